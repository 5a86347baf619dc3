// kernels/cpu/qmatmul.cpp — the fast precision: y = x · Wᵀ with every activation row quantized to
// int8 blocks of 32 and integer dot products against the weights' own quants. A scalar twin defines
// the arithmetic; the AVX2 (maddubs + madd) and VNNI (dpbusd) paths perform exactly the same
// operations, so all three are bit-identical (tested).
//
// Activations (quantize_blocks, and its AVX2 twin that writes the same bytes): per row r and
// 32-element chunk c,
//   amax = max |x|,  d = amax / 127,  q[j] = nearbyint(x[j] · (127 / amax)) ∈ [−127, 127]  (0 when amax = 0),
//   s = d · Σ q  (the scaled sum, for weight formats with a minimum).
// Packed weights (Q4_0, Q4_1, Q8_0; panels of 8 rows, see packed.hpp), one output y = Σ_i W[o,i]·x[r,i]:
//   isum = Σ_{j<32} w[c][j]·q[r][c][j]   (int32, exact; w = nibble for Q4_0/Q4_1, the signed quant for Q8_0)
//   acc  = fma(d[c] · d[r][c], float(isum), acc)                       for c = 0, 1, ..., nc−1
//   mn   = fma(wm[c], s[r][c], mn)   (Q4_1: wm = m; Q4_0: wm = −8·d)   in the same order
//   y = acc (Q8_0), y = acc + mn (Q4_0, Q4_1).
// The SIMD kernels hold one chunk of 8 rows per register (lane = row) and broadcast 4 activation bytes
// (AVX2: maddubs pairs summed in int16, which cannot overflow for nibbles, then madd; VNNI: dpbusd);
// the weights are streamed once per call with a software prefetch ahead of the hardware's. Where the
// AMX route runs, the 512-bit kernel also reads the tile copy's 16-row records (the same bytes a pair
// of panels gives it) for the calls the tiles do not take, so only one copy of the weights is streamed.
// Other formats (Q4_K, Q6_K), decoded per output row into integer quants u (and a signed copy for
// Q6_K) and float scales: per chunk c a lane scale ws[c][l] (l = 0..7; lanes 0–3 cover elements
// 0–15, lanes 4–7 elements 16–31) and a minimum wm[c]:
//   unsigned (U):  Q4_K  u = nibble of sub-block c, ws = d·sc, wm = −(dmin·mn)
//   signed (S):    Q6_K  w = q − 32, ws = d·sc16 (the scale of each 16-element half)
//   isum[l] = Σ_{j=4l..4l+3} w[c][j]·q[r][c][j]   (int32, exact)
//   acc[l]  = fma(ws[c][l] · d[r][c], float(isum[l]), acc[l])          for c = 0, 1, ..., nc−1
//   U only: mn[c mod 8] = fma(wm[c], s[r][c], mn[c mod 8])              for c = 0, 1, ... (zero padded to 8)
//   y = H(acc) for S, y = H(acc ⊕ mn) for U (⊕: lane by lane), where H(a) = ((a0+a4)+(a2+a6)) +
//   ((a1+a5)+(a3+a7)) in the order t[l] = a[l]+a[l+4]; t[l] = t[l]+t[l+2]; t[0]+t[1].
// Every (row, output) runs these operations in this order whatever the number of rows in the call
// and however threads split the outputs (in units of 8 output rows), on every path: a scalar twin
// defines each, the AVX2 and VNNI paths perform the same operations (tested bit for bit).
#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cpu/matmul.hpp"
#include "kernels/cpu/packed.hpp"
#include "kernels/cpu/pool.hpp"
#include "kernels/cpu/tiles.hpp"

namespace specactor::kernels {

namespace {

using packed::AlignedAllocator;
using packed::load_u16;

template <class T>
using AVec = std::vector<T, AlignedAllocator<T>>;

constexpr int kOut = 4;  // weight rows decoded together (one tile)

// Activation rows quantized once per call.
struct QRows {
  std::int64_t rows = 0, nc = 0, ncp = 0;  // ncp: nc rounded up to 8 (d and s are zero padded)
  AVec<std::int8_t> q;                     // nc × rows × 32: block (r, c) at (c·rows + r)·32 (chunk-major,
                                           // so the kernels reach chunk c of every row from one pointer)
  AVec<float> d, s;                        // rows × ncp
  AVec<std::int32_t> b128;                 // rows × ncp: 128 · Σ q of each block (the VNNI Q8_0 kernel's bias)
  const std::int8_t* qblock(std::int64_t r, std::int64_t c) const { return q.data() + (c * rows + r) * 32; }
  const std::int32_t* brow(std::int64_t r) const { return b128.data() + r * ncp; }
  const float* drow(std::int64_t r) const { return d.data() + r * ncp; }
  const float* srow(std::int64_t r) const { return s.data() + r * ncp; }
};

void quantize_shape(std::int64_t rows, std::int64_t in, QRows& out) {
  out.rows = rows;
  out.nc = in / 32;
  out.ncp = (out.nc + 7) / 8 * 8;
  out.q.resize(static_cast<std::size_t>(rows * out.nc * 32));
  out.d.assign(static_cast<std::size_t>(rows * out.ncp), 0.0f);
  out.s.assign(out.d.size(), 0.0f);
  out.b128.assign(out.d.size(), 0);
}

// Blocks [b0, b1) of the rows × nc blocks (threads quantize disjoint ranges).
void quantize_blocks(const float* x, std::int64_t in, QRows& out, std::int64_t b0, std::int64_t b1) {
  for (std::int64_t b = b0; b < b1; ++b) {
    const std::int64_t r = b / out.nc, c = b % out.nc;
    const float* v = x + r * in + c * 32;
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(v[j]));
    const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
    std::int8_t* q = out.q.data() + (c * out.rows + r) * 32;
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      const float f = std::nearbyint(v[j] * id);
      const int qi = (f >= -127.0f && f <= 127.0f) ? static_cast<int>(f) : 0;  // NaN/inf inputs: 0
      q[j] = static_cast<std::int8_t>(qi);
      sum += qi;
    }
    out.d[static_cast<std::size_t>(r * out.ncp + c)] = d;
    out.s[static_cast<std::size_t>(r * out.ncp + c)] = d * static_cast<float>(sum);
    out.b128[static_cast<std::size_t>(r * out.ncp + c)] = 128 * sum;
  }
}

// The same blocks with AVX2: max |x| is exact, the product and round-to-nearest-even are the
// scalar ones (vroundps under the default rounding mode = nearbyint), so the bytes are identical.
__attribute__((target("avx2,fma,f16c"))) void quantize_blocks_avx2(const float* x, std::int64_t in, QRows& out,
                                                                   std::int64_t b0, std::int64_t b1) {
  const __m256 sign = _mm256_set1_ps(-0.0f), lim = _mm256_set1_ps(127.0f), nlim = _mm256_set1_ps(-127.0f);
  for (std::int64_t b = b0; b < b1; ++b) {
    const std::int64_t r = b / out.nc, c = b % out.nc;
    const float* v = x + r * in + c * 32;
    __m256 xv[4];
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      xv[i] = _mm256_loadu_ps(v + 8 * i);
      m = _mm256_max_ps(_mm256_andnot_ps(sign, xv[i]), m);  // a NaN lane keeps m, as std::max does
    }
    alignas(32) float mv[8];
    _mm256_store_ps(mv, m);
    float amax = 0.0f;
    for (int l = 0; l < 8; ++l) amax = std::max(amax, mv[l]);
    const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
    const __m256 idv = _mm256_set1_ps(id);
    __m256i qi[4];
    for (int i = 0; i < 4; ++i) {
      const __m256 f = _mm256_round_ps(_mm256_mul_ps(xv[i], idv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      const __m256 ok = _mm256_and_ps(_mm256_cmp_ps(f, nlim, _CMP_GE_OQ), _mm256_cmp_ps(f, lim, _CMP_LE_OQ));
      qi[i] = _mm256_cvtps_epi32(_mm256_and_ps(f, ok));  // NaN/inf: 0, as in the scalar loop
    }
    const __m256i s01 = _mm256_add_epi32(qi[0], qi[1]), s23 = _mm256_add_epi32(qi[2], qi[3]);
    alignas(32) std::int32_t sv[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(sv), _mm256_add_epi32(s01, s23));
    int sum = 0;
    for (int l = 0; l < 8; ++l) sum += sv[l];
    // int32 → int8 in element order (packs work within 128-bit lanes, then a fixed permutation).
    const __m256i p16a = _mm256_packs_epi32(qi[0], qi[1]), p16b = _mm256_packs_epi32(qi[2], qi[3]);
    const __m256i p8 =
        _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.q.data() + (c * out.rows + r) * 32), p8);
    out.d[static_cast<std::size_t>(r * out.ncp + c)] = d;
    out.s[static_cast<std::size_t>(r * out.ncp + c)] = d * static_cast<float>(sum);
    out.b128[static_cast<std::size_t>(r * out.ncp + c)] = 128 * sum;
  }
}

constexpr bool is_signed(WeightType t) { return t == WeightType::Q8_0 || t == WeightType::Q6_K; }

// Up to kOut weight rows decoded for the integer kernels (layout: row-major by decoded row).
struct WTile {
  std::int64_t nc = 0, ncp = 0;
  AVec<std::uint8_t> u;  // kOut × nc × 32: the unsigned quant (U) or |quant| (S)
  AVec<std::int8_t> sg;  // kOut × nc × 32: the signed quant (S)
  AVec<float> ws;        // kOut × nc × 8 lane scales
  AVec<float> wm;        // kOut × ncp minimums (U), zero padded
  void shape(std::int64_t nchunks) {
    nc = nchunks;
    ncp = (nc + 7) / 8 * 8;
    u.resize(static_cast<std::size_t>(kOut * nc * 32));
    sg.resize(u.size());
    ws.resize(static_cast<std::size_t>(kOut * nc * 8));
    wm.assign(static_cast<std::size_t>(kOut * ncp), 0.0f);
  }
};

// ---- decoding one weight row (scalar: every type; AVX2: the packed types and Q4_K) ------------------

void set_scale(float* ws, float lo, float hi) {
  for (int l = 0; l < 4; ++l) ws[l] = lo;
  for (int l = 4; l < 8; ++l) ws[l] = hi;
}

// Chunk c of a Q4_K / Q6_K row in ggml layout: quants, lane scales, minimum.
void decode_q4k_chunk(const std::uint8_t* row, std::int64_t c, std::uint8_t* u, float* ws, float* wm) {
  const std::uint8_t* b = row + (c / 8) * 144;
  const int sub = static_cast<int>(c % 8);
  std::uint8_t sc, mn;
  q4k_scale_min(sub, b + 4, sc, mn);
  const float d = f16_to_f32(load_u16(b)) * static_cast<float>(sc);
  set_scale(ws, d, d);
  *wm = -(f16_to_f32(load_u16(b + 2)) * static_cast<float>(mn));
  const std::uint8_t* qs = b + 16 + (sub / 2) * 32;
  for (int j = 0; j < 32; ++j) u[j] = static_cast<std::uint8_t>((sub % 2) ? (qs[j] >> 4) : (qs[j] & 0xF));
}

void decode_q6k_chunk(const std::uint8_t* row, std::int64_t c, std::uint8_t* u, std::int8_t* sg, float* ws) {
  const std::uint8_t* b = row + (c / 8) * 210;
  const int half = static_cast<int>(c % 8) / 4, g = static_cast<int>(c % 4);
  const std::uint8_t* ql = b + half * 64 + (g % 2) * 32;
  const std::uint8_t* qh = b + 128 + half * 32;
  const auto* sc = reinterpret_cast<const std::int8_t*>(b + 192 + half * 8);
  const float d = f16_to_f32(load_u16(b + 208));
  for (int l = 0; l < 32; ++l) {
    const int lo = g < 2 ? (ql[l] & 0xF) : (ql[l] >> 4);
    const int q = (lo | (((qh[l] >> (2 * g)) & 3) << 4)) - 32;
    sg[l] = static_cast<std::int8_t>(q);
    u[l] = static_cast<std::uint8_t>(q < 0 ? -q : q);
  }
  set_scale(ws, d * static_cast<float>(sc[2 * g]), d * static_cast<float>(sc[2 * g + 1]));
}

// The arrays of decoded row `slot` of a tile, and the weight row it holds.
struct Slot {
  const std::uint8_t* row;
  std::uint8_t* u;
  std::int8_t* sg;
  float* ws;
  float* wm;
};
Slot slot_of(const WeightMatrix& w, std::int64_t o, WTile& t, int slot) {
  return {w.data + static_cast<std::size_t>(o) * w.row_stride, t.u.data() + slot * t.nc * 32,
          t.sg.data() + slot * t.nc * 32, t.ws.data() + slot * t.nc * 8, t.wm.data() + slot * t.ncp};
}

template <WeightType T>
void decode_row_scalar(const WeightMatrix& w, std::int64_t o, WTile& t, int slot) {
  const std::int64_t nc = t.nc;
  const auto [row, u, sg, ws, wm] = slot_of(w, o, t, slot);
  for (std::int64_t c = 0; c < nc; ++c) {
    if constexpr (T == WeightType::Q4_K)
      decode_q4k_chunk(row, c, u + c * 32, ws + c * 8, wm + c);
    else
      decode_q6k_chunk(row, c, u + c * 32, sg + c * 32, ws + c * 8);
  }
}

#define SPECACTOR_QAVX2 __attribute__((target("avx2,fma,f16c")))

// Q4_K with AVX2: the same bytes and floats as decode_row_scalar (exact f16 conversion, the same
// products).
SPECACTOR_QAVX2 void decode_q4k_row_avx2(const WeightMatrix& w, std::int64_t o, WTile& t, int slot) {
  const std::int64_t nc = t.nc;
  const auto [row, u, sg, ws, wm] = slot_of(w, o, t, slot);
  (void)sg;
  const __m256i nib2 = _mm256_set1_epi8(0x0F);
  for (std::int64_t c = 0; c < nc; c += 2) {  // a 32-byte run holds sub-blocks c (low) and c+1 (high)
    const std::uint8_t* b = row + (c / 8) * 144;
    const int sub = static_cast<int>(c % 8);
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + (sub / 2) * 32));
    _mm256_store_si256(reinterpret_cast<__m256i*>(u + c * 32), _mm256_and_si256(v, nib2));
    _mm256_store_si256(reinterpret_cast<__m256i*>(u + (c + 1) * 32), _mm256_and_si256(_mm256_srli_epi16(v, 4), nib2));
    const float d = f16_to_f32(load_u16(b)), dmin = f16_to_f32(load_u16(b + 2));
    for (int k = 0; k < 2; ++k) {
      std::uint8_t sc, mn;
      q4k_scale_min(sub + k, b + 4, sc, mn);
      _mm256_store_ps(ws + (c + k) * 8, _mm256_set1_ps(d * static_cast<float>(sc)));
      wm[c + k] = -(dmin * static_cast<float>(mn));
    }
  }
}

// ---- the scalar twin ---------------------------------------------------------------------------------

float hsum8_scalar(const float* a) {
  float t[4];
  for (int l = 0; l < 4; ++l) t[l] = a[l] + a[l + 4];
  const float t0 = t[0] + t[2], t1 = t[1] + t[3];
  return t0 + t1;
}

template <bool S>
void apply_scalar(const WTile& wt, int no, const QRows& xq, float* y, std::int64_t y_stride) {
  const std::int64_t nc = wt.nc, ncp = wt.ncp;
  for (std::int64_t r = 0; r < xq.rows; ++r)
    for (int o = 0; o < no; ++o) {
      float acc[8] = {};
      for (std::int64_t c = 0; c < nc; ++c) {
        const std::int8_t* x = xq.qblock(r, c);
        const std::int64_t k = o * nc + c;
        const float xd = xq.drow(r)[c];
        for (int l = 0; l < 8; ++l) {
          int isum = 0;
          for (int j = 4 * l; j < 4 * l + 4; ++j) {
            const int wv = S ? static_cast<int>(wt.sg[static_cast<std::size_t>(k * 32 + j)])
                             : static_cast<int>(wt.u[static_cast<std::size_t>(k * 32 + j)]);
            isum += wv * x[j];
          }
          acc[l] = std::fma(wt.ws[static_cast<std::size_t>(k * 8 + l)] * xd, static_cast<float>(isum), acc[l]);
        }
      }
      if constexpr (!S) {
        float mn[8] = {};
        const float* wm = wt.wm.data() + o * ncp;
        const float* xs = xq.srow(r);
        for (std::int64_t c = 0; c < ncp; ++c) mn[c % 8] = std::fma(wm[c], xs[c], mn[c % 8]);
        for (int l = 0; l < 8; ++l) acc[l] = acc[l] + mn[l];
      }
      y[r * y_stride + o] = hsum8_scalar(acc);
    }
}

// A panel of the packed formats, as panel() in qmatmul_tile.inc computes it: every activation row,
// outputs o0 .. o0 + nvalid − 1.
template <WeightType T>
void panel_scalar(const std::uint8_t* pan, std::int64_t nc, const QRows& xq, float* y, std::int64_t y_stride,
                  std::int64_t o0, int nvalid) {
  constexpr bool Q8 = T == WeightType::Q8_0;
  constexpr std::int64_t CB = packed::panel_chunk_bytes(T), SB = packed::scale_bytes(T);
  for (std::int64_t r = 0; r < xq.rows; ++r)
    for (int k = 0; k < nvalid; ++k) {
      float acc = 0.0f, mn = 0.0f;
      for (std::int64_t c = 0; c < nc; ++c) {
        const std::int8_t* x = xq.qblock(r, c);
        const std::uint8_t* b = pan + c * CB;
        const std::uint8_t* q = b + SB;
        int isum = 0;
        if constexpr (Q8) {
          for (int j = 0; j < 32; ++j)
            isum += static_cast<int>(static_cast<std::int8_t>(q[packed::panel_quant_offset(j, k)])) * x[j];
        } else {
          for (int i = 0; i < 16; ++i) {
            const int v = q[packed::panel_quant_offset(i, k)];
            isum += (v & 0xF) * x[i] + (v >> 4) * x[16 + i];
          }
        }
        const float d = f16_to_f32(load_u16(b + 2 * k));
        acc = std::fma(d * xq.drow(r)[c], static_cast<float>(isum), acc);
        if constexpr (!Q8) {
          const float wm = T == WeightType::Q4_1 ? f16_to_f32(load_u16(b + 16 + 2 * k)) : -8.0f * d;
          mn = std::fma(wm, xq.srow(r)[c], mn);
        }
      }
      y[r * y_stride + o0 + k] = Q8 ? acc : acc + mn;
    }
}

}  // namespace

namespace packed {

void build_kquant_tiles(const WeightMatrix& w, std::uint8_t* dst) {
  if (!is_kquant(w.type)) throw std::logic_error("build_kquant_tiles: not a K-quant matrix");
  const std::int64_t nc = w.in_dim / 32, qb = tile_quant_bytes(w.type), cb = tile_chunk_bytes(w.type);
  alignas(64) std::uint8_t u[32];
  alignas(64) std::int8_t sg[32];
  alignas(64) float ws[8];
  for (std::int64_t o = 0; o < w.out_dim; ++o) {
    const std::uint8_t* row = w.data + static_cast<std::size_t>(o) * w.row_stride;
    const int k = static_cast<int>(o % kTilePanel);
    for (std::int64_t c = 0; c < nc; ++c) {
      std::uint8_t* rec = dst + ((o / kTilePanel) * nc + c) * cb;
      float sc[2];
      if (w.type == WeightType::Q4_K) {
        decode_q4k_chunk(row, c, u, ws, &sc[1]);
        sc[0] = ws[0];
        for (int g = 0; g < 4; ++g)
          for (int i = 0; i < 4; ++i)
            rec[64 * g + 4 * k + i] = static_cast<std::uint8_t>(u[4 * g + i] | (u[16 + 4 * g + i] << 4));
      } else {
        decode_q6k_chunk(row, c, u, sg, ws);
        sc[0] = ws[0];
        sc[1] = ws[4];
        for (int l = 0; l < 8; ++l)
          for (int i = 0; i < 4; ++i) rec[64 * l + 4 * k + i] = static_cast<std::uint8_t>(sg[4 * l + i]);
      }
      std::memcpy(rec + qb + 4 * k, &sc[0], 4);
      std::memcpy(rec + qb + 64 + 4 * k, &sc[1], 4);
    }
  }
}

}  // namespace packed

// ---- the SIMD twins -----------------------------------------------------------------------------------

namespace {
#define QMM_NS avx2
#define QMM_VNNI 0
#define QMM_TARGET __attribute__((target("avx2,fma,f16c")))
#define QMM_DOT4(u, s) _mm256_madd_epi16(_mm256_maddubs_epi16((u), (s)), _mm256_set1_epi16(1))
#include "kernels/cpu/qmatmul_tile.inc"
#undef QMM_NS
#undef QMM_VNNI
#undef QMM_TARGET
#undef QMM_DOT4

#define QMM_NS vnni
#define QMM_VNNI 1
#define QMM_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")))
#define QMM_DOT4(u, s) _mm256_dpbusd_epi32(_mm256_setzero_si256(), (u), (s))
#include "kernels/cpu/qmatmul_tile.inc"
#undef QMM_NS
#undef QMM_VNNI
#undef QMM_TARGET
#undef QMM_DOT4
#undef QMM_DPB

// ---- two panels at once in 512-bit registers (QPath::Vnni512) ----------------------------------------
// Lane k of a register is output row o0 + k of two consecutive panels (k < 8: the first). Every lane
// performs panel<T, RT>'s operations in its order (the same dpbusd sums, the same fma chains), so the
// results are the 256-bit kernel's bits; only the instruction count per output halves.
namespace vnni512 {

#define QMM512_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#define QMM512_DPB(acc, u, p) \
  __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*reinterpret_cast<const std::int32_t*>(p)))

QMM512_TARGET inline __m512i join(const std::uint8_t* a, const std::uint8_t* b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a))),
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)), 1);
}
// 8 f16 values at a and 8 at b as 16 floats.
QMM512_TARGET inline __m512 join_ph(const std::uint8_t* a, const std::uint8_t* b) {
  return _mm512_cvtph_ps(
      _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a))),
                              _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), 1));
}

// Where a 16-output kernel finds chunk c of its weights: two consecutive 8-row panels side by side
// (the panel copy), or one 16-row record of the tile copy (packed.hpp), which holds the same bytes
// in the order one register wants them: its quant block g is join(panel a's group g, panel b's), its
// scales are the two panels' d (Q8_0: as the exact f32 values of the f16) and m. Both give the same
// registers, so the kernel below gives the same bits from either copy.
template <WeightType T>
struct PanelPair {
  static constexpr std::int64_t CB = packed::panel_chunk_bytes(T), SB = packed::scale_bytes(T);
  const std::uint8_t* a;
  const std::uint8_t* b;  // = a + one panel's bytes
  QMM512_TARGET __m512i quants(std::int64_t c, int g) const {
    return join(a + c * CB + SB + 32 * g, b + c * CB + SB + 32 * g);
  }
  QMM512_TARGET __m512 scales(std::int64_t c) const { return join_ph(a + c * CB, b + c * CB); }
  QMM512_TARGET __m512 mins(std::int64_t c) const { return join_ph(a + c * CB + 16, b + c * CB + 16); }  // Q4_1
};
template <WeightType T>
struct TileRecords {
  static constexpr std::int64_t CB = packed::tile_chunk_bytes(T), QB = packed::tile_quant_bytes(T);
  const std::uint8_t* p;
  QMM512_TARGET __m512i quants(std::int64_t c, int g) const {
    return _mm512_load_si512(p + c * CB + 64 * g);  // records are 64-byte aligned
  }
  QMM512_TARGET __m512 scales(std::int64_t c) const {
    if constexpr (T == WeightType::Q8_0) return _mm512_load_ps(reinterpret_cast<const float*>(p + c * CB + QB));
    return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(p + c * CB + QB)));
  }
  QMM512_TARGET __m512 mins(std::int64_t c) const {  // Q4_1
    return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(p + c * CB + QB + 32)));
  }
};

// Sixteen outputs (src: PanelPair or TileRecords) against RT activation rows from r0; writes
// y[(r0 + r)·y_stride + o0 + k] for k < nvalid (≤ 16).
template <WeightType T, int RT, class Src>
QMM512_TARGET void panel2(const Src& src, std::int64_t nc, const QRows& xq, std::int64_t r0, float* y,
                          std::int64_t y_stride, std::int64_t o0, int nvalid) {
  constexpr bool Q8 = T == WeightType::Q8_0, U = !Q8;
  const std::int8_t* xc = xq.qblock(r0, 0);
  const std::int64_t xstep = xq.rows * 32;
  const float* xd_p[RT];
  const float* xs_p[RT];
  [[maybe_unused]] const std::int32_t* xb_p[RT];
#pragma GCC unroll 8
  for (int r = 0; r < RT; ++r) {
    xd_p[r] = xq.drow(r0 + r);
    xs_p[r] = xq.srow(r0 + r);
    xb_p[r] = xq.brow(r0 + r);
  }
  const __m512i nib = _mm512_set1_epi8(0x0F);
  __m512 acc[RT];
#pragma GCC unroll 8
  for (int r = 0; r < RT; ++r) acc[r] = _mm512_setzero_ps();
  for (std::int64_t c = 0; c < nc; ++c, xc += xstep) {
    __m512i isum[RT];
#pragma GCC unroll 8
    for (int r = 0; r < RT; ++r) isum[r] = _mm512_setzero_si512();
    if constexpr (Q8) {
#pragma GCC unroll 8
      for (int g = 0; g < 8; ++g) {
        const __m512i w = _mm512_xor_si512(src.quants(c, g), _mm512_set1_epi8(static_cast<char>(0x80)));
#pragma GCC unroll 8
        for (int r = 0; r < RT; ++r) QMM512_DPB(isum[r], w, xc + 32 * r + 4 * g);
      }
#pragma GCC unroll 8
      for (int r = 0; r < RT; ++r) isum[r] = _mm512_sub_epi32(isum[r], _mm512_set1_epi32(xb_p[r][c]));
    } else {
#pragma GCC unroll 4
      for (int g = 0; g < 4; ++g) {
        const __m512i v = src.quants(c, g);
        const __m512i lo = _mm512_and_si512(v, nib), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
#pragma GCC unroll 8
        for (int r = 0; r < RT; ++r) {
          QMM512_DPB(isum[r], lo, xc + 32 * r + 4 * g);
          QMM512_DPB(isum[r], hi, xc + 32 * r + 16 + 4 * g);
        }
      }
    }
    const __m512 d = src.scales(c);
#pragma GCC unroll 8
    for (int r = 0; r < RT; ++r)
      acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(xd_p[r][c])), _mm512_cvtepi32_ps(isum[r]), acc[r]);
  }
  __m512 mn[RT];
#pragma GCC unroll 8
  for (int r = 0; r < RT; ++r) mn[r] = _mm512_setzero_ps();
  if constexpr (U) {
    for (std::int64_t c = 0; c < nc; ++c) {
      __m512 wm;
      if constexpr (T == WeightType::Q4_1)
        wm = src.mins(c);
      else
        wm = _mm512_mul_ps(_mm512_set1_ps(-8.0f), src.scales(c));
#pragma GCC unroll 8
      for (int r = 0; r < RT; ++r) mn[r] = _mm512_fmadd_ps(wm, _mm512_set1_ps(xs_p[r][c]), mn[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < RT; ++r) {
    const __m512 out = U ? _mm512_add_ps(acc[r], mn[r]) : acc[r];
    float* yr = y + (r0 + r) * y_stride + o0;
    if (nvalid == 16) {
      _mm512_storeu_ps(yr, out);
    } else {
      alignas(64) float t[16];
      _mm512_store_ps(t, out);
      for (int k = 0; k < nvalid; ++k) yr[k] = t[k];
    }
  }
}

#undef QMM512_DPB
#undef QMM512_TARGET

}  // namespace vnni512

bool has_vnni() {  // the AVX-512 the exact path checks (F, BW, VL), plus VNNI
  __builtin_cpu_init();
  return cpu_path_available(CpuPath::Avx512) && __builtin_cpu_supports("avx512vnni");
}

// One panel (pan2 null) or two consecutive ones (pan2 = the second, Vnni512 only; nvalid ≤ 16).
template <WeightType T, int RT>
void panel_rows(QPath path, const std::uint8_t* pan, const std::uint8_t* pan2, std::int64_t nc, const QRows& xq,
                std::int64_t r0, float* y, std::int64_t y_stride, std::int64_t o0, int nvalid) {
  if constexpr (RT <= 4) {
    if (path == QPath::Avx2) return avx2::panel<T, RT>(pan, nc, xq, r0, y, y_stride, o0, nvalid);
  }
  if (pan2) return vnni512::panel2<T, RT>(vnni512::PanelPair<T>{pan, pan2}, nc, xq, r0, y, y_stride, o0, nvalid);
  vnni::panel<T, RT>(pan, nc, xq, r0, y, y_stride, o0, nvalid);
}

// Activation rows per pass over a panel: the VNNI kernel has 32 vector registers (8 rows), AVX2 16.
// Vnni512 runs calls of up to kNarrowRows rows with the 256-bit kernel (see panel_range).
constexpr std::int64_t kNarrowRows = 8;
constexpr std::int64_t rows_per_pass(QPath path) { return path == QPath::Avx2 ? 4 : 8; }

// One pass over a panel for rows [r0, r0 + rt), rt ≤ rows_per_pass(path): panel_rows<T, rt>.
template <WeightType T, std::size_t... R>
constexpr auto pass_table(std::index_sequence<R...>) {
  return std::array{&panel_rows<T, static_cast<int>(R) + 1>...};
}
template <WeightType T>
void panel_pass(QPath path, const std::uint8_t* pan, const std::uint8_t* pan2, std::int64_t nc, const QRows& xq,
                std::int64_t r0, int rt, float* y, std::int64_t y_stride, std::int64_t o0, int nvalid) {
  static constexpr auto kPasses = pass_table<T>(std::make_index_sequence<8>{});
  kPasses[static_cast<std::size_t>(rt - 1)](path, pan, pan2, nc, xq, r0, y, y_stride, o0, nvalid);
}

// Bytes of weights ahead of the panel being computed that are prefetched: the hardware prefetcher
// alone stops at every 4 KiB page and leaves a core at a fraction of its share of the bandwidth
// (measured: the 30 MB output head 3.6 → 1.2–2 ms at one activation row). Into L2 (T1), 4 KiB ahead:
// against L1 (T0) 2 KiB ahead, 200 Q4_1 matrices of 1536 × 576 from memory, alternating, medians:
// 1 row 4.1 → 3.9 ms, 4 rows 5.9 → 5.2, 16 rows 15.5 → 13.4 (Zen 4 VM); T1 at 2 KiB was slower.
constexpr std::size_t kPrefetchAhead = 4096;

inline void prefetch_range(const std::uint8_t* a, const std::uint8_t* b) {
  for (; a < b; a += 64) _mm_prefetch(reinterpret_cast<const char*>(a), _MM_HINT_T1);
}

#include "kernels/cpu/qmatmul_amx.inc"

// Panels [pb, pe) of a packed matrix for every activation row (groups of rows_per_pass rows per pass
// over a panel; the panel stays in L1 between passes).
template <WeightType T>
void panel_range(QPath path, const WeightMatrix& w, std::int64_t pb, std::int64_t pe, const QRows& xq, float* y,
                 std::int64_t y_stride) {
  const std::int64_t nc = w.in_dim / 32;
  const auto pbytes = static_cast<std::size_t>(nc * packed::panel_chunk_bytes(T));
  const std::uint8_t* end = packed::panel_chunk(w, pe, 0);
  if (path != QPath::Scalar)
    prefetch_range(packed::panel_chunk(w, pb, 0), std::min(end, packed::panel_chunk(w, pb, 0) + kPrefetchAhead));
  // Vnni512 takes the panels two at a time (a lone last panel goes through the 256-bit kernel) when
  // the call has more rows than one pass: up to 8 rows the weights' stream from memory sets the pace,
  // and there the 512-bit kernel measured 1.2–1.3× slower (two panels' streams at once; Zen 4).
  const std::int64_t step = path == QPath::Vnni512 && xq.rows > kNarrowRows ? 2 : 1;
  for (std::int64_t p = pb; p < pe; p += step) {
    const std::uint8_t* pan = packed::panel_chunk(w, p, 0);
    const std::int64_t o0 = p * packed::kPanel;
    if (path == QPath::Scalar) {
      panel_scalar<T>(pan, nc, xq, y, y_stride, o0, static_cast<int>(std::min(packed::kPanel, w.out_dim - o0)));
      continue;
    }
    const std::int64_t np = std::min(step, pe - p);
    const std::uint8_t* pan2 = np == 2 ? pan + pbytes : nullptr;
    const int nvalid = static_cast<int>(std::min(np * packed::kPanel, w.out_dim - o0));
    prefetch_range(std::min(end, pan + kPrefetchAhead), std::min(end, pan + kPrefetchAhead + np * pbytes));
    const std::int64_t per = rows_per_pass(path);
    for (std::int64_t r0 = 0; r0 < xq.rows; r0 += per)
      panel_pass<T>(path, pan, pan2, nc, xq, r0, static_cast<int>(std::min(per, xq.rows - r0)), y, y_stride, o0,
                    nvalid);
  }
}

// Tile panels [tb, te) of a Q4_0/Q4_1/Q8_0 matrix's tile copy on 512-bit VNNI, every activation row
// (passes of up to 8 rows): what the AMX route runs for calls below its tile threshold, so that one
// copy of the weights is streamed at every row count. With the panel copy read by the small calls and
// the tile copy by the large ones, a speculative run alternating between them streamed twice the
// weights and found neither copy in the cache: a 1-row forward of the default model took 7.0 ms
// after 4- to 16-row ones against 4.6–4.9 ms alone (Xeon VM with AMX, 2026-12-07).
template <WeightType T, std::size_t... R>
constexpr auto tile_copy_table(std::index_sequence<R...>) {
  return std::array{&vnni512::panel2<T, static_cast<int>(R) + 1, vnni512::TileRecords<T>>...};
}
template <WeightType T>
void tile_copy_range(const WeightMatrix& w, std::int64_t tb, std::int64_t te, const QRows& xq, float* y,
                     std::int64_t y_stride) {
  static constexpr auto kPasses = tile_copy_table<T>(std::make_index_sequence<8>{});
  const std::int64_t nc = w.in_dim / 32;
  const auto pbytes = static_cast<std::size_t>(nc * packed::tile_chunk_bytes(T));
  const std::uint8_t* end = packed::tile_chunk(w, te, 0);
  prefetch_range(packed::tile_chunk(w, tb, 0), std::min(end, packed::tile_chunk(w, tb, 0) + kPrefetchAhead));
  for (std::int64_t p = tb; p < te; ++p) {
    const std::uint8_t* pan = packed::tile_chunk(w, p, 0);
    const std::int64_t o0 = p * packed::kTilePanel;
    const int nvalid = static_cast<int>(std::min(packed::kTilePanel, w.out_dim - o0));
    prefetch_range(std::min(end, pan + kPrefetchAhead), std::min(end, pan + kPrefetchAhead + pbytes));
    for (std::int64_t r0 = 0; r0 < xq.rows; r0 += kNarrowRows) {
      const auto rt = static_cast<std::size_t>(std::min(kNarrowRows, xq.rows - r0));
      kPasses[rt - 1](vnni512::TileRecords<T>{pan}, nc, xq, r0, y, y_stride, o0, nvalid);
    }
  }
}
void tile_copy_range(const WeightMatrix& w, std::int64_t tb, std::int64_t te, const QRows& xq, float* y,
                     std::int64_t y_stride) {
  switch (w.type) {
    case WeightType::Q4_0:
      return tile_copy_range<WeightType::Q4_0>(w, tb, te, xq, y, y_stride);
    case WeightType::Q4_1:
      return tile_copy_range<WeightType::Q4_1>(w, tb, te, xq, y, y_stride);
    case WeightType::Q8_0:
      return tile_copy_range<WeightType::Q8_0>(w, tb, te, xq, y, y_stride);
    default:
      throw std::logic_error("qmatmul: the tile copy's SIMD kernel takes Q4_0/Q4_1/Q8_0 only");
  }
}

using DecodeFn = void (*)(const WeightMatrix&, std::int64_t, WTile&, int);
using ApplyFn = void (*)(const WTile&, int, const QRows&, float*, std::int64_t);

DecodeFn decode_for(QPath p, WeightType t) {
  switch (t) {
    case WeightType::Q4_K:
      return p == QPath::Scalar ? &decode_row_scalar<WeightType::Q4_K> : &decode_q4k_row_avx2;
    case WeightType::Q6_K:
      return &decode_row_scalar<WeightType::Q6_K>;
    default:
      throw std::logic_error("qmatmul: no integer kernel for this weight type");
  }
}

ApplyFn apply_for(QPath p, bool s) {
  switch (p) {
    case QPath::Vnni:
    case QPath::Vnni512:  // the decoded-row tiles have no 512-bit twin
      return s ? &vnni::apply<true> : &vnni::apply<false>;
    case QPath::Avx2:
      return s ? &avx2::apply<true> : &avx2::apply<false>;
    case QPath::Scalar:
    case QPath::Amx:  // never asked: a Route sends these formats to its fallback
    case QPath::AmxEmulated:
      break;
  }
  return s ? &apply_scalar<true> : &apply_scalar<false>;
}

// Units of kPanel output rows [ub, ue) of one matrix for every quantized activation row: panels of
// a packed matrix, tiles of decoded rows otherwise.
void units_range(QPath path, const WeightMatrix& w, std::int64_t ub, std::int64_t ue, const QRows& xq, float* y,
                 std::int64_t y_stride) {
  switch (w.type) {
    case WeightType::Q4_0:
      return panel_range<WeightType::Q4_0>(path, w, ub, ue, xq, y, y_stride);
    case WeightType::Q4_1:
      return panel_range<WeightType::Q4_1>(path, w, ub, ue, xq, y, y_stride);
    case WeightType::Q8_0:
      return panel_range<WeightType::Q8_0>(path, w, ub, ue, xq, y, y_stride);
    default:
      break;
  }
  static_assert(packed::kPanel % kOut == 0, "a unit is whole tiles");
  const std::int64_t ob = ub * packed::kPanel, oe = std::min(w.out_dim, ue * packed::kPanel);
  thread_local WTile tile;
  tile.shape(w.in_dim / 32);
  const DecodeFn decode = decode_for(path, w.type);
  const ApplyFn apply = apply_for(path, is_signed(w.type));
  for (std::int64_t o0 = ob; o0 < oe; o0 += kOut) {
    const int no = static_cast<int>(std::min<std::int64_t>(kOut, oe - o0));
    for (int k = 0; k < no; ++k) decode(w, o0 + k, tile, k);
    apply(tile, no, xq, y + o0, y_stride);
  }
}

// Up to this many activation rows, every thread quantizes all of them into its own buffer (a few
// microseconds at most) and the products start at once: one pool job per call instead of two.
constexpr std::int64_t kLocalQuantRows = 16;

void quantize_range(QPath path, const float* x, std::int64_t in, QRows& xq, std::int64_t b0, std::int64_t b1) {
  if (path == QPath::Scalar || !cpu_path_available(CpuPath::Avx2))  // the emulated tiles run anywhere
    quantize_blocks(x, in, xq, b0, b1);
  else
    quantize_blocks_avx2(x, in, xq, b0, b1);
}

// How one call is computed: `path`; when it is a tile path, calls of at least tile_rows rows
// (tile_rows_k for Q4_K/Q6_K; 0: never) on matrices with a tile copy run on the tiles and everything
// else on `fallback` (same bits).
struct Route {
  QPath path = QPath::Scalar;
  QPath fallback = QPath::Scalar;
  std::int64_t tile_rows = 1, tile_rows_k = 1;
  // Calls of Q4_0/Q4_1/Q8_0 matrices with a tile copy that the tiles do not take read that copy with
  // 512-bit VNNI (tile_copy_range) instead of the panels.
  bool simd_reads_tiles = false;
};

bool is_tile_path(QPath p) { return p == QPath::Amx || p == QPath::AmxEmulated; }

// Tile panels [tb, te) of a matrix with a tile copy.
template <WeightType T>
void tile_range_of(bool hw, const WeightMatrix& w, std::int64_t tb, std::int64_t te, const QRows& xq, float* y,
                   std::int64_t y_stride) {
  hw ? amx::range<tiles::Hardware, T>(w, tb, te, xq, y, y_stride)
     : amx::range<tiles::Emulated, T>(w, tb, te, xq, y, y_stride);
}

void tile_range(QPath path, const WeightMatrix& w, std::int64_t tb, std::int64_t te, const QRows& xq, float* y,
                std::int64_t y_stride) {
  const bool hw = path == QPath::Amx;
  switch (w.type) {
    case WeightType::Q4_K:
      return tile_range_of<WeightType::Q4_K>(hw, w, tb, te, xq, y, y_stride);
    case WeightType::Q6_K:
      return tile_range_of<WeightType::Q6_K>(hw, w, tb, te, xq, y, y_stride);
    case WeightType::Q4_0:
      return tile_range_of<WeightType::Q4_0>(hw, w, tb, te, xq, y, y_stride);
    case WeightType::Q4_1:
      return tile_range_of<WeightType::Q4_1>(hw, w, tb, te, xq, y, y_stride);
    default:
      return tile_range_of<WeightType::Q8_0>(hw, w, tb, te, xq, y, y_stride);
  }
}

void qmatmul_many_path(const Route& route, const MatmulJob* jobs, int n_jobs, const float* x, std::int64_t rows) {
  packed::checked_total_rows(jobs, n_jobs, std::int64_t{1} << 30);
  const QPath path = is_tile_path(route.path) ? route.fallback : route.path;  // for what the tiles do not take
  auto on_tiles = [&](const WeightMatrix& w) {
    if (!is_tile_path(route.path) || !w.tiles) return false;
    const std::int64_t from = packed::is_kquant(w.type) ? route.tile_rows_k : route.tile_rows;
    return from > 0 && rows >= from;
  };
  auto reads_tile_copy = [&](const WeightMatrix& w) {
    return route.simd_reads_tiles && w.tiles && packed::is_packed(w.type) && !on_tiles(w);
  };
  // Threads split units of output rows: tile panels (16) of what reads the tile copy, 8 rows else.
  auto units_of = [&](const WeightMatrix& w) {
    const std::int64_t unit = on_tiles(w) || reads_tile_copy(w) ? packed::kTilePanel : packed::kPanel;
    return (w.out_dim + unit - 1) / unit;
  };
  std::int64_t total = 0;  // over all matrices
  for (int j = 0; j < n_jobs; ++j) total += units_of(*jobs[j].w);
  const std::int64_t in = jobs[0].w->in_dim;
  // Equal contiguous ranges of the concatenated units, one per thread.
  auto products = [&](const QRows& xq, int tid, int nth) {
    const std::int64_t begin = total * tid / nth, end = total * (tid + 1) / nth;
    std::int64_t base = 0;
    for (int j = 0; j < n_jobs; ++j) {
      const WeightMatrix& w = *jobs[j].w;
      const std::int64_t n = units_of(w);
      const std::int64_t b = std::max(begin, base) - base, e = std::min(end, base + n) - base;
      if (b < e && on_tiles(w))
        tile_range(route.path, w, b, e, xq, jobs[j].y, w.out_dim);
      else if (b < e && reads_tile_copy(w))
        tile_copy_range(w, b, e, xq, jobs[j].y, w.out_dim);
      else if (b < e)
        units_range(path, w, b, e, xq, jobs[j].y, w.out_dim);
      base += n;
    }
  };
  if (rows <= kLocalQuantRows) {  // the same bytes in every thread's buffer
    parallel_run([&](int tid, int nth) {
      thread_local QRows local;
      quantize_shape(rows, in, local);
      quantize_range(path, x, in, local, 0, rows * local.nc);
      products(local, tid, nth);
    });
    return;
  }
  thread_local QRows quantized;  // the caller's; the pool's threads reach it through these references
  quantize_shape(rows, in, quantized);
  QRows& xq = quantized;
  // The activation blocks are quantized once (every thread a share), then shared by every matrix.
  parallel_run([&](int tid, int nth) {
    const std::int64_t blocks = rows * xq.nc;
    quantize_range(path, x, in, xq, blocks * tid / nth, blocks * (tid + 1) / nth);
  });
  parallel_run([&](int tid, int nth) { products(xq, tid, nth); });
}

}  // namespace

const char* precision_name(Precision p) { return p == Precision::Fast ? "fast" : "exact"; }

bool has_integer_path(WeightType t) {
  return t == WeightType::Q4_0 || t == WeightType::Q4_1 || t == WeightType::Q8_0 || t == WeightType::Q4_K ||
         t == WeightType::Q6_K;
}

namespace {

// A random ggml matrix of `out` rows of `in` elements with finite f16 scales (0x3c00 | low bits),
// packed with its tile copy: what the start-up timing and the self-check multiply.
struct ProbeMatrix {
  std::vector<std::uint8_t> ggml, storage;
  WeightMatrix w;
  ProbeMatrix(WeightType t, std::int64_t out, std::int64_t in, std::uint32_t seed) {
    const std::size_t rb = row_bytes(t, static_cast<std::size_t>(in)), bb = block_bytes(t);
    ggml.resize(rb * static_cast<std::size_t>(out));
    for (auto& b : ggml) b = static_cast<std::uint8_t>((seed = seed * 1664525u + 1013904223u) >> 24);
    for (std::size_t blk = 0; blk < ggml.size() / bb; ++blk) {  // d (Q6_K: at the block's end), dmin, m
      ggml[blk * bb + (t == WeightType::Q6_K ? 209 : 1)] = 0x3c;
      if (t == WeightType::Q4_1 || t == WeightType::Q4_K) ggml[blk * bb + 3] = 0x3c;
    }
    w = pack_matrix({t, out, in, ggml.data(), rb}, storage, TileCopy::With);
  }
};

// x (rows × in) of a fixed pseudo-random pattern with an all-zero block, quantized.
void probe_rows(std::int64_t rows, std::int64_t in, std::uint32_t seed, QRows& xq) {
  std::vector<float> x(static_cast<std::size_t>(rows * in));
  for (auto& v : x)
    v = static_cast<float>(static_cast<int>((seed = seed * 1664525u + 1013904223u) >> 24) - 128) / 37.0f;
  std::fill(x.begin(), x.begin() + std::min<std::size_t>(32, x.size()), 0.0f);
  quantize_shape(rows, in, xq);
  quantize_blocks(x.data(), in, xq, 0, rows * xq.nc);
}

// Seconds for one product of a small Q4_1 matrix (32 panels × 576, in L2) with 16 activation rows
// (where Vnni512 uses its 512-bit kernel) on this thread, best of `reps`, the two widths alternating.
std::pair<double, double> time_vnni_widths(int reps) {
  constexpr std::int64_t out = 256, in = 576, rows = 16;
  const ProbeMatrix m(WeightType::Q4_1, out, in, 12345);
  std::vector<float> y(static_cast<std::size_t>(rows * out));
  QRows xq;
  probe_rows(rows, in, 7919, xq);
  double best[2] = {1e9, 1e9};
  for (int i = 0; i < reps; ++i)
    for (int k = 0; k < 2; ++k) {
      const QPath p = k == 0 ? QPath::Vnni : QPath::Vnni512;
      const auto t0 = std::chrono::steady_clock::now();
      for (int j = 0; j < 4; ++j) panel_range<WeightType::Q4_1>(p, m.w, 0, out / packed::kPanel, xq, y.data(), out);
      best[k] = std::min(best[k], std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 4);
    }
  return {best[0], best[1]};
}

// A tile unit whose every stored result has bit 0 of its first dword flipped (the self-check's test).
template <class Unit>
struct Faulty : Unit {
  template <int T>
  static void store(void* base, std::size_t stride) {
    Unit::template store<T>(base, stride);
    static_cast<std::int32_t*>(base)[0] ^= 1;
  }
};

// The row counts the start-up timing compares the tiles and the other path at.
constexpr std::array<std::int64_t, 6> kTimedRows = {1, 2, 4, 8, 12, 16};

// Times the tiles against `other` at kTimedRows on this thread (a Q8_0 and a Q4_1 matrix of 256 × 576,
// or with `kquant` a Q4_K and a Q6_K one of 256 × 512, in L2, best of 5, alternating); returns the
// smallest count from which the tiles were at least 5 % faster at every larger timed count (0: at
// none), and the ratios in words.
std::pair<std::int64_t, std::string> time_tile_rows(QPath other, bool kquant) {
  constexpr std::int64_t out = 256;
  const std::int64_t in = kquant ? 512 : 576;
  const ProbeMatrix q8(kquant ? WeightType::Q6_K : WeightType::Q8_0, out, in, 99),
      q4(kquant ? WeightType::Q4_K : WeightType::Q4_1, out, in, 98);
  std::vector<float> y(static_cast<std::size_t>(16 * out));
  std::array<double, kTimedRows.size()> ratio{};
  for (std::size_t i = 0; i < kTimedRows.size(); ++i) {
    QRows xq;
    probe_rows(kTimedRows[i], in, 31, xq);
    double best[2] = {1e9, 1e9};
    for (int rep = 0; rep < 5; ++rep)
      for (int k = 0; k < 2; ++k) {
        const auto t0 = std::chrono::steady_clock::now();
        for (const ProbeMatrix* m : {&q8, &q4}) {
          if (k == 0)
            tile_range(QPath::Amx, m->w, 0, packed::tile_panel_count(out), xq, y.data(), out);
          else if (kquant)
            units_range(other, m->w, 0, packed::panel_count(out), xq, y.data(), out);
          else  // what runs these calls below the threshold: the same tile copy on 512-bit VNNI
            tile_copy_range(m->w, 0, packed::tile_panel_count(out), xq, y.data(), out);
        }
        best[k] = std::min(best[k], std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
    ratio[i] = best[0] / best[1];
  }
  std::int64_t from = 0;
  for (std::size_t i = kTimedRows.size(); i-- > 0 && ratio[i] < 0.95;) from = kTimedRows[i];
  std::string words = std::string(kquant ? "Q4_K/Q6_K" : "Q4_0/Q4_1/Q8_0") + " products timed at start took";
  for (std::size_t i = 0; i < kTimedRows.size(); ++i) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "%s %.2fx at %lld row%s", i ? "," : "", ratio[i],
                  static_cast<long long>(kTimedRows[i]), kTimedRows[i] == 1 ? "" : "s");
    words += buf;
  }
  return {from, words + " on the tiles (against " +
                    (kquant ? std::string(qpath_name(other)) : std::string("512-bit VNNI on the tile copy")) + ")"};
}

// The non-tile choice: the exact precision's path and its overrides, then VNNI's width by a timing.
std::pair<QPath, std::string> choose_simd(const std::string& want) {
  switch (cpu_path()) {
    case CpuPath::Scalar:
      return {QPath::Scalar,
              "scalar: " + std::string(want == "scalar" ? "SPECACTOR_CPU_PATH=scalar" : "no AVX2 + FMA + F16C")};
    case CpuPath::Avx2:
      if (want == "avx2") return {QPath::Avx2, "avx2: SPECACTOR_CPU_PATH=avx2"};
      return {QPath::Avx2, "avx2: no AVX-512 F/BW/VL"};
    case CpuPath::Avx512:
      break;
  }
  if (!has_vnni()) return {QPath::Avx2, "avx2: AVX-512 without VNNI"};
  if (want == "vnni256") return {QPath::Vnni, "avx512-vnni (256-bit): SPECACTOR_CPU_PATH=vnni256"};
  if (want == "vnni512")
    return {QPath::Vnni512, "avx512-vnni-512 (512-bit above 8 rows, 256-bit up to 8): SPECACTOR_CPU_PATH=vnni512"};
  const auto [t256, t512] = time_vnni_widths(7);
  // 512-bit only when it is clearly faster (5 %): the two give the same bits, so a wrong pick costs
  // speed only, and a VM's noise should not flip a tie.
  const bool wide = t512 < 0.95 * t256;
  char buf[160];
  std::snprintf(buf, sizeof buf, "a 16-row product timed at start took %.2fx the time with 512-bit dpbusd",
                t512 / t256);
  return {wide ? QPath::Vnni512 : QPath::Vnni,
          std::string(wide ? "avx512-vnni-512 (512-bit above 8 rows, 256-bit up to 8): " : "avx512-vnni (256-bit): ") +
              buf};
}

QPathDecision choose_qpath() {
  const char* env = std::getenv("SPECACTOR_CPU_PATH");
  const std::string want = env ? env : "";
  const auto [simd, simd_reason] = choose_simd(want);
  TileProbe probe;
  const bool considered = want.empty() || want == "amx" || want == "amx-emulated" || want == "avx512";
  if (considered && want != "amx-emulated") {
    probe.cpu = tiles::cpu_has_amx_int8() && has_vnni();
    if (!tiles::cpu_has_amx_int8())
      probe.cpu_why = "CPUID reports no AMX-TILE/AMX-INT8 (or the OS does not enable the tile state)";
    else if (!probe.cpu)
      probe.cpu_why = "AMX without the AVX-512 VNNI the tile kernels fold with";
    if (probe.cpu) probe.permission = tiles::amx_permission(probe.permission_why);
    if (probe.permission) probe.self_check = tile_self_check(QPath::Amx, simd, probe.self_check_why);
    if (probe.self_check && want != "amx") {
      std::tie(probe.tile_rows, probe.timing) = time_tile_rows(simd, false);
      std::tie(probe.tile_rows_k, probe.timing_k) = time_tile_rows(simd, true);
    }
  }
  QPathDecision d = decide_qpath(want, simd, simd_reason, probe);
  if (!d.warning.empty()) std::fprintf(stderr, "specactor: %s\n", d.warning.c_str());
  return d;
}

const QPathDecision& qpath_choice() {
  static const QPathDecision choice = choose_qpath();
  return choice;
}

// The engine's route (qpath()'s decision), or for a path asked for by name (qmatmul_path: tests,
// benchmarks) the tiles for every row count and the rest on the widest SIMD.
Route route_of(QPath p, bool by_name) {
  const QPathDecision& c = qpath_choice();
  // Where AMX runs (it implies AVX-512 VNNI), the packed formats' calls below the tile threshold read
  // the tile copy too.
  if (!by_name && p == c.path) return {c.path, c.fallback, c.tile_rows, c.tile_rows_k, c.path == QPath::Amx};
  const QPath other = has_vnni() ? QPath::Vnni : cpu_path_available(CpuPath::Avx2) ? QPath::Avx2 : QPath::Scalar;
  return {p, is_tile_path(p) ? other : p, 1, 1};
}

}  // namespace

QPathDecision decide_qpath(const std::string& want, QPath simd, const std::string& simd_reason,
                           const TileProbe& probe) {
  QPathDecision d{simd, simd, 0, 0, simd_reason, ""};
  const std::string running = std::string("; running ") + qpath_name(simd);
  const char* formats = "Q4_0/Q4_1/Q8_0/Q4_K/Q6_K";
  if (want == "amx-emulated") {
    d.path = QPath::AmxEmulated;
    d.tile_rows = d.tile_rows_k = 1;
    d.reason = std::string("amx-emulated: SPECACTOR_CPU_PATH=amx-emulated (the tile kernels on the software model ") +
               "for every call of " + formats + ", slow: for tests; other formats on " + simd_reason + ")";
    return d;
  }
  if (!want.empty() && want != "amx" && want != "avx512") {
    d.reason += "; AMX not used: SPECACTOR_CPU_PATH=" + want;
    static constexpr const char* kKnown[] = {"scalar", "avx2", "vnni256", "vnni512"};
    if (std::find(std::begin(kKnown), std::end(kKnown), want) == std::end(kKnown))
      d.warning = "SPECACTOR_CPU_PATH=" + want +
                  " is not a path (scalar, avx2, avx512, vnni256, vnni512, amx, amx-emulated): not followed" + running;
    return d;
  }
  if (!probe.cpu) {
    d.reason += "; no AMX: " + probe.cpu_why;
    if (want == "amx") d.warning = "SPECACTOR_CPU_PATH=amx refused: " + probe.cpu_why + running;
    return d;
  }
  if (!probe.permission) {
    d.reason += "; AMX not used: " + probe.permission_why;
    d.warning = "AMX not used: " + probe.permission_why + running;
    return d;
  }
  if (!probe.self_check) {
    d.reason += "; AMX disabled: the self-check failed (" + probe.self_check_why + ")";
    d.warning = "error: AMX disabled for this process: the self-check's tile results differ from the " +
                std::string(qpath_name(simd)) + " path (" + probe.self_check_why + ")" + running;
    return d;
  }
  if (want == "amx") {
    d.path = QPath::Amx;
    d.tile_rows = d.tile_rows_k = 1;
    d.reason = std::string("amx: SPECACTOR_CPU_PATH=amx (the tiles for every call of ") + formats +
               ", self-check passed; other formats on " + simd_reason + ")";
    return d;
  }
  const std::string timings = probe.timing + "; " + probe.timing_k;
  if (probe.tile_rows <= 0 && probe.tile_rows_k <= 0) {
    d.reason += "; AMX not used: slower here at every row count (" + timings + ")";
    return d;
  }
  d.path = QPath::Amx;
  d.tile_rows = std::max<std::int64_t>(probe.tile_rows, 0);
  d.tile_rows_k = std::max<std::int64_t>(probe.tile_rows_k, 0);
  auto calls = [](std::int64_t from, const char* which) {
    return from > 0 ? std::string("calls of ") + std::to_string(from) + " or more rows of " + which + " on the tiles"
                    : std::string(which) + " not on the tiles (slower at every row count)";
  };
  d.reason = "amx: " + calls(d.tile_rows, "Q4_0/Q4_1/Q8_0") + ", " + calls(d.tile_rows_k, "Q4_K/Q6_K") +
             " (self-check passed; " + timings + "); their other calls on 512-bit VNNI over the same tile copy, " +
             "the rest on " + simd_reason;
  return d;
}

bool tile_self_check(QPath tile, QPath reference, std::string& why, bool corrupt) {
  if (!is_tile_path(tile)) throw std::invalid_argument("tile_self_check: not a tile path");
  auto name = [](WeightType t) {
    switch (t) {
      case WeightType::Q8_0:
        return "Q8_0";
      case WeightType::Q4_1:
        return "Q4_1";
      case WeightType::Q4_0:
        return "Q4_0";
      case WeightType::Q4_K:
        return "Q4_K";
      default:
        return "Q6_K";
    }
  };
  for (const WeightType t : {WeightType::Q8_0, WeightType::Q4_1, WeightType::Q4_0, WeightType::Q4_K, WeightType::Q6_K})
    for (const std::int64_t in0 : {96, 256}) {  // packed: 3 chunks (a lone last chunk), 8 (pairs only)
      const std::int64_t in = !packed::is_kquant(t) ? in0 : in0 == 96 ? 256 : 512;  // K: 1 and 2 super-blocks
      constexpr std::int64_t out = 40;  // two whole tile panels and a half one
      const ProbeMatrix m(t, out, in, 4242 + static_cast<std::uint32_t>(in));
      std::vector<float> yt(static_cast<std::size_t>(20 * out)), yr(yt.size());
      for (std::int64_t rows = 1; rows <= 20; rows += rows < 16 ? 1 : 4) {
        QRows xq;
        probe_rows(rows, in, 17 + static_cast<std::uint32_t>(rows), xq);
        const std::int64_t tp = packed::tile_panel_count(out);
        if (corrupt && t == WeightType::Q8_0)
          tile == QPath::Amx ? amx::range<Faulty<tiles::Hardware>, WeightType::Q8_0>(m.w, 0, tp, xq, yt.data(), out)
                             : amx::range<Faulty<tiles::Emulated>, WeightType::Q8_0>(m.w, 0, tp, xq, yt.data(), out);
        else if (corrupt)
          continue;
        else
          tile_range(tile, m.w, 0, tp, xq, yt.data(), out);
        units_range(reference, m.w, 0, packed::panel_count(out), xq, yr.data(), out);
        for (std::int64_t i = 0; i < rows * out; ++i)
          if (std::memcmp(&yt[static_cast<std::size_t>(i)], &yr[static_cast<std::size_t>(i)], sizeof(float)) != 0) {
            char buf[200];
            std::snprintf(buf, sizeof buf, "%s %lld x %lld, %lld rows: output (%lld, %lld) %.9g against %.9g", name(t),
                          static_cast<long long>(out), static_cast<long long>(in), static_cast<long long>(rows),
                          static_cast<long long>(i / out), static_cast<long long>(i % out),
                          yt[static_cast<std::size_t>(i)], yr[static_cast<std::size_t>(i)]);
            why = buf;
            return false;
          }
      }
    }
  return true;
}

QPath qpath() { return qpath_choice().path; }
const std::string& qpath_reason() { return qpath_choice().reason; }
std::int64_t qpath_tile_rows() { return is_tile_path(qpath()) ? qpath_choice().tile_rows : 0; }
std::int64_t qpath_tile_rows_k() { return is_tile_path(qpath()) ? qpath_choice().tile_rows_k : 0; }

const char* qpath_name(QPath p) {
  switch (p) {
    case QPath::Amx:
      return "amx";
    case QPath::AmxEmulated:
      return "amx-emulated";
    case QPath::Vnni512:
      return "avx512-vnni-512";
    case QPath::Vnni:
      return "avx512-vnni";
    case QPath::Avx2:
      return "avx2";
    case QPath::Scalar:
      return "scalar";
  }
  return "scalar";
}

bool qpath_available(QPath p) {
  switch (p) {
    case QPath::Amx: {
      std::string why;
      return tiles::cpu_has_amx_int8() && has_vnni() && tiles::amx_permission(why);
    }
    case QPath::AmxEmulated:
      return true;
    case QPath::Vnni:
    case QPath::Vnni512:
      return has_vnni();
    case QPath::Avx2:
      return cpu_path_available(CpuPath::Avx2);
    case QPath::Scalar:
      return true;
  }
  return false;
}

void matmul_many(const MatmulJob* jobs, int n_jobs, const float* x, std::int64_t rows, Precision precision) {
  if (precision == Precision::Exact || rows <= 0) return matmul_many(jobs, n_jobs, x, rows);
  bool all_integer = true;
  for (int j = 0; j < n_jobs; ++j) all_integer = all_integer && has_integer_path(jobs[j].w->type);
  const Route route = route_of(qpath(), false);
  if (all_integer) return qmatmul_many_path(route, jobs, n_jobs, x, rows);
  for (int j = 0; j < n_jobs; ++j) {  // mixed formats: each matrix on its own path
    if (has_integer_path(jobs[j].w->type))
      qmatmul_many_path(route, &jobs[j], 1, x, rows);
    else
      matmul_many(&jobs[j], 1, x, rows);
  }
}

void matmul(const WeightMatrix& w, const float* x, std::int64_t rows, float* y, Precision precision) {
  const MatmulJob job{&w, y};
  matmul_many(&job, 1, x, rows, precision);
}

void qmatmul_tile_copy_simd(const WeightMatrix& w, const float* x, std::int64_t rows, float* y) {
  if (!packed::is_packed(w.type) || !w.tiles)
    throw std::invalid_argument("qmatmul_tile_copy_simd: a Q4_0/Q4_1/Q8_0 matrix with its tile copy is needed");
  if (!has_vnni()) throw std::invalid_argument("qmatmul_tile_copy_simd: this CPU lacks AVX-512 VNNI");
  const MatmulJob job{&w, y};
  // A tile route whose tiles take no call: every call reads the tile copy on 512-bit VNNI.
  qmatmul_many_path({QPath::AmxEmulated, QPath::Vnni, 0, 0, true}, &job, 1, x, rows);
}

void qmatmul_path(QPath path, const WeightMatrix& w, const float* x, std::int64_t rows, float* y) {
  if (!has_integer_path(w.type)) throw std::invalid_argument("qmatmul: no integer kernel for this weight type");
  if (!qpath_available(path))
    throw std::invalid_argument(std::string("qmatmul: this CPU lacks the ") + qpath_name(path) + " path");
  if (is_tile_path(path) && !w.tiles)
    throw std::invalid_argument(std::string("qmatmul: the ") + qpath_name(path) +
                                " path needs the tile copy (pack_matrix with TileCopy::With)");
  const MatmulJob job{&w, y};
  qmatmul_many_path(route_of(path, true), &job, 1, x, rows);
}

}  // namespace specactor::kernels
