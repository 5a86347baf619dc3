#include "kernels/cpu/machine.hpp"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>

#include "kernels/cpu/matmul.hpp"

namespace specactor::kernels {

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// One thread's share [b, e) of the read (a separate function: the OpenMP region clang outlines
// does not inherit a target attribute).
__attribute__((target("avx2"))) float read_range(const float* p, std::size_t b, std::size_t e) {
  __m256 a = _mm256_setzero_ps(), x = a, c = a, d = a;
  for (std::size_t i = b; i < e; i += 32) {
    a = _mm256_add_ps(a, _mm256_load_ps(p + i));
    x = _mm256_add_ps(x, _mm256_load_ps(p + i + 8));
    c = _mm256_add_ps(c, _mm256_load_ps(p + i + 16));
    d = _mm256_add_ps(d, _mm256_load_ps(p + i + 24));
  }
  alignas(32) float o[8];
  _mm256_store_ps(o, _mm256_add_ps(_mm256_add_ps(a, x), _mm256_add_ps(c, d)));
  float total = 0;
  for (float v : o) total += v;
  return total;
}

float read_pass(const float* p, std::size_t n) {
  float total = 0;
  const std::size_t blocks = n / 32;
#pragma omp parallel reduction(+ : total)
  {
    const std::size_t t = static_cast<std::size_t>(omp_get_thread_num()),
                      nt = static_cast<std::size_t>(omp_get_num_threads());
    total += read_range(p, blocks * t / nt * 32, blocks * (t + 1) / nt * 32);
  }
  return total;
}

float read_pass_scalar(const float* p, std::size_t n) {
  float total = 0;
#pragma omp parallel for reduction(+ : total) schedule(static)
  for (std::size_t i = 0; i < n; i += 16) total += p[i];
  return total;
}

__attribute__((target("avx512f"))) double fma_chains_512(long n) {
  __m512 a[8];
  for (int i = 0; i < 8; ++i) a[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512 b = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(0.001f);
  for (long k = 0; k < n; ++k)
    for (int i = 0; i < 8; ++i) a[i] = _mm512_fmadd_ps(a[i], b, c);
  __m512 s = a[0];
  for (int i = 1; i < 8; ++i) s = _mm512_add_ps(s, a[i]);
  return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) double fma_chains_256(long n) {
  __m256 a[8];
  for (int i = 0; i < 8; ++i) a[i] = _mm256_set1_ps(static_cast<float>(i));
  const __m256 b = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(0.001f);
  for (long k = 0; k < n; ++k)
    for (int i = 0; i < 8; ++i) a[i] = _mm256_fmadd_ps(a[i], b, c);
  alignas(32) float o[8];
  __m256 s = a[0];
  for (int i = 1; i < 8; ++i) s = _mm256_add_ps(s, a[i]);
  _mm256_store_ps(o, s);
  return o[0];
}

}  // namespace

MemoryBandwidth measure_memory_bandwidth(std::size_t bytes, int repeats) {
  MemoryBandwidth r;
  const std::size_t n = bytes / sizeof(float) / 64 * 64;
  r.bytes = n * sizeof(float);
  auto* src = static_cast<float*>(std::aligned_alloc(64, r.bytes));
  auto* dst = static_cast<float*>(std::aligned_alloc(64, r.bytes));
  if (!src || !dst) {
    std::free(src);
    std::free(dst);
    return r;
  }
#pragma omp parallel for schedule(static)
  for (std::size_t i = 0; i < n; ++i) src[i] = dst[i] = 1.0f;  // fault the pages in on their threads
  volatile float sink = 0;
  const bool simd = cpu_path() != CpuPath::Scalar;
  double best_read = 1e30, best_copy = 1e30;
  for (int k = 0; k < repeats; ++k) {
    auto t0 = Clock::now();
    sink = sink + (simd ? read_pass(src, n) : read_pass_scalar(src, n));
    best_read = std::min(best_read, seconds(t0));
    t0 = Clock::now();
#pragma omp parallel
    {
      const int nth = omp_get_num_threads(), tid = omp_get_thread_num();
      const std::size_t b = n * tid / nth, e = n * (tid + 1) / nth;
      std::memcpy(dst + b, src + b, (e - b) * sizeof(float));
    }
    best_copy = std::min(best_copy, seconds(t0));
  }
  r.read_gbps = r.bytes / best_read / 1e9;
  r.copy_gbps = 2.0 * r.bytes / best_copy / 1e9;
  std::free(src);
  std::free(dst);
  return r;
}

double measure_peak_gflops(double secs) {
  const CpuPath path = cpu_path();
  if (path == CpuPath::Scalar) return 0;
  const int lanes = path == CpuPath::Avx512 ? 16 : 8;
  const long n = 1 << 20;
  double flops = 0, elapsed = 0;
  volatile double sink = 0;
  const auto t0 = Clock::now();
  int rounds = 0;
  while ((elapsed = seconds(t0)) < secs || rounds == 0) {
    double local = 0;
#pragma omp parallel reduction(+ : local)
    local += path == CpuPath::Avx512 ? fma_chains_512(n) : fma_chains_256(n);
    sink = sink + local;
    flops += 2.0 * 8 * lanes * static_cast<double>(n) * omp_get_max_threads();
    ++rounds;
  }
  return flops / seconds(t0) / 1e9;
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon == std::string::npos) return {};
      const auto start = line.find_first_not_of(" \t", colon + 1);
      return start == std::string::npos ? std::string() : line.substr(start);
    }
  return {};
}

}  // namespace specactor::kernels
