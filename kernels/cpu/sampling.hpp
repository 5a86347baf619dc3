// kernels/cpu/sampling.hpp — turning logits into a token: greedy, temperature, top-k, top-p, min-p,
// with a seeded generator so a (seed, logits) pair always gives the same token.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
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

// A request's coin for the token at sequence index `position`: a hash of (seed, position), the same
// however often and in whatever order it is asked. Sampling with it (inverse CDF) makes a seeded
// request's output a function of its seed and its rows alone: the same with or without drafts, with
// any batch around it, whatever the budget decided (model/verify.cpp).
double position_coin(std::uint64_t seed, std::int64_t position);
// argmax when greedy, else the inverse-CDF draw from sampling_probs with position_coin(seed, position).
std::int32_t sample_at(const float* logits, std::int64_t n, const SamplingParams& p, std::uint64_t seed,
                       std::int64_t position);

// ---- log probabilities (the OpenAI `logprobs` fields) --------------------------------------------
//
// log p(token) under softmax(logits / T), T the request's temperature (1 when greedy), on the row after
// the request's penalties and biases; top-k, top-p and min-p do not cut it. With the top_n most likely
// ids (logit descending, ties by the lower id) and theirs. Sums in double; the same row gives the same
// bits, so speculative and plain decoding report the same numbers.
struct TokenLogprob {
  std::int32_t token = 0;
  float logprob = 0.0f;
  std::vector<std::int32_t> top_ids;
  std::vector<float> top_logprobs;
};
TokenLogprob token_logprob(const float* logits, std::int64_t n, float temperature, std::int32_t token, int top_n);

// ---- penalties and biases (the OpenAI / vLLM request fields) ---------------------------------------
//
// Applied to the target's logits row before the sampling transforms above, in this order, for a
// history of prompt tokens and output tokens (the tokens generated so far, plus — for a row that
// verifies a draft — the drafts on the path from the root to that row):
//   1. min_tokens: while the output holds fewer than min_tokens tokens, every end id is −∞;
//   2. logit_bias: bias[t] is added to logit t;
//   3. repetition_penalty r (every token of the prompt or the output): logit > 0 → logit / r, else logit · r;
//   4. frequency_penalty f and presence_penalty p (tokens of the output, c times): logit −= f·c, then −= p.
// The same history gives the same bits, so speculative and plain decoding see the same distribution.
struct LogitRules {
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  std::vector<std::int32_t> bias_ids;  // logit_bias: ids (ascending, unique) and what is added to each
  std::vector<float> bias_values;
  std::int64_t min_tokens = 0;
  std::vector<std::int32_t> end_ids;  // what min_tokens holds back (the engine sets the model's)
  bool active() const {
    return presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f || !bias_ids.empty() ||
           min_tokens > 0;
  }
  bool needs_prompt() const { return repetition_penalty != 1.0f; }
};

// What the rules of one request look at: the prompt's tokens (only kept where the repetition penalty
// needs them) and how often each output token occurred.
class RuleHistory {
 public:
  void add_prompt(const std::int32_t* ids, std::size_t n);
  void add_output(const std::int32_t* ids, std::size_t n);
  std::int64_t output_length() const { return out_len_; }
  // Applies `rules` to one logits row of `vocab` entries whose history is this one plus `path`
  // (draft tokens of the output not yet committed, any order).
  void apply(const LogitRules& rules, const std::int32_t* path, std::size_t path_len, float* logits,
             std::int64_t vocab) const;

 private:
  std::vector<std::int32_t> prompt_;                        // sorted, unique
  std::vector<std::pair<std::int32_t, std::int32_t>> out_;  // (id, count), sorted by id
  std::int64_t out_len_ = 0;
};

}  // namespace specactor::kernels
