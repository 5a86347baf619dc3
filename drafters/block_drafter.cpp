// drafters/block_drafter.cpp — DFLASH and DSPARK: a block drafter (model/block_drafter.hpp) drafts a
// chain of up to block_size − 1 tokens in one forward pass.
//
// Positions: the target commits t_0 … t_{n−2} and hands over their hidden rows h_0 … h_{n−2} (the
// outputs of the drafter's target_layer_ids); the root t_{n−1} is not in its KV yet. The drafter's KV
// holds one context row per committed position p (from h_p, at position p), filled when a proposal
// needs it, never rolled back (nothing uncommitted is written there). A proposal runs the root and one
// mask row per draft asked for, [t_{n−1}, MASK × d] at positions n−1 … n−1+d with d = min(depth, B−1)
// (the rows attend to each other, so a shorter block drafts a little differently from the trained B;
// the numpy reference takes the same rows).
// With --speculative-use-rejection-sampling at T > 0 each draft is drawn from the drafter's
// probabilities at its position (sent along for rejection sampling); otherwise the chain is the argmax.
// DSPARK adds, row by row after the pass, the Markov term of the token before each draft (so draft i
// is chosen from logits that saw draft i−1) and a confidence per row; each draft's score is the product
// of the confidences up to it (the predicted probability that it is accepted), from which the budget
// picks how much of the chain the target verifies.
// --speculative-eagle-topk K adds the first row's next K−1 likeliest tokens as leaves below the root
// (scored: DFLASH by their probabilities in that row, DSPARK by what the first draft's confidence
// leaves, (1 − c₁) split as the row's probabilities split the rest);
// --speculative-draft-ngram-tokens / --speculative-draft-suffix-tokens merge a prompt-lookup or suffix
// branch into the tree (drafters/branches.hpp), as for the head drafters.
#include "model/block_drafter.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "config/resolve.hpp"
#include "drafters/branches.hpp"
#include "drafters/drafter.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/sampling.hpp"
#include "model/runner.hpp"

namespace specactor::drafters {

namespace {

namespace k = specactor::kernels;

class BlockDrafter final : public Drafter {
 public:
  BlockDrafter(const config::Snapshot& s, const DraftContext& ctx)
      : sampling_(s->speculative_use_rejection_sampling), branches_(*s) {
    reconfigure(s);
    const std::string algo(config::to_string(s->speculative_algorithm));
    if (!s->speculative_draft_model_path)
      throw std::runtime_error("--speculative-algorithm " + algo +
                               " needs --speculative-draft-model-path (a DFlash drafter folder: config.json and "
                               "safetensors; `specactor make-head --kind dflash` writes a random one)");
    if (!ctx.target_weights)
      throw std::runtime_error(algo + " needs the target's weights in this process (its embedding and output head)");
    target_ = ctx.target_weights;
    const std::string& q = s->speculative_draft_quantization;
    const k::Precision precision = model::cpu_precision(*s);
    const k::WeightType quantize_to = precision != k::Precision::Fast || q == "none" ? k::WeightType::F32
                                      : q == "q4_1"                                  ? k::WeightType::Q4_1
                                                                                     : k::WeightType::Q8_0;
    weights_ = model::BlockDraftWeights::load(*s->speculative_draft_model_path, target_->config(),
                                              s->context_length.value_or(target_->config().context_length),
                                              s->load_format, quantize_to);
    const auto& c = weights_->config();
    const bool want_dspark = s->speculative_algorithm == config::SpecAlgorithm::Dspark;
    if (c.dspark != want_dspark)
      throw std::runtime_error("--speculative-algorithm " + algo + ": " + *s->speculative_draft_model_path + " is a " +
                               (c.dspark ? "DSPARK" : "DFLASH") + " drafter (its config.json names " +
                               (c.dspark ? "DSparkDraftModel" : "DFlashDraftModel") +
                               "); use --speculative-algorithm " + (c.dspark ? "DSPARK" : "DFLASH"));
    runner_ = std::make_unique<model::BlockDraftRunner>(weights_, target_, precision);
    kv_ = std::make_unique<model::KvCache>(c.n_layers, c.n_kv_heads, c.head_dim, s->page_size, *s->max_total_tokens,
                                           true, model::kv_type(*s));
    kv_->warm(std::size_t{2} << 20);
  }

  DrafterNeeds needs() const override { return {weights_->config().target_layer_ids, false}; }

  std::string model_config() const override {
    auto j = weights_->config().to_json();
    j["algorithm"] = weights_->config().dspark ? "DSPARK" : "DFLASH";
    j["owns_kv_pool"] = true;
    return j.dump();
  }

  void set_sampling(std::uint64_t req, const k::SamplingParams& params, std::uint64_t seed) override {
    State& st = states_[req];
    st.params = params;
    if (!st.seeded) {
      st.rng = k::Rng(seed ^ 0xdf1a54b10c4ULL);  // the draft's own stream, independent of the target's
      st.seeded = true;
    }
  }

  void observe(std::uint64_t req, const TargetFeatures& f) override {
    if (f.hidden.empty()) return;
    State& st = states_[req];
    const std::int64_t width = weights_->config().feature_width();
    if (f.first != st.rows) st.broken = true;  // a gap (e.g. this worker restarted): no drafts for req
    st.feat.insert(st.feat.end(), f.hidden.begin(), f.hidden.end());
    st.rows += static_cast<std::int64_t>(f.hidden.size()) / width;
  }

  DraftTree propose(std::uint64_t req, const std::vector<std::int32_t>& ctx, std::int32_t max_nodes,
                    std::int32_t max_depth) override {
    auto it = states_.find(req);
    if (it == states_.end() || ctx.size() < 2) return {};
    State& st = it->second;
    const auto n = static_cast<std::int64_t>(ctx.size());
    const auto& c = weights_->config();
    // The block's chain keeps to the configured steps; the branches may use the rest of max_nodes.
    const std::int32_t depth = std::min({max_depth, steps_, max_nodes, static_cast<std::int32_t>(c.block_size - 1)});
    if (st.broken || st.rows != n - 1 || depth <= 0) return {};  // features do not line up, or nothing asked
    std::vector<float> logits;
    try {
      // Fresh context rows (those committed since the last round, a few) ride along with the block's
      // pass; a longer backlog (after steps without drafts) is taken in first, 256 rows at a time.
      const std::int64_t fresh = n - 1 - st.fed;
      if (fresh > model::BlockDraftRunner::kMaxFresh) catch_up(st, n);
      // The root and one mask row per draft asked for, not the trained block_size: rows past the chain
      // would only be attended to by the others (the block is non-causal), at the cost of rows of
      // their own. On the shipped prompts (4-layer drafter, block of 8, a chain of 3): a draft round
      // −21 %, τ 2.30 → 2.29.
      const std::int64_t rows = std::int64_t{depth} + 1;
      std::vector<std::int32_t> block(static_cast<std::size_t>(rows), c.mask_token_id);
      block[0] = ctx.back();
      const std::int64_t p0 = st.fed, nc = n - 1 - p0;
      if (nc > 0) kv_->reserve(st.seq, n - 1);
      std::vector<k::KvSegment> prefix;
      for (std::int64_t l = 0; l < c.n_layers; ++l) prefix.push_back({kv_->view(l, st.seq), 0, n - 1});
      std::vector<std::int32_t> pos(static_cast<std::size_t>(nc));
      for (std::int64_t i = 0; i < nc; ++i) pos[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(p0 + i);
      const std::int64_t row = c.kv_row();
      const model::BlockDraftRunner::FreshContext in{st.feat.data(), nc, pos.data(),
                                                     [&](int l, const float* kk, const float* vv) {
                                                       for (std::int64_t i = 0; i < nc; ++i)
                                                         kv_->write(l, st.seq, p0 + i, kk + i * row, vv + i * row);
                                                     }};
      runner_->block(block.data(), rows, n - 1, prefix, logits, nc > 0 ? &in : nullptr);
      if (nc > 0) commit_context(st, n);
    } catch (const model::KvExhausted&) {
      return {};  // the drafter's cache is full: the target decodes plainly this step
    }
    DraftTree t = chain(st, logits, depth, ctx.back(), max_nodes);
    // A chain drawn for rejection sampling stays a chain (resolution refuses a branch with it).
    if (t.probs.empty()) branches_.add(t, ctx, max_nodes, max_depth, st.doc);
    return t;
  }

  void reconfigure(const config::Snapshot& s) override {
    const config::DraftShapeArgs d = config::draft_shape_args(*s);
    steps_ = static_cast<std::int32_t>(d.num_steps);
    topk_ = static_cast<std::int32_t>(d.eagle_topk);
    branches_.configure(*s);
  }

  void release(std::uint64_t req) override {
    auto it = states_.find(req);
    if (it == states_.end()) return;
    branches_.release(it->second.doc);
    kv_->release(it->second.seq);
    states_.erase(it);
  }

 private:
  struct State {
    std::vector<float> feat;  // target features of positions [fed, rows)
    std::int64_t rows = 0, fed = 0;
    bool broken = false;
    model::KvCache::Seq seq;
    k::SamplingParams params;
    k::Rng rng;
    bool seeded = false;
    SuffixStore::Handle doc = 0;  // this request in the suffix branch's store (0: none yet)
  };

  // Context rows for the committed positions [st.fed, n − 1) into every layer's KV.
  void catch_up(State& st, std::int64_t n) {
    const auto& c = weights_->config();
    const std::int64_t width = c.feature_width(), row = c.kv_row();
    for (std::int64_t p0 = st.fed; p0 < n - 1; p0 += 256) {
      const std::int64_t cnt = std::min<std::int64_t>(256, n - 1 - p0);
      std::vector<std::int32_t> pos(static_cast<std::size_t>(cnt));
      for (std::int64_t i = 0; i < cnt; ++i) pos[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(p0 + i);
      kv_->reserve(st.seq, p0 + cnt);
      runner_->context(st.feat.data() + (p0 - st.fed) * width, cnt, pos.data());
      for (std::int64_t l = 0; l < c.n_layers; ++l)
        for (std::int64_t i = 0; i < cnt; ++i)
          kv_->write(l, st.seq, p0 + i, runner_->ctx_k(static_cast<int>(l)) + i * row,
                     runner_->ctx_v(static_cast<int>(l)) + i * row);
      st.seq.length = p0 + cnt;
    }
    commit_context(st, n);
  }

  // The context rows up to n − 1 are in the drafter's KV: their features are no longer needed.
  void commit_context(State& st, std::int64_t n) {
    st.seq.length = n - 1;
    st.feat.erase(st.feat.begin(), st.feat.begin() + (n - 1 - st.fed) * weights_->config().feature_width());
    st.fed = n - 1;
  }

  // The first `depth` rows' drafts: argmax, or drawn from the drafter's probabilities (sent along).
  // Over a draft vocabulary, q is spread back onto the target's ids (zero elsewhere). DSPARK: each row
  // first gets the Markov term of the token before it, and the chain its confidences' products as
  // scores; DFLASH scores a draft by its path probability under the drafter's rows (the product of
  // each row's softmax at the draft, as a head scores its nodes; the budget's table calibrates it). With
  // --speculative-eagle-topk K > 1 (argmax drafts only) the first row's next K−1 likeliest tokens
  // hang from the root as leaves, within max_nodes: the rows after the first are not conditioned on
  // the first draft, so an alternative first draft has no continuation of its own.
  DraftTree chain(State& st, std::vector<float>& logits, std::int32_t depth, std::int32_t root,
                  std::int32_t max_nodes) {
    const std::int64_t vocab = runner_->vocab(), full = target_->config().vocab_size;
    const bool sample = sampling_ && !st.params.greedy(), dspark = weights_->config().dspark;
    std::vector<std::int32_t> drafts;
    std::vector<float> q_rows, q, scores;
    std::vector<std::int32_t> alternatives;
    float survival = 1.0f;
    std::vector<float> alt_scores;  // the alternatives' scores (see below)
    for (std::int32_t i = 0; i < depth; ++i) {
      float* row = logits.data() + static_cast<std::int64_t>(i) * vocab;
      if (dspark) {
        survival *= runner_->markov(i == 0 ? root : drafts.back(), i, row);
        scores.push_back(survival);
      }
      std::int32_t col = 0;  // the draft's column of the row
      if (sample) {
        k::sampling_probs(row, vocab, st.params, q);
        col = k::sample_from_probs(q, st.rng.uniform());
        drafts.push_back(runner_->to_target(col));
        const std::size_t at = q_rows.size();
        q_rows.resize(at + static_cast<std::size_t>(full), 0.0f);
        for (std::int64_t j = 0; j < vocab; ++j) q_rows[at + static_cast<std::size_t>(runner_->to_target(j))] = q[j];
      } else {
        col = k::argmax(row, vocab);
        drafts.push_back(runner_->to_target(col));
        if (!dspark || i == 0) softmax_row(row, vocab);  // probs_: the row's softmax
        if (i == 0) {
          alternatives = next_likeliest(row, vocab, std::min(topk_ - 1, max_nodes - depth));
          // DFLASH: an alternative's probability in the first row. DSPARK: the first draft is accepted
          // with its confidence c₁; otherwise the target's token is one of the others, split as the
          // row's probabilities split the rest: (1 − c₁) · p_alt / (1 − p_first).
          const double rest = 1.0 - static_cast<double>(probs_[static_cast<std::size_t>(col)]);
          for (const std::int32_t alt : alternatives) {
            const double p = probs_[static_cast<std::size_t>(alt)];
            alt_scores.push_back(!dspark    ? static_cast<float>(p)
                                 : rest > 0 ? static_cast<float>((1.0 - scores[0]) * std::min(1.0, p / rest))
                                            : 0.0f);
          }
        }
      }
      if (!dspark) {  // DFLASH: the path probability under the drafter's own rows (as a head scores)
        if (sample) softmax_row(row, vocab);
        survival *= probs_[static_cast<std::size_t>(col)];
        scores.push_back(survival);
      }
    }
    DraftTree t = DraftTree::chain(std::move(drafts));
    if (sample) t.probs = std::move(q_rows);
    t.scores = std::move(scores);
    for (std::size_t j = 0; j < alternatives.size(); ++j) {
      t.scores.push_back(alt_scores[j]);
      t.tokens.push_back(runner_->to_target(alternatives[j]));
      t.parents.push_back(-1);
    }
    return t;
  }

  // probs_ = the softmax of a row at T = 1 (the drafter's probabilities: exp_approx, vectorised).
  void softmax_row(const float* row, std::int64_t vocab) {
    probs_.assign(row, row + vocab);
    k::softmax_cpu(probs_.data(), vocab);
  }

  // The columns of the n likeliest entries of a row after its argmax (ties to the lower id).
  static std::vector<std::int32_t> next_likeliest(const float* row, std::int64_t vocab, std::int32_t n) {
    std::vector<std::int32_t> out;
    if (n <= 0) return out;
    std::vector<std::int32_t> ids(static_cast<std::size_t>(vocab));
    for (std::int64_t j = 0; j < vocab; ++j) ids[static_cast<std::size_t>(j)] = static_cast<std::int32_t>(j);
    const auto take = static_cast<std::ptrdiff_t>(std::min<std::int64_t>(vocab, std::int64_t{n} + 1));
    std::partial_sort(ids.begin(), ids.begin() + take, ids.end(),
                      [&](std::int32_t a, std::int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
    for (std::ptrdiff_t j = 1; j < take; ++j) out.push_back(ids[static_cast<std::size_t>(j)]);
    return out;
  }

  bool sampling_;              // --speculative-use-rejection-sampling: draw drafts from q instead of argmax
  std::int32_t steps_ = 15;    // --speculative-num-steps: the chain's length (at most block_size - 1)
  std::int32_t topk_ = 1;      // --speculative-eagle-topk: first drafts proposed (the argmax and K−1 leaves)
  ProposalBranches branches_;  // --speculative-draft-ngram-tokens, --speculative-draft-suffix-tokens
  std::shared_ptr<const model::LlamaWeights> target_;
  std::shared_ptr<const model::BlockDraftWeights> weights_;
  std::unique_ptr<model::BlockDraftRunner> runner_;
  std::unique_ptr<model::KvCache> kv_;
  std::map<std::uint64_t, State> states_;
  std::vector<float> probs_;  // a row's softmax (chain())
};

}  // namespace

std::unique_ptr<Drafter> make_dflash_drafter(const config::Snapshot& s, const DraftContext& c) {
  return std::make_unique<BlockDrafter>(s, c);
}

}  // namespace specactor::drafters
