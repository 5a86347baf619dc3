// sched/stream.cpp — the policy's streaming seam: accepted tokens become text through the request's
// decoder and stop matcher, stop conditions end requests, and events reach the request's callback.
#include "sched/stream.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "sched/policy.hpp"
#include "sched/policy_detail.hpp"

namespace specactor::sched {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string StopMatcher::push(const std::string& text) {
  if (stopped_) return {};
  held_ += text;
  std::size_t cut = std::string::npos;
  for (const auto& s : stops_) cut = std::min(cut, held_.find(s));
  if (cut != std::string::npos) {
    std::string out = held_.substr(0, cut);
    held_.clear();
    stopped_ = true;
    return out;
  }
  // Hold back the longest tail that is a proper prefix of a stop string.
  std::size_t keep = 0;
  for (const auto& s : stops_)
    for (std::size_t len = std::min(s.size() - 1, held_.size()); len > keep; --len)
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        keep = len;
        break;
      }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::flush() {
  std::string out = std::move(held_);
  held_.clear();
  return out;
}

namespace detail {

void notify(Sequence& r, TokenEvent ev) {
  ev.id = r.id();
  if (!r.sub->on_token) return;
  try {
    r.sub->on_token(ev);
  } catch (const std::exception& e) {
    spdlog::warn("request {}: the token callback threw: {}", r.id(), e.what());
  }
}

RequestMetrics finish_metrics(const Sequence& r) {
  RequestMetrics m = r.m;
  m.prompt_tokens = static_cast<std::int64_t>(r.prompt_len);
  m.generated_tokens = static_cast<std::int64_t>(r.out.generated.size());
  const auto now = Clock::now();
  if (!r.out.generated.empty()) {
    m.time_to_first_token_ms = ms_between(r.submitted, r.out.first_token);
    const double decode_ms = ms_between(r.out.first_token, now);
    m.decode_tokens_per_s =
        r.out.generated.size() > 1 && decode_ms > 0 ? (r.out.generated.size() - 1) / (decode_ms / 1000.0) : 0.0;
  }
  m.mean_accepted_length = m.steps > 0 ? static_cast<double>(m.accepted + m.steps) / static_cast<double>(m.steps) : 0.0;
  return m;
}

}  // namespace detail

using detail::notify;

// Appends accepted tokens, streams them, and checks the stop conditions. Returns the finish reason
// ("" while the request goes on).
std::string Scheduler::emit(Sequence& r, const std::vector<std::int32_t>& tokens,
                            const std::vector<kernels::TokenLogprob>& logprobs) {
  const GenerationRequest& g = r.sub->request;
  TokenEvent ev;
  std::string reason;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const std::int32_t t = tokens[i];
    if (!g.ignore_eos && tokenizer_ && tokenizer_->is_end_of_generation(t)) {
      reason = "stop";
      break;
    }
    if (r.out.generated.empty()) r.out.first_token = Clock::now();
    r.out.generated.push_back(t);
    r.seq.push_back(t);
    ev.tokens.push_back(t);
    if (i < logprobs.size()) ev.logprobs.push_back(logprobs[i]);
    if (r.out.decoder) {
      ev.text += r.out.stops.push(r.out.decoder->push(t));
      if (r.out.stops.stopped()) {  // a stop string ends the request; its text is not part of the output
        reason = "stop";
        break;
      }
    }
    ++metrics_.generated_tokens;
    if (r.constraint.matcher && advance_constraint(r, t)) {  // the grammar is complete: nothing may follow
      reason = "stop";
      break;
    }
    if (static_cast<std::int64_t>(r.out.generated.size()) >= r.max_new) {
      reason = "length";
      break;
    }
  }
  if (!ev.tokens.empty() || !ev.text.empty()) notify(r, std::move(ev));
  return reason;
}
}  // namespace specactor::sched
