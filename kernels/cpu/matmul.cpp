// kernels/cpu/matmul.cpp — quantized/float matrix products (AVX2 and scalar twins, one arithmetic).
//
// Per output element: the row's blocks are decoded 32 values at a time (four 8-lane groups g0..g3);
// accumulator A takes g0 and g2, accumulator B takes g1 and g3, by fused multiply-add; at the end
// lanes of A+B are summed pairwise: (0+4, 1+5, 2+6, 3+7) → (0+2, 1+3) → 0+1. Decoding computes each
// weight exactly as the scalar reference dequantize_row() does (mul then add, no contraction).
#include "kernels/cpu/matmul.hpp"

#include <immintrin.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

namespace specactor::kernels {

namespace {

constexpr int kTile = 4;  // activation rows sharing one decoded weight block

std::uint16_t load_u16(const std::uint8_t* p) {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// ---- scalar path --------------------------------------------------------------------------------

struct Lanes {
  float v[8];
};

float hsum_scalar(const Lanes& a, const Lanes& b) {
  float s[8];
  for (int i = 0; i < 8; ++i) s[i] = a.v[i] + b.v[i];
  const float t0 = s[0] + s[4], t1 = s[1] + s[5], t2 = s[2] + s[6], t3 = s[3] + s[7];
  const float u0 = t0 + t2, u1 = t1 + t3;
  return u0 + u1;
}

// Decoded values of one 32-element chunk of a row: chunk c of the row.
void decode_chunk_scalar(WeightType t, const std::uint8_t* row, std::int64_t c, float* out) {
  const std::size_t be = block_elems(t), bb = block_bytes(t);
  if (be == 256) {
    float buf[256];
    dequantize_row(t, row + (c / 8) * bb, buf, 256);
    std::memcpy(out, buf + (c % 8) * 32, 32 * sizeof(float));
  } else {
    dequantize_row(t, row + static_cast<std::size_t>(c) * 32 / be * bb, out, 32);
  }
}

void matmul_scalar(const WeightMatrix& w, const float* x, std::int64_t rows, float* y) {
  const std::int64_t chunks = w.in_dim / 32;
#pragma omp parallel for schedule(static)
  for (std::int64_t o = 0; o < w.out_dim; ++o) {
    const std::uint8_t* row = w.data + static_cast<std::size_t>(o) * w.row_stride;
    float wv[32];
    for (std::int64_t r0 = 0; r0 < rows; r0 += kTile) {
      const int nt = static_cast<int>(std::min<std::int64_t>(kTile, rows - r0));
      Lanes a[kTile] = {}, b[kTile] = {};
      for (std::int64_t c = 0; c < chunks; ++c) {
        decode_chunk_scalar(w.type, row, c, wv);
        for (int r = 0; r < nt; ++r) {
          const float* xr = x + (r0 + r) * w.in_dim + c * 32;
          for (int l = 0; l < 8; ++l) a[r].v[l] = std::fma(wv[l], xr[l], a[r].v[l]);
          for (int l = 0; l < 8; ++l) b[r].v[l] = std::fma(wv[8 + l], xr[8 + l], b[r].v[l]);
          for (int l = 0; l < 8; ++l) a[r].v[l] = std::fma(wv[16 + l], xr[16 + l], a[r].v[l]);
          for (int l = 0; l < 8; ++l) b[r].v[l] = std::fma(wv[24 + l], xr[24 + l], b[r].v[l]);
        }
      }
      for (int r = 0; r < nt; ++r) y[(r0 + r) * w.out_dim + o] = hsum_scalar(a[r], b[r]);
    }
  }
}

// ---- AVX2 path ----------------------------------------------------------------------------------

#define SPECACTOR_AVX2 __attribute__((target("avx2,fma,f16c")))

SPECACTOR_AVX2 inline float hsum_avx2(__m256 a, __m256 b) {
  const __m256 s = _mm256_add_ps(a, b);
  const __m128 t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));  // 0+4 .. 3+7
  const __m128 u = _mm_add_ps(t, _mm_movehl_ps(t, t));                                   // 0+2, 1+3
  const __m128 v = _mm_add_ss(u, _mm_shuffle_ps(u, u, 1));                               // 0+1
  return _mm_cvtss_f32(v);
}

SPECACTOR_AVX2 inline __m256 u8x8_to_ps(__m128i bytes8) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes8)); }

// Decodes chunk c (32 values) of a row into g[4].
SPECACTOR_AVX2 inline void decode_chunk_avx2(WeightType t, const std::uint8_t* row, std::int64_t c, __m256 g[4]) {
  switch (t) {
    case WeightType::F32: {
      const float* p = reinterpret_cast<const float*>(row) + c * 32;
      for (int i = 0; i < 4; ++i) g[i] = _mm256_loadu_ps(p + 8 * i);
      return;
    }
    case WeightType::F16: {
      const std::uint8_t* p = row + c * 64;
      for (int i = 0; i < 4; ++i) g[i] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * i)));
      return;
    }
    case WeightType::BF16: {
      const std::uint8_t* p = row + c * 64;
      for (int i = 0; i < 4; ++i) {
        const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * i)));
        g[i] = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
      }
      return;
    }
    case WeightType::Q8_0: {
      const std::uint8_t* b = row + c * 34;
      const __m256 d = _mm256_set1_ps(_cvtsh_ss(load_u16(b)));
      for (int i = 0; i < 4; ++i) {
        const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + 8 * i));
        g[i] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
      }
      return;
    }
    case WeightType::Q4_0:
    case WeightType::Q4_1: {
      const bool q41 = t == WeightType::Q4_1;
      const std::uint8_t* b = row + c * (q41 ? 20 : 18);
      const __m256 d = _mm256_set1_ps(_cvtsh_ss(load_u16(b)));
      const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + (q41 ? 4 : 2)));
      const __m128i mask = _mm_set1_epi8(0x0F);
      const __m128i lo = _mm_and_si128(qs, mask);                     // elements 0..15
      const __m128i hi = _mm_and_si128(_mm_srli_epi16(qs, 4), mask);  // elements 16..31
      __m256 q[4] = {u8x8_to_ps(lo), u8x8_to_ps(_mm_srli_si128(lo, 8)), u8x8_to_ps(hi), u8x8_to_ps(_mm_srli_si128(hi, 8))};
      if (q41) {
        const __m256 m = _mm256_set1_ps(_cvtsh_ss(load_u16(b + 2)));
        for (int i = 0; i < 4; ++i) g[i] = _mm256_add_ps(_mm256_mul_ps(d, q[i]), m);
      } else {
        const __m256 eight = _mm256_set1_ps(8.0f);
        for (int i = 0; i < 4; ++i) g[i] = _mm256_mul_ps(d, _mm256_sub_ps(q[i], eight));
      }
      return;
    }
    case WeightType::Q4_K:
    case WeightType::Q6_K: {
      alignas(32) float buf[32];
      decode_chunk_scalar(t, row, c, buf);
      for (int i = 0; i < 4; ++i) g[i] = _mm256_load_ps(buf + 8 * i);
      return;
    }
  }
}

SPECACTOR_AVX2 void matmul_avx2(const WeightMatrix& w, const float* x, std::int64_t rows, float* y) {
  const std::int64_t chunks = w.in_dim / 32;
#pragma omp parallel for schedule(static)
  for (std::int64_t o = 0; o < w.out_dim; ++o) {
    const std::uint8_t* row = w.data + static_cast<std::size_t>(o) * w.row_stride;
    for (std::int64_t r0 = 0; r0 < rows; r0 += kTile) {
      const int nt = static_cast<int>(std::min<std::int64_t>(kTile, rows - r0));
      __m256 a[kTile], b[kTile];
      for (int r = 0; r < kTile; ++r) a[r] = b[r] = _mm256_setzero_ps();
      const float* xb = x + r0 * w.in_dim;
      for (std::int64_t c = 0; c < chunks; ++c) {
        __m256 g[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        decode_chunk_avx2(w.type, row, c, g);
        for (int r = 0; r < nt; ++r) {
          const float* xr = xb + r * w.in_dim + c * 32;
          a[r] = _mm256_fmadd_ps(g[0], _mm256_loadu_ps(xr), a[r]);
          b[r] = _mm256_fmadd_ps(g[1], _mm256_loadu_ps(xr + 8), b[r]);
          a[r] = _mm256_fmadd_ps(g[2], _mm256_loadu_ps(xr + 16), a[r]);
          b[r] = _mm256_fmadd_ps(g[3], _mm256_loadu_ps(xr + 24), b[r]);
        }
      }
      for (int r = 0; r < nt; ++r) y[(r0 + r) * w.out_dim + o] = hsum_avx2(a[r], b[r]);
    }
  }
}

bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

}  // namespace

CpuPath cpu_path() {
  static const CpuPath path = [] {
    const char* env = std::getenv("SPECACTOR_CPU_PATH");
    if (env && std::string(env) == "scalar") return CpuPath::Scalar;
    return cpu_has_avx2() ? CpuPath::Avx2 : CpuPath::Scalar;
  }();
  return path;
}

const char* cpu_path_name(CpuPath p) { return p == CpuPath::Avx2 ? "avx2" : "scalar"; }

void matmul_path(CpuPath path, const WeightMatrix& w, const float* x, std::int64_t rows, float* y) {
  if (path == CpuPath::Avx2 && cpu_has_avx2()) matmul_avx2(w, x, rows, y);
  else matmul_scalar(w, x, rows, y);
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
