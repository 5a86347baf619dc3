// kernels/spec.hpp — draft/verify kernels of speculative decoding (docs/speculative-kernels.md), CPU
// versions. Notation: b requests, k = topk, S = steps, N = draft tokens incl. the root, V = vocab.
// Trees are flat per request: node 0 is the root (the last emitted token); retrieve_index[r][i] =
// r*N + i is the node's row in the flattened verify batch; next_token[r][i] = first child or -1;
// next_sibling[r][i] = next sibling or -1. All arrays are row-major std::vectors.
#pragma once

#include <cstdint>
#include <vector>

namespace specactor::kernels {

// §1 — one step of top-k draft expansion for one request. `probs` holds the draft's distribution
// for each frontier node (n_frontier × V; n_frontier = 1 at step 0, k after), `frontier_scores`
// their path scores (ignored at step 0). Outputs the step's candidate scores and tokens
// (n_frontier × k, path score = parent score × probability), and the parents entry (step 0:
// [-1, 0..k-1]; step i: the global ids of the frontier nodes expanded), plus the new frontier (the
// best k candidates: their path scores and global candidate ids).
struct ExpandStep {
  std::vector<float> scores;               // n_frontier × k
  std::vector<std::int32_t> tokens;        // n_frontier × k
  std::vector<std::int32_t> parents;       // step 0: k + 1 entries; later: k entries
  std::vector<float> frontier_scores;      // k
  std::vector<std::int32_t> frontier_ids;  // k global candidate ids
  std::vector<std::int32_t> frontier_tokens;
};
ExpandStep topk_expand_cpu(const float* probs, std::int32_t n_frontier, std::int64_t vocab, std::int32_t k,
                           std::int32_t step, const std::vector<float>& frontier_scores,
                           const std::vector<std::int32_t>& frontier_ids);

// §2 — organize_draft_results for one request: per step the scores/tokens/parents of §1.
struct Organized {
  std::vector<std::int32_t> selected;      // N-1 candidate ids, ascending
  std::vector<std::int32_t> draft_tokens;  // N-1 tokens of the selected candidates
  std::vector<std::int32_t> parent_list;   // 1 + k(S-1)
};
Organized organize_draft_results_cpu(const std::vector<std::vector<float>>& score_list,
                                     const std::vector<std::vector<std::int32_t>>& token_list,
                                     const std::vector<std::vector<std::int32_t>>& parents_list, std::int32_t n);

// §3 — build_tree for b requests. Masks: QLEN (b·N·N bools, 1 = may attend) and QLEN bit-packed
// (b·N words, bit j = may attend node j). Returns false (and reports the node) when a selected
// candidate's parent is not in the tree.
struct Tree {
  std::vector<std::int32_t> positions;       // b·N
  std::vector<std::int32_t> retrieve_index;  // b·N
  std::vector<std::int32_t> next_token;      // b·N
  std::vector<std::int32_t> next_sibling;    // b·N
  std::vector<std::uint8_t> mask_qlen;       // b·N·N
  std::vector<std::uint64_t> mask_bits;      // b·N (N <= 64)
  std::vector<std::int32_t> parent;          // b·N, -1 for roots (convenience for compaction/tests)
  bool valid = true;
};
Tree build_tree_cpu(const std::vector<std::int32_t>& parent_list, const std::vector<std::int32_t>& selected,
                    const std::vector<std::int32_t>& seq_lens, std::int32_t b, std::int32_t k, std::int32_t n);

// A tree from explicit parents (node i's parent index, -1 for children of the root; parents come
// before children), for drafters that build trees directly (n-gram tries, chains).
Tree tree_from_parents(const std::vector<std::vector<std::int32_t>>& parents, const std::vector<std::int32_t>& seq_lens,
                       std::int32_t n);

// §4 — greedy verification. candidates (b·N, root first), target_predict (b·N). Outputs predicts
// (b·N, -1 off the accepted path), accept_index (b·(S+1), -1 padded), accept_token_num (b).
struct Verified {
  std::vector<std::int32_t> predicts;
  std::vector<std::int32_t> accept_index;
  std::vector<std::int32_t> accept_token_num;
};
Verified verify_tree_greedy_cpu(const std::vector<std::int32_t>& candidates, const Tree& tree,
                                const std::vector<std::int32_t>& target_predict, std::int32_t b, std::int32_t n,
                                std::int32_t num_steps_plus_one);

// §5 — lossless tree sampling from the target distribution only. target_probs (b·N × V) after
// temperature/top-k/top-p; coins (b·N) one per node, final_coins (b). Thresholds 1 = lossless.
Verified tree_speculative_sampling_target_only_cpu(const std::vector<std::int32_t>& candidates, const Tree& tree,
                                                   const std::vector<float>& target_probs, std::int64_t vocab,
                                                   const std::vector<float>& coins,
                                                   const std::vector<float>& final_coins, std::int32_t b,
                                                   std::int32_t n, std::int32_t num_steps_plus_one,
                                                   float threshold_single = 1.0f, float threshold_acc = 1.0f);

// §6 — chain rejection sampling for one request: drafts x_1..x_k sampled from q_i (k × V),
// target p_i (k+1 × V), coins (k) and a final coin. Returns the emitted tokens: the accepted
// drafts then one more (the corrected or bonus token).
std::vector<std::int32_t> chain_rejection_sampling_cpu(const std::vector<std::int32_t>& drafts,
                                                       const std::vector<float>& draft_probs,
                                                       const std::vector<float>& target_probs, std::int64_t vocab,
                                                       const std::vector<float>& coins, float final_coin);

// Draws from a distribution with a coin in [0, 1) (inverse CDF in id order, renormalised).
std::int32_t sample_distribution(const float* probs, std::int64_t vocab, float coin);

}  // namespace specactor::kernels

namespace specactor::kernels {

// §7 — accepted-path compaction on plain rows: rows[(base + j) * row_floats ...] = rows[(base + path[j]) * ...]
// for j = 1..path.size()-1 (path[0] is the root, path[j] >= j). The paged KV cache does the same
// per layer with KvCache::copy_slot.
void compact_accepted_rows_cpu(std::vector<float>& rows, std::int64_t row_floats, std::int64_t base,
                               const std::vector<std::int32_t>& path);

}  // namespace specactor::kernels
