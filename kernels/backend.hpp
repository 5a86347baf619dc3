// kernels/backend.hpp — the backend table: every op as a function pointer with one signature for
// the CPU and the CUDA twin, chosen at run time by a device probe (CUDA only when it is compiled in
// and a device answers; otherwise the CPU).
#pragma once

#include <string>

namespace specactor::kernels {

struct DeviceProbe {
  bool cuda_compiled = false;  // built with kernels/cuda
  bool cuda_usable = false;    // at least one device answered
  int device_count = 0;
  std::string device_name;     // first device, when usable
  std::string reason;          // why CUDA is not usable (empty when it is)
  int cuda_runtime_version = 0;
  int nccl_version = 0;        // NCCL library version code, 0 when not compiled
};

// Probes once per process (cached); never throws.
const DeviceProbe& probe_devices();

enum class BackendKind { Cpu, Cuda };

struct Backend {
  BackendKind kind;
  const char* name;
  // out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight[:]; x, out: (rows, dim); weight: (dim).
  void (*rmsnorm)(float* out, const float* x, const float* weight, int rows, int dim, float eps);
};

const Backend& cpu_backend();
// nullptr when CUDA is not compiled in or no device is usable.
const Backend* cuda_backend();

}  // namespace specactor::kernels
