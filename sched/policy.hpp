// sched/policy.hpp — the scheduling policy, without CAF: requests (Sequence), admission under the
// KV budget and max_running_requests, batch building with chunked prefill, proposal limits, clean-up
// of the drafter's trees, stop conditions and stop strings, streaming events and metrics.
//
// The scheduler actor (actors/scheduler_actor.cpp) drives it and only moves messages:
//
//   plan = policy.next_step(draft_alive)            // nullopt: nothing to do (or a step in flight)
//   if plan->proposals.items is not empty:
//       ask the draft worker → policy.apply_proposals(*plan, reply) / policy.proposals_failed(*plan)
//   ask the target worker  → policy.step_done(*plan, reply) / policy.step_failed(*plan, error)
//
// Requests are referred to by id across those round trips, never by address: a request may be
// cancelled or failed while a reply is in flight. A plan carries the policy's epoch; fail_everything
// bumps it, so a reply to a plan made before is stale and changes nothing.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "drafters/drafter.hpp"
#include "model/prefix_tree.hpp"
#include "model/tokenizer.hpp"
#include "sched/budget.hpp"
#include "sched/memory.hpp"
#include "sched/sequence.hpp"
#include "sched/step.hpp"
#include "sched/types.hpp"

namespace specactor::sched {

using model::PrefixTree;

struct KeptProposal;  // sched/drafting.cpp

// Settings the policy reads (from the target snapshot).
struct Limits {
  std::int64_t max_running_requests = 1;
  std::int64_t chunked_prefill_size = 512;
  std::int64_t context_length = 0;
  std::int64_t page_size = 16;
  std::uint64_t default_seed = 0;
  bool prefix_cache = false;  // share KV of earlier requests (not --disable-radix-cache)
};

// What the prefix cache asks of the KV owner: before request `req` is released, take a reference on
// `keep` (its pages the cache now holds); let go of `drop` (pages the cache gave up).
struct CacheOps {
  std::uint64_t req = 0;
  std::vector<std::int32_t> keep, drop;
};
Limits limits_of(const config::ServerArgs& target);

// The draft side: how big a proposal may be (from the draft snapshot) and what the drafter asked for.
struct DraftShape {
  bool configured = false;            // an algorithm is set (τ and speculative_steps count these requests)
  std::int64_t num_draft_tokens = 1;  // tree size including the root (and a head's prompt-lookup branch)
  std::int64_t num_steps = 1;         // maximum depth (likewise)
  bool adaptive = false;              // --speculative-adaptive: the budget decides depths and nodes
  bool one_pass = false;              // a block drafter: one pass drafts every level (CostModel::set_one_pass)
  drafters::DrafterNeeds needs;
};
DraftShape draft_shape_of(const config::Snapshot& draft, drafters::DrafterNeeds needs);

// One step the policy planned: the target batch, the proposal round that comes first (no items: none).
struct StepPlan {
  std::uint64_t epoch = 0;
  StepBatch batch;
  ProposeBatch proposals;
  std::vector<std::uint64_t> proposal_ids;  // proposals.items[i] is for this request
  std::vector<std::int32_t> depth_limits;   // and may be at most this deep
  Clock::time_point started;
  // The step's shape for the cost model: rows without drafts, tokens it yields without drafts, all
  // rows, the mean context per row, and the draft levels asked.
  std::int64_t base_rows = 0, rows = 0, draft_levels = 0, decoding = 0;
  std::int64_t catch_up_rows = 0;  // target rows the proposals hand the drafter (a head's catch-up)
  bool priming = false;            // a request drafts for the first time: the drafter takes in its prompt
  double base_tokens = 0, mean_context = 0, draft_ms = 0;
  bool prefill = false;      // a prompt chunk is in the step
  bool probes_only = false;  // every request that drafts does so only because a probe was due (one level)
};

// Where probing cannot pay, a probe may first catch a head drafter up on at most this many rows of a
// request it never drafted for (its prompt).
constexpr std::size_t kProbePrimingRows = 64;

class Scheduler {
 public:
  // `release` is called with the id of every retired request that may hold KV in the workers.
  Scheduler(Limits limits, std::function<void(std::uint64_t)> release);

  // The target model is loaded: its KV pool in pages, its tokenizer (null: no text, no EOS) and
  // hidden size (the width of captured rows).
  void set_target(std::int64_t kv_pages, std::shared_ptr<const model::Tokenizer> tokenizer, std::int64_t hidden_size);
  void set_draft(DraftShape shape);
  // Where the prefix cache's page operations go (the target worker); called before `release` for a
  // request's `keep`.
  void set_cache_sink(std::function<void(CacheOps)> sink) { cache_sink_ = std::move(sink); }
  // Gives up every cached page no running request uses (sglang's /flush_cache); returns how many.
  std::int64_t flush_cache();
  const PrefixTree* prefix_tree() const { return tree_.get(); }
  // Step times measured at start-up: (rows, ms) at a short context.
  void seed_costs(const std::vector<std::pair<std::int64_t, double>>& probe);
  const CostModel& cost() const { return cost_; }
  const AcceptanceModel& acceptance() const { return accept_; }
  const Feedback& feedback() const { return feedback_; }
  // What the budget learned, as text under `key`, and back (sched/memory.hpp: restore_memory returns
  // "" when restored, "key" for another engine's file, else what is wrong with the text).
  std::string save_memory(const std::string& key) const { return MemoryCodec::save(key, accept_, cost_, feedback_); }
  std::string restore_memory(std::string_view text, const std::string& key) {
    return MemoryCodec::restore(text, key, accept_, cost_, feedback_);
  }
  // The clock the budget times draft rounds and steps with (steady_clock; tests drive it).
  void set_clock(std::function<Clock::time_point()> now) { now_ = std::move(now); }
  // Steps run once the policy is ready (the target is loaded, the draft worker answered or failed).
  void set_ready();
  bool ready() const { return ready_; }
  // The target failed for good: every request fails with `error`, and so does every later submission.
  void set_target_failed(const std::string& error);
  const std::string& target_error() const { return target_error_; }

  // Validates and queues a request; a refused one gets its final event at once.
  void submit(std::shared_ptr<const Submission> sub);
  // A queued request ends now; a running one at the next step boundary (its step may be in flight).
  void cancel(std::uint64_t id);
  // Every request ends with `error` (the engine shuts down, the target died); in-flight replies go stale.
  void fail_everything(const std::string& error);

  // The next step: admits what fits, then batches prefill chunks and decode items; proposals for the
  // requests that draft when `draft_alive`. nullopt while a step is in flight or nothing runs.
  std::optional<StepPlan> next_step(bool draft_alive);
  // The drafter's answer: keeps well-formed nodes within each request's depth limit and the tree
  // limit, and adds them to the plan's batch. False (nothing changed) when the plan is stale.
  bool apply_proposals(StepPlan& plan, Proposals& proposals);
  // The drafter failed: the step runs without drafts (counted as fallbacks). False when stale.
  bool proposals_failed(StepPlan& plan);
  // The target's answer: streams tokens, retires finished requests. Ignored when stale.
  void step_done(const StepPlan& plan, StepResult& result);
  // The target step failed: the step's requests end with `error`, the others go on. Ignored when stale.
  void step_failed(const StepPlan& plan, const std::string& error);
  // The plan was never sent (no target to send it to).
  void step_dropped(const StepPlan& plan);

  bool stale(const StepPlan& plan) const { return plan.epoch != epoch_; }
  bool busy() const { return busy_; }
  std::size_t running() const { return running_.size(); }
  std::size_t queued() const { return queue_.size(); }
  std::int64_t free_pages() const { return free_pages_; }
  const Sequence* find(std::uint64_t id) const;
  // Counters; the actor adds what only it knows (draft worker health, timings of round trips).
  EngineMetrics& metrics() { return metrics_; }
  const EngineMetrics& metrics() const { return metrics_; }
  EngineMetrics snapshot_metrics() const;

 private:
  Sequence* find_running(std::uint64_t id);
  void admit();
  void retire(Sequence& r, const std::string& reason, const std::string& error = {}, bool invalid_request = false);
  std::int64_t leave_to_cache(Sequence& r, bool failed);
  std::string emit(Sequence& r, const std::vector<std::int32_t>& tokens,
                   const std::vector<kernels::TokenLogprob>& logprobs = {});
  std::string refusal(const Sequence& r) const;
  void plan_drafts(StepPlan& plan, const std::vector<Sequence*>& decoding);
  // Probing requests the budget stopped drafting for pays only where a first draft is accepted at
  // least 20 % of the time engine-wide and speculating has not measured as a loss for this batch size.
  bool probes_allowed(std::int64_t decoding) const;
  std::string take_result(Sequence& r, ItemResult& item, std::size_t width);
  void observe_verification(Sequence& r, const ItemResult& item);
  void count_drafted(Sequence& r, const ItemResult& item);
  std::vector<KeptProposal> keep_proposals(const StepPlan& plan, const Proposals& p, std::vector<Candidate>& cands);
  void verify_declined(std::vector<KeptProposal>& kept, std::vector<std::vector<bool>>& chosen, std::int64_t decoding);
  void add_proposal(StepPlan& plan, Sequence& r, std::int32_t depth);
  bool cacheable(const Sequence& r) const;
  void take_hit(Sequence& r, PrefixTree::Node* lock, PrefixTree::Match m, const PrefixTree::Partial& part);
  void cache_prompt(Sequence& r);
  void rematch(Sequence& r);
  // Evicts cached pages (LRU) until `need` are free, if it can; tells the KV owner.
  void make_room(std::int64_t need);
  // Constrained output (constrain.cpp).
  const std::shared_ptr<const grammar::Vocabulary>& vocabulary();
  std::string start_constraint(Sequence& r);
  void append_mask(const Sequence& r, const grammar::Matcher& m, std::vector<std::uint32_t>& out);
  bool grammar_allows(const Sequence& r, const grammar::Matcher& m, std::int32_t token, grammar::Matcher& next) const;
  bool advance_constraint(Sequence& r, std::int32_t token);
  static constexpr std::int32_t kForcedDrafts = 8;
  std::int32_t force_drafts(Sequence& r, StepItem& item, const grammar::Matcher& from, std::int32_t parent);

  Limits limits_;
  std::function<void(std::uint64_t)> release_;
  std::shared_ptr<const model::Tokenizer> tokenizer_;
  // Constrained output: the vocabulary's bytes, and the grammars of recent constraints with their masks.
  struct Compiled {
    std::shared_ptr<const grammar::Grammar> grammar;
    std::shared_ptr<grammar::MaskCache> masks;
  };
  static constexpr std::size_t kGrammarsKept = 16;
  std::shared_ptr<const grammar::Vocabulary> vocab_;
  std::list<std::pair<std::string, Compiled>> grammars_;
  std::int64_t hidden_size_ = 0;
  DraftShape draft_;
  bool target_known_ = false, ready_ = false, busy_ = false;
  std::string target_error_;
  std::uint64_t epoch_ = 0;
  std::int64_t free_pages_ = 0, total_pages_ = 0;
  std::deque<std::unique_ptr<Sequence>> queue_;
  std::vector<std::unique_ptr<Sequence>> running_;
  EngineMetrics metrics_;
  CostModel cost_;
  AcceptanceModel accept_;
  Feedback feedback_;
  double rows_per_level_ = 1;         // nodes verified per drafted level (trees verify more than one)
  ProbeGate probe_gate_;              // due probes held back where drafting could not pay
  std::unique_ptr<PrefixTree> tree_;  // the prefix cache (null when off)
  std::function<void(CacheOps)> cache_sink_;
  std::function<Clock::time_point()> now_ = [] { return Clock::now(); };
};

}  // namespace specactor::sched
