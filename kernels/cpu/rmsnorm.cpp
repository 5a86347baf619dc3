#include "kernels/cpu/rmsnorm.hpp"

#include <cmath>

namespace specactor::kernels {

void rmsnorm_cpu(float* out, const float* x, const float* weight, int rows, int dim, float eps) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<long>(r) * dim;
    float* yr = out + static_cast<long>(r) * dim;
    double ss = 0.0;  // double accumulation: the CUDA twin's tree reduction differs only by rounding
    for (int i = 0; i < dim; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float scale = static_cast<float>(1.0 / std::sqrt(ss / dim + eps));
    for (int i = 0; i < dim; ++i) yr[i] = xr[i] * scale * weight[i];
  }
}

}  // namespace specactor::kernels
