// kernels/cpu/matmul.cpp — quantized/float matrix products: scalar, AVX2 and AVX-512 twins that
// perform one and the same arithmetic, so every path gives bit-identical results.
//
// Layout: Q8_0, Q4_0 and Q4_1 matrices are repacked once at load (pack_matrix) into panels of 8 rows
// (packed.hpp), the layout the fast precision's integer kernels stream; this precision gathers each
// row out of its panel into [d[nc]] [m[nc] (Q4_1)] [qs[nc]] before its loop. Other types keep the
// ggml layout.
//
// The canonical arithmetic for one output y = Σ_i W[o,i]·x[i] over 32-element chunks c
// (lane l = 0..15 pairs elements l and 16+l of the chunk; acc[0], acc[1] alternate by chunk):
//   factored types (Q8_0, Q4_0):  q = integer quant as float (Q4_0: nibble − 8)
//       p[l] = q[l]·x[l];  p[l] = fma(q[16+l], x[16+l], p[l]);  acc[c%2][l] = fma(d, p[l], acc[c%2][l])
//   dequantized types:            w = Q4_1: fma(d, nibble, m)   Q4_K: fma(d·sc, nibble, −dmin·mn)
//                                     Q6_K, F32, F16, BF16: dequantize_row()'s value
//       p[l] = w[l]·x[l];  p[l] = fma(w[16+l], x[16+l], p[l]);  acc[c%2][l] = acc[c%2][l] + p[l]
//   result: s[l] = acc[0][l] + acc[1][l], then the tree s[l] += s[l+8], s[l+4], s[l+2], s[l+1].
// Every (row, output) pair runs these operations in this order whatever the number of rows in the
// call, so a token's logits do not depend on its batch.
#include "kernels/cpu/matmul.hpp"

#include <cpuid.h>
#include <immintrin.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/packed.hpp"
#include "kernels/cpu/pool.hpp"

namespace specactor::kernels {

namespace {

using packed::AlignedAllocator;

constexpr int kTile = 4;          // activation rows sharing one decoded weight chunk
constexpr int kMaxChunks = 1024;  // in_dim up to 32768

using packed::is_packed;
using packed::load_u16;
using packed::packed_row;
using packed::PackedRow;
using packed::quant_bytes;
using packed::scale_arrays;
constexpr bool is_factored(WeightType t) { return t == WeightType::Q8_0 || t == WeightType::Q4_0; }

// Scales of a packed row as floats (all paths use the same exact conversion).
void row_scales(WeightType t, const std::uint8_t* row, std::int64_t nc, float* d, float* m) {
  const PackedRow r = packed_row(t, row, nc);
  for (std::int64_t c = 0; c < nc; ++c) {
    d[c] = f16_to_f32(load_u16(r.d + 2 * c));
    if (t == WeightType::Q4_1) m[c] = f16_to_f32(load_u16(r.m + 2 * c));
  }
}

// The same with F16C (exact conversion, identical values), 8 at a time.
__attribute__((target("avx2,f16c"))) void f16_to_f32_f16c(const std::uint8_t* src, std::int64_t n, float* dst) {
  std::int64_t c = 0;
  for (; c + 8 <= n; c += 8)
    _mm256_storeu_ps(dst + c, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * c))));
  for (; c < n; ++c) dst[c] = _cvtsh_ss(load_u16(src + 2 * c));
}

void row_scales_f16c(WeightType t, const std::uint8_t* row, std::int64_t nc, float* d, float* m) {
  const PackedRow r = packed_row(t, row, nc);
  f16_to_f32_f16c(r.d, nc, d);
  if (t == WeightType::Q4_1) f16_to_f32_f16c(r.m, nc, m);
}

// The 32 weights of chunk c of a ggml-layout row (dequantized types), exactly as the canonical
// arithmetic defines them.
template <WeightType T>
void dequant_chunk_ggml(const std::uint8_t* row, std::int64_t c, float* w) {
  if constexpr (T == WeightType::Q4_K) {
    const std::uint8_t* b = row + (c / 8) * 144;
    const int sub = static_cast<int>(c % 8);
    std::uint8_t sc, mn;
    q4k_scale_min(sub, b + 4, sc, mn);
    const float d = f16_to_f32(load_u16(b)) * sc, m = -(f16_to_f32(load_u16(b + 2)) * mn);
    const std::uint8_t* qs = b + 16 + (sub / 2) * 32;
    for (int j = 0; j < 32; ++j) w[j] = std::fma(d, static_cast<float>((sub % 2) ? (qs[j] >> 4) : (qs[j] & 0xF)), m);
  } else if constexpr (T == WeightType::Q6_K) {
    float buf[256];
    dequantize_row(T, row + (c / 8) * 210, buf, 256);
    std::memcpy(w, buf + (c % 8) * 32, 32 * sizeof(float));
  } else {
    dequantize_row(T, row + c * 32 * block_bytes(T), w, 32);
  }
}

float tree16(const float* a0, const float* a1) {
  float s[16];
  for (int l = 0; l < 16; ++l) s[l] = a0[l] + a1[l];
  for (int w = 8; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) s[l] = s[l] + s[l + w];
  return s[0];
}

// ---- scalar path --------------------------------------------------------------------------------

template <WeightType T>
void matmul_rows_scalar(const WeightMatrix& w, std::int64_t o_begin, std::int64_t o_end, const float* x,
                        std::int64_t rows, float* y, std::int64_t y_stride) {
  const std::int64_t nc = w.in_dim / 32;
  float q[32], d[kMaxChunks], m[kMaxChunks];
  thread_local std::vector<std::uint8_t> split;  // a packed row, gathered out of its panel
  split.resize(w.row_stride);
  for (std::int64_t o = o_begin; o < o_end; ++o) {
    const std::uint8_t* row =
        is_packed(T) ? packed::split_row(w, o, split.data()) : w.data + static_cast<std::size_t>(o) * w.row_stride;
    PackedRow pr{};
    if constexpr (is_packed(T)) {
      row_scales(T, row, nc, d, m);
      pr = packed_row(T, row, nc);
    }
    for (std::int64_t r0 = 0; r0 < rows; r0 += kTile) {
      const int nt = static_cast<int>(std::min<std::int64_t>(kTile, rows - r0));
      float acc[kTile][2][16] = {};
      for (std::int64_t c = 0; c < nc; ++c) {
        if constexpr (T == WeightType::Q8_0) {
          const auto* b = reinterpret_cast<const std::int8_t*>(pr.qs + c * 32);
          for (int j = 0; j < 32; ++j) q[j] = static_cast<float>(b[j]);
        } else if constexpr (T == WeightType::Q4_0 || T == WeightType::Q4_1) {
          const std::uint8_t* b = pr.qs + c * 16;
          for (int j = 0; j < 16; ++j) {
            const int lo = b[j] & 0xF, hi = b[j] >> 4;
            if constexpr (T == WeightType::Q4_0) {
              q[j] = static_cast<float>(lo - 8);
              q[16 + j] = static_cast<float>(hi - 8);
            } else {
              q[j] = std::fma(d[c], static_cast<float>(lo), m[c]);
              q[16 + j] = std::fma(d[c], static_cast<float>(hi), m[c]);
            }
          }
        } else {
          dequant_chunk_ggml<T>(row, c, q);
        }
        for (int r = 0; r < nt; ++r) {
          const float* xr = x + (r0 + r) * w.in_dim + c * 32;
          float* a = acc[r][c % 2];
          for (int l = 0; l < 16; ++l) {
            float p = q[l] * xr[l];
            p = std::fma(q[16 + l], xr[16 + l], p);
            if constexpr (is_factored(T))
              a[l] = std::fma(d[c], p, a[l]);
            else
              a[l] = a[l] + p;
          }
        }
      }
      for (int r = 0; r < nt; ++r) y[(r0 + r) * y_stride + o] = tree16(acc[r][0], acc[r][1]);
    }
  }
}

// ---- AVX2 path: lanes 0..7 in lo, 8..15 in hi ---------------------------------------------------

#define SPECACTOR_AVX2 __attribute__((target("avx2,fma,f16c")))

// Chunk c as q[0] = elems 0..7, q[1] = 8..15, q[2] = 16..23, q[3] = 24..31.
template <WeightType T>
SPECACTOR_AVX2 inline void chunk_avx2(const std::uint8_t* row, const PackedRow& pr, std::int64_t c, const float* d,
                                      const float* m, __m256* q) {
  if constexpr (T == WeightType::Q8_0) {
    const std::uint8_t* b = pr.qs + c * 32;
    for (int i = 0; i < 4; ++i)
      q[i] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 8 * i))));
  } else if constexpr (T == WeightType::Q4_0 || T == WeightType::Q4_1) {
    const std::uint8_t* b = pr.qs + c * 16;
    const __m256i v0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b)));
    const __m256i v1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 8)));
    const __m256i nib = _mm256_set1_epi32(0xF);
    const __m256i n[4] = {_mm256_and_si256(v0, nib), _mm256_and_si256(v1, nib), _mm256_srli_epi32(v0, 4),
                          _mm256_srli_epi32(v1, 4)};
    if constexpr (T == WeightType::Q4_0) {
      for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtepi32_ps(_mm256_sub_epi32(n[i], _mm256_set1_epi32(8)));
    } else {
      const __m256 dv = _mm256_set1_ps(d[c]), mv = _mm256_set1_ps(m[c]);
      for (int i = 0; i < 4; ++i) q[i] = _mm256_fmadd_ps(dv, _mm256_cvtepi32_ps(n[i]), mv);
    }
  } else if constexpr (T == WeightType::F32) {
    const float* p = reinterpret_cast<const float*>(row) + c * 32;
    for (int i = 0; i < 4; ++i) q[i] = _mm256_loadu_ps(p + 8 * i);
  } else if constexpr (T == WeightType::F16) {
    const std::uint8_t* p = row + c * 64;
    for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * i)));
  } else if constexpr (T == WeightType::BF16) {
    const std::uint8_t* p = row + c * 64;
    for (int i = 0; i < 4; ++i) {
      const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * i)));
      q[i] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    }
  } else {  // Q4_K, Q6_K
    alignas(32) float buf[32];
    dequant_chunk_ggml<T>(row, c, buf);
    for (int i = 0; i < 4; ++i) q[i] = _mm256_load_ps(buf + 8 * i);
  }
}

// tree16() in registers: s = a0 + a1 (lanes 0..7 lo, 8..15 hi); then l+8, l+4, l+2, l+1.
SPECACTOR_AVX2 inline float tree16_avx2(__m256 a0_lo, __m256 a0_hi, __m256 a1_lo, __m256 a1_hi) {
  const __m256 t8 = _mm256_add_ps(_mm256_add_ps(a0_lo, a1_lo), _mm256_add_ps(a0_hi, a1_hi));
  const __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
  const __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
  return _mm_cvtss_f32(_mm_add_ss(t2, _mm_shuffle_ps(t2, t2, 1)));
}

// One chunk into accumulator set E (compile-time, so the accumulators stay in registers).
template <WeightType T, int NT, int E>
SPECACTOR_AVX2 inline void step_avx2(const std::uint8_t* row, const PackedRow& pr, std::int64_t c, std::int64_t in,
                                     const float* d, const float* m, const float* x, __m256 (&acc)[NT][2][2]) {
  __m256 q[4];
  chunk_avx2<T>(row, pr, c, d, m, q);
  for (int r = 0; r < NT; ++r) {
    const float* xr = x + r * in + c * 32;
    __m256 p0 = _mm256_mul_ps(q[0], _mm256_loadu_ps(xr));
    __m256 p1 = _mm256_mul_ps(q[1], _mm256_loadu_ps(xr + 8));
    p0 = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(xr + 16), p0);
    p1 = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(xr + 24), p1);
    if constexpr (is_factored(T)) {
      const __m256 dv = _mm256_set1_ps(d[c]);
      acc[r][E][0] = _mm256_fmadd_ps(dv, p0, acc[r][E][0]);
      acc[r][E][1] = _mm256_fmadd_ps(dv, p1, acc[r][E][1]);
    } else {
      acc[r][E][0] = _mm256_add_ps(acc[r][E][0], p0);
      acc[r][E][1] = _mm256_add_ps(acc[r][E][1], p1);
    }
  }
}

template <WeightType T, int NT>
SPECACTOR_AVX2 void tile_avx2(const std::uint8_t* row, const PackedRow& pr, std::int64_t nc, std::int64_t in,
                              const float* d, const float* m, const float* x, float* y, std::int64_t y_stride) {
  __m256 acc[NT][2][2];  // [row][chunk parity][lanes 0..7 / 8..15]
  for (int r = 0; r < NT; ++r)
    for (int e = 0; e < 2; ++e) acc[r][e][0] = acc[r][e][1] = _mm256_setzero_ps();
  std::int64_t c = 0;
  for (; c + 2 <= nc; c += 2) {
    step_avx2<T, NT, 0>(row, pr, c, in, d, m, x, acc);
    step_avx2<T, NT, 1>(row, pr, c + 1, in, d, m, x, acc);
  }
  if (c < nc) step_avx2<T, NT, 0>(row, pr, c, in, d, m, x, acc);
  for (int r = 0; r < NT; ++r) y[r * y_stride] = tree16_avx2(acc[r][0][0], acc[r][0][1], acc[r][1][0], acc[r][1][1]);
}

// ---- AVX-512 path: lanes 0..15 in one register -------------------------------------------------

#define SPECACTOR_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

// Chunk c as q0 = elems 0..15, q1 = 16..31. Q4_x nibbles go through a 16-entry table of the chunk's
// 16 possible weights (vpermps uses the low 4 bits of each index, so no mask is needed).
template <WeightType T>
SPECACTOR_AVX512 inline void chunk_avx512(const std::uint8_t* row, const PackedRow& pr, std::int64_t c, const float* d,
                                          const float* m, __m512& q0, __m512& q1) {
  if constexpr (T == WeightType::Q8_0) {
    const std::uint8_t* b = pr.qs + c * 32;
    q0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b))));
    q1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 16))));
  } else if constexpr (T == WeightType::Q4_0 || T == WeightType::Q4_1) {
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 table;
    if constexpr (T == WeightType::Q4_0)
      table = _mm512_sub_ps(iota, _mm512_set1_ps(8.0f));  // exact
    else
      table = _mm512_fmadd_ps(_mm512_set1_ps(d[c]), iota, _mm512_set1_ps(m[c]));
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pr.qs + c * 16)));
    q0 = _mm512_permutexvar_ps(v, table);
    q1 = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table);
  } else if constexpr (T == WeightType::F32) {
    const float* p = reinterpret_cast<const float*>(row) + c * 32;
    q0 = _mm512_loadu_ps(p);
    q1 = _mm512_loadu_ps(p + 16);
  } else if constexpr (T == WeightType::F16) {
    const std::uint8_t* p = row + c * 64;
    q0 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    q1 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32)));
  } else if constexpr (T == WeightType::BF16) {
    const std::uint8_t* p = row + c * 64;
    q0 = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
    q1 = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32))), 16));
  } else {  // Q4_K, Q6_K
    alignas(64) float buf[32];
    dequant_chunk_ggml<T>(row, c, buf);
    q0 = _mm512_load_ps(buf);
    q1 = _mm512_load_ps(buf + 16);
  }
}

SPECACTOR_AVX512 inline float tree16_avx512(__m512 a0, __m512 a1) {
  const __m512 s = _mm512_add_ps(a0, a1);
  const __m256 t8 = _mm256_add_ps(_mm512_castps512_ps256(s), _mm512_extractf32x8_ps(s, 1));
  const __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
  const __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
  return _mm_cvtss_f32(_mm_add_ss(t2, _mm_shuffle_ps(t2, t2, 1)));
}

template <WeightType T, int NT, int E>
SPECACTOR_AVX512 inline void step_avx512(const std::uint8_t* row, const PackedRow& pr, std::int64_t c, std::int64_t in,
                                         const float* d, const float* m, const float* x, __m512 (&acc)[NT][2]) {
  __m512 q0, q1;
  chunk_avx512<T>(row, pr, c, d, m, q0, q1);
  for (int r = 0; r < NT; ++r) {
    const float* xr = x + r * in + c * 32;
    __m512 p = _mm512_mul_ps(q0, _mm512_loadu_ps(xr));
    p = _mm512_fmadd_ps(q1, _mm512_loadu_ps(xr + 16), p);
    if constexpr (is_factored(T))
      acc[r][E] = _mm512_fmadd_ps(_mm512_set1_ps(d[c]), p, acc[r][E]);
    else
      acc[r][E] = _mm512_add_ps(acc[r][E], p);
  }
}

template <WeightType T, int NT>
SPECACTOR_AVX512 void tile_avx512(const std::uint8_t* row, const PackedRow& pr, std::int64_t nc, std::int64_t in,
                                  const float* d, const float* m, const float* x, float* y, std::int64_t y_stride) {
  __m512 acc[NT][2];
  for (int r = 0; r < NT; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  std::int64_t c = 0;
  for (; c + 2 <= nc; c += 2) {
    step_avx512<T, NT, 0>(row, pr, c, in, d, m, x, acc);
    step_avx512<T, NT, 1>(row, pr, c + 1, in, d, m, x, acc);
  }
  if (c < nc) step_avx512<T, NT, 0>(row, pr, c, in, d, m, x, acc);
  for (int r = 0; r < NT; ++r) y[r * y_stride] = tree16_avx512(acc[r][0], acc[r][1]);
}

// ---- the row loop shared by the SIMD paths ----------------------------------------------------------

template <WeightType T, int NT>
struct Avx2Tile {
  static void run(const std::uint8_t* row, const PackedRow& pr, std::int64_t nc, std::int64_t in, const float* d,
                  const float* m, const float* x, float* y, std::int64_t y_stride) {
    tile_avx2<T, NT>(row, pr, nc, in, d, m, x, y, y_stride);
  }
};
template <WeightType T, int NT>
struct Avx512Tile {
  static void run(const std::uint8_t* row, const PackedRow& pr, std::int64_t nc, std::int64_t in, const float* d,
                  const float* m, const float* x, float* y, std::int64_t y_stride) {
    tile_avx512<T, NT>(row, pr, nc, in, d, m, x, y, y_stride);
  }
};

// Output rows [o_begin, o_end): per row, its scales once (packed types), then tiles of up to kTile
// activation rows.
template <WeightType T, template <WeightType, int> class Tile>
void matmul_rows_simd(const WeightMatrix& w, std::int64_t o_begin, std::int64_t o_end, const float* x,
                      std::int64_t rows, float* y, std::int64_t y_stride) {
  const std::int64_t nc = w.in_dim / 32, in = w.in_dim;
  float d[kMaxChunks], m[kMaxChunks];
  thread_local std::vector<std::uint8_t> split;  // a packed row, gathered out of its panel
  split.resize(w.row_stride);
  for (std::int64_t o = o_begin; o < o_end; ++o) {
    const std::uint8_t* row =
        is_packed(T) ? packed::split_row(w, o, split.data()) : w.data + static_cast<std::size_t>(o) * w.row_stride;
    PackedRow pr{};
    if constexpr (is_packed(T)) {
      row_scales_f16c(T, row, nc, d, m);
      pr = packed_row(T, row, nc);
    }
    for (std::int64_t r0 = 0; r0 < rows; r0 += kTile) {
      const float* xr = x + r0 * in;
      float* yr = y + r0 * y_stride + o;
      switch (std::min<std::int64_t>(kTile, rows - r0)) {
        case 1:
          Tile<T, 1>::run(row, pr, nc, in, d, m, xr, yr, y_stride);
          break;
        case 2:
          Tile<T, 2>::run(row, pr, nc, in, d, m, xr, yr, y_stride);
          break;
        case 3:
          Tile<T, 3>::run(row, pr, nc, in, d, m, xr, yr, y_stride);
          break;
        default:
          Tile<T, 4>::run(row, pr, nc, in, d, m, xr, yr, y_stride);
          break;
      }
    }
  }
}

bool cpu_has_f16c() {
  // CPUID leaf 1, ECX bit 29 (clang 14's __builtin_cpu_supports does not know "f16c"). Asked once:
  // the float products look their path up on every call, and in a VM each CPUID traps to the
  // hypervisor (~µs: the fast precision's qmatmul_path spent 6 µs of an 8 µs small product on it).
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0;
  }();
  return has;
}
bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
}
bool cpu_has_avx512() {
  __builtin_cpu_init();
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
}

using RowsFn = void (*)(const WeightMatrix&, std::int64_t, std::int64_t, const float*, std::int64_t, float*,
                        std::int64_t);

template <WeightType T>
RowsFn rows_fn_typed(CpuPath p) {
  if (p == CpuPath::Avx512 && cpu_has_avx512()) return &matmul_rows_simd<T, Avx512Tile>;
  if (p != CpuPath::Scalar && cpu_has_avx2()) return &matmul_rows_simd<T, Avx2Tile>;
  return &matmul_rows_scalar<T>;
}

RowsFn rows_fn(CpuPath p, WeightType t) {
  switch (t) {
    case WeightType::F32:
      return rows_fn_typed<WeightType::F32>(p);
    case WeightType::F16:
      return rows_fn_typed<WeightType::F16>(p);
    case WeightType::BF16:
      return rows_fn_typed<WeightType::BF16>(p);
    case WeightType::Q8_0:
      return rows_fn_typed<WeightType::Q8_0>(p);
    case WeightType::Q4_0:
      return rows_fn_typed<WeightType::Q4_0>(p);
    case WeightType::Q4_1:
      return rows_fn_typed<WeightType::Q4_1>(p);
    case WeightType::Q4_K:
      return rows_fn_typed<WeightType::Q4_K>(p);
    case WeightType::Q6_K:
      return rows_fn_typed<WeightType::Q6_K>(p);
  }
  return rows_fn_typed<WeightType::F32>(p);
}

}  // namespace

CpuPath cpu_path() {
  static const CpuPath path = [] {
    const char* env = std::getenv("SPECACTOR_CPU_PATH");
    const std::string want = env ? env : "";
    if (want == "scalar") return CpuPath::Scalar;
    if (want == "avx2" && cpu_has_avx2()) return CpuPath::Avx2;
    if (cpu_has_avx512()) return CpuPath::Avx512;
    return cpu_has_avx2() ? CpuPath::Avx2 : CpuPath::Scalar;
  }();
  return path;
}

const char* cpu_path_name(CpuPath p) {
  switch (p) {
    case CpuPath::Avx512:
      return "avx512";
    case CpuPath::Avx2:
      return "avx2";
    case CpuPath::Scalar:
      return "scalar";
  }
  return "scalar";
}

bool cpu_path_available(CpuPath p) {
  switch (p) {
    case CpuPath::Avx512:
      return cpu_has_avx512();
    case CpuPath::Avx2:
      return cpu_has_avx2();
    case CpuPath::Scalar:
      return true;
  }
  return false;
}

namespace {
std::atomic<std::size_t> g_tile_copy_bytes{0};

bool tile_copy_wanted(TileCopy t) {
  if (t == TileCopy::Auto) {
    const QPath p = qpath();
    return p == QPath::Amx || p == QPath::AmxEmulated;
  }
  return t == TileCopy::With;
}

// The tile layout of packed matrix w into dst (tile_bytes, zeroed): two 8-row panels side by side.
void build_tile_copy(const WeightMatrix& w, std::uint8_t* dst) {
  const std::int64_t nc = w.in_dim / 32, panels = packed::panel_count(w.out_dim);
  const std::int64_t qb = packed::tile_quant_bytes(w.type), cb = packed::tile_chunk_bytes(w.type);
  const int groups = w.type == WeightType::Q8_0 ? 8 : 4;
  for (std::int64_t p = 0; p < panels; ++p)
    for (std::int64_t c = 0; c < nc; ++c) {
      const std::uint8_t* src = packed::panel_chunk(w, p, c);
      std::uint8_t* rec = dst + ((p / 2) * nc + c) * cb;
      const int h = static_cast<int>(p % 2);
      for (int g = 0; g < groups; ++g)
        std::memcpy(rec + 64 * g + 32 * h, src + packed::scale_bytes(w.type) + 32 * g, 32);
      if (w.type == WeightType::Q8_0) {
        auto* d = reinterpret_cast<float*>(rec + qb) + 8 * h;
        for (int k = 0; k < 8; ++k) d[k] = f16_to_f32(packed::load_u16(src + 2 * k));
      } else {  // d (and Q4_1's m) as the file's f16: the panels hold 8 of each at the chunk's start
        std::memcpy(rec + qb + 16 * h, src, 16);
        if (w.type == WeightType::Q4_1) std::memcpy(rec + qb + 32 + 16 * h, src + 16, 16);
      }
    }
}
}  // namespace

std::size_t tile_copy_bytes() { return g_tile_copy_bytes.load(); }

WeightMatrix pack_matrix(const WeightMatrix& src, std::vector<std::uint8_t>& storage, TileCopy tiles) {
  if (packed::is_kquant(src.type) && !src.tiles && tile_copy_wanted(tiles) && src.in_dim > 0 && src.in_dim % 256 == 0) {
    // The rows stay where they are (the SIMD paths read them); the tile copy goes to storage.
    const std::size_t tbytes = packed::tile_bytes(src.type, src.out_dim, src.in_dim);
    storage.assign(tbytes + 64, 0);
    const auto base = reinterpret_cast<std::uintptr_t>(storage.data());
    WeightMatrix w = src;
    w.tiles = storage.data() + ((64 - base % 64) % 64);
    packed::build_kquant_tiles(w, const_cast<std::uint8_t*>(w.tiles));
    g_tile_copy_bytes += tbytes;
    return w;
  }
  if (src.packed || !is_packed(src.type)) return src;
  if (src.in_dim % 32 != 0 || src.in_dim / 32 > kMaxChunks)
    throw std::invalid_argument("pack_matrix: rows of " + std::to_string(src.in_dim) + " elements are not supported");
  const std::int64_t nc = src.in_dim / 32;
  const std::size_t bb = block_bytes(src.type);
  const int qb = quant_bytes(src.type), sa = scale_arrays(src.type);
  const std::size_t pbytes = packed::packed_bytes(src.type, src.out_dim, src.in_dim);
  const std::size_t tbytes = tile_copy_wanted(tiles) ? packed::tile_bytes(src.type, src.out_dim, src.in_dim) : 0;
  storage.assign(pbytes + (tbytes ? tbytes + 64 : 0), 0);  // padding rows stay zero
  WeightMatrix w = src;
  w.data = storage.data();
  w.packed = true;
  for (std::int64_t o = 0; o < src.out_dim; ++o) {
    const int r = static_cast<int>(o % packed::kPanel);
    for (std::int64_t c = 0; c < nc; ++c) {
      const std::uint8_t* b = src.data + static_cast<std::size_t>(o) * src.row_stride + c * bb;
      auto* dst = const_cast<std::uint8_t*>(packed::panel_chunk(w, o / packed::kPanel, c));
      std::memcpy(dst + 2 * r, b, 2);
      if (sa == 2) std::memcpy(dst + 16 + 2 * r, b + 2, 2);
      std::uint8_t* q = dst + packed::scale_bytes(src.type);
      for (int i = 0; i < qb; ++i) q[packed::panel_quant_offset(i, r)] = b[2 * sa + i];
    }
  }
  if (tbytes) {
    const auto base = reinterpret_cast<std::uintptr_t>(storage.data() + pbytes);
    std::uint8_t* t = storage.data() + pbytes + ((64 - base % 64) % 64);  // records 64-byte aligned
    build_tile_copy(w, t);
    w.tiles = t;
    g_tile_copy_bytes += tbytes;
  }
  return w;
}

void matmul_many_path(CpuPath path, const MatmulJob* jobs, int n_jobs, const float* x, std::int64_t rows) {
  const std::int64_t total = packed::checked_total_rows(jobs, n_jobs, std::int64_t{32} * kMaxChunks);
  // 64-byte aligned activations: every 32-float chunk then starts on a cache line, so no vector load
  // of x is split across two lines (with AVX-512 that alone halves the throughput of multi-row tiles).
  thread_local std::vector<float, AlignedAllocator<float>> aligned;
  if (reinterpret_cast<std::uintptr_t>(x) % 64 != 0) {
    const std::size_t count = static_cast<std::size_t>(rows * jobs[0].w->in_dim);
    aligned.assign(x, x + count);
    x = aligned.data();
  }
  // Split the concatenated output rows into equal contiguous ranges, one per thread.
  parallel_run([&](int tid, int nth) {
    const std::int64_t begin = total * tid / nth, end = total * (tid + 1) / nth;
    std::int64_t base = 0;
    for (int j = 0; j < n_jobs; ++j) {
      const std::int64_t n = jobs[j].w->out_dim;
      const std::int64_t b = std::max(begin, base), e = std::min(end, base + n);
      if (b < e) rows_fn(path, jobs[j].w->type)(*jobs[j].w, b - base, e - base, x, rows, jobs[j].y, n);
      base += n;
    }
  });
}

void matmul_many(const MatmulJob* jobs, int n_jobs, const float* x, std::int64_t rows) {
  matmul_many_path(cpu_path(), jobs, n_jobs, x, rows);
}

void matmul_path(CpuPath path, const WeightMatrix& w, const float* x, std::int64_t rows, float* y) {
  const MatmulJob job{&w, y};
  matmul_many_path(path, &job, 1, x, rows);
}

void matmul(const WeightMatrix& w, const float* x, std::int64_t rows, float* y) {
  matmul_path(cpu_path(), w, x, rows, y);
}

void weight_row(const WeightMatrix& w, std::int64_t r, float* out) {
  if (!w.packed) {
    dequantize_row(w.type, w.data + static_cast<std::size_t>(r) * w.row_stride, out,
                   static_cast<std::size_t>(w.in_dim));
    return;
  }
  // The ggml blocks gathered out of the row's panel, dequantized by the reference.
  thread_local std::vector<std::uint8_t> blocks;
  blocks.resize(w.row_stride);
  packed::ggml_row(w, r, blocks.data());
  dequantize_row(w.type, blocks.data(), out, static_cast<std::size_t>(w.in_dim));
}

float dot8(const float* a, const float* b, std::int64_t n) {
  float acc[8] = {};
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  for (; i < n; ++i) acc[i % 8] += a[i] * b[i];
  const float t0 = acc[0] + acc[4], t1 = acc[1] + acc[5], t2 = acc[2] + acc[6], t3 = acc[3] + acc[7];
  return (t0 + t2) + (t1 + t3);
}

}  // namespace specactor::kernels
