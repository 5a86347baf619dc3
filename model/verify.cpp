// model/verify.cpp — see verify.hpp.
#include "model/verify.hpp"

#include <algorithm>

namespace specactor::model {

bool Verdict::in_place() const {
  for (std::size_t j = 0; j < path.size(); ++j)
    if (path[j] != static_cast<std::int32_t>(j)) return false;
  return true;
}

kernels::Tree item_tree(const VerifyItem& item, std::int64_t seq_len) {
  const auto n = static_cast<std::int32_t>(item.tokens.size());
  std::vector<std::int32_t> parents = item.parents;
  if (parents.empty())  // a chain
    for (std::int32_t i = 0; i + 1 < n; ++i) parents.push_back(i - 1);
  return kernels::tree_from_parents({parents}, {static_cast<std::int32_t>(seq_len)}, n);
}

namespace {

// The sampling distributions of `rows` logits rows (row-major, rows × vocab).
std::vector<float> probs_of(const float* logits, std::int32_t rows, std::int64_t vocab,
                            const kernels::SamplingParams& params) {
  std::vector<float> probs(static_cast<std::size_t>(rows * vocab)), row;
  for (std::int32_t i = 0; i < rows; ++i) {
    kernels::sampling_probs(logits + i * vocab, vocab, params, row);
    std::copy(row.begin(), row.end(), probs.begin() + i * vocab);
  }
  return probs;
}

// Tree sampling from the target only, coupled to plain sampling: at each accepted node the token that
// follows it is drawn with its position's coin; the child carrying that token is accepted and the walk
// goes on, else the drawn token is emitted and the step ends. Every emitted token is a draw from the
// target's distribution at its position (lossless), and the very draw plain decoding would make.
Verdict sample_tree(const VerifyItem& item, const kernels::Tree& tree, const float* logits, std::int64_t vocab) {
  Verdict v;
  v.drafted = static_cast<std::int32_t>(item.tokens.size()) - 1;
  std::int32_t cur = 0;  // node index (row = retrieve_index)
  v.path.push_back(tree.retrieve_index[0]);
  for (;;) {
    const std::int32_t row = tree.retrieve_index[static_cast<std::size_t>(cur)];
    const std::int32_t t =
        kernels::sample_at(logits + static_cast<std::size_t>(row) * static_cast<std::size_t>(vocab), vocab, item.params,
                           item.seed, tree.positions[static_cast<std::size_t>(cur)] + 1);
    v.tokens.push_back(t);
    std::int32_t child = tree.next_token[static_cast<std::size_t>(cur)];
    while (child != -1 && item.tokens[static_cast<std::size_t>(child)] != t)
      child = tree.next_sibling[static_cast<std::size_t>(child)];
    if (child == -1) break;
    ++v.accepted;
    v.path.push_back(tree.retrieve_index[static_cast<std::size_t>(child)]);
    cur = child;
  }
  return v;
}

}  // namespace

Verdict verify_step(const VerifyItem& item, const kernels::Tree& tree, const float* logits, std::int64_t vocab,
                    kernels::Rng& rng, const kernels::Backend& backend) {
  const auto n = static_cast<std::int32_t>(item.tokens.size());
  Verdict v;
  v.drafted = n - 1;
  if (n == 1) {  // plain decoding
    v.tokens = {kernels::sample_at(logits, vocab, item.params, item.seed, item.root_position + 1)};
    v.path = {0};
    return v;
  }
  if (!item.draft_probs.empty() && !item.params.greedy()) {
    // Chain rejection sampling with the draft's q (docs/speculative-kernels.md §6): lossless for any q.
    const std::int32_t k = n - 1;
    const std::vector<float> p = probs_of(logits, k + 1, vocab, item.params);
    std::vector<float> coins(static_cast<std::size_t>(k));
    for (auto& c : coins) c = static_cast<float>(rng.uniform());
    const float final_coin = static_cast<float>(rng.uniform());
    const std::vector<std::int32_t> drafts(item.tokens.begin() + 1, item.tokens.end());
    v.tokens = backend.chain_rejection_sampling(drafts, item.draft_probs, p, vocab, coins, final_coin);
    v.accepted = static_cast<std::int32_t>(v.tokens.size()) - 1;
    for (std::int32_t j = 0; j <= v.accepted; ++j) v.path.push_back(j);  // a chain: the rows stay in place
    return v;
  }
  if (!item.params.greedy()) return sample_tree(item, tree, logits, vocab);
  // A tree (a chain is one), greedy (§4).
  std::int32_t max_depth = 0;
  for (std::int32_t i = 0; i < n; ++i)
    max_depth = std::max(max_depth, tree.positions[static_cast<std::size_t>(i)] - tree.positions[0]);
  std::vector<std::int32_t> predict(static_cast<std::size_t>(n));
  backend.argmax_rows(logits, n, vocab, predict.data());
  const kernels::Verified r = backend.verify_tree_greedy(item.tokens, tree, predict, 1, n, max_depth + 1);
  v.accepted = r.accept_token_num[0];
  for (std::int32_t j = 0; j <= v.accepted; ++j) {
    const std::int32_t node = r.accept_index[static_cast<std::size_t>(j)];
    v.path.push_back(node);
    v.tokens.push_back(r.predicts[static_cast<std::size_t>(node)]);
  }
  return v;
}

}  // namespace specactor::model
