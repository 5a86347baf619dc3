// tests/test_verify.cpp — model::verify_step without an actor system: greedy chains and trees and
// their compaction plans, plain decoding, lossless sampling (the first emitted token follows the
// target distribution whatever the draft), chain rejection sampling with q, and backend parity.
#include <doctest/doctest.h>

#include <array>
#include <cmath>

#include "model/verify.hpp"
#include "tests/support/skip.hpp"

using namespace specactor;
using model::Verdict;
using model::VerifyItem;

namespace {

constexpr std::int64_t V = 6;

// Logits rows whose argmax is `best[i]` (the best token 4 above the rest).
std::vector<float> peaked(const std::vector<std::int32_t>& best) {
  std::vector<float> l(best.size() * V, 0.0f);
  for (std::size_t i = 0; i < best.size(); ++i) l[i * V + static_cast<std::size_t>(best[i])] = 4.0f;
  return l;
}

Verdict run(const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& parents,
            const std::vector<float>& logits, const kernels::SamplingParams& params, kernels::Rng& rng,
            const std::vector<float>& q = {}, const kernels::Backend& backend = kernels::cpu_backend()) {
  const VerifyItem it{tokens, parents, q, params, rng.next(), 10};  // a fresh seed per call: independent draws
  const kernels::Tree tree = tokens.size() > 1 ? model::item_tree(it, 10) : kernels::Tree{};
  return model::verify_step(it, tree, logits.data(), V, rng, backend);
}

}  // namespace

TEST_CASE("verify_step greedy: a chain accepts its matching prefix and adds the target's token") {
  kernels::Rng rng(1);
  const kernels::SamplingParams greedy;
  // Root 0, drafts 1 2 3; the target predicts 1 after the root, 2 after 1, 5 after 2.
  const Verdict v = run({0, 1, 2, 3}, {}, peaked({1, 2, 5, 0}), greedy, rng);
  CHECK(v.drafted == 3);
  CHECK(v.accepted == 2);
  CHECK(v.tokens == std::vector<std::int32_t>{1, 2, 5});
  CHECK(v.path == std::vector<std::int32_t>{0, 1, 2});
  CHECK(v.in_place());
  // Nothing matches: only the target's token.
  const Verdict none = run({0, 3, 3}, {}, peaked({4, 4, 4}), greedy, rng);
  CHECK(none.accepted == 0);
  CHECK(none.tokens == std::vector<std::int32_t>{4});
  CHECK(none.path == std::vector<std::int32_t>{0});
  // Plain decoding (no drafts).
  const Verdict plain = run({0}, {}, peaked({3}), greedy, rng);
  CHECK(plain.tokens == std::vector<std::int32_t>{3});
  CHECK(plain.drafted == 0);
  CHECK(plain.path == std::vector<std::int32_t>{0});
}

TEST_CASE("verify_step greedy: a tree follows the target's branch, the plan moves its rows forward") {
  kernels::Rng rng(1);
  // Nodes: 0 root, 1 = token 1 (child of root), 2 = token 2 (child of root), 3 = token 3 (child of 2).
  // The target predicts 2 after the root, 3 after node 2, 5 after node 3 (row 1's prediction is unused).
  const Verdict v = run({0, 1, 2, 3}, {-1, -1, 1}, peaked({2, 0, 3, 5}), {}, rng);
  CHECK(v.accepted == 2);
  CHECK(v.tokens == std::vector<std::int32_t>{2, 3, 5});
  CHECK(v.path == std::vector<std::int32_t>{0, 2, 3});
  CHECK(!v.in_place());
  for (std::size_t j = 0; j < v.path.size(); ++j) CHECK(v.path[j] >= static_cast<std::int32_t>(j));
}

TEST_CASE("verify_step sampling: the first emitted token follows the target distribution, whatever the draft") {
  // Target p over 6 tokens (temperature 1); a draft that always proposes token 0 (tree sampling, no q),
  // and a chain drafted from a q unlike p (rejection sampling). Both must emit token t with p(t).
  const std::vector<float> row = {1.0f, 0.2f, -0.5f, 0.7f, -1.0f, 0.0f};
  std::array<double, V> p{};
  double z = 0;
  for (std::int64_t t = 0; t < V; ++t) z += std::exp(row[static_cast<std::size_t>(t)]);
  for (std::int64_t t = 0; t < V; ++t) p[static_cast<std::size_t>(t)] = std::exp(row[static_cast<std::size_t>(t)]) / z;
  std::vector<float> logits;
  for (int r = 0; r < 3; ++r) logits.insert(logits.end(), row.begin(), row.end());
  kernels::SamplingParams params;
  params.temperature = 1.0f;
  const std::vector<float> q_row = {0.05f, 0.05f, 0.6f, 0.1f, 0.1f, 0.1f};
  std::vector<float> q;
  for (int r = 0; r < 2; ++r) q.insert(q.end(), q_row.begin(), q_row.end());

  const int trials = 20000;
  std::array<int, V> tree_hist{}, chain_hist{};
  kernels::Rng rng(7), draft_rng(11);
  for (int i = 0; i < trials; ++i) {
    ++tree_hist[static_cast<std::size_t>(run({3, 0, 0}, {}, logits, params, rng).tokens[0])];
    // Draft two tokens from q.
    std::vector<std::int32_t> chain = {3};
    for (int d = 0; d < 2; ++d)
      chain.push_back(kernels::sample_distribution(q_row.data(), V, static_cast<float>(draft_rng.uniform())));
    const Verdict v = run(chain, {}, logits, params, rng, q);
    CHECK(v.path.size() == v.tokens.size());
    ++chain_hist[static_cast<std::size_t>(v.tokens[0])];
  }
  for (std::size_t t = 0; t < V; ++t) {
    CHECK(tree_hist[t] / static_cast<double>(trials) == doctest::Approx(p[t]).epsilon(0.012));
    CHECK(chain_hist[t] / static_cast<double>(trials) == doctest::Approx(p[t]).epsilon(0.012));
  }
}

TEST_CASE("verify_step chain rejection: q equal to p accepts every draft, the same seed gives the same verdict") {
  const std::vector<float> row = {0.3f, 0.1f, 2.0f, -1.0f, 0.0f, 0.5f};
  std::vector<float> logits, q;
  for (int r = 0; r < 4; ++r) logits.insert(logits.end(), row.begin(), row.end());
  kernels::SamplingParams params;
  params.temperature = 1.0f;
  std::vector<float> p_row;
  kernels::sampling_probs(row.data(), V, params, p_row);
  for (int r = 0; r < 3; ++r) q.insert(q.end(), p_row.begin(), p_row.end());
  kernels::Rng a(5), b(5);
  for (int i = 0; i < 200; ++i) {
    const Verdict va = run({1, 2, 0, 5}, {}, logits, params, a, q);
    const Verdict vb = run({1, 2, 0, 5}, {}, logits, params, b, q);
    CHECK(va.accepted == 3);
    CHECK(va.tokens.size() == 4);
    CHECK(va.tokens == vb.tokens);
  }
}

TEST_CASE("verify_step: the CUDA backend's verdicts equal the CPU's") {
  const kernels::Backend* cuda = kernels::cuda_backend();
  if (!cuda) {
    SKIP_CASE("no CUDA device", "verify_step CUDA parity: " << kernels::probe_devices().reason);
  }
  kernels::SamplingParams greedy, sampled;
  sampled.temperature = 0.8f;
  const std::vector<float> logits = peaked({2, 0, 3, 5});
  std::vector<float> q(3 * V, 1.0f / V);
  for (const auto* params : {&greedy, &sampled}) {
    kernels::Rng r1(3), r2(3);
    for (int i = 0; i < 50; ++i) {
      const Verdict c = run({0, 1, 2, 3}, {-1, -1, 1}, logits, *params, r1);
      const Verdict g = run({0, 1, 2, 3}, {-1, -1, 1}, logits, *params, r2, {}, *cuda);
      CHECK(c.tokens == g.tokens);
      CHECK(c.path == g.path);
      const Verdict cc = run({0, 1, 2, 3}, {}, logits, *params, r1, q);
      const Verdict gc = run({0, 1, 2, 3}, {}, logits, *params, r2, q, *cuda);
      CHECK(cc.tokens == gc.tokens);
    }
  }
}

TEST_CASE("logit rules: min_tokens, logit_bias, repetition, frequency and presence, each as defined") {
  using kernels::LogitRules;
  using kernels::RuleHistory;
  const std::int64_t V = 8;
  const std::vector<float> base = {2.0f, -1.0f, 0.5f, 3.0f, -2.0f, 1.0f, 0.0f, 4.0f};
  RuleHistory h;
  const std::int32_t prompt[] = {1, 2, 2};
  h.add_prompt(prompt, 3);
  const std::int32_t out[] = {3, 5, 3};  // 3 twice, 5 once
  h.add_output(out, 3);
  CHECK(h.output_length() == 3);
  auto ruled = [&](const LogitRules& r, std::vector<std::int32_t> path = {}) {
    std::vector<float> l = base;
    h.apply(r, path.data(), path.size(), l.data(), V);
    return l;
  };
  LogitRules none;
  CHECK_FALSE(none.active());
  CHECK(ruled(none) == base);
  // min_tokens: the end ids are -inf while the output (with the path) is shorter.
  LogitRules mt;
  mt.min_tokens = 5;
  mt.end_ids = {7};
  CHECK(std::isinf(ruled(mt)[7]));
  CHECK(ruled(mt)[6] == 0.0f);
  CHECK(std::isinf(ruled(mt, {4})[7]));  // 4 tokens
  CHECK(ruled(mt, {4, 6})[7] == 4.0f);   // 5: free again
  // logit_bias adds.
  LogitRules lb;
  lb.bias_ids = {0, 6};
  lb.bias_values = {-100.0f, 2.5f};
  auto l = ruled(lb);
  CHECK(l[0] == 2.0f - 100.0f);
  CHECK(l[6] == 2.5f);
  CHECK(l[1] == -1.0f);
  // Repetition: prompt and output tokens; positive logits divided, negative multiplied.
  LogitRules rp;
  rp.repetition_penalty = 2.0f;
  l = ruled(rp);
  CHECK(l[1] == -2.0f);  // prompt, negative
  CHECK(l[2] == 0.25f);  // prompt (twice: once)
  CHECK(l[3] == 1.5f);   // output
  CHECK(l[5] == 0.5f);
  CHECK(l[0] == 2.0f);  // neither
  CHECK(l[7] == 4.0f);
  CHECK(ruled(rp, {7})[7] == 2.0f);  // a draft on the path counts as output
  // Frequency and presence: output tokens only (the prompt's 1 and 2 untouched), by count.
  LogitRules fp;
  fp.frequency_penalty = 0.5f;
  fp.presence_penalty = 0.25f;
  l = ruled(fp);
  CHECK(l[3] == 3.0f - 0.5f * 2 - 0.25f);
  CHECK(l[5] == 1.0f - 0.5f - 0.25f);
  CHECK(l[1] == -1.0f);
  CHECK(l[2] == 0.5f);
  l = ruled(fp, {3, 0});
  CHECK(l[3] == 3.0f - 0.5f * 3 - 0.25f);
  CHECK(l[0] == 2.0f - 0.5f - 0.25f);
  // Ids outside the vocabulary are ignored, not written.
  LogitRules odd;
  odd.bias_ids = {9};
  odd.bias_values = {1.0f};
  CHECK(ruled(odd) == base);
}

TEST_CASE("token_logprob: log-softmax at the request's temperature, the top ids by logit with ties to the lower id") {
  const std::vector<float> l = {1.0f, 3.0f, 3.0f, -2.0f, 0.5f};
  for (const float t : {0.0f, 0.7f}) {
    const double inv = t > 0 ? 1.0 / t : 1.0;
    double sum = 0;
    for (float v : l) sum += std::exp(v * inv);
    const auto lp = kernels::token_logprob(l.data(), 5, t, 4, 3);
    CHECK(lp.token == 4);
    CHECK(std::abs(lp.logprob - (0.5 * inv - std::log(sum))) < 1e-5);
    REQUIRE(lp.top_ids == std::vector<std::int32_t>{1, 2, 0});
    CHECK(lp.top_logprobs[0] == lp.top_logprobs[1]);
    CHECK(std::abs(lp.top_logprobs[2] - (1.0 * inv - std::log(sum))) < 1e-5);
  }
  CHECK(kernels::token_logprob(l.data(), 5, 0.0f, 1, 0).top_ids.empty());
}

TEST_CASE(
    "verify_step sampling is coupled to plain sampling: a seeded request emits plain's tokens, whatever the draft") {
  // Every node's row is the same distribution, so plain sampling's token at index i is
  // sample_at(row, seed, i) whatever came before. A verdict must emit exactly those tokens.
  const std::vector<float> row = {0.3f, 1.1f, -0.4f, 0.9f, 0.0f, 0.6f};
  kernels::SamplingParams params;
  params.temperature = 1.0f;
  kernels::Rng rng(5);
  int accepted = 0;
  for (std::uint64_t seed = 1; seed <= 300; ++seed) {
    std::vector<std::int32_t> plain;
    for (std::int64_t i = 11; i < 16; ++i) plain.push_back(kernels::sample_at(row.data(), V, params, seed, i));
    // A tree: two children of the root (one of them plain's first token when seed is even), a chain below.
    constexpr std::int32_t nv = V;
    const std::int32_t first = seed % 2 == 0 ? plain[0] : (plain[0] + 1) % nv;
    const std::vector<std::int32_t> tokens = {3, (first + 2) % nv, first, plain[1], (plain[2] + 3) % nv};
    const std::vector<std::int32_t> parents = {-1, -1, 1, 2};
    std::vector<float> logits;
    for (std::size_t r = 0; r < tokens.size(); ++r) logits.insert(logits.end(), row.begin(), row.end());
    const VerifyItem it{tokens, parents, {}, params, seed, 10};
    const Verdict v = model::verify_step(it, model::item_tree(it, 10), logits.data(), V, rng, kernels::cpu_backend());
    REQUIRE(v.tokens.size() >= 1);
    for (std::size_t j = 0; j < v.tokens.size(); ++j) CHECK(v.tokens[j] == plain[j]);
    CHECK(v.path.size() == v.tokens.size());
    accepted += v.accepted;
  }
  CHECK(accepted > 100);  // the drafts that equal plain's tokens were taken
}
