// drafters/standalone.cpp — STANDALONE drafting: a separate (smaller) GGUF model drafts a
// greedy chain with its own KV cache; or, with --speculative-draft-num-layers K and no draft model,
// the target's own file truncated to its first K layers (plus final norm and output head), which reads
// the target's KV of those layers instead of keeping its own (when both run on the CPU of one process).
#include <algorithm>
#include <filesystem>
#include <map>
#include <stdexcept>

#include "drafters/drafter.hpp"
#include "kernels/cpu/sampling.hpp"
#include "model/loader.hpp"
#include "model/runner.hpp"

namespace specactor::drafters {

namespace {

class StandaloneDrafter final : public Drafter {
 public:
  StandaloneDrafter(const config::Snapshot& s, const DraftContext& ctx)
      : sampling_(s->speculative_use_rejection_sampling) {
    const std::int64_t layers = s->speculative_draft_num_layers.value_or(-1);
    model_ = model::load_model(*s, {}, layers);
    const auto& c = model_.config;
    const std::string what = layers > 0 ? "the first " + std::to_string(layers) + " layers of " + s->model_path
                                        : "draft model " + s->model_path;
    if (c.vocab_size != ctx.target_info.vocab_size)
      throw std::runtime_error(what + ": vocabulary of " + std::to_string(c.vocab_size) +
                               " tokens does not match the target's " + std::to_string(ctx.target_info.vocab_size));
    if (model_.tokenizer && ctx.tokenizer)
      for (std::int32_t id = 0; id < c.vocab_size; ++id)
        if (model_.tokenizer->token_bytes(id) != ctx.tokenizer->token_bytes(id))
          throw std::runtime_error(what + ": token " + std::to_string(id) + " differs from the target's vocabulary");
    // Self-speculation on the target's own file, both on the CPU of this process: the draft's K layers
    // are the target's first K, so their KV of the committed tokens is the target's. It is read from
    // the target's pool (read-only, the pages the scheduler hands over), never prefilled or caught up
    // again; the draft's own pool holds only the root and the drafts of one proposal (at most 64
    // slots, released after it), so it is sized for that: a pool of the target's size faulted in a
    // 2 MiB huge page per KV head and layer on the first round (~0.3 s on the Zen 4 VM, once, and the
    // cost model took it for the price of a round).
    std::error_code ec;
    const bool host = s->device != config::Device::Cuda;
    bool share = layers > 0 && host && ctx.target_kv && ctx.target_kv->has_host_storage() &&
                 std::filesystem::equivalent(s->model_path, ctx.target_info.path, ec) &&
                 ctx.target_kv->n_layers() >= c.n_layers && ctx.target_kv->head_dim() == c.head_dim &&
                 ctx.target_kv->row_floats() == c.n_kv_heads * c.head_dim;
    auto make = [&](bool small) {
      const std::int64_t per_request = (64 + s->page_size - 1) / s->page_size * s->page_size;
      const std::int64_t tokens =
          small ? std::min(*s->max_total_tokens, std::max<std::int64_t>(1, s->max_running_requests) * per_request)
                : *s->max_total_tokens;
      runner_.reset();
      kv_ = std::make_unique<model::KvCache>(c.n_layers, c.n_kv_heads, c.head_dim, s->page_size, tokens, host,
                                             model::kv_type(*s));
      runner_ = model::make_runner(model_.weights, *s, 0, static_cast<int>(s->threads),
                                   *kv_);  // the draft snapshot's device
    };
    make(share);
    if (share && runner_->device() != "cpu") {  // the runner is not where the target's pool is
      share = false;
      make(false);
    }
    if (share) {
      target_kv_ = ctx.target_kv;
      if (host) kv_->prefault();  // a few MiB: resident now rather than in the first rounds
    } else {
      cache_ = std::make_unique<DraftCache>(*kv_, !s->disable_radix_cache);
    }
  }

  DrafterNeeds needs() const override { return {{}, shared()}; }

  void observe(std::uint64_t req, const TargetFeatures& f) override {
    if (!shared() || f.kv_length <= 0) return;
    State& st = states_[req];
    st.kv_pages = f.kv_pages;
    st.kv_length = f.kv_length;
  }

  DraftTree propose(std::uint64_t req, const std::vector<std::int32_t>& ctx, std::int32_t max_nodes,
                    std::int32_t max_depth) override {
    std::int32_t depth = std::min(max_nodes, max_depth);
    if (depth <= 0 || ctx.empty()) return {};
    // The draft's forward runs on the engine's one compute pool, every core (kernels/cpu/pool.hpp).
    State& st = states_[req];
    std::vector<model::ForwardSeq> b(1);
    b[0].kv = &st.seq;
    if (shared()) {
      // The root after the target's committed KV; the drafts after it, in the draft's own pool.
      if (st.kv_length != static_cast<std::int64_t>(ctx.size()) - 1) return {};  // not lined up with ctx
      depth = std::min(depth, 63);
      kv_->truncate(st.seq, 0);
      b[0].tokens = {ctx.back()};
      b[0].prefix_kv = target_kv_.get();
      b[0].prefix_pages = &st.kv_pages;
      b[0].prefix_len = st.kv_length;
    } else {
      if (!st.started) {  // the draft's KV of the longest cached prefix (its last token is fed below)
        st.started = true;
        const std::int64_t hit = cache_->start(st.entry, ctx, static_cast<std::int64_t>(ctx.size()) - 1, st.seq);
        st.fed.assign(ctx.begin(), ctx.begin() + hit);
      }
      // Reuse the KV of the common prefix; roll back the rest (last step's drafts, rejected tokens).
      std::size_t common = 0;
      while (common < st.fed.size() && common + 1 < ctx.size() && st.fed[common] == ctx[common]) ++common;
      kv_->truncate(st.seq, static_cast<std::int64_t>(common));
      st.fed.resize(common);
      cache_->make_room(kv_->pages_for(static_cast<std::int64_t>(ctx.size()) + depth) -
                        static_cast<std::int64_t>(st.seq.pages.size()));
      b[0].tokens.assign(ctx.begin() + static_cast<long>(common), ctx.end());
    }
    std::vector<std::int32_t> drafts;
    std::vector<float> q_rows, q;
    const bool sample = sampling_ && !st.params.greedy();
    try {
      b[0].logit_rows = {static_cast<std::int32_t>(b[0].tokens.size()) - 1};
      model::ForwardResult out;
      runner_->forward(b, *kv_, out);
      if (!shared()) st.fed = ctx;
      for (std::int32_t i = 0; i < depth; ++i) {
        std::int32_t t;
        if (sample) {  // x ~ q, and q goes to the target for rejection sampling
          kernels::sampling_probs(out.logits.data(), model_.config.vocab_size, st.params, q);
          t = kernels::sample_from_probs(q, st.rng.uniform());
          q_rows.insert(q_rows.end(), q.begin(), q.end());
        } else {
          t = kernels::argmax(out.logits.data(), model_.config.vocab_size);
        }
        drafts.push_back(t);
        if (i + 1 == depth) break;
        b[0].tokens = {t};
        b[0].logit_rows = {0};
        runner_->forward(b, *kv_, out);
      }
    } catch (const model::KvExhausted&) {
      // The draft's cache is full: no proposal this step (the target decodes plainly).
    }
    kv_->truncate(st.seq, static_cast<std::int64_t>(st.fed.size()));  // drafts are not kept
    if (!shared() && !st.inserted) {  // the prompt's pages, for requests that start on the same prefix meanwhile
      st.inserted = true;
      cache_->insert(st.entry, st.fed, static_cast<std::int64_t>(st.fed.size()), st.seq);
    }
    DraftTree t = DraftTree::chain(std::move(drafts));
    if (sample && q_rows.size() == t.tokens.size() * static_cast<std::size_t>(model_.config.vocab_size))
      t.probs = std::move(q_rows);
    return t;
  }

  void set_sampling(std::uint64_t req, const kernels::SamplingParams& params, std::uint64_t seed) override {
    State& st = states_[req];
    st.params = params;
    if (!st.seeded) {
      st.rng = kernels::Rng(seed ^ 0x5eedd4a7ULL);  // the draft's own stream, independent of the target's
      st.seeded = true;
    }
  }

  void release(std::uint64_t req) override {
    auto it = states_.find(req);
    if (it == states_.end()) return;
    State& st = it->second;
    if (cache_) {
      cache_->insert(st.entry, st.fed, static_cast<std::int64_t>(st.fed.size()), st.seq);
      cache_->finish(st.entry);
    }
    kv_->release(st.seq);
    states_.erase(it);
  }

  DraftCacheStats cache_stats() const override { return cache_ ? cache_->stats() : DraftCacheStats{}; }
  std::int64_t flush_cache() override { return cache_ ? cache_->flush() : 0; }

 private:
  struct State {
    model::KvCache::Seq seq;
    std::vector<std::int32_t> fed;  // tokens whose KV the draft holds
    kernels::SamplingParams params;
    kernels::Rng rng;
    bool seeded = false;
    bool started = false, inserted = false;  // the draft's prefix cache: looked up, prompt inserted
    DraftCache::Entry entry;
    std::vector<std::int32_t> kv_pages;  // shared: the target's committed pages and their length
    std::int64_t kv_length = 0;
  };
  bool sampling_;  // --speculative-use-rejection-sampling: draw drafts from q instead of argmax
  // Self-speculation reading the target's KV (see the constructor): read-only, only const members
  // are reachable; null when the draft keeps KV of its own (then cache_ is set).
  std::shared_ptr<const model::KvCache> target_kv_;
  bool shared() const { return target_kv_ != nullptr; }
  model::LoadedModel model_;
  std::unique_ptr<model::KvCache> kv_;
  std::unique_ptr<model::ForwardRunner> runner_;
  std::unique_ptr<DraftCache> cache_;  // over kv_, declared after it
  std::map<std::uint64_t, State> states_;
};

}  // namespace

std::unique_ptr<Drafter> make_standalone_drafter(const config::Snapshot& snapshot, const DraftContext& context) {
  return std::make_unique<StandaloneDrafter>(snapshot, context);
}

}  // namespace specactor::drafters
