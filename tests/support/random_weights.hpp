// tests/support/random_weights.hpp — random but valid weight bytes of every supported format.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/quant.hpp"

namespace specactor::testing {

// Random but valid weight bytes of `type` for an (out, in) matrix in ggml layout (scales kept finite
// and small), seeded.
std::vector<std::uint8_t> random_weights(kernels::WeightType t, std::int64_t out, std::int64_t in, std::uint32_t seed);

}  // namespace specactor::testing
