#include "actors/system.hpp"

#include <signal.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <caf/all.hpp>
#include <cstdlib>
#include <exception>
#include <thread>

#include "actors/messages.hpp"

namespace specactor::actors {

std::size_t scheduler_threads(unsigned hardware_threads) { return std::clamp<std::size_t>(hardware_threads / 2, 1, 4); }

// The cooperative actors (scheduler, engine plumbing) do little work; the detached workers run the
// compute (on the one pool of kernels/cpu/pool.hpp). CAF's default work-stealing workers poll while idle, and on a
// small machine that polling steals cores from the forward passes (measured: 57 vs 86 tok/s decode on 2 cores), so the
// engine uses the "sharing" policy (idle workers block) with half the cores at most.

void configure_actor_system(caf::actor_system_config& cfg) {
  cfg.set("scheduler.max-threads", scheduler_threads(std::thread::hardware_concurrency()));
  cfg.set("scheduler.policy", caf::atom("sharing"));
}

struct StartupSignals::Impl {
  std::atomic<bool> done{false};
  std::thread watcher;
};

StartupSignals::StartupSignals(std::string what) : impl_(new Impl) {
  impl_->watcher = std::thread([this, what = std::move(what)] {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    const timespec tick{0, 50'000'000};
    while (!impl_->done.load()) {
      const int sig = sigtimedwait(&set, nullptr, &tick);
      if (sig <= 0) continue;
      spdlog::warn("{} during {}: stopping", sig == SIGINT ? "SIGINT" : "SIGTERM", what);
      spdlog::default_logger()->flush();
      std::_Exit(128 + sig);
    }
  });
}

StartupSignals::~StartupSignals() {
  impl_->done.store(true);
  impl_->watcher.join();
  delete impl_;
}

caf::error user_error(std::string message) { return caf::make_error(caf::sec::invalid_argument, std::move(message)); }

caf::error internal_error(std::string message) { return caf::make_error(caf::sec::runtime_error, std::move(message)); }

bool is_user_error(const caf::error& e) {
  return e.category() == caf::atom("system") && e.code() == static_cast<std::uint8_t>(caf::sec::invalid_argument);
}

std::string error_message(const caf::error& e) {
  if (e.context().match_elements<std::string>()) return e.context().get_as<std::string>(0);
  return caf::to_string(e);
}

caf::error exit_with_message(caf::scheduled_actor*, std::exception_ptr& eptr) {
  try {
    std::rethrow_exception(eptr);
  } catch (const std::exception& e) {
    return caf::make_error(caf::sec::runtime_error, std::string(e.what()));
  } catch (...) {
    return caf::make_error(caf::sec::runtime_error, std::string("unknown exception"));
  }
}

}  // namespace specactor::actors
