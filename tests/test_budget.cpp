// tests/test_budget.cpp — the speculation budget (sched/budget.hpp) driven with synthetic costs and
// acceptance sequences, and the suffix store (drafters/suffix_store.hpp). No model, no actors.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "drafters/drafter.hpp"
#include "drafters/suffix_store.hpp"
#include "sched/budget.hpp"
#include "sched/memory.hpp"
#include "sched/policy.hpp"

using namespace specactor::sched;
using specactor::drafters::SuffixStore;

namespace {

// A machine where a step costs a + b·rows ms (memory-bound: a is the weights' stream).
CostModel linear_cost(double a, double b) {
  CostModel c;
  for (std::int64_t r : {1, 2, 4, 8, 16, 32}) c.seed(r, a + b * static_cast<double>(r));
  return c;
}

DepthAsk ask_for(const AcceptanceModel& m, const RequestAcceptance& r, std::int32_t max_depth) {
  DepthAsk a;
  a.max_depth = max_depth;
  a.probe = probe_due(r);
  for (std::int32_t d = 1; d <= max_depth; ++d) a.level_probs.push_back(m.level_prob(d, r));
  return a;
}

// One request's step under plan_depths: how deep it drafts, then `accepted_depth(d)` is what the
// target accepts of a chain of depth d; the models learn from it. Returns the depth drafted.
template <class Accept>
std::int32_t one_step(AcceptanceModel& m, RequestAcceptance& r, const CostModel& cost, Accept&& accepted_depth) {
  const DepthAsk a = ask_for(m, r, 6);
  const auto depth = plan_depths({a}, 1, 1.0, 100, cost)[0];
  note_plan(r, a.probe, depth);
  if (depth == 0) return 0;
  const std::int32_t acc = accepted_depth(depth);
  for (std::int32_t d = 1; d <= depth; ++d) m.observe_node(-1, d, m.node_prob(-1, d, r), d <= acc, r);
  m.observe_levels(depth, acc, r);
  return depth;
}

}  // namespace

TEST_CASE("cost model: ring medians shrug off spikes, a line fits the buckets, bands borrow the shape") {
  CostModel c = linear_cost(10.0, 0.5);
  CHECK(c.known());
  CHECK(c.step_ms(1, 0) == doctest::Approx(10.5).epsilon(0.01));
  CHECK(c.step_ms(6, 0) == doctest::Approx(13.0).epsilon(0.01));   // between probed sizes
  CHECK(c.step_ms(64, 0) == doctest::Approx(42.0).epsilon(0.01));  // beyond them, the same line
  CHECK(c.relative(2, 0) == doctest::Approx(11.0 / 10.5).epsilon(0.01));
  // Real steps replace the probe; a preempted step (10× slower) among nine does not move the estimate.
  for (int i = 0; i < 8; ++i) c.observe_step(1, 0, 9.0);
  c.observe_step(1, 0, 90.0);
  CHECK(c.step_ms(1, 0) < 10.0);
  // One bucket gone wrong (a stale probe of 4 rows at 40 ms) cannot bend the line through the others,
  // and a bucket without three real steps is predicted by the line, so the stale value is not used.
  CostModel d = linear_cost(10.0, 0.5);
  d.seed(4, 40.0);
  CHECK(d.step_ms(3, 0) == doctest::Approx(11.5).epsilon(0.02));
  CHECK(d.step_ms(6, 0) == doctest::Approx(13.0).epsilon(0.02));
  CHECK(d.step_ms(4, 0) == doctest::Approx(12.0).epsilon(0.02));
  // One real prefill-sized step does not move the 1-row prediction (only the line's own fit).
  CostModel e = linear_cost(10.0, 0.5);
  e.observe_step(30, 0, 3.0);
  CHECK(e.step_ms(1, 0) == doctest::Approx(10.5).epsilon(0.02));
  // A long-context band that has only seen 1-row steps takes band 0's shape, scaled.
  for (int i = 0; i < 3; ++i) c.observe_step(1, 5000, 30.0);
  CHECK(c.step_ms(1, 5000) == doctest::Approx(30.0).epsilon(0.05));
  CHECK(c.step_ms(8, 5000) > c.step_ms(8, 0));
  // Draft rounds: while all asked the same depth, a fixed cost; once depths vary, fixed + per level.
  CHECK(c.draft_ms(3) == 0.0);
  c.observe_draft(4, 2.0);
  c.observe_draft(4, 2.2);
  c.observe_draft(4, 2.0);
  CHECK(c.draft_ms(1) == doctest::Approx(2.0));
  for (std::int64_t l : {1, 2, 3, 5, 6}) c.observe_draft(l, 0.2 + 0.45 * static_cast<double>(l));
  CHECK(c.draft_ms(8) == doctest::Approx(0.2 + 0.45 * 8).epsilon(0.1));
  CHECK(c.draft_ms(1) < 1.0);
  // A round that first took in a prompt (a head's first round after prefill) is not what a round
  // costs: 32 of them, however slow, leave the estimate where real rounds put it.
  for (int i = 0; i < 32; ++i) c.observe_draft(2, 40.0, /*priming=*/true);
  CHECK(c.draft_ms(8) == doctest::Approx(0.2 + 0.45 * 8).epsilon(0.1));
  c.observe_draft(2, 1.1);  // a round after idle steps (a long catch-up) is an ordinary round
  CHECK(c.draft_rounds() == 3 + 5 + 1);
  CostModel empty;
  CHECK_FALSE(empty.known());
  CHECK(empty.step_ms(4, 0) == 0.0);
}

TEST_CASE("budget: a one-pass drafter's second level is not priced as a second pass") {
  // A block drafter at batch 1 on the AMD EPYC of 2026-12-08: a step of one row ~3.2 ms, a verified
  // row ~0.4 ms more, a round ~1 ms whatever its depth; its last 32 rounds all asked one level.
  // Levels reached with P 0.6, 0.35, 0.2.
  auto plan = [](bool one_pass) {
    CostModel c = linear_cost(2.8, 0.4);
    c.set_one_pass(one_pass);
    for (int i = 0; i < 32; ++i) c.observe_draft(1, 1.0);
    DepthAsk a;
    a.max_depth = 3;
    a.level_probs = {0.6, 0.35, 0.2};
    return std::make_pair(c.draft_ms(3), plan_depths({a}, 1, 1.0, 100, c)[0]);
  };
  const auto [heads_ms, heads_depth] = plan(false);
  const auto [block_ms, block_depth] = plan(true);
  CHECK(heads_ms == doctest::Approx(3.0));  // a head: three levels are three head steps
  CHECK(heads_depth == 1);                  // and only the first pays
  CHECK(block_ms == doctest::Approx(1.0));  // one pass, whatever its depth
  CHECK(block_depth == 3);                  // the rows alone decide: every level pays
  // Once depths vary, the line through them decides for both.
  CostModel c = linear_cost(2.8, 0.4);
  c.set_one_pass(true);
  for (std::int64_t l : {1, 2, 3, 1, 2, 3}) c.observe_draft(l, 0.9 + 0.05 * static_cast<double>(l));
  CHECK(c.draft_ms(3) == doctest::Approx(1.05).epsilon(0.01));
}

TEST_CASE("budget: one slow round at a depth seldom asked does not price the depth asked every round") {
  // DFLASH at batch 1 (2026-12-08): probes of one level at ~0.6 ms, and one round of 3 levels that took
  // 15 ms. Every slope of the line ran through that round: one level priced at ~7 ms, two steps' time,
  // so nothing was drafted but the rare probe, and the slow round never left the window.
  for (const bool one_pass : {false, true}) {
    CAPTURE(one_pass);
    CostModel c = linear_cost(2.8, 0.4);
    c.set_one_pass(one_pass);
    c.observe_draft(1, 0.55);
    c.observe_draft(1, 0.73);
    c.observe_draft(3, 15.1);
    CHECK(c.draft_ms(1) > 5.0);  // two rounds of one level say little yet: the line decides
    for (int i = 0; i < 4; ++i) c.observe_draft(1, 0.6);
    CHECK(c.draft_ms(1) == doctest::Approx(0.6));  // asked in six rounds: their median
    CHECK(c.draft_ms(3) > 5.0);                    // the slow depth stays dear while it is in the window
    DepthAsk a;
    a.max_depth = 3;
    a.level_probs = {0.6, 0.35, 0.2};
    CHECK(plan_depths({a}, 1, 1.0, 100, c)[0] == 1);  // so drafting goes on at one level
    // 32 rounds later the slow one has left the window.
    for (int i = 0; i < 32; ++i) c.observe_draft(1, 0.6);
    CHECK(c.draft_ms(3) == doctest::Approx(one_pass ? 0.6 : 1.8));
  }
}

TEST_CASE("budget: drafting deepens when acceptance is high, stops when it collapses, comes back by probes") {
  const CostModel cost = [] {
    CostModel c = linear_cost(10.0, 2.0);  // a row costs ~17 % of a step, a draft level ~4 %
    c.observe_draft(1, 0.5);
    c.observe_draft(2, 1.0);
    return c;
  }();
  AcceptanceModel m;
  RequestAcceptance r;
  // Everything accepted: the planned depth grows to the whole shape.
  std::int32_t depth = 0;
  for (int i = 0; i < 30; ++i) depth = one_step(m, r, cost, [](std::int32_t d) { return d; });
  CHECK(depth == 6);
  // Nothing accepted any more: within a few steps it drafts only on probes.
  int skipped = 0;
  std::string seen;
  for (int i = 0; i < 40; ++i) {
    const std::int32_t d = one_step(m, r, cost, [](std::int32_t) { return 0; });
    seen += std::to_string(d);
    if (i >= 20) skipped += d == 0;
  }
  CAPTURE(seen);
  CHECK(skipped >= 15);
  // Still collapsed: it drafts only when a probe is due, one level, and ever less often (the interval
  // doubles while probes find nothing: 4, 8, 16 ...).
  std::vector<int> probes;
  for (int i = 0; i < 64; ++i) {
    const std::int32_t d = one_step(m, r, cost, [](std::int32_t) { return 0; });
    CHECK(d <= 1);
    if (d > 0) probes.push_back(i);
  }
  CAPTURE(probes.size());
  REQUIRE(probes.size() >= 2);
  CHECK(probes.size() <= 5);
  CHECK(probes[1] - probes[0] < probes.back() - probes[probes.size() - 2] + 1);
  CHECK(r.probe_interval > 4);
  // Acceptance recovers: the probes see it, and drafting returns and deepens again.
  std::int32_t last = 0;
  for (int i = 0; i < 80; ++i) last = one_step(m, r, cost, [](std::int32_t d) { return d; });
  CHECK(last >= 4);
}

TEST_CASE(
    "acceptance model: drafts come in runs, a request whose last draft was taken whole is not judged by the average") {
  const CostModel cost = [] {
    CostModel c = linear_cost(10.0, 2.0);
    c.observe_draft(1, 0.5);
    c.observe_draft(2, 1.0);
    return c;
  }();
  AcceptanceModel m;
  // The engine's record: 40 requests whose drafts mostly miss (prose), 4 that copy a passage: once
  // a draft of theirs is taken whole, the next one is too.
  for (int q = 0; q < 40; ++q) {
    RequestAcceptance r;
    for (int i = 0; i < 10; ++i) m.observe_levels(3, i == 3 ? 1 : 0, r);
  }
  for (int q = 0; q < 4; ++q) {
    RequestAcceptance r;
    m.observe_levels(3, 0, r);
    for (int i = 0; i < 10; ++i) m.observe_levels(3, 3, r);
  }
  const RequestAcceptance fresh;
  CHECK(m.level_prob(1, fresh) < 0.4);  // the average over everything seen
  RequestAcceptance copying;            // a new request whose first draft (a probe) was taken whole
  m.observe_levels(1, 1, copying);
  CHECK(copying.last_whole);
  CAPTURE(m.level_prob(1, copying));
  CAPTURE(m.level_prob(3, copying));
  CHECK(m.level_prob(1, copying) > 0.75);
  CHECK(m.level_prob(3, copying) > 0.5);
  const auto depths = plan_depths({ask_for(m, copying, 6), ask_for(m, fresh, 6)}, 2, 2.0, 100, cost);
  CHECK(depths[0] >= 3);  // it keeps drafting, deep
  CHECK(depths[1] == 0);  // a request with no record does not (no probe due yet)
  // A cut draft ends the run: the estimate falls back to what cut requests show.
  m.observe_levels(3, 1, copying);
  CHECK(!copying.last_whole);
  CHECK(m.level_prob(1, copying) < 0.6);
}

TEST_CASE("budget: a drafter that proposes nothing is asked ever less, and every step again once it proposes") {
  // Prompt lookup at batch 1: a round trip ~2 % of a step whatever it finds, a row ~20 %.
  const CostModel cost = [] {
    CostModel c = linear_cost(3.2, 0.8);
    for (int i = 0; i < 8; ++i) c.observe_draft(2, 0.08);
    return c;
  }();
  // One step: the ask with P(proposes) (or as if the drafter always proposed), then, when asked, a
  // round that proposes `copying` and, if so, a draft taken whole.
  auto step = [&](AcceptanceModel& m, RequestAcceptance& r, bool copying, bool use_q) {
    DepthAsk a = ask_for(m, r, 4);
    const double q = use_q ? m.propose_prob(r) : 1.0;
    for (double& p : a.level_probs) p *= q;
    a.rows_per_level = q;
    const auto depth = plan_depths({a}, 1, 1.0, 100, cost)[0];
    note_plan(r, a.probe, depth);
    if (depth == 0) return 0;
    m.observe_round(copying, r);
    if (copying) m.observe_levels(depth, depth, r);
    return static_cast<int>(depth);
  };
  for (const bool use_q : {false, true}) {
    CAPTURE(use_q);
    AcceptanceModel m;
    RequestAcceptance r;
    CHECK(m.propose_prob(r) == doctest::Approx(1.0));  // a drafter proposes until shown otherwise
    // 64 steps of prose: nothing to copy.
    int asked = 0;
    for (int i = 0; i < 64; ++i) asked += step(m, r, false, use_q) > 0;
    CAPTURE(asked);
    if (!use_q) {
      CHECK(asked == 64);  // what the budget did before: nothing learned, asked every step
      continue;
    }
    CHECK(asked <= 16);  // a few at first, then the probes at doubling intervals
    CHECK(m.propose_prob(r) < 0.1);
    // A passage to copy: the next probe finds it, and the request is asked every step again.
    int first = -1, late = 0;
    for (int i = 0; i < 96; ++i) {
      const bool drafted = step(m, r, true, use_q) > 0;
      if (drafted && first < 0) first = i;
      if (i >= 80) late += drafted;
    }
    CHECK(first >= 0);
    CHECK(first <= 64);
    CHECK(late == 16);
    CHECK(m.propose_prob(r) > 0.8);
    // Another request starts from the engine's record of first rounds, not from this one's silence.
    RequestAcceptance fresh;
    CHECK(m.propose_prob(fresh) > 0.1);
  }
}

TEST_CASE("budget: expected rows below one are priced as part of a row, not a whole one") {
  const CostModel cost = linear_cost(10.0, 2.0);  // a row: a sixth of a step; drafting free (no round yet)
  DepthAsk a;
  a.max_depth = 1;
  a.level_probs = {0.25};  // above the row's sixth: pays
  CHECK(plan_depths({a}, 1, 1.0, 100, cost)[0] == 1);
  // Proposed one time in three: a third of the tokens for a third of the row still pays (priced as
  // a whole row it did not).
  a.level_probs = {0.25 / 3};
  a.rows_per_level = 1.0 / 3;
  CHECK(plan_depths({a}, 1, 1.0, 100, cost)[0] == 1);
  a.level_probs = {0.15 / 3};
  CHECK(plan_depths({a}, 1, 1.0, 100, cost)[0] == 0);
}

TEST_CASE("budget: under load the same acceptance stops speculation for the batch") {
  CostModel cost;
  // Memory-bound up to 16 rows, then every row costs nearly a whole 1-row step (compute-bound).
  for (auto [r, t] : std::vector<std::pair<std::int64_t, double>>{{1, 10}, {2, 10.2}, {4, 10.6}, {8, 11.4}})
    cost.seed(r, t);
  cost.observe_draft(1, 0.2);
  cost.observe_draft(2, 0.4);
  AcceptanceModel m;
  RequestAcceptance r;
  for (int i = 0; i < 50; ++i) m.observe_levels(3, i % 2, r);  // depth 1 accepted half the time
  const DepthAsk one = ask_for(m, r, 3);
  CHECK(plan_depths({one}, 1, 1.0, 100, cost)[0] >= 1);  // alone: cheap rows, it pays
  CostModel loaded;
  for (auto [rows, t] : std::vector<std::pair<std::int64_t, double>>{{1, 10}, {8, 12}, {16, 14}, {32, 28}, {64, 56}})
    loaded.seed(rows, t);
  loaded.observe_draft(1, 0.2);
  loaded.observe_draft(2, 0.4);
  std::vector<DepthAsk> sixteen(16, one);
  const auto depths = plan_depths(sixteen, 16, 16.0, 100, loaded);
  for (auto d : depths) CHECK(d == 0);
  // Probing follows: alone a probe can pay, among 16 even drafts accepted 0.8 per level would not.
  CHECK(probe_pays(3, 1, 1.0, 100, cost));
  CHECK_FALSE(probe_pays(3, 16, 16.0, 100, loaded));
  CHECK(probe_pays(3, 1, 1.0, 100, loaded));  // the batch shrank: probes come back
  // Nothing measured yet: the full shape (the fixed behaviour).
  CHECK(plan_depths({one}, 1, 1.0, 100, CostModel{})[0] == 3);
}

TEST_CASE("budget: an extra row is never free because two neighbouring medians came out equal") {
  // A compute-bound machine at 8–32 rows: 1.1 ms a row. Real steps of 16 and 17 rows whose medians
  // came out equal (noise as large as one row's cost): the difference of the two says a 17th row is
  // free; the local slope through the neighbouring row counts says what it costs.
  CostModel c;
  for (auto [r, t] : std::vector<std::pair<std::int64_t, double>>{{1, 5}, {2, 5.7}, {4, 8.9}, {8, 14.5}, {32, 40}})
    c.seed(r, t);
  for (std::int64_t r = 12; r <= 20; ++r)
    for (int i = 0; i < 5; ++i) c.observe_step(r, 100, 13.0 + 1.1 * static_cast<double>(r));
  for (int i = 0; i < 9; ++i) {
    c.observe_step(16, 100, 30.0);
    c.observe_step(17, 100, 30.0);
  }
  CHECK(c.step_ms(17, 100) - c.step_ms(16, 100) == doctest::Approx(0.0));
  CHECK(c.extra_ms(16, 17, 100) == doctest::Approx(1.1).epsilon(0.05));
  CHECK(c.extra_ms(16, 20, 100) >= 4.0);
  CHECK(c.extra_ms(16, 16, 100) == 0.0);
  // 16 requests drafting one level at 0.65: each extra row (1.1 ms) brings 0.65 tokens where a step
  // brings a token per 1.9 ms and row: no drafts. (With the difference alone every request drafted.)
  c.observe_draft(16, 1.0);
  DepthAsk a;
  a.max_depth = 1;
  a.level_probs = {0.65};
  for (auto d : plan_depths(std::vector<DepthAsk>(16, a), 16, 16.0, 100, c)) CHECK(d == 0);
}

TEST_CASE("budget: a prompt chunk in the step does not make drafting look cheap") {
  // 16 requests decoding and a 200-row prompt chunk in the same step, compute-bound at 1 ms a row.
  CostModel c;
  for (std::int64_t r : {1, 2, 4, 8, 16, 32, 64, 128, 256, 512}) c.seed(r, 6.0 + 1.0 * static_cast<double>(r));
  c.observe_draft(16, 1.0);
  DepthAsk a;
  a.max_depth = 1;
  a.level_probs = {0.75};
  const std::vector<DepthAsk> asks(16, a);
  // Judged against the whole step (222 ms for 17 tokens), 16 extra rows (16 ms) for 12 tokens pay.
  const auto whole = plan_depths(asks, 216, 17.0, 100, c);
  CHECK(std::count(whole.begin(), whole.end(), 1) == 16);
  // Judged against the decoding rows alone (22 ms for 16 tokens), they do not: a decode step without
  // drafts delivers more per ms than the extra rows would.
  for (auto d : plan_depths(asks, 216, 16.0, 100, c, 1.0, 16)) CHECK(d == 0);
  CHECK_FALSE(probe_pays(1, 216, 16.0, 100, c, 16));
  // A lone request with a prompt chunk beside it still drafts where alone it would.
  DepthAsk lone = a;
  lone.level_probs = {0.75};
  CHECK(plan_depths({lone}, 201, 1.0, 100, c, 1.0, 1)[0] == 1);
  CHECK(plan_depths({lone}, 1, 1.0, 100, c)[0] == 1);
  // The node selection after drafting weighs the same way (the draft round's time is spent by then,
  // so a node pays where its tokens per ms beat the step's: 0.6 per 1 ms row against 16 per 23 ms).
  std::vector<Candidate> nodes;
  for (std::size_t i = 0; i < 16; ++i) nodes.push_back({i, 0, -1, 0.6});
  const auto keep_whole = select_nodes(nodes, 216, 17.0, 100, c, 1.0);
  CHECK(std::count(keep_whole.begin(), keep_whole.end(), true) == 16);
  const auto keep = select_nodes(nodes, 216, 16.0, 100, c, 1.0, 1.0, 16);
  CHECK(std::count(keep.begin(), keep.end(), true) == 0);
}

TEST_CASE("budget: where probing cannot pay, one probe every 32 steps with probes due, not all of them") {
  ProbeGate g;
  CHECK(g.quota(true, true) > 16);  // probing pays: every due request may probe
  for (int i = 1; i < ProbeGate::kEvery; ++i) CHECK(g.quota(false, true) == 0);
  CHECK(g.quota(false, true) == 1);  // the 32nd: one request, however many are due
  CHECK(g.quota(false, true) == 0);
  for (int i = 0; i < 100; ++i) CHECK(g.quota(false, false) == 0);  // steps with nothing due do not count
  for (int i = 2; i < ProbeGate::kEvery; ++i) CHECK(g.quota(false, true) == 0);
  CHECK(g.quota(false, true) == 1);
  for (int i = 1; i < 10; ++i) CHECK(g.quota(false, true) == 0);
  CHECK(g.quota(true, false) > 16);  // the batch shrank: the count starts again
  for (int i = 1; i < ProbeGate::kEvery; ++i) CHECK(g.quota(false, true) == 0);
  CHECK(g.quota(false, true) == 1);
}

TEST_CASE("cost model: a draft round at one depth is never priced below it, and grows past it") {
  CostModel c;
  CHECK(c.draft_ms(3) == 0.0);  // before any round
  // Self-speculation probes: every round asked one level, 4.8 ms each (about a target step here).
  for (int i = 0; i < 10; ++i) c.observe_draft(1, 4.8);
  CHECK(c.draft_ms(0) == 0.0);
  CHECK(c.draft_ms(1) == doctest::Approx(4.8));
  CHECK(c.draft_ms(3) == doctest::Approx(14.4));  // priced flat, three levels cost what one did
  // At batch 1 (a 5 ms step, 1.5 ms a row) three levels even as good as 0.8 each do not pay for 14 ms:
  // probing cannot pay, so the gate holds probes back and spaces them to ~1 % of the steps' time.
  const CostModel step = linear_cost(3.5, 1.5);
  CostModel cs = step;
  for (int i = 0; i < 10; ++i) cs.observe_draft(1, 4.8);
  CHECK_FALSE(probe_pays(3, 1, 1.0, 100, cs));
  const auto every = probe_every(cs, 1, 100);
  CHECK(every >= 100);  // (4.8 + 1.5) / (1 % of 5) = 126 steps
  CHECK(every <= ProbeGate::kMaxEvery);
  ProbeGate g;
  std::int64_t let = 0;
  for (int i = 0; i < 1000; ++i) let += g.quota(false, true, every);
  CHECK(let == 1000 / every);
  // A prompt-lookup round asked 48 levels (16 requests × 3) for 0.5 ms: cheaper rounds cost as much,
  // larger ones more.
  CostModel n = step;
  for (int i = 0; i < 10; ++i) n.observe_draft(48, 0.5);
  CHECK(n.draft_ms(1) == doctest::Approx(0.5));
  CHECK(n.draft_ms(96) == doctest::Approx(1.0));
  // Its probe costs the round and the extra row (1.5 ms): (0.5 + 1.5) / (1 % of 5 ms) = 40 steps.
  CHECK(probe_every(n, 1, 100) == 40);
  CostModel busy = linear_cost(20.0, 0.5);  // a step the row and round are small against: one in 32
  for (int i = 0; i < 10; ++i) busy.observe_draft(48, 0.5);
  CHECK(probe_every(busy, 16, 100) == ProbeGate::kEvery);
  // Once depths vary the line takes over: 1 ms a round + 2 ms a level.
  CostModel h;
  for (int i = 0; i < 12; ++i) h.observe_draft(1 + i % 3, 1.0 + 2.0 * (1 + i % 3));
  CHECK(h.draft_ms(1) == doctest::Approx(3.0));
  CHECK(h.draft_ms(5) == doctest::Approx(11.0));
}

TEST_CASE("feedback: drafted steps measured slower than plain ones scale the costs up, faster ones relax them") {
  Feedback f;
  CHECK(f.penalty(4) == 1.0);
  // 4 requests: plain steps give 0.5 tokens/ms, drafted ones 0.4: speculation loses here.
  for (int i = 0; i < 3; ++i) f.observe(4, 4, 8.0, false);
  for (int i = 0; i < 7; ++i) f.observe(4, 4.4, 11.0, true);
  CHECK(f.penalty(4) == 1.0);  // 7 drafted steps are not yet a measurement
  for (int i = 0; i < 17; ++i) f.observe(4, 4.4, 11.0, true);
  CHECK(f.measured_gain(4) == doctest::Approx(0.8).epsilon(0.01));
  CHECK(f.penalty(4) > 2.0);
  CHECK(f.penalty(1) == 1.0);  // another batch size is untouched
  // Without a plain step for kExplore drafted steps, one is asked for; it resets the count.
  for (std::int64_t i = 0; i < Feedback::kExplore; ++i) f.observe(4, 4.4, 11.0, true);
  CHECK(f.want_plain(4));
  f.observe(4, 4, 8.0, false);
  CHECK_FALSE(f.want_plain(4));
  // Drafted steps become faster (1 token/ms against 0.5): the scale comes back to 1.
  for (int i = 0; i < 200; ++i) f.observe(4, 8, 8.0, true);
  CHECK(f.measured_gain(4) > 1.5);
  CHECK(f.penalty(4) == doctest::Approx(1.0));
  // The scale makes extra costs dearer in both decisions.
  const CostModel cost = linear_cost(10.0, 1.0);
  const std::vector<Candidate> one{{0, 0, -1, 0.2}};
  CHECK(select_nodes(one, 1, 1.0, 100, cost, 0.0, 1.0) == std::vector<bool>{true});
  CHECK(select_nodes(one, 1, 1.0, 100, cost, 0.0, 4.0) == std::vector<bool>{false});
}

TEST_CASE("feedback: sparse drafted steps that lose keep the scale up, and an old measurement lets it relax") {
  // One request: plain steps 1 token in 3.3 ms, drafted ones 2 tokens in 7.1 ms (0.93×), one drafted
  // step in 10. Relaxed on every plain step, the scale settled near 1.05^(1/10)·0.995 ≈ 1 and the
  // budget went on drafting at a loss.
  Feedback f;
  for (int cycle = 0; cycle < 60; ++cycle) {
    for (int i = 0; i < 9; ++i) f.observe(1, 1, 3.3, false);
    f.observe(1, 2, 7.1, true);
  }
  CHECK(f.measured_gain(1) < 1.0);
  CHECK(f.penalty(1) > 3.0);
  // No drafted step for kStale plain steps: the measurement is old and the scale relaxes again.
  const double held = f.penalty(1);
  for (std::int64_t i = 0; i < Feedback::kStale - 1; ++i) f.observe(1, 1, 3.3, false);
  CHECK(f.penalty(1) == held);
  for (int i = 0; i < 400; ++i) f.observe(1, 1, 3.3, false);
  CHECK(f.penalty(1) < 1.1);
  // The next drafted steps are a fresh measurement: the old loss does not count against them.
  for (int i = 0; i < 7; ++i) f.observe(1, 2.6, 7.1, true);
  CHECK(f.measured_gain(1) == 1.0);  // 7 fresh drafted steps are not yet a measurement
  for (int i = 0; i < 3; ++i) f.observe(1, 2.6, 7.1, true);
  CHECK(f.measured_gain(1) > 1.0);
}

TEST_CASE("feedback: one slow drafted step among fast ones does not hold the scale up") {
  // One request: plain steps 1 token in 4 ms (0.25/ms); drafting pays, 1.6 tokens in 4.5 ms (0.36/ms),
  // but the first drafted step took 40 ms (a drafter's cold first round).
  Feedback f;
  for (int i = 0; i < 10; ++i) f.observe(1, 1, 4.0, false);
  f.observe(1, 3, 40.0, true);
  CHECK(f.penalty(1) == 1.0);  // a single step moves nothing
  for (int i = 0; i < 30; ++i) f.observe(1, 1.6, 4.5, true);
  CHECK(f.measured_gain(1) > 1.3);
  CHECK(f.penalty(1) < 1.25);  // a mean of per-step rates started at 0.075/ms read a loss here and reached 1.5
  // The same steps in the other order: the slow one late changes the ratio of sums a little.
  Feedback g;
  for (int i = 0; i < 10; ++i) g.observe(1, 1, 4.0, false);
  for (int i = 0; i < 30; ++i) g.observe(1, 1.6, 4.5, true);
  CHECK(g.penalty(1) == 1.0);
  g.observe(1, 3, 40.0, true);
  CHECK(g.penalty(1) <= 1.05);
}

TEST_CASE("budget: node selection keeps the likely nodes, closed under ancestors, and counts the spent time") {
  const CostModel cost = linear_cost(10.0, 1.0);
  // Request 0: a chain 0.9 → 0.8 → 0.05; request 1: two children 0.6 and 0.02.
  const std::vector<Candidate> nodes{
      {0, 0, -1, 0.9}, {0, 1, 0, 0.8}, {0, 2, 1, 0.05}, {1, 0, -1, 0.6}, {1, 1, -1, 0.02}};
  const auto keep = select_nodes(nodes, 2, 2.0, 100, cost);
  CHECK(keep == std::vector<bool>{true, true, false, true, false});
  // Spent draft time makes a marginal row relatively cheaper: a 0.05 node pays only then.
  const std::vector<Candidate> marginal{{0, 0, -1, 0.05}};
  CHECK(select_nodes(marginal, 1, 1.0, 100, cost, 0.0) == std::vector<bool>{false});
  CHECK(select_nodes(marginal, 1, 1.0, 100, cost, 20.0) == std::vector<bool>{true});
  // Whatever the probabilities, a kept node's parent is kept.
  std::vector<Candidate> chain;
  for (int i = 0; i < 10; ++i) chain.push_back({0, i, i - 1, std::pow(0.7, i + 1)});
  const auto k = select_nodes(chain, 1, 1.0, 100, cost);
  for (std::size_t i = 1; i < k.size(); ++i)
    if (k[i]) CHECK(k[i - 1]);
  // Unknown costs: everything is verified.
  CHECK(select_nodes(nodes, 2, 2.0, 100, CostModel{}) == std::vector<bool>(5, true));
}

TEST_CASE("acceptance model: calibrates a drafter's scores and reports its calibration error") {
  AcceptanceModel m;
  RequestAcceptance r;
  // A drafter that says 0.9 but is right 30 % of the time: the model learns 0.3.
  for (int i = 0; i < 400; ++i) m.observe_node(0.9f, 1, m.node_prob(0.9f, 1, r), i % 10 < 3, r);
  RequestAcceptance fresh;
  CHECK(m.node_prob(0.9f, 1, fresh) == doctest::Approx(0.3).epsilon(0.15));
  CHECK(m.calibration_count() == doctest::Approx(400));
  // Predictions of 0.9 at first and 0.3 later, observed 0.3: the error is between the two.
  CHECK(m.calibration_error() > 0.0);
  CHECK(m.calibration_error() < 0.6);
  // Per request: one that is accepted more than predicted gets a higher factor.
  RequestAcceptance good;
  for (int i = 0; i < 20; ++i) m.observe_node(0.5f, 2, 0.2, true, good);
  CHECK(good.factor() > 1.5);
  CHECK(m.node_prob(0.5f, 2, good) > m.node_prob(0.5f, 2, fresh));
  // Depth prior without observations: each level no likelier than the one above.
  for (int d = 2; d < 8; ++d) CHECK(m.level_prob(d, fresh) <= m.level_prob(d - 1, fresh));
}

namespace {

// Models that learned something: a drafter right 30 % of the time at score 0.9 and depth 1, levels
// accepted 1 in 4, draft rounds of 2 ms per level, and drafting that measured slower at batch 1.
struct Learned {
  AcceptanceModel accept;
  CostModel cost;
  Feedback feedback;
  Learned() {
    RequestAcceptance r;
    for (int i = 0; i < 1000; ++i) accept.observe_node(0.9f, 1, 0.9, i % 10 < 3, r);
    for (int i = 0; i < 200; ++i) accept.observe_levels(2, i % 4 == 0 ? 1 : 0, r);
    for (int i = 0; i < 100; ++i) accept.observe_round(i % 5 == 0, r);  // a drafter that mostly finds nothing
    for (int levels : {1, 2, 3}) cost.observe_draft(levels, 2.0 * levels);
    for (int i = 0; i < 10; ++i) feedback.observe(1, 1, 4.0, false);
    for (int i = 0; i < 20; ++i) feedback.observe(1, 1.1, 6.0, true);
  }
};

}  // namespace

TEST_CASE("budget memory: what the models learned comes back in a new engine's models, and only under its key") {
  const Learned l;
  REQUIRE(l.feedback.penalty(1) > 1.0);
  const std::string text = MemoryCodec::save("cpu=X | draft=Y", l.accept, l.cost, l.feedback);
  CHECK(text.rfind(std::string(MemoryCodec::kHeader) + "\nkey cpu=X | draft=Y\n", 0) == 0);
  AcceptanceModel a;
  CostModel c;
  Feedback f;
  const RequestAcceptance fresh;
  const double prior = a.node_prob(0.9f, 1, fresh);
  // Another key: nothing changes.
  CHECK(MemoryCodec::restore(text, "cpu=X | draft=Z", a, c, f) == "key");
  CHECK(a.node_prob(0.9f, 1, fresh) == prior);
  CHECK(c.draft_ms(2) == 0.0);
  CHECK(MemoryCodec::restore(text, "cpu=X | draft=Y", a, c, f).empty());
  // The calibration table: 30 % learned, not the prior's 90 %; capped at kCap observations, so the
  // estimate is the same but new evidence moves it sooner.
  CHECK(a.node_prob(0.9f, 1, fresh) == doctest::Approx(l.accept.node_prob(0.9f, 1, fresh)).epsilon(0.02));
  CHECK(a.node_prob(0.9f, 1, fresh) < 0.35);
  for (int d = 1; d <= 3; ++d) CHECK(a.level_prob(d, fresh) == doctest::Approx(l.accept.level_prob(d, fresh)));
  RequestAcceptance dry;  // its drafter proposed nothing last time: this one rarely does then
  dry.empty_rounds = 1;
  CHECK(a.propose_prob(dry) == doctest::Approx(l.accept.propose_prob(dry)));
  CHECK(a.propose_prob(dry) < 0.1);
  CHECK(c.draft_ms(2) == doctest::Approx(l.cost.draft_ms(2)));
  CHECK(c.draft_ms(2) == doctest::Approx(4.0));
  CHECK(f.penalty(1) == doctest::Approx(l.feedback.penalty(1)));
  CHECK(f.measured_gain(1) == doctest::Approx(l.feedback.measured_gain(1)));
  // The calibration error is each run's own.
  CHECK(a.calibration_count() == 0.0);
  // Saved again, the text is the same but for the capped counts.
  const std::string again = MemoryCodec::save("cpu=X | draft=Y", a, c, f);
  CHECK(again.find("accept 0 1 120 400\n") != std::string::npos);
  CHECK(text.find("accept 0 1 300 1000\n") != std::string::npos);
  // The feedback's step counts only gate the comparison: capped when read.
  AcceptanceModel a2;
  CostModel c2;
  Feedback f2;
  CHECK(MemoryCodec::restore(std::string(MemoryCodec::kHeader) + "\nkey k\nfeedback 0 1 5 20 123456 10 30 99999\n", "k",
                             a2, c2, f2)
            .empty());
  CHECK(MemoryCodec::save("k", a2, c2, f2).find("feedback 0 1 5 20 1000 10 30 1000\n") != std::string::npos);
}

TEST_CASE("budget memory: a damaged text is refused with its line, and the models are left as they were") {
  const Learned l;
  const std::string good = MemoryCodec::save("k", l.accept, l.cost, l.feedback);
  const std::string head = std::string(MemoryCodec::kHeader) + "\nkey k\n";
  const std::vector<std::pair<std::string, std::string>> bad{
      {"", "line 1: the file is empty"},
      {"specactor-budget-memory 9\nkey k\n", "line 1: expected"},
      {std::string(MemoryCodec::kHeader) + "\naccept 0 1 1 2\n", "line 2: a record before the key"},
      {head + "accept 13 1 1 2\n", "line 3: expected a score bin"},
      {head + "accept 0 0 1 2\n", "line 3: expected a score bin 0-12 and a depth 1-32"},
      {head + "accept 0 1 3 2\n", "line 3: expected hits ≤ seen"},
      {head + "level 1 nan 2\n", "line 3: expected hits ≤ seen"},
      {head + "whole 1 1 2 7\n", "line 3: expected hits ≤ seen"},
      {head + "rounds 8 1 2\n", "line 3: expected a round bin 0-7"},
      {head + "rounds 1 3 2\n", "line 3: expected hits ≤ seen"},
      {head + "draft 0 1\n", "line 3: expected levels ≥ 1"},
      {head + "draft 1 -1\n", "line 3: expected levels ≥ 1"},
      {head + "feedback 6 1 0 0 0 0 0 0\n", "line 3: expected a batch bucket"},
      {head + "feedback 0 9 0 0 0 0 0 0\n", "line 3: expected a scale 1-4"},
      {head + "feedback 0 1 0 0 0 0 0\n", "line 3: expected a scale 1-4"},
      {head + "key k\n", "line 3: a second key"},
      {head + "level 1 1 2\nbogus 1\n", "line 4: unknown record"},
      {std::string(MemoryCodec::kHeader) + "\n", "no key line"},
  };
  for (const auto& [text_, want] : bad) {
    const std::string& text = text_;  // a plain reference: CAPTURE's lambda takes it (Clang 14)
    CAPTURE(text);
    Learned m;
    const std::string err = MemoryCodec::restore(text, "k", m.accept, m.cost, m.feedback);
    CHECK(err.rfind(want, 0) == 0);
    CHECK(MemoryCodec::save("k", m.accept, m.cost, m.feedback) == good);  // untouched
  }
}

TEST_CASE("budget memory: the file is written whole through a rename, read back, and a missing one is empty") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("specactor_budget_memory." + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::string path = memory_file((dir / "a" / "b").string(), "key one");
  CHECK(path == memory_file((dir / "a" / "b").string(), "key one"));
  CHECK(path != memory_file((dir / "a" / "b").string(), "key two"));
  std::string text = "left over";
  CHECK(read_memory_file(path, text).empty());
  CHECK(text.empty());
  CHECK(write_memory_file(path, "one\n").empty());  // creates the folders
  CHECK(write_memory_file(path, "two\n").empty());  // replaces
  CHECK(read_memory_file(path, text).empty());
  CHECK(text == "two\n");
  std::size_t files = 0;
  for (const auto& e : fs::directory_iterator(fs::path(path).parent_path())) files += e.is_regular_file() ? 1 : 0;
  CHECK(files == 1);  // no temporary left behind
  // The default folder follows XDG: an absolute $XDG_CACHE_HOME, else ~/.cache (a relative one is ignored).
  {
    const char* old_xdg = std::getenv("XDG_CACHE_HOME");
    const char* old_home = std::getenv("HOME");
    const std::string keep_xdg = old_xdg ? old_xdg : "", keep_home = old_home ? old_home : "";
    ::setenv("HOME", "/home/someone", 1);
    ::setenv("XDG_CACHE_HOME", "/var/cache/x", 1);
    CHECK(default_memory_folder() == "/var/cache/x/specactor/budget");
    ::setenv("XDG_CACHE_HOME", "relative/cache", 1);
    CHECK(default_memory_folder() == "/home/someone/.cache/specactor/budget");
    ::unsetenv("XDG_CACHE_HOME");
    CHECK(default_memory_folder() == "/home/someone/.cache/specactor/budget");
    ::unsetenv("HOME");
    CHECK(default_memory_folder().empty());
    if (old_xdg) ::setenv("XDG_CACHE_HOME", keep_xdg.c_str(), 1);
    if (old_home) ::setenv("HOME", keep_home.c_str(), 1);
  }
  // A folder where the file should be: one clear error, nothing written.
  fs::create_directories(dir / "blocked" / memory_file("", "k"));
  const std::string blocked = memory_file((dir / "blocked").string(), "k");
  CHECK(fs::is_directory(blocked));
  CHECK(write_memory_file(blocked, "x") == blocked + ": a directory is in the way, not a budget-memory file");
  CHECK(read_memory_file(blocked, text) == "not a regular file");
  // A huge file (3 GiB, sparse) is refused by its size before a byte is read; a FIFO without blocking.
  const std::string big = (dir / "big.txt").string();
  CHECK(write_memory_file(big, "x").empty());
  fs::resize_file(big, std::uintmax_t{3} << 30);
  text = "left over";
  CHECK(read_memory_file(big, text) == "3221225472 bytes, larger than 1 MiB: not a file specactor wrote");
  CHECK(text.empty());
  const std::string pipe = (dir / "pipe.txt").string();
  REQUIRE(::mkfifo(pipe.c_str(), 0600) == 0);
  CHECK(read_memory_file(pipe, text) == "not a regular file");
  fs::remove_all(dir);
}

TEST_CASE("suffix store: continuations across documents, own earlier text, bounded memory oldest-first") {
  SuffixStore s(40, 3);
  s.add_document({1, 2, 3, 4, 5, 6, 7, 8});
  const auto live = s.open();
  const std::vector<std::int32_t> ctx{9, 9, 2, 3, 4};
  s.extend(live, ctx.data(), ctx.size());
  auto m = s.lookup(ctx, 32, 3, 4, live);
  REQUIRE(m.size() == 1);
  CHECK(m[0].continuation == std::vector<std::int32_t>{5, 6, 7});
  CHECK(m[0].match_length == 3);
  // The request's own earlier text counts too, and its current end is never its own match.
  const std::vector<std::int32_t> more{7, 7, 7, 9, 9};
  s.extend(live, more.data(), more.size());
  std::vector<std::int32_t> own = ctx;
  own.insert(own.end(), more.begin(), more.end());  // ... 9 9 2 3 4 7 7 7 9 9
  const std::vector<std::int32_t> tail{9, 2, 3};
  s.extend(live, tail.data(), tail.size());
  own.insert(own.end(), tail.begin(), tail.end());
  m = s.lookup(own, 32, 2, 4, live);
  REQUIRE(m.size() == 1);         // "9 2 3" occurs only in its own text (the other document has "1 2 3")
  CHECK(m[0].match_length == 4);  // measured backwards: "9 9 2 3"
  CHECK(m[0].continuation == std::vector<std::int32_t>{4, 7});
  CHECK(m[0].doc == live);
  // Too short a match: nothing.
  CHECK(s.lookup({5, 99, 98}, 32, 3, 4).empty());
  // Past the capacity, closed documents go oldest first; an open one stays.
  for (int i = 0; i < 6; ++i) s.add_document({50 + i, 51 + i, 52 + i, 53 + i, 54 + i, 55 + i, 56 + i, 57 + i});
  CHECK(s.tokens() <= 40);
  CHECK(s.length(live) == own.size());
  CHECK(s.lookup({1, 2, 3}, 32, 3, 4).empty());         // the first document was evicted
  CHECK(s.lookup({59, 60, 61}, 32, 3, 4).size() == 1);  // in the last document, followed by 62
  SuffixStore none(0, 3);
  none.add_document({1, 2, 3, 4});
  CHECK(none.tokens() == 0);
}

TEST_CASE("suffix trees: matches merged into a trie, scores by share and length, never above a parent") {
  using M = SuffixStore::Match;
  const std::vector<M> ms{{{5, 6, 7}, 8, 1}, {{5, 6, 9}, 8, 2}, {{4}, 3, 3}};
  const auto t = specactor::drafters::tree_from_matches(ms, 10, 2);
  CHECK(t.tokens == std::vector<std::int32_t>{5, 6, 7, 9, 4});
  CHECK(t.parents == std::vector<std::int32_t>{-1, 0, 1, 1, -1});
  REQUIRE(t.scores.size() == 5);
  CHECK(t.scores[0] > t.scores[2]);  // two matches pass through 5, one through 7
  CHECK(t.scores[0] > t.scores[4]);  // and 4's match is shorter
  for (std::size_t i = 0; i < t.tokens.size(); ++i)
    if (t.parents[i] >= 0) CHECK(t.scores[i] <= t.scores[static_cast<std::size_t>(t.parents[i])]);
  CHECK(specactor::drafters::tree_from_matches(ms, 2, 2).tokens.size() == 2);   // node budget
  CHECK(specactor::drafters::tree_from_matches(ms, 10, 1).tokens.size() == 3);  // one child per node
  // One match of length 4 continued by 8 tokens: a path probability, (4/6)^d at depth d.
  const auto chain = specactor::drafters::tree_from_matches({{{1, 2, 3, 4, 5, 6, 7, 8}, 4, 1}}, 16, 2);
  REQUIRE(chain.scores.size() == 8);
  for (std::size_t d = 0; d < 8; ++d) CHECK(chain.scores[d] == doctest::Approx(std::pow(4.0 / 6.0, d + 1.0)));
  // A long match keeps a deep node likely: 32/34 per level, 0.62 at depth 8.
  const auto sure = specactor::drafters::tree_from_matches({{{1, 2, 3, 4, 5, 6, 7, 8}, 32, 1}}, 16, 2);
  CHECK(sure.scores.back() == doctest::Approx(std::pow(32.0 / 34.0, 8.0)));
}
