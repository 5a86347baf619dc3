// kernels/cpu/matmul.hpp — y = x · Wᵀ for quantized or float weights, on the CPU.
//
// Versions: AVX-512, AVX2/FMA/F16C and a portable scalar path, chosen at run time by what the CPU
// has; all three perform the same 16-lane arithmetic (see matmul.cpp), so they are bit-identical.
// Every (row, output) dot product runs the same operations in the same order no matter how many
// rows share the call: a token's logits do not depend on its batch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/quant.hpp"

namespace specactor::kernels {

// A weight matrix in ggml layout: out_dim rows of in_dim elements, each row a run of blocks.
struct WeightMatrix {
  WeightType type = WeightType::F32;
  std::int64_t out_dim = 0;  // rows (output features)
  std::int64_t in_dim = 0;   // elements per row (input features)
  const std::uint8_t* data = nullptr;
  std::size_t row_stride = 0;  // bytes between rows (= row_bytes(type, in_dim))
  bool packed = false;         // Q8_0/Q4_0/Q4_1 in 8-row panels (see pack_matrix, packed.hpp)
};

// Q8_0, Q4_0 and Q4_1 matrices are repacked into panels of 8 rows (kernels/cpu/packed.hpp; the same
// bytes, the last panel zero padded) for the integer kernels; matmul() requires it. Other types are
// returned as they are. `storage` receives the packed bytes and must outlive the returned view.
WeightMatrix pack_matrix(const WeightMatrix& src, std::vector<std::uint8_t>& storage);

enum class CpuPath { Scalar, Avx2, Avx512 };
// The path used by matmul(): the widest the CPU supports, unless SPECACTOR_CPU_PATH=scalar|avx2.
CpuPath cpu_path();
const char* cpu_path_name(CpuPath p);
bool cpu_path_available(CpuPath p);

// Several matrices applied to the same input in one parallel region (q/k/v, gate/up):
// jobs[j].y = x · jobs[j].wᵀ, each (rows, out_dim_j). All jobs share in_dim.
struct MatmulJob {
  const WeightMatrix* w;
  float* y;
};
void matmul_many(const MatmulJob* jobs, int n_jobs, const float* x, std::int64_t rows);

// x: (rows, in_dim) row-major; y: (rows, out_dim). in_dim must be a multiple of 32. Parallel over
// output features on the compute pool (kernels/cpu/pool.hpp).
void matmul(const WeightMatrix& w, const float* x, std::int64_t rows, float* y);
// The same with an explicit path (tests compare the two).
void matmul_path(CpuPath path, const WeightMatrix& w, const float* x, std::int64_t rows, float* y);

// Copies row `r` of w, dequantized, into out[in_dim] (embedding lookup).
void weight_row(const WeightMatrix& w, std::int64_t r, float* out);

// ---- fast precision: integer dot products over 8-bit quantized activations (qmatmul.cpp) ----------
//
// `Precision::Exact` keeps activations in float32 and dequantizes every weight (the functions above).
// `Precision::Fast` quantizes each activation row once per call to int8 blocks of 32 (a float scale
// per block and the block's scaled sum) and multiplies them with the weights' own integer quants:
// Q4_0, Q4_1, Q4_K and Q8_0, Q6_K; other weight types fall back to the exact path. Integer block sums
// are exact and the float combination runs in one fixed order (see qmatmul.cpp), so a row's result is
// bit-identical whatever the number of rows in the call and whatever the instruction path.
enum class Precision { Fast, Exact };
const char* precision_name(Precision p);

// The instruction paths of the fast precision: a scalar twin that defines the arithmetic, AVX2
// (maddubs/madd), VNNI (AVX512-VNNI with VL, 256-bit dpbusd: one panel of 8 outputs per register)
// and Vnni512 (calls of more than 8 rows with 512-bit dpbusd, two panels per register, for
// Q4_0/Q4_1/Q8_0; up to 8 rows, and Q4_K/Q6_K, as Vnni). All four give the same bits.
// Amx: the tile unit (kernels/cpu/tiles.hpp) for Q4_0/Q4_1/Q8_0, 16 outputs × up to 16 rows per tile
// pass (Q4_K/Q6_K on the widest other path); AmxEmulated: the same kernel on the software model of the
// tiles, on any CPU (slow; tests). Neither is chosen by qpath() yet: tests and qmatmul_path() use them.
enum class QPath { Scalar, Avx2, Vnni, Vnni512, Amx, AmxEmulated };
// The path the fast precision runs: the widest available; between Vnni and Vnni512 the faster on
// this CPU, timed once at first use (a few milliseconds: a small matrix in cache, 16 rows). Forced by
// SPECACTOR_CPU_PATH=scalar|avx2|vnni256|vnni512 (a path the CPU lacks is not taken).
QPath qpath();
// Why qpath() is what it is, in a sentence (the CPU's features, the timing, an override, AMX).
const std::string& qpath_reason();
const char* qpath_name(QPath p);
bool qpath_available(QPath p);
// Whether `t` has an integer kernel (else Fast computes it with the exact path).
bool has_integer_path(WeightType t);

void matmul_many(const MatmulJob* jobs, int n_jobs, const float* x, std::int64_t rows, Precision precision);
void matmul(const WeightMatrix& w, const float* x, std::int64_t rows, float* y, Precision precision);
// The fast precision with an explicit path (tests compare the paths).
void qmatmul_path(QPath path, const WeightMatrix& w, const float* x, std::int64_t rows, float* y);

// 8-lane dot product used by the float kernels (attention scores): same order on every path.
float dot8(const float* a, const float* b, std::int64_t n);

}  // namespace specactor::kernels
