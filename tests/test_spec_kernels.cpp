// tests/test_spec_kernels.cpp — draft/verify kernels against tests/data/spec_kernels.json
// (bit-exact; the contracts are docs/speculative-kernels.md), random-tree invariants, top-k expansion, and chi-square
// tests that both samplers emit the target distribution (and that deliberately wrong samplers are caught).
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "kernels/backend.hpp"
#include "kernels/cpu/sampling.hpp"
#include "kernels/spec.hpp"
#include "tests/support/skip.hpp"

using namespace specactor::kernels;
using json = nlohmann::json;

namespace {

json goldens() {
  std::ifstream in(SPECACTOR_SOURCE_DIR "/tests/data/spec_kernels.json");
  REQUIRE_MESSAGE(in, "tests/data/spec_kernels.json not found");
  return json::parse(in);
}

template <class T>
std::vector<T> flat(const json& j) {
  std::vector<T> out;
  std::function<void(const json&)> walk = [&](const json& x) {
    if (x.is_array())
      for (const auto& e : x) walk(e);
    else
      out.push_back(x.get<T>());
  };
  walk(j);
  return out;
}

// The verify goldens' target logits: 1.0 everywhere, 10.0 at the peaks, 10.0 at token 18 elsewhere.
std::vector<float> golden_logits(const json& in, std::int32_t b, std::int32_t n, std::int64_t vocab) {
  std::vector<float> logits(static_cast<std::size_t>(b * n * vocab), 1.0f);
  std::vector<bool> peaked(static_cast<std::size_t>(b * n), false);
  for (const auto& p : in["peaks"]) {
    const int r = p[0], node = p[1], tok = p[2];
    logits[static_cast<std::size_t>((r * n + node) * vocab + tok)] = 10.0f;
    peaked[static_cast<std::size_t>(r * n + node)] = true;
  }
  for (std::int32_t i = 0; i < b * n; ++i)
    if (!peaked[static_cast<std::size_t>(i)]) logits[static_cast<std::size_t>(i * vocab + 18)] = 10.0f;
  return logits;
}

Tree golden_tree(const json& in, std::int32_t b, std::int32_t n) {
  Tree t;
  t.retrieve_index = flat<std::int32_t>(in["retrive_index"]);
  t.next_token = flat<std::int32_t>(in["retrive_next_token"]);
  t.next_sibling = flat<std::int32_t>(in["retrive_next_sibling"]);
  CHECK(static_cast<std::int32_t>(t.retrieve_index.size()) == b * n);
  return t;
}

// A random draft (b requests, top-k expansion over S steps, N nodes) organised and built into a tree.
struct RandomDraft {
  int b, k, S, n;
  std::vector<std::int32_t> parent_list, selected, seq_lens, candidates;
};
RandomDraft random_draft(std::mt19937& rng, int max_n, std::int64_t vocab) {
  RandomDraft d;
  d.b = 1 + static_cast<int>(rng() % 3);
  d.k = 1 + static_cast<int>(rng() % 4);
  d.S = 1 + static_cast<int>(rng() % 5);
  const int most = 1 + d.k + (d.S - 1) * d.k * d.k;
  d.n = 2 + static_cast<int>(rng() % std::min(most - 1, max_n));
  for (int r = 0; r < d.b; ++r) {
    std::vector<std::vector<float>> scores;
    std::vector<std::vector<std::int32_t>> tokens, parents;
    std::vector<float> fs;
    std::vector<std::int32_t> fid;
    for (int s = 0; s < d.S; ++s) {
      const int nf = s == 0 ? 1 : d.k;
      std::vector<float> probs(static_cast<std::size_t>(nf * vocab));
      for (auto& p : probs) p = static_cast<float>(rng() % 1000) / 1000.0f;
      const ExpandStep e = topk_expand_cpu(probs.data(), nf, vocab, d.k, s, fs, fid);
      scores.push_back(e.scores);
      tokens.push_back(e.tokens);
      parents.push_back(e.parents);
      fs = e.frontier_scores;
      fid = e.frontier_ids;
    }
    const Organized o = organize_draft_results_cpu(scores, tokens, parents, d.n);
    CHECK(std::is_sorted(o.selected.begin(), o.selected.end()));
    d.parent_list.insert(d.parent_list.end(), o.parent_list.begin(), o.parent_list.end());
    d.selected.insert(d.selected.end(), o.selected.begin(), o.selected.end());
    d.seq_lens.push_back(static_cast<std::int32_t>(rng() % 100));
    d.candidates.push_back(static_cast<std::int32_t>(rng() % vocab));
    d.candidates.insert(d.candidates.end(), o.draft_tokens.begin(), o.draft_tokens.end());
  }
  return d;
}

}  // namespace

TEST_CASE("organize_draft_results + build_tree reproduce the goldens") {
  const json g = goldens()["build_tree"];
  const json& in = g["inputs"];
  const int b = 2, k = in["topk"], S = in["depth"], n = in["num_draft_token"];
  std::vector<std::int32_t> parent_list, selected, draft_tokens;
  for (int r = 0; r < b; ++r) {
    std::vector<std::vector<float>> scores;
    std::vector<std::vector<std::int32_t>> tokens, parents;
    for (int s = 0; s < S; ++s) {
      scores.push_back(flat<float>(in["score_list"][s][r]));
      tokens.push_back(flat<std::int32_t>(in["token_list"][s][r]));
      parents.push_back(flat<std::int32_t>(in["parents_list"][s][r]));
    }
    const Organized o = organize_draft_results_cpu(scores, tokens, parents, n);
    CHECK(o.parent_list.size() == static_cast<std::size_t>(1 + k * (S - 1)));
    parent_list.insert(parent_list.end(), o.parent_list.begin(), o.parent_list.end());
    selected.insert(selected.end(), o.selected.begin(), o.selected.end());
    draft_tokens.push_back(in["bonus_tokens"][r].get<std::int32_t>());
    draft_tokens.insert(draft_tokens.end(), o.draft_tokens.begin(), o.draft_tokens.end());
  }
  const Tree t = build_tree_cpu(parent_list, selected, in["seq_lens"].get<std::vector<std::int32_t>>(), b, k, n);
  const json& ex = g["expected"];
  CHECK(t.valid);
  CHECK(draft_tokens == flat<std::int32_t>(ex["draft_tokens"]));
  CHECK(t.positions == flat<std::int32_t>(ex["positions"]));
  CHECK(t.retrieve_index == flat<std::int32_t>(ex["retrieve_index"]));
  CHECK(t.next_token == flat<std::int32_t>(ex["retrieve_next_token"]));
  CHECK(t.next_sibling == flat<std::int32_t>(ex["retrieve_next_sibling"]));
}

TEST_CASE("verify_tree_greedy reproduces the goldens") {
  const json g = goldens()["verify_tree_greedy"];
  const json& in = g["inputs"];
  const int b = 2, n = 6, vocab = in["vocab"], steps1 = in["num_spec_step_plus_one"];
  const Tree t = golden_tree(in, b, n);
  const auto logits = golden_logits(in, b, n, vocab);
  std::vector<std::int32_t> predict(static_cast<std::size_t>(b * n));
  for (int i = 0; i < b * n; ++i) predict[static_cast<std::size_t>(i)] = argmax(logits.data() + i * vocab, vocab);
  const Verified v = verify_tree_greedy_cpu(flat<std::int32_t>(in["candidates"]), t, predict, b, n, steps1);
  CHECK(v.predicts == flat<std::int32_t>(g["expected"]["predicts"]));
  CHECK(v.accept_index == flat<std::int32_t>(g["expected"]["accept_index"]));
  CHECK(v.accept_token_num == flat<std::int32_t>(g["expected"]["accept_token_num"]));
}

TEST_CASE("tree_speculative_sampling_target_only reproduces the goldens (both threshold cases)") {
  const json g = goldens()["tree_speculative_sampling_target_only"];
  const json& in = g["inputs"];
  const int b = 2, n = 6, vocab = in["vocab"], steps1 = in["num_spec_step_plus_one"];
  const Tree t = golden_tree(in, b, n);
  const auto logits = golden_logits(in, b, n, vocab);
  const float temperature = in["temperature"];
  std::vector<float> probs(logits.size());
  for (int i = 0; i < b * n; ++i) {
    double mx = -1e30, sum = 0;
    for (int j = 0; j < vocab; ++j) mx = std::max(mx, static_cast<double>(logits[i * vocab + j]));
    for (int j = 0; j < vocab; ++j) sum += std::exp((logits[i * vocab + j] - mx) / temperature);
    for (int j = 0; j < vocab; ++j)
      probs[static_cast<std::size_t>(i * vocab + j)] =
          static_cast<float>(std::exp((logits[i * vocab + j] - mx) / temperature) / sum);
  }
  Rng rng(5);
  for (const auto& c : g["cases"]) {
    for (int trial = 0; trial < 20; ++trial) {  // "the result does not depend on the coins"
      std::vector<float> coins(static_cast<std::size_t>(b * n)), final_coins(static_cast<std::size_t>(b));
      for (auto& x : coins) x = static_cast<float>(rng.uniform());
      for (auto& x : final_coins) x = static_cast<float>(rng.uniform());
      const Verified v = tree_speculative_sampling_target_only_cpu(flat<std::int32_t>(in["candidates"]), t, probs,
                                                                   vocab, coins, final_coins, b, n, steps1,
                                                                   c["threshold_single"], c["threshold_acc"]);
      CHECK(v.predicts == flat<std::int32_t>(c["predicts"]));
      CHECK(v.accept_index == flat<std::int32_t>(c["accept_index"]));
      CHECK(v.accept_token_num == flat<std::int32_t>(c["accept_token_num"]));
    }
  }
}

TEST_CASE("random trees: one parent per node, positions = seq_len + depth, child lists ascending") {
  std::mt19937 rng(17);
  for (int trial = 0; trial < 300; ++trial) {
    const RandomDraft d = random_draft(rng, 20, 50);
    const int b = d.b, n = d.n;
    const auto& seq_lens = d.seq_lens;
    const Tree t = build_tree_cpu(d.parent_list, d.selected, d.seq_lens, d.b, d.k, d.n);
    for (int r = 0; r < b; ++r) {
      std::vector<int> parent_count(static_cast<std::size_t>(n), 0);
      for (int i = 0; i < n; ++i) {
        for (int c = t.next_token[static_cast<std::size_t>(r * n + i)], prev = -1; c != -1;
             prev = c, c = t.next_sibling[static_cast<std::size_t>(r * n + c)]) {
          CHECK(c > prev);  // ascending child lists
          ++parent_count[static_cast<std::size_t>(c)];
        }
      }
      CHECK(parent_count[0] == 0);
      for (int i = 1; i < n; ++i) {
        if (t.parent[static_cast<std::size_t>(r * n + i)] == -2) continue;  // an unselected parent (reported)
        CHECK(parent_count[static_cast<std::size_t>(i)] == 1);
        // depth: walk to the root
        int d = 0;
        for (int c = i; c != 0; c = std::max(0, t.parent[static_cast<std::size_t>(r * n + c)])) ++d;
        CHECK(t.positions[static_cast<std::size_t>(r * n + i)] == seq_lens[static_cast<std::size_t>(r)] + d);
        // mask: exactly self and ancestors
        std::uint64_t want = 0;
        for (int c = i;; c = std::max(0, t.parent[static_cast<std::size_t>(r * n + c)])) {
          want |= std::uint64_t{1} << c;
          if (c == 0) break;
        }
        CHECK(t.mask_bits[static_cast<std::size_t>(r * n + i)] == want);
      }
    }
  }
}

TEST_CASE("top-k expansion: path scores multiply, the frontier keeps the best k") {
  const std::int64_t V = 5;
  const std::vector<float> p0 = {0.1f, 0.5f, 0.05f, 0.3f, 0.05f};
  const ExpandStep s0 = topk_expand_cpu(p0.data(), 1, V, 2, 0, {}, {});
  CHECK(s0.tokens == std::vector<std::int32_t>{1, 3});
  CHECK(s0.parents == std::vector<std::int32_t>{-1, 0, 1});
  const std::vector<float> p1 = {0.9f, 0.1f, 0,    0,    0,   // after token 1 (score 0.5)
                                 0,    0,    0.2f, 0.8f, 0};  // after token 3 (score 0.3)
  const ExpandStep s1 = topk_expand_cpu(p1.data(), 2, V, 2, 1, s0.frontier_scores, s0.frontier_ids);
  CHECK(s1.scores[0] == doctest::Approx(0.45f));
  // Frontier 0 (token 1) proposes tokens 0 and 1; frontier 1 (token 3) proposes 3 (0.3 × 0.8) and 2.
  CHECK(s1.tokens == std::vector<std::int32_t>{0, 1, 3, 2});
  CHECK(s1.scores[2] == doctest::Approx(0.24f));
  CHECK(s1.frontier_ids == std::vector<std::int32_t>{2, 4});  // global ids: step 1 starts at k = 2
  CHECK(s1.frontier_tokens == std::vector<std::int32_t>{0, 3});
  CHECK(s1.parents == s1.frontier_ids);
}

// ---- statistics -----------------------------------------------------------------------------------

namespace {

constexpr std::int64_t kV = 6;
const std::vector<float> kP = {0.30f, 0.05f, 0.20f, 0.25f, 0.15f, 0.05f};  // target
const std::vector<float> kQ = {0.05f, 0.40f, 0.10f, 0.15f, 0.25f, 0.05f};  // draft

double chi_square(const std::vector<int>& counts, const std::vector<float>& p, int draws) {
  double chi = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    const double e = p[i] * draws;
    chi += (counts[i] - e) * (counts[i] - e) / e;
  }
  return chi;
}
constexpr double kChi2Crit = 20.515;  // df = 5, p = 0.001
constexpr int kDraws = 100000;

}  // namespace

TEST_CASE("target-only tree sampling emits the target distribution (and a wrong variant is caught)") {
  // Root with two sibling drafts (tokens 3 and 1), one depth: the first emitted token must be ~ p.
  const Tree t = tree_from_parents({{-1, -1}}, {0}, 3);
  const std::vector<std::int32_t> cand = {0, 3, 1};
  std::vector<float> probs;
  for (int i = 0; i < 3; ++i) probs.insert(probs.end(), kP.begin(), kP.end());
  Rng rng(2024);
  std::vector<int> counts(kV, 0), wrong(kV, 0);
  for (int d = 0; d < kDraws; ++d) {
    std::vector<float> coins = {static_cast<float>(rng.uniform()), static_cast<float>(rng.uniform()),
                                static_cast<float>(rng.uniform())};
    std::vector<float> fin = {static_cast<float>(rng.uniform())};
    const Verified v = tree_speculative_sampling_target_only_cpu(cand, t, probs, kV, coins, fin, 1, 3, 2);
    counts[static_cast<std::size_t>(v.predicts[0] == -1 ? 0 : v.predicts[0])]++;
    // Wrong: on rejection, draw from the full row (rejected siblings not removed).
    const float c = coins[0];
    std::int32_t tok;
    if (c <= kP[3])
      tok = 3;
    else if (c <= kP[3] + kP[1])
      tok = 1;
    else
      tok = sample_distribution(kP.data(), kV, fin[0]);
    wrong[static_cast<std::size_t>(tok)]++;
  }
  const double chi = chi_square(counts, kP, kDraws), chi_wrong = chi_square(wrong, kP, kDraws);
  MESSAGE("target-only sampling: chi2 = " << chi << ", deliberately wrong variant: " << chi_wrong << " (critical "
                                          << kChi2Crit << ")");
  CHECK(chi < kChi2Crit);
  CHECK(chi_wrong > kChi2Crit);
}

TEST_CASE("chain rejection sampling emits the target distribution for any draft (and a wrong variant is caught)") {
  Rng rng(77);
  std::vector<int> first(kV, 0), second(kV, 0), wrong(kV, 0);
  std::vector<float> q2 = kQ, p2 = kP;  // two positions with the same p and q
  std::vector<float> target;
  for (int i = 0; i < 3; ++i) target.insert(target.end(), kP.begin(), kP.end());
  std::vector<float> draft;
  for (int i = 0; i < 2; ++i) draft.insert(draft.end(), kQ.begin(), kQ.end());
  for (int d = 0; d < kDraws; ++d) {
    const std::vector<std::int32_t> x = {sample_distribution(kQ.data(), kV, static_cast<float>(rng.uniform())),
                                         sample_distribution(kQ.data(), kV, static_cast<float>(rng.uniform()))};
    const std::vector<float> coins = {static_cast<float>(rng.uniform()), static_cast<float>(rng.uniform())};
    const float fin = static_cast<float>(rng.uniform());
    const auto out = chain_rejection_sampling_cpu(x, draft, target, kV, coins, fin);
    first[static_cast<std::size_t>(out[0])]++;
    if (out.size() > 1) second[static_cast<std::size_t>(out[1])]++;
    // Wrong: accept the draft whenever coin < p(x), ignoring q.
    wrong[static_cast<std::size_t>(
        coins[0] < kP[static_cast<std::size_t>(x[0])] ? x[0] : sample_distribution(kP.data(), kV, fin))]++;
  }
  const double chi = chi_square(first, kP, kDraws), chi_wrong = chi_square(wrong, kP, kDraws);
  int n2 = 0;
  for (int c : second) n2 += c;
  const double chi2 = chi_square(second, kP, n2);
  MESSAGE("chain rejection sampling: chi2 first token = " << chi << ", second = " << chi2
                                                          << ", wrong variant = " << chi_wrong);
  CHECK(chi < kChi2Crit);
  CHECK(chi2 < kChi2Crit);
  CHECK(chi_wrong > kChi2Crit);
}

#ifdef SPECACTOR_HAVE_CUDA
#include "kernels/cuda/cuda_api.hpp"
#endif

TEST_CASE("spec kernels: CPU vs CUDA parity on the goldens and on random trees") {
#ifndef SPECACTOR_HAVE_CUDA
  SKIP_CASE("built without CUDA", "spec kernel CUDA parity");
#else
  if (!cuda_backend()) {
    SKIP_CASE("no CUDA device", "spec kernel CUDA parity: " << probe_devices().reason);
  }
  std::mt19937 rng(23);
  for (int trial = 0; trial < 100; ++trial) {
    const std::int64_t vocab = 40;
    const RandomDraft d = random_draft(rng, 16, vocab);
    const int b = d.b, k = d.k, S = d.S, n = d.n;
    const auto &parent_list = d.parent_list, &selected = d.selected, &seq_lens = d.seq_lens, &cand = d.candidates;
    const Tree t = build_tree_cpu(parent_list, selected, seq_lens, b, k, n);
    const auto g = cuda::build_tree_cuda(parent_list, selected, seq_lens, b, k, n);
    CHECK(g.positions == t.positions);
    CHECK(g.next_token == t.next_token);
    CHECK(g.next_sibling == t.next_sibling);
    // FULL mask = prefix columns + the QLEN rows.
    std::size_t at = 0;
    for (int r = 0; r < b; ++r)
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < seq_lens[static_cast<std::size_t>(r)] + n; ++j, ++at) {
          const int len = seq_lens[static_cast<std::size_t>(r)];
          const std::uint8_t want = j < len ? 1 : t.mask_qlen[static_cast<std::size_t>((r * n + i) * n + (j - len))];
          CHECK(g.mask_full[at] == want);
        }
    std::vector<std::int32_t> predict(static_cast<std::size_t>(b * n));
    for (auto& p : predict) p = static_cast<std::int32_t>(rng() % vocab);
    const Verified vc = verify_tree_greedy_cpu(cand, t, predict, b, n, S + 1);
    const auto vg =
        cuda::verify_tree_greedy_cuda(cand, t.retrieve_index, t.next_token, t.next_sibling, predict, b, n, S + 1);
    CHECK(vg.predicts == vc.predicts);
    CHECK(vg.accept_index == vc.accept_index);
    std::vector<float> probs(static_cast<std::size_t>(b * n * vocab)), coins(static_cast<std::size_t>(b * n)),
        fin(static_cast<std::size_t>(b));
    for (auto& p : probs) p = static_cast<float>(rng() % 1000) / 40000.0f;
    for (auto& c : coins) c = static_cast<float>(rng() % 1000) / 1000.0f;
    for (auto& c : fin) c = static_cast<float>(rng() % 1000) / 1000.0f;
    const Verified sc = tree_speculative_sampling_target_only_cpu(cand, t, probs, vocab, coins, fin, b, n, S + 1);
    const auto sg = cuda::tree_speculative_sampling_target_only_cuda(
        cand, t.retrieve_index, t.next_token, t.next_sibling, probs, vocab, coins, fin, b, n, S + 1, 1.0f, 1.0f);
    CHECK(sg.predicts == sc.predicts);
    CHECK(sg.accept_index == sc.accept_index);
  }
#endif
}

TEST_CASE("spec kernels: CPU vs CUDA parity for expansion, organize, chain rejection sampling, compaction") {
  std::vector<float> rows(10 * 3);
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(i);
  std::vector<float> cpu_rows = rows;
  compact_accepted_rows_cpu(cpu_rows, 3, 2, {0, 2, 5});
  CHECK(std::vector<float>(cpu_rows.begin() + 9, cpu_rows.begin() + 12) ==
        std::vector<float>{12, 13, 14});  // slot 3 <- 4
  CHECK(std::vector<float>(cpu_rows.begin() + 12, cpu_rows.begin() + 15) ==
        std::vector<float>{21, 22, 23});  // slot 4 <- 7
#ifndef SPECACTOR_HAVE_CUDA
  SKIP_CASE("built without CUDA", "spec kernel CUDA parity");
#else
  if (!cuda_backend()) {
    SKIP_CASE("no CUDA device", "spec kernel CUDA parity: " << probe_devices().reason);
  }
  std::vector<float> gpu_rows = rows;
  cuda::compact_accepted_rows_cuda(gpu_rows, 3, 2, {0, 2, 5});
  CHECK(gpu_rows == cpu_rows);
  std::mt19937 rng(31);
  const std::int64_t V = 300;
  for (int trial = 0; trial < 20; ++trial) {
    const int k = 1 + static_cast<int>(rng() % 4), nf = trial % 2 ? k : 1, step = nf == 1 ? 0 : 1 + trial % 3;
    std::vector<float> probs(static_cast<std::size_t>(nf * V)), fs(static_cast<std::size_t>(nf));
    for (auto& p : probs) p = static_cast<float>(rng() % 200) / 200.0f;  // many ties: the tie rule matters
    for (auto& f : fs) f = static_cast<float>(rng() % 100) / 100.0f;
    const ExpandStep c = topk_expand_cpu(probs.data(), nf, V, k, step, fs, {});
    const auto g = cuda::topk_expand_cuda(probs, nf, V, k, step, fs);
    CHECK(g.tokens == c.tokens);
    CHECK(g.scores == c.scores);
    CHECK(g.parents == c.parents);
    // organize on the concatenated candidates of one request
    const int n = 2 + static_cast<int>(rng() % std::min<std::size_t>(c.scores.size(), 8));
    const Organized o = organize_draft_results_cpu({c.scores}, {c.tokens}, {c.parents}, n);
    std::vector<int> sel, dt;
    cuda::organize_draft_results_cuda(c.scores, c.tokens, 1, static_cast<int>(c.scores.size()), n, sel, dt);
    CHECK(sel == o.selected);
    CHECK(dt == o.draft_tokens);
  }
  for (int trial = 0; trial < 50; ++trial) {
    const int b = 1 + static_cast<int>(rng() % 3), k = 1 + static_cast<int>(rng() % 4);
    const std::int64_t v = 12;
    std::vector<float> q(static_cast<std::size_t>(b * k * v)), p(static_cast<std::size_t>(b * (k + 1) * v)),
        coins(static_cast<std::size_t>(b * k)), fin(static_cast<std::size_t>(b));
    std::vector<std::int32_t> drafts(static_cast<std::size_t>(b * k));
    for (auto& x : q) x = static_cast<float>(rng() % 100) / 1200.0f;
    for (auto& x : p) x = static_cast<float>(rng() % 100) / 1200.0f;
    for (auto& x : coins) x = static_cast<float>(rng() % 1000) / 1000.0f;
    for (auto& x : fin) x = static_cast<float>(rng() % 1000) / 1000.0f;
    for (auto& x : drafts) x = static_cast<std::int32_t>(rng() % v);
    const auto g = cuda::chain_rejection_sampling_cuda(drafts, q, p, v, coins, fin, b, k);
    for (int r = 0; r < b; ++r) {
      const auto c = chain_rejection_sampling_cpu(
          std::vector<std::int32_t>(drafts.begin() + r * k, drafts.begin() + (r + 1) * k),
          std::vector<float>(q.begin() + r * k * v, q.begin() + (r + 1) * k * v),
          std::vector<float>(p.begin() + r * (k + 1) * v, p.begin() + (r + 1) * (k + 1) * v), v,
          std::vector<float>(coins.begin() + r * k, coins.begin() + (r + 1) * k), fin[static_cast<std::size_t>(r)]);
      for (std::size_t i = 0; i < c.size(); ++i) CHECK(g[static_cast<std::size_t>(r * (k + 1)) + i] == c[i]);
    }
  }
#endif
}
