// kernels/cpu/spec.cpp — CPU draft/verify kernels (contracts: kernels/spec.hpp, docs/speculative-kernels.md).
#include "kernels/spec.hpp"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

namespace specactor::kernels {

namespace {

// Indices of the k largest values (descending; ties keep the lower index first).
std::vector<std::int32_t> top_indices(const float* v, std::int64_t n, std::int32_t k) {
  std::vector<std::int32_t> idx(static_cast<std::size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  const auto kk = static_cast<std::size_t>(std::min<std::int64_t>(k, n));
  std::partial_sort(idx.begin(), idx.begin() + static_cast<long>(kk), idx.end(),
                    [v](std::int32_t a, std::int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
  idx.resize(kk);
  return idx;
}

void link_children(Tree& t, std::int32_t r, std::int32_t n) {
  for (std::int32_t i = n - 1; i >= 1; --i) {
    const std::int32_t p = t.parent[static_cast<std::size_t>(r * n + i)];
    if (p == -2) continue;  // a node whose parent is missing: left out of the tree
    const std::size_t pi = static_cast<std::size_t>(r * n + (p < 0 ? 0 : p));
    const std::size_t ii = static_cast<std::size_t>(r * n + i);
    if (t.next_token[pi] == -1) {
      t.next_token[pi] = i;
    } else {
      t.next_sibling[ii] = t.next_token[pi];
      t.next_token[pi] = i;
    }
  }
}

// Depths, positions and masks once parents are known (parent < child for every node).
void finish_tree(Tree& t, const std::vector<std::int32_t>& seq_lens, std::int32_t b, std::int32_t n) {
  t.positions.assign(static_cast<std::size_t>(b * n), 0);
  t.mask_qlen.assign(static_cast<std::size_t>(b) * n * n, 0);
  t.mask_bits.assign(static_cast<std::size_t>(b * n), 0);
  for (std::int32_t r = 0; r < b; ++r) {
    std::vector<std::int32_t> depth(static_cast<std::size_t>(n), 0);
    for (std::int32_t i = 0; i < n; ++i) {
      const std::int32_t p = t.parent[static_cast<std::size_t>(r * n + i)];
      std::uint64_t bits = n <= 64 ? (std::uint64_t{1} << i) : 0;
      t.mask_qlen[static_cast<std::size_t>((r * n + i) * n + i)] = 1;
      if (i > 0 && p >= -1) {
        const std::int32_t pp = p < 0 ? 0 : p;
        depth[static_cast<std::size_t>(i)] = depth[static_cast<std::size_t>(pp)] + 1;
        for (std::int32_t j = 0; j < n; ++j)
          if (t.mask_qlen[static_cast<std::size_t>((r * n + pp) * n + j)])
            t.mask_qlen[static_cast<std::size_t>((r * n + i) * n + j)] = 1;
        if (n <= 64) bits |= t.mask_bits[static_cast<std::size_t>(r * n + pp)];
      }
      t.mask_bits[static_cast<std::size_t>(r * n + i)] = bits;
      t.positions[static_cast<std::size_t>(r * n + i)] =
          seq_lens[static_cast<std::size_t>(r)] + depth[static_cast<std::size_t>(i)];
    }
  }
}

Tree empty_tree(std::int32_t b, std::int32_t n) {
  Tree t;
  const auto sz = static_cast<std::size_t>(b * n);
  t.retrieve_index.resize(sz);
  std::iota(t.retrieve_index.begin(), t.retrieve_index.end(), 0);
  t.next_token.assign(sz, -1);
  t.next_sibling.assign(sz, -1);
  t.parent.assign(sz, -1);
  return t;
}

}  // namespace

ExpandStep topk_expand_cpu(const float* probs, std::int32_t n_frontier, std::int64_t vocab, std::int32_t k,
                           std::int32_t step, const std::vector<float>& frontier_scores,
                           const std::vector<std::int32_t>& frontier_ids) {
  ExpandStep e;
  for (std::int32_t f = 0; f < n_frontier; ++f) {
    const float* row = probs + static_cast<std::int64_t>(f) * vocab;
    const float base = step == 0 ? 1.0f : frontier_scores[static_cast<std::size_t>(f)];
    for (std::int32_t t : top_indices(row, vocab, k)) {
      e.scores.push_back(base * row[t]);
      e.tokens.push_back(t);
    }
  }
  // The new frontier: the best k candidates of this step, by path score.
  const std::int32_t first_id = step == 0 ? 0 : k + k * k * (step - 1);
  const auto best = top_indices(e.scores.data(), static_cast<std::int64_t>(e.scores.size()), k);
  if (step == 0) e.parents.push_back(-1);
  for (std::int32_t c : best) {
    e.frontier_scores.push_back(e.scores[static_cast<std::size_t>(c)]);
    e.frontier_ids.push_back(first_id + c);
    e.frontier_tokens.push_back(e.tokens[static_cast<std::size_t>(c)]);
    e.parents.push_back(first_id + c);
  }
  (void)frontier_ids;  // the ids of the expanded nodes were recorded by the previous step's parents
  return e;
}

Organized organize_draft_results_cpu(const std::vector<std::vector<float>>& score_list,
                                     const std::vector<std::vector<std::int32_t>>& token_list,
                                     const std::vector<std::vector<std::int32_t>>& parents_list, std::int32_t n) {
  std::vector<float> scores;
  std::vector<std::int32_t> tokens;
  for (std::size_t s = 0; s < score_list.size(); ++s) {
    scores.insert(scores.end(), score_list[s].begin(), score_list[s].end());
    tokens.insert(tokens.end(), token_list[s].begin(), token_list[s].end());
  }
  Organized o;
  o.selected = top_indices(scores.data(), static_cast<std::int64_t>(scores.size()), n - 1);
  std::sort(o.selected.begin(), o.selected.end());
  for (std::int32_t c : o.selected) o.draft_tokens.push_back(tokens[static_cast<std::size_t>(c)]);
  for (std::size_t s = 0; s + 1 < parents_list.size(); ++s)
    o.parent_list.insert(o.parent_list.end(), parents_list[s].begin(), parents_list[s].end());
  return o;
}

Tree build_tree_cpu(const std::vector<std::int32_t>& parent_list, const std::vector<std::int32_t>& selected,
                    const std::vector<std::int32_t>& seq_lens, std::int32_t b, std::int32_t k, std::int32_t n) {
  Tree t = empty_tree(b, n);
  const auto per_req_parents = static_cast<std::int32_t>(parent_list.size()) / b;
  for (std::int32_t r = 0; r < b; ++r) {
    const std::int32_t* sel = selected.data() + static_cast<std::size_t>(r) * (n - 1);
    const std::int32_t* pl = parent_list.data() + static_cast<std::size_t>(r) * per_req_parents;
    for (std::int32_t i = 1; i < n; ++i) {
      const std::int32_t g = sel[i - 1] / k;
      std::int32_t parent = -1;  // the root
      if (g != 0) {
        parent = -2;
        for (std::int32_t j = 0; j < n - 1; ++j)
          if (g < per_req_parents && sel[j] == pl[g]) {
            parent = j + 1;
            break;
          }
        if (parent == -2) t.valid = false;  // the parent candidate was not selected: node skipped
      }
      t.parent[static_cast<std::size_t>(r * n + i)] = parent;
    }
    link_children(t, r, n);
  }
  finish_tree(t, seq_lens, b, n);
  return t;
}

Tree tree_from_parents(const std::vector<std::vector<std::int32_t>>& parents, const std::vector<std::int32_t>& seq_lens,
                       std::int32_t n) {
  const auto b = static_cast<std::int32_t>(parents.size());
  Tree t = empty_tree(b, n);
  for (std::int32_t r = 0; r < b; ++r) {
    const auto& p = parents[static_cast<std::size_t>(r)];
    if (static_cast<std::int32_t>(p.size()) != n - 1)
      throw std::invalid_argument("tree_from_parents: need N-1 parents");
    for (std::int32_t i = 1; i < n; ++i) {
      const std::int32_t pi = p[static_cast<std::size_t>(i - 1)];  // -1 = root, else index of an earlier draft token
      if (pi >= i - 1)
        throw std::invalid_argument("tree_from_parents: node " + std::to_string(i) + "'s parent comes after it");
      t.parent[static_cast<std::size_t>(r * n + i)] = pi < 0 ? -1 : pi + 1;
    }
    link_children(t, r, n);
  }
  finish_tree(t, seq_lens, b, n);
  return t;
}

Verified verify_tree_greedy_cpu(const std::vector<std::int32_t>& candidates, const Tree& tree,
                                const std::vector<std::int32_t>& target_predict, std::int32_t b, std::int32_t n,
                                std::int32_t num_steps_plus_one) {
  Verified v;
  v.predicts.assign(static_cast<std::size_t>(b * n), -1);
  v.accept_index.assign(static_cast<std::size_t>(b * num_steps_plus_one), -1);
  v.accept_token_num.assign(static_cast<std::size_t>(b), 0);
  for (std::int32_t r = 0; r < b; ++r) {
    auto at = [&](const std::vector<std::int32_t>& a, std::int32_t i) {
      return a[static_cast<std::size_t>(r * n + i)];
    };
    std::int32_t last = at(tree.retrieve_index, 0), cnt = 0, cur = 0;
    v.accept_index[static_cast<std::size_t>(r * num_steps_plus_one)] = last;
    for (std::int32_t s = 1; s < num_steps_plus_one; ++s) {
      cur = at(tree.next_token, cur);
      while (cur != -1 && at(candidates, cur) != target_predict[static_cast<std::size_t>(last)])
        cur = at(tree.next_sibling, cur);
      if (cur == -1) break;
      v.predicts[static_cast<std::size_t>(last)] = at(candidates, cur);
      ++cnt;
      last = at(tree.retrieve_index, cur);
      v.accept_index[static_cast<std::size_t>(r * num_steps_plus_one + cnt)] = last;
    }
    v.accept_token_num[static_cast<std::size_t>(r)] = cnt;
    v.predicts[static_cast<std::size_t>(last)] = target_predict[static_cast<std::size_t>(last)];  // the bonus token
  }
  return v;
}

std::int32_t sample_distribution(const float* probs, std::int64_t vocab, float coin) {
  double total = 0;
  for (std::int64_t i = 0; i < vocab; ++i) total += probs[i];
  const double target = static_cast<double>(coin) * total;
  double acc = 0;
  std::int32_t last = -1;
  for (std::int64_t i = 0; i < vocab; ++i) {
    if (probs[i] <= 0) continue;
    acc += probs[i];
    last = static_cast<std::int32_t>(i);
    if (target < acc) return last;
  }
  return last;
}

Verified tree_speculative_sampling_target_only_cpu(const std::vector<std::int32_t>& candidates, const Tree& tree,
                                                   const std::vector<float>& target_probs, std::int64_t vocab,
                                                   const std::vector<float>& coins,
                                                   const std::vector<float>& final_coins, std::int32_t b,
                                                   std::int32_t n, std::int32_t num_steps_plus_one,
                                                   float threshold_single, float threshold_acc) {
  threshold_acc = std::max(threshold_acc, 1e-9f);
  Verified v;
  v.predicts.assign(static_cast<std::size_t>(b * n), -1);
  v.accept_index.assign(static_cast<std::size_t>(b * num_steps_plus_one), -1);
  v.accept_token_num.assign(static_cast<std::size_t>(b), 0);
  std::vector<float> row(static_cast<std::size_t>(vocab));
  for (std::int32_t r = 0; r < b; ++r) {
    auto at = [&](const std::vector<std::int32_t>& a, std::int32_t i) {
      return a[static_cast<std::size_t>(r * n + i)];
    };
    std::int32_t last = at(tree.retrieve_index, 0), cnt = 0, cur = 0;
    v.accept_index[static_cast<std::size_t>(r * num_steps_plus_one)] = last;
    std::vector<std::int32_t> rejected;
    for (std::int32_t s = 1; s < num_steps_plus_one; ++s) {
      std::int32_t child = at(tree.next_token, cur);
      if (child == -1) break;  // a leaf: the final token comes from the full row
      const float coin = coins[static_cast<std::size_t>(r * n + cur)];
      const float* p = target_probs.data() + static_cast<std::size_t>(last) * static_cast<std::size_t>(vocab);
      float acc = 0;
      bool accepted = false;
      rejected.clear();
      while (child != -1) {
        const std::int32_t tok = at(candidates, child);
        const float q = p[tok];
        acc += q;
        if (coin <= acc / threshold_acc || q >= threshold_single) {
          v.predicts[static_cast<std::size_t>(last)] = tok;
          ++cnt;
          last = at(tree.retrieve_index, child);
          v.accept_index[static_cast<std::size_t>(r * num_steps_plus_one + cnt)] = last;
          cur = child;
          accepted = true;
          break;
        }
        rejected.push_back(tok);
        child = at(tree.next_sibling, child);
      }
      if (!accepted) break;
      rejected.clear();
    }
    const float* p = target_probs.data() + static_cast<std::size_t>(last) * static_cast<std::size_t>(vocab);
    std::copy(p, p + vocab, row.begin());
    for (std::int32_t tok : rejected) row[static_cast<std::size_t>(tok)] = 0.0f;  // renormalised by the draw
    v.accept_token_num[static_cast<std::size_t>(r)] = cnt;
    v.predicts[static_cast<std::size_t>(last)] =
        sample_distribution(row.data(), vocab, final_coins[static_cast<std::size_t>(r)]);
  }
  return v;
}

std::vector<std::int32_t> chain_rejection_sampling_cpu(const std::vector<std::int32_t>& drafts,
                                                       const std::vector<float>& draft_probs,
                                                       const std::vector<float>& target_probs, std::int64_t vocab,
                                                       const std::vector<float>& coins, float final_coin) {
  std::vector<std::int32_t> out;
  const auto V = static_cast<std::size_t>(vocab);
  for (std::size_t i = 0; i < drafts.size(); ++i) {
    const float* q = draft_probs.data() + i * V;
    const float* p = target_probs.data() + i * V;
    const auto x = static_cast<std::size_t>(drafts[i]);
    if (coins[i] * q[x] < p[x]) {
      out.push_back(drafts[i]);
      continue;
    }
    std::vector<float> residual(V);
    for (std::size_t t = 0; t < V; ++t) residual[t] = std::max(0.0f, p[t] - q[t]);
    out.push_back(sample_distribution(residual.data(), vocab, final_coin));
    return out;
  }
  out.push_back(sample_distribution(target_probs.data() + drafts.size() * V, vocab, final_coin));
  return out;
}

}  // namespace specactor::kernels

namespace specactor::kernels {

void compact_accepted_rows_cpu(std::vector<float>& rows, std::int64_t row_floats, std::int64_t base,
                               const std::vector<std::int32_t>& path) {
  for (std::size_t j = 1; j < path.size(); ++j) {
    const std::int64_t from = base + path[j], to = base + static_cast<std::int64_t>(j);
    if (from == to) continue;
    std::copy(rows.begin() + from * row_floats, rows.begin() + (from + 1) * row_floats, rows.begin() + to * row_floats);
  }
}

}  // namespace specactor::kernels
