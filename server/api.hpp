// server/api.hpp — the HTTP API's request parsing and response shapes, without the HTTP: OpenAI
// chat completions and completions, sglang's /generate, tokenize/detokenize; OpenAI-shaped errors
// naming the field; SSE framing. Everything here is a pure function of its inputs (unit-tested in
// tests/test_server.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "sched/types.hpp"

namespace specactor::server {

using json = nlohmann::ordered_json;  // keys keep their order (a JSON Schema's properties are generated in it)

// An error answered as {"error": {"message", "type", "param", "code"}} with an HTTP status.
struct ApiError : std::runtime_error {
  int status;
  std::string type, param, code;
  ApiError(int status, std::string message, std::string param = {}, std::string type = "invalid_request_error",
           std::string code = {});
};
json error_body(const ApiError& e);
// The body for a bare HTTP status (404 route, 405, 413, ...).
json status_error_body(int status, const std::string& message);

enum class Endpoint { Chat, Completion, Generate };

// A parsed generation request: what the engine runs and how to answer.
struct ApiRequest {
  Endpoint endpoint = Endpoint::Chat;
  sched::GenerationRequest request;
  std::string model;  // as the client named it (empty: not given)
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool tools = false;          // the model was offered tools: its <tool_call> blocks are answered as tool_calls
  std::int64_t n = 1;          // choices (server/choices.hpp), 1..kMaxChoices
  // How this request spells the engine's fields (for errors): the length limit, the prompt, the
  // sampling fields' prefix ("sampling_params" for /generate).
  std::string max_tokens_name = "max_tokens", prompt_name = "prompt", sampling_prefix;
};

// The engine's field names (sched::check_request) as the request spells them; max_tokens unset means
// as many as the context leaves room for (OpenAI's rule), more than fits is a 400.
std::function<std::string(const std::string&)> api_field_names(const ApiRequest& r);
// An engine refusal as a 400 naming the API's field, with its code (e.g. "context_length_exceeded").
ApiError request_error(const sched::RequestError& e);

// Limits the parser needs: the served model's name (a request naming another model is a 404).
struct ApiLimits {
  std::string model_name;
};

// The most choices (`n`) one request may ask for.
inline constexpr std::int64_t kMaxChoices = 16;

// Error messages quoting client input are cut to this many characters.
inline constexpr std::size_t kMaxErrorChars = 300;

// Parse a request body (already JSON). Throw ApiError (400 naming the field, 404 for an unknown
// model) on anything malformed: wrong types, values out of range, unsupported features (echo, suffix,
// best_of other than n), no messages/prompt.
ApiRequest parse_chat(const json& body, const ApiLimits& limits);
ApiRequest parse_completion(const json& body, const ApiLimits& limits);
ApiRequest parse_generate(const json& body, const ApiLimits& limits);
// /tokenize: {"prompt"} or {"messages"} (a chat, templated as generation would); /detokenize: {"tokens"},
// each an id below vocab_size. A 400 naming the field otherwise.
sched::GenerationRequest parse_tokenize(const json& body, const ApiLimits& limits);
std::vector<std::int32_t> parse_detokenize(const json& body, std::int64_t vocab_size);
// Parses the text as JSON; a syntax error or a non-object is a 400.
json parse_body(const std::string& text);
// A media type is JSON when it is application/json or application/<something>+json, parameters aside.
bool is_json_type(const std::string& content_type);

// What came back from the engine for one request.
struct Outcome {
  std::vector<std::int32_t> tokens;
  std::vector<kernels::TokenLogprob> logprobs;     // when the request asked (sched::GenerationRequest::logprobs)
  std::function<std::string(std::int32_t)> piece;  // a token's bytes, for the logprobs' token strings
  std::string text;
  std::string finish_reason;  // stop | length | cancelled | error
  std::string error;
  bool invalid_request = false;  // the engine refused the request itself (e.g. beyond the KV budget): a 400
  bool tools = false;            // ApiRequest::tools
  std::int64_t prompt_tokens = 0;
  sched::RequestMetrics metrics;
};

// The per-request speculative metrics every response carries ("speculative": {...}).
json speculative_json(const sched::RequestMetrics& m);

// Complete (non-streamed) responses.
json chat_response(const std::string& id, std::int64_t created, const std::string& model, const Outcome& o);
json completion_response(const std::string& id, std::int64_t created, const std::string& model, const Outcome& o);
json generate_response(const std::string& id, const Outcome& o);

// Streamed chunks. delta: new text; finish_reason empty while the request runs.
json chat_chunk(const std::string& id, std::int64_t created, const std::string& model, const std::string& delta,
                bool first, const std::string& finish_reason, const json& logprobs = nullptr);
json completion_chunk(const std::string& id, std::int64_t created, const std::string& model, const std::string& delta,
                      const std::string& finish_reason, const json& logprobs = nullptr);
// A choice's "logprobs" for `tokens` (the whole answer, or a chunk's) and their log probabilities:
// chat {"content": [{token, logprob, bytes, top_logprobs: [...]}]}, completions {tokens, token_logprobs,
// top_logprobs: [{token: logprob}], text_offset} (offsets from `offset`); null when none were asked.
json logprobs_json(Endpoint e, const std::vector<std::int32_t>& tokens, const std::vector<kernels::TokenLogprob>& lps,
                   const std::function<std::string(std::int32_t)>& piece, std::size_t offset = 0);
// A streamed chunk's: the event's tokens (completions' offsets after the text before them, `o` having
// absorbed the event); null when the event has none.
json chunk_logprobs(Endpoint e, const sched::TokenEvent& ev, const Outcome& o);
// stream_options.include_usage: the last chunk before [DONE] (choices empty).
json usage_chunk(Endpoint e, const std::string& id, std::int64_t created, const std::string& model, const Outcome& o);
json usage_json(const Outcome& o);

// The finish reason as OpenAI spells it (cancelled/error have no OpenAI name: "abort"/"error").
std::string openai_finish_reason(const std::string& engine_reason);

// Server-sent events: one `data: ...` event (the payload must be one line, as JSON dumps are),
// and the terminating `data: [DONE]`.
std::string sse_event(const json& payload);
std::string sse_done();

}  // namespace specactor::server
