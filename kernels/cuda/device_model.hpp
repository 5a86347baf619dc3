// kernels/cuda/device_model.hpp — the plain C++ face of the CUDA forward pass (no CUDA headers, so
// model/ and actors/ can use it). Compiled only when SPECACTOR_HAVE_CUDA is defined.
//
// A DeviceModel holds one rank's Llama weights and its paged KV pool in device memory and runs a
// batched forward over it: embedding, RMSNorm, RoPE, paged attention with the tree mask, SiLU-gated
// MLP, dequantising mat-vec products for Q8_0/Q4_0/Q4_1/F16/BF16/F32 (for every batch width, so a
// row's result never depends on its batch), the final norm and output head. Only token ids, page tables and masks go
// in; only the requested logits (and captured hidden rows) come back. The page *allocation* stays on the host
// (model::KvCache); the device pool mirrors its page numbering.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/comm.hpp"
#include "kernels/cpu/matmul.hpp"

namespace specactor::kernels::cuda {

// Weight matrices come as the CPU side holds them (kernels/cpu/matmul.hpp: ggml type codes; Q8_0/
// Q4_0/Q4_1 in 8-row panels, which the upload copies back to rows [d[nc]] [m[nc] (Q4_1)] [quants],
// kernels/cpu/packed.hpp: split_rows); other types are uploaded byte for byte.
// Whether the CUDA kernels compute this matrix: F32, F16, BF16, and packed Q8_0/Q4_0/Q4_1.
bool computable_on_device(const WeightMatrix& w);

struct HostLayer {
  WeightMatrix wq, wk, wv, wo, gate, up, down;
  const float* attn_norm = nullptr;
  const float* ffn_norm = nullptr;
};

// One rank's model: head counts and MLP width are this rank's share.
struct HostModel {
  std::int64_t vocab = 0, hidden = 0, ffn = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, rope_dim = 0;
  double rope_base = 10000.0, norm_eps = 1e-5;
  bool rope_neox = false;
  WeightMatrix embedding, output;
  const float* output_norm = nullptr;
  std::vector<HostLayer> layers;
};

// Not enough device memory for what the snapshot asks; the message names every share and the fix.
class DeviceOutOfMemory : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct DeviceSeq {
  const std::int32_t* pages = nullptr;  // page table (host), covering old_len + tokens slots
  std::int64_t n_pages = 0;
  std::int64_t old_len = 0;  // slots already in the cache
  std::vector<std::int32_t> tokens;
  std::vector<std::int32_t> positions;  // RoPE positions, one per token
  std::vector<std::uint64_t> mask;      // empty = causal; else one word per token (bit j: sees new token j)
  std::vector<std::int32_t> logit_rows;
};

class DeviceModel {
 public:
  // Uploads the weights to `device` and allocates a KV pool of kv_pages pages of page_size slots.
  // Throws DeviceOutOfMemory (with the sizes) when the device has too little free memory, and
  // std::runtime_error naming the tensor for a type the kernels do not compute.
  DeviceModel(const HostModel& model, int device, std::int64_t kv_pages, std::int64_t page_size, bool cuda_graphs);
  ~DeviceModel();
  DeviceModel(const DeviceModel&) = delete;
  DeviceModel& operator=(const DeviceModel&) = delete;

  // One forward over the batch. logits: (Σ logit_rows, vocab) in batch order; hidden[h]: (Σ tokens,
  // hidden) after layer hidden_layers[h]. `comm` (tensor parallel): all-reduce after the attention
  // output and the MLP down projection; a host-memory communicator is staged through the host.
  void forward(const std::vector<DeviceSeq>& batch, const std::vector<int>& hidden_layers, std::vector<float>& logits,
               std::vector<std::vector<float>>& hidden, Communicator* comm);
  // Copies slot `from` to slot `to` of a sequence in every layer (accepted-path compaction).
  void copy_slot(const std::vector<std::int32_t>& pages, std::int64_t page_size, std::int64_t from, std::int64_t to);

  int device() const;
  std::uint64_t weight_bytes() const;  // device bytes of the weights (streamed per decode step)
  std::uint64_t kv_bytes() const;
  std::int64_t graphs_captured() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Host-pointer twins of the forward's kernels, for the CPU–CUDA parity tests (each copies in, runs
// on the current device, copies out; std::runtime_error on a CUDA error).
void embedding_rows_cuda(const WeightMatrix& w, const std::vector<std::int32_t>& tokens, float* out);
// y (rows, out) = x (rows, in) · Wᵀ. gemm: dequantise and use cuBLAS instead of the mat-vec kernel.
void matmul_cuda(const WeightMatrix& w, const float* x, std::int64_t rows, float* y, bool gemm);
void rope_cuda(float* x, std::int64_t n_tok, std::int64_t n_heads, std::int64_t head_dim, std::int64_t rope_dim,
               const std::int32_t* positions, double base, bool neox);
void silu_mul_cuda(float* out, const float* gate, const float* up, std::int64_t n);
// Attention of n_q new queries over a paged pool of n_pages pages (k_pool, v_pool: n_pages ·
// page_size · row floats, one layer): the contract of kernels::attention_cpu.
void attention_cuda(const float* q, std::int64_t n_q, std::int64_t n_heads, std::int64_t n_kv_heads,
                    std::int64_t head_dim, const float* k_pool, const float* v_pool, std::int64_t n_pages,
                    const std::int32_t* pages, std::int64_t page_size, std::int64_t n_prefix, const std::uint64_t* mask,
                    float scale, float* out);
// Greedy sampling: the first index of each row's maximum.
std::vector<std::int32_t> argmax_rows_cuda(const float* logits, std::int64_t rows, std::int64_t vocab);
// Sampling probabilities with temperature (softmax(logits / t)), per row.
void softmax_temperature_cuda(const float* logits, std::int64_t rows, std::int64_t vocab, float temperature,
                              float* probs);

// Device-to-device copy bandwidth of `device` (bytes read + written per second, GB/s), measured with
// events over repeated copies of a `bytes` buffer: the practical ceiling of a memory-bound decode.
double measure_device_bandwidth_gbps(int device, std::size_t bytes = std::size_t(1) << 30);

// NCCL: one communicator per device 0 .. size-1 of this process (one rank per thread). all_reduce_sum
// takes device pointers (device_memory() is true); broadcast takes host memory.
std::vector<std::unique_ptr<Communicator>> make_nccl_group(int size);
// Test helper: uploads n floats (rank + 1) · i to the communicator's device, all-reduces them there,
// and returns the result.
std::vector<float> test_all_reduce(Communicator& comm, std::size_t n, int rank);

}  // namespace specactor::kernels::cuda
