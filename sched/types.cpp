// sched/types.cpp — the request checks (see types.hpp).
#include "sched/types.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "config/error.hpp"
#include "model/tokenizer.hpp"

namespace specactor::sched {

namespace {

// A value as the user would have written it (the shortest text that reads back the same).
std::string shortest(float v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

}  // namespace

std::shared_ptr<const grammar::Grammar> compile_constraint(const OutputConstraint& c) {
  using grammar::Grammar;
  switch (c.kind) {
    case OutputConstraint::Kind::None:
      return nullptr;
    case OutputConstraint::Kind::JsonObject:
      return Grammar::any_json_object();
    case OutputConstraint::Kind::JsonSchema:
      return Grammar::from_json_schema(c.schema);
    case OutputConstraint::Kind::ToolCalls: {
      if (c.tool_names.size() != c.tool_parameters.size())
        throw grammar::GrammarError("", "tool names and parameter schemas differ in number");
      std::vector<Grammar::Tool> tools;
      for (std::size_t i = 0; i < c.tool_names.size(); ++i) tools.push_back({c.tool_names[i], c.tool_parameters[i]});
      return Grammar::tool_calls(tools, c.tools_required, c.parallel_tool_calls);
    }
  }
  throw grammar::GrammarError("", "unknown constraint kind " + std::to_string(static_cast<int>(c.kind)));
}

void check_request(const GenerationRequest& r, const RequestLimits& limits,
                   const std::function<std::string(const std::string&)>& name) {
  auto field = [&](const std::string& f) { return name ? name(f) : f; };
  auto fail = [&](const std::string& f, const std::string& m, const char* code = "invalid_value") {
    throw RequestError(field(f), m, code);
  };
  const auto& sp = r.sampling;
  if (r.max_new_tokens && *r.max_new_tokens < 1)
    fail("max_new_tokens", "must be >= 1 (got " + std::to_string(*r.max_new_tokens) + ")");
  if (!(std::isfinite(sp.temperature) && sp.temperature >= 0)) fail("temperature", "must be a finite number >= 0");
  // Logits are divided by the temperature in float32: below 1e-5 that overflows to infinity (and a
  // subnormal 1e-40 picked the last token forever), so such values are refused rather than sampled.
  if (sp.temperature > 0 && sp.temperature < kMinTemperature)
    fail("temperature", "must be 0 (greedy) or at least 1e-05 (got " + shortest(sp.temperature) + ")");
  if (!(sp.top_p > 0 && sp.top_p <= 1)) fail("top_p", "must be in (0, 1]");
  if (sp.top_p < kMinTopP) fail("top_p", "must be at least 1e-05 (a smaller nucleus is the top token: use top_k 1)");
  if (sp.top_k < 0) fail("top_k", "must be >= 0 (0 = off)");
  if (!(sp.min_p >= 0 && sp.min_p < 1)) fail("min_p", "must be in [0, 1)");
  if (r.logprobs < -1 || r.logprobs > 20) fail("logprobs", "must be between 0 and 20 alternatives (-1 = none)");
  const auto& rl = r.rules;
  if (!(rl.presence_penalty >= -2 && rl.presence_penalty <= 2)) fail("presence_penalty", "must be in [-2, 2]");
  if (!(rl.frequency_penalty >= -2 && rl.frequency_penalty <= 2)) fail("frequency_penalty", "must be in [-2, 2]");
  if (!(std::isfinite(rl.repetition_penalty) && rl.repetition_penalty > 0))
    fail("repetition_penalty", "must be a finite number > 0 (1 = off)");
  if (rl.min_tokens < 0) fail("min_tokens", "must be >= 0");
  if (r.max_new_tokens && rl.min_tokens > *r.max_new_tokens)
    fail("min_tokens", "must be at most " + field("max_new_tokens") + " (" + std::to_string(*r.max_new_tokens) + ")");
  if (rl.bias_ids.size() != rl.bias_values.size()) fail("logit_bias", "ids and values differ in number");
  for (std::size_t i = 0; i < rl.bias_ids.size(); ++i) {
    std::string at;  // appended, not "[" + …: GCC 12's -Wrestrict false positive (see above)
    at.append("[").append(std::to_string(rl.bias_ids[i])).append("]");
    if (!(rl.bias_values[i] >= -100 && rl.bias_values[i] <= 100))
      throw RequestError(field("logit_bias") + at, "must be a number in [-100, 100]");
    if (rl.bias_ids[i] < 0 || (i > 0 && rl.bias_ids[i] <= rl.bias_ids[i - 1]))
      throw RequestError(field("logit_bias") + at, "token ids must be >= 0, ascending and unique");
    if (limits.vocab_size > 0 && rl.bias_ids[i] >= limits.vocab_size)
      throw RequestError(field("logit_bias") + at, "token id " + std::to_string(rl.bias_ids[i]) +
                                                       " is outside the vocabulary (" +
                                                       std::to_string(limits.vocab_size) + " tokens)");
  }
  for (std::size_t i = 0; i < r.stop.size(); ++i) {
    std::string at;  // built by appending: GCC 12 warns (-Wrestrict, a false positive) on "[" + std::string
    if (r.stop.size() > 1) at.append("[").append(std::to_string(i)).append("]");
    if (r.stop[i].empty()) throw RequestError(field("stop") + at, "is empty");
    try {
      model::check_utf8(r.stop[i]);
    } catch (const config::ConfigError& e) {
      throw RequestError(field("stop") + at, e.what());
    }
  }
  if (r.constraint.active()) {
    try {
      compile_constraint(r.constraint);
    } catch (const grammar::GrammarError& e) {
      fail(r.constraint.field(), e.what());
    }
  }
  if (limits.vocab_size > 0)
    for (std::size_t i = 0; i < r.prompt_ids.size(); ++i)
      if (r.prompt_ids[i] < 0 || r.prompt_ids[i] >= limits.vocab_size)
        throw RequestError(field("prompt_ids") + "[" + std::to_string(i) + "]",
                           "token id " + std::to_string(r.prompt_ids[i]) + " is outside the vocabulary (" +
                               std::to_string(limits.vocab_size) + " tokens)");
  if (limits.context_length <= 0) return;
  // The context rule. The totals are printed as unsigned sums: the largest max_new_tokens does not wrap.
  const auto ctx = limits.context_length, prompt = static_cast<std::int64_t>(r.prompt_ids.size());
  if (prompt == 0) fail("prompt_ids", "is empty (at least one token is needed)");
  if (prompt >= ctx)
    fail("prompt_ids",
         "this model's maximum context length is " + std::to_string(ctx) + " tokens; the prompt has " +
             std::to_string(prompt) + ", which leaves no room for a new token",
         "context_length_exceeded");
  if (r.max_new_tokens && *r.max_new_tokens > ctx - prompt)
    fail("max_new_tokens",
         "this model's maximum context length is " + std::to_string(ctx) + " tokens; you requested " +
             std::to_string(static_cast<unsigned long long>(prompt) +
                            static_cast<unsigned long long>(*r.max_new_tokens)) +
             " tokens (" + std::to_string(prompt) + " in the prompt, " + std::to_string(*r.max_new_tokens) +
             " for the completion); ask for at most " + std::to_string(ctx - prompt) +
             ", or leave it unset for as many as fit",
         "context_length_exceeded");
}

std::int64_t new_token_budget(const GenerationRequest& r, std::int64_t prompt_tokens, std::int64_t context_length) {
  return r.max_new_tokens ? *r.max_new_tokens : std::max<std::int64_t>(0, context_length - prompt_tokens);
}

}  // namespace specactor::sched
