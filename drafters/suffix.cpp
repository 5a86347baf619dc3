// drafters/suffix.cpp — SUFFIX drafting (suffix decoding): continuations of the sequence's last
// tokens found in earlier requests' prompts and outputs and earlier in this request
// (drafters/suffix_store.hpp), merged into a tree. A node's score is the share of the matches that
// pass through it times, for each node on its path, a factor of that node's longest match,
// L / (L + 2) — a path probability, like a head's, that falls with depth (one factor for the whole
// path scored a 16-node chain of one short match as likely at its end as at its start, and the
// budget verified all of it). The scheduler's acceptance model calibrates it by score and depth
// (sched/budget.hpp).
#include <algorithm>
#include <map>

#include "config/resolve.hpp"
#include "drafters/drafter.hpp"
#include "drafters/suffix_store.hpp"

namespace specactor::drafters {

DraftTree tree_from_matches(const std::vector<SuffixStore::Match>& matches, std::int32_t max_nodes,
                            std::int32_t breadth) {
  DraftTree out;
  struct Node {
    std::int32_t token, parent;
    double weight = 0;
    std::int32_t longest = 0;
    std::vector<std::int32_t> children;
  };
  std::vector<Node> nodes;
  std::vector<std::int32_t> root_children;
  double total = 0;
  for (const auto& m : matches) {
    total += 1;
    std::int32_t at = -1;
    for (std::int32_t t : m.continuation) {
      auto& kids = at < 0 ? root_children : nodes[static_cast<std::size_t>(at)].children;
      std::int32_t next = -1;
      for (std::int32_t k : kids)
        if (nodes[static_cast<std::size_t>(k)].token == t) next = k;
      if (next < 0) {
        if (static_cast<std::int32_t>(nodes.size()) >= max_nodes || static_cast<std::int32_t>(kids.size()) >= breadth)
          break;
        next = static_cast<std::int32_t>(nodes.size());
        kids.push_back(next);
        nodes.push_back({t, at, 0, 0, {}});
      }
      Node& nd = nodes[static_cast<std::size_t>(next)];
      nd.weight += 1;
      nd.longest = std::max(nd.longest, m.match_length);
      at = next;
    }
  }
  // Parents come before their children, so the path products build in one pass.
  std::vector<double> path(nodes.size(), 1.0);
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    out.tokens.push_back(n.token);
    out.parents.push_back(n.parent);
    const double l = n.longest;
    path[i] = (n.parent >= 0 ? path[static_cast<std::size_t>(n.parent)] : 1.0) * l / (l + 2.0);
    out.scores.push_back(static_cast<float>(n.weight / total * path[i]));
  }
  // A child's score must not exceed its parent's (it cannot be likelier).
  for (std::size_t i = 0; i < out.tokens.size(); ++i)
    if (out.parents[i] >= 0)
      out.scores[i] = std::min(out.scores[i], out.scores[static_cast<std::size_t>(out.parents[i])]);
  return out;
}

namespace {

class SuffixDrafter final : public Drafter {
 public:
  SuffixDrafter(const config::Snapshot& s, const DraftContext&)
      : store_(s->speculative_suffix_cache_tokens, s->speculative_suffix_min_match) {
    reconfigure(s);
  }

  DraftTree propose(std::uint64_t req, const std::vector<std::int32_t>& ctx, std::int32_t max_nodes,
                    std::int32_t max_depth) override {
    const SuffixStore::Handle doc = follow(req, ctx);
    if (max_nodes <= 0 || max_depth <= 0) return {};
    const auto matches = store_.lookup(ctx, max_match_, max_depth, 2 * static_cast<std::size_t>(breadth_) + 2, doc);
    return tree_from_matches(matches, max_nodes, breadth_);
  }

  void release(std::uint64_t req) override {
    auto it = docs_.find(req);
    if (it == docs_.end()) return;
    store_.close(it->second);
    docs_.erase(it);
  }

  void reconfigure(const config::Snapshot& s) override {
    max_match_ = s->speculative_suffix_max_match;
    breadth_ = static_cast<std::int32_t>(config::draft_shape_args(*s).eagle_topk);
  }

 private:
  // The request's document follows its committed sequence (which only grows).
  SuffixStore::Handle follow(std::uint64_t req, const std::vector<std::int32_t>& ctx) {
    auto [it, fresh] = docs_.try_emplace(req, 0);
    if (fresh) it->second = store_.open();
    const std::size_t have = store_.length(it->second);
    if (ctx.size() > have) store_.extend(it->second, ctx.data() + have, ctx.size() - have);
    return it->second;
  }

  SuffixStore store_;
  std::map<std::uint64_t, SuffixStore::Handle> docs_;
  std::int64_t max_match_ = 32;
  std::int32_t breadth_ = 1;
};

}  // namespace

std::unique_ptr<Drafter> make_suffix_drafter(const config::Snapshot& snapshot, const DraftContext& context) {
  return std::make_unique<SuffixDrafter>(snapshot, context);
}

}  // namespace specactor::drafters
