// model/step.hpp — one target step as plain data: what the scheduling policy asks of the target
// (StepBatch: each request's new tokens, drafts and sampling) and what comes back (StepResult:
// accepted tokens, captured hidden rows, page tables). Below sched/ so that model::TargetStep can run
// it; sched/step.hpp re-exports the names for the policy. No CAF.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/sampling.hpp"

namespace specactor::model {

// One request's share of a target step.
struct StepItem {
  std::uint64_t req = 0;
  std::vector<std::int32_t> tokens;   // a prefill chunk, or [root, draft_1 .. draft_k] when decoding
  std::vector<std::int32_t> parents;  // per draft: -1 (the root) or the index of an earlier draft; empty = chain
  std::vector<float> draft_probs;     // chain drafts sampled from q: q rows (drafts × vocab) for rejection sampling
  bool prefill = false;               // tokens are prompt tokens (else [root, drafts...])
  bool sample = false;                // produce tokens: the last prefill chunk, or a decode/verify step
  kernels::SamplingParams params;
  // Penalties and biases on the target's rows (the worker keeps the request's history for them), and
  // when the worker first sees a request that starts on cached pages: the prompt tokens before
  // `tokens` (the rules count them; only sent when rules.needs_prompt()).
  kernels::LogitRules rules;
  std::vector<std::int32_t> history;
  std::int32_t logprobs = -1;  // >= 0: each emitted token's log probability and this many top alternatives
  // Constrained output: per row that samples (the last prefill row, or every row of [root, drafts...]),
  // one bit per token id (bit id % 32 of word id / 32, rows one after another): tokens whose bit is
  // clear are impossible there (applied after the rules). Empty: no constraint.
  std::vector<std::uint32_t> allowed;
  std::uint64_t seed = 0;    // used when the worker first sees the request
  bool want_hidden = false;  // return the batch's captured layers for this item's committed rows
  bool want_kv = false;      // return the item's committed KV page table (FROZEN_KV_MTP, the prefix cache)
  // Keep the batch's captured layers of the committed rows with the KV pages (the prefix cache: a
  // later request that starts on those pages gets them back as its first hidden rows).
  bool keep_hidden = false;
  // When the worker first sees the request: it starts on these pages (the prefix cache's, full ones),
  // holding its first prefix_len tokens; `tokens` continue from there.
  std::vector<std::int32_t> prefix_pages;
  std::int64_t prefix_len = 0;
  // Then the first copy_len slots of cached page copy_page (a partly matched page), copied into a
  // page of the request's own: `tokens` continue after prefix_len + copy_len.
  std::int32_t copy_page = -1;
  std::int64_t copy_len = 0;
};

struct StepBatch {
  std::vector<StepItem> items;
  std::vector<std::int32_t> capture;  // target layers whose outputs items with want_hidden get back
};

struct ItemResult {
  std::uint64_t req = 0;
  std::vector<std::int32_t> tokens;  // accepted drafts then the bonus token (empty for a non-final prefill chunk)
  std::vector<kernels::TokenLogprob> logprobs;  // one per token when the item asked (StepItem::logprobs)
  std::int32_t accepted = 0;                    // how many of the drafts were accepted
  std::int32_t drafted = 0;                     // how many drafts were verified
  std::vector<float> hidden;                    // want_hidden: committed rows (prefill rows, or root + accepted path)
  std::int64_t hidden_first = 0;       // the context position of hidden's first row (0 after a cache hit with rows)
  std::vector<std::int32_t> kv_pages;  // want_kv: the request's page table after the step
  std::int64_t kv_length = 0;
};

struct StepResult {
  std::vector<ItemResult> items;
  double compute_ms = 0;  // time the worker spent computing (the rest of a step's wall time is messaging)
};

}  // namespace specactor::model
