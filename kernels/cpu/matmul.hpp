// kernels/cpu/matmul.hpp — y = x · Wᵀ for quantized or float weights, on the CPU.
//
// Versions: an AVX2/FMA/F16C path (chosen at run time when the CPU has it) and a portable scalar
// path that emulates the same 8-lane arithmetic with std::fma, so both give bit-identical results.
// Every (row, output) dot product runs the same operations in the same order no matter how many
// rows share the call: a token's logits do not depend on its batch.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/quant.hpp"

namespace specactor::kernels {

// A weight matrix in ggml layout: out_dim rows of in_dim elements, each row a run of blocks.
struct WeightMatrix {
  WeightType type = WeightType::F32;
  std::int64_t out_dim = 0;  // rows (output features)
  std::int64_t in_dim = 0;   // elements per row (input features)
  const std::uint8_t* data = nullptr;
  std::size_t row_stride = 0;  // bytes between rows (= row_bytes(type, in_dim))
};

enum class CpuPath { Scalar, Avx2 };
// The path used by matmul(): AVX2 when the CPU supports avx2+fma+f16c and SPECACTOR_CPU_PATH is not
// "scalar".
CpuPath cpu_path();
const char* cpu_path_name(CpuPath p);

// x: (rows, in_dim) row-major; y: (rows, out_dim). Parallel over output features (OpenMP).
void matmul(const WeightMatrix& w, const float* x, std::int64_t rows, float* y);
// The same with an explicit path (tests compare the two).
void matmul_path(CpuPath path, const WeightMatrix& w, const float* x, std::int64_t rows, float* y);

// Copies row `r` of w, dequantized, into out[in_dim] (embedding lookup).
void weight_row(const WeightMatrix& w, std::int64_t r, float* out);

// 8-lane dot product used by the float kernels (attention scores): same order on every path.
float dot8(const float* a, const float* b, std::int64_t n);

}  // namespace specactor::kernels
