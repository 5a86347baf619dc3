// kernels/cpu/quant.hpp — weight formats (ggml block layouts) and their dequantization.
//
// Block layouts (little endian, f16 = IEEE half):
//   Q8_0  (32 elems, 34 B): f16 d; i8 q[32]                       x = d*q
//   Q4_0  (32 elems, 18 B): f16 d; u8 qs[16]                      x[j] = d*((qs[j]&15)-8), x[j+16] = d*((qs[j]>>4)-8)
//   Q4_1  (32 elems, 20 B): f16 d, m; u8 qs[16]                   x[j] = d*(qs[j]&15)+m,   x[j+16] = d*(qs[j]>>4)+m
//   Q4_K (256 elems, 144 B): f16 d, dmin; u8 scales[12]; u8 qs[128]   8 sub-blocks of 32 with 6-bit scale/min
//   Q6_K (256 elems, 210 B): u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d   16 sub-blocks of 16, 6-bit quants
//   F32, F16, BF16 plain.
#pragma once

#include <cstddef>
#include <cstdint>

namespace specactor::kernels {

// Same numbering as ggml / model::GgmlType.
enum class WeightType : std::uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q8_0 = 8,
  Q4_K = 12,
  Q6_K = 14,
  BF16 = 30
};

bool weight_type_supported(std::uint32_t ggml_type);
std::size_t block_elems(WeightType t);  // elements per block
std::size_t block_bytes(WeightType t);  // bytes per block
// Bytes of one row of n elements (n must be a multiple of block_elems).
std::size_t row_bytes(WeightType t, std::size_t n);

float f16_to_f32(std::uint16_t h);
std::uint16_t f32_to_f16(float f);  // round to nearest even
float bf16_to_f32(std::uint16_t h);
std::uint16_t f32_to_bf16(float f);  // round to nearest even; NaN stays a (quiet) NaN
// n values, each converted as the scalar functions above do (a NaN keeps its sign and the top of its
// payload and becomes quiet, as F16C's conversion does). With `simd` and a CPU with AVX2 + FMA +
// F16C (and SPECACTOR_CPU_PATH not "scalar"), 8 at a time — the same bits (tested).
void f32_to_f16_n(const float* x, std::uint16_t* out, std::size_t n, bool simd = true);
void f32_to_bf16_n(const float* x, std::uint16_t* out, std::size_t n, bool simd = true);

// Scale and min (6 bits each) of sub-block j (0..7) of a Q4_K super-block, from its 12 scale bytes.
void q4k_scale_min(int j, const std::uint8_t* scales, std::uint8_t& sc, std::uint8_t& m);

// Dequantizes n elements (a whole number of blocks) starting at `src` into out[n]. Scalar reference.
void dequantize_row(WeightType t, const void* src, float* out, std::size_t n);

// Quantizes n floats (a multiple of 32) to Q8_0 blocks at dst (row_bytes(Q8_0, n) bytes): per block
// d = max|x| / 127 (stored as f16), q = round(x / d). Draft heads stored in float use it in the fast
// precision, so their products take the integer path.
void quantize_row_q8_0(const float* x, void* dst, std::size_t n);

// Quantizes n floats (a multiple of 32) to Q4_1 blocks at dst (row_bytes(Q4_1, n) bytes): per block
// m = min x (f16), d = (max x − m) / 15 (f16), q = round((x − m) / d) clamped to [0, 15].
void quantize_row_q4_1(const float* x, void* dst, std::size_t n);

}  // namespace specactor::kernels
