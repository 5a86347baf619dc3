// sched/step.hpp — what the scheduling policy hands to the workers and gets back (plain structs, no
// CAF; actors/messages.hpp makes them messages): a target step (StepBatch → StepResult), a draft
// proposal round (ProposeBatch → Proposals), and a submission.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "drafters/draft_cache.hpp"
#include "kernels/cpu/sampling.hpp"
#include "model/step.hpp"
#include "sched/types.hpp"

namespace specactor::sched {

// A target step (StepBatch → StepResult) is plain model data (model/step.hpp).
using model::ItemResult;
using model::StepBatch;
using model::StepItem;
using model::StepResult;

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
  std::vector<std::vector<float>> scores;          // per item: each node's score (drafters::DraftTree), or none
  double compute_ms = 0;
  drafters::DraftCacheStats cache;  // the drafter's own prefix cache, so far
};

// A submission: the request and where its tokens go (host callbacks never leave the process).
struct Submission {
  std::uint64_t id = 0;
  std::vector<std::int32_t> prompt;
  GenerationRequest request;
  std::function<void(const TokenEvent&)> on_token;
};

}  // namespace specactor::sched
