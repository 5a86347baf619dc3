#include "kernels/cpu/ops.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/matmul.hpp"  // cpu_path
#include "kernels/cpu/pool.hpp"

namespace specactor::kernels {

namespace {

// exp_approx: Cephes' single-precision exp (range reduction by ln 2 in two parts, a degree-5
// polynomial), every step an explicit fma or IEEE operation so the AVX2 twin matches bit for bit.
constexpr float kExpLog2e = 1.44269504088896341f;
constexpr float kExpLn2Hi = -0.693359375f, kExpLn2Lo = 2.12194440e-4f;  // −ln 2 = kExpLn2Hi + kExpLn2Lo
constexpr float kExpP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                            4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
constexpr float kExpMax = 88.0f, kExpMin = -86.0f;  // inside: 2^n keeps the result normal

}  // namespace
float exp_approx(float x);
namespace {

#define SPECACTOR_OPS_AVX2 __attribute__((target("avx2,fma")))

// Attention's arithmetic, one definition for the scalar loops and their AVX2 twins (bit-identical):
//   dot:      8 lanes, acc[l] = fma(a[i], b[i], acc[l]) for i ≡ l (mod 8) in increasing i, then
//             ((acc0+acc1) + (acc2+acc3)) + ((acc4+acc5) + (acc6+acc7))
//   softmax:  s = dot·scale; m = max s; e = exp_approx(s − m); sum over 8 lanes (lane c mod 8, in c
//             order) reduced like dot; p = e · (1/sum)
//   output:   o[d] = fma(p[c], v[c][d], o[d]) in c order, from 0.
float dot_fma(const float* a, const float* b, std::int64_t n) {
  float acc[8] = {};
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] = std::fma(a[i + l], b[i + l], acc[l]);
  for (; i < n; ++i) acc[i % 8] = std::fma(a[i], b[i], acc[i % 8]);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// H(a) = ((a0+a1)+(a2+a3)) + ((a4+a5)+(a6+a7)), dot_fma's reduction.
SPECACTOR_OPS_AVX2 inline float hsum8_avx2(__m256 acc) {
  const __m256 h = _mm256_hadd_ps(acc, acc);  // a0+a1, a2+a3 | a4+a5, a6+a7 (twice)
  const __m256 h2 = _mm256_hadd_ps(h, h);     // (a0+a1)+(a2+a3) | (a4+a5)+(a6+a7)
  return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(h2), _mm256_extractf128_ps(h2, 1)));
}

// H of 8 accumulators at once: lane j of the result is H(a[j]).
SPECACTOR_OPS_AVX2 inline __m256 reduce8_avx2(const __m256* a) {
  const __m256 c0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 c1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(c0, c1, 0x20), _mm256_permute2f128_ps(c0, c1, 0x31));
}

// dot_fma of two queries with four keys each (8 chains; 6 loads per 8 fma). n: a multiple of 8.
SPECACTOR_OPS_AVX2 void dot_fma_2x4_avx2(const float* q0, const float* q1, const float* const* k, std::int64_t n,
                                         float* out0, float* out1) {
  __m256 acc[8];
  for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
  for (std::int64_t i = 0; i < n; i += 8) {
    const __m256 a0 = _mm256_loadu_ps(q0 + i), a1 = _mm256_loadu_ps(q1 + i);
    for (int j = 0; j < 4; ++j) {
      const __m256 kv = _mm256_loadu_ps(k[j] + i);
      acc[j] = _mm256_fmadd_ps(a0, kv, acc[j]);
      acc[4 + j] = _mm256_fmadd_ps(a1, kv, acc[4 + j]);
    }
  }
  alignas(32) float r[8];
  _mm256_store_ps(r, reduce8_avx2(acc));
  for (int j = 0; j < 4; ++j) out0[j] = r[j], out1[j] = r[4 + j];
}

// dot_fma of one query with eight keys. n: a multiple of 8.
SPECACTOR_OPS_AVX2 void dot_fma_1x8_avx2(const float* q, const float* const* k, std::int64_t n, float* out) {
  __m256 acc[8];
  for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
  for (std::int64_t i = 0; i < n; i += 8) {
    const __m256 a = _mm256_loadu_ps(q + i);
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(a, _mm256_loadu_ps(k[j] + i), acc[j]);
  }
  _mm256_storeu_ps(out, reduce8_avx2(acc));
}

SPECACTOR_OPS_AVX2 float dot_fma_avx2(const float* a, const float* b, std::int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  for (std::int64_t i = 0; i < n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  return hsum8_avx2(acc);
}

// o = Σ_c p[c] · v[c] over 64 elements, kept in registers, each element accumulated in c order.
SPECACTOR_OPS_AVX2 void weighted_sum64_avx2(float* o, const float* p, const float* const* v, std::int64_t n) {
  __m256 acc[8];
  for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
  for (std::int64_t c = 0; c < n; ++c) {
    const __m256 pv = _mm256_set1_ps(p[c]);
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(pv, _mm256_loadu_ps(v[c] + 8 * j), acc[j]);
  }
  for (int j = 0; j < 8; ++j) _mm256_storeu_ps(o + 8 * j, acc[j]);
}

// weighted_sum64_avx2 for G heads that share the value rows (grouped-query attention): each value
// row is loaded once for all G, in passes over W of the 64 elements; per element the same fma chain.
template <int G>
SPECACTOR_OPS_AVX2 void weighted_sum64_group_avx2(float* const* o, const float* const* p, const float* const* v,
                                                  std::int64_t n) {
  constexpr int W = G <= 3 ? 32 : 16;  // G · W / 8 accumulators in registers
  for (int d0 = 0; d0 < 64; d0 += W) {
    __m256 acc[G][W / 8];
    for (int g = 0; g < G; ++g)
      for (int j = 0; j < W / 8; ++j) acc[g][j] = _mm256_setzero_ps();
    for (std::int64_t c = 0; c < n; ++c) {
      __m256 vv[W / 8];
      for (int j = 0; j < W / 8; ++j) vv[j] = _mm256_loadu_ps(v[c] + d0 + 8 * j);
      for (int g = 0; g < G; ++g) {
        const __m256 pv = _mm256_set1_ps(p[g][c]);
        for (int j = 0; j < W / 8; ++j) acc[g][j] = _mm256_fmadd_ps(pv, vv[j], acc[g][j]);
      }
    }
    for (int g = 0; g < G; ++g)
      for (int j = 0; j < W / 8; ++j) _mm256_storeu_ps(o[g] + d0 + 8 * j, acc[g][j]);
  }
}

// o[d] = fma(p, v[d], o[d]), element by element.
SPECACTOR_OPS_AVX2 void axpy_avx2(float* o, float p, const float* v, std::int64_t n) {
  const __m256 pv = _mm256_set1_ps(p);
  for (std::int64_t d = 0; d < n; d += 8)
    _mm256_storeu_ps(o + d, _mm256_fmadd_ps(pv, _mm256_loadu_ps(v + d), _mm256_loadu_ps(o + d)));
}

// exp_approx (see ops.hpp) over 8 lanes: the scalar operations, lane by lane.
SPECACTOR_OPS_AVX2 __m256 exp_approx_avx2(__m256 x) {
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kExpLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(kExpLn2Hi), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(kExpLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpP[0]);
  for (int k = 1; k < 6; ++k) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpP[k]));
  __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  // × 2^n through the exponent bits (n ∈ [−124, 127] inside the range: the result stays normal)
  y = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(y), _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23)));
  y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(kExpMin), _CMP_LT_OQ));
  y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, _mm256_set1_ps(kExpMax), _CMP_GT_OQ));
  return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

// The softmax of attention over n scores (in place): exp_approx(s − max), the 8-lane sum, × 1/sum.
void softmax_scores(float* s, std::int64_t n) {
  float mx = -INFINITY;
  for (std::int64_t c = 0; c < n; ++c) mx = std::max(mx, s[c]);
  float lane[8] = {};
  for (std::int64_t c = 0; c < n; ++c) {
    s[c] = exp_approx(s[c] - mx);
    lane[c % 8] = lane[c % 8] + s[c];
  }
  const float t0 = lane[0] + lane[4], t1 = lane[1] + lane[5], t2 = lane[2] + lane[6], t3 = lane[3] + lane[7];
  const float inv = 1.0f / ((t0 + t2) + (t1 + t3));
  for (std::int64_t c = 0; c < n; ++c) s[c] = s[c] * inv;
}

SPECACTOR_OPS_AVX2 void softmax_scores_avx2(float* s, std::int64_t n) {
  const std::int64_t n8 = n / 8 * 8;
  __m256 m8 = _mm256_set1_ps(-INFINITY);
  for (std::int64_t c = 0; c < n8; c += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(s + c));
  alignas(32) float mv[8];
  _mm256_store_ps(mv, m8);
  float mx = -INFINITY;  // max is exact in any order (scores are finite or the result is NaN anyway)
  for (int l = 0; l < 8; ++l) mx = std::max(mx, mv[l]);
  for (std::int64_t c = n8; c < n; ++c) mx = std::max(mx, s[c]);
  const __m256 mxv = _mm256_set1_ps(mx);
  __m256 sum = _mm256_setzero_ps();
  for (std::int64_t c = 0; c < n8; c += 8) {
    const __m256 e = exp_approx_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + c), mxv));
    _mm256_storeu_ps(s + c, e);
    sum = _mm256_add_ps(sum, e);
  }
  alignas(32) float lane[8];
  _mm256_store_ps(lane, sum);
  for (std::int64_t c = n8; c < n; ++c) {
    s[c] = exp_approx(s[c] - mx);
    lane[c % 8] = lane[c % 8] + s[c];
  }
  const float t0 = lane[0] + lane[4], t1 = lane[1] + lane[5], t2 = lane[2] + lane[6], t3 = lane[3] + lane[7];
  const __m256 inv = _mm256_set1_ps(1.0f / ((t0 + t2) + (t1 + t3)));
  std::int64_t c = 0;
  for (; c < n8; c += 8) _mm256_storeu_ps(s + c, _mm256_mul_ps(_mm256_loadu_ps(s + c), inv));
  for (; c < n; ++c) s[c] = s[c] * _mm256_cvtss_f32(inv);
}

}  // namespace

float exp_approx(float x) {
  if (x != x) return x;
  if (x > kExpMax) return INFINITY;
  if (x < kExpMin) return 0.0f;
  const float n = std::nearbyint(x * kExpLog2e);
  float r = std::fma(n, kExpLn2Hi, x);
  r = std::fma(n, kExpLn2Lo, r);
  float p = kExpP[0];
  for (int k = 1; k < 6; ++k) p = std::fma(p, r, kExpP[k]);
  float y = std::fma(p, r * r, r) + 1.0f;
  std::uint32_t bits;
  std::memcpy(&bits, &y, 4);
  bits += static_cast<std::uint32_t>(static_cast<std::int32_t>(n)) << 23;
  std::memcpy(&y, &bits, 4);
  return y;
}

namespace {
SPECACTOR_OPS_AVX2 std::int64_t exp_approx_many_avx2(const float* x, std::int64_t n, float* y) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp_approx_avx2(_mm256_loadu_ps(x + i)));
  return i;
}
}  // namespace

void exp_approx_many(const float* x, std::int64_t n, float* y, bool simd) {
  std::int64_t i = simd && cpu_path() != CpuPath::Scalar ? exp_approx_many_avx2(x, n, y) : 0;
  for (; i < n; ++i) y[i] = exp_approx(x[i]);
}

void rope_table_cpu(const std::int32_t* positions, std::int64_t n_tok, std::int64_t rope_dim, double base,
                    float* table) {
  const std::int64_t half = rope_dim / 2;
  for (std::int64_t t = 0; t < n_tok; ++t)
    for (std::int64_t i = 0; i < half; ++i) {
      const double theta = positions[t] * std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(rope_dim));
      table[t * rope_dim + i] = static_cast<float>(std::cos(theta));
      table[t * rope_dim + half + i] = static_cast<float>(std::sin(theta));
    }
}

void rope_apply_cpu(float* x, std::int64_t n_tok, std::int64_t n_heads, std::int64_t head_dim, std::int64_t rope_dim,
                    const float* table, bool neox) {
  const std::int64_t half = rope_dim / 2;
  for (std::int64_t t = 0; t < n_tok; ++t) {
    const float* cs = table + t * rope_dim;
    const float* sn = cs + half;
    for (std::int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * head_dim;
      for (std::int64_t i = 0; i < half; ++i) {
        const std::int64_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        const float x0 = v[a], x1 = v[b];
        v[a] = x0 * cs[i] - x1 * sn[i];
        v[b] = x0 * sn[i] + x1 * cs[i];
      }
    }
  }
}

void rope_cpu(float* x, std::int64_t n_tok, std::int64_t n_heads, std::int64_t head_dim, std::int64_t rope_dim,
              const std::int32_t* positions, double base, bool neox) {
  std::vector<float> table(static_cast<std::size_t>(n_tok * rope_dim));
  rope_table_cpu(positions, n_tok, rope_dim, base, table.data());
  rope_apply_cpu(x, n_tok, n_heads, head_dim, rope_dim, table.data(), neox);
}

namespace {
SPECACTOR_OPS_AVX2 std::int64_t silu_mul_avx2(float* out, const float* gate, const float* up, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = exp_approx_avx2(_mm256_sub_ps(_mm256_setzero_ps(), g));
    _mm256_storeu_ps(out + i,
                     _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), _mm256_loadu_ps(up + i)));
  }
  return i;
}
}  // namespace

// out = g / (1 + exp_approx(−g)) · up, element by element (the AVX2 loop performs the same operations).
void silu_mul_cpu(float* out, const float* gate, const float* up, std::int64_t n) {
  std::int64_t i = cpu_path() != CpuPath::Scalar ? silu_mul_avx2(out, gate, up, n) : 0;
  for (; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + exp_approx(0.0f - g)) * up[i];
  }
}

void softmax_cpu(float* x, std::int64_t n) {
  float mx = -INFINITY;
  for (std::int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i]);
  float sum = 0.0f;
  for (std::int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = 1.0f / sum;
  for (std::int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void attention_many_cpu(const AttentionJob* jobs, int n_jobs, std::int64_t n_heads, std::int64_t n_kv_heads,
                        std::int64_t head_dim, float scale) {
  const std::int64_t group = n_heads / n_kv_heads;
  std::int64_t queries = 0, work = 0, max_ctx = 0;
  for (int j = 0; j < n_jobs; ++j) {
    const std::int64_t n_ctx = jobs[j].prefix.count + jobs[j].masked.count;
    queries += jobs[j].n_q;
    work += jobs[j].n_q * n_heads * n_ctx * head_dim;
    max_ctx = std::max(max_ctx, n_ctx);
  }
  // Small problems (a decode step over a short context) are not worth waking the other threads.
  const bool parallel = work >= (1 << 16);
  const bool simd = head_dim % 8 == 0 && cpu_path() != CpuPath::Scalar;
  const int nth_max = parallel ? ComputePool::instance().threads() : 1;
  // Work items: (query, KV head) with the group's query heads together (keys and values read once
  // for all of them) when there are enough of them for every thread; (query, head) otherwise.
  // Either way every (query, head) runs the same operations, so the result depends neither on this
  // choice nor on the other sequences in the call.
  const bool grouped = simd && group <= 8 && queries * n_kv_heads >= 2 * nth_max;
  const std::int64_t per_item = grouped ? group : 1, items_per_query = n_heads / per_item;
  auto share = [&](int tid, int nth) {
    thread_local std::vector<float> score;
    thread_local std::vector<const float*> krow, vrow;
    const std::size_t stride = static_cast<std::size_t>(max_ctx) + 8;
    score.resize(stride * static_cast<std::size_t>(per_item));
    krow.resize(static_cast<std::size_t>(max_ctx));
    vrow.resize(static_cast<std::size_t>(max_ctx));
    const std::int64_t total = queries * items_per_query;
    const std::int64_t begin = total * tid / nth, end = total * (tid + 1) / nth;
    std::int64_t base = 0;  // first item of job j
    for (int j = 0; j < n_jobs && base < end; base += jobs[j].n_q * items_per_query, ++j) {
      const AttentionJob& job = jobs[j];
      const std::int64_t lo = std::max(begin, base), hi = std::min(end, base + job.n_q * items_per_query);
      const std::int64_t lag = job.masked.count - job.n_q;  // causal default: query i sees masked slots j <= i + lag
      std::int64_t listed_i = -1, listed_kvh = -1, n = 0;
      for (std::int64_t item = lo - base; item < hi - base; ++item) {
        const std::int64_t ih = item * per_item;
        const std::int64_t i = ih / n_heads, h0 = ih % n_heads, kvh = h0 / group;
        if (i != listed_i || kvh != listed_kvh) {
          // Visible slots in order: every prefix slot, then the masked slots this query may see (the
          // heads of one group share the list). Pages are walked, not divided into.
          listed_i = i;
          listed_kvh = kvh;
          n = 0;
          auto walk = [&](const KvSegment& seg, auto&& visible) {
            const PagedKvView& v = seg.view;
            std::int64_t page = seg.first / v.page_size, off = seg.first % v.page_size;
            for (std::int64_t m = 0; m < seg.count; ++m) {
              if (visible(m)) {
                const std::int64_t at = v.pages[page] * v.page_stride + off * v.row + kvh * head_dim;
                krow[static_cast<std::size_t>(n)] = v.k + at;
                vrow[static_cast<std::size_t>(n++)] = v.v + at;
              }
              if (++off == v.page_size) off = 0, ++page;
            }
          };
          walk(job.prefix, [](std::int64_t) { return true; });
          walk(job.masked, [&](std::int64_t m) { return job.mask ? ((job.mask[i] >> m) & 1u) != 0 : m <= i + lag; });
        }
        float* sc[8];
        const float* qv[8];
        float* o[8];
        for (std::int64_t g = 0; g < per_item; ++g) {
          sc[g] = score.data() + stride * static_cast<std::size_t>(g);
          qv[g] = job.q + (i * n_heads + h0 + g) * head_dim;
          o[g] = job.out + (i * n_heads + h0 + g) * head_dim;
        }
        // Scores: pairs of heads against 4 keys at a time, a last odd head against 8 (the keys stay
        // in L1 between the item's heads); the remaining keys one by one.
        for (std::int64_t g = 0; g < per_item; g += 2) {
          std::int64_t c0 = 0;
          if (simd && g + 1 < per_item)
            for (; c0 + 4 <= n; c0 += 4)
              dot_fma_2x4_avx2(qv[g], qv[g + 1], krow.data() + c0, head_dim, sc[g] + c0, sc[g + 1] + c0);
          else if (simd)
            for (; c0 + 8 <= n; c0 += 8) dot_fma_1x8_avx2(qv[g], krow.data() + c0, head_dim, sc[g] + c0);
          for (std::int64_t h = g; h < std::min(per_item, g + 2); ++h)
            for (std::int64_t c = c0; c < n; ++c)
              sc[h][c] = simd ? dot_fma_avx2(qv[h], krow[c], head_dim) : dot_fma(qv[h], krow[c], head_dim);
        }
        for (std::int64_t g = 0; g < per_item; ++g) {
          for (std::int64_t c = 0; c < n; ++c) sc[g][c] = sc[g][c] * scale;
          if (simd)
            softmax_scores_avx2(sc[g], n);
          else
            softmax_scores(sc[g], n);
        }
        if (simd && head_dim == 64) {
          switch (per_item) {
            case 1: weighted_sum64_avx2(o[0], sc[0], vrow.data(), n); break;
            case 2: weighted_sum64_group_avx2<2>(o, sc, vrow.data(), n); break;
            case 3: weighted_sum64_group_avx2<3>(o, sc, vrow.data(), n); break;
            case 4: weighted_sum64_group_avx2<4>(o, sc, vrow.data(), n); break;
            default:
              for (std::int64_t g = 0; g < per_item; ++g) weighted_sum64_avx2(o[g], sc[g], vrow.data(), n);
          }
          continue;
        }
        for (std::int64_t g = 0; g < per_item; ++g) {
          for (std::int64_t d = 0; d < head_dim; ++d) o[g][d] = 0.0f;
          for (std::int64_t c = 0; c < n; ++c) {
            if (simd)
              axpy_avx2(o[g], sc[g][c], vrow[c], head_dim);
            else
              for (std::int64_t d = 0; d < head_dim; ++d) o[g][d] = std::fma(sc[g][c], vrow[c][d], o[g][d]);
          }
        }
      }
    }
  };
  if (parallel)
    parallel_run(share);
  else
    share(0, 1);
}

void attention_segments_cpu(const float* q, std::int64_t n_q, std::int64_t n_heads, std::int64_t n_kv_heads,
                            std::int64_t head_dim, const KvSegment& prefix, const KvSegment& masked,
                            const std::uint64_t* mask, float scale, float* out) {
  const AttentionJob job{q, n_q, prefix, masked, mask, out};
  attention_many_cpu(&job, 1, n_heads, n_kv_heads, head_dim, scale);
}

void attention_cpu(const float* q, std::int64_t n_q, std::int64_t n_heads, std::int64_t n_kv_heads,
                   std::int64_t head_dim, const PagedKvView& kv, std::int64_t n_prefix, const std::uint64_t* mask,
                   float scale, float* out) {
  attention_segments_cpu(q, n_q, n_heads, n_kv_heads, head_dim, {kv, 0, n_prefix}, {kv, n_prefix, n_q}, mask, scale,
                         out);
}

}  // namespace specactor::kernels
