// kernels/cuda/cuda_api.hpp — the plain C++ face of kernels/cuda (no CUDA headers here, so the rest
// of the code base never sees CUDA). Compiled only when SPECACTOR_HAVE_CUDA is defined.
#pragma once

#include <string>

namespace specactor::kernels::cuda {

struct ProbeResult {
  int device_count = 0;
  std::string device_name;
  std::string error;  // non-empty when the runtime call failed (e.g. no driver)
  int runtime_version = 0;
  int nccl_version = 0;
};

// Asks the CUDA runtime for devices; never throws (a machine without a driver reports an error).
ProbeResult probe();

// Host-pointer RMSNorm: copies in, runs on the current device, copies out. Throws std::runtime_error
// on a CUDA error. Same contract as rmsnorm_cpu.
void rmsnorm_cuda(float* out, const float* x, const float* weight, int rows, int dim, float eps);

}  // namespace specactor::kernels::cuda
