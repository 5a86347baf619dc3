// kernels/cpu/sampling.hpp — turning logits into a token: greedy, temperature, top-k, top-p, min-p,
// with a seeded generator so a (seed, logits) pair always gives the same token.
#pragma once

#include <cstdint>
#include <vector>

namespace specactor::kernels {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy
  std::int32_t top_k = 0;    // 0 = off
  float top_p = 1.0f;        // 1 = off
  float min_p = 0.0f;        // 0 = off
  bool greedy() const { return temperature <= 0.0f; }
};

// xoshiro256** seeded through splitmix64: small, fast, identical on every platform.
class Rng {
 public:
  explicit Rng(std::uint64_t seed = 0);
  std::uint64_t next();
  double uniform();  // [0, 1)
 private:
  std::uint64_t s_[4];
};

// argmax; ties go to the lowest id.
std::int32_t argmax(const float* logits, std::int64_t n);

// The distribution sampling draws from after temperature / top-k / top-p / min-p (zeros outside the
// kept set), normalised. Greedy params give a one-hot at argmax.
void sampling_probs(const float* logits, std::int64_t n, const SamplingParams& p, std::vector<float>& probs);

// Draws one token from `probs` with coin u in [0, 1) (inverse CDF in id order).
std::int32_t sample_from_probs(const std::vector<float>& probs, double u);

std::int32_t sample(const float* logits, std::int64_t n, const SamplingParams& p, Rng& rng);

}  // namespace specactor::kernels
