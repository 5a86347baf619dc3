// cli/bench.hpp — the benchmark commands behind `specactor bench` (cli/bench_spec.cpp,
// cli/bench_gpu.cpp).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/model_info.hpp"

// Plain vs one speculative setting (or a --sweep of shapes) through the engine, side by side.
// `concurrency`: request counts for the concurrent part (aggregate tok/s with and without drafts).
// `compare`: further drafters (ALGO or ALGO:PATH) run as settings of the same run (--compare).
int bench_speculative(const std::vector<std::string>& server_args, const std::string& prompts_path,
                      std::int64_t max_new, int repeats, bool sweep, bool as_json, const std::string& chart,
                      const std::vector<std::int64_t>& concurrency = {}, const std::vector<std::string>& compare = {});

// A drafter to compare against plain decoding: a label and the flags that select it.
struct DrafterChoice {
  std::string label;
  std::vector<std::string> flags;
};
struct DrafterRow {
  std::string label;
  double plain_tps = 0, spec_tps = 0, median_speedup = 0, mean_tau = 0;
  bool identical = false;
  std::string error;  // set when the engine refused or failed this drafter
};
// Each drafter in turn, plain and speculative alternating per prompt (medians over the prompts).
std::vector<DrafterRow> bench_each_drafter(const std::vector<std::string>& server_args,
                                           const std::vector<DrafterChoice>& drafters, const std::string& prompts_path,
                                           std::int64_t max_new, int repeats);

// Every drafter against plain decoding on the server args' device: NGRAM, STANDALONE self-speculation
// (the first min(8, layers/2) layers), EAGLE, EAGLE3, MTP and FROZEN_KV_MTP heads, DFLASH and DSPARK
// drafters. EAGLE3, DFLASH and DSPARK are the ones shipped for `model_path` (heads/, at their shipped
// shape) where they exist; every other head or drafter is random, written for `target` to a temporary
// folder: a random drafter measures the drafting overhead, not acceptance.
std::vector<DrafterRow> bench_every_drafter(const std::vector<std::string>& server_args, const std::string& model_path,
                                            const specactor::model::ModelInfo& target, std::int64_t target_layers,
                                            const std::string& prompts_path, std::int64_t max_new, int repeats);
void print_drafter_rows(const std::vector<DrafterRow>& rows, const std::string& prompts_path, std::int64_t max_new,
                        std::int64_t repeats);
nlohmann::json drafter_rows_json(const std::vector<DrafterRow>& rows);

// `specactor bench --device cuda`: device bandwidth, decode tokens/s at batch 1 and 16 with the share
// of the bandwidth reached, then plain vs every drafter.
struct CudaBenchOptions {
  std::int64_t prompt_tokens = 256, decode_tokens = 128, repeats = 3, max_new_tokens = 64;
  std::string prompts_path = "cli/bench_prompts.jsonl";
  bool json = false;
};
int bench_cuda(const std::vector<std::string>& server_args, const CudaBenchOptions& options);
