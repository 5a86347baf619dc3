// actors/scheduler_actor.hpp — the scheduler: owns requests, admission (KV budget, max running requests),
// continuous batching with chunked prefill, stop conditions, streaming, metrics; resolves nothing
// itself but derives the draft snapshot once from the target's resolved snapshot and the loaded
// model, spawns the workers and supervises them.
#pragma once

#include <caf/actor_system.hpp>
#include <caf/typed_actor.hpp>

#include "actors/messages.hpp"

namespace specactor::actors {

using scheduler_actor = caf::typed_actor<
    // Answers once the target model is loaded (or with the load error).
    caf::replies_to<ready_atom>::with<TargetInfo>,
    // Queues a request; its tokens stream to the submission's callback.
    caf::reacts_to<submit_atom, std::shared_ptr<const Submission>>,
    // Cancels a queued or running request (its callback gets a final "cancelled" event).
    caf::reacts_to<cancel_atom, std::uint64_t>,
    // Aggregate metrics.
    caf::replies_to<metrics_atom>::with<EngineMetrics>,
    // The snapshot objects held by the scheduler and the workers (isolation tests).
    caf::replies_to<snapshot_atom>::with<SnapshotReport>,
    // A new draft snapshot for the draft worker; the target's stays the same object.
    caf::reacts_to<reconf_atom, config::Snapshot>,
    // Spawns a new draft worker after a failure.
    caf::reacts_to<restart_atom>,
    // Empties the prefix cache of every page no running request uses; replies how many it gave up.
    caf::replies_to<flush_atom>::with<std::int64_t>,
    // Internal: run the next step.
    caf::reacts_to<tick_atom>>;

// Spawns the scheduler (which spawns the target worker, and the draft worker once the model is
// loaded). `target` is the resolved target snapshot; the target worker gets this very object.
scheduler_actor spawn_scheduler(caf::actor_system& system, config::Snapshot target);

}  // namespace specactor::actors
