// drafters/head_drafter.cpp — EAGLE, EAGLE3, MTP and FROZEN_KV_MTP drafting with a head that reads the
// target's hidden states (model/head_model.hpp).
//
// Positions: the head's pair (token t_{p+1}, target feature h_p) sits at position p+1. The target
// commits t_0..t_{n-2} (the root t_{n-1} is not in its KV yet) and hands over h_0..h_{n-2}.
//   EAGLE/EAGLE3/MTP: every head layer keeps its own KV of the committed pairs (slot p = pair p),
//     filled lazily from the target's features (the catch-up after verification); draft nodes are
//     appended after them for one proposal and dropped afterwards. The last committed pair's output
//     gives the root's children. Draft step i (i >= 1) runs head layer min(i, layers-1), so a
//     multi-layer MTP head drafts depth i+1 with its layer i (each layer's KV is filled from the
//     target's features; a layer sees the draft nodes it computed itself).
//   FROZEN_KV_MTP: no KV pool. The root pair and the draft nodes attend into the target's committed
//     KV of its last layer (a read-only view of its pages) and to scratch rows for this proposal.
// Trees follow docs/speculative-kernels.md §1–2: top-k expansion per step by path score, then the best
// speculative_num_draft_tokens - 1 candidates — of those whose path score (the product of the head's
// probabilities from the root) reaches --speculative-draft-p-min; drafting stops at the first depth
// where no frontier node does (llama.cpp's --draft-p-min, on the path rather than the step).
#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "config/resolve.hpp"
#include "drafters/branches.hpp"
#include "drafters/drafter.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/spec.hpp"
#include "model/head_model.hpp"
#include "model/runner.hpp"

namespace specactor::drafters {

namespace {

namespace k = specactor::kernels;

class HeadDrafter final : public Drafter {
  struct State;

 public:
  HeadDrafter(const config::Snapshot& s, const DraftContext& ctx, model::HeadKind kind, bool frozen)
      : frozen_(frozen), kind_(kind), branches_(*s) {
    const std::string algo(config::to_string(s->speculative_algorithm));
    if (!s->speculative_draft_model_path)
      throw std::runtime_error(
          "--speculative-algorithm " + algo +
          " needs --speculative-draft-model-path (a head file; `specactor make-head` writes a random one)");
    if (!ctx.target_weights)
      throw std::runtime_error(algo + " needs the target's weights in this process (its embedding and output head)");
    if (frozen && !ctx.target_kv) throw std::runtime_error(algo + " needs a read-only view of the target's KV cache");
    target_ = ctx.target_weights;
    target_kv_ = ctx.target_kv;
    const auto& tc = target_->config();
    std::vector<std::int32_t> hot;
    if (s->speculative_token_map) hot = model::read_token_map(*s->speculative_token_map, tc.vocab_size);
    // Fast precision: a head stored in float is quantized once (--speculative-draft-quantization, Q8_0
    // unless resolution chose otherwise), so drafting takes the integer kernels.
    const std::string& q = s->speculative_draft_quantization;
    const k::WeightType quantize_to = model::cpu_precision(*s) != k::Precision::Fast || q == "none" ? k::WeightType::F32
                                      : q == "q4_1" ? k::WeightType::Q4_1
                                                    : k::WeightType::Q8_0;
    head_ =
        model::HeadWeights::load(*s->speculative_draft_model_path, kind, tc, hot, frozen, s->load_format, quantize_to);
    runner_ = std::make_unique<model::HeadRunner>(head_, target_, model::cpu_precision(*s));
    const auto& hc = head_->config();
    draft_vocab_ = hc.draft_vocab() > 0 ? hc.draft_vocab() : tc.vocab_size;
    layers_ = static_cast<int>(hc.n_layers);
    page_size_ = s->page_size;
    max_tokens_ = *s->max_total_tokens;
    configure(s);
    if (!frozen)
      for (int l = 0; l < layers_; ++l) {
        kv_.push_back(std::make_unique<model::KvCache>(1, hc.n_kv_heads, hc.head_dim, page_size_, max_tokens_, true,
                                                       model::kv_type(*s)));
        kv_.back()->warm(std::size_t{2} << 20);  // here, not in the first request's draft round
      }
    // The head's own prefix cache: one layer only (the layers of a deeper head take pages in their own
    // order while drafting, so one tree could not name one page for all of them).
    if (!frozen && layers_ == 1) cache_ = std::make_unique<DraftCache>(*kv_[0], !s->disable_radix_cache);
  }

  DrafterNeeds needs() const override { return {head_->config().aux_layers, frozen_}; }

  std::string model_config() const override {
    auto j = head_->config().to_json();
    j["algorithm"] = frozen_ ? "FROZEN_KV_MTP" : model::to_string(kind_);
    j["draft_vocab_size"] = draft_vocab_;
    j["owns_kv_pool"] = !frozen_;
    return j.dump();
  }

  void reconfigure(const config::Snapshot& s) override { configure(s); }
  DraftCacheStats cache_stats() const override { return cache_ ? cache_->stats() : DraftCacheStats{}; }
  std::int64_t flush_cache() override { return cache_ ? cache_->flush() : 0; }

  void observe(std::uint64_t req, const TargetFeatures& f) override {
    State& st = states_[req];
    const std::int64_t width = head_->config().feature_width();
    if (!f.hidden.empty()) {
      if (f.first != st.rows) st.broken = true;  // a gap (e.g. this worker was restarted): no drafts for req
      const auto rows = static_cast<std::int64_t>(f.hidden.size()) / width;
      st.feat.insert(st.feat.end(), f.hidden.begin(), f.hidden.end());
      if (kind_ == model::HeadKind::Eagle)  // EAGLE reads the target's normed last hidden state
        runner_->target_norm(st.feat.data() + (st.feat.size() - f.hidden.size()), rows);
      st.rows += rows;
      if (frozen_ && static_cast<std::int64_t>(st.feat.size()) > width) {  // only the newest row is read
        st.feat.erase(st.feat.begin(), st.feat.end() - width);
        st.feat_base = st.rows - 1;
      }
    }
    if (f.kv_length > 0) {
      st.kv_pages = f.kv_pages;
      st.kv_length = f.kv_length;
    }
  }

  DraftTree propose(std::uint64_t req, const std::vector<std::int32_t>& ctx, std::int32_t max_nodes,
                    std::int32_t max_depth) override {
    if (!frozen_) return std::move(propose_own({{req, &ctx, max_nodes, max_depth}}).front());
    auto it = states_.find(req);
    if (it == states_.end() || ctx.size() < 2) return {};
    State& st = it->second;
    const auto n = static_cast<std::int64_t>(ctx.size());
    if (st.broken || st.rows != n - 1 || st.kv_length != n - 1) return {};  // features do not line up
    const std::int32_t depth = std::min(max_depth, steps_);
    if (depth <= 0 || max_nodes <= 0) return {};
    // The head's tree keeps to its own shape; the branches may use the rest of max_nodes.
    DraftTree t = draft_frozen(st, ctx, max_nodes, depth);
    branches_.add(t, ctx, max_nodes, max_depth, st.doc);
    return t;
  }

  std::vector<DraftTree> propose_batch(const std::vector<ProposeArgs>& round) override {
    return frozen_ ? Drafter::propose_batch(round) : propose_own(round);
  }

  void release(std::uint64_t req) override {
    auto it = states_.find(req);
    if (it == states_.end()) return;
    branches_.release(it->second.doc);
    if (cache_) {
      cache_insert(it->second);
      cache_->finish(it->second.entry);
    }
    for (std::size_t l = 0; l < kv_.size() && l < it->second.seqs.size(); ++l) kv_[l]->release(it->second.seqs[l]);
    states_.erase(it);
  }

 private:
  struct State {
    std::vector<float> feat;  // target features of positions [feat_base, rows)
    std::int64_t feat_base = 0, rows = 0;
    bool broken = false;
    std::vector<model::KvCache::Seq> seqs;  // per head layer (own KV)
    std::int64_t fed = 0;                   // committed pairs in every layer's KV
    std::vector<float> root_hidden;         // output of the last committed pair (layer 0)
    std::vector<std::int32_t> kv_pages;     // FROZEN: the target's committed pages
    std::int64_t kv_length = 0;
    SuffixStore::Handle doc = 0;  // this request in the suffix branch's store (0: none yet)
    // The head's prefix cache: slot p (the pair at position p+1) depends on t_0 .. t_{p+1}, so the key
    // of slot p is t_{p+1} (ctx[1..]) and a tree serves one first token t_0 (key_first_).
    bool started = false, inserted = false, uncached = false;
    std::vector<std::int32_t> key;
    DraftCache::Entry entry;
  };

  // The head's prefix cache at a request's first proposal: start on the longest cached run of pairs
  // (leaving at least the root's pair to compute, whose output starts the tree), and put the pairs
  // caught up on into the tree.
  void cache_start(State& st, const std::vector<std::int32_t>& ctx) {
    st.started = true;
    if (!cache_) return;
    if (key_first_ < 0) key_first_ = ctx[0];
    if (ctx[0] != key_first_) {
      st.uncached = true;
      return;
    }
    st.seqs.resize(static_cast<std::size_t>(layers_));
    cache_key(st, ctx);
    st.fed = cache_->start(st.entry, st.key, static_cast<std::int64_t>(st.key.size()) - 1, st.seqs[0]);
  }
  // The key follows the context (which only grows between proposals: committed tokens and the root).
  void cache_key(State& st, const std::vector<std::int32_t>& ctx) {
    if (!cache_ || st.uncached || ctx.size() <= st.key.size() + 1) return;
    st.key.insert(st.key.end(), ctx.begin() + 1 + static_cast<std::ptrdiff_t>(st.key.size()), ctx.end());
  }
  void cache_insert(State& st) {
    if (cache_ && !st.uncached && !st.seqs.empty()) cache_->insert(st.entry, st.key, st.fed, st.seqs[0]);
  }

  // A node computed in this proposal: which layer, which masked slot, its parent node (-1: none).
  struct Node {
    int layer = 0;
    std::int64_t slot = 0;
    int parent = -1;
  };

  void configure(const config::Snapshot& s) {
    const config::DraftShapeArgs d = config::draft_shape_args(*s);
    steps_ = static_cast<std::int32_t>(d.num_steps);
    topk_ = static_cast<std::int32_t>(d.eagle_topk);
    n_tokens_ = static_cast<std::int32_t>(d.num_draft_tokens);
    p_min_ = static_cast<float>(d.p_min);
    branches_.configure(*s);
    if (static_cast<std::int64_t>(steps_) * topk_ + 1 > config::kMaxHeadDraftNodes)  // resolution refuses it first
      throw std::runtime_error(
          "--speculative-num-steps × --speculative-eagle-topk must stay under 64 draft nodes (got " +
          std::to_string(steps_) + " × " + std::to_string(topk_) + ")");
  }

  std::uint64_t mask_of(const std::vector<Node>& nodes, int node, int layer) const {
    std::uint64_t m = 0;
    for (int a = node; a >= 0; a = nodes[static_cast<std::size_t>(a)].parent)
      if (frozen_ || nodes[static_cast<std::size_t>(a)].layer == layer)
        m |= 1ull << nodes[static_cast<std::size_t>(a)].slot;
    return m;
  }

  // Feeds the committed pairs [st.fed, n-1) into every layer's KV (the catch-up).
  void catch_up(State& st, const std::vector<std::int32_t>& ctx) {
    const auto n = static_cast<std::int64_t>(ctx.size());
    const std::int64_t width = head_->config().feature_width();
    if (st.seqs.size() < static_cast<std::size_t>(layers_)) st.seqs.resize(static_cast<std::size_t>(layers_));
    std::vector<float> hidden;
    for (std::int64_t p0 = st.fed; p0 < n - 1; p0 += 256) {
      const std::int64_t cnt = std::min<std::int64_t>(256, n - 1 - p0);
      std::vector<std::int32_t> toks(ctx.begin() + p0 + 1, ctx.begin() + p0 + 1 + cnt),
          pos(static_cast<std::size_t>(cnt));
      for (std::int64_t i = 0; i < cnt; ++i) pos[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(p0 + 1 + i);
      const float* feat = st.feat.data() + (p0 - st.feat_base) * width;
      for (int l = 0; l < layers_; ++l) {
        auto& cache = *kv_[static_cast<std::size_t>(l)];
        auto& seq = st.seqs[static_cast<std::size_t>(l)];
        cache.reserve(seq, p0 + cnt);
        runner_->project(l, toks.data(), feat, width, cnt, pos.data());
        store(cache, seq, p0, cnt);
        seq.length = p0 + cnt;
        // Only the root's output is kept (layer 0, the last pair): the rest of the layer is not run.
        if (l == 0 && p0 + cnt == n - 1) {
          const k::PagedKvView v = cache.view(0, seq);
          runner_->finish_last(l, {{{v, 0, p0}, {v, p0, cnt}, nullptr, 0, cnt}}, hidden);
          st.root_hidden = hidden;
        }
      }
    }
    st.fed = n - 1;
    // Rows every layer has consumed are not needed again.
    st.feat.erase(st.feat.begin(), st.feat.begin() + (st.fed - st.feat_base) * width);
    st.feat_base = st.fed;
  }

  void store(model::KvCache& cache, const model::KvCache::Seq& seq, std::int64_t first, std::int64_t cnt,
             std::int64_t from_row = 0) {
    const std::int64_t row = runner_->kv_row();
    for (std::int64_t i = 0; i < cnt; ++i)
      cache.write(0, seq, first + i, runner_->k_rows() + (from_row + i) * row,
                  runner_->v_rows() + (from_row + i) * row);
  }

  // One request's tree while it is expanded level by level (docs/speculative-kernels.md §1–2): top-k
  // expansion per step by path score; the frontier's nodes, each with its parent's output hidden row
  // and node.
  struct Expansion {
    std::int32_t max_nodes = 0, depth = 0;
    std::int64_t root_pos = 0;
    std::int32_t step = 1;  // the level expanded next
    std::vector<std::vector<float>> score_list;
    std::vector<std::vector<std::int32_t>> token_list, parents_list;
    std::vector<std::int32_t> cand_parent;  // candidate id -> parent candidate id (-1: the root)
    std::vector<std::int32_t> frontier, frontier_tokens;
    std::vector<float> frontier_scores, parent_hidden;
    std::vector<int> parent_node;
  };

  static Expansion expansion(std::int32_t max_nodes, std::int32_t depth, std::int64_t root_pos) {
    Expansion e;
    e.max_nodes = max_nodes;
    e.depth = depth;
    e.root_pos = root_pos;
    return e;
  }

  // Softmax of each of `rows` logit rows, in place.
  void softmax_rows(std::vector<float>& logits, std::int64_t rows) const {
    for (std::int64_t j = 0; j < rows; ++j) k::softmax_cpu(logits.data() + j * draft_vocab_, draft_vocab_);
  }

  // The first level, from the root's draft probabilities (one row) and its output.
  void expansion_begin(Expansion& e, const float* root_probs, const float* root_hidden, int root_node) const {
    const std::int64_t H = head_->config().hidden;
    const k::ExpandStep s = k::topk_expand_cpu(root_probs, 1, draft_vocab_, topk_, 0, {}, {});
    e.cand_parent.assign(s.tokens.size(), -1);
    e.score_list.push_back(s.scores);
    e.token_list.push_back(s.tokens);
    e.parents_list.push_back(s.parents);
    e.frontier = s.frontier_ids;
    e.frontier_tokens = s.frontier_tokens;
    e.frontier_scores = s.frontier_scores;
    e.parent_hidden.clear();
    for (std::size_t j = 0; j < e.frontier.size(); ++j)
      e.parent_hidden.insert(e.parent_hidden.end(), root_hidden, root_hidden + H);
    e.parent_node.assign(e.frontier.size(), root_node);
  }

  // Another level is drafted while the depth allows and a frontier node reaches the floor (a child's
  // path probability is at most its parent's: below the floor, no deeper node can count).
  bool expansion_continues(const Expansion& e) const {
    return e.step < e.depth && !e.frontier_scores.empty() &&
           *std::max_element(e.frontier_scores.begin(), e.frontier_scores.end()) >= p_min_;
  }

  // The next level's rows: the frontier's tokens (target ids) and their positions.
  void expansion_inputs(const Expansion& e, std::vector<std::int32_t>& toks, std::vector<std::int32_t>& pos) const {
    for (std::int32_t t : e.frontier_tokens) {
      toks.push_back(runner_->to_target(t));
      pos.push_back(static_cast<std::int32_t>(e.root_pos + e.step));
    }
  }

  // The level's outputs: the frontier rows' hidden outputs and softmaxed draft probabilities, and the
  // nodes they were computed as.
  void expansion_absorb(Expansion& e, const float* out, const float* probs, const std::vector<int>& made) const {
    const std::int64_t H = head_->config().hidden;
    const std::int32_t kk = topk_;
    const auto nf = static_cast<std::int32_t>(e.frontier.size());
    const k::ExpandStep s = k::topk_expand_cpu(probs, nf, draft_vocab_, kk, e.step, e.frontier_scores, e.frontier);
    for (std::size_t c = 0; c < s.tokens.size(); ++c)
      e.cand_parent.push_back(e.frontier[c / static_cast<std::size_t>(kk)]);
    e.score_list.push_back(s.scores);
    e.token_list.push_back(s.tokens);
    e.parents_list.push_back(s.parents);
    const std::int32_t first_id = kk + kk * kk * (e.step - 1);
    std::vector<float> next_hidden;
    std::vector<int> next_node;
    for (std::int32_t id : s.frontier_ids) {
      const auto f = static_cast<std::size_t>(id - first_id) / static_cast<std::size_t>(kk);
      next_hidden.insert(next_hidden.end(), out + f * H, out + (f + 1) * H);
      next_node.push_back(made[f]);
    }
    e.frontier = s.frontier_ids;
    e.frontier_tokens = s.frontier_tokens;
    e.frontier_scores = s.frontier_scores;
    e.parent_hidden = std::move(next_hidden);
    e.parent_node = std::move(next_node);
    ++e.step;
  }

  // The best candidates by path probability, only those reaching the floor (--speculative-draft-p-min):
  // as the best are taken first, limiting their number to the candidates at or above it is enough.
  DraftTree expansion_tree(const Expansion& e) const {
    std::vector<float> all_scores;
    for (const auto& v : e.score_list) all_scores.insert(all_scores.end(), v.begin(), v.end());
    const auto confident = static_cast<std::int32_t>(
        std::count_if(all_scores.begin(), all_scores.end(), [&](float sc) { return sc >= p_min_; }));
    const std::int32_t want = std::min<std::int32_t>({e.max_nodes, n_tokens_ - 1, confident});
    if (want <= 0) return {};  // not even the first draft is likely: the target decodes plainly
    const k::Organized o = k::organize_draft_results_cpu(e.score_list, e.token_list, e.parents_list, want + 1);
    DraftTree t;
    std::map<std::int32_t, std::int32_t> index;  // candidate id -> index in t
    std::vector<std::int32_t> all_tokens;
    for (const auto& v : e.token_list) all_tokens.insert(all_tokens.end(), v.begin(), v.end());
    for (std::int32_t c : o.selected) {
      const std::int32_t par = e.cand_parent[static_cast<std::size_t>(c)];
      std::int32_t pi = -1;
      if (par >= 0) {
        auto p = index.find(par);
        if (p == index.end()) continue;  // its parent was not selected (a score tie): drop it
        pi = p->second;
      }
      index[c] = static_cast<std::int32_t>(t.tokens.size());
      t.tokens.push_back(runner_->to_target(all_tokens[static_cast<std::size_t>(c)]));
      t.parents.push_back(pi);
      t.scores.push_back(all_scores[static_cast<std::size_t>(c)]);
    }
    return t;
  }

  // One request's expansion with `forward(layer, tokens, parent features, positions, parent nodes,
  // made)` running each level (FROZEN_KV_MTP); the first level comes from root_hidden.
  template <class Forward>
  DraftTree expand(const std::vector<float>& root_hidden, int root_node, std::int64_t root_pos, std::int32_t max_nodes,
                   std::int32_t depth, Forward&& forward) {
    Expansion e = expansion(max_nodes, depth, root_pos);
    std::vector<float> logits;
    runner_->logits(0, root_hidden.data(), 1, logits);
    softmax_rows(logits, 1);
    expansion_begin(e, logits.data(), root_hidden.data(), root_node);
    while (expansion_continues(e)) {
      std::vector<std::int32_t> toks, pos;
      expansion_inputs(e, toks, pos);
      const int layer = std::min<int>(e.step, layers_ - 1);
      std::vector<int> made;
      const std::vector<float> out = forward(layer, toks, e.parent_hidden, pos, e.parent_node, made);
      runner_->logits(layer, out.data(), static_cast<std::int64_t>(toks.size()), logits);
      softmax_rows(logits, static_cast<std::int64_t>(toks.size()));
      expansion_absorb(e, out.data(), logits.data(), made);
    }
    return expansion_tree(e);
  }

  // A request of a proposal round drafting with the head's own KV (EAGLE, EAGLE3, MTP).
  struct Work {
    std::size_t index = 0;  // in the round
    State* st = nullptr;
    const std::vector<std::int32_t>* ctx = nullptr;
    Expansion e;
    std::vector<Node> nodes;
    std::vector<int> made;
    std::vector<std::uint64_t> mask;
    std::int64_t first_row = 0, rows = 0;  // its rows in the level being run
    bool failed = false;                   // the head's KV is full: no draft this round
  };

  // Before catch-up: the request's layers back to its committed pairs, the head's prefix cache.
  void prepare_own(State& st, const std::vector<std::int32_t>& ctx) {
    const auto n = static_cast<std::int64_t>(ctx.size());
    for (int l = 0; l < static_cast<int>(st.seqs.size()); ++l)
      kv_[static_cast<std::size_t>(l)]->truncate(st.seqs[static_cast<std::size_t>(l)], st.fed);
    if (!st.started) cache_start(st, ctx);
    cache_key(st, ctx);
    if (cache_)
      cache_->make_room(kv_[0]->pages_for(n + config::kMaxHeadDraftNodes) -
                        static_cast<std::int64_t>(st.seqs.empty() ? 0 : st.seqs[0].pages.size()));
  }

  // Catch-ups of at most this many pairs run together; longer ones (a prompt) alone, in chunks.
  static constexpr std::int64_t kJointCatchUp = 64;

  // Every request's catch-up: the short ones in one head forward per layer for all of their pairs.
  void catch_up_round(std::vector<Work>& work) {
    const std::int64_t width = head_->config().feature_width();
    std::vector<Work*> joint;
    for (Work& w : work) {
      State& st = *w.st;
      const std::int64_t pending = static_cast<std::int64_t>(w.ctx->size()) - 1 - st.fed;
      if (pending <= 0 && !st.root_hidden.empty()) continue;
      try {
        if (st.seqs.size() < static_cast<std::size_t>(layers_)) st.seqs.resize(static_cast<std::size_t>(layers_));
        if (pending <= 0 || pending > kJointCatchUp) {
          catch_up(st, *w.ctx);
          continue;
        }
        for (int l = 0; l < layers_; ++l)
          kv_[static_cast<std::size_t>(l)]->reserve(st.seqs[static_cast<std::size_t>(l)], st.fed + pending);
        joint.push_back(&w);
      } catch (const model::KvExhausted&) {
        w.failed = true;
      }
    }
    if (joint.empty()) return;
    std::vector<std::int32_t> toks, pos;
    std::vector<float> feat, hidden;
    for (Work* w : joint) {
      State& st = *w->st;
      const auto n = static_cast<std::int64_t>(w->ctx->size());
      w->first_row = static_cast<std::int64_t>(toks.size());
      w->rows = n - 1 - st.fed;
      for (std::int64_t p = st.fed; p < n - 1; ++p) {
        toks.push_back((*w->ctx)[static_cast<std::size_t>(p + 1)]);
        pos.push_back(static_cast<std::int32_t>(p + 1));
      }
      const float* f = st.feat.data() + (st.fed - st.feat_base) * width;
      feat.insert(feat.end(), f, f + w->rows * width);
    }
    const auto total = static_cast<std::int64_t>(toks.size());
    for (int l = 0; l < layers_; ++l) {
      auto& cache = *kv_[static_cast<std::size_t>(l)];
      runner_->project(l, toks.data(), feat.data(), width, total, pos.data());
      std::vector<model::HeadRunner::AttentionPart> parts;
      for (Work* w : joint) {
        auto& seq = w->st->seqs[static_cast<std::size_t>(l)];
        const std::int64_t p0 = w->st->fed;
        store(cache, seq, p0, w->rows, w->first_row);
        seq.length = p0 + w->rows;
      }
      if (l != 0) continue;    // only the roots' outputs (layer 0, each request's last pair) are kept
      for (Work* w : joint) {  // views after every write: a view holds the page table as it is
        const k::PagedKvView v = cache.view(0, w->st->seqs[static_cast<std::size_t>(l)]);
        parts.push_back({{v, 0, w->st->fed}, {v, w->st->fed, w->rows}, nullptr, w->first_row, w->rows});
      }
      runner_->finish_last(l, parts, hidden);
      const std::int64_t H = head_->config().hidden;
      for (std::size_t i = 0; i < joint.size(); ++i)
        joint[i]->st->root_hidden.assign(hidden.begin() + static_cast<long>(i) * H,
                                         hidden.begin() + static_cast<long>(i + 1) * H);
    }
    for (Work* w : joint) {
      State& st = *w->st;
      st.fed = static_cast<std::int64_t>(w->ctx->size()) - 1;
      st.feat.erase(st.feat.begin(), st.feat.begin() + (st.fed - st.feat_base) * width);
      st.feat_base = st.fed;
    }
  }

  // EAGLE/EAGLE3/MTP: the requests of a round expand together — one head forward and one output
  // head product per level over all of their frontier rows; each attends to its own KV.
  std::vector<DraftTree> propose_own(const std::vector<ProposeArgs>& round) {
    std::vector<DraftTree> out(round.size());
    std::vector<Work> work;
    for (std::size_t i = 0; i < round.size(); ++i) {
      const ProposeArgs& a = round[i];
      auto it = states_.find(a.req);
      if (it == states_.end() || a.context->size() < 2) continue;
      State& st = it->second;
      const auto n = static_cast<std::int64_t>(a.context->size());
      if (st.broken || st.rows != n - 1) continue;  // features do not line up with the context
      const std::int32_t depth = std::min(a.max_depth, steps_);
      if (depth <= 0 || a.max_nodes <= 0) continue;
      try {
        prepare_own(st, *a.context);
      } catch (const model::KvExhausted&) {
        continue;
      }
      Work w;
      w.index = i;
      w.st = &st;
      w.ctx = a.context;
      w.e = expansion(a.max_nodes, depth, n - 1);
      work.push_back(std::move(w));
    }
    catch_up_round(work);
    for (Work& w : work)
      if (!w.failed && !w.st->inserted) {
        w.st->inserted = true;
        cache_insert(*w.st);
      }
    const std::int64_t H = head_->config().hidden;
    std::vector<float> rows, logits, hidden;
    std::vector<Work*> live;
    for (Work& w : work)
      if (!w.failed && static_cast<std::int64_t>(w.st->root_hidden.size()) == H) {
        live.push_back(&w);
        rows.insert(rows.end(), w.st->root_hidden.begin(), w.st->root_hidden.end());
      }
    if (!live.empty()) {
      runner_->logits(0, rows.data(), static_cast<std::int64_t>(live.size()), logits);
      softmax_rows(logits, static_cast<std::int64_t>(live.size()));
      for (std::size_t j = 0; j < live.size(); ++j)
        expansion_begin(live[j]->e, logits.data() + static_cast<std::int64_t>(j) * draft_vocab_,
                        live[j]->st->root_hidden.data(), -1);
    }
    for (std::int32_t step = 1;; ++step) {
      const int layer = std::min<int>(step, layers_ - 1);
      auto& cache = *kv_[static_cast<std::size_t>(layer)];
      std::vector<Work*> active;
      for (Work* w : live) {
        if (w->failed || !expansion_continues(w->e)) continue;
        try {
          auto& seq = w->st->seqs[static_cast<std::size_t>(layer)];
          cache.reserve(seq, seq.length + static_cast<std::int64_t>(w->e.frontier.size()));
          active.push_back(w);
        } catch (const model::KvExhausted&) {
          w->failed = true;
        }
      }
      if (active.empty()) break;
      std::vector<std::int32_t> toks, pos;
      std::vector<float> feat;
      for (Work* w : active) {
        w->first_row = static_cast<std::int64_t>(toks.size());
        w->rows = static_cast<std::int64_t>(w->e.frontier.size());
        expansion_inputs(w->e, toks, pos);
        feat.insert(feat.end(), w->e.parent_hidden.begin(), w->e.parent_hidden.end());
      }
      const auto total = static_cast<std::int64_t>(toks.size());
      runner_->project(layer, toks.data(), feat.data(), H, total, pos.data());
      for (Work* w : active) {
        State& st = *w->st;
        auto& seq = st.seqs[static_cast<std::size_t>(layer)];
        const std::int64_t first = seq.length;
        w->made.clear();
        w->mask.assign(static_cast<std::size_t>(w->rows), 0);
        for (std::int64_t j = 0; j < w->rows; ++j) {
          w->nodes.push_back({layer, first + j - st.fed, w->e.parent_node[static_cast<std::size_t>(j)]});
          w->made.push_back(static_cast<int>(w->nodes.size()) - 1);
          w->mask[static_cast<std::size_t>(j)] = mask_of(w->nodes, w->made.back(), layer);
        }
        store(cache, seq, first, w->rows, w->first_row);
        seq.length = first + w->rows;
      }
      std::vector<model::HeadRunner::AttentionPart> parts;
      for (Work* w : active) {
        const auto& seq = w->st->seqs[static_cast<std::size_t>(layer)];
        const k::PagedKvView v = cache.view(0, seq);
        parts.push_back(
            {{v, 0, w->st->fed}, {v, w->st->fed, seq.length - w->st->fed}, w->mask.data(), w->first_row, w->rows});
      }
      runner_->finish(layer, parts, hidden);
      runner_->logits(layer, hidden.data(), total, logits);
      softmax_rows(logits, total);
      for (Work* w : active)
        expansion_absorb(w->e, hidden.data() + w->first_row * H, logits.data() + w->first_row * draft_vocab_, w->made);
    }
    for (Work& w : work) {
      for (std::size_t l = 0; l < w.st->seqs.size(); ++l) kv_[l]->truncate(w.st->seqs[l], w.st->fed);
      if (w.failed || w.e.score_list.empty())
        continue;  // the head's cache is full: the target decodes plainly this step
      const ProposeArgs& a = round[w.index];
      DraftTree t = expansion_tree(w.e);
      branches_.add(t, *a.context, a.max_nodes, a.max_depth, w.st->doc);
      out[w.index] = std::move(t);
    }
    return out;
  }

  DraftTree draft_frozen(State& st, const std::vector<std::int32_t>& ctx, std::int32_t max_nodes, std::int32_t depth) {
    const auto n = static_cast<std::int64_t>(ctx.size());
    const auto& hc = head_->config();
    const std::int64_t row = runner_->kv_row();
    // Scratch rows for this proposal (not a pool: nothing outlives the call).
    scratch_k_.assign(static_cast<std::size_t>(64 * row), 0.0f);
    scratch_v_.assign(scratch_k_.size(), 0.0f);
    static const std::int32_t page0 = 0;
    const k::PagedKvView scratch{scratch_k_.data(), scratch_v_.data(), &page0, 64, 64 * row, row};
    const model::KvCache::Seq target_seq{st.kv_pages, st.kv_length};
    const k::KvSegment prefix{target_kv_->view(target_->config().n_layers - 1, target_seq), 0, st.kv_length};
    std::vector<Node> nodes;
    std::vector<float> hidden;
    std::int64_t used = 0;
    auto forward = [&](int layer, const std::vector<std::int32_t>& toks, const std::vector<float>& feat,
                       const std::vector<std::int32_t>& pos, const std::vector<int>& parents, std::vector<int>& made) {
      const auto cnt = static_cast<std::int64_t>(toks.size());
      std::vector<std::uint64_t> mask(static_cast<std::size_t>(cnt));
      for (std::int64_t j = 0; j < cnt; ++j) {
        nodes.push_back({layer, used + j, parents[static_cast<std::size_t>(j)]});
        made.push_back(static_cast<int>(nodes.size()) - 1);
        mask[static_cast<std::size_t>(j)] = mask_of(nodes, made.back(), layer);
      }
      runner_->project(layer, toks.data(), feat.data(), static_cast<std::int64_t>(feat.size()) / cnt, cnt, pos.data());
      std::copy(runner_->k_rows(), runner_->k_rows() + cnt * row, scratch_k_.begin() + used * row);
      std::copy(runner_->v_rows(), runner_->v_rows() + cnt * row, scratch_v_.begin() + used * row);
      used += cnt;
      runner_->finish(layer, prefix, {scratch, 0, used}, mask.data(), hidden);
      return hidden;
    };
    // The root pair (t_{n-1}, h_{n-2}) at position n-1, with the target's feature.
    std::vector<int> made;
    const std::vector<float> root_feat(st.feat.end() - hc.feature_width(), st.feat.end());
    std::vector<float> root_hidden =
        forward(0, {ctx.back()}, root_feat, {static_cast<std::int32_t>(n - 1)}, {-1}, made);
    (void)row;
    return expand(root_hidden, made[0], n - 1, max_nodes, depth, forward);
  }

  bool frozen_;
  model::HeadKind kind_;
  std::shared_ptr<const model::LlamaWeights> target_;
  std::shared_ptr<const model::KvCache> target_kv_;  // read-only: only const members are reachable
  std::shared_ptr<const model::HeadWeights> head_;
  std::unique_ptr<model::HeadRunner> runner_;
  std::vector<std::unique_ptr<model::KvCache>> kv_;  // per head layer (not FROZEN_KV_MTP)
  std::unique_ptr<DraftCache> cache_;                // over kv_[0] (one-layer heads), declared after it
  std::int32_t key_first_ = -1;                      // the first token of every sequence in cache_
  std::vector<float> scratch_k_, scratch_v_;
  std::int64_t draft_vocab_ = 0, page_size_ = 0, max_tokens_ = 0;
  int layers_ = 1;
  std::int32_t steps_ = 3, topk_ = 1, n_tokens_ = 4;
  float p_min_ = 0.0f;         // --speculative-draft-p-min
  ProposalBranches branches_;  // --speculative-draft-ngram-tokens, --speculative-draft-suffix-tokens
  std::map<std::uint64_t, State> states_;
};

}  // namespace

std::unique_ptr<Drafter> make_eagle_drafter(const config::Snapshot& s, const DraftContext& c) {
  return std::make_unique<HeadDrafter>(s, c, model::HeadKind::Eagle, false);
}
std::unique_ptr<Drafter> make_eagle3_drafter(const config::Snapshot& s, const DraftContext& c) {
  return std::make_unique<HeadDrafter>(s, c, model::HeadKind::Eagle3, false);
}
std::unique_ptr<Drafter> make_mtp_drafter(const config::Snapshot& s, const DraftContext& c) {
  return std::make_unique<HeadDrafter>(s, c, model::HeadKind::Mtp, false);
}
std::unique_ptr<Drafter> make_frozen_kv_mtp_drafter(const config::Snapshot& s, const DraftContext& c) {
  return std::make_unique<HeadDrafter>(s, c, model::HeadKind::Mtp, true);
}

}  // namespace specactor::drafters
