// tests/test_cpu_kernels.cpp — CPU kernels against references: dequantization against the `gguf`
// package's (tests/data/quant_goldens.json), AVX2 vs scalar matmul (bit-exact), batch invariance,
// RoPE, attention masks, sampling, and the paged KV cache.
#include <doctest/doctest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/matmul.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/packed.hpp"
#include "kernels/cpu/pool.hpp"
#include "kernels/cpu/quant.hpp"
#include "kernels/cpu/sampling.hpp"
#include "kernels/cpu/tiles.hpp"
#include "model/kv_cache.hpp"
#include "tests/support/random_weights.hpp"

using namespace specactor::kernels;
using specactor::testing::random_weights;
using json = nlohmann::json;

namespace {

WeightType type_named(const std::string& n) {
  if (n == "Q8_0") return WeightType::Q8_0;
  if (n == "Q4_0") return WeightType::Q4_0;
  if (n == "Q4_1") return WeightType::Q4_1;
  if (n == "Q4_K") return WeightType::Q4_K;
  if (n == "Q6_K") return WeightType::Q6_K;
  if (n == "F16") return WeightType::F16;
  if (n == "BF16") return WeightType::BF16;
  return WeightType::F32;
}

const WeightType kAllTypes[] = {WeightType::F32,  WeightType::F16,  WeightType::BF16, WeightType::Q8_0,
                                WeightType::Q4_0, WeightType::Q4_1, WeightType::Q4_K, WeightType::Q6_K};

}  // namespace

TEST_CASE("dequantization matches the gguf package on random blocks of every format") {
  std::ifstream in(SPECACTOR_SOURCE_DIR "/tests/data/quant_goldens.json");
  REQUIRE(in);
  const json g = json::parse(in);
  REQUIRE(g["cases"].size() == 7);
  for (const auto& c : g["cases"]) {
    const std::string name = c["type"];
    CAPTURE(name);
    const auto bytes = c["bytes"].get<std::vector<std::uint8_t>>();
    const auto want = c["values"].get<std::vector<float>>();
    std::vector<float> got(want.size());
    dequantize_row(type_named(name), bytes.data(), got.data(), got.size());
    int mismatches = 0;
    for (std::size_t i = 0; i < want.size(); ++i) mismatches += got[i] != want[i];
    CHECK(mismatches == 0);
  }
}

TEST_CASE("Q8_0 quantization: each value within half a step of its block scale, zeros stay zero") {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 0.3f);
  std::vector<float> x(96), back(96);
  for (auto& v : x) v = dist(rng);
  for (int i = 32; i < 64; ++i) x[static_cast<std::size_t>(i)] = 0.0f;  // an all-zero block
  x[70] = 5.0f;                                                         // an outlier sets its block's scale
  std::vector<std::uint8_t> q(row_bytes(WeightType::Q8_0, x.size()));
  quantize_row_q8_0(x.data(), q.data(), x.size());
  dequantize_row(WeightType::Q8_0, q.data(), back.data(), back.size());
  for (std::size_t b = 0; b < 3; ++b) {
    float amax = 0.0f;
    for (std::size_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
    const float step = amax / 127.0f;
    for (std::size_t i = 0; i < 32; ++i)
      CHECK(std::fabs(back[b * 32 + i] - x[b * 32 + i]) <= 0.5f * step * 1.01f + 1e-7f);
  }
  for (int i = 32; i < 64; ++i) CHECK(back[static_cast<std::size_t>(i)] == 0.0f);
  CHECK(back[70] == doctest::Approx(5.0f).epsilon(1e-3));
}

TEST_CASE("Q4_1 quantization: within half a step of each block's range, exact on the grid and for constants") {
  std::mt19937 rng(9);
  std::normal_distribution<float> dist(0.1f, 0.3f);
  std::vector<float> x(128), back(128);
  for (auto& v : x) v = dist(rng);
  x[40] = -4.0f;                                                         // an outlier widens its block
  for (int i = 64; i < 96; ++i) x[static_cast<std::size_t>(i)] = 0.25f;  // a constant block
  for (int i = 96; i < 128; ++i) x[static_cast<std::size_t>(i)] = -1.0f + 0.25f * static_cast<float>((i * 7) % 16);
  std::vector<std::uint8_t> q(row_bytes(WeightType::Q4_1, x.size()));
  quantize_row_q4_1(x.data(), q.data(), x.size());
  dequantize_row(WeightType::Q4_1, q.data(), back.data(), back.size());
  for (std::size_t b = 0; b < 2; ++b) {
    const auto [lo, hi] =
        std::minmax_element(x.begin() + static_cast<long>(b * 32), x.begin() + static_cast<long>(b * 32 + 32));
    const float step = (*hi - *lo) / 15.0f;
    // Half a step, plus the f16 rounding of the stored minimum and step (relative 2^-11 each, ×15 levels).
    const float tol = 0.5f * step + 16.0f * step / 2048.0f + std::fabs(*lo) / 2048.0f + 1e-7f;
    for (std::size_t i = 0; i < 32; ++i) CHECK(std::fabs(back[b * 32 + i] - x[b * 32 + i]) <= tol);
  }
  for (std::size_t i = 64; i < 128; ++i) CHECK(back[i] == x[i]);  // the constant and the grid block: exact
}

TEST_CASE("f16 conversion: exact for every half value, round to nearest even") {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(static_cast<std::uint16_t>(h));
    if (std::isnan(f)) continue;
    REQUIRE(f32_to_f16(f) == h);
  }
  CHECK(f16_to_f32(f32_to_f16(1.0f + 1.0f / 4096)) == 1.0f);  // halfway rounds to even
  CHECK(f16_to_f32(0x3c00) == 1.0f);
  CHECK(bf16_to_f32(0x3f80) == 1.0f);
}

TEST_CASE("matmul: AVX-512, AVX2 and scalar paths are bit-identical, and close to a float64 reference") {
  const std::int64_t out = 37, in = 512, rows = 5;
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(rows * in));
  for (auto& v : x) v = d(rng);
  for (WeightType t : kAllTypes) {
    CAPTURE(static_cast<int>(t));
    const auto bytes = random_weights(t, out, in, 11 + static_cast<std::uint32_t>(t));
    std::vector<std::uint8_t> packed;
    const WeightMatrix w = pack_matrix({t, out, in, bytes.data(), row_bytes(t, static_cast<std::size_t>(in))}, packed);
    std::vector<float> ys(static_cast<std::size_t>(rows * out)), ya(ys.size());
    matmul_path(CpuPath::Scalar, w, x.data(), rows, ys.data());
    for (CpuPath p : {CpuPath::Avx2, CpuPath::Avx512}) {
      if (!cpu_path_available(p)) {
        MESSAGE("not run here: this CPU lacks the " << cpu_path_name(p) << " path");
        continue;
      }
      matmul_path(p, w, x.data(), rows, ya.data());
      CHECK(ys == ya);
    }
    // The packed view dequantizes to exactly what the ggml bytes do.
    std::vector<float> a(static_cast<std::size_t>(in)), b(a.size());
    weight_row(w, 3, a.data());
    dequantize_row(t, bytes.data() + 3 * row_bytes(t, static_cast<std::size_t>(in)), b.data(), a.size());
    CHECK(a == b);
    std::vector<float> wr(static_cast<std::size_t>(in));
    double worst = 0;
    for (std::int64_t o = 0; o < out; ++o) {
      weight_row(w, o, wr.data());
      for (std::int64_t r = 0; r < rows; ++r) {
        double ref = 0, mag = 0;
        for (std::int64_t i = 0; i < in; ++i) {
          ref += static_cast<double>(wr[i]) * x[r * in + i];
          mag += std::abs(static_cast<double>(wr[i]) * x[r * in + i]);
        }
        worst = std::max(worst, std::abs(ref - ys[r * out + o]) / (mag + 1e-30));
      }
    }
    CHECK(worst < 1e-5);  // float32 accumulation of 512 products, relative to Σ|w·x|
  }
}

TEST_CASE("matmul: a row's result does not depend on how many rows share the call") {
  const std::int64_t out = 64, in = 256;
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (WeightType t : {WeightType::Q4_1, WeightType::Q8_0, WeightType::F32, WeightType::Q6_K}) {
    const auto bytes = random_weights(t, out, in, 21);
    std::vector<std::uint8_t> packed;
    const WeightMatrix w = pack_matrix({t, out, in, bytes.data(), row_bytes(t, static_cast<std::size_t>(in))}, packed);
    for (std::int64_t rows : {1, 2, 3, 4, 5, 8, 13}) {
      std::vector<float> x(static_cast<std::size_t>(rows * in));
      for (auto& v : x) v = d(rng);
      std::vector<float> batch(static_cast<std::size_t>(rows * out)), single(static_cast<std::size_t>(out));
      matmul(w, x.data(), rows, batch.data());
      for (std::int64_t r = 0; r < rows; ++r) {
        matmul(w, x.data() + r * in, 1, single.data());
        CHECK(std::equal(single.begin(), single.end(), batch.begin() + r * out));
      }
    }
  }
}

namespace {

// The activation quantization of the fast precision, written again here from its definition
// (qmatmul.cpp): per 32-block d = amax / 127, q = nearbyint(x · 127 / amax).
std::vector<double> quantized_activations(const std::vector<float>& x) {
  std::vector<double> out(x.size());
  for (std::size_t b = 0; b < x.size(); b += 32) {
    float amax = 0;
    for (std::size_t j = 0; j < 32; ++j) amax = std::max(amax, std::abs(x[b + j]));
    const float d = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
    for (std::size_t j = 0; j < 32; ++j) out[b + j] = static_cast<double>(d) * std::nearbyint(x[b + j] * id);
  }
  return out;
}

TEST_CASE("packed panels: every row comes back out as the file's blocks and as the split row layout") {
  // split_rows() is what the CUDA upload sends; weight_row() what embeddings and heads read.
  for (WeightType t : {WeightType::Q8_0, WeightType::Q4_0, WeightType::Q4_1})
    for (const std::int64_t out : {8, 37})
      for (const std::int64_t in : {64, 256}) {
        CAPTURE(static_cast<int>(t));
        CAPTURE(out);
        CAPTURE(in);
        const std::size_t rb = row_bytes(t, static_cast<std::size_t>(in));
        const auto bytes = random_weights(t, out, in, 41 + static_cast<std::uint32_t>(out + in));
        std::vector<std::uint8_t> packed, split;
        const WeightMatrix w = pack_matrix({t, out, in, bytes.data(), rb}, packed, TileCopy::Without);
        REQUIRE(w.packed);
        CHECK(w.tiles == nullptr);
        CHECK(packed.size() == static_cast<std::size_t>((out + 7) / 8 * 8) * rb);  // the last panel padded
        {  // with the tile copy: the same panels, then the tile layout after them (on a 64-byte boundary)
          std::vector<std::uint8_t> both;
          const WeightMatrix wt = pack_matrix({t, out, in, bytes.data(), rb}, both, TileCopy::With);
          REQUIRE(wt.tiles != nullptr);
          CHECK(std::memcmp(both.data(), packed.data(), packed.size()) == 0);
          CHECK(reinterpret_cast<std::uintptr_t>(wt.tiles) % 64 == 0);
          CHECK(static_cast<std::size_t>(both.data() + both.size() - wt.tiles) >=
                specactor::kernels::packed::tile_bytes(t, out, in));
        }
        const std::uint8_t* rows = specactor::kernels::packed::split_rows(w, split);
        const std::int64_t nc = in / 32;
        const int sa = t == WeightType::Q4_1 ? 2 : 1, qb = t == WeightType::Q8_0 ? 32 : 16;
        const std::size_t bb = block_bytes(t);
        bool same = true;
        std::vector<float> a(static_cast<std::size_t>(in)), b(a.size());
        for (std::int64_t o = 0; o < out; ++o) {
          const std::uint8_t* g = bytes.data() + static_cast<std::size_t>(o) * rb;  // ggml blocks
          const std::uint8_t* r = rows + static_cast<std::size_t>(o) * rb;          // [d × nc][m × nc][quants]
          for (std::int64_t c = 0; c < nc; ++c) {
            same = same && std::memcmp(r + 2 * c, g + c * bb, 2) == 0;
            if (sa == 2) same = same && std::memcmp(r + 2 * nc + 2 * c, g + c * bb + 2, 2) == 0;
            same =
                same && std::memcmp(r + 2 * sa * nc + c * qb, g + c * bb + 2 * sa, static_cast<std::size_t>(qb)) == 0;
          }
          weight_row(w, o, a.data());
          dequantize_row(t, g, b.data(), b.size());
          same = same && a == b;
        }
        CHECK(same);
      }
}

const WeightType kIntegerTypes[] = {WeightType::Q8_0, WeightType::Q4_0, WeightType::Q4_1, WeightType::Q4_K,
                                    WeightType::Q6_K};

}  // namespace

TEST_CASE("fast matmul: scalar, AVX2 and VNNI paths are bit-identical and compute the integer dot product") {
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 1.0f);
  // Row counts that exercise every pass width of the kernels (AVX2: up to 4 rows, VNNI: up to 8) and
  // both ways of quantizing the activations (per thread up to 16 rows, shared above).
  for (const auto& [in_, rows_] :
       {std::pair<std::int64_t, std::int64_t>{256, 11}, {768, 11}, {256, 5}, {512, 7}, {256, 14}, {256, 20}}) {
    const std::int64_t in = in_, rows = rows_;    // plain variables: CAPTURE's lambda takes them (Clang 14)
    const std::int64_t out = rows % 2 ? 37 : 29;  // 5 or 4 panels: pairs, a lone one, a partial pair
    std::vector<float> x(static_cast<std::size_t>(rows * in));
    for (auto& v : x) v = d(rng);
    x[5] = 0;
    std::fill(x.begin() + 32, x.begin() + 64, 0.0f);  // an all-zero block
    x[100] = 40.0f;                                   // an outlier
    const std::vector<double> xq = quantized_activations(x);
    for (WeightType t : kIntegerTypes) {
      CAPTURE(static_cast<int>(t));
      CAPTURE(in);
      REQUIRE(has_integer_path(t));
      const auto bytes = random_weights(t, out, in, 31 + static_cast<std::uint32_t>(t));
      std::vector<std::uint8_t> packed;
      const WeightMatrix w =
          pack_matrix({t, out, in, bytes.data(), row_bytes(t, static_cast<std::size_t>(in))}, packed);
      std::vector<float> ys(static_cast<std::size_t>(rows * out)), ya(ys.size());
      qmatmul_path(QPath::Scalar, w, x.data(), rows, ys.data());
      for (QPath p : {QPath::Avx2, QPath::Vnni, QPath::Vnni512}) {
        if (!qpath_available(p)) {
          MESSAGE("not run here: this CPU lacks the " << std::string(qpath_name(p)) << " path");
          continue;
        }
        std::fill(ya.begin(), ya.end(), -1.0f);
        qmatmul_path(p, w, x.data(), rows, ya.data());
        CHECK(ys == ya);
      }
      // Against float64 sums of the dequantized weights times the quantized activations (only float
      // rounding separates them), and against the exact float path (activation quantization error).
      std::vector<float> wr(static_cast<std::size_t>(in)), ye(ys.size());
      matmul(w, x.data(), rows, ye.data(), Precision::Exact);
      double worst_int = 0, worst_exact = 0;
      for (std::int64_t o = 0; o < out; ++o) {
        weight_row(w, o, wr.data());
        for (std::int64_t r = 0; r < rows; ++r) {
          double ref = 0, mag = 0;
          for (std::int64_t i = 0; i < in; ++i) {
            ref += static_cast<double>(wr[i]) * xq[r * in + i];
            mag += std::abs(static_cast<double>(wr[i]) * x[r * in + i]);
          }
          worst_int = std::max(worst_int, std::abs(ref - ys[r * out + o]) / (mag + 1e-30));
          worst_exact =
              std::max(worst_exact, std::abs(static_cast<double>(ye[r * out + o]) - ys[r * out + o]) / (mag + 1e-30));
        }
      }
      CHECK(worst_int < 2e-6);
      CHECK(worst_exact < 2e-2);
      CHECK(worst_exact > 0);  // it is a different arithmetic
    }
  }
}

TEST_CASE("fast matmul: the tile kernel (emulated, and on the hardware where AMX runs) equals the scalar twin") {
  // 1…64 rows: every tile height, whole tiles and several; 37 and 29 outputs: pairs of panels, a
  // lone panel, a partial one; 1, 2 and 3 threads: ranges that start at odd panels.
  std::mt19937 rng(11);
  std::normal_distribution<float> d(0.0f, 1.0f);
  auto& pool = specactor::kernels::ComputePool::instance();
  const int before = pool.threads();
  const bool hardware = qpath_available(QPath::Amx);
  int compared = 0;
  std::vector<std::int64_t> row_counts;
  for (std::int64_t r = 1; r <= 64; ++r) row_counts.push_back(r);  // every tile height, whole and partial tiles
  for (const std::int64_t rows : row_counts)
    for (const WeightType t : kIntegerTypes) {
      const std::int64_t in = rows % 2 ? 256 : 768, out = rows % 3 ? 37 : 29;
      std::vector<float> x(static_cast<std::size_t>(rows * in));
      for (auto& v : x) v = d(rng);
      std::fill(x.begin(), x.begin() + 32, 0.0f);  // an all-zero block
      x[40] = 60.0f;                               // an outlier
      const auto bytes = random_weights(t, out, in, 97 + static_cast<std::uint32_t>(rows));
      std::vector<std::uint8_t> packed;
      const WeightMatrix w =
          pack_matrix({t, out, in, bytes.data(), row_bytes(t, static_cast<std::size_t>(in))}, packed, TileCopy::With);
      REQUIRE(w.tiles != nullptr);                           // every integer format has a tile layout
      if (t == WeightType::Q4_K || t == WeightType::Q6_K) {  // K-quants: the ggml rows stay, the copy is extra
        CHECK(w.data == bytes.data());
        CHECK_FALSE(w.packed);
        CHECK(reinterpret_cast<std::uintptr_t>(w.tiles) % 64 == 0);
      }
      std::vector<float> ys(static_cast<std::size_t>(rows * out)), ya(ys.size());
      pool.set_threads(1);
      qmatmul_path(QPath::Scalar, w, x.data(), rows, ys.data());
      for (int threads : {1, 2, 3}) {
        pool.set_threads(threads);
        for (QPath p : {QPath::AmxEmulated, QPath::Amx}) {
          if (p == QPath::Amx && !hardware) continue;
          CAPTURE(rows);
          CAPTURE(static_cast<int>(t));
          CAPTURE(threads);
          CAPTURE(std::string(qpath_name(p)));
          std::fill(ya.begin(), ya.end(), -1.0f);
          qmatmul_path(p, w, x.data(), rows, ya.data());
          CHECK(ys == ya);
          ++compared;
        }
      }
    }
  pool.set_threads(before);
  CHECK(compared >= 64 * 5 * 3);
  std::string why;
  if (!hardware) {  // where the tiles do not run, asking for them is refused, with the reason
    const auto bytes = random_weights(WeightType::Q8_0, 8, 32, 5);
    std::vector<std::uint8_t> packed;
    const WeightMatrix w =
        pack_matrix({WeightType::Q8_0, 8, 32, bytes.data(), row_bytes(WeightType::Q8_0, 32)}, packed);
    std::vector<float> x(32, 1.0f), y(8);
    CHECK_THROWS_WITH(qmatmul_path(QPath::Amx, w, x.data(), 1, y.data()), doctest::Contains("lacks the amx path"));
    CHECK_FALSE(tiles::amx_permission(why));
    CHECK_FALSE(why.empty());
  }
}

TEST_CASE("fast matmul: 512-bit VNNI over the tile copy (the AMX route below its threshold) equals the scalar twin") {
  if (!qpath_available(QPath::Vnni512)) {
    MESSAGE("not run here: this CPU lacks AVX-512 VNNI");
    return;
  }
  std::mt19937 rng(13);
  std::normal_distribution<float> d(0.0f, 1.0f);
  auto& pool = specactor::kernels::ComputePool::instance();
  const int before = pool.threads();
  int compared = 0;
  for (std::int64_t rows = 1; rows <= 20; ++rows)
    for (const WeightType t : {WeightType::Q4_0, WeightType::Q4_1, WeightType::Q8_0}) {
      // 37 and 29 outputs: whole tile panels and a partial one; 16: one whole panel.
      const std::int64_t in = rows % 2 ? 256 : 576, out = rows % 3 == 0 ? 16 : rows % 3 == 1 ? 37 : 29;
      std::vector<float> x(static_cast<std::size_t>(rows * in));
      for (auto& v : x) v = d(rng);
      std::fill(x.begin(), x.begin() + 32, 0.0f);  // an all-zero block
      x[40] = 60.0f;                               // an outlier
      const auto bytes = random_weights(t, out, in, 211 + static_cast<std::uint32_t>(rows));
      std::vector<std::uint8_t> packed;
      const WeightMatrix w =
          pack_matrix({t, out, in, bytes.data(), row_bytes(t, static_cast<std::size_t>(in))}, packed, TileCopy::With);
      std::vector<float> ys(static_cast<std::size_t>(rows * out)), ya(ys.size());
      pool.set_threads(1);
      qmatmul_path(QPath::Scalar, w, x.data(), rows, ys.data());
      for (int threads : {1, 2, 3}) {
        pool.set_threads(threads);
        CAPTURE(rows);
        CAPTURE(static_cast<int>(t));
        CAPTURE(threads);
        std::fill(ya.begin(), ya.end(), -1.0f);
        qmatmul_tile_copy_simd(w, x.data(), rows, ya.data());
        CHECK(ys == ya);
        ++compared;
      }
    }
  pool.set_threads(before);
  CHECK(compared == 20 * 3 * 3);
  // Refused: a matrix without its tile copy, a format the kernel does not take.
  const auto bytes = random_weights(WeightType::Q8_0, 16, 64, 5);
  std::vector<std::uint8_t> packed;
  const WeightMatrix plain =
      pack_matrix({WeightType::Q8_0, 16, 64, bytes.data(), row_bytes(WeightType::Q8_0, 64)}, packed, TileCopy::Without);
  std::vector<float> x(64, 1.0f), y(16);
  CHECK_THROWS_WITH(qmatmul_tile_copy_simd(plain, x.data(), 1, y.data()), doctest::Contains("tile copy"));
}

TEST_CASE("AMX decision: forced where it cannot run, refused permission, a failed self-check -> one line, SIMD") {
  TileProbe good;
  good.cpu = good.permission = good.self_check = true;
  good.tile_rows = 4;
  good.timing = "timed";
  good.tile_rows_k = 8;
  good.timing_k = "K timed";
  const std::string simd_why = "vnni512: timed";
  // Everything agrees: the tiles from the timed row count on, VNNI below it, no line on stderr.
  QPathDecision d = decide_qpath("", QPath::Vnni512, simd_why, good);
  CHECK(d.path == QPath::Amx);
  CHECK(d.fallback == QPath::Vnni512);
  CHECK(d.tile_rows == 4);
  CHECK(d.tile_rows_k == 8);  // the K-quants timed on their own
  CHECK(d.warning.empty());
  // Forced: the tiles for every call.
  d = decide_qpath("amx", QPath::Vnni512, simd_why, good);
  CHECK(d.path == QPath::Amx);
  CHECK(d.tile_rows == 1);
  CHECK(d.tile_rows_k == 1);
  // One family slower at every count: the other still runs on the tiles, and the reason says which.
  TileProbe half = good;
  half.tile_rows_k = 0;
  d = decide_qpath("", QPath::Vnni512, simd_why, half);
  CHECK(d.path == QPath::Amx);
  CHECK(d.tile_rows == 4);
  CHECK(d.tile_rows_k == 0);
  CHECK(d.reason.find("Q4_K/Q6_K not on the tiles") != std::string::npos);
  half = good;
  half.tile_rows = 0;
  d = decide_qpath("", QPath::Vnni512, simd_why, half);
  CHECK(d.path == QPath::Amx);
  CHECK(d.tile_rows == 0);
  CHECK(d.tile_rows_k == 8);
  CHECK(d.reason.find("Q4_0/Q4_1/Q8_0 not on the tiles") != std::string::npos);
  // Forced on a CPU without AMX: one line naming the reason, and the SIMD path.
  TileProbe none;
  none.cpu_why = "the CPU lacks AMX-INT8";
  d = decide_qpath("amx", QPath::Vnni512, simd_why, none);
  CHECK(d.path == QPath::Vnni512);
  CHECK(d.tile_rows == 0);
  CHECK(d.warning.find("SPECACTOR_CPU_PATH=amx refused") != std::string::npos);
  CHECK(d.warning.find("lacks AMX-INT8") != std::string::npos);
  CHECK(d.warning.find("running avx512-vnni-512") != std::string::npos);
  d = decide_qpath("", QPath::Vnni512, simd_why, none);  // not asked for: no line, the reason says why
  CHECK(d.path == QPath::Vnni512);
  CHECK(d.warning.empty());
  CHECK(d.reason.find("no AMX") != std::string::npos);
  // Asked for or not: the SIMD path, no tile rows, and a line on stderr that starts with `start` and
  // names `why`.
  auto falls_back = [&](const TileProbe& probe, const std::string& start, const std::string& why) {
    for (const char* want : {"", "amx"}) {
      CAPTURE(want);
      const QPathDecision f = decide_qpath(want, QPath::Vnni512, simd_why, probe);
      CHECK(f.path == QPath::Vnni512);
      CHECK(f.tile_rows == 0);
      CHECK(f.tile_rows_k == 0);
      CHECK(f.warning.rfind(start, 0) == 0);
      CHECK(f.warning.find(why) != std::string::npos);
    }
  };
  // The kernel refused the tile state (a container).
  TileProbe refused = good;
  refused.permission = false;
  refused.permission_why = "arch_prctl(ARCH_REQ_XCOMP_PERM) refused: Operation not permitted";
  falls_back(refused, "AMX not used", "ARCH_REQ_XCOMP_PERM");
  // The self-check disagreed: AMX off for the process, an error line.
  TileProbe wrong = good;
  wrong.self_check = false;
  wrong.self_check_why = "Q8_0, 3 rows: output 17 differs";
  falls_back(wrong, "error: AMX disabled", "output 17 differs");
  // Slower at every row count: not used, and no line (nothing was asked for).
  TileProbe slow = good;
  slow.tile_rows = slow.tile_rows_k = 0;
  d = decide_qpath("", QPath::Vnni512, simd_why, slow);
  CHECK(d.path == QPath::Vnni512);
  CHECK(d.reason.find("slower here at every row count") != std::string::npos);
  CHECK(d.warning.empty());
  // Another path asked for by name wins; the emulator runs anywhere.
  d = decide_qpath("avx2", QPath::Avx2, "avx2: forced", good);
  CHECK(d.path == QPath::Avx2);
  d = decide_qpath("amx-emulated", QPath::Avx2, "avx2", none);
  CHECK(d.path == QPath::AmxEmulated);
  CHECK(d.tile_rows == 1);
  CHECK(d.tile_rows_k == 1);
  CHECK(d.warning.empty());
  // A value that names no path is not followed, and says so.
  d = decide_qpath("amx512", QPath::Vnni512, simd_why, good);
  CHECK(d.path == QPath::Vnni512);
  CHECK(d.warning.find("SPECACTOR_CPU_PATH=amx512 is not a path") != std::string::npos);
  d = decide_qpath("vnni512", QPath::Vnni512, simd_why, good);
  CHECK(d.warning.empty());
}

TEST_CASE("AMX self-check: the tile kernels agree with the SIMD path, and a corrupted tile result is caught") {
  const QPath simd = qpath_available(QPath::Vnni)   ? QPath::Vnni
                     : qpath_available(QPath::Avx2) ? QPath::Avx2
                                                    : QPath::Scalar;
  std::vector<QPath> tile_paths{QPath::AmxEmulated};
  if (qpath_available(QPath::Amx)) tile_paths.push_back(QPath::Amx);
  for (const QPath p : tile_paths) {
    CAPTURE(std::string(qpath_name(p)));
    std::string why;
    CHECK(tile_self_check(p, simd, why));
    CHECK(why.empty());
    // One flipped bit in every Q8_0 tile result: the check fails and names where.
    CHECK_FALSE(tile_self_check(p, simd, why, /*corrupt=*/true));
    CHECK(why.find("Q8_0") != std::string::npos);
  }
  std::string why;
  CHECK_THROWS(tile_self_check(QPath::Vnni, QPath::Scalar, why));
}

TEST_CASE("fast matmul: a row's result does not depend on how many rows or matrices share the call") {
  const std::int64_t in = 576;
  std::mt19937 rng(9);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (WeightType t : kIntegerTypes) {
    CAPTURE(static_cast<int>(t));
    const std::int64_t out = t == WeightType::Q8_0 ? 203 : 66;  // not a multiple of the 4-row tile
    const auto bytes = random_weights(t, out, t == WeightType::Q4_K || t == WeightType::Q6_K ? 512 : in, 41);
    const std::int64_t width = t == WeightType::Q4_K || t == WeightType::Q6_K ? 512 : in;
    std::vector<std::uint8_t> packed;
    const WeightMatrix w =
        pack_matrix({t, out, width, bytes.data(), row_bytes(t, static_cast<std::size_t>(width))}, packed);
    for (std::int64_t rows : {1, 2, 3, 4, 5, 8, 13, 16, 17, 30}) {  // ≤ 16 rows: quantized per thread
      std::vector<float> x(static_cast<std::size_t>(rows * width));
      for (auto& v : x) v = d(rng);
      std::vector<float> batch(static_cast<std::size_t>(rows * out)), single(static_cast<std::size_t>(out));
      std::vector<float> twice(static_cast<std::size_t>(2 * rows * out));
      matmul(w, x.data(), rows, batch.data(), Precision::Fast);
      const MatmulJob jobs[2] = {{&w, twice.data()}, {&w, twice.data() + rows * out}};
      matmul_many(jobs, 2, x.data(), rows, Precision::Fast);
      CHECK(std::equal(batch.begin(), batch.end(), twice.begin()));
      CHECK(std::equal(batch.begin(), batch.end(), twice.begin() + rows * out));
      for (std::int64_t r = 0; r < rows; ++r) {
        matmul(w, x.data() + r * width, 1, single.data(), Precision::Fast);
        CHECK(std::equal(single.begin(), single.end(), batch.begin() + r * out));
      }
    }
  }
}

TEST_CASE("fast matmul: float weight types use the exact path") {
  const std::int64_t out = 8, in = 64;
  const auto bytes = random_weights(WeightType::F16, out, in, 3);
  const WeightMatrix w{WeightType::F16, out, in, bytes.data(), row_bytes(WeightType::F16, in)};
  std::vector<float> x(in, 0.5f), a(out), b(out);
  matmul(w, x.data(), 1, a.data(), Precision::Fast);
  matmul(w, x.data(), 1, b.data(), Precision::Exact);
  CHECK(a == b);
  CHECK_FALSE(has_integer_path(WeightType::F16));
}

TEST_CASE("RoPE: both layouts rotate the right pairs by the right angles") {
  const std::int64_t hd = 8;
  std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::int32_t pos = 3;
  auto rot = [&](std::int64_t a, std::int64_t b, int i) {
    const double th = pos * std::pow(10000.0, -2.0 * i / hd);
    return std::pair{x[a] * std::cos(th) - x[b] * std::sin(th), x[a] * std::sin(th) + x[b] * std::cos(th)};
  };
  std::vector<float> adj = x, neox = x;
  rope_cpu(adj.data(), 1, 1, hd, hd, &pos, 10000.0, false);
  rope_cpu(neox.data(), 1, 1, hd, hd, &pos, 10000.0, true);
  for (int i = 0; i < 4; ++i) {
    auto [a0, a1] = rot(2 * i, 2 * i + 1, i);
    CHECK(adj[2 * i] == doctest::Approx(a0).epsilon(1e-5));
    CHECK(adj[2 * i + 1] == doctest::Approx(a1).epsilon(1e-5));
    auto [n0, n1] = rot(i, i + 4, i);
    CHECK(neox[i] == doctest::Approx(n0).epsilon(1e-5));
    CHECK(neox[i + 4] == doctest::Approx(n1).epsilon(1e-5));
  }
  const std::int32_t zero = 0;
  std::vector<float> same = x;
  rope_cpu(same.data(), 1, 1, hd, hd, &zero, 10000.0, false);
  CHECK(same == x);
}

// One layer's KV cache holding `slots` random rows, and n · heads · hd random queries.
struct RandomAttention {
  specactor::model::KvCache kv;
  specactor::model::KvCache::Seq seq;
  std::vector<float> q;
  RandomAttention(std::int64_t heads, std::int64_t kvh, std::int64_t hd, std::int64_t page, std::int64_t cap,
                  std::int64_t slots, std::int64_t n, std::uint32_t seed)
      : kv(1, kvh, hd, page, cap), q(static_cast<std::size_t>(n * heads * hd)) {
    kv.reserve(seq, slots);
    seq.length = slots;
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> kr(static_cast<std::size_t>(kvh * hd)), vr(kr.size());
    for (std::int64_t s = 0; s < slots; ++s) {
      for (std::size_t i = 0; i < kr.size(); ++i) kr[i] = d(rng), vr[i] = d(rng);
      kv.write(0, seq, s, kr.data(), vr.data());
    }
    for (auto& v : q) v = d(rng);
  }
};

TEST_CASE("attention: a chain mask equals the causal default, a tree mask hides siblings") {
  const std::int64_t heads = 4, kvh = 2, hd = 16, page = 4, prefix = 5, n = 4;
  RandomAttention a(heads, kvh, hd, page, 64, prefix + n, n, 9);
  auto& kv = a.kv;
  auto& seq = a.seq;
  const std::vector<float>& q = a.q;
  std::vector<float> causal(q.size()), chain(q.size()), tree(q.size());
  attention_cpu(q.data(), n, heads, kvh, hd, kv.view(0, seq), prefix, nullptr, 0.25f, causal.data());
  const std::vector<std::uint64_t> chain_mask = {0b1, 0b11, 0b111, 0b1111};
  attention_cpu(q.data(), n, heads, kvh, hd, kv.view(0, seq), prefix, chain_mask.data(), 0.25f, chain.data());
  CHECK(causal == chain);
  // Tree: node 0 root, nodes 1 and 2 children of 0, node 3 child of 2. Node 3 must equal a query
  // that sees only (prefix, 0, 2, 3) — i.e. the same as when node 1's K/V were anything else.
  const std::vector<std::uint64_t> tree_mask = {0b1, 0b11, 0b101, 0b1101};
  attention_cpu(q.data(), n, heads, kvh, hd, kv.view(0, seq), prefix, tree_mask.data(), 0.25f, tree.data());
  std::vector<float> kr(static_cast<std::size_t>(kvh * hd)), vr(kr.size());
  kv.read(0, seq, prefix + 1, kr.data(), vr.data());
  for (float& x : kr) x += 100.0f;
  kv.write(0, seq, prefix + 1, kr.data(), vr.data());
  std::vector<float> tree2(q.size());
  attention_cpu(q.data(), n, heads, kvh, hd, kv.view(0, seq), prefix, tree_mask.data(), 0.25f, tree2.data());
  for (std::int64_t i = 0; i < heads * hd; ++i) {
    CHECK(tree[3 * heads * hd + i] == tree2[3 * heads * hd + i]);
    CHECK(tree[2 * heads * hd + i] == tree2[2 * heads * hd + i]);
  }
  CHECK(tree[1 * heads * hd] != tree2[1 * heads * hd]);  // node 1 does see itself
}

TEST_CASE("softmax_cpu: within 1e-4 of a float64 softmax (float sums of 4,099 terms), sums to 1, -inf gets 0") {
  std::mt19937 rng(12);
  std::normal_distribution<float> dist(0.0f, 4.0f);
  std::vector<float> x(4099);
  for (auto& v : x) v = dist(rng);
  x[17] = -INFINITY;
  std::vector<float> p = x;
  softmax_cpu(p.data(), static_cast<std::int64_t>(p.size()));
  double mx = -INFINITY, sum = 0.0, got_sum = 0.0;
  for (float v : x) mx = std::max(mx, static_cast<double>(v));
  for (float v : x) sum += std::exp(static_cast<double>(v) - mx);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double want = std::exp(static_cast<double>(x[i]) - mx) / sum;
    CHECK(std::fabs(p[i] - want) <= 1e-4 * want + 1e-12);
    got_sum += p[i];
  }
  CHECK(p[17] == 0.0f);
  CHECK(got_sum == doctest::Approx(1.0).epsilon(1e-5));
}

TEST_CASE("gelu_tanh_mul: Gemma's GELU within 2e-6 of the float64 formula, the vector loop equal to its scalar tail") {
  std::vector<float> g, up;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-12.0f, 12.0f);
  for (int i = 0; i < 4099; ++i) {
    g.push_back(u(rng));
    up.push_back(u(rng) / 4.0f);
  }
  for (float v : {0.0f, -0.0f, 1e-20f, -60.0f, 60.0f, -5.0f}) {
    g.push_back(v);
    up.push_back(1.0f);
  }
  const auto n = static_cast<std::int64_t>(g.size());
  std::vector<float> all(g.size()), one(g.size());
  gelu_tanh_mul_cpu(all.data(), g.data(), up.data(), n);  // AVX2 where the CPU path has it, then a scalar tail
  for (std::int64_t i = 0; i < n; ++i) gelu_tanh_mul_cpu(&one[i], &g[i], &up[i], 1);  // the scalar loop alone
  CHECK(std::memcmp(all.data(), one.data(), all.size() * sizeof(float)) == 0);
  double worst = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double x = g[i];
    const double ref = 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))) * up[i];
    worst = std::max(worst, std::abs(ref - all[i]) / std::max(1.0, std::abs(ref)));
  }
  MESSAGE("gelu_tanh_mul: max relative error " << worst);
  CHECK(worst < 2e-6);
}

TEST_CASE("exp_approx: the AVX2 twin is bit-identical, within 3e-7 of exp, edges as documented") {
  std::vector<float> x;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-90.0f, 90.0f);
  for (int i = 0; i < 20000; ++i) x.push_back(u(rng));
  for (float v : {0.0f, -0.0f, 1.0f, -1.0f, 0.34657359f, -0.34657359f, 88.0f, 88.0001f, -86.0f, -86.0001f, 1e-30f,
                  -1e-30f, INFINITY, -INFINITY, NAN})
    x.push_back(v);
  std::vector<float> ys(x.size()), ya(x.size());
  exp_approx_many(x.data(), static_cast<std::int64_t>(x.size()), ys.data(), false);
  exp_approx_many(x.data(), static_cast<std::int64_t>(x.size()), ya.data(), true);
  CHECK(std::memcmp(ys.data(), ya.data(), ys.size() * sizeof(float)) == 0);
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (!std::isnan(x[i])) CHECK(ys[i] == exp_approx(x[i]));
    if (std::isnan(x[i])) {
      CHECK(std::isnan(ys[i]));
    } else if (x[i] > 88.0f) {
      CHECK(ys[i] == INFINITY);
    } else if (x[i] < -86.0f) {
      CHECK(ys[i] == 0.0f);
    } else {
      const double ref = std::exp(static_cast<double>(x[i]));
      worst = std::max(worst, std::abs(ys[i] - ref) / ref);
    }
  }
  MESSAGE("exp_approx: worst relative error " << worst);
  CHECK(worst < 3e-7);
}

TEST_CASE(
    "attention: each query of a causal or tree-masked batch equals that query alone (grouped or per-head order)") {
  const std::int64_t heads = 9, kvh = 3, hd = 64, page = 16, prefix = 37, n = 6;
  RandomAttention a(heads, kvh, hd, page, 128, prefix + n, n, 11);
  auto& kv = a.kv;
  auto& seq = a.seq;
  const std::vector<float>& q = a.q;
  std::vector<float> batch(q.size()), one(static_cast<std::size_t>(heads * hd));
  attention_cpu(q.data(), n, heads, kvh, hd, kv.view(0, seq), prefix, nullptr, 0.125f, batch.data());
  for (std::int64_t i = 0; i < n; ++i) {
    attention_cpu(q.data() + i * heads * hd, 1, heads, kvh, hd, kv.view(0, seq), prefix + i, nullptr, 0.125f,
                  one.data());
    CHECK(std::memcmp(one.data(), batch.data() + i * heads * hd, one.size() * sizeof(float)) == 0);
  }
  // A tree mask (node 0 the root; 1, 2 children of 0; 3 of 2; 4 of 1; 5 of 3): the batch against
  // each node alone with its own mask row.
  const std::vector<std::uint64_t> tree = {0b1, 0b11, 0b101, 0b1101, 0b10011, 0b101101};
  const specactor::kernels::KvSegment pre{kv.view(0, seq), 0, prefix}, news{kv.view(0, seq), prefix, n};
  attention_segments_cpu(q.data(), n, heads, kvh, hd, pre, news, tree.data(), 0.125f, batch.data());
  for (std::int64_t i = 0; i < n; ++i) {
    attention_segments_cpu(q.data() + i * heads * hd, 1, heads, kvh, hd, pre, news, &tree[static_cast<std::size_t>(i)],
                           0.125f, one.data());
    CHECK(std::memcmp(one.data(), batch.data() + i * heads * hd, one.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("attention: the KV cache's per-head pages and rows with the heads side by side give the same bits") {
  const std::int64_t heads = 9, kvh = 3, hd = 64, page = 16, prefix = 45, n = 5;
  RandomAttention a(heads, kvh, hd, page, 128, prefix + n, n, 13);
  // The same slots as plain rows (one page holding them all, heads side by side: the head drafters'
  // scratch layout), read back through the cache.
  const std::int64_t slots = prefix + n, row = kvh * hd;
  std::vector<float> k_rows(static_cast<std::size_t>(slots * row)), v_rows(k_rows.size());
  for (std::int64_t s = 0; s < slots; ++s) a.kv.read(0, a.seq, s, k_rows.data() + s * row, v_rows.data() + s * row);
  const std::int32_t page0 = 0;
  const specactor::kernels::PagedKvView rows{k_rows.data(), v_rows.data(), &page0, slots, slots * row, row};
  const specactor::kernels::PagedKvView cache = a.kv.view(0, a.seq);
  CHECK(cache.page_stride == page * hd);                       // the cache keeps a head's slots of a page together,
  CHECK(cache.head_stride == a.kv.total_pages() * page * hd);  // and a head's pages one after another
  for (std::int64_t nq : {std::int64_t{1}, n}) {
    const std::int64_t pre = slots - nq;
    std::vector<float> x(static_cast<std::size_t>(nq * heads * hd)), y(x.size());
    attention_cpu(a.q.data(), nq, heads, kvh, hd, cache, pre, nullptr, 0.125f, x.data());
    attention_cpu(a.q.data(), nq, heads, kvh, hd, rows, pre, nullptr, 0.125f, y.data());
    CHECK(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
  }
  // write/read round trip, and copy_slot moves every head of a slot.
  std::vector<float> k1(static_cast<std::size_t>(row)), v1(k1.size()), k2(k1.size()), v2(k1.size());
  a.kv.copy_slot(a.seq, 3, 20);
  a.kv.read(0, a.seq, 3, k1.data(), v1.data());
  a.kv.read(0, a.seq, 20, k2.data(), v2.data());
  CHECK(k1 == k2);
  CHECK(v1 == v2);
  CHECK(std::equal(k1.begin(), k1.end(), k_rows.begin() + 3 * row));
}

TEST_CASE("attention: a batch of sequences of different lengths gives the same bits at 1, 2, 3 threads and alone") {
  // The threads' shares follow each item's keys, so where the split falls depends on the lengths;
  // every (query, head) must still compute the same bits as in a call of its own.
  const std::int64_t heads = 9, kvh = 3, hd = 64, page = 16;
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {{700, 1}, {20, 1},   {300, 4}, {5, 1},
                                                                     {160, 1}, {1000, 1}, {33, 3}};  // (keys, queries)
  std::vector<RandomAttention> seqs;
  for (std::size_t i = 0; i < shapes.size(); ++i)
    seqs.emplace_back(heads, kvh, hd, page, 1024, shapes[i].first, shapes[i].second,
                      static_cast<std::uint32_t>(50 + i));
  auto run = [&](int threads) {
    specactor::kernels::ComputePool::instance().set_threads(threads);
    std::vector<std::vector<float>> outs;
    std::vector<specactor::kernels::AttentionJob> jobs;
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      const auto [keys, nq] = shapes[i];
      outs.emplace_back(static_cast<std::size_t>(nq * heads * hd));
      const auto view = seqs[i].kv.view(0, seqs[i].seq);
      jobs.push_back({seqs[i].q.data(), nq, {view, 0, keys - nq}, {view, keys - nq, nq}, nullptr, nullptr});
    }
    for (std::size_t i = 0; i < jobs.size(); ++i) jobs[i].out = outs[i].data();
    specactor::kernels::attention_many_cpu(jobs.data(), static_cast<int>(jobs.size()), heads, kvh, hd, 0.125f);
    return outs;
  };
  const int before = specactor::kernels::ComputePool::instance().threads();
  const auto one = run(1), two = run(2), three = run(3);
  specactor::kernels::ComputePool::instance().set_threads(before);
  CHECK(one == two);
  CHECK(one == three);
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const auto [keys, nq] = shapes[i];
    std::vector<float> alone(static_cast<std::size_t>(nq * heads * hd));
    attention_cpu(seqs[i].q.data(), nq, heads, kvh, hd, seqs[i].kv.view(0, seqs[i].seq), keys - nq, nullptr, 0.125f,
                  alone.data());
    CHECK(alone == two[i]);
  }
}

TEST_CASE("KV cache: pages come and go, exhaustion is an error that changes nothing") {
  specactor::model::KvCache kv(2, 1, 8, 4, 16);  // 4 pages of 4 slots
  specactor::model::KvCache::Seq a, b;
  kv.reserve(a, 6);
  CHECK(a.pages.size() == 2);
  CHECK(kv.free_pages() == 2);
  kv.reserve(b, 8);
  CHECK(kv.free_pages() == 0);
  CHECK_THROWS_AS(kv.reserve(a, 9), specactor::model::KvExhausted);
  CHECK(a.pages.size() == 2);
  a.length = 6;
  kv.truncate(a, 3);
  CHECK(a.length == 3);
  CHECK(a.pages.size() == 1);
  CHECK(kv.free_pages() == 1);
  kv.release(b);
  CHECK(kv.free_pages() == 3);
  kv.reserve(a, 16);
  CHECK(kv.free_pages() == 0);
  CHECK_THROWS_WITH(specactor::model::KvCache(1, 1, 8, 4, 2), doctest::Contains("KvCache: bad shape"));
}

TEST_CASE("KV cache: after churn a sequence's pages still follow each other where free ones allow") {
  specactor::model::KvCache kv(1, 1, 8, 4, 4 * 200);  // 200 pages of 4 slots
  std::vector<specactor::model::KvCache::Seq> seqs(10);
  for (int round = 0; round < 3; ++round)  // requests growing side by side, then leaving in a scrambled order
    for (int step = 1; step <= 20; ++step)
      for (auto& s : seqs) kv.reserve(s, step * 4);
  for (int i : {3, 7, 0, 9, 5, 1, 8, 2, 6, 4}) kv.release(seqs[static_cast<std::size_t>(i)]);
  CHECK(kv.free_pages() == 200);
  specactor::model::KvCache::Seq held, longer;
  kv.reserve(held, 4 * 3);  // pages 0-2
  kv.reserve(longer, 4 * 100);
  for (std::size_t i = 1; i < longer.pages.size(); ++i) CHECK(longer.pages[i] == longer.pages[i - 1] + 1);
  CHECK(longer.pages.front() == 3);
  // Where the next page is taken, the lowest free one: a hole left by a released sequence is filled.
  specactor::model::KvCache::Seq blocker;
  kv.reserve(blocker, 4);
  CHECK(blocker.pages.front() == 103);
  kv.release(held);
  kv.reserve(longer, 4 * 101);
  CHECK(longer.pages.back() == 0);
  kv.reserve(longer, 4 * 102);
  CHECK(longer.pages.back() == 1);
}

TEST_CASE("KV cache: warm makes the start of every layer's KV head regions resident, and takes no page") {
  // 2 layers × 3 KV heads, each head's region 256 pages × 64 slots × 64 dims × 2 bytes = 2 MiB.
  specactor::model::KvCache kv(2, 3, 64, 64, 64 * 256, true, specactor::kernels::KvType::F16);
  specactor::model::KvCache::Seq seq;
  kv.reserve(seq, 1);  // for a view (page 0); nothing written
  const long page = ::sysconf(_SC_PAGESIZE);
  auto resident = [&](const void* p) {
    unsigned char in = 0;
    REQUIRE(::mincore(const_cast<void*>(p), static_cast<std::size_t>(page), &in) == 0);
    return (in & 1) != 0;
  };
  auto starts = [&] {
    std::vector<const unsigned char*> out;
    for (std::int64_t l = 0; l < 2; ++l) {
      const auto v = kv.view(l, seq);
      for (std::int64_t h = 0; h < 3; ++h)
        for (const void* base : {v.k, v.v})
          out.push_back(static_cast<const unsigned char*>(base) + h * specactor::kernels::kv_head_stride(v, 64) * 2);
    }
    return out;
  };
  REQUIRE(starts().size() == 12);
  int cold = 0;
  for (const auto* p : starts()) cold += resident(p) ? 0 : 1;
  CHECK(cold == 12);  // an anonymous mapping no one wrote
  const std::int64_t free_before = kv.free_pages();
  kv.warm(4096);
  for (const auto* p : starts()) CHECK(resident(p));
  CHECK(kv.free_pages() == free_before);
  std::vector<float> k(3 * 64, 1.0f), v(3 * 64, 1.0f);
  kv.read(1, seq, 0, k.data(), v.data());
  CHECK(std::all_of(k.begin(), k.end(), [](float x) { return x == 0.0f; }));
  CHECK(std::all_of(v.begin(), v.end(), [](float x) { return x == 0.0f; }));
}

TEST_CASE("sampling: greedy, top-k, top-p, min-p, temperature, seeds") {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f};
  CHECK(argmax(logits.data(), 5) == 1);  // ties go to the lowest id
  std::vector<float> p;
  sampling_probs(logits.data(), 5, {0.0f}, p);
  CHECK(p == std::vector<float>{0, 1, 0, 0, 0});
  sampling_probs(logits.data(), 5, {1.0f, 2}, p);
  CHECK(p[1] == doctest::Approx(0.5));
  CHECK(p[3] == doctest::Approx(0.5));
  CHECK(p[0] + p[2] + p[4] == 0.0f);
  sampling_probs(logits.data(), 5, {1.0f, 0, 0.39f}, p);  // the first of the tied pair alone has p = 0.397
  CHECK(p[1] == 1.0f);
  sampling_probs(logits.data(), 5, {1.0f, 0, 1.0f, 0.3f}, p);  // min-p: e^(2-3) = 0.37 >= 0.3 stays, e^-2 goes
  CHECK(p[0] == 0.0f);
  CHECK(p[2] > 0.0f);
  CHECK(p[4] == 0.0f);
  sampling_probs(logits.data(), 5, {1.0f}, p);
  double sum = 0;
  for (float v : p) sum += v;
  CHECK(sum == doctest::Approx(1.0));
  CHECK(p[1] / p[2] == doctest::Approx(std::exp(1.0)));
  sampling_probs(logits.data(), 5, {0.5f}, p);
  CHECK(p[1] / p[2] == doctest::Approx(std::exp(2.0)));

  Rng r1(42), r2(42), r3(43);
  std::vector<std::int32_t> s1, s2, s3;
  for (int i = 0; i < 50; ++i) {
    s1.push_back(sample(logits.data(), 5, {1.0f}, r1));
    s2.push_back(sample(logits.data(), 5, {1.0f}, r2));
    s3.push_back(sample(logits.data(), 5, {1.0f}, r3));
  }
  CHECK(s1 == s2);
  CHECK(s1 != s3);
  // Empirical frequencies follow the distribution.
  Rng r(7);
  std::vector<int> counts(5);
  sampling_probs(logits.data(), 5, {1.0f}, p);
  const int draws = 200000;
  for (int i = 0; i < draws; ++i) counts[static_cast<std::size_t>(sample_from_probs(p, r.uniform()))]++;
  for (int i = 0; i < 5; ++i) CHECK(counts[i] / double(draws) == doctest::Approx(p[i]).epsilon(0.03));
}

// The kept set and probabilities from sorting the whole vocabulary (the obvious way), against
// sampling_probs, which sorts only the ids that can be kept.
TEST_CASE("sampling: top-p / min-p over a large vocabulary equal a full sort (ties, flat and peaked logits)") {
  auto reference = [](const std::vector<float>& l, const SamplingParams& p) {
    const auto n = static_cast<std::int32_t>(l.size());
    std::vector<std::int32_t> ids(l.size());
    std::iota(ids.begin(), ids.end(), 0);
    std::sort(ids.begin(), ids.end(),
              [&](std::int32_t a, std::int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    std::vector<double> w(l.size());
    double sum = 0;
    for (std::int32_t i = 0; i < n; ++i) sum += (w[i] = std::exp((l[ids[i]] - l[ids[0]]) / double(p.temperature)));
    std::size_t keep = l.size();
    double acc = 0;
    if (p.top_p < 1.0f)
      for (std::size_t i = 0; i < keep; ++i)
        if ((acc += w[i] / sum) >= p.top_p) keep = i + 1;
    if (p.min_p > 0.0f) {
      std::size_t k = 1;
      while (k < keep && w[k] >= p.min_p * w[0]) ++k;
      keep = k;
    }
    double kept = 0;
    for (std::size_t i = 0; i < keep; ++i) kept += w[i];
    std::vector<double> out(l.size(), 0.0);
    for (std::size_t i = 0; i < keep; ++i) out[static_cast<std::size_t>(ids[i])] = w[i] / kept;
    return out;
  };
  Rng rng(11);
  for (int trial = 0; trial < 24; ++trial) {
    const std::int64_t n = 5000 + 1000 * (trial % 3);
    const double scale = trial % 4 == 0 ? 0.05 : trial % 4 == 1 ? 1.0 : trial % 4 == 2 ? 4.0 : 12.0;
    std::vector<float> l(static_cast<std::size_t>(n));
    for (auto& v : l) v = static_cast<float>(scale * (rng.uniform() * 2 - 1));
    for (int t = 0; t < 40; ++t) l[rng.next() % l.size()] = l[rng.next() % l.size()];  // ties
    if (trial % 2 == 1) l[rng.next() % l.size()] = 10.0f;  // one peak over a sea of tiny weights with real mass
    const SamplingParams params[] = {{0.7f, 0, 0.9f},        {1.0f, 0, 0.99f},       {1.5f, 0, 0.5f},
                                     {1.0f, 0, 1.0f, 0.05f}, {0.8f, 0, 0.95f, 0.2f}, {2.0f, 0, 0.999f}};
    for (const auto& p : params) {
      CAPTURE(trial);
      CAPTURE(p.temperature);
      CAPTURE(p.top_p);
      CAPTURE(p.min_p);
      std::vector<float> got;
      sampling_probs(l.data(), n, p, got);
      const auto want = reference(l, p);
      int support_got = 0, support_want = 0, mismatched = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        support_got += got[static_cast<std::size_t>(i)] > 0;
        support_want += want[static_cast<std::size_t>(i)] > 0;
        mismatched += std::abs(got[static_cast<std::size_t>(i)] - want[static_cast<std::size_t>(i)]) >
                      1e-6 * want[static_cast<std::size_t>(i)] + 1e-12;
      }
      CHECK(support_got == support_want);
      CHECK(mismatched == 0);
    }
  }
}

// ---- tensor parallelism on the CPU communicator ----

#include <unistd.h>

#include <filesystem>
#include <thread>

#include "kernels/comm.hpp"
#include "model/gguf.hpp"
#include "model/llama.hpp"
#include "model/safetensors.hpp"
#include "tests/support/gguf_writer.hpp"

TEST_CASE("CPU communicator: all-reduce sums in rank order on every rank, broadcast copies the root's values") {
  for (int size : {1, 2, 3, 4}) {
    auto group = make_cpu_group(size);
    std::vector<std::vector<float>> data(static_cast<std::size_t>(size));
    std::vector<std::vector<std::int32_t>> ids(static_cast<std::size_t>(size));
    std::vector<std::thread> threads;
    for (int r = 0; r < size; ++r)
      threads.emplace_back([&, r] {
        auto& d = data[static_cast<std::size_t>(r)];
        for (int i = 0; i < 100; ++i) d.push_back(0.1f * static_cast<float>(r + 1) + static_cast<float>(i));
        group[static_cast<std::size_t>(r)]->all_reduce_sum(d.data(), d.size());
        ids[static_cast<std::size_t>(r)] = {r, r * 10, r * 100};
        group[static_cast<std::size_t>(r)]->broadcast(ids[static_cast<std::size_t>(r)].data(), 3, size - 1);
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < size; ++r) {
      CHECK(data[static_cast<std::size_t>(r)] == data[0]);  // bit-identical on every rank
      CHECK(ids[static_cast<std::size_t>(r)] == std::vector<std::int32_t>{size - 1, (size - 1) * 10, (size - 1) * 100});
    }
    float want = 0.0f;
    for (int r = 0; r < size; ++r) want += 0.1f * static_cast<float>(r + 1) + 7.0f;
    CHECK(data[0][7] == doctest::Approx(want));
  }
}

TEST_CASE("CPU communicator: a rank that aborts wakes the ranks waiting for it, and later collectives fail") {
  auto group = make_cpu_group(3);
  std::vector<std::string> errors(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      std::vector<float> d(10, 1.0f);
      try {
        group[static_cast<std::size_t>(r)]->all_reduce_sum(d.data(), d.size());
      } catch (const CommAborted& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // ranks 0 and 1 are waiting by now (or soon)
  group[2]->abort("rank 2: out of memory");
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r)
    CHECK(errors[static_cast<std::size_t>(r)] == "tensor-parallel group aborted: rank 2: out of memory");
  std::int32_t x = 1;
  CHECK_THROWS_AS(group[0]->broadcast(&x, 1, 0), CommAborted);
  group[1]->abort("a second reason");  // the first reason stays
  CHECK_THROWS_WITH(group[1]->broadcast(&x, 1, 0), "tensor-parallel group aborted: rank 2: out of memory");
}

TEST_CASE("tensor parallel forward: TP = 2 and 3 on the CPU communicator give TP = 1's greedy tokens") {
  namespace fs = std::filesystem;
  namespace sm = specactor::model;
  specactor::testing::TinyLlamaShape s = specactor::testing::tp_divisible_shape();
  s.layers = 2;
  s.context = 256;
  const std::string path =
      (fs::temp_directory_path() / ("specactor_tp." + std::to_string(::getpid()) + ".gguf")).string();
  specactor::testing::tiny_llama(s, true, 21).write(path);
  auto file = sm::GgufFile::open(path);
  const auto cfg = sm::LlamaConfig::from(sm::read_model_info(*file), "");
  auto source = std::make_shared<sm::GgufSource>(file);

  // Greedy generation with `tp` ranks: every rank runs the forward, rank 0 picks the token and
  // broadcasts it (the decision is made once), every rank checks it got rank 0's logits.
  auto generate = [&](int tp, std::vector<float>& first_logits) {
    auto group = make_cpu_group(tp);
    std::vector<std::int32_t> tokens = {5, 17, 33, 2, 71, 40, 9};
    const std::size_t prompt = tokens.size();
    std::vector<int> same_logits(static_cast<std::size_t>(tp), 1);
    std::vector<std::thread> threads;
    for (int r = 0; r < tp; ++r)
      threads.emplace_back([&, r] {
        auto w = sm::LlamaWeights::load(source, sm::LlamaWeights::Naming::Gguf, cfg,
                                        specactor::config::LoadFormat::Auto, -1, {}, sm::TpShard{r, tp});
        sm::LlamaRunner runner(w, 1);
        sm::KvCache kv(cfg.n_layers, w->local_kv_heads(), cfg.head_dim, 16, 256);
        sm::KvCache::Seq seq;
        std::vector<std::int32_t> mine(tokens.begin(), tokens.begin() + static_cast<long>(prompt));
        std::size_t fed = 0;
        for (int step = 0; step < 12; ++step) {
          std::vector<sm::ForwardSeq> b(1);
          b[0].kv = &seq;
          b[0].tokens.assign(mine.begin() + static_cast<long>(fed), mine.end());
          b[0].logit_rows = {static_cast<std::int32_t>(b[0].tokens.size()) - 1};
          sm::ForwardResult out;
          runner.forward(b, kv, out, {}, group[static_cast<std::size_t>(r)].get());
          fed = mine.size();
          std::int32_t next = argmax(out.logits.data(), cfg.vocab_size);
          if (step == 0 && r == 0) first_logits = out.logits;
          std::vector<float> check = out.logits;  // every rank holds the same logits
          std::vector<float> rank0 = out.logits;
          group[static_cast<std::size_t>(r)]->broadcast(reinterpret_cast<std::int32_t*>(rank0.data()), rank0.size(), 0);
          if (check != rank0) same_logits[static_cast<std::size_t>(r)] = 0;
          group[static_cast<std::size_t>(r)]->broadcast(&next, 1, 0);
          mine.push_back(next);
        }
        if (r == 0) tokens = mine;
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < tp; ++r) CHECK(same_logits[static_cast<std::size_t>(r)] == 1);
    return tokens;
  };
  std::vector<float> l1, l2, l3;
  const auto t1 = generate(1, l1);
  const auto t2 = generate(2, l2);
  const auto t3 = generate(3, l3);
  CHECK(t2 == t1);
  CHECK(t3 == t1);
  float d2 = 0, d3 = 0;
  for (std::size_t i = 0; i < l1.size(); ++i) {
    d2 = std::max(d2, std::fabs(l2[i] - l1[i]));
    d3 = std::max(d3, std::fabs(l3[i] - l1[i]));
  }
  MESSAGE("max |logit(TP) - logit(TP=1)|: TP=2 " << d2 << ", TP=3 " << d3);
  CHECK(d2 < 1e-4f);
  CHECK(d3 < 1e-4f);
  // A split the model does not allow is a clear error.
  CHECK_THROWS_WITH_AS(sm::LlamaWeights::load(source, sm::LlamaWeights::Naming::Gguf, cfg,
                                              specactor::config::LoadFormat::Auto, -1, {}, sm::TpShard{0, 4}),
                       doctest::Contains("--tp-size 4 does not divide the model's 6 attention heads"), sm::GgufError);
  fs::remove(path);
}

#include <sys/resource.h>

TEST_CASE("compute pool: every share of every job runs exactly once while the thread count changes") {
  // A worker that sat out a job of 2 threads once read the next job's count of 3 before it saw that
  // job: it ran the job's share, then ran it again on seeing it, and `run` returned while another
  // share was still running (outputs unwritten at 3 threads on 2 cores). The window is a few
  // instructions: against that pool this stress caught it in about one run in eight here, the tile
  // kernel test (3 threads, long shares) in about one in three.
  auto& pool = specactor::kernels::ComputePool::instance();
  const int before = pool.threads();
  // Busy threads beside the pool's, so that its threads are preempted often, as on a loaded machine.
  std::atomic<bool> done{false};
  std::vector<std::thread> busy;
  for (int b = 0; b < 2; ++b)
    busy.emplace_back([&] {
      volatile std::uint64_t x = 0;
      while (!done.load(std::memory_order_relaxed)) x = x + 1;
    });
  int wrong = 0;
  for (int i = 0; i < 2000 && wrong == 0; ++i) {
    const int n = 2 + i % 2;
    pool.set_threads(n);
    std::array<std::atomic<int>, 3> runs{};
    pool.run([&](int tid, int nth) {
      if (nth != n) ++wrong;
      // Shares of uneven length, so that threads (3 may share 2 cores) are preempted at any point.
      volatile std::uint64_t spin = 0;
      for (int k = 0; k < (i * 7919 + tid * 104729) % 20000; ++k) spin = spin + 1;
      runs[static_cast<std::size_t>(tid)].fetch_add(1);
    });
    for (int t = 0; t < 3; ++t) wrong += runs[static_cast<std::size_t>(t)].load() != (t < n ? 1 : 0);
    CAPTURE(i);
  }
  done = true;
  for (auto& t : busy) t.join();
  pool.set_threads(before);
  CHECK(wrong == 0);
}

TEST_CASE("compute pool: threads the system refuses are an error at start, named with the count") {
  // `generate --threads 4096` ended in "internal error: Resource temporarily unavailable" at the first
  // step; the engine now starts its threads at load (LlamaRunner) and names --threads. Here the
  // address-space limit leaves room for a few 8 MiB thread stacks, not for 256.
  auto& pool = specactor::kernels::ComputePool::instance();
  const int before = pool.threads();
  long vm_kb = 0;
  {
    std::ifstream st("/proc/self/status");
    for (std::string line; std::getline(st, line);)
      if (line.rfind("VmSize:", 0) == 0) vm_kb = std::stol(line.substr(7));
  }
  REQUIRE(vm_kb > 0);
  rlimit old{};
  REQUIRE(::getrlimit(RLIMIT_AS, &old) == 0);
  rlimit low = old;
  low.rlim_cur = static_cast<rlim_t>(vm_kb + 64 * 1024) * 1024;
  REQUIRE(::setrlimit(RLIMIT_AS, &low) == 0);
  pool.set_threads(256);
  std::string what;
  try {
    pool.start_threads();
  } catch (const std::runtime_error& e) {
    what = e.what();
  }
  REQUIRE(::setrlimit(RLIMIT_AS, &old) == 0);
  pool.set_threads(before);
  CHECK(what.find("the system refused to start compute thread") != std::string::npos);
  CHECK(what.find(" of 256 (") != std::string::npos);
  // Within the limits the pool works as before.
  std::atomic<int> calls{0};
  pool.run([&](int, int) { ++calls; });
  CHECK(calls == pool.threads());
}
