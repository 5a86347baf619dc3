// actors/system.hpp — the CAF actor system as specactor runs it.
#pragma once

#include <caf/actor_system_config.hpp>

#include "config/snapshot.hpp"
#include "config/snapshot_inspect.hpp"  // Snapshot travels in messages

namespace specactor::actors {

// Scheduler threads for the cooperative actors: CAF starts 4 by default even on 2 cores; the
// compute actors are detached (own threads), so the cooperative pool needs only a few: half the
// cores, 1 to 4.
std::size_t scheduler_threads(unsigned hardware_threads);

// Sets the scheduler thread count and the blocking "sharing" policy on a CAF config before the
// actor_system is built.
void configure_actor_system(caf::actor_system_config& cfg);

}  // namespace specactor::actors
