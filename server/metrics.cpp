// server/metrics.cpp — see metrics.hpp.
#include "server/metrics.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace specactor::server {

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {
  std::sort(bounds_.begin(), bounds_.end());
}

void Histogram::observe(double value) {
  const auto at = static_cast<std::size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin());
  std::lock_guard<std::mutex> lock(m_);
  ++counts_[at];
  sum_ += value;
}

Histogram::Snapshot Histogram::snapshot() const {
  std::lock_guard<std::mutex> lock(m_);
  Snapshot s;
  s.bounds = bounds_;
  s.sum = sum_;
  std::uint64_t run = 0;
  for (std::uint64_t c : counts_) s.cumulative.push_back(run += c);
  s.count = run;
  return s;
}

std::string escape_label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  if (v == std::floor(v) && std::fabs(v) < 1e15)
    std::snprintf(buf, sizeof buf, "%.0f", v);
  else
    std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

void Exposition::family(const std::string& name, const std::string& type, const std::string& help) {
  std::string h;
  for (char c : help) h += c == '\\' ? std::string("\\\\") : c == '\n' ? std::string("\\n") : std::string(1, c);
  out_ += "# HELP " + name + " " + h + "\n# TYPE " + name + " " + type + "\n";
}

void Exposition::sample(const std::string& name, double value, const Labels& labels) {
  out_ += name;
  if (!labels.empty()) {
    out_ += "{";
    for (std::size_t i = 0; i < labels.size(); ++i) {
      if (i) out_ += ',';
      out_ += labels[i].first;
      out_ += "=\"";
      out_ += escape_label(labels[i].second);
      out_ += '"';
    }
    out_ += "}";
  }
  out_ += ' ';
  out_ += format_value(value);
  out_ += '\n';
}

void Exposition::counter(const std::string& name, const std::string& help, double value, const Labels& labels) {
  family(name, "counter", help);
  sample(name, value, labels);
}

void Exposition::gauge(const std::string& name, const std::string& help, double value, const Labels& labels) {
  family(name, "gauge", help);
  sample(name, value, labels);
}

void Exposition::histogram(const std::string& name, const std::string& help, const Histogram::Snapshot& h) {
  family(name, "histogram", help);
  for (std::size_t i = 0; i < h.bounds.size(); ++i)
    sample(name + "_bucket", static_cast<double>(h.cumulative[i]), {{"le", format_value(h.bounds[i])}});
  sample(name + "_bucket", static_cast<double>(h.count), {{"le", "+Inf"}});
  sample(name + "_sum", h.sum);
  sample(name + "_count", static_cast<double>(h.count));
}

}  // namespace specactor::server
