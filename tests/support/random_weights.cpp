// tests/support/random_weights.cpp — see random_weights.hpp.
#include "tests/support/random_weights.hpp"

#include <cstring>
#include <random>

namespace specactor::testing {

using namespace specactor::kernels;

std::vector<std::uint8_t> random_weights(WeightType t, std::int64_t out, std::int64_t in, std::uint32_t seed) {
  std::mt19937 rng(seed);
  const std::size_t rb = row_bytes(t, static_cast<std::size_t>(in));
  std::vector<std::uint8_t> b(rb * static_cast<std::size_t>(out));
  for (auto& x : b) x = static_cast<std::uint8_t>(rng());
  std::uniform_real_distribution<float> scale(0.001f, 0.05f), val(-1.0f, 1.0f);
  auto put_f16 = [&](std::size_t at, float v) {
    const std::uint16_t h = f32_to_f16(v);
    std::memcpy(b.data() + at, &h, 2);
  };
  const std::size_t bb = block_bytes(t);
  for (std::size_t at = 0; at < b.size(); at += bb) {
    switch (t) {
      case WeightType::F32: {
        const float v = val(rng);
        std::memcpy(b.data() + at, &v, 4);
        break;
      }
      case WeightType::F16:
        put_f16(at, val(rng));
        break;
      case WeightType::BF16: {
        float v = val(rng);
        std::uint32_t u;
        std::memcpy(&u, &v, 4);
        const std::uint16_t h = u >> 16;
        std::memcpy(b.data() + at, &h, 2);
        break;
      }
      case WeightType::Q8_0:
      case WeightType::Q4_0:
        put_f16(at, scale(rng));
        break;
      case WeightType::Q4_1:
      case WeightType::Q4_K:
        put_f16(at, scale(rng));
        put_f16(at + 2, scale(rng));
        break;
      case WeightType::Q6_K:
        put_f16(at + 208, scale(rng));
        break;
    }
  }
  return b;
}

}  // namespace specactor::testing
