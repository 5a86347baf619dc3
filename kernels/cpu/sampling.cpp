#include "kernels/cpu/sampling.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "kernels/cpu/ops.hpp"

namespace specactor::kernels {

namespace {
std::uint64_t splitmix64(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

Rng::Rng(std::uint64_t seed) {
  for (auto& s : s_) s = splitmix64(seed);
}

std::uint64_t Rng::next() {
  const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const std::uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

std::int32_t argmax(const float* logits, std::int64_t n) {
  std::int64_t best = 0;
  for (std::int64_t i = 1; i < n; ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<std::int32_t>(best);
}

void sampling_probs(const float* logits, std::int64_t n, const SamplingParams& p, std::vector<float>& probs) {
  probs.assign(static_cast<std::size_t>(n), 0.0f);
  if (p.greedy()) {
    probs[static_cast<std::size_t>(argmax(logits, n))] = 1.0f;
    return;
  }
  // The kept set is a prefix of the ids ordered by logit (descending, ties by id).
  auto by_logit = [&](std::int32_t a, std::int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  const double inv_t = 1.0 / p.temperature;
  std::vector<std::int32_t> ids;
  std::vector<double> w;  // w[i]: the weight of ids[i]
  double sum = 0.0;       // the softmax denominator over every candidate (all n without top-k)
  if (p.top_k > 0 && p.top_k < n) {
    ids.resize(static_cast<std::size_t>(n));
    std::iota(ids.begin(), ids.end(), 0);
    const auto keep = static_cast<std::size_t>(p.top_k);
    std::partial_sort(ids.begin(), ids.begin() + static_cast<long>(keep), ids.end(), by_logit);
    ids.resize(keep);
    const double mx = logits[ids[0]];
    w.resize(keep);
    for (std::size_t i = 0; i < keep; ++i) sum += (w[i] = std::exp((logits[ids[i]] - mx) * inv_t));
  } else {
    // No sort of the whole vocabulary: every weight once, then only the ids that can be kept, sorted.
    // The weights in float through the vectorized exp (a sampled token paid ~0.25 ms for 49,152
    // double-precision exps); their sum in double.
    const float mx = logits[argmax(logits, n)];
    const auto inv_tf = static_cast<float>(inv_t);
    std::vector<float> all(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) all[static_cast<std::size_t>(i)] = (logits[i] - mx) * inv_tf;
    exp_approx_many(all.data(), n, all.data(), true);
    double part[8] = {};  // eight running sums: one chain of dependent adds cost ~5 cycles a token
    std::int64_t i8 = 0;
    for (; i8 + 8 <= n; i8 += 8)
      for (int l = 0; l < 8; ++l) part[l] += all[static_cast<std::size_t>(i8 + l)];
    for (; i8 < n; ++i8) part[0] += all[static_cast<std::size_t>(i8)];
    sum = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
    if (p.top_p >= 1.0f && p.min_p <= 0.0f) {  // everything is kept: no order needed
      for (std::int64_t i = 0; i < n; ++i)
        probs[static_cast<std::size_t>(i)] = static_cast<float>(all[static_cast<std::size_t>(i)] / sum);
      return;
    }
    // Candidates are the ids whose weight reaches a floor (the top weight is exp(0) = 1), a prefix of
    // the order: with min-p, its own floor (what min-p keeps; the top-p prefix is cut to it anyway);
    // for top-p alone, one low enough that the candidates' mass reaches top_p, lowered until it does.
    const bool min_p_floor = p.min_p > 0.0f;
    double floor = min_p_floor ? static_cast<double>(p.min_p) : 1e-4;
    for (;;) {
      // Every id whose logit reaches the lowest logit above the floor: a prefix of the order even
      // where the float exp is not strictly monotonic.
      float lowest = INFINITY;
      for (std::int64_t i = 0; i < n; ++i)
        if (all[static_cast<std::size_t>(i)] >= floor) lowest = std::min(lowest, logits[i]);
      ids.clear();
      double mass = 0.0;
      for (std::int64_t i = 0; i < n; ++i)
        if (logits[i] >= lowest) {
          ids.push_back(static_cast<std::int32_t>(i));
          mass += all[static_cast<std::size_t>(i)];
        }
      // A margin over top_p: the prefix scan below sums in another order. Floor 0 takes everything.
      if (min_p_floor || floor == 0.0 || mass / sum >= static_cast<double>(p.top_p) + 1e-9) break;
      floor = floor > 1e-30 ? floor * 1e-4 : 0.0;
    }
    std::sort(ids.begin(), ids.end(), by_logit);
    w.resize(ids.size());
    for (std::size_t i = 0; i < ids.size(); ++i) w[i] = all[static_cast<std::size_t>(ids[i])];
  }
  std::size_t keep = ids.size();
  // top-p: smallest prefix whose mass reaches top_p.
  if (p.top_p < 1.0f) {
    double acc = 0.0;
    for (std::size_t i = 0; i < keep; ++i) {
      acc += w[i] / sum;
      if (acc >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  // min-p: drop candidates below min_p × the top probability.
  if (p.min_p > 0.0f) {
    const double floor = p.min_p * w[0];
    std::size_t k = 1;
    while (k < keep && w[k] >= floor) ++k;
    keep = k;
  }
  double kept = 0.0;
  for (std::size_t i = 0; i < keep; ++i) kept += w[i];
  for (std::size_t i = 0; i < keep; ++i) probs[static_cast<std::size_t>(ids[i])] = static_cast<float>(w[i] / kept);
}

std::int32_t sample_from_probs(const std::vector<float>& probs, double u) {
  double acc = 0.0;
  std::int32_t last = -1;
  for (std::size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0.0f) continue;
    acc += probs[i];
    last = static_cast<std::int32_t>(i);
    if (u < acc) return last;
  }
  return last;  // rounding left u above the total: the last kept token
}

std::int32_t sample(const float* logits, std::int64_t n, const SamplingParams& p, Rng& rng) {
  if (p.greedy()) return argmax(logits, n);
  std::vector<float> probs;
  sampling_probs(logits, n, p, probs);
  return sample_from_probs(probs, rng.uniform());
}

void RuleHistory::add_prompt(const std::int32_t* ids, std::size_t n) {
  prompt_.insert(prompt_.end(), ids, ids + n);
  std::sort(prompt_.begin(), prompt_.end());
  prompt_.erase(std::unique(prompt_.begin(), prompt_.end()), prompt_.end());
}

void RuleHistory::add_output(const std::int32_t* ids, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    auto it = std::lower_bound(out_.begin(), out_.end(), std::make_pair(ids[i], std::int32_t{0}));
    if (it != out_.end() && it->first == ids[i])
      ++it->second;
    else
      out_.insert(it, {ids[i], 1});
  }
  out_len_ += static_cast<std::int64_t>(n);
}

void RuleHistory::apply(const LogitRules& rules, const std::int32_t* path, std::size_t path_len, float* logits,
                        std::int64_t vocab) const {
  auto valid = [&](std::int32_t t) { return t >= 0 && t < vocab; };
  if (out_len_ + static_cast<std::int64_t>(path_len) < rules.min_tokens)
    for (const std::int32_t t : rules.end_ids)
      if (valid(t)) logits[t] = -std::numeric_limits<float>::infinity();
  for (std::size_t i = 0; i < rules.bias_ids.size() && i < rules.bias_values.size(); ++i)
    if (valid(rules.bias_ids[i])) logits[rules.bias_ids[i]] += rules.bias_values[i];
  const bool rep = rules.repetition_penalty != 1.0f,
             out = rules.frequency_penalty != 0.0f || rules.presence_penalty != 0.0f;
  if (!rep && !out) return;
  // The output's counts with the path's tokens added (each token handled once).
  std::vector<std::pair<std::int32_t, std::int32_t>> counts = out_;
  if (path_len > 0) {
    std::vector<std::int32_t> extra(path, path + path_len);
    std::sort(extra.begin(), extra.end());
    for (std::size_t i = 0; i < extra.size();) {
      std::size_t j = i;
      while (j < extra.size() && extra[j] == extra[i]) ++j;
      auto it = std::lower_bound(counts.begin(), counts.end(), std::make_pair(extra[i], std::int32_t{0}));
      if (it != counts.end() && it->first == extra[i])
        it->second += static_cast<std::int32_t>(j - i);
      else
        counts.insert(it, {extra[i], static_cast<std::int32_t>(j - i)});
      i = j;
    }
  }
  auto repeat = [&](float& l) { l = l > 0.0f ? l / rules.repetition_penalty : l * rules.repetition_penalty; };
  for (const auto& [t, c] : counts) {
    if (!valid(t)) continue;
    float& l = logits[t];
    if (rep) repeat(l);
    if (out) {
      l -= rules.frequency_penalty * static_cast<float>(c);
      l -= rules.presence_penalty;
    }
  }
  if (rep)  // prompt tokens the output does not hold (those were penalised above)
    for (const std::int32_t t : prompt_)
      if (valid(t) && !std::binary_search(counts.begin(), counts.end(), std::make_pair(t, std::int32_t{0}),
                                          [](const auto& a, const auto& b) { return a.first < b.first; }))
        repeat(logits[t]);
}

TokenLogprob token_logprob(const float* logits, std::int64_t n, float temperature, std::int32_t token, int top_n) {
  const double inv_t = temperature > 0.0f ? 1.0 / static_cast<double>(temperature) : 1.0;
  double mx = -std::numeric_limits<double>::infinity();
  for (std::int64_t i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(logits[i]) * inv_t);
  double sum = 0.0;
  for (std::int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(logits[i]) * inv_t - mx);
  const double lse = mx + std::log(sum);
  auto lp = [&](std::int32_t id) { return static_cast<float>(static_cast<double>(logits[id]) * inv_t - lse); };
  TokenLogprob out;
  out.token = token;
  out.logprob = token >= 0 && token < n ? lp(token) : -std::numeric_limits<float>::infinity();
  const auto k = static_cast<std::size_t>(std::clamp<std::int64_t>(top_n, 0, n));
  if (k == 0) return out;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(n));
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + static_cast<long>(k), ids.end(), [&](std::int32_t a, std::int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  for (std::size_t i = 0; i < k; ++i) {
    out.top_ids.push_back(ids[i]);
    out.top_logprobs.push_back(lp(ids[i]));
  }
  return out;
}

double position_coin(std::uint64_t seed, std::int64_t position) {
  std::uint64_t x = seed ^ (static_cast<std::uint64_t>(position) * 0xd1342543de82ef95ULL);
  splitmix64(x);
  return static_cast<double>(splitmix64(x) >> 11) * 0x1.0p-53;
}

std::int32_t sample_at(const float* logits, std::int64_t n, const SamplingParams& p, std::uint64_t seed,
                       std::int64_t position) {
  if (p.greedy()) return argmax(logits, n);
  std::vector<float> probs;
  sampling_probs(logits, n, p, probs);
  return sample_from_probs(probs, position_coin(seed, position));
}

}  // namespace specactor::kernels
