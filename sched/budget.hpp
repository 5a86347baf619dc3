// sched/budget.hpp — the arithmetic that decides how much to speculate (no CAF, no clocks: every
// time is passed in, so tests drive it with synthetic costs and acceptance sequences).
//
//   CostModel        what a target step of R rows costs at a given context, and what a draft round
//                    costs per level; seeded by a start-up probe, refined from every real step by
//                    ring medians (robust to a noisy machine): a row count real steps measured often
//                    is predicted by its own median, the rest by a robust line through all of them.
//   AcceptanceModel  the probability that a proposed node is accepted (it and every ancestor): a
//                    calibration table over (drafter score, depth) shared by all requests, times a
//                    per-request factor (observed / predicted acceptance, decayed).
//   plan_depths      before drafting: how deep each request drafts (0 = not at all), chosen to
//                    maximise expected tokens per second of the whole step.
//   select_nodes     after drafting: which proposed nodes the target verifies, the same objective
//                    with the draft's cost already spent.
//
// The budget only changes how much is verified, never what is accepted: a selection is closed
// under ancestors, so verification stays exactly as lossless as without it.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <vector>

namespace specactor::sched {

// A small ring of recent measurements whose median is the estimate. Each carries a stamp (a step
// count): size and median count those stamped `since` or later.
class RingMedian {
 public:
  static constexpr std::int64_t kAll = std::numeric_limits<std::int64_t>::min();
  void add(double v, std::int64_t stamp = 0);
  bool empty(std::int64_t since = kAll) const { return size(since) == 0; }
  std::size_t size(std::int64_t since = kAll) const;
  double median(std::int64_t since = kAll) const;  // 0 when none

 private:
  static constexpr std::size_t kCap = 9;
  std::array<double, kCap> v_{};        // oldest first
  std::array<std::int64_t, kCap> t_{};  // their stamps
  std::size_t n_ = 0;
};

class CostModel {
 public:
  // Context bands by the mean context a row attends to: [0, 1k), [1k, 4k), [4k, 16k), [16k, ∞).
  static constexpr int kBands = 4;
  static int band_of(double mean_context);
  // Row buckets: 1..32 exactly, then every 8 to 64, every 32 to 256, every 128 beyond.
  static int bucket_of(std::int64_t rows);
  static std::int64_t bucket_rows(int bucket);

  // A start-up probe: ms of one step of `rows` rows at a short context (band 0). Used until real
  // steps of that size are seen.
  void seed(std::int64_t rows, double ms);
  // A real target step: its rows, the mean context per row, its wall time. Measurements older than
  // kStaleSteps steps no longer count (a cell without newer ones falls back to the start-up probe or
  // the line): a row count the engine stopped running (drafting off, only the probes' one extra row
  // every 32-256 steps) kept the medians of another hour (another load, another kernel path) for
  // thousands of steps, and the budget, trusting them, drafted nothing that would measure them again.
  static constexpr std::int64_t kStaleSteps = 128;
  void observe_step(std::int64_t rows, double mean_context, double ms);
  // The predicted time of a step (monotone in rows). 0 when nothing is known yet.
  double step_ms(std::int64_t rows, double mean_context) const;
  // What `rows` rows cost more than `base_rows` (rows ≥ base_rows): the difference of the two
  // predictions, but never less than the local slope (a robust line through the row counts from
  // base_rows / 2 to 2 · base_rows + 4) times the extra rows. Neighbouring row counts are measured by
  // separate medians whose noise is as large as one row's cost, so their difference alone often said an
  // extra row was free (16 in flight: 16 and 17 rows measured 27.18 ms each) and drafting looked free.
  double extra_ms(std::int64_t base_rows, std::int64_t rows, double mean_context) const;
  // c(R) = step_ms(R) / step_ms(1) at a context (1 when unknown).
  double relative(std::int64_t rows, double mean_context) const;
  bool known() const;

  // A draft round: `levels` = Σ depth asked over its requests, its wall time. `priming`: the round
  // took in a request's prompt for the first time (a head's first round after prefill catches up on
  // the whole prompt): a one-time prefill of the drafter's own state, not what a round costs, left
  // out; counting it made one slow first round look like the price of every round, and the budget
  // then drafted nothing more to learn otherwise. The catch-up after idle steps is counted: it recurs
  // whenever drafting is sparse, and leaving such rounds out hides exactly the rounds that make sparse
  // drafting a loss (docs/performance.md, 2026-12-05 house entry).
  void observe_draft(std::int64_t levels, double ms, bool priming = false);
  // Predicted wall time of a draft round of `levels` levels (0 for none, and before any round): a
  // robust line (fixed cost per round + cost per level) through the last 32 rounds. While they all
  // asked the same L levels, their median m for up to L levels and m · levels / L beyond: never less
  // than was measured, and growing with depth past it (a prompt-lookup round costs the same at any
  // depth, a head's or a self-speculation draft's grows with it; priced flat, a one-level probe's
  // cost made three levels look as cheap as one and probes "paid" at batch 1 where a level costs
  // about a target step). The line takes over once depths vary.
  // A one-pass drafter (set_one_pass: DFLASH, DSPARK) drafts every level of a round in the same pass,
  // whose weights are read once however many rows it runs: while every round asked the same levels,
  // m for any depth. Priced as more passes, a block drafter that had asked one level for 32 rounds (its
  // probes, or a cautious start) saw a second level at twice a round and never asked for one again:
  // DSPARK drafted one level for a whole run (2026-12-08) where another run of it drafted three.
  // A level count that three or more rounds in the window asked is predicted by their median, as a
  // step's row count is: with depth-1 probes and one slow round of 3 levels (15 ms against ~0.6) the
  // line's every slope ran through that one round, one level cost 7 ms, and DFLASH drafted in 166 of
  // 10,929 steps of a run (2026-12-08) while the slow round stayed in the window.
  double draft_ms(std::int64_t levels) const;
  void set_one_pass(bool one_pass) {
    one_pass_ = one_pass;
    draft_fresh_ = false;
  }
  std::int64_t draft_rounds() const { return draft_rounds_; }

 private:
  friend struct MemoryCodec;  // sched/memory.cpp
  static constexpr int kBuckets = 64;
  struct Cell {
    RingMedian real;  // stamped with steps_
    double seeded = -1;
    double estimate(std::int64_t since) const { return real.empty(since) ? seeded : real.median(since); }
  };
  double band_estimate(int band, int bucket) const;  // -1 when no band knows enough
  struct Line {
    double a = 0, b = 0;  // ms = a + b · rows
    bool known = false;
  };
  const Line& line(int band) const;
  std::array<std::array<Cell, kBuckets>, kBands> cells_{};
  mutable std::array<Line, kBands> lines_;
  mutable std::array<std::array<double, kBuckets>, kBands> preds_{};
  mutable std::array<bool, kBands> fresh_{};
  double local_slope(int band, std::int64_t rows) const;
  mutable std::array<std::array<double, kBuckets>, kBands> slopes_{};  // per band and bucket; < 0: not yet
  std::array<std::pair<double, double>, 32> draft_obs_{};              // (levels, ms), a ring
  std::int64_t draft_rounds_ = 0;
  std::int64_t steps_ = 0;                                     // real steps observed
  std::int64_t since() const { return steps_ - kStaleSteps; }  // the oldest stamp that still counts
  mutable bool draft_fresh_ = false;
  mutable double draft_a_ = 0, draft_b_ = 0;
  mutable double draft_same_ = -1;                            // > 0: every round in the ring asked this many levels
  mutable std::vector<std::pair<double, double>> draft_own_;  // (levels, median) of levels asked ≥ 3 times
  bool one_pass_ = false;
};

// Acceptance bookkeeping of one request (kept in its Sequence).
struct RequestAcceptance {
  double observed = 0, predicted = 0;                 // decayed Σ accepted nodes and Σ their predicted probabilities
  std::array<double, 33> level_hits{}, level_seen{};  // decayed: steps accepting depth d / reaching d-1 and drafting d
  std::int64_t idle_steps = 0;                        // decode steps in a row without a draft by the budget
  std::int64_t probe_interval = 4;    // idle steps before the next probe: doubles (to 64) while probes find nothing
  bool probing = false;               // the last draft was a probe
  std::int64_t unverified_steps = 0;  // proposals in a row of which the budget verified nothing
  std::int64_t verify_probe_interval = 4;  // then its likeliest first node is verified anyway (doubling to 64)
  // Its last verified draft was accepted whole: drafts come in runs (a copied passage, a repeated
  // list, a template the model fills in), so the next draft's chance depends on it.
  bool last_whole = false;
  // Rounds in a row in which its drafter, asked for a draft, proposed nothing (-1: never asked).
  std::int64_t empty_rounds = -1;
  double factor() const { return (observed + 1.0) / (predicted + 1.0); }
};

class AcceptanceModel {
 public:
  static constexpr int kMaxDepth = 32;
  static constexpr int kScoreBins = 12;
  static int score_bin(float score);

  // P(node accepted), score < 0: the drafter gave none.
  double node_prob(float score, int depth, const RequestAcceptance& r) const;
  // P(the chain reaches depth d) for this request, before anything is drafted. For a request whose
  // last draft was taken whole, the global estimate it starts from is what followed such drafts, so
  // it is not judged by the engine's average.
  double level_prob(int depth, const RequestAcceptance& r) const;
  // P(the drafter proposes anything at all when this request asks), which multiplies every level's
  // probability. Prompt lookup and suffix drafts find nothing to copy in most prose, and a round that
  // comes back empty still costs its round trip (~0.08 ms, 2 % of a batch-1 step); as no node of it
  // is ever verified, nothing else learned from it, and the budget asked at its prior every step
  // (SUFFIX ~0.96x plain on a chat prompt it never drafted for). The engine's rate over all requests
  // after as many empty rounds in a row as this request has had (bins: a first round, after a
  // proposal, after 1, 2, 3–4, 5–8, 9–16, 17+ empty ones), each bin's prior the bin before it: a
  // head drafter that declines an unconfident step (--speculative-draft-p-min) proposes again a step
  // later, prompt lookup in prose stays empty, and each keeps its own curve. 1 for a drafter that
  // always proposes.
  static constexpr int kRoundBins = 8;
  static int round_bin(std::int64_t empty_rounds);
  double propose_prob(const RequestAcceptance& r) const;
  // One round this request asked for: whether the drafter proposed anything.
  void observe_round(bool proposed, RequestAcceptance& r);
  // One verified node: its score, depth, what was predicted and whether it was accepted.
  void observe_node(float score, int depth, double predicted, bool accepted, RequestAcceptance& r);
  // One verified proposal: how deep it went and how deep it was accepted.
  void observe_levels(int drafted_depth, int accepted_depth, RequestAcceptance& r);
  // Expected calibration error of the predictions so far (|mean predicted − observed rate| weighted
  // over ten bins of the prediction), and how many predictions it covers.
  double calibration_error() const;
  double calibration_count() const;
  // The same error for the drafter's own scores (each verified node's that has one: a head's path
  // probability, DSPARK's product of confidences) taken as predictions of acceptance, and how many
  // nodes it covers: how well calibrated the drafter's confidence is before the table above corrects it.
  double score_calibration_error() const;
  double score_calibration_count() const;

 private:
  friend struct MemoryCodec;  // sched/memory.cpp: kept across engine starts
  struct Beta {
    double hits = 0, seen = 0;
  };
  std::array<std::array<Beta, kMaxDepth + 1>, kScoreBins + 1> table_{};  // [bin or kScoreBins = none][depth]
  std::array<Beta, kMaxDepth + 1> levels_{};                             // every verified proposal, by depth
  std::array<Beta, kMaxDepth + 1> after_whole_{};                        // those that followed a draft accepted whole
  std::array<Beta, kRoundBins> rounds_{};                                // rounds that proposed, by round_bin
  std::array<double, 10> cal_pred_{}, cal_obs_{}, cal_n_{};
  std::array<double, 10> score_pred_{}, score_obs_{}, score_n_{};
};

// The check on the models, by measurement: per batch-size bucket, the tokens per millisecond of
// decode steps that drafted (draft round + verification) against decode steps that did not. Steps
// without drafts happen by themselves (the budget skipped, plain requests); where none has happened
// for kExplore drafted steps, the policy runs one step plainly to measure (want_plain). While drafted
// steps measure slower, the extra costs the budget weighs are scaled up (×1.05 per drafted step, at
// most ×4), so it drafts less; when they measure ≥ 5 % faster the scale relaxes (×0.98). A plain step
// relaxes it a little (×0.995) unless the measurement says drafting loses and is recent (a drafted
// step within kStale plain steps), so a batch size that stopped speculating tries again, but one that
// drafts now and then at a loss does not: relaxed on every plain step, the scale settled where one
// drafted step in ~10 balanced its ×1.05 (1.05 ≈ 0.995^−10), and those steps kept losing (DFLASH on
// held-out prompts, 2026-12-07: measured gain 0.75–0.9 for thousands of steps at a scale of 1.0–1.3,
// 0.95× plain). A drafted step after kStale plain ones starts a fresh measurement. The cost model
// can be wrong; this comparison of two measured rates cannot be fooled by it.
class Feedback {
 public:
  static constexpr std::int64_t kExplore = 32;
  static constexpr std::int64_t kStale = 128;   // plain steps after which the drafted steps' rate is old
  static int bucket_of(std::int64_t requests);  // 1, 2, 3-4, 5-8, 9-16, 17+
  double penalty(std::int64_t requests) const { return at(requests).scale; }
  // One decode-only step: its requests, the tokens it emitted, its time, whether it drafted.
  void observe(std::int64_t requests, double tokens, double ms, bool drafted);
  bool want_plain(std::int64_t requests) const { return at(requests).since_plain >= kExplore; }
  // Drafted ÷ plain tokens per ms (1 until both were measured).
  double measured_gain(std::int64_t requests) const;

 private:
  friend struct MemoryCodec;  // sched/memory.cpp
  // Tokens and milliseconds summed with geometric weights (`keep` per new step): the rate of the
  // recent steps as a ratio of sums. A mean of per-step rates started from its first sample, and a
  // drafted step that took 40 ms (a drafter's first round) then held the measured gain under 1 for
  // tens of steps while the scale climbed ×1.05 per step — on prompts where drafting paid 1.2×.
  struct Rate {
    double tokens = 0, ms = 0;
    std::int64_t n = 0;  // steps seen
    void add(double t, double m, double keep) {
      tokens = keep * tokens + t;
      ms = keep * ms + m;
      ++n;
    }
    double rate() const { return ms > 0 ? tokens / ms : 0.0; }
  };
  static constexpr double kPlainKeep = 0.8, kSpecKeep = 0.9;
  // Before the scale moves: a drafted step emits 1 to depth + 1 tokens, so a mean over 4 of them
  // was still ±20 % noise (early losses of one request set the scale to ×2 for a hundred steps).
  static constexpr std::int64_t kMinPlain = 3, kMinSpec = 8;
  struct Bucket {
    Rate plain, spec;
    std::int64_t since_plain = 0;
    std::int64_t since_spec = 0;  // plain steps since the last drafted one (not kept across starts)
    double scale = 1;
    // Drafted ÷ plain tokens per ms once both have enough steps to count; 1 before.
    double gain() const {
      return plain.n >= kMinPlain && spec.n >= kMinSpec && plain.rate() > 0 ? spec.rate() / plain.rate() : 1.0;
    }
  };
  const Bucket& at(std::int64_t n) const { return b_[static_cast<std::size_t>(bucket_of(n))]; }
  std::array<Bucket, 6> b_{};
};

// Probing a request the budget stopped drafting for: due after `probe_interval` idle steps; a probe
// that led to no draft on the next plan doubles the interval (to 64), a draft by choice resets it to 4.
inline bool probe_due(const RequestAcceptance& r) { return r.idle_steps >= r.probe_interval; }
void note_plan(RequestAcceptance& r, bool probe, std::int32_t depth);

// One request's side of a depth plan.
struct DepthAsk {
  std::int32_t max_depth = 0;       // what the shape and the request allow
  bool probe = false;               // idle long enough: draft one level whatever the estimate
  std::vector<double> level_probs;  // [d-1]: P(reaching depth d), non-increasing
  double rows_per_level = 1;        // nodes the target verifies per level, expected (fractional: a
                                    // drafter that may propose nothing; rows are priced in between)
};

// Depths that maximise (base_tokens + Σ expected tokens) / (reference time + what drafting adds), by
// adding levels in order of their probability. base_rows: rows the step has anyway (roots, prefill
// chunks). What drafting adds: the draft round and the extra rows' cost on top of base_rows
// (CostModel::extra_ms), both scaled by `penalty` (Feedback). The reference time: the step's own,
// or with ref_rows ≥ 0 that of a step of ref_rows rows — the decoding rows alone, when the step also
// prefills: prefill is work the engine does anyway, and against a step made long by it any extra row
// looked cheap (16 in flight: drafts in nearly every step with a prompt chunk, each a loss). With
// ref_rows, base_tokens are the decoding rows' tokens.
std::vector<std::int32_t> plan_depths(const std::vector<DepthAsk>& asks, std::int64_t base_rows, double base_tokens,
                                      double mean_context, const CostModel& cost, double penalty = 1.0,
                                      std::int64_t ref_rows = -1);

// Whether probing can pay in a step: a request drafting alone, with drafts as good as they get
// (0.8 per level, up to max_depth), would raise the step's tokens per second. Under load a round costs
// more than its tokens are worth whatever a probe would learn, so probing stops with the speculation
// it would bring back (and resumes when the batch shrinks). By the cost model alone: the measured
// feedback (Feedback::penalty) already limits probes where drafts have not paid, and a request whose
// last draft was taken whole may probe whatever it says.
// The best case must beat plain decoding by kProbeMargin: where it would gain a few percent at most
// (self-speculation at batch 1 on this VM: a level costs ~50–60 % of a step, the best case gains
// 0–5 % as the step's time wanders) the probes' certain cost outweighs what they could find, and
// they ran every few steps of every request (STANDALONE ~0.96× plain with every draft declined).
constexpr double kProbeMargin = 1.10;
bool probe_pays(std::int32_t max_depth, std::int64_t base_rows, double base_tokens, double mean_context,
                const CostModel& cost, std::int64_t ref_rows = -1);

// How many due probes a step lets through. Where probing pays (probe_pays), all of them. Where it
// cannot, none, except that every `every`-th step with a probe due lets one through (probe_every), so
// the models keep measuring what a round costs and never rest on a stale figure. (Letting every due
// request through on that step sent a flood of one-level drafts every 32 steps at 16 in flight, each
// a loss.)
class ProbeGate {
 public:
  static constexpr std::int64_t kEvery = 32, kMaxEvery = 256;
  static constexpr double kShare = 0.01;  // of the steps' time that held-back probes may cost
  std::int64_t quota(bool probing_pays, bool any_due, std::int64_t every = kEvery) {
    if (probing_pays) {
      held_ = 0;
      return std::numeric_limits<std::int64_t>::max();
    }
    if (!any_due || ++held_ < every) return 0;
    held_ = 0;
    return 1;
  }

 private:
  std::int64_t held_ = 0;  // steps in a row with a probe due and held back
};

// Steps between the probes ProbeGate lets through where probing cannot pay: kEvery, or as many as
// keep a probe (a one-level round and one more row) within kShare of the steps' time, at most
// kMaxEvery. A self-speculation level costs about a target step on a small model: one in 32 steps
// cost ~3 % (STANDALONE 0.96–0.97× plain with every draft declined); a prompt-lookup probe stays at
// one in 32.
std::int64_t probe_every(const CostModel& cost, std::int64_t base_rows, double mean_context,
                         std::int64_t ref_rows = -1);

// One proposed node as the selection sees it.
struct Candidate {
  std::size_t request = 0;  // index of its request in the step
  std::int32_t index = 0;   // its index in the request's proposal
  std::int32_t parent = -1;
  double prob = 0;  // P(accepted), already non-increasing from parent to child
};

// For every candidate whether it is verified: the best prefix of the candidates ordered by
// probability (parents first) under the same objective. Closed under ancestors. `spent_ms`: time
// this step has taken already (its draft round): it cannot be saved, but it is part of the step's
// rate, so leaving it out would make every row look dearer than it is. ref_rows as for plan_depths.
std::vector<bool> select_nodes(const std::vector<Candidate>& nodes, std::int64_t base_rows, double base_tokens,
                               double mean_context, const CostModel& cost, double spent_ms = 0, double penalty = 1.0,
                               std::int64_t ref_rows = -1);

}  // namespace specactor::sched
