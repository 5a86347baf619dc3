// actors/target_worker.hpp — the target worker: owns the target model and its KV cache, runs one
// forward per step over every request's new tokens, samples or verifies, and rolls back rejected
// tokens. Detached (it blocks on compute). Receives its snapshot at spawn and never changes it.
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

namespace specactor::actors {

// A tensor-parallel rank > 0: runs its share of every step and applies rank 0's decisions.
struct TpRankState {
  std::shared_ptr<const model::LlamaWeights> weights;
  std::shared_ptr<kernels::Communicator> comm;
  std::unique_ptr<model::KvCache> kv;
  std::unique_ptr<model::ForwardRunner> runner;
  std::map<std::uint64_t, model::KvCache::Seq> seqs;
  int rank = 0;
  static inline const char* name = "tp_rank_worker";
};
using tp_rank_actor =
    caf::typed_actor<caf::reacts_to<step_atom, StepBatch>, caf::reacts_to<release_atom, std::uint64_t>>;

struct TargetWorkerState {
  config::Snapshot snapshot;
  std::optional<model::LoadedModel> model;
  std::shared_ptr<model::KvCache> kv;  // drafters get a const handle (TargetInfo::kv)
  std::unique_ptr<model::ForwardRunner> runner;
  std::string load_error;
  bool load_error_is_user = false;  // a model file, a setting or a memory budget (not a bug)
  struct Seq {
    model::KvCache::Seq kv;
    kernels::Rng rng;
  };
  std::map<std::uint64_t, Seq> seqs;
  std::shared_ptr<kernels::Communicator> comm;  // rank 0's, when tensor parallel
  std::vector<tp_rank_actor> ranks;             // ranks 1 .. T-1
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
    // The snapshot this worker was spawned with (the isolation tests compare pointers).
    caf::replies_to<snapshot_atom>::with<config::Snapshot>>;

target_worker_actor::behavior_type target_worker(target_worker_actor::stateful_pointer<TargetWorkerState> self,
                                                 config::Snapshot snapshot);

}  // namespace specactor::actors
