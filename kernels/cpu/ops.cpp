#include "kernels/cpu/ops.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/exp_simd.hpp"
#include "kernels/cpu/matmul.hpp"  // cpu_path
#include "kernels/cpu/pool.hpp"

namespace specactor::kernels {

#define SPECACTOR_OPS_AVX2 __attribute__((target("avx2,fma")))

float exp_approx(float x) {
  if (x != x) return x;
  if (x > expdef::kMax) return INFINITY;
  if (x < expdef::kMin) return 0.0f;
  const float n = std::nearbyint(x * expdef::kLog2e);
  float r = std::fma(n, expdef::kLn2Hi, x);
  r = std::fma(n, expdef::kLn2Lo, r);
  float p = expdef::kP[0];
  for (int k = 1; k < 6; ++k) p = std::fma(p, r, expdef::kP[k]);
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
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, expdef::exp8(_mm256_loadu_ps(x + i)));
  return i;
}
}  // namespace

void exp_approx_many(const float* x, std::int64_t n, float* y, bool simd) {
  std::int64_t i = simd && cpu_path() != CpuPath::Scalar ? exp_approx_many_avx2(x, n, y) : 0;
  for (; i < n; ++i) y[i] = exp_approx(x[i]);
}

void rope_table_cpu(const std::int32_t* positions, std::int64_t n_tok, std::int64_t rope_dim, double base, float* table,
                    double linear_factor) {
  const std::int64_t half = rope_dim / 2;
  for (std::int64_t t = 0; t < n_tok; ++t)
    for (std::int64_t i = 0; i < half; ++i) {
      const double theta =
          positions[t] / linear_factor * std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(rope_dim));
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
    const __m256 e = expdef::exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
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

// GELU's tanh form as a sigmoid: 0.5·(1 + tanh(u)) = 1 / (1 + e^(−2u)), so gelu(g) = g / (1 + e^(−2u))
// with 2u = 2√(2/π)·(g + 0.044715·g³) — SiLU's shape, with exp_approx; the AVX2 loop performs the same
// operations in the same order (this file is compiled without FMA contraction), so the twins agree.
constexpr float kGeluA = 2.0f * 0.7978845608028654f, kGeluB = 0.044715f;

namespace {
SPECACTOR_OPS_AVX2 std::int64_t gelu_tanh_mul_avx2(float* out, const float* gate, const float* up, std::int64_t n) {
  std::int64_t i = 0;
  const __m256 a = _mm256_set1_ps(kGeluA), b = _mm256_set1_ps(kGeluB), one = _mm256_set1_ps(1.0f);
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 cube = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(b, g), g), g);
    const __m256 t = _mm256_mul_ps(a, _mm256_add_ps(g, cube));
    const __m256 e = expdef::exp8(_mm256_sub_ps(_mm256_setzero_ps(), t));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
  }
  return i;
}
}  // namespace

void gelu_tanh_mul_cpu(float* out, const float* gate, const float* up, std::int64_t n) {
  std::int64_t i = cpu_path() != CpuPath::Scalar ? gelu_tanh_mul_avx2(out, gate, up, n) : 0;
  for (; i < n; ++i) {
    const float g = gate[i];
    const float t = kGeluA * (g + kGeluB * g * g * g);
    out[i] = g / (1.0f + exp_approx(0.0f - t)) * up[i];
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

}  // namespace specactor::kernels
