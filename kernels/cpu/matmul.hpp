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
  std::size_t row_stride = 0;           // bytes between rows (= row_bytes(type, in_dim))
  bool packed = false;                  // Q8_0/Q4_0/Q4_1 in 8-row panels (see pack_matrix, packed.hpp)
  const std::uint8_t* tiles = nullptr;  // the same matrix in the tile layout (AMX; packed or K-quant), or null
};

// Q8_0, Q4_0 and Q4_1 matrices are repacked into panels of 8 rows (kernels/cpu/packed.hpp; the same
// bytes, the last panel zero padded) for the integer kernels; matmul() requires it. Other types are
// returned as they are. `storage` receives the packed bytes and must outlive the returned view.
// A second copy in the tile layout (packed.hpp) follows the panels when `tiles` says so: Auto = when
// the fast precision's path is the AMX one (qpath()), so the tile kernels stream their own layout.
// Q4_K and Q6_K matrices keep their ggml rows and get only the tile copy (in `storage`), then.
enum class TileCopy { Auto, With, Without };
WeightMatrix pack_matrix(const WeightMatrix& src, std::vector<std::uint8_t>& storage, TileCopy tiles = TileCopy::Auto);
// Bytes of tile-layout copies pack_matrix has made in this process (the AMX path's extra memory).
std::size_t tile_copy_bytes();

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
// Amx: the tile unit (Intel AMX-INT8, kernels/cpu/tiles.hpp) for Q4_0/Q4_1/Q8_0/Q4_K/Q6_K matrices
// with a tile copy (pack_matrix), 16 outputs × up to 16 rows per tile pass, for calls of at least
// qpath_tile_rows() rows (qpath_tile_rows_k() for the K-quants); fewer rows of Q4_0/Q4_1/Q8_0 run on
// 512-bit VNNI over the same tile copy (qmatmul_tile_copy_simd), so a run that mixes small and large
// calls streams one copy of the weights; the other formats run on the path it falls back to (the VNNI
// choice). AmxEmulated: the same kernels on the software model of the tiles,
// on any CPU (slow; tests, SPECACTOR_CPU_PATH=amx-emulated). Every path gives the same bits.
enum class QPath { Scalar, Avx2, Vnni, Vnni512, Amx, AmxEmulated };
// The path the fast precision runs, decided once at first use: the widest SIMD the CPU has (between
// Vnni and Vnni512 the faster, timed: a few milliseconds on a small matrix in cache), then AMX when
// the CPU has it, Linux grants the tile state, the self-check agrees bit for bit and a timing shows the
// tiles faster from some row count on. SPECACTOR_CPU_PATH=scalar|avx2|vnni256|vnni512 forces a SIMD
// path (a path the CPU lacks is not taken), =amx the tiles for every call (refused, with one line on
// stderr, where they cannot run), =amx-emulated the emulator.
QPath qpath();
// Why qpath() is what it is, in a sentence (the CPU's features, the timing, an override, AMX).
const std::string& qpath_reason();
// Activation rows from which calls of Q4_0/Q4_1/Q8_0 (qpath_tile_rows_k: Q4_K/Q6_K) run on the
// tiles; 0 when qpath() is not a tile path or that family stays off the tiles.
std::int64_t qpath_tile_rows();
std::int64_t qpath_tile_rows_k();
const char* qpath_name(QPath p);
bool qpath_available(QPath p);

// What the AMX decision looked at (gathered at first use; tests make up machines).
struct TileProbe {
  bool cpu = false;  // AMX-TILE + AMX-INT8 with the OS's tile state, and AVX-512 VNNI
  std::string cpu_why;
  bool permission = false;  // Linux granted the tile state (arch_prctl)
  std::string permission_why;
  bool self_check = false;  // tile_self_check() passed
  std::string self_check_why;
  std::int64_t tile_rows = 0;    // the timing: tiles faster from this many rows on (0: at no count)
  std::string timing;            // the timing, in words
  std::int64_t tile_rows_k = 0;  // the same for the K-quants (Q4_K, Q6_K), timed on their own
  std::string timing_k;
};
struct QPathDecision {
  QPath path = QPath::Scalar;
  QPath fallback = QPath::Scalar;  // for what a tile path does not take
  std::int64_t tile_rows = 0;      // Q4_0/Q4_1/Q8_0 calls of this many rows or more on the tiles (0: none)
  std::int64_t tile_rows_k = 0;    // the same for Q4_K/Q6_K
  std::string reason;
  std::string warning;  // printed once on stderr when not empty (AMX wanted or present but not used)
};
// The decision for SPECACTOR_CPU_PATH=`want` ("" when unset), the SIMD choice and the probe.
QPathDecision decide_qpath(const std::string& want, QPath simd, const std::string& simd_reason, const TileProbe& probe);
// A fixed random product of every tile format (Q4_0, Q4_1, Q8_0 with 96 and 256 inputs; Q4_K, Q6_K
// with 256 and 512; 1…16 and 20 rows; 40 outputs) through `tile` (Amx or AmxEmulated) and through `reference`; true
// when every bit agrees, else `why` names the first difference. `corrupt` flips a bit of every Q8_0 tile result first
// (the test of the failure path).
bool tile_self_check(QPath tile, QPath reference, std::string& why, bool corrupt = false);
// Whether `t` has an integer kernel (else Fast computes it with the exact path).
bool has_integer_path(WeightType t);

void matmul_many(const MatmulJob* jobs, int n_jobs, const float* x, std::int64_t rows, Precision precision);
void matmul(const WeightMatrix& w, const float* x, std::int64_t rows, float* y, Precision precision);
// The fast precision with an explicit path (tests compare the paths).
void qmatmul_path(QPath path, const WeightMatrix& w, const float* x, std::int64_t rows, float* y);

// The kernel the AMX route runs for Q4_0/Q4_1/Q8_0 calls below its tile threshold: 512-bit VNNI over
// the matrix's tile copy, so one copy of the weights is streamed at every row count (same bits as every
// path). Throws without AVX-512 VNNI, for another format or without a tile copy (tests).
void qmatmul_tile_copy_simd(const WeightMatrix& w, const float* x, std::int64_t rows, float* y);

// 8-lane dot product used by the float kernels (attention scores): same order on every path.
float dot8(const float* a, const float* b, std::int64_t n);

}  // namespace specactor::kernels
