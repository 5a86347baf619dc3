#include "actors/target_worker.hpp"

#include <chrono>
#include <map>
#include <optional>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>


namespace specactor::actors {


namespace {

// Verifies the chain [root, d1..dk] against the target rows (greedy, or SPEC-KERNELS §5 for a chain:
// accept d_i iff coin <= p_i(d_i); on rejection sample from p_i without d_i; else the bonus from p_k).
ItemResult verify_chain(const StepItem& item, const float* logits, std::int64_t vocab, kernels::Rng& rng) {
  ItemResult r;
  r.req = item.req;
  const auto k = static_cast<std::int32_t>(item.tokens.size()) - 1;
  r.drafted = k;
  std::vector<float> p;
  for (std::int32_t i = 0; i <= k; ++i) {
    const float* row = logits + static_cast<std::int64_t>(i) * vocab;
    if (item.params.greedy()) {
      const std::int32_t t = kernels::argmax(row, vocab);
      r.tokens.push_back(t);
      if (i == k || t != item.tokens[static_cast<std::size_t>(i) + 1]) break;
      ++r.accepted;
      continue;
    }
    kernels::sampling_probs(row, vocab, item.params, p);
    if (i < k) {
      const std::int32_t d = item.tokens[static_cast<std::size_t>(i) + 1];
      if (rng.uniform() <= p[static_cast<std::size_t>(d)] && p[static_cast<std::size_t>(d)] > 0.0f) {
        r.tokens.push_back(d);
        ++r.accepted;
        continue;
      }
      p[static_cast<std::size_t>(d)] = 0.0f;
      double sum = 0;
      for (float v : p) sum += v;
      for (float& v : p) v = static_cast<float>(v / sum);
    }
    r.tokens.push_back(kernels::sample_from_probs(p, rng.uniform()));
    break;
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
    st.kv = std::make_unique<model::KvCache>(c.n_layers, c.n_kv_heads, c.head_dim, st.snapshot->page_size,
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
        return TargetInfo{s.model->info, s.model->tokenizer, s.kv->capacity_tokens(), s.kv->page_size()};
      },
      [self](step_atom, StepBatch& batch) -> caf::result<StepResult> {
        auto& s = self->state;
        if (!s.model) return caf::make_error(caf::sec::runtime_error, s.load_error);
        const auto t0 = std::chrono::steady_clock::now();
        const std::int64_t vocab = s.model->config.vocab_size;
        std::vector<model::ForwardSeq> fwd(batch.items.size());
        std::vector<std::int64_t> old_len(batch.items.size());
        for (std::size_t i = 0; i < batch.items.size(); ++i) {
          const StepItem& it = batch.items[i];
          auto [pos, fresh] = s.seqs.try_emplace(it.req, TargetWorkerState::Seq{{}, kernels::Rng(it.seed)});
          (void)fresh;
          fwd[i].kv = &pos->second.kv;
          fwd[i].tokens = it.tokens;
          old_len[i] = pos->second.kv.length;
          const auto n = static_cast<std::int32_t>(it.tokens.size());
          if (it.sample && it.prefill) fwd[i].logit_rows = {n - 1};
          if (it.sample && !it.prefill)
            for (std::int32_t r = 0; r < n; ++r) fwd[i].logit_rows.push_back(r);
        }
        model::ForwardResult out;
        try {
          s.runner->forward(fwd, *s.kv, out);
        } catch (const model::KvExhausted& e) {
          return caf::make_error(caf::sec::runtime_error, std::string("target worker: ") + e.what());
        }
        StepResult res;
        std::size_t row = 0;
        for (std::size_t i = 0; i < batch.items.size(); ++i) {
          const StepItem& it = batch.items[i];
          auto& seq = s.seqs.at(it.req);
          const float* logits = out.logits.data() + row * static_cast<std::size_t>(vocab);
          row += fwd[i].logit_rows.size();
          if (!it.sample) {
            res.items.push_back({it.req, {}, 0, 0});
          } else if (it.prefill) {
            res.items.push_back({it.req, {kernels::sample(logits, vocab, it.params, seq.rng)}, 0, 0});
          } else {
            ItemResult r = verify_chain(it, logits, vocab, seq.rng);
            // Keep the root and the accepted drafts; roll back the rejected ones.
            s.kv->truncate(seq.kv, old_len[i] + 1 + r.accepted);
            res.items.push_back(std::move(r));
          }
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
