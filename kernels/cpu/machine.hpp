// kernels/cpu/machine.hpp — measures this machine's limits, so benchmarks can print how far a
// kernel is from them: memory read/copy bandwidth and peak fused-multiply-add throughput.
#pragma once

#include <cstddef>
#include <string>

namespace specactor::kernels {

struct MemoryBandwidth {
  double read_gbps = 0;   // GB/s (1e9 bytes) streaming reads over all threads
  double copy_gbps = 0;   // GB/s of bytes read + written by a parallel memcpy
  std::size_t bytes = 0;  // buffer size used
};
// Best of `repeats` passes over a buffer far larger than the last-level cache.
MemoryBandwidth measure_memory_bandwidth(std::size_t bytes = std::size_t{512} << 20, int repeats = 5);

// Peak float32 FMA throughput over all threads with the widest vector unit matmul() uses
// (GFLOP/s, one FMA = 2 FLOPs), measured with independent register-resident FMA chains.
double measure_peak_gflops(double seconds = 0.3);

// The CPU's model name as /proc/cpuinfo gives it ("" when it does not).
std::string cpu_model_name();

}  // namespace specactor::kernels
