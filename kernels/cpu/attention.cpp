// kernels/cpu/attention.cpp — attention over a paged KV cache (float32, float16 or bfloat16 rows) in
// one streaming pass with an online softmax.
//
// The arithmetic, for one query (a row and a head) whose visible keys, in order, are t = 0 … n−1
// (every prefix slot, then the masked slots the query sees). The scalar twin below is the
// definition; the AVX2 and AVX-512 paths perform the same operations and give the same bits.
//   score    s_t = (fma chain over d = 0 … D−1 of q[d]·k_t[d], from 0) · scale
//   blocks   t is cut into blocks of 16 (block b: t ∈ [16b, 16b + 16)), and blocks into chunks of
//            kChunk keys. A chunk's state is (m, l[16], o[D]), from (−inf, 0, 0). Per block:
//              bm = max of the block's scores; if bm > m: a = exp_approx(m − bm), l[·] ·= a,
//              o[·] ·= a, m = bm;  p_t = exp_approx(s_t − m);  l[t mod 16] += p_t;
//              o[d] = fma(p_t, v_t[d], o[d]) for t in order.
//   chunks   states are merged in chunk order: M = max(m, m'), a = exp_approx(m − M),
//            b = exp_approx(m' − M), l = fma(l', b, l·a), o = fma(o', b, o·a).
//   output   L = fold of l's 16 lanes by halves (l[i] + l[i+8], then +4, +2, +1), out = o · (1/L);
//            a query with no visible key gets zeros.
// A query's result depends on its own keys only: not on the other rows or sequences of the call, on
// how rows and chunks are shared among threads, nor on where its keys live (the prefix cache's pages,
// a drafter's scratch rows). Keys and values are read once per KV head for every row and query head
// of a run (up to kMaxQ queries), converted to float in a small tile that stays in L1.
#include <immintrin.h>

// GCC 12 reports the AVX-512 intrinsics' deliberately undefined source operands
// (_mm512_undefined_*) as maybe-uninitialized once they are inlined into these kernels (GCC bug
// 105593, fixed in GCC 13); no value of ours is uninitialized there.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/exp_simd.hpp"
#include "kernels/cpu/matmul.hpp"  // cpu_path
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/pool.hpp"
#include "kernels/cpu/quant.hpp"  // f16_to_f32, bf16_to_f32

namespace specactor::kernels {

const char* kv_type_name(KvType t) {
  switch (t) {
    case KvType::F32:
      return "float32";
    case KvType::F16:
      return "float16";
    case KvType::BF16:
      return "bfloat16";
  }
  return "float32";
}

namespace {

constexpr int kLanes = 16;            // keys per block: the lanes of a block's scores and sums
constexpr std::int64_t kTile = 64;    // keys gathered into float at once (4 blocks)
constexpr std::int64_t kChunk = 512;  // keys per chunk (threads may share a query's chunks)
constexpr int kMaxQ = 24;             // queries (rows × heads of one KV head) sharing a tile

enum Path { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

#define SPECACTOR_ATT_AVX2 __attribute__((target("avx2,fma,f16c")))
#define SPECACTOR_ATT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,f16c,fma")))

// ---- reading rows -------------------------------------------------------------------------------
// Every element type converts to float exactly, so the paths read the same values.

template <KvType T>
inline float element(const void* base, std::int64_t i) {
  if constexpr (T == KvType::F16) return f16_to_f32(static_cast<const std::uint16_t*>(base)[i]);
  if constexpr (T == KvType::BF16) return bf16_to_f32(static_cast<const std::uint16_t*>(base)[i]);
  return static_cast<const float*>(base)[i];
}

// 16 elements from `at` (the first n of them; the rest read as 0).
// (Masked loads and stores only where a run ends inside 16 slots: on some cores, Zen 4 among them,
// they cost several times a plain one.)
template <KvType T>
SPECACTOR_ATT_AVX512 inline __m512 load16(const void* base, std::int64_t at, int n) {
  const auto m = static_cast<__mmask16>(n >= 16 ? 0xffffu : (1u << n) - 1u);
  if constexpr (T == KvType::F32) {
    if (n >= 16) return _mm512_loadu_ps(static_cast<const float*>(base) + at);
    return _mm512_maskz_loadu_ps(m, static_cast<const float*>(base) + at);
  } else {
    const __m256i x =
        n >= 16 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const std::uint16_t*>(base) + at))
                : _mm256_maskz_loadu_epi16(m, static_cast<const std::uint16_t*>(base) + at);
    if constexpr (T == KvType::F16) return _mm512_cvtph_ps(x);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16));
  }
}

// 8 elements from `at` (the first n; the rest read as 0).
template <KvType T>
SPECACTOR_ATT_AVX2 inline __m256 load8(const void* base, std::int64_t at, int n) {
  if constexpr (T == KvType::F32) {
    const float* s = static_cast<const float*>(base) + at;
    if (n >= 8) return _mm256_loadu_ps(s);
    alignas(32) float f[8] = {};
    std::memcpy(f, s, sizeof(float) * static_cast<std::size_t>(n));
    return _mm256_load_ps(f);
  } else {
    const std::uint16_t* s = static_cast<const std::uint16_t*>(base) + at;
    __m128i x;
    if (n >= 8) {
      x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    } else {
      alignas(16) std::uint16_t h[8] = {};
      std::memcpy(h, s, sizeof(std::uint16_t) * static_cast<std::size_t>(n));
      x = _mm_load_si128(reinterpret_cast<const __m128i*>(h));
    }
    if constexpr (T == KvType::F16) return _mm256_cvtph_ps(x);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(x), 16));
  }
}

// A run of len consecutive slots of one page (from row r; `base`: the page's KV head) into the tile
// columns kt[d · kTile + i] and rows vt[i · D + d], one function per path so the loads inline.
template <KvType T>
SPECACTOR_ATT_AVX512 void read_run512(const PagedKvView& v, std::int64_t base, std::int64_t r, std::int64_t len,
                                      std::int64_t D, float* kt, float* vt) {
  const void* K = v.k;
  const std::int64_t ps = v.page_size;
  for (std::int64_t i0 = 0; v.k_by_dim && i0 < len; i0 += 16) {
    const int c = static_cast<int>(std::min<std::int64_t>(16, len - i0));
    if (c == 16) {
      for (std::int64_t d = 0; d < D; ++d)
        _mm512_storeu_ps(kt + d * kTile + i0, load16<T>(K, base + d * ps + r + i0, 16));
    } else {
      const auto m = static_cast<__mmask16>((1u << c) - 1u);
      for (std::int64_t d = 0; d < D; ++d)
        _mm512_mask_storeu_ps(kt + d * kTile + i0, m, load16<T>(K, base + d * ps + r + i0, c));
    }
  }
  if (!v.k_by_dim)
    for (std::int64_t i = 0; i < len; ++i)
      for (std::int64_t d0 = 0; d0 < D; d0 += 16) {
        alignas(64) float row[16];
        _mm512_store_ps(row, load16<T>(v.k, base + (r + i) * v.row + d0, 16));
        for (int d = 0; d < 16; ++d) kt[(d0 + d) * kTile + i] = row[d];
      }
  const void* V = v.v;
  const std::int64_t row = v.row;
  for (std::int64_t i = 0; i < len; ++i)
    for (std::int64_t d0 = 0; d0 < D; d0 += 16)
      _mm512_storeu_ps(vt + i * D + d0, load16<T>(V, base + (r + i) * row + d0, 16));
}

template <KvType T>
SPECACTOR_ATT_AVX2 void read_run256(const PagedKvView& v, std::int64_t base, std::int64_t r, std::int64_t len,
                                    std::int64_t D, float* kt, float* vt) {
  if (v.k_by_dim) {
    for (std::int64_t d = 0; d < D; ++d) {
      std::int64_t i = 0;
      for (; i + 8 <= len; i += 8)
        _mm256_storeu_ps(kt + d * kTile + i, load8<T>(v.k, base + d * v.page_size + r + i, 8));
      for (; i < len; ++i) kt[d * kTile + i] = element<T>(v.k, base + d * v.page_size + r + i);
    }
  } else {
    for (std::int64_t i = 0; i < len; ++i)
      for (std::int64_t d0 = 0; d0 < D; d0 += 8) {
        alignas(32) float row[8];
        _mm256_store_ps(row, load8<T>(v.k, base + (r + i) * v.row + d0, 8));
        for (int d = 0; d < 8; ++d) kt[(d0 + d) * kTile + i] = row[d];
      }
  }
  for (std::int64_t i = 0; i < len; ++i)
    for (std::int64_t d0 = 0; d0 < D; d0 += 8)
      _mm256_storeu_ps(vt + i * D + d0, load8<T>(v.v, base + (r + i) * v.row + d0, 8));
}

template <KvType T>
void read_run_scalar(const PagedKvView& v, std::int64_t base, std::int64_t r, std::int64_t len, std::int64_t D,
                     float* kt, float* vt) {
  for (std::int64_t i = 0; i < len; ++i)
    for (std::int64_t d = 0; d < D; ++d) {
      kt[d * kTile + i] = element<T>(v.k, v.k_by_dim ? base + d * v.page_size + r + i : base + (r + i) * v.row + d);
      vt[i * D + d] = element<T>(v.v, base + (r + i) * v.row + d);
    }
}

// A query row's visible keys: t < prefix count is prefix slot t; after that the masked slots it
// sees, listed (`list`, a tree mask) or every one from 0 (the causal default).
struct RowKeys {
  std::int64_t n = 0;
  const std::int32_t* list = nullptr;
};

// Keys [t0, t1) of a row, for KV head kvh, into the tile: kt[d · kTile + j] (K by dimension) and
// vt[j · D + d], j = t − t0. Runs of consecutive slots of one page are converted together.
template <int P, KvType T>
void gather_typed(const AttentionJob& job, const RowKeys& rk, std::int64_t kvh, std::int64_t D, std::int64_t t0,
                  std::int64_t t1, float* kt, float* vt) {
  const std::int64_t pc = job.prefix.count;
  for (std::int64_t t = t0; t < t1;) {
    const bool in_prefix = t < pc;
    const KvSegment& seg = in_prefix ? job.prefix : job.masked;
    const std::int64_t k = t - pc;
    const std::int64_t m = in_prefix ? t : (rk.list ? rk.list[k] : k);
    const PagedKvView& v = seg.view;
    const std::int64_t s = seg.first + m, r = s % v.page_size;
    const std::int64_t base = v.pages[s / v.page_size] * v.page_stride + kvh * kv_head_stride(v, D);
    const std::int64_t j = t - t0;
    // How many of the next keys are the next slots of the same page.
    std::int64_t len = std::min({t1 - t, v.page_size - r, in_prefix ? pc - t : rk.n - t});
    if (!in_prefix && rk.list)
      for (std::int64_t i = 1; i < len; ++i)
        if (rk.list[k + i] != m + i) {
          len = i;
          break;
        }
    if constexpr (P == kAvx512)
      read_run512<T>(v, base, r, len, D, kt + j, vt + j * D);
    else if constexpr (P == kAvx2)
      read_run256<T>(v, base, r, len, D, kt + j, vt + j * D);
    else
      read_run_scalar<T>(v, base, r, len, D, kt + j, vt + j * D);
    t += len;
  }
}

// The masked keys may live in memory of another type than the prefix (FROZEN_KV_MTP: the target's
// cache, then the drafter's float rows): a tile that crosses from one to the other is read in two.
template <int P>
void gather_path(const AttentionJob& job, const RowKeys& rk, std::int64_t kvh, std::int64_t D, std::int64_t t0,
                 std::int64_t t1, float* kt, float* vt) {
  const std::int64_t pc = job.prefix.count;
  auto part = [&](KvType type, std::int64_t a, std::int64_t b) {
    if (a >= b) return;
    switch (type) {
      case KvType::F16:
        return gather_typed<P, KvType::F16>(job, rk, kvh, D, a, b, kt + (a - t0), vt + (a - t0) * D);
      case KvType::BF16:
        return gather_typed<P, KvType::BF16>(job, rk, kvh, D, a, b, kt + (a - t0), vt + (a - t0) * D);
      case KvType::F32:
        return gather_typed<P, KvType::F32>(job, rk, kvh, D, a, b, kt + (a - t0), vt + (a - t0) * D);
    }
  };
  part(job.prefix.view.type, t0, std::min(t1, pc));
  part(job.masked.view.type, std::max(t0, pc), t1);
}

void gather(int path, const AttentionJob& job, const RowKeys& rk, std::int64_t kvh, std::int64_t D, std::int64_t t0,
            std::int64_t t1, float* kt, float* vt) {
  if (path == kAvx512)
    gather_path<kAvx512>(job, rk, kvh, D, t0, t1, kt, vt);
  else if (path == kAvx2)
    gather_path<kAvx2>(job, rk, kvh, D, t0, t1, kt, vt);
  else
    gather_path<kScalar>(job, rk, kvh, D, t0, t1, kt, vt);
}

// ---- scores: S[q · kTile + j] = fma chain over d of q[d] · kt[d][j], blocks [b0, b1) -----------------

void scores_scalar(const float* const* q, int nq, const float* kt, std::int64_t D, int nblocks, float* S) {
  for (int i = 0; i < nq; ++i)
    for (int j = 0; j < nblocks * kLanes; ++j) {
      float s = 0.0f;
      for (std::int64_t d = 0; d < D; ++d) s = std::fma(q[i][d], kt[d * kTile + j], s);
      S[i * kTile + j] = s;
    }
}

template <int NQ, int NB>
SPECACTOR_ATT_AVX512 void scores512(const float* const* q, const float* kt, std::int64_t D, int b0, float* S) {
  __m512 acc[NQ][NB];
  for (int i = 0; i < NQ; ++i)
    for (int b = 0; b < NB; ++b) acc[i][b] = _mm512_setzero_ps();
  for (std::int64_t d = 0; d < D; ++d) {
    __m512 k[NB];
    for (int b = 0; b < NB; ++b) k[b] = _mm512_loadu_ps(kt + d * kTile + (b0 + b) * kLanes);
    for (int i = 0; i < NQ; ++i) {
      const __m512 qd = _mm512_set1_ps(q[i][d]);
      for (int b = 0; b < NB; ++b) acc[i][b] = _mm512_fmadd_ps(qd, k[b], acc[i][b]);
    }
  }
  for (int i = 0; i < NQ; ++i)
    for (int b = 0; b < NB; ++b) _mm512_storeu_ps(S + i * kTile + (b0 + b) * kLanes, acc[i][b]);
}

template <int NQ, int NB>
SPECACTOR_ATT_AVX2 void scores256(const float* const* q, const float* kt, std::int64_t D, int b0, float* S) {
  __m256 acc[NQ][2 * NB];
  for (int i = 0; i < NQ; ++i)
    for (int b = 0; b < 2 * NB; ++b) acc[i][b] = _mm256_setzero_ps();
  for (std::int64_t d = 0; d < D; ++d) {
    __m256 k[2 * NB];
    for (int b = 0; b < 2 * NB; ++b) k[b] = _mm256_loadu_ps(kt + d * kTile + b0 * kLanes + 8 * b);
    for (int i = 0; i < NQ; ++i) {
      const __m256 qd = _mm256_broadcast_ss(q[i] + d);
      for (int b = 0; b < 2 * NB; ++b) acc[i][b] = _mm256_fmadd_ps(qd, k[b], acc[i][b]);
    }
  }
  for (int i = 0; i < NQ; ++i)
    for (int b = 0; b < 2 * NB; ++b) _mm256_storeu_ps(S + i * kTile + b0 * kLanes + 8 * b, acc[i][b]);
}

using ScoresFn = void (*)(const float* const*, const float*, std::int64_t, int, float*);

// Queries in groups of NQ, blocks NB at a time (NQ · NB accumulators, enough to hide the FMA latency).
template <int NQ>
void scores_group(int path, const float* const* q, const float* kt, std::int64_t D, int nblocks, float* S) {
  if (path == kAvx512) {
    constexpr int NB = std::max(1, std::min(4, 12 / NQ));
    int b = 0;
    for (; b + NB <= nblocks; b += NB) scores512<NQ, NB>(q, kt, D, b, S);
    for (; b < nblocks; ++b) scores512<NQ, 1>(q, kt, D, b, S);
  } else {
    constexpr int NB = std::max(1, std::min(4, 6 / NQ));
    int b = 0;
    for (; b + NB <= nblocks; b += NB) scores256<NQ, NB>(q, kt, D, b, S);
    for (; b < nblocks; ++b) scores256<NQ, 1>(q, kt, D, b, S);
  }
}

void scores(int path, const float* const* q, int nq, const float* kt, std::int64_t D, int nblocks, float* S) {
  if (path == kScalar) return scores_scalar(q, nq, kt, D, nblocks, S);
  const int step = path == kAvx512 ? 12 : 6;
  for (int i = 0; i < nq; i += step) {
    const int n = std::min(step, nq - i);
    const float* const* qi = q + i;
    float* Si = S + i * kTile;
    switch (n) {
      case 1:
        scores_group<1>(path, qi, kt, D, nblocks, Si);
        break;
      case 2:
        scores_group<2>(path, qi, kt, D, nblocks, Si);
        break;
      case 3:
        scores_group<3>(path, qi, kt, D, nblocks, Si);
        break;
      case 4:
        scores_group<4>(path, qi, kt, D, nblocks, Si);
        break;
      case 5:
        scores_group<5>(path, qi, kt, D, nblocks, Si);
        break;
      case 6:
        scores_group<6>(path, qi, kt, D, nblocks, Si);
        break;
      case 7:
        scores_group<7>(path, qi, kt, D, nblocks, Si);
        break;
      case 8:
        scores_group<8>(path, qi, kt, D, nblocks, Si);
        break;
      case 9:
        scores_group<9>(path, qi, kt, D, nblocks, Si);
        break;
      case 10:
        scores_group<10>(path, qi, kt, D, nblocks, Si);
        break;
      case 11:
        scores_group<11>(path, qi, kt, D, nblocks, Si);
        break;
      default:
        scores_group<12>(path, qi, kt, D, nblocks, Si);
        break;
    }
  }
}

// ---- one block of one query: the online softmax step and the weighted sum -------------------------
// st = (m, l[16], o[D]); S16: the block's raw dot products; nb ≥ 1 keys; vt: their value rows.

constexpr std::int64_t kStateHead = 1 + kLanes;  // floats before o in a state

void block_scalar(float* st, const float* S16, int nb, const float* vt, std::int64_t D, float scale) {
  float s[kLanes], p[kLanes];
  float bm = -INFINITY;
  for (int j = 0; j < kLanes; ++j) {
    s[j] = j < nb ? S16[j] * scale : -INFINITY;
    bm = s[j] > bm ? s[j] : bm;
  }
  float* l = st + 1;
  float* o = st + kStateHead;
  if (bm > st[0]) {
    const float a = exp_approx(st[0] - bm);
    for (int j = 0; j < kLanes; ++j) l[j] = l[j] * a;
    for (std::int64_t d = 0; d < D; ++d) o[d] = o[d] * a;
    st[0] = bm;
  }
  for (int j = 0; j < kLanes; ++j) {
    p[j] = exp_approx(s[j] - st[0]);
    l[j] = l[j] + p[j];
  }
  for (int j = 0; j < nb; ++j)
    for (std::int64_t d = 0; d < D; ++d) o[d] = std::fma(p[j], vt[j * D + d], o[d]);
}

// The SIMD paths do a tile's blocks for several queries at once: first each query's softmax steps
// (m, l, and each block's p and rescale factor), then the weighted sums with o held in registers
// across the tile, each value row loaded once for up to NQ queries. Per query and element the
// operations and their order are block_scalar's.
struct Steps {
  alignas(64) float p[kMaxQ][kTile];
  float a[kMaxQ][kTile / kLanes];
  bool rescale[kMaxQ][kTile / kLanes];
};

SPECACTOR_ATT_AVX512 void steps512(float* st, const float* Sq, int nk, float scale, float* p, float* a, bool* rs) {
  __m512 l = _mm512_loadu_ps(st + 1);
  float m = st[0];
  for (int b = 0; b * kLanes < nk; ++b) {
    const int nb = std::min(kLanes, nk - b * kLanes);
    const auto valid = static_cast<__mmask16>(nb >= kLanes ? 0xffffu : (1u << nb) - 1u);
    const __m512 s = _mm512_mask_blend_ps(valid, _mm512_set1_ps(-INFINITY),
                                          _mm512_mul_ps(_mm512_loadu_ps(Sq + b * kLanes), _mm512_set1_ps(scale)));
    const float bm = _mm512_reduce_max_ps(s);
    rs[b] = bm > m;
    if (rs[b]) {
      a[b] = _mm512_cvtss_f32(expdef::exp16(_mm512_set1_ps(m - bm)));  // exp_approx(m − bm), its twin
      l = _mm512_mul_ps(l, _mm512_set1_ps(a[b]));
      m = bm;
    }
    const __m512 pv = expdef::exp16(_mm512_sub_ps(s, _mm512_set1_ps(m)));
    l = _mm512_add_ps(l, pv);
    _mm512_store_ps(p + b * kLanes, pv);
  }
  _mm512_storeu_ps(st + 1, l);
  st[0] = m;
}

// Keys [j0, j1) of the tile; a block's rescale is applied where the block starts inside the range
// (a query whose keys run past its group's is finished by a second call from there).
template <int NQ, int W>
SPECACTOR_ATT_AVX512 void pv512(float* const* o, const Steps& w, int q0, int j0, int j1, const float* vt,
                                std::int64_t D, std::int64_t d0) {
  __m512 acc[NQ][W];
  for (int q = 0; q < NQ; ++q)
    for (int x = 0; x < W; ++x) acc[q][x] = _mm512_loadu_ps(o[q] + d0 + 16 * x);
  for (int b = j0 / kLanes; b * kLanes < j1; ++b) {
    if (b * kLanes >= j0)
      for (int q = 0; q < NQ; ++q)
        if (w.rescale[q0 + q][b]) {
          const __m512 av = _mm512_set1_ps(w.a[q0 + q][b]);
          for (int x = 0; x < W; ++x) acc[q][x] = _mm512_mul_ps(acc[q][x], av);
        }
    const int je = std::min(j1, (b + 1) * kLanes);
    for (int j = std::max(j0, b * kLanes); j < je; ++j) {
      __m512 v[W];
      for (int x = 0; x < W; ++x) v[x] = _mm512_loadu_ps(vt + j * D + d0 + 16 * x);
      for (int q = 0; q < NQ; ++q) {
        const __m512 pj = _mm512_set1_ps(w.p[q0 + q][j]);
        for (int x = 0; x < W; ++x) acc[q][x] = _mm512_fmadd_ps(pj, v[x], acc[q][x]);
      }
    }
  }
  for (int q = 0; q < NQ; ++q)
    for (int x = 0; x < W; ++x) _mm512_storeu_ps(o[q] + d0 + 16 * x, acc[q][x]);
}

template <int NQ>
void pv512_all(float* const* o, const Steps& w, int q0, int j0, int j1, const float* vt, std::int64_t D) {
  std::int64_t d0 = 0;
  for (; d0 + 64 <= D; d0 += 64) pv512<NQ, 4>(o, w, q0, j0, j1, vt, D, d0);
  for (; d0 < D; d0 += 16) pv512<NQ, 1>(o, w, q0, j0, j1, vt, D, d0);
}

SPECACTOR_ATT_AVX2 void steps256(float* st, const float* Sq, int nk, float scale, float* p, float* a, bool* rs) {
  __m256 l0 = _mm256_loadu_ps(st + 1), l1 = _mm256_loadu_ps(st + 9);
  float m = st[0];
  for (int b = 0; b * kLanes < nk; ++b) {
    const int nb = std::min(kLanes, nk - b * kLanes);
    alignas(32) float s[kLanes];
    float bm = -INFINITY;
    for (int j = 0; j < kLanes; ++j) {
      s[j] = j < nb ? Sq[b * kLanes + j] * scale : -INFINITY;
      bm = s[j] > bm ? s[j] : bm;
    }
    rs[b] = bm > m;
    if (rs[b]) {
      a[b] = _mm256_cvtss_f32(expdef::exp8(_mm256_set1_ps(m - bm)));  // exp_approx(m − bm), its twin
      const __m256 av = _mm256_set1_ps(a[b]);
      l0 = _mm256_mul_ps(l0, av);
      l1 = _mm256_mul_ps(l1, av);
      m = bm;
    }
    const __m256 mv = _mm256_set1_ps(m);
    const __m256 p0 = expdef::exp8(_mm256_sub_ps(_mm256_load_ps(s), mv));
    const __m256 p1 = expdef::exp8(_mm256_sub_ps(_mm256_load_ps(s + 8), mv));
    l0 = _mm256_add_ps(l0, p0);
    l1 = _mm256_add_ps(l1, p1);
    _mm256_storeu_ps(p + b * kLanes, p0);
    _mm256_storeu_ps(p + b * kLanes + 8, p1);
  }
  _mm256_storeu_ps(st + 1, l0);
  _mm256_storeu_ps(st + 9, l1);
  st[0] = m;
}

template <int NQ, int W>
SPECACTOR_ATT_AVX2 void pv256(float* const* o, const Steps& w, int q0, int j0, int j1, const float* vt, std::int64_t D,
                              std::int64_t d0) {
  __m256 acc[NQ][W];
  for (int q = 0; q < NQ; ++q)
    for (int x = 0; x < W; ++x) acc[q][x] = _mm256_loadu_ps(o[q] + d0 + 8 * x);
  for (int b = j0 / kLanes; b * kLanes < j1; ++b) {
    if (b * kLanes >= j0)
      for (int q = 0; q < NQ; ++q)
        if (w.rescale[q0 + q][b]) {
          const __m256 av = _mm256_set1_ps(w.a[q0 + q][b]);
          for (int x = 0; x < W; ++x) acc[q][x] = _mm256_mul_ps(acc[q][x], av);
        }
    const int je = std::min(j1, (b + 1) * kLanes);
    for (int j = std::max(j0, b * kLanes); j < je; ++j) {
      __m256 v[W];
      for (int x = 0; x < W; ++x) v[x] = _mm256_loadu_ps(vt + j * D + d0 + 8 * x);
      for (int q = 0; q < NQ; ++q) {
        const __m256 pj = _mm256_broadcast_ss(&w.p[q0 + q][j]);
        for (int x = 0; x < W; ++x) acc[q][x] = _mm256_fmadd_ps(pj, v[x], acc[q][x]);
      }
    }
  }
  for (int q = 0; q < NQ; ++q)
    for (int x = 0; x < W; ++x) _mm256_storeu_ps(o[q] + d0 + 8 * x, acc[q][x]);
}

template <int NQ>
void pv256_all(float* const* o, const Steps& w, int q0, int j0, int j1, const float* vt, std::int64_t D) {
  std::int64_t d0 = 0;
  for (; d0 + 32 <= D; d0 += 32) pv256<NQ, 4>(o, w, q0, j0, j1, vt, D, d0);
  for (; d0 < D; d0 += 8) pv256<NQ, 1>(o, w, q0, j0, j1, vt, D, d0);
}

// A tile for nq queries whose states are st[q], raw scores S[q · kTile + ·], and keys [0, nk[q]) of
// the tile (0: none).
void tile(int path, float* const* st, int nq, const float* S, const int* nk, const float* vt, std::int64_t D,
          float scale, Steps& w) {
  if (path == kScalar) {
    for (int q = 0; q < nq; ++q)
      for (int b = 0; b * kLanes < nk[q]; ++b)
        block_scalar(st[q], S + q * kTile + b * kLanes, std::min(kLanes, nk[q] - b * kLanes), vt + b * kLanes * D, D,
                     scale);
    return;
  }
  float* o[kMaxQ];
  for (int q = 0; q < nq; ++q) {
    o[q] = st[q] + kStateHead;
    if (path == kAvx512)
      steps512(st[q], S + q * kTile, nk[q], scale, w.p[q], w.a[q], w.rescale[q]);
    else
      steps256(st[q], S + q * kTile, nk[q], scale, w.p[q], w.a[q], w.rescale[q]);
  }
  // Groups of queries share each value row up to the group's fewest keys; each query then goes on
  // alone to its own count.
  const int step = path == kAvx512 ? 4 : 2;
  for (int q = 0; q < nq; q += step) {
    const int n = std::min(step, nq - q);
    int common = kTile;
    for (int i = q; i < q + n; ++i) common = std::min(common, nk[i]);
    if (path == kAvx512) {
      if (n == 4) pv512_all<4>(o + q, w, q, 0, common, vt, D);
      if (n == 3) pv512_all<3>(o + q, w, q, 0, common, vt, D);
      if (n == 2) pv512_all<2>(o + q, w, q, 0, common, vt, D);
      if (n == 1) pv512_all<1>(o + q, w, q, 0, common, vt, D);
    } else {
      if (n == 2) pv256_all<2>(o + q, w, q, 0, common, vt, D);
      if (n == 1) pv256_all<1>(o + q, w, q, 0, common, vt, D);
    }
    for (int i = q; i < q + n; ++i)
      if (nk[i] > common) {
        if (path == kAvx512)
          pv512_all<1>(o + i, w, i, common, nk[i], vt, D);
        else
          pv256_all<1>(o + i, w, i, common, nk[i], vt, D);
      }
  }
}

// ---- one row's queries straight from the cache's pages (decode, AVX-512) --------------------------
// Blocks of 16 whole slots of one page, K stored by dimension: scores read K and the weighted sums
// read V without the float tile, with block_scalar's operations in its order.

template <KvType T, int NQ, int NB>
SPECACTOR_ATT_AVX512 void direct_scores512(const float* const* q, const void* K, const std::int64_t* kb,
                                           std::int64_t ps, std::int64_t D, float* S, const char* const* pf) {
  __m512 acc[NQ][NB];
  for (int i = 0; i < NQ; ++i)
    for (int b = 0; b < NB; ++b) acc[i][b] = _mm512_setzero_ps();
  constexpr std::int64_t E = kv_type_bytes(T);
  for (std::int64_t d = 0; d < D; ++d) {
    if (ps * E >= 64 || (d * ps * E) % 64 == 0)  // each cache line of the next blocks once
      for (int b = 0; b < NB; ++b)
        if (pf[b] != nullptr) _mm_prefetch(pf[b] + d * ps * E, _MM_HINT_T1);
    __m512 k[NB];
    for (int b = 0; b < NB; ++b) k[b] = load16<T>(K, kb[b] + d * ps, 16);
    for (int i = 0; i < NQ; ++i) {
      const __m512 qd = _mm512_set1_ps(q[i][d]);
      for (int b = 0; b < NB; ++b) acc[i][b] = _mm512_fmadd_ps(qd, k[b], acc[i][b]);
    }
  }
  for (int i = 0; i < NQ; ++i)
    for (int b = 0; b < NB; ++b) _mm512_storeu_ps(S + i * kTile + b * kLanes, acc[i][b]);
}

template <KvType T, int NQ>
SPECACTOR_ATT_AVX512 void direct_pv512(float* const* o, const Steps& w, const void* V, const std::int64_t* vb,
                                       std::int64_t row, int nblocks, std::int64_t D, const char* const* pf) {
  constexpr std::int64_t E = kv_type_bytes(T);
  for (std::int64_t d0 = 0; d0 < D; d0 += 64) {
    __m512 acc[NQ][4];
    for (int q = 0; q < NQ; ++q)
      for (int x = 0; x < 4; ++x) acc[q][x] = _mm512_loadu_ps(o[q] + d0 + 16 * x);
    for (int b = 0; b < nblocks; ++b) {
      for (int q = 0; q < NQ; ++q)
        if (w.rescale[q][b]) {
          const __m512 av = _mm512_set1_ps(w.a[q][b]);
          for (int x = 0; x < 4; ++x) acc[q][x] = _mm512_mul_ps(acc[q][x], av);
        }
      for (int j = 0; j < kLanes; ++j) {
        if (pf[b] != nullptr)
          for (std::int64_t x = 0; x < 64 * E; x += 64) _mm_prefetch(pf[b] + (j * row + d0) * E + x, _MM_HINT_T1);
        __m512 v[4];
        for (int x = 0; x < 4; ++x) v[x] = load16<T>(V, vb[b] + j * row + d0 + 16 * x, 16);
        for (int q = 0; q < NQ; ++q) {
          const __m512 pj = _mm512_set1_ps(w.p[q][b * kLanes + j]);
          for (int x = 0; x < 4; ++x) acc[q][x] = _mm512_fmadd_ps(pj, v[x], acc[q][x]);
        }
      }
    }
    for (int q = 0; q < NQ; ++q)
      for (int x = 0; x < 4; ++x) _mm512_storeu_ps(o[q] + d0 + 16 * x, acc[q][x]);
  }
}

// The whole blocks of keys [t0, t1) of a row that has keys t ↔ prefix slots, when they can be read in
// place; returns how many keys it did (a multiple of 16, from t0), 0 when it cannot.
std::int64_t direct_tile(int path, const AttentionJob& job, std::int64_t kvh, std::int64_t D, std::int64_t t0,
                         std::int64_t t1, const float* const* q, float* const* st, int nq, float scale, float* S,
                         Steps& w) {
  const PagedKvView& v = job.prefix.view;
  const std::int64_t end = std::min(t1, job.prefix.count);
  const int nblocks = end > t0 ? static_cast<int>((end - t0) / kLanes) : 0;
  if (path != kAvx512 || nblocks == 0 || !v.k_by_dim || v.page_size % kLanes != 0 || D % 64 != 0 || nq > 3 ||
      (job.prefix.first + t0) % kLanes != 0)
    return 0;
  std::int64_t blocks[kTile / kLanes];
  for (int b = 0; b < nblocks; ++b) {
    const std::int64_t s = job.prefix.first + t0 + b * kLanes;
    blocks[b] = v.pages[s / v.page_size] * v.page_stride + kvh * kv_head_stride(v, D) + s % v.page_size;
  }
  // V rows of block b start at blocks[b] − r + r · row; K's dimension d at blocks[b] + d · page_size.
  std::int64_t vblocks[kTile / kLanes];
  for (int b = 0; b < nblocks; ++b) {
    const std::int64_t r = (job.prefix.first + t0 + b * kLanes) % v.page_size;
    vblocks[b] = blocks[b] - r + r * v.row;
  }
  // The next tile's blocks of this head (those that are whole prefix blocks) are prefetched into L2
  // while this tile computes. Without it the core waits on each line: the hardware prefetchers do not
  // run ahead of a stream consumed this slowly (decode over 7,936 keys, 30 layers resident, Zen 4 VM:
  // 490 -> 310 us per layer; T0 hints, into L1, gained little, as they hold the L1's few miss buffers).
  const char* pk[kTile / kLanes] = {};
  const char* pv[kTile / kLanes] = {};
  const auto eb = kv_type_bytes(v.type);
  for (int b = 0; b < kTile / kLanes; ++b) {
    const std::int64_t s = job.prefix.first + t0 + kTile + b * kLanes;
    if (s + kLanes > job.prefix.first + job.prefix.count) break;
    const std::int64_t at = v.pages[s / v.page_size] * v.page_stride + kvh * kv_head_stride(v, D) + s % v.page_size;
    pk[b] = static_cast<const char*>(v.k) + at * eb;
    pv[b] = static_cast<const char*>(v.v) + (at - s % v.page_size + (s % v.page_size) * v.row) * eb;
  }
  auto go = [&](auto tag, auto nq_c) {
    constexpr KvType T = decltype(tag)::value;
    constexpr int NQ = decltype(nq_c)::value;
    int b = 0;
    for (; b + 4 <= nblocks; b += 4)
      direct_scores512<T, NQ, 4>(q, v.k, blocks + b, v.page_size, D, S + b * kLanes, pk + b);
    for (; b < nblocks; ++b) direct_scores512<T, NQ, 1>(q, v.k, blocks + b, v.page_size, D, S + b * kLanes, pk + b);
    float* o[NQ];
    for (int i = 0; i < NQ; ++i) {
      steps512(st[i], S + i * kTile, nblocks * kLanes, scale, w.p[i], w.a[i], w.rescale[i]);
      o[i] = st[i] + kStateHead;
    }
    direct_pv512<T, NQ>(o, w, v.v, vblocks, v.row, nblocks, D, pv);
  };
  auto with_type = [&](auto nq_c) {
    switch (v.type) {
      case KvType::F16:
        return go(std::integral_constant<KvType, KvType::F16>{}, nq_c);
      case KvType::BF16:
        return go(std::integral_constant<KvType, KvType::BF16>{}, nq_c);
      case KvType::F32:
        return go(std::integral_constant<KvType, KvType::F32>{}, nq_c);
    }
  };
  if (nq == 1) with_type(std::integral_constant<int, 1>{});
  if (nq == 2) with_type(std::integral_constant<int, 2>{});
  if (nq == 3) with_type(std::integral_constant<int, 3>{});
  return nblocks * kLanes;
}

// Up to this many rows of a run read the shared keys straight from the pages, one row after the other
// (direct_tile), instead of converting each tile once for all of them (gather): a forward over k new
// rows of one sequence, 30 layers, float16 KV, 2 threads, Zen 4 VM, both ways alternating in one
// process (medians): context 256, k = 2 / 4 / 8: 5.83 → 5.40, 7.86 → 7.55, 10.14 → 9.76 ms;
// context 2,048: 10.2 → 7.2, 13.9 → 11.6, 22.2 → 20.2 ms; at 12 and 16 rows no difference. Each row's
// operations are the same either way (a row's result never depends on its batch).
constexpr std::int64_t kDirectRows = 8;

// ---- states: start, merge (chunk order), finish -------------------------------------------------

inline void state_start(float* st, std::int64_t D) {
  st[0] = -INFINITY;
  std::fill(st + 1, st + kStateHead + D, 0.0f);
}

// acc[i] = fma(cur[i], b, acc[i] · a) for the state's sums and o: the scalar loop and its SIMD twins
// (the same two roundings per element). Without the twins this loop, each element a libm fmaf call,
// was ~10 % of decode attention at 7,936 keys (one merge per 512-key chunk and query).
void merge_scalar(float* acc, const float* cur, std::int64_t n, float a, float b) {
  for (std::int64_t i = 0; i < n; ++i) acc[i] = std::fma(cur[i], b, acc[i] * a);
}

SPECACTOR_ATT_AVX2 void merge256(float* acc, const float* cur, std::int64_t n, float a, float b) {
  const __m256 av = _mm256_set1_ps(a), bv = _mm256_set1_ps(b);
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(acc + i,
                     _mm256_fmadd_ps(_mm256_loadu_ps(cur + i), bv, _mm256_mul_ps(_mm256_loadu_ps(acc + i), av)));
  merge_scalar(acc + i, cur + i, n - i, a, b);
}

SPECACTOR_ATT_AVX512 void merge512(float* acc, const float* cur, std::int64_t n, float a, float b) {
  const __m512 av = _mm512_set1_ps(a), bv = _mm512_set1_ps(b);
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(acc + i,
                     _mm512_fmadd_ps(_mm512_loadu_ps(cur + i), bv, _mm512_mul_ps(_mm512_loadu_ps(acc + i), av)));
  merge_scalar(acc + i, cur + i, n - i, a, b);
}

void state_merge(int path, float* acc, const float* cur, std::int64_t D) {
  const float M = acc[0] < cur[0] ? cur[0] : acc[0];
  const float a = exp_approx(acc[0] - M), b = exp_approx(cur[0] - M);
  const std::int64_t n = kStateHead - 1 + D;
  if (path == kAvx512)
    merge512(acc + 1, cur + 1, n, a, b);
  else if (path == kAvx2)
    merge256(acc + 1, cur + 1, n, a, b);
  else
    merge_scalar(acc + 1, cur + 1, n, a, b);
  acc[0] = M;
}

void state_finish(const float* st, std::int64_t D, float* out) {
  const float* l = st + 1;
  float h8[8], h4[4], h2[2];
  for (int i = 0; i < 8; ++i) h8[i] = l[i] + l[i + 8];
  for (int i = 0; i < 4; ++i) h4[i] = h8[i] + h8[i + 4];
  for (int i = 0; i < 2; ++i) h2[i] = h4[i] + h4[i + 2];
  const float inv = 1.0f / (h2[0] + h2[1]);
  for (std::int64_t d = 0; d < D; ++d) out[d] = st[kStateHead + d] * inv;
}

// ---- the plan: runs of rows × heads of one KV head, cut into chunks --------------------------------

struct Run {
  int job = 0;
  std::int64_t h0 = 0, nh = 0;  // query heads [h0, h0 + nh), all of KV head h0 / group
  std::int64_t ia = 0, ib = 0;  // rows
  std::int64_t nmax = 0;        // most keys of a row
  std::int64_t shared = 0;      // keys t < shared are the same key for every row
  std::int64_t chunks = 0;
  std::int64_t item0 = 0;   // its first item (one item per chunk)
  std::int64_t spill = -1;  // first state of its spilled chunks (runs whose chunks several threads share)
};

struct Plan {
  int path = kScalar;
  std::int64_t n_heads = 0, group = 0, D = 0;
  float scale = 0.0f;
  const AttentionJob* jobs = nullptr;
  std::vector<std::vector<RowKeys>> rows;        // per job, per row
  std::vector<std::vector<std::int32_t>> lists;  // per job: the masked lists of its rows, concatenated
  std::vector<Run> runs;
  std::vector<std::int64_t> list_at;           // scratch of make_plan
  std::vector<std::int64_t> item_cost_prefix;  // cumulative cost before item i
  std::int64_t items = 0;
  std::vector<float> spill;
};

std::int64_t stride_of(std::int64_t D) { return kStateHead + D; }

void make_plan(Plan& p, const AttentionJob* jobs, int n_jobs) {
  const std::int64_t G = p.group, nh = std::min<std::int64_t>(G, kMaxQ), R = std::max<std::int64_t>(1, kMaxQ / nh);
  p.jobs = jobs;
  // Reused between calls (a decode batch calls this once per layer): clear, keep the capacity.
  if (p.rows.size() < static_cast<std::size_t>(n_jobs)) p.rows.resize(static_cast<std::size_t>(n_jobs));
  if (p.lists.size() < static_cast<std::size_t>(n_jobs)) p.lists.resize(static_cast<std::size_t>(n_jobs));
  p.runs.clear();
  for (int j = 0; j < n_jobs; ++j) {
    const AttentionJob& job = jobs[j];
    const std::int64_t pc = job.prefix.count, mc = job.masked.count, lag = mc - job.n_q;
    auto& rows = p.rows[static_cast<std::size_t>(j)];
    auto& lists = p.lists[static_cast<std::size_t>(j)];
    lists.clear();
    rows.assign(static_cast<std::size_t>(job.n_q), RowKeys{});
    std::vector<std::int64_t>& at = p.list_at;
    at.assign(static_cast<std::size_t>(job.n_q), 0);
    for (std::int64_t i = 0; i < job.n_q; ++i) {
      if (job.mask) {
        at[static_cast<std::size_t>(i)] = static_cast<std::int64_t>(lists.size());
        for (std::int64_t m = 0; m < mc; ++m)
          if ((job.mask[i] >> m) & 1u) lists.push_back(static_cast<std::int32_t>(m));
        rows[static_cast<std::size_t>(i)].n =
            pc + static_cast<std::int64_t>(lists.size()) - at[static_cast<std::size_t>(i)];
      } else {
        rows[static_cast<std::size_t>(i)].n = pc + std::clamp<std::int64_t>(i + lag + 1, 0, mc);
      }
    }
    if (job.mask)
      for (std::int64_t i = 0; i < job.n_q; ++i)
        rows[static_cast<std::size_t>(i)].list = lists.data() + at[static_cast<std::size_t>(i)];
    for (std::int64_t ia = 0; ia < job.n_q; ia += R) {
      const std::int64_t ib = std::min(job.n_q, ia + R);
      std::int64_t nmax = 0, nmin = std::numeric_limits<std::int64_t>::max();
      for (std::int64_t i = ia; i < ib; ++i) {
        nmax = std::max(nmax, rows[static_cast<std::size_t>(i)].n);
        nmin = std::min(nmin, rows[static_cast<std::size_t>(i)].n);
      }
      // Keys t < shared are the same key in every row that has them: all of a causal row's (key t is
      // slot t of the prefix, then of the masked segment); a tree's rows agree on the prefix and on
      // the masked keys they all list alike from the first.
      std::int64_t shared = nmax;
      if (job.mask) {  // the masked keys every row lists alike, from the first
        std::int64_t k = 0;
        for (; pc + k < nmin; ++k) {
          const std::int32_t m = rows[static_cast<std::size_t>(ia)].list[k];
          bool same = true;
          for (std::int64_t i = ia + 1; i < ib && same; ++i) same = rows[static_cast<std::size_t>(i)].list[k] == m;
          if (!same) break;
        }
        shared = pc + k;
      }
      const std::int64_t chunks = std::max<std::int64_t>(1, (nmax + kChunk - 1) / kChunk);
      for (std::int64_t h0 = 0; h0 < p.n_heads;) {
        Run r;
        r.job = j;
        r.h0 = h0;
        r.nh = std::min(nh, (h0 / G + 1) * G - h0);
        r.ia = ia;
        r.ib = ib;
        r.nmax = nmax;
        r.shared = shared;
        r.chunks = chunks;
        h0 += r.nh;
        p.runs.push_back(r);
      }
    }
  }
  p.items = 0;
  p.item_cost_prefix.clear();
  std::int64_t cost = 0;
  for (Run& r : p.runs) {
    r.item0 = p.items;
    for (std::int64_t c = 0; c < r.chunks; ++c) {
      p.item_cost_prefix.push_back(cost);
      const std::int64_t keys = std::min(kChunk, r.nmax - c * kChunk);
      cost += std::max<std::int64_t>(keys, 1) * ((r.ib - r.ia) * r.nh + 4) + 64;
    }
    p.items += r.chunks;
  }
  p.item_cost_prefix.push_back(cost);
}

// Thread tid's first item: where the running cost reaches total × tid / nth.
std::int64_t boundary(const Plan& p, int tid, int nth) {
  if (tid >= nth) return p.items;
  const std::int64_t target = p.item_cost_prefix.back() * tid / nth;
  const auto it = std::upper_bound(p.item_cost_prefix.begin(), p.item_cost_prefix.end() - 1, target);
  return std::max<std::int64_t>(0, (it - p.item_cost_prefix.begin()) - 1);
}

struct Scratch {
  std::vector<float> kt, vt, S, cur, acc;
  Steps steps;
};

// Items [i0, i1) of one run (chunks [c0, c1)).
void run_chunks(Plan& p, const Run& r, std::int64_t c0, std::int64_t c1, Scratch& w) {
  const AttentionJob& job = p.jobs[r.job];
  const auto& rows = p.rows[static_cast<std::size_t>(r.job)];
  const std::int64_t D = p.D, SS = stride_of(D), kvh = r.h0 / p.group, nr = r.ib - r.ia, nq = nr * r.nh;
  w.kt.resize(static_cast<std::size_t>(D * kTile));
  w.vt.resize(static_cast<std::size_t>(kTile * D));
  w.S.resize(static_cast<std::size_t>(kMaxQ * kTile));
  w.cur.resize(static_cast<std::size_t>(nq * SS));
  w.acc.resize(static_cast<std::size_t>(nq * SS));
  const float* qp[kMaxQ];
  for (std::int64_t i = 0; i < nr; ++i)
    for (std::int64_t h = 0; h < r.nh; ++h) qp[i * r.nh + h] = job.q + ((r.ia + i) * p.n_heads + r.h0 + h) * D;
  auto n_of = [&](std::int64_t i) { return rows[static_cast<std::size_t>(r.ia + i)].n; };
  // The tile holding keys [t0, t1) for queries [qa, qa + n), each up to its row's keys.
  auto update = [&](std::int64_t qa, std::int64_t n, std::int64_t t0, std::int64_t t1) {
    float* st[kMaxQ];
    int nk[kMaxQ];
    for (std::int64_t q = 0; q < n; ++q) {
      st[q] = w.cur.data() + (qa + q) * SS;
      nk[q] = static_cast<int>(std::max<std::int64_t>(0, std::min(t1, n_of((qa + q) / r.nh)) - t0));
    }
    tile(p.path, st, static_cast<int>(n), w.S.data() + qa * kTile, nk, w.vt.data(), D, p.scale, w.steps);
  };
  for (std::int64_t c = c0; c < c1; ++c) {
    const std::int64_t cb = c * kChunk, ce = std::min(r.nmax, cb + kChunk);
    for (std::int64_t q = 0; q < nq; ++q) state_start(w.cur.data() + q * SS, D);
    for (std::int64_t t0 = cb; t0 < ce; t0 += kTile) {
      // Where every row's keys agree (all of them for causal rows, whose key t is slot t), one tile
      // read serves every row, each up to its own count; past that each row reads its own.
      const std::int64_t t1 = std::min(t0 + kTile, ce);
      if (nr <= kDirectRows && t1 <= r.shared) {  // few rows: their whole blocks straight from the pages, row by row
        std::int64_t done = 0;
        for (std::int64_t i = 0; i < nr; ++i) {  // (whether it can does not depend on the row)
          float* st[kMaxQ];
          for (std::int64_t h = 0; h < r.nh; ++h) st[h] = w.cur.data() + (i * r.nh + h) * SS;
          done = direct_tile(p.path, job, kvh, D, t0, t1, qp + i * r.nh, st, static_cast<int>(r.nh), p.scale,
                             w.S.data(), w.steps);
          if (done == 0) break;
        }
        if (done > 0) {
          if (t0 + done < t1) {  // the rest (a partial block, the new keys) through the tile
            gather(p.path, job, rows[static_cast<std::size_t>(r.ib - 1)], kvh, D, t0 + done, t1, w.kt.data(),
                   w.vt.data());
            scores(p.path, qp, static_cast<int>(nq), w.kt.data(), D,
                   static_cast<int>((t1 - t0 - done + kLanes - 1) / kLanes), w.S.data());
            update(0, nq, t0 + done, t1);
          }
          continue;
        }
      }
      if (t1 <= r.shared) {
        gather(p.path, job, rows[static_cast<std::size_t>(r.ib - 1)], kvh, D, t0, t1, w.kt.data(), w.vt.data());
        scores(p.path, qp, static_cast<int>(nq), w.kt.data(), D, static_cast<int>((t1 - t0 + kLanes - 1) / kLanes),
               w.S.data());
        update(0, nq, t0, t1);
        continue;
      }
      for (std::int64_t i = 0; i < nr; ++i) {
        const std::int64_t ti = std::min(t1, n_of(i));
        if (ti <= t0) continue;
        gather(p.path, job, rows[static_cast<std::size_t>(r.ia + i)], kvh, D, t0, ti, w.kt.data(), w.vt.data());
        const int nblocks = static_cast<int>((ti - t0 + kLanes - 1) / kLanes);
        scores(p.path, qp + i * r.nh, static_cast<int>(r.nh), w.kt.data(), D, nblocks, w.S.data() + i * r.nh * kTile);
        update(i * r.nh, r.nh, t0, ti);
      }
    }
    for (std::int64_t q = 0; q < nq; ++q) {
      if (n_of(q / r.nh) <= cb) continue;  // no key of this row in the chunk
      float* cur = w.cur.data() + q * SS;
      if (r.spill >= 0)
        std::memcpy(p.spill.data() + (r.spill + c * nq + q) * SS, cur, sizeof(float) * static_cast<std::size_t>(SS));
      else if (c == 0)
        std::memcpy(w.acc.data() + q * SS, cur, sizeof(float) * static_cast<std::size_t>(SS));
      else
        state_merge(p.path, w.acc.data() + q * SS, cur, D);
    }
  }
  if (r.spill >= 0 || c1 != r.chunks) return;
  for (std::int64_t q = 0; q < nq; ++q) {
    float* out = job.out + ((r.ia + q / r.nh) * p.n_heads + r.h0 + q % r.nh) * D;
    if (n_of(q / r.nh) == 0)
      std::fill(out, out + D, 0.0f);
    else
      state_finish(w.acc.data() + q * SS, D, out);
  }
}

// The runs whose chunks are shared by several threads keep every chunk's state for a merge after.
void mark_spills(Plan& p, int nth) {
  std::int64_t states = 0;
  for (Run& r : p.runs) {
    r.spill = -1;
    for (int tid = 1; tid < nth; ++tid) {
      const std::int64_t b = boundary(p, tid, nth);
      if (b > r.item0 && b < r.item0 + r.chunks) {
        r.spill = states;
        states += r.chunks * (r.ib - r.ia) * r.nh;
        break;
      }
    }
  }
  p.spill.resize(static_cast<std::size_t>(states * stride_of(p.D)));
}

void run_share(Plan& p, int tid, int nth) {
  thread_local Scratch w;
  const std::int64_t begin = boundary(p, tid, nth), end = boundary(p, tid + 1, nth);
  if (begin >= end) return;
  // The run holding item `begin`, then on.
  auto it =
      std::upper_bound(p.runs.begin(), p.runs.end(), begin, [](std::int64_t v, const Run& r) { return v < r.item0; });
  for (auto r = it - 1; r != p.runs.end() && r->item0 < end; ++r) {
    const std::int64_t c0 = std::max(begin, r->item0) - r->item0, c1 = std::min(end, r->item0 + r->chunks) - r->item0;
    if (c1 > c0) run_chunks(p, *r, c0, c1, w);
  }
}

void merge_spills(Plan& p) {
  const std::int64_t D = p.D, SS = stride_of(D);
  std::vector<float> acc(static_cast<std::size_t>(SS));
  for (const Run& r : p.runs) {
    if (r.spill < 0) continue;
    const AttentionJob& job = p.jobs[r.job];
    const std::int64_t nq = (r.ib - r.ia) * r.nh;
    for (std::int64_t q = 0; q < nq; ++q) {
      const std::int64_t n = p.rows[static_cast<std::size_t>(r.job)][static_cast<std::size_t>(r.ia + q / r.nh)].n;
      float* out = job.out + ((r.ia + q / r.nh) * p.n_heads + r.h0 + q % r.nh) * D;
      if (n == 0) {
        std::fill(out, out + D, 0.0f);
        continue;
      }
      for (std::int64_t c = 0; c * kChunk < n; ++c) {
        const float* st = p.spill.data() + (r.spill + c * nq + q) * SS;
        if (c == 0)
          std::copy(st, st + SS, acc.begin());
        else
          state_merge(p.path, acc.data(), st, D);
      }
      state_finish(acc.data(), D, out);
    }
  }
}

int path_of(CpuPath c, std::int64_t D) {
  if (c == CpuPath::Avx512 && D % 16 == 0) return kAvx512;
  if (c != CpuPath::Scalar && D % 8 == 0) return kAvx2;
  return kScalar;
}

void attention_run_all(int path, int threads, const AttentionJob* jobs, int n_jobs, std::int64_t n_heads,
                       std::int64_t n_kv_heads, std::int64_t head_dim, float scale) {
  thread_local Plan plan;  // reused between calls; the workers reach it through this reference
  Plan& p = plan;
  p.path = path;
  p.n_heads = n_heads;
  p.group = n_heads / n_kv_heads;
  p.D = head_dim;
  p.scale = scale;
  make_plan(p, jobs, n_jobs);
  std::int64_t work = 0;
  for (int j = 0; j < n_jobs; ++j)
    work += jobs[j].n_q * n_heads * (jobs[j].prefix.count + jobs[j].masked.count) * head_dim;
  // Small problems (a decode step over a short context) are not worth waking the other threads.
  const int nth = threads > 0 ? threads : (work >= (1 << 16) ? ComputePool::instance().threads() : 1);
  mark_spills(p, nth);
  if (threads > 0 || nth == 1) {
    for (int tid = 0; tid < nth; ++tid) run_share(p, tid, nth);  // the tests' split, one after another
  } else {
    parallel_run([&](int tid, int n) {
      if (n != nth) throw std::logic_error("attention: the pool changed size during a call");
      run_share(p, tid, n);
    });
  }
  merge_spills(p);
}

}  // namespace

void attention_many_path(int path, int threads, const AttentionJob* jobs, int n_jobs, std::int64_t n_heads,
                         std::int64_t n_kv_heads, std::int64_t head_dim, float scale) {
  const CpuPath want = path == kAvx512 ? CpuPath::Avx512 : (path == kAvx2 ? CpuPath::Avx2 : CpuPath::Scalar);
  attention_run_all(path_of(want, head_dim), threads, jobs, n_jobs, n_heads, n_kv_heads, head_dim, scale);
}

void attention_many_cpu(const AttentionJob* jobs, int n_jobs, std::int64_t n_heads, std::int64_t n_kv_heads,
                        std::int64_t head_dim, float scale) {
  attention_run_all(path_of(cpu_path(), head_dim), 0, jobs, n_jobs, n_heads, n_kv_heads, head_dim, scale);
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
