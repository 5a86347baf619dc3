// model/verify.hpp — verification of one request's share of a target step (docs/speculative-kernels.md §4–§7),
// given the target's logits for its rows: plain sampling (no drafts), greedy tree verification,
// lossless tree sampling from the target distribution only, and chain rejection sampling with the
// draft's q rows. The spec kernels come from the backend table of the device the forward ran on.
// The result says which rows stay in the KV cache (the compaction plan), in order, root first.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/cpu/sampling.hpp"
#include "kernels/spec.hpp"

namespace specactor::model {

struct VerifyItem {
  const std::vector<std::int32_t>& tokens;   // [root, draft_1 .. draft_k]
  const std::vector<std::int32_t>& parents;  // per draft: -1 (the root) or an earlier draft; empty = chain
  const std::vector<float>& draft_probs;     // q rows of sampled chain drafts (k × vocab), or empty
  const kernels::SamplingParams& params;
  std::uint64_t seed;          // the request's: position-keyed coins (kernels::position_coin)
  std::int64_t root_position;  // the root's sequence index (the first token emitted goes at root_position + 1)
};

struct Verdict {
  std::vector<std::int32_t> tokens;  // accepted drafts, then the bonus (or corrected) token
  std::int32_t accepted = 0;         // drafts accepted
  std::int32_t drafted = 0;          // drafts verified
  std::vector<std::int32_t> path;    // node indices whose KV rows stay, root first; row j of the
                                     // draft region takes row path[j] (path[j] >= j)
  bool in_place() const;             // path is 0, 1, .., n-1: nothing to move
};

// The tree of an item's nodes (node 0, the root, at position seq_len; a chain when parents is empty).
kernels::Tree item_tree(const VerifyItem& item, std::int64_t seq_len);

// `logits`: one row per node (tokens.size() × vocab). `tree`: item_tree's, for items with drafts.
// Sampling without the draft's q (plain decoding and tree sampling from the target) draws the token at
// index i with position_coin(seed, i) and accepts the draft that equals it, so a seeded request emits
// exactly what plain sampling emits, whatever was drafted. `rng`: the request's generator, for chain
// rejection sampling with q (--speculative-use-rejection-sampling: its output depends on the drafts).
Verdict verify_step(const VerifyItem& item, const kernels::Tree& tree, const float* logits, std::int64_t vocab,
                    kernels::Rng& rng, const kernels::Backend& backend);

}  // namespace specactor::model
