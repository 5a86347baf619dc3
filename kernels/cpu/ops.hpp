// kernels/cpu/ops.hpp — the float kernels of a Llama forward on the CPU: RoPE, SiLU-gated MLP
// activation, softmax, attention over a paged KV cache with an optional tree mask.
// Every kernel treats each token independently, so results do not depend on the batch.
#pragma once

#include <cstdint>

namespace specactor::kernels {

// Rotary position embedding, in place. x: (n_tok, n_heads, head_dim); the first rope_dim values of
// each head rotate. neox = false: GGUF-llama layout, pairs (2i, 2i+1); neox = true: Hugging Face /
// NeoX layout, pairs (i, i + rope_dim/2). Angle of pair i at position p: p · base^(−2i/rope_dim).
void rope_cpu(float* x, std::int64_t n_tok, std::int64_t n_heads, std::int64_t head_dim, std::int64_t rope_dim,
              const std::int32_t* positions, double base, bool neox);

// The same in two steps, so a forward pass computes the angles once for all layers:
// table (n_tok, rope_dim) holds cos of pair i at [t][i] and sin at [t][rope_dim/2 + i].
// linear_factor > 1: linear RoPE scaling (each position divided by it).
void rope_table_cpu(const std::int32_t* positions, std::int64_t n_tok, std::int64_t rope_dim, double base, float* table,
                    double linear_factor = 1.0);
void rope_apply_cpu(float* x, std::int64_t n_tok, std::int64_t n_heads, std::int64_t head_dim, std::int64_t rope_dim,
                    const float* table, bool neox);

// exp(x) to ~1 ulp (Cephes' single-precision scheme: 0 below −86, +inf above 88, NaN stays NaN), one
// definition for the scalar and AVX2 paths of the attention softmax and SiLU (bit-identical twins).
float exp_approx(float x);
// y[i] = exp_approx(x[i]); simd: the AVX2 twin where the CPU path allows it (for its tests).
void exp_approx_many(const float* x, std::int64_t n, float* y, bool simd);

// out[i] = silu(gate[i]) * up[i] = gate[i] / (1 + exp_approx(−gate[i])) · up[i] for n values; out may
// alias gate.
void silu_mul_cpu(float* out, const float* gate, const float* up, std::int64_t n);

// out[i] = gelu_tanh(gate[i]) * up[i], GELU's tanh approximation (Gemma's MLP):
// 0.5·g·(1 + tanh(√(2/π)·(g + 0.044715·g³))); out may alias gate.
void gelu_tanh_mul_cpu(float* out, const float* gate, const float* up, std::int64_t n);

// Softmax of n values in place (max-subtracted, exp_approx, float accumulation in index order); the
// head drafters' probabilities.
void softmax_cpu(float* x, std::int64_t n);

// Element type of a KV cache's rows: float32, or IEEE half / bfloat16 (converted to float exactly
// when read; rounded to nearest even when written).
enum class KvType : std::uint8_t { F32, F16, BF16 };
constexpr std::int64_t kv_type_bytes(KvType t) { return t == KvType::F32 ? 4 : 2; }
const char* kv_type_name(KvType t);

// The KV cache of one sequence in one layer, as plain memory: slot s lives in page pages[s / page_size]
// at row s % page_size. KV head h of slot s (head_dim elements, K and the same for V) starts at
//   pages[s / page_size] · page_stride + (s % page_size) · row + h · head_stride
// where head_stride 0 means head_dim (the heads of a slot side by side, as the head drafters' scratch
// rows are). The KV cache keeps each head's slots of a page contiguous instead (row = head_dim,
// page_stride = page_size · head_dim) and each head's pages in a region of their own (head_stride =
// the pool's pages · page_stride), so attention streams a head's keys and values, and stores
// K by dimension (k_by_dim): element d of the slot at row r of a page is at
//   page · page_stride + h · head_stride + d · page_size + r
// so 16 consecutive slots' values of one dimension are one vector load. Offsets count elements.
struct PagedKvView {
  const void* k = nullptr;  // layer base of the K pool
  const void* v = nullptr;  // layer base of the V pool
  const std::int32_t* pages = nullptr;
  std::int64_t page_size = 0;
  std::int64_t page_stride = 0;  // elements per page
  std::int64_t row = 0;          // elements between consecutive slots of a page (V; K too unless k_by_dim)
  std::int64_t head_stride = 0;  // elements between consecutive KV heads of a slot (0: head_dim)
  KvType type = KvType::F32;
  bool k_by_dim = false;
};
inline std::int64_t kv_head_stride(const PagedKvView& v, std::int64_t head_dim) {
  return v.head_stride > 0 ? v.head_stride : head_dim;
}

// Attention of n_q new queries of one sequence. q, out: (n_q, n_heads, head_dim). Keys/values: slots
// [0, n_prefix + n_q) of `kv`; the new tokens occupy slots n_prefix + j. Query i sees every prefix
// slot and new slot j iff (mask ? bit j of mask[i] : j <= i) — mask is the bit-packed QLEN tree mask
// (n_q ≤ 64). Grouped heads: query head h reads KV head h / (n_heads / n_kv_heads).
void attention_cpu(const float* q, std::int64_t n_q, std::int64_t n_heads, std::int64_t n_kv_heads,
                   std::int64_t head_dim, const PagedKvView& kv, std::int64_t n_prefix, const std::uint64_t* mask,
                   float scale, float* out);

// A run of `count` slots of a paged view starting at slot `first`.
struct KvSegment {
  PagedKvView view;
  std::int64_t first = 0;
  std::int64_t count = 0;
};

// The general form (draft heads): every slot of `prefix` is visible; query i sees masked slot j iff
// (mask ? bit j of mask[i] : j <= i + masked.count - n_q). The two segments may live in different
// memory: FROZEN_KV_MTP reads the target's committed KV as the prefix and its own scratch rows as
// the masked part; a tree drafter masks over all draft nodes appended so far. masked.count ≤ 64.
// attention_cpu(kv, n_prefix, mask) is this with prefix = slots [0, n_prefix) and masked = the n_q new slots.
void attention_segments_cpu(const float* q, std::int64_t n_q, std::int64_t n_heads, std::int64_t n_kv_heads,
                            std::int64_t head_dim, const KvSegment& prefix, const KvSegment& masked,
                            const std::uint64_t* mask, float scale, float* out);

// Several sequences' attention in one call (one pass of the thread pool for a whole batch): job j's
// n_q queries at q (rows of n_heads × head_dim) see its prefix and masked segments as in
// attention_segments_cpu, and write out. Each (query, head) gets exactly the bits it would get alone.
struct AttentionJob {
  const float* q = nullptr;
  std::int64_t n_q = 0;
  KvSegment prefix, masked;
  const std::uint64_t* mask = nullptr;
  float* out = nullptr;
};
void attention_many_cpu(const AttentionJob* jobs, int n_jobs, std::int64_t n_heads, std::int64_t n_kv_heads,
                        std::int64_t head_dim, float scale);
// The same on a chosen instruction path (0 scalar, 1 AVX2, 2 AVX-512; the tests compare the twins) and
// number of threads (0: the pool's).
void attention_many_path(int path, int threads, const AttentionJob* jobs, int n_jobs, std::int64_t n_heads,
                         std::int64_t n_kv_heads, std::int64_t head_dim, float scale);

}  // namespace specactor::kernels
