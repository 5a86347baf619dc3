// kernels/backend.hpp — the backend table: every op as a function pointer with one signature for
// the CPU and the CUDA twin, chosen at run time by a device probe (CUDA only when it is compiled in
// and a device answers; otherwise the CPU).
#pragma once

#include <cstdint>
#include <string>

#include "kernels/cpu/matmul.hpp"
#include "kernels/spec.hpp"

namespace specactor::kernels {

struct DeviceProbe {
  bool cuda_compiled = false;  // built with kernels/cuda
  bool cuda_usable = false;    // at least one device answered
  int device_count = 0;
  std::string device_name;  // first device, when usable
  std::string reason;       // why CUDA is not usable (empty when it is)
  int cuda_runtime_version = 0;
  int nccl_version = 0;  // NCCL library version code, 0 when not compiled
};

// Probes once per process (cached); never throws.
const DeviceProbe& probe_devices();

enum class BackendKind { Cpu, Cuda };

// Every op with host pointers in and out (the CUDA entries copy in, run on the device, copy out):
// the parity tests drive both tables with the same inputs. The forward passes themselves keep data
// resident (model::LlamaRunner on the CPU, kernels/cuda/device_model.hpp on CUDA) and run these
// same kernels.
struct Backend {
  BackendKind kind;
  const char* name;
  // out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight[:]; x, out: (rows, dim); weight: (dim).
  void (*rmsnorm)(float* out, const float* x, const float* weight, int rows, int dim, float eps);
  // out (n, w.in_dim): rows tokens[i] of the embedding matrix w, dequantised.
  void (*embedding_rows)(const WeightMatrix& w, const std::int32_t* tokens, std::int64_t n, float* out);
  // y (rows, out) = x (rows, in) · Wᵀ (w packed as pack_matrix leaves it). matmul_wide: the path for
  // wide batches (CUDA: dequantise + cuBLAS; CPU: the same as matmul).
  void (*matmul)(const WeightMatrix& w, const float* x, std::int64_t rows, float* y);
  void (*matmul_wide)(const WeightMatrix& w, const float* x, std::int64_t rows, float* y);
  // Rotary embedding in place over (n_tok, n_heads, head_dim) (kernels/cpu/ops.hpp rope_cpu).
  void (*rope)(float* x, std::int64_t n_tok, std::int64_t n_heads, std::int64_t head_dim, std::int64_t rope_dim,
               const std::int32_t* positions, double base, bool neox);
  // out = silu(gate) * up, element-wise.
  void (*silu_mul)(float* out, const float* gate, const float* up, std::int64_t n);
  // Attention of n_q new queries over one layer's paged pool (n_pages pages of page_size slots of
  // n_kv_heads·head_dim floats): attention_cpu's contract, tree mask included.
  void (*attention)(const float* q, std::int64_t n_q, std::int64_t n_heads, std::int64_t n_kv_heads,
                    std::int64_t head_dim, const float* k_pool, const float* v_pool, std::int64_t n_pages,
                    const std::int32_t* pages, std::int64_t page_size, std::int64_t n_prefix, const std::uint64_t* mask,
                    float scale, float* out);
  // Greedy sampling per row (the first index of the maximum), and softmax(logits / temperature).
  void (*argmax_rows)(const float* logits, std::int64_t rows, std::int64_t vocab, std::int32_t* out);
  void (*softmax_temperature)(const float* logits, std::int64_t rows, std::int64_t vocab, float temperature,
                              float* probs);
  // Verification (kernels/spec.hpp §4, §5, §6; model/verify.hpp calls them).
  Verified (*verify_tree_greedy)(const std::vector<std::int32_t>& candidates, const Tree& tree,
                                 const std::vector<std::int32_t>& target_predict, std::int32_t b, std::int32_t n,
                                 std::int32_t num_steps_plus_one);
  Verified (*tree_sampling_target_only)(const std::vector<std::int32_t>& candidates, const Tree& tree,
                                        const std::vector<float>& target_probs, std::int64_t vocab,
                                        const std::vector<float>& coins, const std::vector<float>& final_coins,
                                        std::int32_t b, std::int32_t n, std::int32_t num_steps_plus_one,
                                        float threshold_single, float threshold_acc);
  std::vector<std::int32_t> (*chain_rejection_sampling)(const std::vector<std::int32_t>& drafts,
                                                        const std::vector<float>& draft_probs,
                                                        const std::vector<float>& target_probs, std::int64_t vocab,
                                                        const std::vector<float>& coins, float final_coin);
};

const Backend& cpu_backend();
// nullptr when CUDA is not compiled in or no device is usable.
const Backend* cuda_backend();

}  // namespace specactor::kernels
