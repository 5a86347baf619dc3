// tests/test_kernels.cpp — kernel references and the CPU/CUDA twins (CUDA parity runs only where a
// device answers; elsewhere it is skipped with a visible message).
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/cpu/rmsnorm.hpp"

using namespace specactor::kernels;

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
    MESSAGE("SKIPPED: rmsnorm CUDA parity (no usable CUDA device: " << probe_devices().reason << ")");
    return;
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
