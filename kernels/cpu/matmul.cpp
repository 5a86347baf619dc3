// kernels/cpu/matmul.cpp — quantized/float matrix products: scalar, AVX2 and AVX-512 twins that
// perform one and the same arithmetic, so every path gives bit-identical results.
//
// The canonical arithmetic for one output y = Σ_i W[o,i]·x[i], over 32-element chunks c:
//   each chunk is (q[0..31], d, m) with W[o, 32c+j] = d·q[j] + m      (float types: q = W, d = 1, m = 0)
//   lane l (0..15):   p[l]    = q[l]·x[l];  p[l] = fma(q[16+l], x[16+l], p[l])
//                     acc[l]  = fma(d, p[l], acc[l])
//   per chunk:        macc[c%2] = fma(m, sx[c], macc[c%2])     sx[c] = Σ of the chunk's x (fixed tree)
//   result:           tree sum of acc (l+8, l+4, l+2, l+1) + (macc[0] + macc[1])
// Q4_0/Q4_1/Q8_0/Q4_K chunks keep integer q and fold the scale in once per chunk (d·(q·x) + m·Σx);
// Q6_K and the float types are decoded to float q. Every (row, output) pair runs these operations
// in this order whatever the number of rows in the call: a token's logits do not depend on its batch.
#include "kernels/cpu/matmul.hpp"

#include <immintrin.h>
#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace specactor::kernels {

namespace {

constexpr int kTile = 4;  // activation rows sharing one decoded weight chunk

std::uint16_t load_u16(const std::uint8_t* p) {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Σ of each 32-element chunk of x (n/32 values), by the fixed tree of the header comment.
void chunk_sums(const float* x, std::int64_t n, float* out) {
  for (std::int64_t c = 0; c < n / 32; ++c) {
    const float* v = x + 32 * c;
    float s[16];
    for (int l = 0; l < 16; ++l) s[l] = v[l] + v[16 + l];
    for (int w = 8; w >= 1; w /= 2)
      for (int l = 0; l < w; ++l) s[l] = s[l] + s[l + w];
    out[c] = s[0];
  }
}

// Scale and min of sub-block j (0..7) of a Q4_K super-block.
void q4k_scale_min(int j, const std::uint8_t* q, std::uint8_t& sc, std::uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = static_cast<std::uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = static_cast<std::uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Chunk c of a Q4_K row: integer nibbles (as bytes) and (d, m).
struct Q4kChunk {
  const std::uint8_t* qs;  // 32 bytes; the nibble is low (hi = false) or high (hi = true)
  bool hi;
  float d, m;
};
Q4kChunk q4k_chunk(const std::uint8_t* row, std::int64_t c) {
  const std::uint8_t* b = row + (c / 8) * 144;
  const int sub = static_cast<int>(c % 8);
  std::uint8_t sc, mn;
  q4k_scale_min(sub, b + 4, sc, mn);
  const float d = f16_to_f32(load_u16(b)), dmin = f16_to_f32(load_u16(b + 2));
  return {b + 16 + (sub / 2) * 32, (sub % 2) == 1, d * sc, -(dmin * mn)};
}

// Types whose chunks carry an additive term m (the others skip the m·Σx accumulation entirely).
constexpr bool has_min(WeightType t) { return t == WeightType::Q4_1 || t == WeightType::Q4_K; }

float tree16(const float* acc16) {
  float s[16];
  std::memcpy(s, acc16, sizeof s);
  for (int w = 8; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) s[l] = s[l] + s[l + w];
  return s[0];
}

// ---- scalar path --------------------------------------------------------------------------------

// Chunk c of a row as (q[32], d, m).
template <WeightType T>
void decode_chunk_scalar(const std::uint8_t* row, std::int64_t c, float* q, float& d, float& m) {
  d = 1.0f;
  m = 0.0f;
  if constexpr (T == WeightType::Q8_0) {
    const std::uint8_t* b = row + c * 34;
    d = f16_to_f32(load_u16(b));
    for (int j = 0; j < 32; ++j) q[j] = static_cast<float>(static_cast<std::int8_t>(b[2 + j]));
  } else if constexpr (T == WeightType::Q4_0 || T == WeightType::Q4_1) {
    constexpr bool q41 = T == WeightType::Q4_1;
    const std::uint8_t* b = row + c * (q41 ? 20 : 18);
    d = f16_to_f32(load_u16(b));
    if (q41) m = f16_to_f32(load_u16(b + 2));
    const std::uint8_t* qs = b + (q41 ? 4 : 2);
    constexpr int off = q41 ? 0 : 8;
    for (int j = 0; j < 16; ++j) {
      q[j] = static_cast<float>((qs[j] & 0xF) - off);
      q[j + 16] = static_cast<float>((qs[j] >> 4) - off);
    }
  } else if constexpr (T == WeightType::Q4_K) {
    const Q4kChunk k = q4k_chunk(row, c);
    d = k.d;
    m = k.m;
    for (int j = 0; j < 32; ++j) q[j] = static_cast<float>(k.hi ? (k.qs[j] >> 4) : (k.qs[j] & 0xF));
  } else if constexpr (T == WeightType::Q6_K) {
    float buf[256];
    dequantize_row(T, row + (c / 8) * 210, buf, 256);
    std::memcpy(q, buf + (c % 8) * 32, 32 * sizeof(float));
  } else {
    dequantize_row(T, row + c * 32 * block_bytes(T), q, 32);
  }
}

template <WeightType T>
void matmul_rows_scalar(const WeightMatrix& w, std::int64_t o_begin, std::int64_t o_end, const float* x,
                        const float* sx, std::int64_t rows, float* y, std::int64_t y_stride) {
  const std::int64_t chunks = w.in_dim / 32;
  float q[32];
  for (std::int64_t o = o_begin; o < o_end; ++o) {
    const std::uint8_t* row = w.data + static_cast<std::size_t>(o) * w.row_stride;
    for (std::int64_t r0 = 0; r0 < rows; r0 += kTile) {
      const int nt = static_cast<int>(std::min<std::int64_t>(kTile, rows - r0));
      float acc[kTile][16] = {}, macc[kTile][2] = {};
      for (std::int64_t c = 0; c < chunks; ++c) {
        float d, m;
        decode_chunk_scalar<T>(row, c, q, d, m);
        for (int r = 0; r < nt; ++r) {
          const float* xr = x + (r0 + r) * w.in_dim + c * 32;
          for (int l = 0; l < 16; ++l) {
            float p = q[l] * xr[l];
            p = std::fma(q[16 + l], xr[16 + l], p);
            acc[r][l] = std::fma(d, p, acc[r][l]);
          }
          if constexpr (has_min(T)) macc[r][c % 2] = std::fma(m, sx[(r0 + r) * chunks + c], macc[r][c % 2]);
        }
      }
      for (int r = 0; r < nt; ++r) {
        float v = tree16(acc[r]);
        if constexpr (has_min(T)) v = v + (macc[r][0] + macc[r][1]);
        y[(r0 + r) * y_stride + o] = v;
      }
    }
  }
}

// ---- AVX2 path: lanes 0..7 in `lo`, 8..15 in `hi` -----------------------------------------------

#define SPECACTOR_AVX2 __attribute__((target("avx2,fma,f16c")))

SPECACTOR_AVX2 inline __m256 bytes8_to_ps(const std::uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// Chunk c as q[0] = elems 0..7, q[1] = 8..15, q[2] = 16..23, q[3] = 24..31, and (d, m).
template <WeightType T>
SPECACTOR_AVX2 inline void decode_chunk_avx2(const std::uint8_t* row, std::int64_t c, __m256* q, float& d, float& m) {
  d = 1.0f;
  m = 0.0f;
  if constexpr (T == WeightType::Q8_0) {
    const std::uint8_t* b = row + c * 34;
    d = _cvtsh_ss(load_u16(b));
    for (int i = 0; i < 4; ++i) q[i] = bytes8_to_ps(b + 2 + 8 * i);
  } else if constexpr (T == WeightType::Q4_0 || T == WeightType::Q4_1) {
    constexpr bool q41 = T == WeightType::Q4_1;
    const std::uint8_t* b = row + c * (q41 ? 20 : 18);
    d = _cvtsh_ss(load_u16(b));
    if constexpr (q41) m = _cvtsh_ss(load_u16(b + 2));
    const std::uint8_t* qs = b + (q41 ? 4 : 2);
    const __m256i v0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs)));
    const __m256i v1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8)));
    const __m256i nib = _mm256_set1_epi32(0xF);
    const __m256i off = _mm256_set1_epi32(q41 ? 0 : 8);
    q[0] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(v0, nib), off));
    q[1] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(v1, nib), off));
    q[2] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(v0, 4), off));
    q[3] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(v1, 4), off));
  } else if constexpr (T == WeightType::Q4_K) {
    const Q4kChunk k = q4k_chunk(row, c);
    d = k.d;
    m = k.m;
    for (int i = 0; i < 4; ++i) {
      const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(k.qs + 8 * i)));
      q[i] = _mm256_cvtepi32_ps(k.hi ? _mm256_srli_epi32(v, 4) : _mm256_and_si256(v, _mm256_set1_epi32(0xF)));
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
  } else {  // Q6_K
    alignas(32) float buf[32];
    decode_chunk_scalar<T>(row, c, buf, d, m);
    for (int i = 0; i < 4; ++i) q[i] = _mm256_load_ps(buf + 8 * i);
  }
}

template <WeightType T, int NT>
SPECACTOR_AVX2 void tile_avx2(const std::uint8_t* row, std::int64_t chunks, std::int64_t in, const float* x,
                              const float* sx, float* y, std::int64_t y_stride) {
  __m256 lo[NT], hi[NT];
  float m0[NT], m1[NT];
  for (int r = 0; r < NT; ++r) lo[r] = hi[r] = _mm256_setzero_ps(), m0[r] = m1[r] = 0.0f;
  for (std::int64_t c = 0; c < chunks; ++c) {
    __m256 q[4];
    float d, m;
    decode_chunk_avx2<T>(row, c, q, d, m);
    const __m256 dv = _mm256_set1_ps(d);
    for (int r = 0; r < NT; ++r) {
      const float* xr = x + r * in + c * 32;
      __m256 p0 = _mm256_mul_ps(q[0], _mm256_loadu_ps(xr));
      __m256 p1 = _mm256_mul_ps(q[1], _mm256_loadu_ps(xr + 8));
      p0 = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(xr + 16), p0);
      p1 = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(xr + 24), p1);
      lo[r] = _mm256_fmadd_ps(dv, p0, lo[r]);
      hi[r] = _mm256_fmadd_ps(dv, p1, hi[r]);
      if constexpr (has_min(T)) {
        if (c % 2 == 0) m0[r] = std::fma(m, sx[r * chunks + c], m0[r]);
        else m1[r] = std::fma(m, sx[r * chunks + c], m1[r]);
      }
    }
  }
  for (int r = 0; r < NT; ++r) {
    alignas(32) float acc[16];
    _mm256_store_ps(acc, lo[r]);
    _mm256_store_ps(acc + 8, hi[r]);
    float v = tree16(acc);
    if constexpr (has_min(T)) v = v + (m0[r] + m1[r]);
    y[r * y_stride] = v;
  }
}

template <WeightType T>
SPECACTOR_AVX2 void matmul_rows_avx2(const WeightMatrix& w, std::int64_t o_begin, std::int64_t o_end, const float* x,
                                     const float* sx, std::int64_t rows, float* y, std::int64_t y_stride) {
  const std::int64_t chunks = w.in_dim / 32, in = w.in_dim;
  for (std::int64_t o = o_begin; o < o_end; ++o) {
    const std::uint8_t* row = w.data + static_cast<std::size_t>(o) * w.row_stride;
    for (std::int64_t r0 = 0; r0 < rows; r0 += kTile) {
      const float* xr = x + r0 * in;
      const float* sr = sx + r0 * chunks;
      float* yr = y + r0 * y_stride + o;
      switch (std::min<std::int64_t>(kTile, rows - r0)) {
        case 1: tile_avx2<T, 1>(row, chunks, in, xr, sr, yr, y_stride); break;
        case 2: tile_avx2<T, 2>(row, chunks, in, xr, sr, yr, y_stride); break;
        case 3: tile_avx2<T, 3>(row, chunks, in, xr, sr, yr, y_stride); break;
        default: tile_avx2<T, 4>(row, chunks, in, xr, sr, yr, y_stride); break;
      }
    }
  }
}

// ---- AVX-512 path: lanes 0..15 in one register -------------------------------------------------

#define SPECACTOR_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

template <WeightType T>
SPECACTOR_AVX512 inline void decode_chunk_avx512(const std::uint8_t* row, std::int64_t c, __m512& q0, __m512& q1,
                                                 float& d, float& m) {
  d = 1.0f;
  m = 0.0f;
  if constexpr (T == WeightType::Q8_0) {
    const std::uint8_t* b = row + c * 34;
    d = _cvtsh_ss(load_u16(b));
    q0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2))));
    q1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 18))));
  } else if constexpr (T == WeightType::Q4_0 || T == WeightType::Q4_1) {
    constexpr bool q41 = T == WeightType::Q4_1;
    const std::uint8_t* b = row + c * (q41 ? 20 : 18);
    d = _cvtsh_ss(load_u16(b));
    if constexpr (q41) m = _cvtsh_ss(load_u16(b + 2));
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + (q41 ? 4 : 2))));
    const __m512i off = _mm512_set1_epi32(q41 ? 0 : 8);
    q0 = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_and_si512(v, _mm512_set1_epi32(0xF)), off));
    q1 = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_srli_epi32(v, 4), off));
  } else if constexpr (T == WeightType::Q4_K) {
    const Q4kChunk k = q4k_chunk(row, c);
    d = k.d;
    m = k.m;
    const __m512i v0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k.qs)));
    const __m512i v1 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k.qs + 16)));
    const __m512i nib = _mm512_set1_epi32(0xF);
    q0 = _mm512_cvtepi32_ps(k.hi ? _mm512_srli_epi32(v0, 4) : _mm512_and_si512(v0, nib));
    q1 = _mm512_cvtepi32_ps(k.hi ? _mm512_srli_epi32(v1, 4) : _mm512_and_si512(v1, nib));
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
    q0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
    q1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32))), 16));
  } else {  // Q6_K
    alignas(64) float buf[32];
    decode_chunk_scalar<T>(row, c, buf, d, m);
    q0 = _mm512_load_ps(buf);
    q1 = _mm512_load_ps(buf + 16);
  }
}

template <WeightType T, int NT>
SPECACTOR_AVX512 void tile_avx512(const std::uint8_t* row, std::int64_t chunks, std::int64_t in, const float* x,
                                  const float* sx, float* y, std::int64_t y_stride) {
  __m512 acc[NT];
  float m0[NT], m1[NT];
  for (int r = 0; r < NT; ++r) acc[r] = _mm512_setzero_ps(), m0[r] = m1[r] = 0.0f;
  for (std::int64_t c = 0; c < chunks; ++c) {
    __m512 q0, q1;
    float d, m;
    decode_chunk_avx512<T>(row, c, q0, q1, d, m);
    const __m512 dv = _mm512_set1_ps(d);
    for (int r = 0; r < NT; ++r) {
      const float* xr = x + r * in + c * 32;
      __m512 p = _mm512_mul_ps(q0, _mm512_loadu_ps(xr));
      p = _mm512_fmadd_ps(q1, _mm512_loadu_ps(xr + 16), p);
      acc[r] = _mm512_fmadd_ps(dv, p, acc[r]);
      if constexpr (has_min(T)) {
        if (c % 2 == 0) m0[r] = std::fma(m, sx[r * chunks + c], m0[r]);
        else m1[r] = std::fma(m, sx[r * chunks + c], m1[r]);
      }
    }
  }
  for (int r = 0; r < NT; ++r) {
    alignas(64) float a[16];
    _mm512_store_ps(a, acc[r]);
    float v = tree16(a);
    if constexpr (has_min(T)) v = v + (m0[r] + m1[r]);
    y[r * y_stride] = v;
  }
}

template <WeightType T>
SPECACTOR_AVX512 void matmul_rows_avx512(const WeightMatrix& w, std::int64_t o_begin, std::int64_t o_end,
                                         const float* x, const float* sx, std::int64_t rows, float* y,
                                         std::int64_t y_stride) {
  const std::int64_t chunks = w.in_dim / 32, in = w.in_dim;
  for (std::int64_t o = o_begin; o < o_end; ++o) {
    const std::uint8_t* row = w.data + static_cast<std::size_t>(o) * w.row_stride;
    for (std::int64_t r0 = 0; r0 < rows; r0 += kTile) {
      const float* xr = x + r0 * in;
      const float* sr = sx + r0 * chunks;
      float* yr = y + r0 * y_stride + o;
      switch (std::min<std::int64_t>(kTile, rows - r0)) {
        case 1: tile_avx512<T, 1>(row, chunks, in, xr, sr, yr, y_stride); break;
        case 2: tile_avx512<T, 2>(row, chunks, in, xr, sr, yr, y_stride); break;
        case 3: tile_avx512<T, 3>(row, chunks, in, xr, sr, yr, y_stride); break;
        default: tile_avx512<T, 4>(row, chunks, in, xr, sr, yr, y_stride); break;
      }
    }
  }
}

bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}
bool cpu_has_avx512() {
  __builtin_cpu_init();
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
}

using RowsFn = void (*)(const WeightMatrix&, std::int64_t, std::int64_t, const float*, const float*, std::int64_t,
                        float*, std::int64_t);

template <WeightType T> RowsFn rows_fn_typed(CpuPath p) {
  if (p == CpuPath::Avx512 && cpu_has_avx512()) return &matmul_rows_avx512<T>;
  if (p != CpuPath::Scalar && cpu_has_avx2()) return &matmul_rows_avx2<T>;
  return &matmul_rows_scalar<T>;
}

RowsFn rows_fn(CpuPath p, WeightType t) {
  switch (t) {
    case WeightType::F32: return rows_fn_typed<WeightType::F32>(p);
    case WeightType::F16: return rows_fn_typed<WeightType::F16>(p);
    case WeightType::BF16: return rows_fn_typed<WeightType::BF16>(p);
    case WeightType::Q8_0: return rows_fn_typed<WeightType::Q8_0>(p);
    case WeightType::Q4_0: return rows_fn_typed<WeightType::Q4_0>(p);
    case WeightType::Q4_1: return rows_fn_typed<WeightType::Q4_1>(p);
    case WeightType::Q4_K: return rows_fn_typed<WeightType::Q4_K>(p);
    case WeightType::Q6_K: return rows_fn_typed<WeightType::Q6_K>(p);
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
    case CpuPath::Avx512: return "avx512";
    case CpuPath::Avx2: return "avx2";
    case CpuPath::Scalar: return "scalar";
  }
  return "scalar";
}

bool cpu_path_available(CpuPath p) {
  switch (p) {
    case CpuPath::Avx512: return cpu_has_avx512();
    case CpuPath::Avx2: return cpu_has_avx2();
    case CpuPath::Scalar: return true;
  }
  return false;
}

void matmul_many_path(CpuPath path, const MatmulJob* jobs, int n_jobs, const float* x, std::int64_t rows) {
  if (n_jobs <= 0) return;
  const std::int64_t in = jobs[0].w->in_dim;
  std::vector<float> sx(static_cast<std::size_t>(rows * (in / 32)));
  for (std::int64_t r = 0; r < rows; ++r) chunk_sums(x + r * in, in, sx.data() + r * (in / 32));
  std::int64_t total = 0;
  for (int j = 0; j < n_jobs; ++j) total += jobs[j].w->out_dim;
  // Split the concatenated output rows into equal contiguous ranges, one per thread.
#pragma omp parallel
  {
    const int nth = omp_get_num_threads(), tid = omp_get_thread_num();
    const std::int64_t begin = total * tid / nth, end = total * (tid + 1) / nth;
    std::int64_t base = 0;
    for (int j = 0; j < n_jobs; ++j) {
      const std::int64_t n = jobs[j].w->out_dim;
      const std::int64_t b = std::max(begin, base), e = std::min(end, base + n);
      if (b < e) rows_fn(path, jobs[j].w->type)(*jobs[j].w, b - base, e - base, x, sx.data(), rows, jobs[j].y, n);
      base += n;
    }
  }
}

void matmul_many(const MatmulJob* jobs, int n_jobs, const float* x, std::int64_t rows) {
  matmul_many_path(cpu_path(), jobs, n_jobs, x, rows);
}

void matmul_path(CpuPath path, const WeightMatrix& w, const float* x, std::int64_t rows, float* y) {
  const MatmulJob job{&w, y};
  matmul_many_path(path, &job, 1, x, rows);
}

void matmul(const WeightMatrix& w, const float* x, std::int64_t rows, float* y) { matmul_path(cpu_path(), w, x, rows, y); }

void weight_row(const WeightMatrix& w, std::int64_t r, float* out) {
  dequantize_row(w.type, w.data + static_cast<std::size_t>(r) * w.row_stride, out, static_cast<std::size_t>(w.in_dim));
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
