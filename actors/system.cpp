#include "actors/system.hpp"

#include <algorithm>
#include <thread>

namespace specactor::actors {

std::size_t scheduler_threads(unsigned hardware_threads) {
  return std::clamp<std::size_t>(hardware_threads, 1, 4);
}

void configure_actor_system(caf::actor_system_config& cfg) {
  cfg.set("scheduler.max-threads", scheduler_threads(std::thread::hardware_concurrency()));
}

}  // namespace specactor::actors
