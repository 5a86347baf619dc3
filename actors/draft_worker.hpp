// actors/draft_worker.hpp — a draft worker: runs one drafters::Drafter (built by the factory registered for
// the draft snapshot's algorithm) for every request. Detached; it owns the drafter's state only.
#pragma once

#include <caf/typed_actor.hpp>

#include "actors/messages.hpp"
#include "drafters/drafter.hpp"

namespace specactor::actors {

using drafters::DraftContext;
using drafters::Drafter;
using drafters::DrafterFactory;
using drafters::DraftTree;
using drafters::TargetFeatures;

struct DraftWorkerState {
  config::Snapshot snapshot;
  std::unique_ptr<Drafter> drafter;
  static inline const char* name = "draft_worker";
};

using draft_worker_actor = caf::typed_actor<
    // Proposes a chain of draft tokens per request (possibly empty).
    caf::replies_to<propose_atom, ProposeBatch>::with<Proposals>,
    // The request is gone: drop its state.
    caf::reacts_to<release_atom, std::uint64_t>,
    // Empty the drafter's own prefix cache (with the target's /flush_cache).
    caf::reacts_to<flush_atom>,
    // A new draft snapshot (between steps): the worker swaps its pointer and tells the drafter.
    caf::reacts_to<reconf_atom, config::Snapshot>,
    // What the drafter needs from the target (hidden layers, KV view).
    caf::replies_to<needs_atom>::with<DrafterNeeds>,
    // The draft model's config as JSON text (the isolation tests read the hot vocabulary here).
    caf::replies_to<info_atom>::with<std::string>,
    // The snapshot the worker holds now.
    caf::replies_to<snapshot_atom>::with<config::Snapshot>>;

// `snapshot` is the draft snapshot the scheduler derived; `factory` is called with that same object.
draft_worker_actor::behavior_type draft_worker(draft_worker_actor::stateful_pointer<DraftWorkerState> self,
                                               config::Snapshot snapshot, DrafterFactory factory, DraftContext context);

}  // namespace specactor::actors
