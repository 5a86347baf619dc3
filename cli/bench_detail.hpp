// cli/bench_detail.hpp — what the files of `specactor bench`'s speculative runs share (bench_spec.cpp:
// prompts, plain-vs-speculative runs and the report; bench_concurrent.cpp: concurrent requests and
// the budget's summary; bench_drafters.cpp: every drafter against plain decoding). Not an API.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "actors/engine.hpp"

namespace specactor::cli::bench_detail {

namespace sa = specactor::actors;
using json = nlohmann::json;

struct Prompt {
  std::string category, text;
  std::int64_t max_new = 0;  // its own "max_new_tokens" (0: the run's --max-new-tokens)
  bool chat = true;          // "chat": false sends the text as a completion (base models)
};

// A prompt may contain {previous}: the answer to the prompt before it goes there (an edit loop that
// rewrites the same file again and again). See resolve_chain.
constexpr std::string_view kPrevious = "{previous}";

struct Run {
  std::vector<std::int32_t> tokens;
  double tps = 0, tau = 0;
  std::int64_t drafted = 0, accepted = 0;
};

struct Setting {
  std::string label;
  std::vector<std::string> flags;
  std::vector<Run> runs, plain;  // speculative and plain runs, per prompt
  sa::EngineMetrics metrics;
  double median_speedup = 0, mean_tau = 0, alpha = 0;
  int mismatches = 0;
  bool own_drafter = false;  // --compare: `flags` choose the drafter; the user's drafter flags are dropped
};

// --compare ALGO[:PATH]: a setting that runs that drafter (its default shape) in the same run.
Setting compare_setting(const std::string& spec);
// The server args of a setting: the user's (less their drafter and shape flags for a --compare
// setting), then the setting's own flags.
std::vector<std::string> setting_args(const std::vector<std::string>& spec_base, const Setting& s);
// Each setting's speedup over plain and τ, per category, against the first setting's (the --compare report).
nlohmann::json against_first(const nlohmann::json& settings);
void print_against_first(const nlohmann::json& against, const std::string& first);

// Where a mode's concurrent runs spent their time (summed over its runs; engine metrics deltas).
struct ConcurrentTime {
  double wall_ms = 0, step_wall_ms = 0, compute_ms = 0, draft_ms = 0;
  std::int64_t steps = 0, tokens = 0, cache_query_tokens = 0, cache_hit_tokens = 0;
  json to_json() const {
    return {{"wall_ms", wall_ms},
            {"target_steps", steps},
            {"step_wall_ms", step_wall_ms},
            {"compute_ms", compute_ms},
            {"draft_ms", draft_ms},
            {"tokens", tokens},
            {"prompt_tokens", cache_query_tokens},
            {"prompt_tokens_from_cache", cache_hit_tokens}};
  }
};

// A run of n concurrent chat requests, all plain or all speculative, as n clients that each send
// their next request when the last one ends: `total` requests in all (the prompts in turn). Two
// figures from the same run:
//   steady — tokens streamed while n requests were in flight (from the first submission until the
//            last request was submitted) ÷ that time: what a server holding n requests delivers;
//   drain  — every token ÷ (first submission → last completion), which adds the tail where fewer
//            than n run and the run waits for its slowest requests.
struct ConcurrentRate {
  double steady = 0, drain = 0;
};

// Best of `repeats` rounds; a round is two fresh engines, each warmed up on other prompts, one running
// plain then speculative, the other speculative then plain. A drafter that remembers requests
// (SUFFIX) never sees these prompts' outputs before its speculative run. Requests per run: every
// prompt at least once and at least 6 per client, so the steady window holds several turns of each.
// The prefix cache is flushed before each timed run: otherwise the second run of an engine finds
// every prompt cached and skips its prefill (~25 % faster at 4 in flight on short answers), and the
// ratio measures which mode ran second.
struct ConcurrentResult {
  ConcurrentRate plain, spec;
  std::vector<double> pair_ratios;  // per engine: speculative ÷ plain of its two adjacent runs (steady)
  std::int64_t requests = 0;
  sa::EngineMetrics metrics;
  ConcurrentTime plain_time, spec_time;
};

// bench_spec.cpp
void add_metrics(sa::EngineMetrics& t, const sa::EngineMetrics& m);
double geometric_mean(const std::vector<double>& v);
double median(std::vector<double> v);
std::vector<Prompt> load_prompts(const std::string& path);
std::vector<Prompt> resolve_chain(const std::vector<std::string>& args, std::vector<Prompt> prompts,
                                  std::int64_t max_new);
void run_setting(const std::vector<std::string>& args, const std::vector<Prompt>& prompts, std::int64_t max_new,
                 int repeats, Setting& s);
void quiet_unless_asked(std::vector<std::string>& args);
// --speculative-num-steps, --speculative-eagle-topk, --speculative-num-draft-tokens.
bool is_spec_shape_flag(const std::string& a);
// bench_concurrent.cpp
ConcurrentResult run_concurrent(const std::vector<std::string>& args, const std::vector<Prompt>& prompts,
                                std::int64_t n, std::int64_t max_new, int repeats);
json budget_json(const sa::EngineMetrics& m);
void print_budget(const json& b);

}  // namespace specactor::cli::bench_detail
