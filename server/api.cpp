// server/api.cpp — see api.hpp.
#include "server/api.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>

#include "config/error.hpp"
#include "config/input.hpp"
#include "server/api_fields.hpp"
#include "server/structured.hpp"

namespace specactor::server {

ApiError::ApiError(int status_, std::string message, std::string param_, std::string type_, std::string code_)
    : std::runtime_error(std::move(message)),
      status(status_),
      type(std::move(type_)),
      param(std::move(param_)),
      code(std::move(code_)) {}

json error_body(const ApiError& e) {
  return {{"error",
           {{"message", e.what()},
            {"type", e.type},
            {"param", e.param.empty() ? json(nullptr) : json(e.param)},
            {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
}

json status_error_body(int status, const std::string& message) {
  const char* type = status == 401   ? "authentication_error"
                     : status == 404 ? "not_found_error"
                     : status == 413 ? "request_too_large"
                     : status == 503 ? "service_unavailable"
                     : status >= 500 ? "server_error"
                                     : "invalid_request_error";
  return error_body(ApiError(status, message, {}, type));
}

bool is_json_type(const std::string& content_type) {
  std::string t = content_type.substr(0, content_type.find(';'));
  while (!t.empty() && (t.back() == ' ' || t.back() == '\t')) t.pop_back();
  for (char& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return t == "application/json" ||
         (t.rfind("application/", 0) == 0 && t.size() > 5 && t.substr(t.size() - 5) == "+json");
}

json parse_body(const std::string& text) {
  json j;
  try {
    j = config::parse_ordered_json(text, "request body");
  } catch (const config::ConfigError& e) {
    // Bounded: a parse error quotes the offending token, which may be megabytes long.
    throw ApiError(400, config::printable(e.what(), kMaxErrorChars));
  }
  if (!j.is_object()) throw ApiError(400, "request body: expected a JSON object");
  return j;
}

namespace {

using namespace fields;

std::vector<std::string> get_stop(const json& o, const std::string& prefix = {}) {
  const json* v = field(o, "stop");
  if (!v) return {};
  if (v->is_string()) return {v->get<std::string>()};
  if (!v->is_array()) throw ApiError(400, where(prefix, "stop") + ": expected a string or an array of strings", "stop");
  std::vector<std::string> out;
  for (std::size_t i = 0; i < v->size(); ++i) {
    if (!(*v)[i].is_string())
      throw ApiError(400, where(prefix, "stop") + "[" + std::to_string(i) + "]: expected a string", "stop");
    out.push_back((*v)[i].get<std::string>());
  }
  return out;
}

std::int32_t to_top_k(std::int64_t k, const std::string& name) {
  if (k == -1) return 0;  // vLLM's and sglang's "off"
  if (k < 0 || k > std::numeric_limits<std::int32_t>::max())
    throw ApiError(400, name + ": must be -1 (off), 0 (off) or a positive integer", name);
  return static_cast<std::int32_t>(k);
}

// The sampling fields shared by the OpenAI endpoints (top level) and /generate (sampling_params).
// Penalties, logit_bias and min_tokens (ranges: sched::check_request). logit_bias is an object of
// token ids (as decimal strings, OpenAI's form) to numbers.
void read_rules(const json& o, kernels::LogitRules& rules, const std::string& prefix) {
  if (auto v = get_number(o, "presence_penalty", prefix)) rules.presence_penalty = static_cast<float>(*v);
  if (auto v = get_number(o, "frequency_penalty", prefix)) rules.frequency_penalty = static_cast<float>(*v);
  if (auto v = get_number(o, "repetition_penalty", prefix)) rules.repetition_penalty = static_cast<float>(*v);
  for (const char* name : {"min_tokens", "min_new_tokens"})  // vLLM's name, sglang's
    if (auto v = get_int(o, name, prefix)) {
      if (*v < 0) throw ApiError(400, where(prefix, name) + ": must be >= 0", where(prefix, name));
      rules.min_tokens = *v;
    }
  const json* b = field(o, "logit_bias");
  if (!b || b->is_null()) return;
  const std::string name = where(prefix, "logit_bias");
  if (!b->is_object())
    throw ApiError(400, name + ": expected an object of token ids to biases, e.g. {\"1234\": -100}", name);
  std::map<std::int32_t, float> bias;
  for (const auto& [key, value] : b->items()) {
    const std::string at = name + "[" + config::printable(key, 40) + "]";
    const bool digits = !key.empty() && key.size() <= 10 &&
                        std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!digits || std::stoll(key) > std::numeric_limits<std::int32_t>::max())
      throw ApiError(400, at + ": expected a token id (a non-negative integer as a string)", name);
    if (!value.is_number()) throw ApiError(400, at + ": expected a number", name);
    bias[static_cast<std::int32_t>(std::stoll(key))] = static_cast<float>(value.get<double>());
  }
  for (const auto& [id, v] : bias) {
    rules.bias_ids.push_back(id);
    rules.bias_values.push_back(v);
  }
}

void read_sampling(const json& o, sched::GenerationRequest& r, const std::string& prefix) {
  if (auto t = get_number(o, "temperature", prefix)) r.sampling.temperature = static_cast<float>(*t);
  if (auto t = get_number(o, "top_p", prefix)) r.sampling.top_p = static_cast<float>(*t);
  if (auto t = get_number(o, "min_p", prefix)) r.sampling.min_p = static_cast<float>(*t);
  if (auto k = get_int(o, "top_k", prefix)) r.sampling.top_k = to_top_k(*k, where(prefix, "top_k"));
  if (auto s = get_int(o, "seed", prefix)) {
    if (*s < 0) throw ApiError(400, where(prefix, "seed") + ": must be >= 0", where(prefix, "seed"));
    r.seed = static_cast<std::uint64_t>(*s);
  }
  r.stop = get_stop(o, prefix);
  r.ignore_eos = get_bool(o, "ignore_eos", false, prefix);
  read_rules(o, r.rules, prefix);
}

// The engine's own checks of the request's fields (sched::check_request), at parse time: a 400 naming
// the API's field before anything is tokenized.
void check_ranges(const ApiRequest& a) {
  try {
    sched::check_request(a.request, {}, api_field_names(a));
  } catch (const sched::RequestError& e) {
    throw request_error(e);
  }
}

// A prompt given as token ids (each in [0, 2^31)).
std::vector<std::int32_t> token_ids(const json& arr, const std::string& name) {
  std::vector<std::int32_t> ids;
  for (std::size_t i = 0; i < arr.size(); ++i) {
    const json& t = arr[i];
    if (!t.is_number_integer() || t.get<std::int64_t>() < 0 ||
        t.get<std::int64_t>() > std::numeric_limits<std::int32_t>::max())
      throw ApiError(400, name + "[" + std::to_string(i) + "]: expected a token id", name);
    ids.push_back(static_cast<std::int32_t>(t.get<std::int64_t>()));
  }
  return ids;
}

// The model the request names must be the one served (a 404 otherwise, as OpenAI answers).
void check_model(const json& body, const ApiLimits& limits, ApiRequest& a) {
  if (auto m = get_string(body, "model")) {
    a.model = *m;
    if (!limits.model_name.empty() && a.model != limits.model_name)
      throw ApiError(404,
                     "The model '" + config::printable(a.model) + "' does not exist (this server serves '" +
                         limits.model_name + "')",
                     "model", "invalid_request_error", "model_not_found");
  }
}

// OpenAI fields this server does not implement: accepted at their neutral values (clients send
// them), refused with a 400 naming the field when the value would change the result.
void refuse_unsupported(const json& body) {
  auto refuse = [](const char* name, const json& v, const char* why) {
    throw ApiError(400, std::string(name) + ": " + config::printable(v.dump(), 80) + " is not supported (" + why + ")",
                   name);
  };
  if (const json* v = field(body, "echo"); v && !v->is_null() && *v != false)
    refuse("echo", *v, "the answer never repeats the prompt; /tokenize gives its tokens");
  if (const json* v = field(body, "suffix"); v && !v->is_null() && *v != "")
    refuse("suffix", *v, "fill-in-the-middle needs a model trained for it, and the default model is not");
}

// Chat: "logprobs": true and "top_logprobs" 0..20; completions: "logprobs": 0..5 (the top count).
void read_logprobs(const json& body, ApiRequest& a) {
  if (a.endpoint == Endpoint::Completion) {
    if (auto n = get_int(body, "logprobs")) {
      if (*n < 0 || *n > 5) throw ApiError(400, "logprobs: must be between 0 and 5", "logprobs");
      a.request.logprobs = static_cast<std::int32_t>(*n);
    }
    return;
  }
  const bool on = get_bool(body, "logprobs", false);
  const auto top = get_int(body, "top_logprobs");
  if (top && !on) throw ApiError(400, "top_logprobs: needs \"logprobs\": true", "top_logprobs");
  if (top && (*top < 0 || *top > 20)) throw ApiError(400, "top_logprobs: must be between 0 and 20", "top_logprobs");
  if (on) a.request.logprobs = static_cast<std::int32_t>(top.value_or(0));
}

void read_common(const json& body, const ApiLimits& limits, ApiRequest& a) {
  check_model(body, limits, a);
  if (auto n = get_int(body, "n")) {
    if (*n < 1 || *n > kMaxChoices) throw ApiError(400, "n: must be between 1 and " + std::to_string(kMaxChoices), "n");
    a.n = *n;
  }
  if (auto b = get_int(body, "best_of"); b && *b != a.n)
    throw ApiError(400, "best_of: only best_of = n is supported (every sample is returned; none is ranked away)",
                   "best_of");
  read_logprobs(body, a);
  refuse_unsupported(body);
  read_structured(body, a);
  a.stream = get_bool(body, "stream", false);
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) throw ApiError(400, "stream_options: expected an object", "stream_options");
    a.include_usage = get_bool(*so, "include_usage", false, "stream_options");
  }
  auto& r = a.request;
  read_sampling(body, r, "");
  r.speculative = get_bool(body, "speculative", true);
  auto mt = get_int(body, "max_completion_tokens");
  if (!mt) mt = get_int(body, "max_tokens");
  if (mt) r.max_new_tokens = *mt;
  if (field(body, "max_completion_tokens")) a.max_tokens_name = "max_completion_tokens";
  check_ranges(a);
}

}  // namespace

ApiRequest parse_chat(const json& body, const ApiLimits& limits) {
  ApiRequest a;
  a.endpoint = Endpoint::Chat;
  a.prompt_name = "messages";
  const json* msgs = field(body, "messages");
  if (!msgs || !msgs->is_array() || msgs->empty())
    throw ApiError(400, "messages: expected a non-empty array of {\"role\", \"content\"}", "messages");
  auto& r = a.request;
  r.chat = true;
  for (std::size_t i = 0; i < msgs->size(); ++i) {
    const json& m = (*msgs)[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) throw ApiError(400, at + ": expected an object", "messages");
    const auto role = get_string(m, "role", at);
    if (!role ||
        (*role != "system" && *role != "user" && *role != "assistant" && *role != "developer" && *role != "tool"))
      throw ApiError(400, at + ".role: expected system, user, assistant, developer or tool", "messages");
    std::string content;
    const json* c = field(m, "content");
    if (c && c->is_string()) {
      content = c->get<std::string>();
    } else if (c && c->is_array()) {  // content parts: only text
      for (std::size_t j = 0; j < c->size(); ++j) {
        const json& part = (*c)[j];
        const std::string pat = at + ".content[" + std::to_string(j) + "]";
        if (!part.is_object() || get_string(part, "type", pat).value_or("") != "text")
          throw ApiError(400, pat + ": only {\"type\": \"text\", \"text\": ...} parts are supported", "messages");
        content += get_string(part, "text", pat).value_or("");
      }
    } else if (c || *role != "assistant") {
      throw ApiError(400, at + ".content: expected a string or an array of text parts", "messages");
    }
    std::string turn = *role == "developer" ? "system" : *role;
    read_tool_message(m, at, turn, content);
    r.messages.push_back({std::move(turn), std::move(content)});
  }
  read_common(body, limits, a);
  return a;
}

ApiRequest parse_completion(const json& body, const ApiLimits& limits) {
  ApiRequest a;
  a.endpoint = Endpoint::Completion;
  const json* p = field(body, "prompt");
  auto& r = a.request;
  if (p && p->is_string()) {
    r.prompt = p->get<std::string>();
  } else if (p && p->is_array() && p->size() == 1 && (*p)[0].is_string()) {
    r.prompt = (*p)[0].get<std::string>();
  } else if (p && p->is_array() && !p->empty() && (*p)[0].is_number_integer()) {
    r.prompt_ids = token_ids(*p, "prompt");
  } else {
    throw ApiError(400, "prompt: expected a string, an array of one string, or an array of token ids", "prompt");
  }
  if (r.prompt.empty() && r.prompt_ids.empty()) throw ApiError(400, "prompt: is empty", "prompt");
  read_common(body, limits, a);
  return a;
}

ApiRequest parse_generate(const json& body, const ApiLimits& limits) {
  ApiRequest a;
  a.endpoint = Endpoint::Generate;
  a.max_tokens_name = "sampling_params.max_new_tokens";
  a.sampling_prefix = "sampling_params";
  auto& r = a.request;
  if (auto t = get_string(body, "text")) {
    r.prompt = *t;
  } else if (const json* ids = field(body, "input_ids")) {
    if (!ids->is_array() || ids->empty()) throw ApiError(400, "input_ids: expected a non-empty array", "input_ids");
    r.prompt_ids = token_ids(*ids, "input_ids");
  } else {
    throw ApiError(400, "text or input_ids: one is required", "text");
  }
  a.prompt_name = r.prompt_ids.empty() ? "text" : "input_ids";
  if (r.prompt.empty() && r.prompt_ids.empty()) throw ApiError(400, "text: is empty", "text");
  check_model(body, limits, a);
  a.stream = get_bool(body, "stream", false);
  r.speculative = get_bool(body, "speculative", true);
  if (const json* sp = field(body, "sampling_params")) {
    if (!sp->is_object()) throw ApiError(400, "sampling_params: expected an object", "sampling_params");
    read_sampling(*sp, r, "sampling_params");
    read_generate_structured(*sp, a);
    if (auto mt = get_int(*sp, "max_new_tokens", "sampling_params")) r.max_new_tokens = *mt;
  }
  check_ranges(a);
  return a;
}

sched::GenerationRequest parse_tokenize(const json& body, const ApiLimits& limits) {
  if (body.contains("messages")) return parse_chat(body, limits).request;
  sched::GenerationRequest r;
  const auto it = body.find("prompt");
  if (it == body.end() || !it->is_string()) throw ApiError(400, "prompt: expected a string", "prompt");
  r.prompt = it->get<std::string>();
  return r;
}

std::vector<std::int32_t> parse_detokenize(const json& body, std::int64_t vocab_size) {
  const auto it = body.find("tokens");
  if (it == body.end() || !it->is_array()) throw ApiError(400, "tokens: expected an array of token ids", "tokens");
  std::vector<std::int32_t> ids;
  for (std::size_t i = 0; i < it->size(); ++i) {
    const json& t = (*it)[i];
    if (!t.is_number_integer() || t.get<std::int64_t>() < 0 || t.get<std::int64_t>() >= vocab_size)
      throw ApiError(400, "tokens[" + std::to_string(i) + "]: expected a token id below " + std::to_string(vocab_size),
                     "tokens");
    ids.push_back(static_cast<std::int32_t>(t.get<std::int64_t>()));
  }
  return ids;
}

std::function<std::string(const std::string&)> api_field_names(const ApiRequest& a) {
  return [max_tokens = a.max_tokens_name, prompt = a.prompt_name, prefix = a.sampling_prefix](const std::string& f) {
    if (f == "max_new_tokens") return max_tokens;
    if (f == "prompt_ids") return prompt;
    return where(prefix, f.c_str());
  };
}

ApiError request_error(const sched::RequestError& e) {
  return ApiError(400, e.what(), e.field.substr(0, e.field.find('[')), "invalid_request_error",
                  e.code == "invalid_value" ? std::string() : e.code);
}

std::string openai_finish_reason(const std::string& r) {
  if (r == "stop" || r == "length") return r;
  if (r == "cancelled") return "abort";
  return r.empty() ? "stop" : r;
}

json speculative_json(const sched::RequestMetrics& m) {
  json by_pos = json::array();
  for (std::size_t d = 0; d < m.drafted_at.size(); ++d) {
    const std::int64_t acc = d < m.accepted_at.size() ? m.accepted_at[d] : 0;
    by_pos.push_back({{"position", d},
                      {"drafted", m.drafted_at[d]},
                      {"accepted", acc},
                      {"rate", m.drafted_at[d] > 0 ? static_cast<double>(acc) / m.drafted_at[d] : 0.0}});
  }
  return {{"steps", m.steps},
          {"drafted", m.drafted},
          {"accepted", m.accepted},
          {"tau", m.mean_accepted_length},
          {"acceptance_rate", m.drafted > 0 ? static_cast<double>(m.accepted) / m.drafted : 0.0},
          {"acceptance_by_position", by_pos},
          {"fallback_steps", m.fallbacks},
          {"budget_skipped_steps", m.budget_skipped}};
}

json usage_json(const Outcome& o) {
  const auto completion = static_cast<std::int64_t>(o.tokens.size());
  return {{"prompt_tokens", o.prompt_tokens},
          {"completion_tokens", completion},
          {"total_tokens", o.prompt_tokens + completion},
          {"prompt_tokens_details", {{"cached_tokens", o.metrics.cached_tokens}}}};
}

json logprobs_json(Endpoint e, const std::vector<std::int32_t>& tokens, const std::vector<kernels::TokenLogprob>& lps,
                   const std::function<std::string(std::int32_t)>& piece, std::size_t offset) {
  if (!piece || lps.size() != tokens.size()) return nullptr;
  auto text = [&](std::int32_t t) { return piece(t); };  // raw bytes; invalid UTF-8 is replaced when dumped
  auto bytes = [](const std::string& s) {
    json b = json::array();
    for (unsigned char c : s) b.push_back(static_cast<int>(c));
    return b;
  };
  if (e == Endpoint::Chat) {
    json content = json::array();
    for (const auto& lp : lps) {
      json top = json::array();
      for (std::size_t k = 0; k < lp.top_ids.size(); ++k) {
        const std::string s = text(lp.top_ids[k]);
        top.push_back({{"token", s}, {"logprob", lp.top_logprobs[k]}, {"bytes", bytes(s)}});
      }
      const std::string s = text(lp.token);
      content.push_back({{"token", s}, {"logprob", lp.logprob}, {"bytes", bytes(s)}, {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json toks = json::array(), values = json::array(), tops = json::array(), offsets = json::array();
  for (const auto& lp : lps) {
    const std::string s = text(lp.token);
    toks.push_back(s);
    values.push_back(lp.logprob);
    json top = json::object();
    for (std::size_t k = 0; k < lp.top_ids.size(); ++k) top[text(lp.top_ids[k])] = lp.top_logprobs[k];
    tops.push_back(top);
    offsets.push_back(offset);
    offset += s.size();
  }
  return {{"tokens", toks}, {"token_logprobs", values}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json chunk_logprobs(Endpoint e, const sched::TokenEvent& ev, const Outcome& o) {
  if (ev.logprobs.empty()) return nullptr;
  return logprobs_json(e, ev.tokens, ev.logprobs, o.piece, o.text.size() - ev.text.size());
}

json chat_response(const std::string& id, std::int64_t created, const std::string& model, const Outcome& o) {
  std::string reason;
  return {{"id", id},
          {"object", "chat.completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array({{{"index", 0},
                                    {"message", chat_message(o, id, reason)},
                                    {"logprobs", logprobs_json(Endpoint::Chat, o.tokens, o.logprobs, o.piece)},
                                    {"finish_reason", reason}}})},
          {"usage", usage_json(o)},
          {"speculative", speculative_json(o.metrics)}};
}

json completion_response(const std::string& id, std::int64_t created, const std::string& model, const Outcome& o) {
  return {{"id", id},
          {"object", "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array({{{"index", 0},
                                    {"text", o.text},
                                    {"logprobs", logprobs_json(Endpoint::Completion, o.tokens, o.logprobs, o.piece)},
                                    {"finish_reason", openai_finish_reason(o.finish_reason)}}})},
          {"usage", usage_json(o)},
          {"speculative", speculative_json(o.metrics)}};
}

json generate_response(const std::string& id, const Outcome& o) {
  json finish = {{"type", openai_finish_reason(o.finish_reason)}};
  if (o.finish_reason == "length") finish["length"] = static_cast<std::int64_t>(o.tokens.size());
  return {{"text", o.text},
          {"output_ids", o.tokens},
          {"meta_info",
           {{"id", id},
            {"prompt_tokens", o.prompt_tokens},
            {"completion_tokens", static_cast<std::int64_t>(o.tokens.size())},
            {"finish_reason", finish},
            {"spec_verify_ct", o.metrics.steps},
            {"speculative", speculative_json(o.metrics)}}}};
}

json chat_chunk(const std::string& id, std::int64_t created, const std::string& model, const std::string& delta,
                bool first, const std::string& finish_reason, const json& logprobs) {
  json d = json::object();
  if (first) d["role"] = "assistant";
  if (!delta.empty() || first) d["content"] = delta;
  return {{"id", id},
          {"object", "chat.completion.chunk"},
          {"created", created},
          {"model", model},
          {"choices",
           json::array({{{"index", 0},
                         {"delta", d},
                         {"logprobs", logprobs},
                         {"finish_reason",
                          finish_reason.empty() ? json(nullptr) : json(openai_finish_reason(finish_reason))}}})}};
}

json completion_chunk(const std::string& id, std::int64_t created, const std::string& model, const std::string& delta,
                      const std::string& finish_reason, const json& logprobs) {
  return {{"id", id},
          {"object", "text_completion"},
          {"created", created},
          {"model", model},
          {"choices",
           json::array({{{"index", 0},
                         {"text", delta},
                         {"logprobs", logprobs},
                         {"finish_reason",
                          finish_reason.empty() ? json(nullptr) : json(openai_finish_reason(finish_reason))}}})}};
}

json usage_chunk(Endpoint e, const std::string& id, std::int64_t created, const std::string& model, const Outcome& o) {
  return {{"id", id},
          {"object", e == Endpoint::Chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array()},
          {"usage", usage_json(o)},
          {"speculative", speculative_json(o.metrics)}};
}

std::string sse_event(const json& payload) {
  // dump() escapes control characters, so the payload is one line and cannot end the event early.
  return "data: " + payload.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

std::string sse_done() { return "data: [DONE]\n\n"; }

}  // namespace specactor::server
