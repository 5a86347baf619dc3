#include "actors/target_worker.hpp"

#include <spdlog/spdlog.h>

#include <caf/all.hpp>
#include <chrono>
#include <map>
#include <optional>
#include <thread>

#include "actors/system.hpp"
#include "config/error.hpp"
#include "kernels/spec.hpp"
#include "model/gguf.hpp"
#include "model/verify.hpp"

namespace specactor::actors {

namespace {

model::KvCache::Seq& seq_kv(model::KvCache::Seq& s) { return s; }
model::KvCache::Seq& seq_kv(TargetWorkerState::Seq& s) { return s.kv; }

// The forward batch of a step — the same on every tensor-parallel rank (rank > 0 asks for no logits).
// Empty string on success, else the error.
template <class SeqMap, class MakeSeq>
std::string plan_step(const StepBatch& batch, SeqMap& seqs, MakeSeq make_seq, bool logits,
                      std::vector<model::ForwardSeq>& fwd, std::vector<std::int64_t>& old_len,
                      std::vector<kernels::Tree>& trees) {
  fwd.assign(batch.items.size(), {});
  old_len.assign(batch.items.size(), 0);
  trees.assign(batch.items.size(), {});
  for (std::size_t i = 0; i < batch.items.size(); ++i) {
    const StepItem& it = batch.items[i];
    const auto n = static_cast<std::int32_t>(it.tokens.size());
    if (it.sample && !it.prefill && n > config::kMaxTreeTokens)
      return "target worker: more than " + std::to_string(config::kMaxTreeTokens) + " tree tokens";
  }
  for (std::size_t i = 0; i < batch.items.size(); ++i) {
    const StepItem& it = batch.items[i];
    auto pos = seqs.try_emplace(it.req, make_seq(it)).first;
    model::KvCache::Seq& kv = seq_kv(pos->second);
    fwd[i].kv = &kv;
    fwd[i].tokens = it.tokens;
    old_len[i] = kv.length;
    const auto n = static_cast<std::int32_t>(it.tokens.size());
    if (it.sample && it.prefill && logits) fwd[i].logit_rows = {n - 1};
    if (it.sample && !it.prefill) {
      if (logits)
        for (std::int32_t r = 0; r < n; ++r) fwd[i].logit_rows.push_back(r);
      if (n > 1) {  // draft tokens: positions by depth, attention by the tree mask
        trees[i] = model::item_tree({it.tokens, it.parents, it.draft_probs, it.params}, old_len[i]);
        fwd[i].positions = trees[i].positions;
        fwd[i].mask = trees[i].mask_bits;
      }
    }
  }
  return {};
}

// Rank 0's decisions of a step, one slot of (tokens + 1) ints per item: -1 (the KV rows all stay), or
// the number of kept rows c followed by the kept rows' node indices in order (root first). Every rank
// applies them the same way: kept node path[j] moves to slot j of the draft region, the rest is freed.
std::vector<std::int32_t> decision_slots(const StepBatch& batch, std::vector<std::size_t>& offset) {
  offset.clear();
  std::size_t total = 0;
  for (const auto& it : batch.items) {
    offset.push_back(total);
    total += it.tokens.size() + 1;
  }
  return std::vector<std::int32_t>(total, -1);
}

void apply_decisions(model::ForwardRunner& runner, model::KvCache& kv, const std::vector<model::ForwardSeq>& fwd,
                     const std::vector<std::int64_t>& old_len, const std::vector<std::int32_t>& decisions,
                     const std::vector<std::size_t>& offset) {
  for (std::size_t i = 0; i < fwd.size(); ++i) {
    const std::int32_t* d = decisions.data() + offset[i];
    if (d[0] < 0) continue;
    // path[j] >= j, so no row is overwritten before it is copied.
    for (std::int32_t j = 1; j < d[0]; ++j) runner.copy_slot(kv, *fwd[i].kv, old_len[i] + d[1 + j], old_len[i] + j);
    kv.truncate(*fwd[i].kv, old_len[i] + d[0]);
  }
}

// Every rank computes on the engine's one pool (kernels/cpu/pool.hpp) with all its threads; the
// ranks take turns per kernel.
int rank_threads(const config::ServerArgs& s) { return static_cast<int>(s.threads); }

}  // namespace

tp_rank_actor::behavior_type tp_rank_worker(tp_rank_actor::stateful_pointer<TpRankState> self,
                                            std::shared_ptr<const model::LlamaWeights> weights,
                                            std::shared_ptr<kernels::Communicator> comm, config::Snapshot snapshot,
                                            int rank) {
  self->set_exception_handler(exit_with_message);
  auto& st = self->state;
  st.weights = std::move(weights);
  st.comm = std::move(comm);
  const auto& c = st.weights->config();
  st.kv = std::make_unique<model::KvCache>(c.n_layers, st.weights->local_kv_heads(), c.head_dim, snapshot->page_size,
                                           *snapshot->max_total_tokens, snapshot->device != config::Device::Cuda);
  st.runner = model::make_runner(st.weights, *snapshot, rank, rank_threads(*snapshot), *st.kv);
  st.rank = rank;
  // However this rank ends, nobody may wait for it in a collective.
  self->attach_functor(
      [comm = st.comm, rank](const caf::error&) { comm->abort("rank " + std::to_string(rank) + " stopped"); });
  return {
      [self](step_atom, StepBatch& batch) {
        auto& s = self->state;
        std::vector<model::ForwardSeq> fwd;
        std::vector<std::int64_t> old_len;
        std::vector<kernels::Tree> trees;
        if (!plan_step(
                 batch, s.seqs, [](const StepItem&) { return model::KvCache::Seq{}; }, false, fwd, old_len, trees)
                 .empty())
          return;  // rank 0 refused the same batch before handing it out
        model::ForwardResult out;
        std::vector<std::size_t> offset;
        std::vector<std::int32_t> decisions = decision_slots(batch, offset);
        try {
          s.runner->forward(fwd, *s.kv, out, {}, s.comm.get());
          s.comm->broadcast(decisions.data(), decisions.size(), 0);
        } catch (const model::KvExhausted&) {
          return;  // every rank's pool is the same size and sees the same requests: rank 0 failed too
        } catch (const kernels::CommAborted&) {
          return;  // another rank gave up; rank 0 reports it
        } catch (const std::exception& e) {
          s.comm->abort("rank " + std::to_string(s.rank) + ": " + e.what());  // wake the others, then exit
          throw;
        }
        apply_decisions(*s.runner, *s.kv, fwd, old_len, decisions, offset);
      },
      [self](release_atom, std::uint64_t req) {
        auto& s = self->state;
        auto it = s.seqs.find(req);
        if (it == s.seqs.end()) return;
        s.kv->release(it->second);
        s.seqs.erase(it);
      },
  };
}

target_worker_actor::behavior_type target_worker(target_worker_actor::stateful_pointer<TargetWorkerState> self,
                                                 config::Snapshot snapshot) {
  self->set_exception_handler(exit_with_message);
  auto& st = self->state;
  st.snapshot = std::move(snapshot);
  const int T = static_cast<int>(st.snapshot->tp_size);
  try {
    const bool quiet =
        st.snapshot->log_level == "warn" || st.snapshot->log_level == "error" || st.snapshot->log_level == "off";
    st.model = model::load_model(
        *st.snapshot, quiet ? model::LlamaWeights::Progress{} : model::terminal_progress("loading target"), -1, {0, T});
    const auto& c = st.model->config;
    const bool host_kv = st.snapshot->device != config::Device::Cuda;  // on CUDA the rows live on the device
    st.kv = std::make_shared<model::KvCache>(c.n_layers, st.model->weights->local_kv_heads(), c.head_dim,
                                             st.snapshot->page_size, *st.snapshot->max_total_tokens, host_kv);
    st.runner = model::make_runner(st.model->weights, *st.snapshot, 0,
                                   T > 1 ? rank_threads(*st.snapshot) : static_cast<int>(st.snapshot->threads), *st.kv);
    if (T > 1) {
      // Every shard is bound here first, so a bad file fails the worker before any rank runs.
      std::vector<std::shared_ptr<const model::LlamaWeights>> shards;
      for (int r = 1; r < T; ++r) shards.push_back(model::load_model(*st.snapshot, {}, -1, {r, T}).weights);
      auto group = model::make_tp_group(*st.snapshot);
      st.comm = std::move(group[0]);
      for (int r = 1; r < T; ++r)
        st.ranks.push_back(self->spawn<caf::detached>(
            tp_rank_worker, shards[static_cast<std::size_t>(r - 1)],
            std::shared_ptr<kernels::Communicator>(std::move(group[static_cast<std::size_t>(r)])), st.snapshot, r));
      // The ranks live exactly as long as rank 0.
      self->attach_functor([ranks = st.ranks, comm = st.comm](const caf::error&) {
        comm->abort("rank 0 stopped");  // a rank waiting in a collective wakes up and sees its exit
        for (const auto& r : ranks) caf::anon_send_exit(r, caf::exit_reason::user_shutdown);
      });
      if (st.snapshot->device == config::Device::Cuda)
        spdlog::info("target worker: {} tensor-parallel ranks, one GPU each, over NCCL", T);
      else
        spdlog::info("target worker: {} tensor-parallel ranks on the CPU communicator, {} threads each", T,
                     rank_threads(*st.snapshot));
    }
  } catch (const std::exception& e) {
    // Nothing half-built stays: every handler below sees either a whole worker or none.
    for (const auto& r : st.ranks) caf::anon_send_exit(r, caf::exit_reason::user_shutdown);
    st.ranks.clear();
    st.comm.reset();
    st.runner.reset();
    st.kv.reset();
    st.model.reset();
    st.load_error = e.what();
    st.load_error_is_user = dynamic_cast<const config::ConfigError*>(&e) || dynamic_cast<const model::GgufError*>(&e) ||
                            dynamic_cast<const std::bad_alloc*>(&e);
    if (dynamic_cast<const std::bad_alloc*>(&e)) st.load_error = "out of memory while loading the model";
    // A user error reaches the caller as the engine's exception (and the CLI prints it once).
    if (st.load_error_is_user)
      spdlog::debug("target worker: {}", st.load_error);
    else
      spdlog::error("target worker: {}", st.load_error);
  }
  return {
      [self](info_atom) -> caf::result<TargetInfo> {
        auto& s = self->state;
        if (!s.model) return s.load_error_is_user ? user_error(s.load_error) : internal_error(s.load_error);
        return TargetInfo{s.model->info,     s.model->tokenizer, s.kv->capacity_tokens(),
                          s.kv->page_size(), s.model->weights,   s.kv};
      },
      [self](step_atom, StepBatch& batch) -> caf::result<StepResult> {
        auto& s = self->state;
        if (!s.model) return caf::make_error(caf::sec::runtime_error, s.load_error);
        const auto t0 = std::chrono::steady_clock::now();
        const std::int64_t vocab = s.model->config.vocab_size;
        std::vector<model::ForwardSeq> fwd;
        std::vector<std::int64_t> old_len;
        std::vector<kernels::Tree> trees;
        const std::string refused = plan_step(
            batch, s.seqs,
            [](const StepItem& it) {
              return TargetWorkerState::Seq{{}, kernels::Rng(it.seed)};
            },
            true, fwd, old_len, trees);
        if (!refused.empty()) return caf::make_error(caf::sec::runtime_error, refused);
        bool any_hidden = false;
        for (const auto& it : batch.items) any_hidden = any_hidden || it.want_hidden;
        std::vector<int> capture;
        if (any_hidden)
          for (auto l : batch.capture) {
            if (l < 0 || l >= s.model->config.n_layers)
              return caf::make_error(caf::sec::runtime_error, "target worker: cannot capture layer " +
                                                                  std::to_string(l) + " of " +
                                                                  std::to_string(s.model->config.n_layers));
            capture.push_back(l);
          }
        // The other ranks run the same forward on their shards (the collectives pair them up).
        for (const auto& r : s.ranks) self->send(r, step_atom::value, batch);
        model::ForwardResult out;
        try {
          s.runner->forward(fwd, *s.kv, out, capture, s.comm.get());
        } catch (const model::KvExhausted& e) {
          return caf::make_error(caf::sec::runtime_error, std::string("target worker: ") + e.what());
        } catch (const kernels::CommAborted& e) {
          return caf::make_error(caf::sec::runtime_error, std::string("target worker: ") + e.what());
        } catch (const std::exception& e) {
          if (s.comm) s.comm->abort(std::string("rank 0: ") + e.what());  // the other ranks must not wait for us
          throw;
        }
        StepResult res;
        std::vector<std::size_t> offset;
        std::vector<std::int32_t> decisions = decision_slots(batch, offset);
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
        std::string failed;
        try {
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
            } else {  // decode: one token, or [root, drafts...] verified against the target's rows
              const model::VerifyItem vi{it.tokens, it.parents, it.draft_probs, it.params};
              model::Verdict v = model::verify_step(vi, trees[i], logits, vocab, seq.rng, s.runner->backend());
              committed = v.path;
              decisions[offset[i]] = static_cast<std::int32_t>(v.path.size());
              std::copy(v.path.begin(), v.path.end(), decisions.begin() + static_cast<std::ptrdiff_t>(offset[i] + 1));
              res.items.push_back({it.req, std::move(v.tokens), v.accepted, v.drafted, {}, {}, 0});
            }
            if (it.want_hidden && !capture.empty()) take_rows(res.items.back(), committed);
            tok_row += n_tok;
          }
        } catch (const std::exception& e) {
          failed = e.what();  // the other ranks still wait for the decisions: send what there is
        }
        // Decided once, here; every rank applies the same accepted paths to its KV heads.
        try {
          if (s.comm) s.comm->broadcast(decisions.data(), decisions.size(), 0);
        } catch (const kernels::CommAborted& e) {
          return caf::make_error(caf::sec::runtime_error, std::string("target worker: ") + e.what());
        }
        apply_decisions(*s.runner, *s.kv, fwd, old_len, decisions, offset);
        if (!failed.empty()) return caf::make_error(caf::sec::runtime_error, "target worker: " + failed);
        for (std::size_t i = 0; i < batch.items.size(); ++i)
          if (batch.items[i].want_kv) {
            res.items[i].kv_pages = fwd[i].kv->pages;
            res.items[i].kv_length = fwd[i].kv->length;
          }
        res.compute_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        return res;
      },
      [self](release_atom, std::uint64_t req) {
        auto& s = self->state;
        for (const auto& r : s.ranks) self->send(r, release_atom::value, req);
        auto it = s.seqs.find(req);
        if (it == s.seqs.end()) return;
        s.kv->release(it->second.kv);
        s.seqs.erase(it);
      },
      [self](snapshot_atom) -> config::Snapshot { return self->state.snapshot; },
  };
}

}  // namespace specactor::actors
