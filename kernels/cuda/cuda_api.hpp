// kernels/cuda/cuda_api.hpp — the plain C++ face of kernels/cuda (no CUDA headers here, so the rest
// of the code base never sees CUDA). Compiled only when SPECACTOR_HAVE_CUDA is defined.
#pragma once

#include <string>
#include <vector>

namespace specactor::kernels::cuda {

struct ProbeResult {
  int device_count = 0;
  std::string device_name;
  std::string error;  // non-empty when the runtime call failed (e.g. no driver)
  int runtime_version = 0;
  int nccl_version = 0;
};

// Asks the CUDA runtime for devices; never throws (a machine without a driver reports an error).
ProbeResult probe();

// Host-pointer RMSNorm: copies in, runs on the current device, copies out. Throws std::runtime_error
// on a CUDA error. Same contract as rmsnorm_cpu.
void rmsnorm_cuda(float* out, const float* x, const float* weight, int rows, int dim, float eps);

// Speculative kernels (twins of kernels/spec, host vectors in and out).
struct SpecTree {
  std::vector<int> parent, next_token, next_sibling, retrieve_index, positions;
  std::vector<unsigned char> mask_full;  // per request N rows of (seq_len + N): prefix columns, then nodes
};
struct SpecVerified {
  std::vector<int> predicts, accept_index, accept_token_num;
};
SpecTree build_tree_cuda(const std::vector<int>& parent_list, const std::vector<int>& selected,
                         const std::vector<int>& seq_lens, int b, int k, int n);
SpecVerified verify_tree_greedy_cuda(const std::vector<int>& candidates, const std::vector<int>& retrieve_index,
                                     const std::vector<int>& next_token, const std::vector<int>& next_sibling,
                                     const std::vector<int>& target_predict, int b, int n, int steps1);
SpecVerified tree_speculative_sampling_target_only_cuda(
    const std::vector<int>& candidates, const std::vector<int>& retrieve_index, const std::vector<int>& next_token,
    const std::vector<int>& next_sibling, const std::vector<float>& probs, long long vocab,
    const std::vector<float>& coins, const std::vector<float>& final_coins, int b, int n, int steps1,
    float threshold_single, float threshold_acc);

}  // namespace specactor::kernels::cuda

namespace specactor::kernels::cuda {

// Top-k draft expansion (§1), organize (§2), chain rejection sampling (§6) and accepted-path row
// compaction (§7): same contracts as the CPU versions in kernels/spec.hpp.
struct SpecExpand {
  std::vector<float> scores, frontier_scores;
  std::vector<int> tokens, parents, frontier_ids, frontier_tokens;
};
SpecExpand topk_expand_cuda(const std::vector<float>& probs, int n_frontier, long long vocab, int k, int step,
                            const std::vector<float>& frontier_scores);
// Per request: all steps' scores and tokens concatenated (length L each), parents concatenated
// (length P); returns selected (b, n-1), draft tokens (b, n-1).
void organize_draft_results_cuda(const std::vector<float>& scores, const std::vector<int>& tokens, int b, int len,
                                 int n, std::vector<int>& selected, std::vector<int>& draft_tokens);
// b chains of k drafts: q (b, k, V), p (b, k+1, V), coins (b, k), final coins (b). out (b, k+1), -1 padded.
std::vector<int> chain_rejection_sampling_cuda(const std::vector<int>& drafts, const std::vector<float>& q,
                                               const std::vector<float>& p, long long vocab,
                                               const std::vector<float>& coins, const std::vector<float>& final_coins,
                                               int b, int k);
void compact_accepted_rows_cuda(std::vector<float>& rows, long long row_floats, long long base,
                                const std::vector<int>& path);

}  // namespace specactor::kernels::cuda
