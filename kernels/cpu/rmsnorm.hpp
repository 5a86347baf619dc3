// kernels/cpu/rmsnorm.hpp — RMSNorm on the CPU (reference order: one pass for the sum of squares).
#pragma once

namespace specactor::kernels {

// x, out: (rows, dim) row-major; weight: (dim). out may alias x.
void rmsnorm_cpu(float* out, const float* x, const float* weight, int rows, int dim, float eps);

}  // namespace specactor::kernels
