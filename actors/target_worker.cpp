#include "actors/target_worker.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <caf/all.hpp>

#include "actors/system.hpp"
#include "config/error.hpp"
#include "model/gguf.hpp"

namespace specactor::actors {

namespace {

// One rank's step machinery: its KV cache (on CUDA the rows live on the device) and its runner. Every
// rank computes on the engine's one pool (kernels/cpu/pool.hpp) with all its threads; the ranks take
// turns per kernel.
std::unique_ptr<model::TargetStep> make_step(const std::shared_ptr<const model::LlamaWeights>& w,
                                             const config::ServerArgs& s, int rank,
                                             std::shared_ptr<kernels::Communicator> comm) {
  const auto& c = w->config();
  auto kv = std::make_shared<model::KvCache>(c.n_layers, w->local_kv_heads(), c.head_dim, s.page_size,
                                             *s.max_total_tokens, s.device != config::Device::Cuda, model::kv_type(s));
  auto runner = model::make_runner(w, s, rank, static_cast<int>(s.threads), *kv);
  return std::make_unique<model::TargetStep>(std::move(kv), std::move(runner), std::move(comm));
}

// Loads the target (rank 0) and, with --tp-size T > 1, binds every other shard first (so a bad file
// fails the worker before any rank runs) and spawns one rank worker per shard.
void load(target_worker_actor::stateful_pointer<TargetWorkerState> self) {
  auto& st = self->state;
  const config::ServerArgs& s = *st.snapshot;
  const int T = static_cast<int>(s.tp_size);
  const bool quiet = s.log_level == "warn" || s.log_level == "error" || s.log_level == "off";
  st.model = model::load_model(s, quiet ? model::LlamaWeights::Progress{} : model::terminal_progress("loading target"),
                               -1, {0, T});
  if (T == 1) {
    st.step = make_step(st.model->weights, s, 0, nullptr);
    return;
  }
  std::vector<std::shared_ptr<const model::LlamaWeights>> shards;
  for (int r = 1; r < T; ++r) shards.push_back(model::load_model(s, {}, -1, {r, T}).weights);
  auto group = model::make_tp_group(s);
  std::shared_ptr<kernels::Communicator> comm = std::move(group[0]);
  st.step = make_step(st.model->weights, s, 0, comm);
  for (int r = 1; r < T; ++r) {
    const auto i = static_cast<std::size_t>(r);
    st.ranks.push_back(self->spawn<caf::detached>(
        tp_rank_worker, shards[i - 1], std::shared_ptr<kernels::Communicator>(std::move(group[i])), st.snapshot, r));
  }
  // The ranks live exactly as long as rank 0.
  self->attach_functor([ranks = st.ranks, comm](const caf::error&) {
    comm->abort("rank 0 stopped");  // a rank waiting in a collective wakes up and sees its exit
    for (const auto& r : ranks) caf::anon_send_exit(r, caf::exit_reason::user_shutdown);
  });
  if (s.device == config::Device::Cuda)
    spdlog::info("target worker: {} tensor-parallel ranks, one GPU each, over NCCL", T);
  else
    spdlog::info("target worker: {} tensor-parallel ranks on the CPU communicator, {} threads each", T, s.threads);
}

// Nothing half-built stays: every handler sees either a whole worker or none. A user error (a model
// file, a setting, a memory budget) reaches the caller as the engine's exception (the CLI prints it
// once); anything else is logged as a bug.
void drop_after_load_error(TargetWorkerState& st, const std::exception& e) {
  for (const auto& r : st.ranks) caf::anon_send_exit(r, caf::exit_reason::user_shutdown);
  st.ranks.clear();
  st.step.reset();
  st.model.reset();
  const bool oom = dynamic_cast<const std::bad_alloc*>(&e) != nullptr;
  st.load_error = oom ? "out of memory while loading the model" : e.what();
  st.load_error_is_user =
      oom || dynamic_cast<const config::ConfigError*>(&e) || dynamic_cast<const model::GgufError*>(&e);
  if (st.load_error_is_user)
    spdlog::debug("target worker: {}", st.load_error);
  else
    spdlog::error("target worker: {}", st.load_error);
}

caf::error step_error(const std::string& what) { return caf::make_error(caf::sec::runtime_error, what); }

}  // namespace

tp_rank_actor::behavior_type tp_rank_worker(tp_rank_actor::stateful_pointer<TpRankState> self,
                                            std::shared_ptr<const model::LlamaWeights> weights,
                                            std::shared_ptr<kernels::Communicator> comm, config::Snapshot snapshot,
                                            int rank) {
  self->set_exception_handler(exit_with_message);
  self->state.step = make_step(weights, *snapshot, rank, comm);
  // However this rank ends, nobody may wait for it in a collective.
  self->attach_functor([comm, rank](const caf::error&) { comm->abort("rank " + std::to_string(rank) + " stopped"); });
  return {
      [self](step_atom, StepBatch& batch) { self->state.step->follow(batch); },
      [self](release_atom, std::uint64_t req) { self->state.step->release(req); },
      [self](cache_atom, std::uint64_t req, std::vector<std::int32_t>& keep, std::vector<std::int32_t>& drop) {
        self->state.step->cache_ops(req, keep, drop);
      },
  };
}

target_worker_actor::behavior_type target_worker(target_worker_actor::stateful_pointer<TargetWorkerState> self,
                                                 config::Snapshot snapshot) {
  self->set_exception_handler(exit_with_message);
  self->state.snapshot = std::move(snapshot);
  try {
    load(self);
    // The budget's cost model starts from a short probe (only an engine that speculates adaptively).
    const auto& sn = *self->state.snapshot;
    if (sn.speculative_algorithm != config::SpecAlgorithm::None && sn.speculative_adaptive) {
      auto& st = self->state;
      st.step_probe =
          st.step->probe(static_cast<std::int32_t>(st.model->info.vocab_size), 400.0, [&](const StepBatch& b) {
            for (const auto& r : st.ranks) self->send(r, step_atom::value, b);
          });
      std::string probe;
      for (const auto& [rows, ms] : st.step_probe) probe += fmt::format(" {} rows {:.2f} ms", rows, ms);
      spdlog::debug("target worker: cost probe:{}{}", probe.empty() ? " nothing measured" : probe,
                    st.step->probe_error().empty() ? "" : " (" + st.step->probe_error() + ")");
    }
  } catch (const std::exception& e) {
    drop_after_load_error(self->state, e);
  }
  return {
      [self](info_atom) -> caf::result<TargetInfo> {
        auto& s = self->state;
        if (!s.step) return s.load_error_is_user ? user_error(s.load_error) : internal_error(s.load_error);
        const auto& kv = s.step->kv();
        return TargetInfo{s.model->info,   s.model->tokenizer, kv->capacity_tokens(),
                          kv->page_size(), s.model->weights,   kv,
                          s.step_probe};
      },
      [self](step_atom, StepBatch& batch) -> caf::result<StepResult> {
        auto& s = self->state;
        if (!s.step) return step_error(s.load_error);
        try {
          // The other ranks run the same forward on their shards (the collectives pair them up).
          return s.step->run(batch, [&] {
            for (const auto& r : s.ranks) self->send(r, step_atom::value, batch);
          });
        } catch (const model::StepFailed& e) {
          return step_error(e.what());
        }
      },
      [self](release_atom, std::uint64_t req) {
        auto& s = self->state;
        for (const auto& r : s.ranks) self->send(r, release_atom::value, req);
        if (s.step) s.step->release(req);
      },
      [self](cache_atom, std::uint64_t req, std::vector<std::int32_t>& keep, std::vector<std::int32_t>& drop) {
        auto& s = self->state;
        for (const auto& r : s.ranks) self->send(r, cache_atom::value, req, keep, drop);
        if (s.step) s.step->cache_ops(req, keep, drop);
      },
      [self](snapshot_atom) -> config::Snapshot { return self->state.snapshot; },
  };
}

}  // namespace specactor::actors
