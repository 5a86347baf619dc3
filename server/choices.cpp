// server/choices.cpp — see choices.hpp.
#include "server/choices.hpp"

namespace specactor::server {

json merge_responses(const std::vector<json>& responses) {
  json out = responses.at(0);
  json choices = json::array();
  std::int64_t completion = 0;
  json spec = json::object();
  for (std::size_t i = 0; i < responses.size(); ++i) {
    json c = responses[i]["choices"][0];
    c["index"] = i;
    choices.push_back(std::move(c));
    completion += responses[i]["usage"].value("completion_tokens", std::int64_t{0});
    for (const char* k : {"steps", "drafted", "accepted", "fallback_steps", "budget_skipped_steps"})
      if (responses[i].contains("speculative") && responses[i]["speculative"].contains(k))
        spec[k] = spec.value(k, std::int64_t{0}) + responses[i]["speculative"][k].get<std::int64_t>();
  }
  out["choices"] = std::move(choices);
  if (out.contains("usage")) {
    out["usage"]["completion_tokens"] = completion;
    out["usage"]["total_tokens"] = out["usage"].value("prompt_tokens", std::int64_t{0}) + completion;
  }
  if (out.contains("speculative")) {
    const auto steps = spec.value("steps", std::int64_t{0});
    spec["tau"] = steps > 0 ? static_cast<double>(steps + spec.value("accepted", std::int64_t{0})) / steps : 0.0;
    out["speculative"] = std::move(spec);
  }
  return out;
}

Outcome summed_outcome(const std::vector<const Outcome*>& outcomes) {
  Outcome sum = *outcomes.at(0);
  for (std::size_t i = 1; i < outcomes.size(); ++i)
    sum.tokens.insert(sum.tokens.end(), outcomes[i]->tokens.begin(), outcomes[i]->tokens.end());
  return sum;
}

std::string reindex_events(const std::string& sse, std::size_t index) {
  std::string out;
  for (std::size_t at = 0; at < sse.size();) {
    std::size_t end = sse.find("\n\n", at);
    if (end == std::string::npos) end = sse.size();
    const std::string event = sse.substr(at, end - at);
    at = end + 2;
    json j = event.rfind("data: {", 0) == 0 ? json::parse(event.substr(6), nullptr, false) : json();
    if (!j.is_object() || !j.contains("choices")) {
      out += event + "\n\n";
      continue;
    }
    for (auto& c : j["choices"]) c["index"] = index;
    out += sse_event(j);
  }
  return out;
}

std::uint64_t choice_seed(const std::optional<std::uint64_t>& seed, std::uint64_t base, std::size_t i) {
  return (seed ? *seed : base) + i;
}

json whole_response(Endpoint ep, const std::string& rid, std::int64_t created, const std::string& model,
                    const Outcome& o) {
  return ep == Endpoint::Chat         ? chat_response(rid, created, model, o)
         : ep == Endpoint::Completion ? completion_response(rid, created, model, o)
                                      : generate_response(rid, o);
}

std::string stream_events(const StreamTo& to, const sched::TokenEvent& ev, const Outcome& o, ChatStream* chat,
                          const std::optional<ApiError>& cut, bool last, const Outcome& usage,
                          std::optional<std::size_t> index) {
  std::string out;
  const std::string reason = ev.finished ? ev.finish_reason : "";
  if (ev.finished && ev.finish_reason == "error") {
    out += sse_event(error_body(ev.invalid_request ? ApiError(400, ev.error, {}, "invalid_request_error")
                                                   : ApiError(500, ev.error, {}, "server_error")));
  } else if (ev.finished && ev.finish_reason == "cancelled" && cut) {
    out += sse_event(error_body(*cut));
  } else if (to.ep == Endpoint::Chat && chat) {
    out += chat->events(ev, chunk_logprobs(to.ep, ev, o));
  } else if (to.ep == Endpoint::Completion) {
    if (!ev.text.empty() || ev.finished || !ev.logprobs.empty())
      out += sse_event(completion_chunk(to.rid, to.created, to.model, ev.text, reason, chunk_logprobs(to.ep, ev, o)));
  } else if (to.ep == Endpoint::Generate) {  // sglang: cumulative text so far
    json chunk = generate_response(to.rid, o);
    if (!ev.finished) chunk["meta_info"]["finish_reason"] = nullptr;
    out += sse_event(chunk);
  }
  if (index) out = reindex_events(out, *index);
  if (ev.finished && last) {
    if (to.include_usage && o.finish_reason != "error" && to.ep != Endpoint::Generate && !cut)
      out += sse_event(usage_chunk(to.ep, to.rid, to.created, to.model, usage));
    out += sse_done();
  }
  return out;
}

}  // namespace specactor::server
