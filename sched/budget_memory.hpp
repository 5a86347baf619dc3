// sched/budget_memory.hpp — where the budget's memory lives between engine starts
// (--speculative-budget-cache): its key (what it was learned with), its file, when it is written.
// The format and the codec are in sched/memory.hpp; the scheduler actor only calls open and save.
#pragma once

#include <cstdint>
#include <string>

#include "config/server_args.hpp"
#include "model/model_info.hpp"

namespace specactor::sched {

class Scheduler;

// What the memory was learned with: the machine (CPU, integer path, threads, precision, device), the
// target (file name, bytes, weight types) and the drafter with its shape. An engine reads only a file
// whose key is its own, so a head, a shape or a CPU never borrows another's acceptance or costs.
std::string budget_memory_key(const config::ServerArgs& target, const config::ServerArgs& draft,
                              const model::ModelInfo& info);

class BudgetMemory {
 public:
  // Written every this many decode steps (and at exit, and when the draft shape changes).
  static constexpr std::int64_t kEvery = 4096;

  // Starts `policy`'s budget from the file of this engine's key, when the budget is on and kept
  // (`draft` null or without an algorithm, a fixed shape or "none": off). Sets the policy's
  // metrics().budget_memory to what happened ("off", "read FILE", "new FILE", "ignored FILE: why").
  void open(Scheduler& policy, const config::ServerArgs& target, const config::ServerArgs* draft,
            const model::ModelInfo& info);
  // Writes what the budget learned (a failed write is reported once).
  void save(const Scheduler& policy);
  // Writes when kEvery decode steps passed since the last write.
  void save_if_due(const Scheduler& policy);
  bool kept() const { return !file_.empty(); }
  const std::string& file() const { return file_; }

 private:
  std::string file_, key_;
  std::int64_t saved_at_ = 0;  // decode steps when it was last written
  bool warned_ = false;
};

}  // namespace specactor::sched
