// actors/target_worker.hpp — the target worker: owns the target model and its KV cache, runs one
// forward per step over every request's new tokens, samples or verifies, and rolls back rejected
// tokens. Detached (it blocks on compute). Receives its snapshot at spawn and never changes it.
#pragma once

#include <caf/typed_actor.hpp>

#include <map>
#include <optional>

#include "actors/messages.hpp"
#include "model/loader.hpp"

namespace specactor::actors {

struct TargetWorkerState {
  config::Snapshot snapshot;
  std::optional<model::LoadedModel> model;
  std::shared_ptr<model::KvCache> kv;  // drafters get a const handle (TargetInfo::kv)
  std::unique_ptr<model::LlamaRunner> runner;
  std::string load_error;
  struct Seq {
    model::KvCache::Seq kv;
    kernels::Rng rng;
  };
  std::map<std::uint64_t, Seq> seqs;
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
