// actors/engine_caf.hpp — building an engine inside a host's own caf::actor_system (the host keeps
// the system alive longer than the engine and configures its scheduler threads itself).
#pragma once

#include <caf/actor_system.hpp>

#include "actors/engine.hpp"

namespace specactor::actors {

std::unique_ptr<Engine> create_engine_in(caf::actor_system& system, const config::ServerArgs& user_args);

}  // namespace specactor::actors
