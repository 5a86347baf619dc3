// server/metrics.cpp — see metrics.hpp.
#include "server/metrics.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "server/http.hpp"

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

void add_engine_metrics(Exposition& x, const sched::EngineMetrics& m) {
  x.gauge("specactor:num_requests_running", "requests in the running batch", static_cast<double>(m.running));
  x.gauge("specactor:num_requests_waiting", "requests queued for the batch", static_cast<double>(m.queued));
  x.gauge("specactor:kv_pages_total", "pages of the target's KV pool", static_cast<double>(m.kv_pages_total));
  x.gauge("specactor:kv_pages_used", "KV pages reserved by admitted requests",
          static_cast<double>(m.kv_pages_total - m.kv_pages_free - m.cache_pages));
  x.gauge("specactor:prefix_cache_enabled", "1 when the prefix cache is on (not --disable-radix-cache)",
          m.prefix_cache ? 1 : 0);
  x.gauge("specactor:prefix_cache_pages", "KV pages the prefix cache holds", static_cast<double>(m.cache_pages));
  x.counter("specactor:prefix_cache_queries_total", "prompt tokens of requests that looked the cache up",
            static_cast<double>(m.cache_query_tokens));
  x.counter("specactor:prefix_cache_hits_total", "of those, tokens found in the cache (not prefilled)",
            static_cast<double>(m.cache_hit_tokens));
  x.counter("specactor:prefix_cache_evicted_pages_total", "pages the cache gave up for room or a flush",
            static_cast<double>(m.cache_evicted_pages));
  x.counter("specactor:draft_prefix_cache_queries_total",
            "draft KV slots asked for at requests' starts (STANDALONE, one-layer heads)",
            static_cast<double>(m.draft_cache_query_tokens));
  x.counter("specactor:draft_prefix_cache_hits_total", "of those, found in the drafter's own prefix cache",
            static_cast<double>(m.draft_cache_hit_tokens));
  x.gauge("specactor:draft_prefix_cache_pages", "draft KV pages the drafter's prefix cache holds",
          static_cast<double>(m.draft_cache_pages));
  x.counter("specactor:generation_tokens_total", "tokens generated", static_cast<double>(m.generated_tokens));
  x.counter("specactor:spec_decode_num_drafts_total", "decode steps whose request got a proposal",
            m.drafted_at.empty() ? 0.0 : static_cast<double>(m.drafted_at[0]));
  x.counter("specactor:spec_decode_num_draft_tokens_total", "draft tokens verified", static_cast<double>(m.drafted));
  x.counter("specactor:spec_decode_num_accepted_tokens_total", "draft tokens accepted",
            static_cast<double>(m.accepted));
  if (!m.draft_model.empty()) {  // block drafters: tokens per block (the root and block − 1 drafts)
    const auto d = nlohmann::json::parse(m.draft_model, nullptr, false);
    if (d.is_object() && d.contains("block_size") && d["block_size"].is_number_integer())
      x.gauge("specactor:spec_draft_block_size", "the block drafter's tokens per block (the root and block - 1 drafts)",
              d["block_size"].get<double>());
  }
  x.family("specactor:spec_decode_num_accepted_tokens_per_pos_total", "counter",
           "draft tokens accepted at each depth of the proposal (position 0 = the first draft)");
  for (std::size_t d = 0; d < m.accepted_at.size(); ++d)
    x.sample("specactor:spec_decode_num_accepted_tokens_per_pos_total", static_cast<double>(m.accepted_at[d]),
             {{"position", std::to_string(d)}});
  x.counter("specactor:spec_decode_draft_failures_total", "times the draft worker failed",
            static_cast<double>(m.draft_failures));
  x.counter("specactor:spec_decode_fallback_steps_total", "decode steps run without a draft after a failure",
            static_cast<double>(m.fallback_steps));
  x.gauge("specactor:spec_budget_adaptive", "1 when the budget decides what is drafted and verified",
          m.adaptive ? 1 : 0);
  x.counter("specactor:spec_budget_skipped_steps_total",
            "per-request decode steps run without a draft because the budget said it would not pay",
            static_cast<double>(m.budget_skipped_steps));
  x.counter("specactor:grammar_forced_drafts_total",
            "drafts a constrained request's grammar forced (keys, brackets, literals), verified like any draft",
            static_cast<double>(m.grammar_drafts));
  x.counter("specactor:grammar_masks_total", "token masks sent with constrained rows",
            static_cast<double>(m.grammar_masks));
  x.counter("specactor:grammar_masks_computed_total", "token masks computed (the others came from the cache)",
            static_cast<double>(m.grammar_masks_computed));
  x.counter("specactor:grammar_mask_seconds_total", "time the scheduler spent on token masks",
            m.grammar_mask_ms / 1000.0);
  x.family("specactor:spec_budget_verified_nodes_total", "counter",
           "per-request decode steps by the number of draft nodes verified (the last bucket: that many or more)");
  for (std::size_t n = 0; n < m.verified_nodes.size(); ++n)
    x.sample("specactor:spec_budget_verified_nodes_total", static_cast<double>(m.verified_nodes[n]),
             {{"nodes", std::to_string(n)}});
  x.gauge("specactor:spec_budget_calibration_error",
          "acceptance model: expected calibration error of its node predictions", m.calibration_error);
  x.gauge("specactor:spec_draft_score_calibration_error",
          "the drafter's own scores (path probabilities of a head or DFLASH, DSPARK confidences) as predictions of "
          "acceptance: expected calibration error over the verified nodes that had one",
          m.draft_score_calibration_error);
  x.gauge("specactor:spec_budget_step_ms", "cost model: one row's step time at a short context (ms)", m.step_ms_1);
  x.family("specactor:spec_budget_step_cost_ratio", "gauge", "cost model: c(k), k rows' step time over one row's");
  const std::vector<int> ks{1, 2, 4, 8, 16, 32};
  for (std::size_t i = 0; i < m.step_cost.size() && i < ks.size(); ++i)
    x.sample("specactor:spec_budget_step_cost_ratio", m.step_cost[i], {{"rows", std::to_string(ks[i])}});
}

void add_http_refusals(Exposition& x, const http::Stats& h) {
  x.family("specactor:http_refused_total", "counter", "exchanges the HTTP layer refused or cut, by reason");
  for (auto [reason, n] :
       {std::pair{"connection_cap", h.refused_connection_cap},
        std::pair{"headers_too_large", h.refused_header_too_large},
        std::pair{"body_too_large", h.refused_body_too_large}, std::pair{"header_timeout", h.header_timeouts},
        std::pair{"body_timeout", h.body_timeouts}, std::pair{"client_gone", h.clients_gone}})
    x.sample("specactor:http_refused_total", static_cast<double>(n), {{"reason", reason}});
}

}  // namespace specactor::server
