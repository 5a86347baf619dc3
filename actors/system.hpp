// actors/system.hpp — the CAF actor system as specactor runs it.
#pragma once

#include <caf/actor_system_config.hpp>
#include <caf/error.hpp>
#include <string>

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

// While a process starts (loads a model, waits for its workers) nothing waits for SIGINT/SIGTERM
// yet, and the caller has blocked them for the sigwait that comes after. This watches for them
// meanwhile: on one it logs "<signal> during <what>: stopping" and ends the process at once with
// 128 + the signal (nothing has been accepted yet, so nothing is lost). Stops watching when
// destroyed, leaving later signals to the caller's own wait.
class StartupSignals {
 public:
  explicit StartupSignals(std::string what);
  ~StartupSignals();
  StartupSignals(const StartupSignals&) = delete;
  StartupSignals& operator=(const StartupSignals&) = delete;

 private:
  struct Impl;
  Impl* impl_;
};

// Errors that cross actor boundaries keep one distinction: the user's input was wrong (a model
// file, a setting, a budget: exit 2 / HTTP 400, caf::sec::invalid_argument) or the engine failed
// (a bug or the machine: caf::sec::runtime_error). Both carry the message as their only context.
caf::error user_error(std::string message);
caf::error internal_error(std::string message);
bool is_user_error(const caf::error& e);
// The message an error carries (its rendering when it carries none).
std::string error_message(const caf::error& e);

}  // namespace specactor::actors
