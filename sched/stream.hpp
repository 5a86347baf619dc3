// sched/stream.hpp — streaming a request's text: stop strings matched on the text as it is decoded.
// (The scheduler's side of streaming, Scheduler::emit and the token events, is in sched/stream.cpp.)
#pragma once

#include <string>
#include <vector>

namespace specactor::sched {

// Stop-string matching on streamed text: text that could still be the start of a stop string is held
// back until it cannot; once a stop string appears, the text before it is released and the rest dropped.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops = {});
  // Adds text; returns what may be streamed now. `stopped` turns true when a stop string appeared.
  std::string push(const std::string& text);
  bool stopped() const { return stopped_; }
  // What was held back (at the end of a request that did not stop on a stop string).
  std::string flush();

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace specactor::sched
