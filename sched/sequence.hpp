// sched/sequence.hpp — one request as the scheduling policy tracks it, its fields grouped by the
// seam of the policy that owns them: the KV it holds (admission, retirement: sched/policy.cpp), its
// output (streaming and stop matching: sched/stream.cpp), its drafting state (plan, apply, observe:
// sched/drafting.cpp) and its place in the prefix cache (sched/cache_glue.cpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "grammar/mask.hpp"
#include "model/prefix_tree.hpp"
#include "model/tokenizer.hpp"
#include "sched/budget.hpp"
#include "sched/step.hpp"
#include "sched/stream.hpp"
#include "sched/types.hpp"

namespace specactor::sched {

using Clock = std::chrono::steady_clock;

struct Sequence {
  std::shared_ptr<const Submission> sub;
  std::vector<std::int32_t> seq;  // prompt + emitted tokens
  std::size_t prompt_len = 0;
  std::size_t prefilled = 0;  // prompt tokens in the target's KV
  std::size_t chunk = 0;      // prompt tokens in the step in flight
  std::int64_t max_new = 0;
  std::uint64_t seed = 0;
  kernels::LogitRules rules;  // the request's, with the model's end ids for min_tokens
  bool cancelled = false;
  bool in_step = false;
  Clock::time_point submitted;
  RequestMetrics m;

  // The target's KV: what the request may use, holds in reserve and has written.
  struct Kv {
    std::int64_t need = 0;      // tokens it may use: prompt + max_new (+ the draft tree at admission)
    std::int64_t reserved = 0;  // pages held from admission to retirement
    std::vector<std::int32_t> pages;
    std::int64_t length = 0;
  } kv;

  // What it emitted and how the text streams.
  struct Output {
    std::vector<std::int32_t> generated;
    std::unique_ptr<model::StreamDecoder> decoder;
    StopMatcher stops;
    Clock::time_point first_token;
  } out;

  // Drafting: the proposal in the step in flight and what the drafter is fed.
  struct Draft {
    std::int32_t depth = 0;  // depth of the proposal in the step in flight
    // The nodes of that proposal the target verifies, with what the acceptance model predicted.
    struct Verified {
      std::int32_t token = 0, parent = -1, depth = 1;
      float score = -1;
      double prob = 0;
    };
    std::vector<Verified> verified;
    RequestAcceptance acc;
    // Target features for a head drafter, gathered since the last proposal.
    std::vector<float> hidden;
    std::int64_t hidden_first = 0;  // context position of hidden's first row
    std::int64_t hidden_rows = 0;   // rows received so far (= position after the last row)
    bool primed = false;            // a proposal round took in its prompt (its first round)
  } draft;

  // The prefix cache: the request runs on `pages` (whole pages) and the first copy_len slots of
  // copy_page copied into a page of its own (a partly matched page) — its first `tokens` tokens —
  // under a lock on `node`; `on`: its KV may be looked up and inserted.
  struct Cache {
    bool on = false;
    model::PrefixTree::Node* node = nullptr;
    std::vector<std::int32_t> pages;
    std::int64_t tokens = 0;
    std::int32_t copy_page = -1;
    std::int64_t copy_len = 0;
  } cache;

  // Constrained output (sched/constrain.cpp): the matcher over what was emitted, the masks of its
  // grammar's states (shared by requests with the same constraint).
  struct Constraint {
    std::unique_ptr<grammar::Matcher> matcher;
    std::shared_ptr<grammar::MaskCache> masks;
  } constraint;

  std::uint64_t id() const { return sub->id; }
};

}  // namespace specactor::sched
