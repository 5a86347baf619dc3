// actors/target_worker.hpp — the target worker: loads the target model, owns its KV cache, and runs
// each step through model::TargetStep (forward, sampling or verification, KV compaction). Detached
// (it blocks on compute). Receives its snapshot at spawn and never changes it.
//
// Tensor parallel (--tp-size T > 1): this worker is rank 0. It loads every rank's shard, spawns one
// rank worker per other rank (each its own detached actor with its shard, its KV heads and its
// communicator), hands each step to them, and runs its own share. All ranks end a forward with
// identical logits (the all-reduce sums in rank order); rank 0 alone samples/verifies and broadcasts
// the accepted paths over the communicator, so ranks can never disagree about which KV rows stay.
#pragma once

#include <caf/typed_actor.hpp>
#include <map>
#include <optional>

#include "actors/messages.hpp"
#include "kernels/comm.hpp"
#include "model/loader.hpp"
#include "model/runner.hpp"
#include "model/target_step.hpp"

namespace specactor::actors {

// A tensor-parallel rank > 0: runs its share of every step and applies rank 0's decisions.
struct TpRankState {
  std::unique_ptr<model::TargetStep> step;
  static inline const char* name = "tp_rank_worker";
};
using tp_rank_actor =
    caf::typed_actor<caf::reacts_to<step_atom, StepBatch>, caf::reacts_to<release_atom, std::uint64_t>,
                     caf::reacts_to<cache_atom, std::uint64_t, std::vector<std::int32_t>, std::vector<std::int32_t>>>;

tp_rank_actor::behavior_type tp_rank_worker(tp_rank_actor::stateful_pointer<TpRankState> self,
                                            std::shared_ptr<const model::LlamaWeights> weights,
                                            std::shared_ptr<kernels::Communicator> comm, config::Snapshot snapshot,
                                            int rank);

struct TargetWorkerState {
  config::Snapshot snapshot;
  std::optional<model::LoadedModel> model;
  std::unique_ptr<model::TargetStep> step;  // the KV cache in it is shared with drafters as const (TargetInfo::kv)
  std::string load_error;
  bool load_error_is_user = false;                          // a model file, a setting or a memory budget (not a bug)
  std::vector<tp_rank_actor> ranks;                         // ranks 1 .. T-1
  std::vector<std::pair<std::int64_t, double>> step_probe;  // the cost probe after loading
  static inline const char* name = "target_worker";
};

using target_worker_actor = caf::typed_actor<
    // Loads the model (once) and reports its ModelInfo, tokenizer and KV capacity; an error when
    // the model could not be loaded.
    caf::replies_to<info_atom>::with<TargetInfo>,
    // One forward over the batch: prefill chunks, and decode items [root, drafts...] whose drafts are
    // verified against the target (greedy, or lossless sampling); returns accepted drafts + bonus.
    caf::replies_to<step_atom, StepBatch>::with<StepResult>,
    // Frees a request's KV pages.
    caf::reacts_to<release_atom, std::uint64_t>,
    // The prefix cache: references on a request's pages the cache keeps (before its release), and
    // pages the cache gives up (model::TargetStep::cache_ops).
    caf::reacts_to<cache_atom, std::uint64_t, std::vector<std::int32_t>, std::vector<std::int32_t>>,
    // The snapshot this worker was spawned with (the isolation tests compare pointers).
    caf::replies_to<snapshot_atom>::with<config::Snapshot>>;

target_worker_actor::behavior_type target_worker(target_worker_actor::stateful_pointer<TargetWorkerState> self,
                                                 config::Snapshot snapshot);

}  // namespace specactor::actors
