#include "actors/target_worker.hpp"

#include <chrono>
#include <map>
#include <optional>

#include <caf/all.hpp>

#include "kernels/spec/spec.hpp"
#include <spdlog/spdlog.h>


namespace specactor::actors {


namespace {

// The draft tree of a decode item: node 0 is the root, node i+1 is draft i.
kernels::Tree item_tree(const StepItem& it, std::int64_t seq_len) {
  const auto n = static_cast<std::int32_t>(it.tokens.size());
  std::vector<std::int32_t> parents = it.parents;
  if (parents.empty())  // a chain
    for (std::int32_t i = 0; i + 1 < n; ++i) parents.push_back(i - 1);
  return kernels::tree_from_parents({parents}, {static_cast<std::int32_t>(seq_len)}, n);
}

// Verifies the tree against the target rows (greedy: SPEC-KERNELS §4; sampling: §5, lossless).
// Returns the result and the accepted path (node indices, the root first).
ItemResult verify_tree(const StepItem& it, const kernels::Tree& tree, const float* logits, std::int64_t vocab,
                       kernels::Rng& rng, std::vector<std::int32_t>& path) {
  const auto n = static_cast<std::int32_t>(it.tokens.size());
  std::int32_t max_depth = 0;
  for (std::int32_t i = 0; i < n; ++i) max_depth = std::max(max_depth, tree.positions[static_cast<std::size_t>(i)] - tree.positions[0]);
  kernels::Verified v;
  if (it.params.greedy()) {
    std::vector<std::int32_t> predict(static_cast<std::size_t>(n));
    for (std::int32_t i = 0; i < n; ++i) predict[static_cast<std::size_t>(i)] = kernels::argmax(logits + i * vocab, vocab);
    v = kernels::verify_tree_greedy_cpu(it.tokens, tree, predict, 1, n, max_depth + 1);
  } else {
    std::vector<float> probs(static_cast<std::size_t>(n * vocab)), row;
    for (std::int32_t i = 0; i < n; ++i) {
      kernels::sampling_probs(logits + i * vocab, vocab, it.params, row);
      std::copy(row.begin(), row.end(), probs.begin() + i * vocab);
    }
    std::vector<float> coins(static_cast<std::size_t>(n)), final_coin(1);
    for (auto& c : coins) c = static_cast<float>(rng.uniform());
    final_coin[0] = static_cast<float>(rng.uniform());
    v = kernels::tree_speculative_sampling_target_only_cpu(it.tokens, tree, probs, vocab, coins, final_coin, 1, n,
                                                           max_depth + 1);
  }
  ItemResult r;
  r.req = it.req;
  r.drafted = n - 1;
  r.accepted = v.accept_token_num[0];
  path.clear();
  for (std::int32_t j = 0; j <= r.accepted; ++j) {
    const std::int32_t node = v.accept_index[static_cast<std::size_t>(j)];
    path.push_back(node);
    r.tokens.push_back(v.predicts[static_cast<std::size_t>(node)]);
  }
  return r;
}

}  // namespace

target_worker_actor::behavior_type target_worker(target_worker_actor::stateful_pointer<TargetWorkerState> self,
                                                 config::Snapshot snapshot) {
  self->set_exception_handler(exit_with_message);
  auto& st = self->state;
  st.snapshot = std::move(snapshot);
  try {
    const bool quiet = st.snapshot->log_level == "warn" || st.snapshot->log_level == "error" || st.snapshot->log_level == "off";
    st.model = model::load_model(*st.snapshot, quiet ? model::LlamaWeights::Progress{} : model::terminal_progress("loading target"));
    const auto& c = st.model->config;
    st.kv = std::make_shared<model::KvCache>(c.n_layers, c.n_kv_heads, c.head_dim, st.snapshot->page_size,
                                             *st.snapshot->max_total_tokens);
    st.runner = std::make_unique<model::LlamaRunner>(st.model->weights, static_cast<int>(st.snapshot->threads));
  } catch (const std::exception& e) {
    st.load_error = e.what();
    spdlog::error("target worker: {}", st.load_error);
  }
  return {
      [self](info_atom) -> caf::result<TargetInfo> {
        auto& s = self->state;
        if (!s.model) return caf::make_error(caf::sec::runtime_error, s.load_error);
        return TargetInfo{s.model->info, s.model->tokenizer, s.kv->capacity_tokens(), s.kv->page_size(), s.model->weights, s.kv};
      },
      [self](step_atom, StepBatch& batch) -> caf::result<StepResult> {
        auto& s = self->state;
        if (!s.model) return caf::make_error(caf::sec::runtime_error, s.load_error);
        const auto t0 = std::chrono::steady_clock::now();
        const std::int64_t vocab = s.model->config.vocab_size;
        std::vector<model::ForwardSeq> fwd(batch.items.size());
        std::vector<std::int64_t> old_len(batch.items.size());
        std::vector<kernels::Tree> trees(batch.items.size());
        for (std::size_t i = 0; i < batch.items.size(); ++i) {
          const StepItem& it = batch.items[i];
          auto [pos, fresh] = s.seqs.try_emplace(it.req, TargetWorkerState::Seq{{}, kernels::Rng(it.seed)});
          (void)fresh;
          fwd[i].kv = &pos->second.kv;
          fwd[i].tokens = it.tokens;
          old_len[i] = pos->second.kv.length;
          const auto n = static_cast<std::int32_t>(it.tokens.size());
          if (it.sample && it.prefill) fwd[i].logit_rows = {n - 1};
          if (it.sample && !it.prefill) {
            for (std::int32_t r = 0; r < n; ++r) fwd[i].logit_rows.push_back(r);
            if (n > 64) return caf::make_error(caf::sec::runtime_error, "target worker: more than 64 tree nodes");
            if (n > 1) {  // draft tokens: positions by depth, attention by the tree mask
              trees[i] = item_tree(it, old_len[i]);
              fwd[i].positions = trees[i].positions;
              fwd[i].mask = trees[i].mask_bits;
            }
          }
        }
        model::ForwardResult out;
        bool any_hidden = false;
        for (const auto& it : batch.items) any_hidden = any_hidden || it.want_hidden;
        std::vector<int> capture;
        if (any_hidden)
          for (auto l : batch.capture) {
            if (l < 0 || l >= s.model->config.n_layers)
              return caf::make_error(caf::sec::runtime_error, "target worker: cannot capture layer " + std::to_string(l) + " of " +
                                                                  std::to_string(s.model->config.n_layers));
            capture.push_back(l);
          }
        try {
          s.runner->forward(fwd, *s.kv, out, capture);
        } catch (const model::KvExhausted& e) {
          return caf::make_error(caf::sec::runtime_error, std::string("target worker: ") + e.what());
        }
        StepResult res;
        std::size_t row = 0;
        std::int64_t tok_row = 0;  // the item's first row in the forward batch
        const std::int64_t H = s.model->config.hidden;
        // The captured layers of batch rows, concatenated per row, for the drafter.
        auto take_rows = [&](ItemResult& r, const std::vector<std::int32_t>& rows) {
          r.hidden.resize(rows.size() * capture.size() * static_cast<std::size_t>(H));
          float* dst = r.hidden.data();
          for (auto rr : rows)
            for (const auto& layer : out.hidden) {
              const float* src = layer.data() + (tok_row + rr) * H;
              dst = std::copy(src, src + H, dst);
            }
        };
        for (std::size_t i = 0; i < batch.items.size(); ++i) {
          const StepItem& it = batch.items[i];
          auto& seq = s.seqs.at(it.req);
          const auto n_tok = static_cast<std::int32_t>(it.tokens.size());
          std::vector<std::int32_t> committed;  // rows whose KV stays: prefill rows, or root + accepted path
          const float* logits = out.logits.data() + row * static_cast<std::size_t>(vocab);
          row += fwd[i].logit_rows.size();
          if (!it.sample) {
            res.items.push_back({it.req, {}, 0, 0, {}, {}, 0});
            for (std::int32_t r = 0; r < n_tok; ++r) committed.push_back(r);
          } else if (it.prefill) {
            res.items.push_back({it.req, {kernels::sample(logits, vocab, it.params, seq.rng)}, 0, 0, {}, {}, 0});
            for (std::int32_t r = 0; r < n_tok; ++r) committed.push_back(r);
          } else if (it.tokens.size() == 1) {  // plain decode
            res.items.push_back({it.req, {kernels::sample(logits, vocab, it.params, seq.rng)}, 0, 0, {}, {}, 0});
            committed = {0};
          } else if (!it.draft_probs.empty() && !it.params.greedy()) {
            // Chain rejection sampling with the draft's q (SPEC-KERNELS §6): lossless for any q.
            const auto k = static_cast<std::int32_t>(it.tokens.size()) - 1;
            std::vector<float> p(static_cast<std::size_t>((k + 1) * vocab)), row;
            for (std::int32_t j = 0; j <= k; ++j) {
              kernels::sampling_probs(logits + j * vocab, vocab, it.params, row);
              std::copy(row.begin(), row.end(), p.begin() + j * vocab);
            }
            std::vector<float> coins(static_cast<std::size_t>(k));
            for (auto& c : coins) c = static_cast<float>(seq.rng.uniform());
            const std::vector<std::int32_t> drafts(it.tokens.begin() + 1, it.tokens.end());
            ItemResult r;
            r.req = it.req;
            r.drafted = k;
            r.tokens = kernels::chain_rejection_sampling_cpu(drafts, it.draft_probs, p, vocab, coins,
                                                             static_cast<float>(seq.rng.uniform()));
            r.accepted = static_cast<std::int32_t>(r.tokens.size()) - 1;
            s.kv->truncate(seq.kv, old_len[i] + 1 + r.accepted);  // a chain: nothing to compact
            for (std::int32_t j = 0; j <= r.accepted; ++j) committed.push_back(j);
            res.items.push_back(std::move(r));
          } else {
            std::vector<std::int32_t> path;
            ItemResult r = verify_tree(it, trees[i], logits, vocab, seq.rng, path);
            // Compact: the accepted nodes' KV rows move to the front of the draft region in path
            // order (path[j] >= j, so no row is overwritten before it is copied); the rest is freed.
            for (std::size_t j = 1; j < path.size(); ++j)
              s.kv->copy_slot(seq.kv, old_len[i] + path[j], old_len[i] + static_cast<std::int64_t>(j));
            s.kv->truncate(seq.kv, old_len[i] + 1 + r.accepted);
            committed = path;
            res.items.push_back(std::move(r));
          }
          if (it.want_hidden && !capture.empty()) take_rows(res.items.back(), committed);
          if (it.want_kv) {
            res.items.back().kv_pages = seq.kv.pages;
            res.items.back().kv_length = seq.kv.length;
          }
          tok_row += n_tok;
        }
        res.compute_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        return res;
      },
      [self](release_atom, std::uint64_t req) {
        auto& s = self->state;
        auto it = s.seqs.find(req);
        if (it == s.seqs.end()) return;
        s.kv->release(it->second.kv);
        s.seqs.erase(it);
      },
      [self](snapshot_atom) -> config::Snapshot { return self->state.snapshot; },
  };
}

}  // namespace specactor::actors
