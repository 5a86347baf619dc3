// sched/policy_detail.hpp — helpers the policy's files share (sched/policy.cpp, stream.cpp,
// drafting.cpp, cache_glue.cpp); not part of the policy's interface.
#pragma once

#include <cstdint>
#include <vector>

#include "sched/sequence.hpp"

namespace specactor::sched::detail {

inline double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

inline std::int64_t pages_for(std::int64_t tokens, std::int64_t page) { return (tokens + page - 1) / page; }

// Hands the request's callback an event (a callback that throws is logged, never propagated).
void notify(Sequence& r, TokenEvent ev);
// The request's metrics at its end.
RequestMetrics finish_metrics(const Sequence& r);

// Counts one more occurrence at each of the first `n` levels of a per-level histogram.
inline void count_levels(std::vector<std::int64_t>& histogram, std::int32_t n) {
  if (static_cast<std::int32_t>(histogram.size()) < n) histogram.resize(static_cast<std::size_t>(n), 0);
  for (std::int32_t d = 0; d < n; ++d) ++histogram[static_cast<std::size_t>(d)];
}

}  // namespace specactor::sched::detail
