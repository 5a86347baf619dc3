// kernels/cuda/probe.cu — device probe: CUDA runtime device count/name and the NCCL version.
#include <cuda_runtime.h>
#include <nccl.h>

#include "kernels/cuda/cuda_api.hpp"

namespace specactor::kernels::cuda {

ProbeResult probe() {
  ProbeResult r;
  cudaRuntimeGetVersion(&r.runtime_version);
  ncclGetVersion(&r.nccl_version);
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    r.error = std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
    cudaGetLastError();  // clear the sticky error
    return r;
  }
  r.device_count = n;
  if (n > 0) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) r.device_name = prop.name;
  }
  return r;
}

}  // namespace specactor::kernels::cuda
