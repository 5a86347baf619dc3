// kernels/cuda/ops.cuh — device-pointer launchers of the forward's kernels (CUDA-only header, used by
// ops.cu and forward.cu; everything else sees device_model.hpp).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/device_model.hpp"

namespace specactor::kernels::cuda::detail {

void check(cudaError_t e, const char* what);
void check_blas(cublasStatus_t s, const char* what);

// A weight matrix in device memory (HostMatrix's layout).
struct DMat {
  std::uint32_t type = 0;
  long long out = 0, in = 0;
  const std::uint8_t* data = nullptr;
  std::size_t stride = 0;
};

// Where every row of a forward batch reads and writes the KV pool (all device arrays).
struct AttnRows {
  const int* row_seq = nullptr;                  // (T) the row's sequence
  const int* row_idx = nullptr;                  // (T) the row's index among its sequence's new tokens
  const long long* seq_old_len = nullptr;        // (S) slots in the cache before this step
  const int* seq_n_new = nullptr;                // (S)
  const long long* seq_page_off = nullptr;       // (S) first entry of the sequence's page table in `pages`
  const int* pages = nullptr;                    // concatenated page tables
  const unsigned long long* row_mask = nullptr;  // (T) tree mask word
  const unsigned char* row_has_mask = nullptr;   // (T) 0 = causal
};

constexpr int kMatvecRows = 8;  // activation rows per mat-vec launch

void launch_embedding(const DMat& w, const int* tokens, long long n, float* out, cudaStream_t st);
void launch_rmsnorm(float* out, const float* x, const float* w, long long rows, long long dim, float eps,
                    cudaStream_t st);
void launch_matvec(const DMat& w, const float* x, long long rows, float* y, cudaStream_t st);
void launch_dequant(const DMat& w, float* dense, cudaStream_t st);
// y (rows, out) = x (rows, in) · denseᵀ with dense (out, in) row-major, FP32 (no TF32).
void gemm_rows(cublasHandle_t h, const float* dense, long long out, long long in, const float* x, long long rows,
               float* y);
void launch_rope(float* x, long long n_tok, long long n_heads, long long head_dim, long long rope_dim,
                 const int* positions, double base, bool neox, cudaStream_t st);
void launch_silu_mul(float* out, const float* gate, const float* up, long long n, cudaStream_t st);
void launch_add(float* x, const float* y, long long n, cudaStream_t st);
void launch_kv_write(const float* k, const float* v, long long T, long long row, float* k_layer, float* v_layer,
                     long long page_size, long long page_stride, const AttnRows& r, cudaStream_t st);
void launch_attention(const float* q, long long T, long long n_heads, long long n_kv_heads, long long head_dim,
                      const float* k_layer, const float* v_layer, long long page_size, long long page_stride,
                      const AttnRows& r, float scale, float* out, cudaStream_t st);
void launch_gather_rows(const float* x, const int* rows, long long n, long long dim, float* out, cudaStream_t st);
void launch_copy_slot(float* k_pool, float* v_pool, long long layers, long long layer_stride, long long row,
                      long long from_off, long long to_off, cudaStream_t st);
void launch_argmax(const float* logits, long long rows, long long vocab, int* out, cudaStream_t st);
void launch_softmax_t(const float* logits, long long rows, long long vocab, float temperature, float* probs,
                      cudaStream_t st);

}  // namespace specactor::kernels::cuda::detail
