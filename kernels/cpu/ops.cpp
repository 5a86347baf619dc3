#include "kernels/cpu/ops.hpp"

#include <immintrin.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/matmul.hpp"  // dot8
#include "kernels/cpu/pool.hpp"

namespace specactor::kernels {

namespace {

// dot8() with AVX2: the same 8 lanes (mul, then add: this file is compiled without FMA contraction)
// and the same final order, so the result is bit-identical. n must be a multiple of 8.
__attribute__((target("avx2"))) float dot8_avx2(const float* a, const float* b, std::int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  for (std::int64_t i = 0; i < n; i += 8)
    acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  const __m128 t = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));  // t0..t3
  const __m128 u = _mm_add_ps(t, _mm_movehl_ps(t, t));                                      // t0+t2, t1+t3
  return _mm_cvtss_f32(_mm_add_ss(u, _mm_shuffle_ps(u, u, 1)));
}

// Four dot8_avx2() at once (independent chains, each in dot8's order).
__attribute__((target("avx2"))) void dot8x4_avx2(const float* a, const float* const* b, std::int64_t n, float* out) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  for (std::int64_t i = 0; i < n; i += 8) {
    const __m256 av = _mm256_loadu_ps(a + i);
    for (int k = 0; k < 4; ++k) acc[k] = _mm256_add_ps(acc[k], _mm256_mul_ps(av, _mm256_loadu_ps(b[k] + i)));
  }
  for (int k = 0; k < 4; ++k) {
    const __m128 t = _mm_add_ps(_mm256_castps256_ps128(acc[k]), _mm256_extractf128_ps(acc[k], 1));
    const __m128 u = _mm_add_ps(t, _mm_movehl_ps(t, t));
    out[k] = _mm_cvtss_f32(_mm_add_ss(u, _mm_shuffle_ps(u, u, 1)));
  }
}

// o = Σ_c p[c] · v[c] over 64 elements, kept in registers, each element accumulated in c order
// (mul, then add, from 0), exactly as the scalar loop does it.
__attribute__((target("avx2"))) void weighted_sum64_avx2(float* o, const float* p, const float* const* v,
                                                         std::int64_t n) {
  __m256 acc[8];
  for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
  for (std::int64_t c = 0; c < n; ++c) {
    const __m256 pv = _mm256_set1_ps(p[c]);
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_add_ps(acc[j], _mm256_mul_ps(pv, _mm256_loadu_ps(v[c] + 8 * j)));
  }
  for (int j = 0; j < 8; ++j) _mm256_storeu_ps(o + 8 * j, acc[j]);
}

// o[d] += p · v[d], element by element (mul, then add).
__attribute__((target("avx2"))) void axpy_avx2(float* o, float p, const float* v, std::int64_t n) {
  const __m256 pv = _mm256_set1_ps(p);
  for (std::int64_t d = 0; d < n; d += 8)
    _mm256_storeu_ps(o + d, _mm256_add_ps(_mm256_loadu_ps(o + d), _mm256_mul_ps(pv, _mm256_loadu_ps(v + d))));
}

}  // namespace

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

void silu_mul_cpu(float* out, const float* gate, const float* up, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
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

void attention_segments_cpu(const float* q, std::int64_t n_q, std::int64_t n_heads, std::int64_t n_kv_heads,
                            std::int64_t head_dim, const KvSegment& prefix, const KvSegment& masked,
                            const std::uint64_t* mask, float scale, float* out) {
  const std::int64_t group = n_heads / n_kv_heads;
  const std::int64_t n_ctx = prefix.count + masked.count;
  const std::int64_t lag = masked.count - n_q;  // causal default: query i sees masked slots j <= i + lag
  // Small problems (a decode step over a short context) are not worth waking the other threads.
  const bool parallel = n_q * n_heads * n_ctx * head_dim >= (1 << 16);
  const bool simd = head_dim % 8 == 0 && cpu_path() != CpuPath::Scalar;
  auto row = [](const PagedKvView& v, const float* base, std::int64_t s) {
    return base + v.pages[s / v.page_size] * v.page_stride + (s % v.page_size) * v.row;
  };
  auto share = [&](int tid, int nth) {
    std::vector<float> score(static_cast<std::size_t>(n_ctx));
    std::vector<const float*> krow(static_cast<std::size_t>(n_ctx)), vrow(static_cast<std::size_t>(n_ctx));
    const std::int64_t total = n_q * n_heads;
    for (std::int64_t ih = total * tid / nth; ih < total * (tid + 1) / nth; ++ih) {
      const std::int64_t i = ih / n_heads, h = ih % n_heads;
      {
        const float* qv = q + (i * n_heads + h) * head_dim;
        const std::int64_t kvh = h / group;
        // Visible slots in order: every prefix slot, then the masked slots this query may see.
        std::int64_t n = 0;
        for (std::int64_t s = 0; s < prefix.count; ++s) {
          krow[n] = row(prefix.view, prefix.view.k, prefix.first + s) + kvh * head_dim;
          vrow[n++] = row(prefix.view, prefix.view.v, prefix.first + s) + kvh * head_dim;
        }
        for (std::int64_t j = 0; j < masked.count; ++j) {
          const bool visible = mask ? ((mask[i] >> j) & 1u) != 0 : j <= i + lag;
          if (!visible) continue;
          krow[n] = row(masked.view, masked.view.k, masked.first + j) + kvh * head_dim;
          vrow[n++] = row(masked.view, masked.view.v, masked.first + j) + kvh * head_dim;
        }
        float mx = -INFINITY;
        std::int64_t c0 = 0;
        if (simd)
          for (; c0 + 4 <= n; c0 += 4) dot8x4_avx2(qv, krow.data() + c0, head_dim, score.data() + c0);
        for (std::int64_t c = c0; c < n; ++c)
          score[c] = simd ? dot8_avx2(qv, krow[c], head_dim) : dot8(qv, krow[c], head_dim);
        for (std::int64_t c = 0; c < n; ++c) {
          score[c] = score[c] * scale;
          mx = std::max(mx, score[c]);
        }
        float sum = 0.0f;
        for (std::int64_t c = 0; c < n; ++c) {
          score[c] = std::exp(score[c] - mx);
          sum += score[c];
        }
        const float inv = 1.0f / sum;
        float* o = out + (i * n_heads + h) * head_dim;
        if (simd && head_dim == 64) {
          for (std::int64_t c = 0; c < n; ++c) score[c] = score[c] * inv;
          weighted_sum64_avx2(o, score.data(), vrow.data(), n);
          continue;
        }
        for (std::int64_t d = 0; d < head_dim; ++d) o[d] = 0.0f;
        for (std::int64_t c = 0; c < n; ++c) {
          const float* vr = vrow[c];
          const float p = score[c] * inv;
          if (simd)
            axpy_avx2(o, p, vr, head_dim);
          else
            for (std::int64_t d = 0; d < head_dim; ++d) o[d] += p * vr[d];
        }
      }
    }
  };
  if (parallel)
    parallel_run(share);
  else
    share(0, 1);
}

void attention_cpu(const float* q, std::int64_t n_q, std::int64_t n_heads, std::int64_t n_kv_heads,
                   std::int64_t head_dim, const PagedKvView& kv, std::int64_t n_prefix, const std::uint64_t* mask,
                   float scale, float* out) {
  attention_segments_cpu(q, n_q, n_heads, n_kv_heads, head_dim, {kv, 0, n_prefix}, {kv, n_prefix, n_q}, mask, scale,
                         out);
}

}  // namespace specactor::kernels
