// sched/step.hpp — what the scheduling policy hands to the workers and gets back (plain structs, no
// CAF; actors/messages.hpp makes them messages): a target step (StepBatch → StepResult), a draft
// proposal round (ProposeBatch → Proposals), and a submission.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kernels/cpu/sampling.hpp"
#include "sched/types.hpp"

namespace specactor::sched {

// One request's share of a target step.
struct StepItem {
  std::uint64_t req = 0;
  std::vector<std::int32_t> tokens;   // a prefill chunk, or [root, draft_1 .. draft_k] when decoding
  std::vector<std::int32_t> parents;  // per draft: -1 (the root) or the index of an earlier draft; empty = chain
  std::vector<float> draft_probs;     // chain drafts sampled from q: q rows (drafts × vocab) for rejection sampling
  bool prefill = false;               // tokens are prompt tokens (else [root, drafts...])
  bool sample = false;                // produce tokens: the last prefill chunk, or a decode/verify step
  kernels::SamplingParams params;
  std::uint64_t seed = 0;    // used when the worker first sees the request
  bool want_hidden = false;  // return the batch's captured layers for this item's committed rows
  bool want_kv = false;      // return the item's committed KV page table (FROZEN_KV_MTP)
};

struct StepBatch {
  std::vector<StepItem> items;
  std::vector<std::int32_t> capture;  // target layers whose outputs items with want_hidden get back
};

struct ItemResult {
  std::uint64_t req = 0;
  std::vector<std::int32_t> tokens;    // accepted drafts then the bonus token (empty for a non-final prefill chunk)
  std::int32_t accepted = 0;           // how many of the drafts were accepted
  std::int32_t drafted = 0;            // how many drafts were verified
  std::vector<float> hidden;           // want_hidden: committed rows (prefill rows, or root + accepted path)
  std::vector<std::int32_t> kv_pages;  // want_kv: the request's page table after the step
  std::int64_t kv_length = 0;
};

struct StepResult {
  std::vector<ItemResult> items;
  double compute_ms = 0;  // time the worker spent computing (the rest of a step's wall time is messaging)
};

// The draft worker's input: each request's whole token sequence (shared, immutable) and how many
// tokens it may propose.
struct ProposeItem {
  std::uint64_t req = 0;
  std::shared_ptr<const std::vector<std::int32_t>> context;
  std::int32_t max_nodes = 0;  // draft tokens (tree nodes without the root)
  std::int32_t max_depth = 0;
  kernels::SamplingParams params;
  std::uint64_t seed = 0;
  std::vector<float> hidden;  // target rows since the last proposal (see drafters::TargetFeatures)
  std::int64_t hidden_first = 0;
  std::vector<std::int32_t> kv_pages;
  std::int64_t kv_length = 0;
};
struct ProposeBatch {
  std::vector<ProposeItem> items;
};
struct Proposals {
  std::vector<std::vector<std::int32_t>> tokens;   // per item: draft tokens (possibly none)
  std::vector<std::vector<std::int32_t>> parents;  // per item: their parents (see drafters::DraftTree)
  std::vector<std::vector<float>> probs;           // per item: q rows when the drafter sampled
  double compute_ms = 0;
};

// A submission: the request and where its tokens go (host callbacks never leave the process).
struct Submission {
  std::uint64_t id = 0;
  std::vector<std::int32_t> prompt;
  GenerationRequest request;
  std::function<void(const TokenEvent&)> on_token;
};

}  // namespace specactor::sched
