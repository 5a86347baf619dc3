// sched/types.hpp — the plain types of the embedding API and the scheduling policy (no CAF):
// requests, streamed token events, results and metrics. actors/engine.hpp re-exports them as
// specactor::actors::GenerationRequest etc.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "config/error.hpp"
#include "config/snapshot.hpp"
#include "grammar/grammar.hpp"
#include "kernels/cpu/sampling.hpp"
#include "model/chat.hpp"

namespace specactor::sched {

// Constrained output (grammar/, docs/structured-output.md): the answer is JSON — any object, or what
// a JSON Schema admits — or tool calls (<tool_call>\n{"name": …, "arguments": …}\n</tool_call>). Every
// token, drafted or not, is checked against it on the target's rows, so speculation stays lossless.
struct OutputConstraint {
  enum class Kind : std::int32_t { None = 0, JsonObject = 1, JsonSchema = 2, ToolCalls = 3 };
  Kind kind = Kind::None;
  std::string schema;  // JsonSchema: the schema's JSON text
  // ToolCalls: the functions (name, parameters schema as JSON text; "" = any object). Required: the
  // answer is calls only (tool_choice "required", or a named function — then only that one is listed);
  // else free text that may turn into calls.
  std::vector<std::string> tool_names, tool_parameters;
  bool tools_required = false;
  bool parallel_tool_calls = true;
  bool active() const { return kind != Kind::None; }
  // The request field a problem with it is reported under.
  const char* field() const { return kind == Kind::ToolCalls ? "tools" : "response_format"; }
};

// The grammar of a constraint (null for None). Throws grammar::GrammarError.
std::shared_ptr<const grammar::Grammar> compile_constraint(const OutputConstraint& c);

struct GenerationRequest {
  std::string prompt;                        // text (ignored when prompt_ids is set)
  std::vector<std::int32_t> prompt_ids;      // token ids, used as they are
  bool chat = false;                         // format `prompt` with the model's chat template
  std::string system;                        // optional system turn for chat
  std::vector<model::ChatMessage> messages;  // chat: a whole conversation (used instead of prompt/system)
  // Unset: as many as the context leaves room for (generation stops earlier at the end-of-generation
  // token or a stop string). Given: at least 1, and the prompt plus these must fit the context.
  std::optional<std::int64_t> max_new_tokens;
  kernels::SamplingParams sampling;  // greedy by default
  // Penalties, biases and min_tokens on the target's logits (kernels/cpu/sampling.hpp), speculative
  // or not; end_ids may stay empty (the model's end-of-generation ids are used).
  kernels::LogitRules rules;
  // >= 0: every generated token's log probability (kernels::token_logprob) and this many (<= 20) of the
  // most likely tokens at its position, in the events and the result; -1 = none.
  std::int32_t logprobs = -1;
  OutputConstraint constraint;        // none by default
  std::optional<std::uint64_t> seed;  // default: the snapshot's random_seed
  std::vector<std::string> stop;      // stop strings (not included in the output)
  bool ignore_eos = false;
  bool speculative = true;  // false: this request decodes without drafts even when the engine has a drafter
};

struct RequestMetrics {
  std::int64_t prompt_tokens = 0;
  std::int64_t generated_tokens = 0;
  double time_to_first_token_ms = 0;
  double decode_tokens_per_s = 0;         // tokens after the first / time after the first
  std::int64_t steps = 0;                 // decode steps (one target forward each)
  std::int64_t drafted = 0;               // draft tokens verified
  std::int64_t accepted = 0;              // draft tokens accepted
  double mean_accepted_length = 0;        // τ: tokens emitted per decode step (accepted + 1)
  std::int64_t fallbacks = 0;             // steps that ran without a draft because the drafter was gone
  std::int64_t budget_skipped = 0;        // steps that ran without a draft because the budget said it would not pay
  std::vector<std::int64_t> drafted_at;   // [d]: this request's steps whose proposal reached depth d+1
  std::vector<std::int64_t> accepted_at;  // [d]: this request's steps that accepted a token at depth d+1
  std::int64_t cached_tokens = 0;         // prompt tokens taken from the prefix cache (not prefilled)
};

struct TokenEvent {
  std::uint64_t id = 0;                         // request id
  std::vector<std::int32_t> tokens;             // tokens accepted in this step (empty on the final event of a stop)
  std::vector<kernels::TokenLogprob> logprobs;  // one per token when the request asked
  std::string text;                             // their text (complete UTF-8 only)
  bool finished = false;
  std::string finish_reason;     // "stop" | "length" | "cancelled" | "error"
  std::string error;             // set when finish_reason is "error"
  bool invalid_request = false;  // the error is the request's own (bad prompt, budget), not the engine's
  RequestMetrics metrics;        // filled on the final event

  // A request's final event when it ends with an error.
  static TokenEvent final_error(std::uint64_t id, std::string why, bool invalid = false) {
    TokenEvent ev;
    ev.id = id;
    ev.finished = true;
    ev.finish_reason = "error";
    ev.error = std::move(why);
    ev.invalid_request = invalid;
    return ev;
  }
};

struct GenerationResult {
  std::uint64_t id = 0;
  std::vector<std::int32_t> prompt_ids;
  std::vector<std::int32_t> tokens;
  std::vector<kernels::TokenLogprob> logprobs;  // one per token when the request asked
  std::string text;
  std::string finish_reason;
  std::string error;
  bool invalid_request = false;  // see TokenEvent
  RequestMetrics metrics;
};

struct EngineMetrics {
  std::int64_t requests_submitted = 0, requests_finished = 0, requests_failed = 0, requests_cancelled = 0;
  std::int64_t running = 0, queued = 0;
  std::int64_t generated_tokens = 0;
  std::int64_t steps = 0;              // target forward calls
  std::int64_t decode_steps = 0;       // per-request decode steps
  std::int64_t speculative_steps = 0;  // of those, steps of requests that draft (τ is over these)
  std::int64_t drafted = 0, accepted = 0;
  double mean_accepted_length = 0;          // τ over all decode steps
  double acceptance_rate = 0;               // α = accepted / drafted
  std::int64_t draft_failures = 0;          // times the draft worker died
  std::string draft_error;                  // why it last died (e.g. a head file that does not fit the target)
  std::int64_t fallback_steps = 0;          // per-request decode steps run without a draft after a failure
  bool adaptive = false;                    // --speculative-adaptive: the budget decides what is drafted and verified
  std::int64_t budget_skipped_steps = 0;    // per-request decode steps run without a draft by the budget
  std::int64_t grammar_drafts = 0;          // drafts a constrained request's grammar forced (jump-forward)
  std::int64_t grammar_masks = 0;           // token masks sent with constrained rows
  std::int64_t grammar_masks_computed = 0;  // of those, computed (the rest came from the cache)
  double grammar_mask_ms = 0;               // Σ time the scheduler spent on them
  std::vector<std::int64_t>
      verified_nodes;            // [n]: per-request decode steps that verified n draft nodes (last: n or more)
  double calibration_error = 0;  // acceptance model: expected calibration error of its node predictions
  double calibrated_nodes = 0;   // predictions that error covers
  // The drafter's own scores (heads: path probabilities; DSPARK: products of its confidences) as
  // predictions of acceptance: their expected calibration error and how many verified nodes it covers.
  double draft_score_calibration_error = 0;
  double draft_scored_nodes = 0;
  std::vector<double> step_cost;  // cost model: c(k) = step time of k rows ÷ 1 row, k = 1, 2, 4, 8, 16, 32
  double step_ms_1 = 0;           // cost model: one row's step time, ms (short context)
  std::string budget_memory;      // what the budget started from: "read FILE", "new FILE", "off", or the problem
  bool draft_alive = false;
  std::string draft_model;                // the drafter's model config (JSON text), asked when its worker came up
  std::string algorithm;                  // the speculative algorithm in the draft snapshot ("NONE" without)
  double step_wall_ms = 0;                // Σ wall time of target steps seen by the scheduler
  double step_compute_ms = 0;             // Σ compute time reported by the target worker
  double draft_ms = 0;                    // Σ wall time of propose calls
  std::vector<std::int64_t> drafted_at;   // [d]: decode steps whose proposal reached depth d+1
  std::vector<std::int64_t> accepted_at;  // [d]: decode steps that accepted a token at depth d+1
  std::string target_error;               // set once the target worker has failed
  std::int64_t kv_pages_total = 0,
               kv_pages_free = 0;        // the target's KV pool (pages neither reserved by requests nor cached)
  bool prefix_cache = false;             // the prefix cache is on
  std::int64_t cache_query_tokens = 0;   // prompt tokens of requests that looked the cache up
  std::int64_t cache_hit_tokens = 0;     // of those, found in the cache
  std::int64_t cache_pages = 0;          // pages the cache holds now
  std::int64_t cache_evicted_pages = 0;  // pages it gave up for room (or a flush)
  // The drafter's own prefix cache (STANDALONE's draft KV, a one-layer head's KV), as of its last
  // proposal: slots asked for at requests' starts, found cached, pages held, pages given up.
  std::int64_t draft_cache_query_tokens = 0, draft_cache_hit_tokens = 0, draft_cache_pages = 0,
               draft_cache_evicted_pages = 0;
};

// The smallest usable temperature and top-p (0 temperature = greedy).
inline constexpr float kMinTemperature = 1e-5f, kMinTopP = 1e-5f;

// A request the engine refuses: the field (as the caller spells it) and an OpenAI-style error code
// ("invalid_value", or "context_length_exceeded" when it does not fit the context). what() is
// "FIELD: why".
class RequestError : public config::ConfigError {
 public:
  RequestError(std::string f, const std::string& why, std::string c = "invalid_value")
      : config::ConfigError(f + ": " + why), field(std::move(f)), code(std::move(c)) {}
  std::string field, code;
};

// What the model and the engine allow (0 = not known yet: the rules that need it are not checked).
struct RequestLimits {
  std::int64_t context_length = 0;  // the resolved --context-length
  std::int64_t vocab_size = 0;
};

// The one check of a request: the server, the CLI, an embedding host (EngineApi::prepare) and the
// scheduler's admission all call it. Its own fields: max_new_tokens >= 1 when given, sampling values
// finite and in range (temperature 0 or >= 1e-5, top_p in [1e-5, 1], top_k >= 0, min_p in [0, 1)),
// stop strings non-empty UTF-8, a constraint that compiles (its field: "response_format" or "tools"). With limits, on
// the tokenized request (prompt_ids): ids inside the vocabulary, and the context rule — the prompt leaves room for at
// least one new token, and a given max_new_tokens fits in that room (else "context_length_exceeded"; it is never
// shortened); unset, the request gets the room. Throws RequestError naming the field as `name` spells it (default: the
// field's own name, "prompt_ids" for the prompt).
void check_request(const GenerationRequest& r, const RequestLimits& limits = {},
                   const std::function<std::string(const std::string& field)>& name = {});

// The tokens a checked request may generate: max_new_tokens, or the room the context leaves.
std::int64_t new_token_budget(const GenerationRequest& r, std::int64_t prompt_tokens, std::int64_t context_length);

// The snapshot objects each party holds, for the isolation tests.
struct SnapshotReport {
  config::Snapshot resolved_target;  // what the scheduler resolved
  config::Snapshot target_worker;    // what the target worker holds
  config::Snapshot derived_draft;    // what the scheduler derived (null without an algorithm)
  config::Snapshot draft_worker;     // what the draft worker holds (null without a live worker)
};

}  // namespace specactor::sched
