// tests/support/skip.hpp — a test case that cannot run on this machine says so and is counted as
// skipped, not passed.
//
//   if (!have_model) SKIP_CASE("no default model", "run tools/setup");   // returns from the case
//
// The case's process then exits with kSkipExit (when every case it ran was skipped and none failed),
// which CTest reports as "Skipped" (SKIP_RETURN_CODE in tests/CMakeLists.txt). The line printed,
// "SKIPPED [why]: detail", is what `tools/setup test` counts in its summary, by `why`.
#pragma once

#include <sstream>
#include <string>

namespace specactor::testing {

inline constexpr int kSkipExit = 77;

// Records that the running test case is skipped for `why` (a short category: "no CUDA device", "no
// default model", …) and prints the line. The caller returns from the case right after.
void mark_skipped(const std::string& why, const std::string& detail);

}  // namespace specactor::testing

// Skips the rest of the running test case (`detail` may use <<).
#define SKIP_CASE(why, detail)                                     \
  do {                                                             \
    std::ostringstream skip_detail_;                               \
    skip_detail_ << detail;                                        \
    ::specactor::testing::mark_skipped((why), skip_detail_.str()); \
    return;                                                        \
  } while (0)
