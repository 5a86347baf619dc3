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

// For the H heads of one query row: acc[h][0..64) = fma(p[h][t], v[idx[t]][·], acc[h]) for t in
// [t0, t1), in t order (acc in memory between calls: the key blocks of attention_run).
template <int H>
SPECACTOR_OPS_AVX2 void accumulate64_avx2(float* acc, const float* const* p, const std::int32_t* idx, std::int64_t t0,
                                          std::int64_t t1, const float* const* v) {
  constexpr int W = H <= 2 ? 32 : (H <= 4 ? 16 : 8);  // H · W / 8 accumulators in registers
  for (int d0 = 0; d0 < 64; d0 += W) {
    __m256 a[H][W / 8];
    for (int h = 0; h < H; ++h)
      for (int j = 0; j < W / 8; ++j) a[h][j] = _mm256_loadu_ps(acc + h * 64 + d0 + 8 * j);
    for (std::int64_t t = t0; t < t1; ++t) {
      const float* vr = v[idx[t]] + d0;
      __m256 vv[W / 8];
      for (int j = 0; j < W / 8; ++j) vv[j] = _mm256_loadu_ps(vr + 8 * j);
      for (int h = 0; h < H; ++h) {
        const __m256 pv = _mm256_set1_ps(p[h][t]);
        for (int j = 0; j < W / 8; ++j) a[h][j] = _mm256_fmadd_ps(pv, vv[j], a[h][j]);
      }
    }
    for (int h = 0; h < H; ++h)
      for (int j = 0; j < W / 8; ++j) _mm256_storeu_ps(acc + h * 64 + d0 + 8 * j, a[h][j]);
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
  const __m256 n =
      _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kExpLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
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

// The softmax's sum of its 8 lanes: ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7)).
inline float lane_sum(const float* lane) {
  const float t0 = lane[0] + lane[4], t1 = lane[1] + lane[5], t2 = lane[2] + lane[6], t3 = lane[3] + lane[7];
  return (t0 + t2) + (t1 + t3);
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
  const float inv = 1.0f / lane_sum(lane);
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
  const __m256 inv = _mm256_set1_ps(1.0f / lane_sum(lane));
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
  for (std::int64_t i = 0; i < n; ++i) x[i] = x[i] - mx;
  exp_approx_many(x, n, x, true);  // the scalar and AVX2 twins give the same bits
  float sum = 0.0f;
  for (std::int64_t i = 0; i < n; ++i) sum += x[i];
  const float inv = 1.0f / sum;
  for (std::int64_t i = 0; i < n; ++i) x[i] *= inv;
}

namespace {

// The slots m of a segment (in order) for which keep(m) holds, as row pointers at column `col` of
// their K and V pages, appended to krow/vrow from index n; calls mark(m, index) for each. Pages are walked,
// not divided into. Returns the new n.
template <class Keep, class Mark>
std::int64_t list_slots(const KvSegment& seg, std::int64_t col, Keep&& keep, Mark&& mark, const float** krow,
                        const float** vrow, std::int64_t n) {
  const PagedKvView& v = seg.view;
  std::int64_t page = seg.first / v.page_size, off = seg.first % v.page_size;
  for (std::int64_t m = 0; m < seg.count; ++m) {
    if (keep(m)) {
      const std::int64_t at = v.pages[page] * v.page_stride + off * v.row + col;
      krow[n] = v.k + at;
      vrow[n] = v.v + at;
      mark(m, n++);
    }
    if (++off == v.page_size) off = 0, ++page;
  }
  return n;
}

// The thread-local buffers of attention_run.
struct RunScratch {
  std::vector<const float*> krow, vrow;
  std::vector<std::int64_t> slot;  // masked slot of each union entry (−1: a prefix slot)
  std::vector<std::int32_t> vis;   // per row: its visible union entries, in order
  std::vector<std::int64_t> nvis;
  std::vector<float> s, p, acc;
};

constexpr std::int64_t kRunRows = 16;   // rows of one run at most (bounds the score buffers)
constexpr std::int64_t kKeyBlock = 64;  // keys per block: 16 KiB of K or V rows stay in L1

// Rows [ia, ib) of one job and H consecutive heads from h0 (one KV head's group, or one head) with
// head_dim 64 on the AVX2 path: every key and value row is read from memory once for the whole run
// (blocks of kKeyBlock keys serve every row and head while they are in L1). Per (row, head) the
// operations are those of the one-query loop: dot_fma per visible key in order, × scale,
// softmax_scores, then o = fma(p, v, o) over the visible keys in order.
template <int H>
SPECACTOR_OPS_AVX2 void attention_run(const AttentionJob& job, std::int64_t n_heads, std::int64_t group,
                                      std::int64_t h0, std::int64_t ia, std::int64_t ib, float scale, RunScratch& w) {
  constexpr std::int64_t D = 64;
  const std::int64_t kvh = h0 / group, R = ib - ia, Q = R * H;
  const std::int64_t lag = job.masked.count - job.n_q;
  auto visible = [&](std::int64_t i, std::int64_t m) {
    return job.mask ? ((job.mask[i] >> m) & 1u) != 0 : m <= i + lag;
  };
  // The union of the rows' visible slots, in slot order.
  const std::int64_t cap = job.prefix.count + job.masked.count;
  w.krow.resize(static_cast<std::size_t>(cap));
  w.vrow.resize(static_cast<std::size_t>(cap));
  w.slot.resize(static_cast<std::size_t>(cap));
  std::int64_t n = 0;
  auto any_row = [&](std::int64_t m) {
    for (std::int64_t i = ia; i < ib; ++i)
      if (visible(i, m)) return true;
    return false;
  };
  n = list_slots(
      job.prefix, kvh * kv_head_stride(job.prefix.view, D), [](std::int64_t) { return true; },
      [&](std::int64_t, std::int64_t u) { w.slot[static_cast<std::size_t>(u)] = -1; }, w.krow.data(), w.vrow.data(), n);
  n = list_slots(
      job.masked, kvh * kv_head_stride(job.masked.view, D), any_row,
      [&](std::int64_t m, std::int64_t u) { w.slot[static_cast<std::size_t>(u)] = m; }, w.krow.data(), w.vrow.data(),
      n);
  w.vis.resize(static_cast<std::size_t>(R * n));
  w.nvis.resize(static_cast<std::size_t>(R));
  for (std::int64_t r = 0; r < R; ++r) {
    std::int64_t c = 0;
    for (std::int64_t u = 0; u < n; ++u)
      if (w.slot[static_cast<std::size_t>(u)] < 0 || visible(ia + r, w.slot[static_cast<std::size_t>(u)]))
        w.vis[static_cast<std::size_t>(r * n + c++)] = static_cast<std::int32_t>(u);
    w.nvis[static_cast<std::size_t>(r)] = c;
  }
  // Scores of every query (row, head) with every union key, key block by key block.
  w.s.resize(static_cast<std::size_t>(Q * n + 8));
  w.p.resize(w.s.size());
  const float* qv[2 * kRunRows * 8];
  for (std::int64_t r = 0; r < R; ++r)
    for (std::int64_t h = 0; h < H; ++h) qv[r * H + h] = job.q + ((ia + r) * n_heads + h0 + h) * D;
  for (std::int64_t ub = 0; ub < n; ub += kKeyBlock) {
    const std::int64_t ue = std::min(n, ub + kKeyBlock);
    for (std::int64_t qi = 0; qi < Q; qi += 2) {
      float* s0 = w.s.data() + qi * n;
      std::int64_t c = ub;
      if (qi + 1 < Q) {
        float* s1 = s0 + n;
        for (; c + 4 <= ue; c += 4) dot_fma_2x4_avx2(qv[qi], qv[qi + 1], w.krow.data() + c, D, s0 + c, s1 + c);
        for (std::int64_t t = c; t < ue; ++t) s1[t] = dot_fma_avx2(qv[qi + 1], w.krow[static_cast<std::size_t>(t)], D);
      } else {
        for (; c + 8 <= ue; c += 8) dot_fma_1x8_avx2(qv[qi], w.krow.data() + c, D, s0 + c);
      }
      for (; c < ue; ++c) s0[c] = dot_fma_avx2(qv[qi], w.krow[static_cast<std::size_t>(c)], D);
    }
  }
  // Each query's visible scores, in order, × scale, softmax.
  for (std::int64_t r = 0; r < R; ++r) {
    const std::int32_t* vis = w.vis.data() + r * n;
    const std::int64_t nv = w.nvis[static_cast<std::size_t>(r)];
    for (std::int64_t h = 0; h < H; ++h) {
      const float* sq = w.s.data() + (r * H + h) * n;
      float* pq = w.p.data() + (r * H + h) * n;
      for (std::int64_t t = 0; t < nv; ++t) pq[t] = sq[vis[t]] * scale;
      softmax_scores_avx2(pq, nv);
    }
  }
  // Weighted sums, key block by key block (each row's accumulators kept between blocks).
  w.acc.assign(static_cast<std::size_t>(Q * D), 0.0f);
  std::int64_t cursor[kRunRows] = {};
  for (std::int64_t ub = 0; ub < n; ub += kKeyBlock) {
    const std::int64_t ue = std::min(n, ub + kKeyBlock);
    for (std::int64_t r = 0; r < R; ++r) {
      const std::int32_t* vis = w.vis.data() + r * n;
      const std::int64_t nv = w.nvis[static_cast<std::size_t>(r)];
      const std::int64_t t0 = cursor[r];
      std::int64_t t1 = t0;
      while (t1 < nv && vis[t1] < ue) ++t1;
      cursor[r] = t1;
      if (t1 == t0) continue;
      const float* pr[H];
      for (std::int64_t h = 0; h < H; ++h) pr[h] = w.p.data() + (r * H + h) * n;
      accumulate64_avx2<H>(w.acc.data() + r * H * D, pr, vis, t0, t1, w.vrow.data());
    }
  }
  for (std::int64_t r = 0; r < R; ++r)
    for (std::int64_t h = 0; h < H; ++h)
      std::memcpy(job.out + ((ia + r) * n_heads + h0 + h) * D, w.acc.data() + (r * H + h) * D, sizeof(float) * D);
}

using RunFn = void (*)(const AttentionJob&, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, float,
                       RunScratch&);
constexpr RunFn kRuns[8] = {&attention_run<1>, &attention_run<2>, &attention_run<3>, &attention_run<4>,
                            &attention_run<5>, &attention_run<6>, &attention_run<7>, &attention_run<8>};

// The one-query loop that defines the arithmetic (any head_dim; AVX2 or scalar twins).
void attention_one(const AttentionJob& job, std::int64_t n_heads, std::int64_t group, std::int64_t head_dim,
                   std::int64_t h, std::int64_t i, float scale, bool simd, RunScratch& w) {
  const std::int64_t kvh = h / group, lag = job.masked.count - job.n_q;
  const std::int64_t cap = job.prefix.count + job.masked.count;
  w.krow.resize(static_cast<std::size_t>(cap));
  w.vrow.resize(static_cast<std::size_t>(cap));
  w.s.resize(static_cast<std::size_t>(cap + 8));
  auto none = [](std::int64_t, std::int64_t) {};
  std::int64_t n = list_slots(
      job.prefix, kvh * kv_head_stride(job.prefix.view, head_dim), [](std::int64_t) { return true; }, none,
      w.krow.data(), w.vrow.data(), 0);
  n = list_slots(
      job.masked, kvh * kv_head_stride(job.masked.view, head_dim),
      [&](std::int64_t m) { return job.mask ? ((job.mask[i] >> m) & 1u) != 0 : m <= i + lag; }, none, w.krow.data(),
      w.vrow.data(), n);
  const float* qv = job.q + (i * n_heads + h) * head_dim;
  float* sc = w.s.data();
  std::int64_t c = 0;
  if (simd)
    for (; c + 8 <= n; c += 8) dot_fma_1x8_avx2(qv, w.krow.data() + c, head_dim, sc + c);
  for (; c < n; ++c)
    sc[c] = simd ? dot_fma_avx2(qv, w.krow[static_cast<std::size_t>(c)], head_dim)
                 : dot_fma(qv, w.krow[static_cast<std::size_t>(c)], head_dim);
  for (std::int64_t t = 0; t < n; ++t) sc[t] = sc[t] * scale;
  if (simd)
    softmax_scores_avx2(sc, n);
  else
    softmax_scores(sc, n);
  float* o = job.out + (i * n_heads + h) * head_dim;
  if (simd && head_dim == 64) {
    weighted_sum64_avx2(o, sc, w.vrow.data(), n);
    return;
  }
  for (std::int64_t d = 0; d < head_dim; ++d) o[d] = 0.0f;
  for (std::int64_t t = 0; t < n; ++t) {
    if (simd)
      axpy_avx2(o, sc[t], w.vrow[static_cast<std::size_t>(t)], head_dim);
    else
      for (std::int64_t d = 0; d < head_dim; ++d) o[d] = std::fma(sc[t], w.vrow[static_cast<std::size_t>(t)][d], o[d]);
  }
}

}  // namespace

void attention_many_cpu(const AttentionJob* jobs, int n_jobs, std::int64_t n_heads, std::int64_t n_kv_heads,
                        std::int64_t head_dim, float scale) {
  const std::int64_t group = n_heads / n_kv_heads;
  std::int64_t queries = 0, work = 0;
  for (int j = 0; j < n_jobs; ++j) {
    queries += jobs[j].n_q;
    work += jobs[j].n_q * n_heads * (jobs[j].prefix.count + jobs[j].masked.count) * head_dim;
  }
  // Small problems (a decode step over a short context) are not worth waking the other threads.
  const bool parallel = work >= (1 << 16);
  const bool simd = head_dim % 8 == 0 && cpu_path() != CpuPath::Scalar;
  const bool runs = simd && head_dim == 64;
  const int nth_max = parallel ? ComputePool::instance().threads() : 1;
  // Work items: (head group, query row) per job, in that order; a head group is a KV head's query
  // heads when that leaves every thread enough items, else one head. A thread's consecutive rows of
  // one head group form runs (attention_run) that read each key and value once; for a job of one
  // query, a thread's consecutive heads of one KV head do. Every (query, head) runs the same
  // operations whatever the grouping, the runs and the other sequences in the call.
  const std::int64_t hp = runs && group <= 8 && queries * n_kv_heads >= 2 * nth_max ? group : 1;
  const std::int64_t n_hg = n_heads / hp;
  // The split follows each item's cost (its keys, plus a fixed share), not the item count: a decode
  // batch's sequences differ in length, and an even count left one thread most of the keys.
  auto item_cost = [&](const AttentionJob& job) { return job.prefix.count + job.masked.count + 16; };
  std::int64_t total_cost = 0;
  for (int j = 0; j < n_jobs; ++j) total_cost += jobs[j].n_q * n_hg * item_cost(jobs[j]);
  // The first item of thread `tid`'s share: where the running cost reaches total_cost × tid / nth.
  auto boundary = [&](int tid, int nth) {
    if (tid >= nth) return queries * n_hg;
    const std::int64_t target = total_cost * tid / nth;
    std::int64_t cost = 0, base = 0;
    for (int j = 0; j < n_jobs; ++j) {
      const std::int64_t items = jobs[j].n_q * n_hg, c = item_cost(jobs[j]);
      if (cost + items * c > target) return base + (target - cost + c / 2) / c;
      cost += items * c;
      base += items;
    }
    return base;
  };
  auto share = [&](int tid, int nth) {
    thread_local RunScratch w;
    const std::int64_t begin = boundary(tid, nth), end = boundary(tid + 1, nth);
    std::int64_t base = 0;
    for (int j = 0; j < n_jobs && base < end; base += jobs[j].n_q * n_hg, ++j) {
      const AttentionJob& job = jobs[j];
      const std::int64_t lo = std::max(begin, base) - base, hi = std::min(end, base + job.n_q * n_hg) - base;
      for (std::int64_t t = lo; t < hi;) {
        const std::int64_t hg = t / job.n_q, ia = t % job.n_q;
        const std::int64_t ib = std::min({job.n_q, ia + (hi - t), ia + kRunRows});
        if (runs && hp == 1 && job.n_q == 1 && group <= 8) {
          // One query (a decode step): this thread's consecutive heads of one KV head form one run,
          // so a KV head's keys and values are read once per thread, not once per query head.
          const std::int64_t g_end = std::min((hg / group + 1) * group, hg + (hi - t));
          kRuns[g_end - hg - 1](job, n_heads, group, hg, 0, 1, scale, w);
          t += g_end - hg;
          continue;
        }
        if (runs) {
          kRuns[hp - 1](job, n_heads, group, hg * hp, ia, ib, scale, w);
        } else {
          for (std::int64_t i = ia; i < ib; ++i) attention_one(job, n_heads, group, head_dim, hg, i, scale, simd, w);
        }
        t += ib - ia;
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
