// kernels/backend.cpp — device probe and the CPU/CUDA backend tables.
#include "kernels/backend.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/rmsnorm.hpp"
#include "kernels/cpu/sampling.hpp"
#ifdef SPECACTOR_HAVE_CUDA
#include "kernels/cuda/cuda_api.hpp"
#include "kernels/cuda/device_model.hpp"
#endif

namespace specactor::kernels {

const DeviceProbe& probe_devices() {
  static const DeviceProbe probe = [] {
    DeviceProbe p;
#ifdef SPECACTOR_HAVE_CUDA
    p.cuda_compiled = true;
    const cuda::ProbeResult r = cuda::probe();
    p.device_count = r.device_count;
    p.device_name = r.device_name;
    p.cuda_runtime_version = r.runtime_version;
    p.nccl_version = r.nccl_version;
    p.cuda_usable = r.error.empty() && r.device_count > 0;
    if (!r.error.empty())
      p.reason = r.error;
    else if (r.device_count == 0)
      p.reason = "the CUDA runtime reports no devices";
#else
    p.reason = "built without CUDA (no nvcc at configure time, or -DSPECACTOR_CUDA=OFF)";
#endif
    return p;
  }();
  return probe;
}

namespace {

void embedding_rows_cpu(const WeightMatrix& w, const std::int32_t* tokens, std::int64_t n, float* out) {
  for (std::int64_t i = 0; i < n; ++i) weight_row(w, tokens[i], out + i * w.in_dim);
}

void attention_pool_cpu(const float* q, std::int64_t n_q, std::int64_t n_heads, std::int64_t n_kv_heads,
                        std::int64_t head_dim, const float* k_pool, const float* v_pool, std::int64_t /*n_pages*/,
                        const std::int32_t* pages, std::int64_t page_size, std::int64_t n_prefix,
                        const std::uint64_t* mask, float scale, float* out) {
  const std::int64_t row = n_kv_heads * head_dim;
  const PagedKvView view{k_pool, v_pool, pages, page_size, page_size * row, row};
  attention_cpu(q, n_q, n_heads, n_kv_heads, head_dim, view, n_prefix, mask, scale, out);
}

void argmax_rows_cpu(const float* logits, std::int64_t rows, std::int64_t vocab, std::int32_t* out) {
  for (std::int64_t r = 0; r < rows; ++r) out[r] = argmax(logits + r * vocab, vocab);
}

void softmax_temperature_cpu(const float* logits, std::int64_t rows, std::int64_t vocab, float temperature,
                             float* probs) {
  SamplingParams p;
  p.temperature = temperature;
  std::vector<float> row;
  for (std::int64_t r = 0; r < rows; ++r) {
    sampling_probs(logits + r * vocab, vocab, p, row);
    std::copy(row.begin(), row.end(), probs + r * vocab);
  }
}

#ifdef SPECACTOR_HAVE_CUDA
void embedding_rows_gpu(const WeightMatrix& w, const std::int32_t* tokens, std::int64_t n, float* out) {
  cuda::embedding_rows_cuda(w, std::vector<std::int32_t>(tokens, tokens + n), out);
}
void matmul_gpu(const WeightMatrix& w, const float* x, std::int64_t rows, float* y) {
  cuda::matmul_cuda(w, x, rows, y, false);
}
void matmul_wide_gpu(const WeightMatrix& w, const float* x, std::int64_t rows, float* y) {
  cuda::matmul_cuda(w, x, rows, y, true);
}
void argmax_rows_gpu(const float* logits, std::int64_t rows, std::int64_t vocab, std::int32_t* out) {
  const auto ids = cuda::argmax_rows_cuda(logits, rows, vocab);
  std::copy(ids.begin(), ids.end(), out);
}
Verified to_verified(cuda::SpecVerified&& v) {
  return Verified{std::move(v.predicts), std::move(v.accept_index), std::move(v.accept_token_num)};
}
Verified verify_tree_greedy_gpu(const std::vector<std::int32_t>& candidates, const Tree& tree,
                                const std::vector<std::int32_t>& target_predict, std::int32_t b, std::int32_t n,
                                std::int32_t steps1) {
  return to_verified(cuda::verify_tree_greedy_cuda(candidates, tree.retrieve_index, tree.next_token, tree.next_sibling,
                                                   target_predict, b, n, steps1));
}
Verified tree_sampling_target_only_gpu(const std::vector<std::int32_t>& candidates, const Tree& tree,
                                       const std::vector<float>& probs, std::int64_t vocab,
                                       const std::vector<float>& coins, const std::vector<float>& final_coins,
                                       std::int32_t b, std::int32_t n, std::int32_t steps1, float threshold_single,
                                       float threshold_acc) {
  return to_verified(cuda::tree_speculative_sampling_target_only_cuda(
      candidates, tree.retrieve_index, tree.next_token, tree.next_sibling, probs, vocab, coins, final_coins, b, n,
      steps1, threshold_single, threshold_acc));
}
std::vector<std::int32_t> chain_rejection_sampling_gpu(const std::vector<std::int32_t>& drafts,
                                                       const std::vector<float>& q, const std::vector<float>& p,
                                                       std::int64_t vocab, const std::vector<float>& coins,
                                                       float final_coin) {
  // One chain (b = 1); the kernel pads its output with -1.
  std::vector<std::int32_t> out =
      cuda::chain_rejection_sampling_cuda(drafts, q, p, vocab, coins, {final_coin}, 1, static_cast<int>(drafts.size()));
  out.erase(std::find(out.begin(), out.end(), -1), out.end());
  return out;
}
#endif

}  // namespace

const Backend& cpu_backend() {
  static const Backend b{BackendKind::Cpu,
                         "cpu",
                         &rmsnorm_cpu,
                         &embedding_rows_cpu,
                         &matmul,
                         &matmul,
                         &rope_cpu,
                         &silu_mul_cpu,
                         &attention_pool_cpu,
                         &argmax_rows_cpu,
                         &softmax_temperature_cpu,
                         &verify_tree_greedy_cpu,
                         &tree_speculative_sampling_target_only_cpu,
                         &chain_rejection_sampling_cpu};
  return b;
}

const Backend* cuda_backend() {
#ifdef SPECACTOR_HAVE_CUDA
  static const Backend b{BackendKind::Cuda,
                         "cuda",
                         &cuda::rmsnorm_cuda,
                         &embedding_rows_gpu,
                         &matmul_gpu,
                         &matmul_wide_gpu,
                         &cuda::rope_cuda,
                         &cuda::silu_mul_cuda,
                         &cuda::attention_cuda,
                         &argmax_rows_gpu,
                         &cuda::softmax_temperature_cuda,
                         &verify_tree_greedy_gpu,
                         &tree_sampling_target_only_gpu,
                         &chain_rejection_sampling_gpu};
  return probe_devices().cuda_usable ? &b : nullptr;
#else
  return nullptr;
#endif
}

}  // namespace specactor::kernels
