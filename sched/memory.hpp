// sched/memory.hpp — what the budget learned, kept across engine starts.
//
// The acceptance model needs a few hundred verified nodes before its tables say more than their
// priors, the feedback a dozen steps per batch size, and the draft cost a round or two; an engine
// that starts from nothing pays for that on its first requests (measured: chat first in the bench
// prompts read ~5 % lower than the same prompts after two others). So the scheduler keeps those
// tables in a small text file per (CPU, integer path, threads, precision, model, drafter and shape)
// and starts from it. The step-cost cells are not kept: the start-up probe measures them again, and a
// stale median of a rare row count would outlive its machine state.
//
// The file is plain text, one record per line:
//   specactor-budget-memory 1
//   key <what it was learned with>
//   accept <score bin> <depth> <hits> <seen>      AcceptanceModel calibration table
//   level <depth> <hits> <seen>                   per-depth acceptance over all requests
//   whole <depth> <hits> <seen>                   the same after a draft taken whole
//   rounds <bin> <hits> <seen>                    rounds that proposed anything, by the empty rounds
//                                                 in a row before them (AcceptanceModel::round_bin)
//   draft <levels> <ms>                           recent draft rounds, oldest first
//   feedback <bucket> <scale> <plain tokens> <plain ms> <plain steps> <spec tokens> <spec ms> <spec steps>
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "sched/budget.hpp"

namespace specactor::sched {

struct MemoryCodec {
  static constexpr std::string_view kHeader = "specactor-budget-memory 1";
  // Counts above this per cell are scaled down when read, so a new run's evidence still moves them.
  static constexpr double kCap = 400;

  static std::string save(const std::string& key, const AcceptanceModel& accept, const CostModel& cost,
                          const Feedback& feedback);
  // Replaces the models' learned state with the text's. Returns "" when done, "key" when the text was
  // learned with another key (nothing changed: not an error, a different engine), else what is wrong
  // ("line N: …"; nothing changed).
  static std::string restore(std::string_view text, const std::string& key, AcceptanceModel& accept, CostModel& cost,
                             Feedback& feedback);
};

// folder/budget-<16 hex digits of the key's FNV-1a hash>.txt
std::string memory_file(const std::string& folder, const std::string& key);
// $XDG_CACHE_HOME/specactor/budget (an absolute $XDG_CACHE_HOME), else $HOME/.cache/specactor/budget;
// "" when neither is set.
std::string default_memory_folder();
// A budget-memory file is a few KiB; a larger one is not read (nor a file that is not regular).
constexpr std::size_t kMaxMemoryFileBytes = std::size_t{1} << 20;
// Reads `path` into `text`, its size checked before anything is read. Returns "" (a missing file too: `text` then stays
// empty) or the error.
std::string read_memory_file(const std::string& path, std::string& text);
// Writes `text` to `path` through a temporary file and a rename (a reader never sees half a file),
// creating the folder. Returns "" or the error.
std::string write_memory_file(const std::string& path, const std::string& text);

}  // namespace specactor::sched
