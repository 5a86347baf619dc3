// kernels/cuda/rmsnorm.cu — host-pointer RMSNorm for the backend table: the forward's own kernel
// (ops.cu launch_rmsnorm: one block per row, double-precision sum of squares), copied in and out.
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_api.hpp"
#include "kernels/cuda/ops.cuh"

namespace specactor::kernels::cuda {

void rmsnorm_cuda(float* out, const float* x, const float* weight, int rows, int dim, float eps) {
  const size_t xbytes = sizeof(float) * static_cast<size_t>(rows) * dim;
  float *dx = nullptr, *dw = nullptr, *dy = nullptr;
  try {
    detail::check(cudaMalloc(&dx, xbytes), "malloc");
    detail::check(cudaMalloc(&dy, xbytes), "malloc");
    detail::check(cudaMalloc(&dw, sizeof(float) * dim), "malloc");
    detail::check(cudaMemcpy(dx, x, xbytes, cudaMemcpyHostToDevice), "memcpy");
    detail::check(cudaMemcpy(dw, weight, sizeof(float) * dim, cudaMemcpyHostToDevice), "memcpy");
    detail::launch_rmsnorm(dy, dx, dw, rows, dim, eps, nullptr);
    detail::check(cudaMemcpy(out, dy, xbytes, cudaMemcpyDeviceToHost), "memcpy");
  } catch (...) {
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(dw);
    throw;
  }
  cudaFree(dx);
  cudaFree(dy);
  cudaFree(dw);
}

}  // namespace specactor::kernels::cuda
