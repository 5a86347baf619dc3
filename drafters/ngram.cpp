// drafters/ngram.cpp — NGRAM drafting (prompt lookup): match the longest recent suffix of the
// sequence against the sequence itself (prompt and everything generated) and, optionally, an
// external corpus indexed once at start-up (a suffix array over its tokens); propose what followed
// the matches. With topk = 1 the proposal is one chain; with topk > 1 several continuations are
// merged into a trie whose nodes share prefixes (at most min(topk, max_bfs_breadth) children each).
#include <algorithm>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "config/error.hpp"
#include "config/input.hpp"
#include "config/resolve.hpp"
#include "drafters/drafter.hpp"

namespace specactor::drafters {

namespace {

using Tokens = std::vector<std::int32_t>;

// Calls visit(end) for every earlier occurrence ctx[end-w, end) of the last w tokens, latest first,
// until visit returns false.
template <class Visit>
void for_each_match(const Tokens& ctx, std::int64_t w, Visit&& visit) {
  const auto n = static_cast<std::int64_t>(ctx.size());
  const auto* suffix = ctx.data() + (n - w);
  for (std::int64_t end = n - 1; end >= w; --end)
    if (std::equal(suffix, suffix + w, ctx.data() + (end - w)) && !visit(end)) return;
}

class NgramDrafter final : public Drafter {
 public:
  NgramDrafter(const config::Snapshot& s, const DraftContext& ctx) {
    reconfigure(s);
    if (s->speculative_ngram_corpus_path) load_corpus(*s->speculative_ngram_corpus_path, ctx);
  }

  DraftTree propose(std::uint64_t, const Tokens& ctx, std::int32_t max_nodes, std::int32_t max_depth) override {
    DraftTree out;
    if (max_nodes <= 0 || max_depth <= 0 || ctx.size() < 2) return out;
    std::vector<std::int64_t> windows;
    std::vector<Tokens> conts = continuations(ctx, max_depth, windows);
    // A trie over the continuations, first (best) continuation first. A node's score is w / (w + 2)
    // for the longest matched window w through it (the scheduler calibrates it; only its order counts).
    struct Node {
      std::int32_t token, parent;
      std::vector<std::int32_t> children;
      float score = 0;
    };
    std::vector<Node> nodes;  // node i = draft i; parent -1 = root
    std::vector<std::int32_t> root_children;
    for (std::size_t ci = 0; ci < conts.size(); ++ci) {
      const Tokens& c = conts[ci];
      const auto w = static_cast<float>(windows[ci]);
      std::int32_t at = -1;
      for (std::int32_t t : c) {
        auto& kids = at < 0 ? root_children : nodes[static_cast<std::size_t>(at)].children;
        std::int32_t next = -1;
        for (std::int32_t k : kids)
          if (nodes[static_cast<std::size_t>(k)].token == t) next = k;
        if (next < 0) {
          if (static_cast<std::int32_t>(nodes.size()) >= max_nodes ||
              static_cast<std::int32_t>(kids.size()) >= breadth_)
            break;
          next = static_cast<std::int32_t>(nodes.size());
          kids.push_back(next);
          nodes.push_back({t, at, {}, 0.0f});
        }
        auto& nd = nodes[static_cast<std::size_t>(next)];
        nd.score = std::max(nd.score, w / (w + 2.0f));
        if (at >= 0) nd.score = std::min(nd.score, nodes[static_cast<std::size_t>(at)].score);
        at = next;
      }
      if (static_cast<std::int32_t>(nodes.size()) >= max_nodes) break;
    }
    // Nodes were created parent-first, so indices already satisfy parent < child.
    for (const Node& n : nodes) {
      out.tokens.push_back(n.token);
      out.parents.push_back(n.parent);
      out.scores.push_back(n.score);
    }
    return out;
  }

  void reconfigure(const config::Snapshot& s) override {
    min_window_ = s->speculative_ngram_min_match_window_size;
    max_window_ = s->speculative_ngram_max_match_window_size;
    breadth_ = static_cast<std::int32_t>(
        std::min<std::int64_t>(config::draft_shape_args(*s).eagle_topk, s->speculative_ngram_max_bfs_breadth));
    if (breadth_ < 1) breadth_ = 1;
  }

 private:
  // Continuations of the longest suffix matches: most recent in the sequence first, then corpus.
  std::vector<Tokens> continuations(const Tokens& ctx, std::int32_t max_depth,
                                    std::vector<std::int64_t>& windows) const {
    std::vector<Tokens> out;
    const auto n = static_cast<std::int64_t>(ctx.size());
    const std::size_t want = static_cast<std::size_t>(breadth_) * 2;
    for (std::int64_t w = std::min<std::int64_t>(max_window_, n - 1); w >= min_window_ && out.size() < want; --w) {
      for_each_match(ctx, w, [&](std::int64_t end) {
        add(out, Tokens(ctx.begin() + end, ctx.begin() + end + std::min<std::int64_t>(max_depth, n - end)));
        return out.size() < want;
      });
      if (!corpus_.empty()) corpus_matches(ctx.data() + (n - w), w, max_depth, out, want);
      windows.resize(out.size(), w);
      if (!out.empty() && breadth_ == 1) break;
    }
    return out;
  }

  static void add(std::vector<Tokens>& out, Tokens c) {
    if (c.empty()) return;
    for (const auto& o : out)
      if (o == c) return;
    out.push_back(std::move(c));
  }

  // Binary search of the suffix array for suffixes starting with pattern[0..w).
  void corpus_matches(const std::int32_t* pattern, std::int64_t w, std::int32_t max_depth, std::vector<Tokens>& out,
                      std::size_t want) const {
    auto less_suffix = [&](std::int64_t pos, bool upper) {
      // compare corpus[pos..] with pattern, limited to w tokens
      for (std::int64_t i = 0; i < w; ++i) {
        if (pos + i >= static_cast<std::int64_t>(corpus_.size())) return true;  // shorter suffix sorts first
        const auto a = corpus_[static_cast<std::size_t>(pos + i)], b = pattern[i];
        if (a != b) return a < b;
      }
      return upper;  // equal prefix: lower_bound stops here, upper_bound passes it
    };
    auto lo = std::partition_point(sa_.begin(), sa_.end(), [&](std::int64_t p) { return less_suffix(p, false); });
    auto hi = std::partition_point(lo, sa_.end(), [&](std::int64_t p) { return less_suffix(p, true); });
    for (auto it = lo; it != hi && out.size() < want; ++it) {
      const std::int64_t start = *it + w;
      const std::int64_t take = std::min<std::int64_t>(max_depth, static_cast<std::int64_t>(corpus_.size()) - start);
      if (take > 0) add(out, Tokens(corpus_.begin() + start, corpus_.begin() + start + take));
    }
  }

  void load_corpus(const std::string& path, const DraftContext& ctx) {
    const std::string what = "--speculative-ngram-corpus-path " + path;
    const std::string text = config::read_text_file(path, what);
    if (!ctx.tokenizer)
      throw std::runtime_error(
          "--speculative-ngram-corpus-path needs the target's tokenizer (not --skip-tokenizer-init)");
    try {
      corpus_ = ctx.tokenizer->encode(text);
    } catch (const config::ConfigError& e) {
      throw config::ConfigError(what + ": " + e.what());
    }
    sa_.resize(corpus_.size());
    for (std::size_t i = 0; i < sa_.size(); ++i) sa_[i] = static_cast<std::int64_t>(i);
    const std::int64_t cap = std::max<std::int64_t>(max_window_, 1) + 1;  // suffixes compared on a bounded prefix
    std::sort(sa_.begin(), sa_.end(), [&](std::int64_t a, std::int64_t b) {
      for (std::int64_t i = 0; i < cap; ++i) {
        const bool ea = a + i >= static_cast<std::int64_t>(corpus_.size()),
                   eb = b + i >= static_cast<std::int64_t>(corpus_.size());
        if (ea || eb) return ea && !eb;
        const auto x = corpus_[static_cast<std::size_t>(a + i)], y = corpus_[static_cast<std::size_t>(b + i)];
        if (x != y) return x < y;
      }
      return a < b;
    });
  }

  std::int64_t min_window_ = 1, max_window_ = 12;
  std::int32_t breadth_ = 1;
  Tokens corpus_;
  std::vector<std::int64_t> sa_;
};

}  // namespace

std::vector<std::int32_t> latest_match_continuation(const std::vector<std::int32_t>& ctx, std::int64_t min_window,
                                                    std::int64_t max_window, std::int64_t max_len) {
  // One pass over the earlier positions, latest first: how many of the last tokens match before each
  // (at most max_window); the first position with the most wins.
  const auto n = static_cast<std::int64_t>(ctx.size());
  std::int64_t best = 0, best_end = -1;
  for (std::int64_t end = n - 1; end >= 1 && best < max_window; --end) {
    std::int64_t len = 0;
    while (len < max_window && len < end &&
           ctx[static_cast<std::size_t>(end - 1 - len)] == ctx[static_cast<std::size_t>(n - 1 - len)])
      ++len;
    if (len > best) best = len, best_end = end;
  }
  if (best < std::max<std::int64_t>(min_window, 1) || max_len <= 0) return {};
  return Tokens(ctx.begin() + best_end, ctx.begin() + best_end + std::min<std::int64_t>(max_len, n - best_end));
}

std::int32_t merge_chain(DraftTree& tree, const std::vector<std::int32_t>& chain, std::int32_t max_new, float score) {
  std::int32_t at = -1, added = 0;
  for (const std::int32_t tok : chain) {
    std::int32_t next = -1;
    for (std::size_t j = 0; j < tree.tokens.size() && next < 0; ++j)
      if (tree.parents[j] == at && tree.tokens[j] == tok) next = static_cast<std::int32_t>(j);
    if (next < 0) {
      if (added >= max_new) break;
      next = static_cast<std::int32_t>(tree.tokens.size());
      if (tree.scores.size() == tree.tokens.size()) tree.scores.push_back(score);
      tree.tokens.push_back(tok);
      tree.parents.push_back(at);
      ++added;
    }
    at = next;
  }
  return added;
}

std::unique_ptr<Drafter> make_ngram_drafter(const config::Snapshot& snapshot, const DraftContext& context) {
  return std::make_unique<NgramDrafter>(snapshot, context);
}

}  // namespace specactor::drafters
