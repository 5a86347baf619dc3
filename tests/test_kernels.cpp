// tests/test_kernels.cpp — kernel references and the CPU/CUDA twins (CUDA parity runs only where a
// device answers; elsewhere it is skipped with a visible message).
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/cpu/rmsnorm.hpp"
#include "tests/support/random_weights.hpp"
#include "tests/support/skip.hpp"

using namespace specactor::kernels;

namespace {

// The CUDA table, or a visible skip naming the kernel and the reason.
const Backend* gpu_or_skip(const char* kernel) {
  const Backend* b = cuda_backend();
  if (!b)
    specactor::testing::mark_skipped("no CUDA device", std::string(kernel) + " CUDA parity: " + probe_devices().reason);
  return b;
}

std::vector<float> randn(std::size_t n, std::uint32_t seed, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// max |a - b| / (tol_abs + tol_rel · |a|) over the elements: <= 1 means within tolerance.
double worst_ratio(const std::vector<float>& a, const std::vector<float>& b, double tol_abs, double tol_rel) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(
        worst, std::abs(static_cast<double>(a[i]) - b[i]) / (tol_abs + tol_rel * std::abs(static_cast<double>(a[i]))));
  return worst;
}

// The weight formats the CUDA kernels compute (Q4_K/Q6_K run on the CPU only).
const WeightType kGpuTypes[] = {WeightType::F32,  WeightType::F16,  WeightType::BF16,
                                WeightType::Q8_0, WeightType::Q4_0, WeightType::Q4_1};

struct Packed {
  std::vector<std::uint8_t> bytes, packed;
  WeightMatrix w;
};
Packed random_matrix(WeightType t, std::int64_t out, std::int64_t in, std::uint32_t seed) {
  Packed p;
  p.bytes = specactor::testing::random_weights(t, out, in, seed);
  p.w = pack_matrix({t, out, in, p.bytes.data(), row_bytes(t, static_cast<std::size_t>(in))}, p.packed);
  return p;
}

}  // namespace

TEST_CASE("rmsnorm_cpu on hand-computable rows") {
  // Row [3, 4]: mean square 12.5, scale 1/sqrt(12.5 + eps).
  const std::vector<float> x = {3, 4, 1, 1};
  const std::vector<float> w = {1, 2};
  std::vector<float> y(4);
  rmsnorm_cpu(y.data(), x.data(), w.data(), 2, 2, 0.0f);
  const float s0 = 1.0f / std::sqrt(12.5f);
  CHECK(y[0] == doctest::Approx(3 * s0));
  CHECK(y[1] == doctest::Approx(8 * s0));
  CHECK(y[2] == doctest::Approx(1.0f));
  CHECK(y[3] == doctest::Approx(2.0f));
  // In place.
  std::vector<float> z = x;
  rmsnorm_cpu(z.data(), z.data(), w.data(), 2, 2, 0.0f);
  CHECK(z == y);
}

TEST_CASE("device probe: never throws, the CPU backend is always there") {
  const DeviceProbe& p = probe_devices();
  CHECK(cpu_backend().kind == BackendKind::Cpu);
  if (p.cuda_usable) {
    CHECK(cuda_backend() != nullptr);
    CHECK(p.reason.empty());
  } else {
    CHECK(cuda_backend() == nullptr);
    CHECK(!p.reason.empty());
    MESSAGE("CUDA not usable here: " << p.reason << " (the CPU backend runs every test)");
  }
#ifdef SPECACTOR_HAVE_CUDA
  CHECK(p.cuda_compiled);
  CHECK(p.nccl_version > 0);  // NCCL is linked and answers without a device
#endif
}

TEST_CASE("rmsnorm CPU vs CUDA parity on seeded random rows") {
  const Backend* cuda = cuda_backend();
  if (!cuda) {
    SKIP_CASE("no CUDA device", "rmsnorm CUDA parity: " << probe_devices().reason);
  }
  std::mt19937 rng(42);
  std::normal_distribution<float> d(0.0f, 1.0f);
  const int rows = 37, dim = 576;
  std::vector<float> x(rows * dim), w(dim), ref(rows * dim), got(rows * dim);
  for (auto& v : x) v = d(rng);
  for (auto& v : w) v = d(rng);
  cpu_backend().rmsnorm(ref.data(), x.data(), w.data(), rows, dim, 1e-5f);
  cuda->rmsnorm(got.data(), x.data(), w.data(), rows, dim, 1e-5f);
  float max_diff = 0;
  for (int i = 0; i < rows * dim; ++i) max_diff = std::max(max_diff, std::abs(ref[i] - got[i]));
  MESSAGE("rmsnorm max |cpu - cuda| = " << max_diff);
  CHECK(max_diff < 1e-5f);  // float32 outputs from double accumulation: only the last bit may differ
}

// Tolerances: float32 kernels whose summation order differs between the CPU and the GPU. Element-wise
// ops (silu, rope, embedding) agree to a few ulps; reductions (mat-vec over `in` terms, attention,
// softmax) are compared relative to the magnitude of the summed terms.
TEST_CASE("CUDA parity: embedding rows of every device weight format are the CPU's dequantisation") {
  const Backend* gpu = gpu_or_skip("embedding");
  if (!gpu) return;
  const std::vector<std::int32_t> tokens = {0, 7, 3, 7, 99, 42};
  for (WeightType t : kGpuTypes) {
    CAPTURE(static_cast<int>(t));
    const Packed m = random_matrix(t, 100, 256, 5 + static_cast<std::uint32_t>(t));
    std::vector<float> a(tokens.size() * 256), b(a.size());
    cpu_backend().embedding_rows(m.w, tokens.data(), static_cast<std::int64_t>(tokens.size()), a.data());
    gpu->embedding_rows(m.w, tokens.data(), static_cast<std::int64_t>(tokens.size()), b.data());
    CHECK(worst_ratio(a, b, 1e-7, 1e-6) <= 1.0);  // the same decode: equal up to fma contraction
  }
}

TEST_CASE("CUDA parity: mat-vec and cuBLAS paths of every device weight format") {
  const Backend* gpu = gpu_or_skip("matmul");
  if (!gpu) return;
  const std::int64_t out = 77, in = 576;
  for (WeightType t : kGpuTypes)
    for (std::int64_t rows : {1, 5, 8, 13, 37}) {
      CAPTURE(static_cast<int>(t));
      CAPTURE(rows);
      const Packed m = random_matrix(t, out, in, 9 + static_cast<std::uint32_t>(t));
      const auto x = randn(static_cast<std::size_t>(rows * in), 17);
      std::vector<float> ref(static_cast<std::size_t>(rows * out)), mv(ref.size()), wide(ref.size());
      cpu_backend().matmul(m.w, x.data(), rows, ref.data());
      gpu->matmul(m.w, x.data(), rows, mv.data());
      gpu->matmul_wide(m.w, x.data(), rows, wide.data());
      // |Σ w·x| over 576 terms of size ~|w|: absolute 2e-4 · typical magnitude, relative 1e-4.
      double mag = 0;
      for (float v : ref) mag = std::max(mag, static_cast<double>(std::abs(v)));
      CHECK(worst_ratio(ref, mv, 1e-5 * (1 + mag), 1e-4) <= 1.0);
      CHECK(worst_ratio(ref, wide, 1e-5 * (1 + mag), 1e-4) <= 1.0);
    }
}

TEST_CASE("CUDA parity: RoPE (adjacent pairs and NeoX halves), SiLU-gated product") {
  const Backend* gpu = gpu_or_skip("rope/silu");
  if (!gpu) return;
  const std::int64_t n_tok = 9, heads = 6, hd = 64;
  const std::vector<std::int32_t> pos = {0, 1, 2, 17, 255, 1000, 4095, 8191, 3};
  for (bool neox : {false, true}) {
    CAPTURE(neox);
    auto a = randn(static_cast<std::size_t>(n_tok * heads * hd), 23), b = a;
    cpu_backend().rope(a.data(), n_tok, heads, hd, hd, pos.data(), 100000.0, neox);
    gpu->rope(b.data(), n_tok, heads, hd, hd, pos.data(), 100000.0, neox);
    CHECK(worst_ratio(a, b, 1e-5, 1e-5) <= 1.0);
  }
  const auto g = randn(5000, 29, 3.0f), u = randn(5000, 31);
  std::vector<float> a(5000), b(5000);
  cpu_backend().silu_mul(a.data(), g.data(), u.data(), 5000);
  gpu->silu_mul(b.data(), g.data(), u.data(), 5000);
  CHECK(worst_ratio(a, b, 1e-7, 1e-6) <= 1.0);
}

TEST_CASE("CUDA parity: paged attention, causal and tree-masked, grouped heads, shuffled pages") {
  const Backend* gpu = gpu_or_skip("attention");
  if (!gpu) return;
  const std::int64_t heads = 6, kv_heads = 2, hd = 64, page = 16, n_pages = 24, row = kv_heads * hd;
  const auto k_pool = randn(static_cast<std::size_t>(n_pages * page * row), 37);
  const auto v_pool = randn(k_pool.size(), 41);
  std::vector<std::int32_t> pages(static_cast<std::size_t>(n_pages));
  for (std::int64_t i = 0; i < n_pages; ++i)
    pages[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((i * 7) % n_pages);
  const float scale = 1.0f / 8.0f;
  for (std::int64_t n_prefix : {0, 5, 150, 300}) {
    const std::int64_t n_q = 7;
    // A tree: node 0 root, 1-2 children of 0, 3 child of 1, 4 child of 3, 5 child of 2, 6 child of 0.
    const std::int32_t parent[] = {-1, 0, 0, 1, 3, 2, 0};
    std::vector<std::uint64_t> mask(static_cast<std::size_t>(n_q));
    for (std::int64_t i = 0; i < n_q; ++i)
      for (std::int32_t j = static_cast<std::int32_t>(i); j >= 0; j = parent[j])
        mask[static_cast<std::size_t>(i)] |= 1ull << j;
    for (bool tree : {false, true}) {
      CAPTURE(n_prefix);
      CAPTURE(tree);
      const auto q = randn(static_cast<std::size_t>(n_q * heads * hd), 43);
      std::vector<float> a(q.size()), b(q.size());
      const std::uint64_t* m = tree ? mask.data() : nullptr;
      cpu_backend().attention(q.data(), n_q, heads, kv_heads, hd, k_pool.data(), v_pool.data(), n_pages, pages.data(),
                              page, n_prefix, m, scale, a.data());
      gpu->attention(q.data(), n_q, heads, kv_heads, hd, k_pool.data(), v_pool.data(), n_pages, pages.data(), page,
                     n_prefix, m, scale, b.data());
      CHECK(worst_ratio(a, b, 1e-5, 1e-4) <= 1.0);
    }
  }
}

TEST_CASE("CUDA parity: greedy argmax (ties to the lowest id) and temperature softmax") {
  const Backend* gpu = gpu_or_skip("sampling");
  if (!gpu) return;
  const std::int64_t rows = 5, vocab = 49152;
  auto logits = randn(static_cast<std::size_t>(rows * vocab), 47, 4.0f);
  logits[2 * vocab + 100] = logits[2 * vocab + 40000] = 1e3f;  // a tie: id 100 wins
  std::vector<std::int32_t> a(rows), b(rows);
  cpu_backend().argmax_rows(logits.data(), rows, vocab, a.data());
  gpu->argmax_rows(logits.data(), rows, vocab, b.data());
  CHECK(a == b);
  CHECK(b[2] == 100);
  std::vector<float> pa(logits.size()), pb(logits.size());
  cpu_backend().softmax_temperature(logits.data(), rows, vocab, 0.7f, pa.data());
  gpu->softmax_temperature(logits.data(), rows, vocab, 0.7f, pb.data());
  CHECK(worst_ratio(pa, pb, 1e-9, 1e-5) <= 1.0);
}

TEST_CASE("CPU backend table: the host-pointer entries agree with the kernels they wrap") {
  // Runs everywhere: the CPU table is what the CUDA parity tests compare against.
  const Packed m = random_matrix(WeightType::Q4_1, 8, 64, 3);
  const std::vector<std::int32_t> tok = {5};
  std::vector<float> row(64), x(64, 0.0f), y(8);
  cpu_backend().embedding_rows(m.w, tok.data(), 1, row.data());
  x[10] = 1.0f;  // y = W[:, 10]
  cpu_backend().matmul(m.w, x.data(), 1, y.data());
  std::vector<float> col(8);
  for (std::int64_t o = 0; o < 8; ++o) {
    std::vector<float> r(64);
    weight_row(m.w, o, r.data());
    col[static_cast<std::size_t>(o)] = r[10];
  }
  CHECK(y == col);
  std::vector<float> logits = {0.5f, 2.0f, 2.0f, -1.0f};
  std::int32_t id = -1;
  cpu_backend().argmax_rows(logits.data(), 1, 4, &id);
  CHECK(id == 1);
  std::vector<float> p(4);
  cpu_backend().softmax_temperature(logits.data(), 1, 4, 1.0f, p.data());
  CHECK(p[1] == doctest::Approx(p[2]));
  CHECK(p[0] + p[1] + p[2] + p[3] == doctest::Approx(1.0));
  CHECK(row.size() == 64);
}

#ifdef SPECACTOR_HAVE_CUDA
#include "kernels/cuda/device_model.hpp"
#endif

TEST_CASE("NCCL communicator: all-reduce of device buffers and broadcast over every device present") {
#ifndef SPECACTOR_HAVE_CUDA
  SKIP_CASE("built without CUDA", "NCCL communicator");
#else
  if (!gpu_or_skip("NCCL communicator")) return;
  const int n = probe_devices().device_count;
  auto group = cuda::make_nccl_group(n);
  REQUIRE(static_cast<int>(group.size()) == n);
  CHECK(group[0]->device_memory());
  // One thread per rank (NCCL collectives of a group must be issued concurrently).
  std::vector<std::vector<float> > got(static_cast<std::size_t>(n));
  std::vector<std::vector<std::int32_t> > bc(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      got[static_cast<std::size_t>(r)] = cuda::test_all_reduce(*group[static_cast<std::size_t>(r)], 1000, r);
      bc[static_cast<std::size_t>(r)] = {r == 0 ? 7 : -1, r == 0 ? 11 : -1};
      group[static_cast<std::size_t>(r)]->broadcast(bc[static_cast<std::size_t>(r)].data(), 2, 0);
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    // Rank r contributed (r + 1) · i at element i: the sum is i · n(n+1)/2 everywhere.
    for (int i = 0; i < 1000; i += 111)
      CHECK(got[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)] == doctest::Approx(i * n * (n + 1) / 2.0));
    CHECK(bc[static_cast<std::size_t>(r)] == std::vector<std::int32_t>{7, 11});
  }
  MESSAGE("NCCL group of " << n << " device(s) checked");
#endif
}
