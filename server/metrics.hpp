// server/metrics.hpp — Prometheus text exposition (format 0.0.4) written by hand: metric families
// with HELP and TYPE lines, labelled samples, and cumulative histograms. Thread-safe histogram.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "sched/types.hpp"

namespace specactor::server {
namespace http {
struct Stats;
}

using Labels = std::vector<std::pair<std::string, std::string>>;

// A histogram with fixed upper bounds; observe() may be called from any thread.
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  struct Snapshot {
    std::vector<double> bounds;
    std::vector<std::uint64_t> cumulative;  // per bound, then +Inf
    double sum = 0;
    std::uint64_t count = 0;
  };
  Snapshot snapshot() const;

 private:
  mutable std::mutex m_;
  std::vector<double> bounds_;
  std::vector<std::uint64_t> counts_;  // per bucket (not cumulative), last = above every bound
  double sum_ = 0;
};

class Exposition {
 public:
  // Starts a family (HELP and TYPE once); samples follow with its name (plus a suffix for histograms).
  void family(const std::string& name, const std::string& type, const std::string& help);
  void sample(const std::string& name, double value, const Labels& labels = {});
  void counter(const std::string& name, const std::string& help, double value, const Labels& labels = {});
  void gauge(const std::string& name, const std::string& help, double value, const Labels& labels = {});
  void histogram(const std::string& name, const std::string& help, const Histogram::Snapshot& h);
  const std::string& text() const { return out_; }

 private:
  std::string out_;
};

// A label value or HELP text escaped as the format requires (\\, \", \n).
std::string escape_label(const std::string& v);
// A sample value: integers without a fraction, +Inf/-Inf/NaN spelled as Prometheus does.
std::string format_value(double v);

// The engine's gauges and counters (running and queued requests, KV pages, prefix caches, speculative
// decoding and the budget), and the HTTP layer's refusals by reason, as /metrics shows them.
void add_engine_metrics(Exposition& x, const sched::EngineMetrics& m);
void add_http_refusals(Exposition& x, const http::Stats& h);

}  // namespace specactor::server
