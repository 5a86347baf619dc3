// kernels/cpu/quant.cpp — scalar reference dequantization of every supported weight format.
#include "kernels/cpu/quant.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/cpu/matmul.hpp"

namespace specactor::kernels {

bool weight_type_supported(std::uint32_t t) {
  switch (t) {
    case 0:
    case 1:
    case 2:
    case 3:
    case 8:
    case 12:
    case 14:
    case 30:
      return true;
    default:
      return false;
  }
}

std::size_t block_elems(WeightType t) {
  switch (t) {
    case WeightType::F32:
    case WeightType::F16:
    case WeightType::BF16:
      return 1;
    case WeightType::Q4_0:
    case WeightType::Q4_1:
    case WeightType::Q8_0:
      return 32;
    case WeightType::Q4_K:
    case WeightType::Q6_K:
      return 256;
  }
  return 0;
}

std::size_t block_bytes(WeightType t) {
  switch (t) {
    case WeightType::F32:
      return 4;
    case WeightType::F16:
    case WeightType::BF16:
      return 2;
    case WeightType::Q4_0:
      return 18;
    case WeightType::Q4_1:
      return 20;
    case WeightType::Q8_0:
      return 34;
    case WeightType::Q4_K:
      return 144;
    case WeightType::Q6_K:
      return 210;
  }
  return 0;
}

std::size_t row_bytes(WeightType t, std::size_t n) { return n / block_elems(t) * block_bytes(t); }

float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000) << 16;
  std::uint32_t exp = (h >> 10) & 0x1f;
  std::uint32_t mant = h & 0x3ff;
  std::uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      exp = 127 - 15 + 1;
      while ((mant & 0x400) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ff;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000 | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::uint16_t f32_to_f16(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  const std::uint32_t sign = (x >> 16) & 0x8000;
  const std::uint32_t exp = (x >> 23) & 0xff;
  std::uint32_t mant = x & 0x7fffff;
  // Infinity; a NaN becomes quiet and keeps the top 9 bits of its payload (what vcvtps2ph does).
  if (exp == 0xff) return static_cast<std::uint16_t>(sign | 0x7c00 | (mant ? 0x200 | (mant >> 13) : 0));
  int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 0x1f) return static_cast<std::uint16_t>(sign | 0x7c00);
  if (e <= 0) {
    if (e < -10) return static_cast<std::uint16_t>(sign);
    mant |= 0x800000;
    const int shift = 14 - e;
    std::uint32_t half = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return static_cast<std::uint16_t>(sign | half);
  }
  std::uint32_t half = (static_cast<std::uint32_t>(e) << 10) | (mant >> 13);
  const std::uint32_t rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;  // may carry into the exponent: correct
  return static_cast<std::uint16_t>(sign | half);
}

float bf16_to_f32(std::uint16_t h) {
  const std::uint32_t bits = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::uint16_t f32_to_bf16(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);  // NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);  // to nearest even (a carry into the exponent is correct)
  return static_cast<std::uint16_t>(bits >> 16);
}

namespace {

__attribute__((target("avx2,f16c"))) void f32_to_f16_avx2(const float* x, std::uint16_t* out, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) out[i] = f32_to_f16(x[i]);
}

// f32_to_bf16's integer steps, 8 lanes at a time.
__attribute__((target("avx2"))) void f32_to_bf16_avx2(const float* x, std::uint16_t* out, std::size_t n) {
  const __m256i abs = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000),
                bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1), quiet = _mm256_set1_epi32(0x40);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i h[2];
    for (int k = 0; k < 2; ++k) {
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 8 * k));
      const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(b, abs), inf);
      const __m256i r = _mm256_srli_epi32(
          _mm256_add_epi32(b, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(b, 16), one))), 16);
      h[k] = _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(b, 16), quiet), nan);
    }
    // Every lane is in [0, 0xffff]: the unsigned saturating pack is exact; packs work per 128-bit lane.
    const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(h[0], h[1]), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), p);
  }
  for (; i < n; ++i) out[i] = f32_to_bf16(x[i]);
}

// AVX2 + FMA + F16C present and SPECACTOR_CPU_PATH not "scalar" (the float kernels' probe).
bool simd_conversions() { return cpu_path() != CpuPath::Scalar; }

}  // namespace

void f32_to_f16_n(const float* x, std::uint16_t* out, std::size_t n, bool simd) {
  if (simd && simd_conversions()) return f32_to_f16_avx2(x, out, n);
  for (std::size_t i = 0; i < n; ++i) out[i] = f32_to_f16(x[i]);
}

void f32_to_bf16_n(const float* x, std::uint16_t* out, std::size_t n, bool simd) {
  if (simd && simd_conversions()) return f32_to_bf16_avx2(x, out, n);
  for (std::size_t i = 0; i < n; ++i) out[i] = f32_to_bf16(x[i]);
}

void q4k_scale_min(int j, const std::uint8_t* q, std::uint8_t& sc, std::uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = static_cast<std::uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = static_cast<std::uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

namespace {

std::uint16_t load_u16(const std::uint8_t* p) {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

void dequant_q8_0(const std::uint8_t* b, float* y) {
  const float d = f16_to_f32(load_u16(b));
  const auto* q = reinterpret_cast<const std::int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = d * q[j];
}

void dequant_q4_0(const std::uint8_t* b, float* y) {
  const float d = f16_to_f32(load_u16(b));
  const std::uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * ((qs[j] & 0xF) - 8);
    y[j + 16] = d * ((qs[j] >> 4) - 8);
  }
}

void dequant_q4_1(const std::uint8_t* b, float* y) {
  const float d = f16_to_f32(load_u16(b));
  const float m = f16_to_f32(load_u16(b + 2));
  const std::uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * (qs[j] & 0xF) + m;
    y[j + 16] = d * (qs[j] >> 4) + m;
  }
}

void dequant_q4_k(const std::uint8_t* b, float* y) {
  const float d = f16_to_f32(load_u16(b));
  const float dmin = f16_to_f32(load_u16(b + 2));
  const std::uint8_t* scales = b + 4;
  const std::uint8_t* q = b + 16;
  for (int j = 0; j < 4; ++j) {  // 64 elements per step: low nibbles, then high nibbles
    std::uint8_t sc, m;
    q4k_scale_min(2 * j, scales, sc, m);
    const float d1 = d * sc, m1 = dmin * m;
    q4k_scale_min(2 * j + 1, scales, sc, m);
    const float d2 = d * sc, m2 = dmin * m;
    for (int l = 0; l < 32; ++l) y[l] = d1 * (q[l] & 0xF) - m1;
    for (int l = 0; l < 32; ++l) y[l + 32] = d2 * (q[l] >> 4) - m2;
    q += 32;
    y += 64;
  }
}

void dequant_q6_k(const std::uint8_t* b, float* y) {
  const std::uint8_t* ql = b;
  const std::uint8_t* qh = b + 128;
  const auto* sc = reinterpret_cast<const std::int8_t*>(b + 192);
  const float d = f16_to_f32(load_u16(b + 208));
  for (int n = 0; n < 2; ++n) {  // two halves of 128
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * sc[is + 0] * q1;
      y[l + 32] = d * sc[is + 2] * q2;
      y[l + 64] = d * sc[is + 4] * q3;
      y[l + 96] = d * sc[is + 6] * q4;
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

}  // namespace

void quantize_row_q8_0(const float* x, void* dst, std::size_t n) {
  auto* out = static_cast<std::uint8_t*>(dst);
  for (std::size_t b = 0; b < n / 32; ++b, x += 32, out += 34) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    const std::uint16_t dh = f32_to_f16(amax / 127.0f);
    const float d = f16_to_f32(dh);
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    std::memcpy(out, &dh, 2);
    for (int i = 0; i < 32; ++i) {
      const float q = std::nearbyint(x[i] * id);
      out[2 + i] = static_cast<std::uint8_t>(static_cast<std::int8_t>(std::clamp(q, -127.0f, 127.0f)));
    }
  }
}

void quantize_row_q4_1(const float* x, void* dst, std::size_t n) {
  auto* out = static_cast<std::uint8_t*>(dst);
  for (std::size_t b = 0; b < n / 32; ++b, x += 32, out += 20) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < 32; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
    const std::uint16_t dh = f32_to_f16((hi - lo) / 15.0f), mh = f32_to_f16(lo);
    const float d = f16_to_f32(dh), m = f16_to_f32(mh);
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    std::memcpy(out, &dh, 2);
    std::memcpy(out + 2, &mh, 2);
    auto level = [&](float v) {
      return static_cast<std::uint8_t>(std::clamp(std::nearbyint((v - m) * id), 0.0f, 15.0f));
    };
    for (int j = 0; j < 16; ++j) out[4 + j] = static_cast<std::uint8_t>(level(x[j]) | (level(x[j + 16]) << 4));
  }
}

void dequantize_row(WeightType t, const void* src, float* out, std::size_t n) {
  const auto* p = static_cast<const std::uint8_t*>(src);
  const std::size_t be = block_elems(t), bb = block_bytes(t);
  if (be == 0 || n % be != 0)
    throw std::invalid_argument("dequantize_row: " + std::to_string(n) + " elements is not a whole number of blocks");
  for (std::size_t i = 0; i < n / be; ++i, p += bb, out += be) {
    switch (t) {
      case WeightType::F32:
        std::memcpy(out, p, 4);
        break;
      case WeightType::F16:
        *out = f16_to_f32(load_u16(p));
        break;
      case WeightType::BF16:
        *out = bf16_to_f32(load_u16(p));
        break;
      case WeightType::Q8_0:
        dequant_q8_0(p, out);
        break;
      case WeightType::Q4_0:
        dequant_q4_0(p, out);
        break;
      case WeightType::Q4_1:
        dequant_q4_1(p, out);
        break;
      case WeightType::Q4_K:
        dequant_q4_k(p, out);
        break;
      case WeightType::Q6_K:
        dequant_q6_k(p, out);
        break;
    }
  }
}

}  // namespace specactor::kernels
