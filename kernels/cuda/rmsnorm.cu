// kernels/cuda/rmsnorm.cu — RMSNorm, one block per row, shared-memory tree reduction.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_api.hpp"

namespace specactor::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void rmsnorm_kernel(float* out, const float* x, const float* w, int dim, float eps) {
  __shared__ double partial[kThreads];
  const float* xr = x + static_cast<long>(blockIdx.x) * dim;
  float* yr = out + static_cast<long>(blockIdx.x) * dim;
  double ss = 0.0;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += static_cast<double>(xr[i]) * xr[i];
  partial[threadIdx.x] = ss;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  const float scale = static_cast<float>(1.0 / sqrt(partial[0] / dim + eps));
  for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = xr[i] * scale * w[i];
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA ") + what + ": " + cudaGetErrorString(e));
}

}  // namespace

void rmsnorm_cuda(float* out, const float* x, const float* weight, int rows, int dim, float eps) {
  const size_t xbytes = sizeof(float) * static_cast<size_t>(rows) * dim;
  float *dx = nullptr, *dw = nullptr, *dy = nullptr;
  check(cudaMalloc(&dx, xbytes), "malloc");
  check(cudaMalloc(&dy, xbytes), "malloc");
  check(cudaMalloc(&dw, sizeof(float) * dim), "malloc");
  check(cudaMemcpy(dx, x, xbytes, cudaMemcpyHostToDevice), "memcpy");
  check(cudaMemcpy(dw, weight, sizeof(float) * dim, cudaMemcpyHostToDevice), "memcpy");
  rmsnorm_kernel<<<rows, kThreads>>>(dy, dx, dw, dim, eps);
  check(cudaGetLastError(), "launch rmsnorm");
  check(cudaMemcpy(out, dy, xbytes, cudaMemcpyDeviceToHost), "memcpy");
  cudaFree(dx);
  cudaFree(dy);
  cudaFree(dw);
}

}  // namespace specactor::kernels::cuda
