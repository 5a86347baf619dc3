// server/choices.hpp — a request's answer as a stream of events, and `n` > 1: the n choices of one request run as n
// engine requests (the same prompt: the prefix cache prefills it about once and shares its pages; choice i samples with
// seed + i), and their answers merge into one response with choices[i].index = i, their chunks into one stream.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "server/api.hpp"
#include "server/structured.hpp"

namespace specactor::server {

struct Choices {
  std::mutex m;  // the stream's writes, the counts below
  std::size_t n = 1, finished = 0;
  std::vector<json> responses;  // each choice's whole response (not streamed)
  std::vector<const Outcome*> outcomes;
  bool answered = false;  // an error (or the merged response) went out: the rest is dropped
};

// One response with every choice in order (index i), usage summed (the prompt counted once), the
// speculative metrics summed over the choices.
json merge_responses(const std::vector<json>& responses);
// The usage of all choices as one Outcome (prompt once, every choice's tokens).
Outcome summed_outcome(const std::vector<const Outcome*>& outcomes);
// A streamed event's SSE text with its choices' "index" set to `index`.
std::string reindex_events(const std::string& sse, std::size_t index);
// The seed of choice i: the request's seed + i; without one, a different one per choice (`base`).
std::uint64_t choice_seed(const std::optional<std::uint64_t>& seed, std::uint64_t base, std::size_t i);

// A request's whole (not streamed) response on its endpoint.
json whole_response(Endpoint ep, const std::string& rid, std::int64_t created, const std::string& model,
                    const Outcome& o);

// How a streamed request is answered.
struct StreamTo {
  Endpoint ep;
  std::string rid, model;
  std::int64_t created;
  bool include_usage;
};
// The SSE text of one engine event (`o` having absorbed it): the endpoint's chunk(s) (`chat`: the chat
// stream), an error event when it failed (`cut`: the shutdown cut it), and after the `last` event the
// usage chunk (counting `usage`, when asked) and [DONE]; `index`: choice i of n > 1.
std::string stream_events(const StreamTo& to, const sched::TokenEvent& ev, const Outcome& o, ChatStream* chat,
                          const std::optional<ApiError>& cut, bool last, const Outcome& usage,
                          std::optional<std::size_t> index);

}  // namespace specactor::server
