// sched/policy.cpp — the scheduling policy's core (see sched/policy.hpp): requests in and out,
// admission under the KV budget, the step plan with chunked prefill, and the target's results. Its
// seams have files of their own: streaming and stop matching (stream.cpp), drafting (drafting.cpp),
// the prefix cache (cache_glue.cpp).
#include "sched/policy.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "config/server_args.hpp"
#include "sched/policy_detail.hpp"

namespace specactor::sched {

using detail::finish_metrics;
using detail::ms_between;
using detail::notify;
using detail::pages_for;

Limits limits_of(const config::ServerArgs& t) {
  Limits l;
  l.max_running_requests = t.max_running_requests;
  l.chunked_prefill_size = t.chunked_prefill_size;
  l.context_length = t.context_length.value_or(0);
  l.page_size = t.page_size;
  l.default_seed = static_cast<std::uint64_t>(t.random_seed);
  l.prefix_cache = !t.disable_radix_cache;
  return l;
}

Scheduler::Scheduler(Limits limits, std::function<void(std::uint64_t)> release)
    : limits_(limits), release_(std::move(release)) {}

void Scheduler::set_target(std::int64_t kv_pages, std::shared_ptr<const model::Tokenizer> tokenizer,
                           std::int64_t hidden_size) {
  total_pages_ = free_pages_ = kv_pages;
  tree_ = limits_.prefix_cache ? std::make_unique<PrefixTree>(limits_.page_size) : nullptr;
  tokenizer_ = std::move(tokenizer);
  hidden_size_ = hidden_size;
  target_known_ = true;
}

void Scheduler::set_draft(DraftShape shape) {
  draft_ = std::move(shape);
  cost_.set_one_pass(draft_.one_pass);
}

void Scheduler::seed_costs(const std::vector<std::pair<std::int64_t, double>>& probe) {
  for (const auto& [rows, ms] : probe) cost_.seed(rows, ms);
}

void Scheduler::set_ready() { ready_ = true; }

void Scheduler::set_target_failed(const std::string& error) {
  target_error_ = error;
  metrics_.target_error = error;
  fail_everything(error);
}

Sequence* Scheduler::find_running(std::uint64_t id) {
  for (auto& r : running_)
    if (r->id() == id) return r.get();
  return nullptr;
}

const Sequence* Scheduler::find(std::uint64_t id) const {
  for (const auto& r : running_)
    if (r->id() == id) return r.get();
  for (const auto& r : queue_)
    if (r->id() == id) return r.get();
  return nullptr;
}

EngineMetrics Scheduler::snapshot_metrics() const {
  EngineMetrics m = metrics_;
  m.running = static_cast<std::int64_t>(running_.size());
  m.queued = static_cast<std::int64_t>(queue_.size());
  m.mean_accepted_length =
      m.speculative_steps > 0 ? static_cast<double>(m.accepted + m.speculative_steps) / m.speculative_steps : 0.0;
  m.acceptance_rate = m.drafted > 0 ? static_cast<double>(m.accepted) / m.drafted : 0.0;
  m.kv_pages_total = total_pages_;
  m.kv_pages_free = free_pages_;
  m.prefix_cache = tree_ != nullptr;
  m.cache_pages = tree_ ? tree_->cached_pages() : 0;
  m.adaptive = draft_.configured && draft_.adaptive;
  m.calibration_error = accept_.calibration_error();
  m.calibrated_nodes = accept_.calibration_count();
  m.draft_score_calibration_error = accept_.score_calibration_error();
  m.draft_scored_nodes = accept_.score_calibration_count();
  m.step_ms_1 = cost_.step_ms(1, 0);
  m.step_cost.clear();
  if (m.step_ms_1 > 0)
    for (std::int64_t k : {1, 2, 4, 8, 16, 32}) m.step_cost.push_back(cost_.relative(k, 0));
  return m;
}

void Scheduler::retire(Sequence& r, const std::string& reason, const std::string& error, bool invalid_request) {
  TokenEvent ev;
  if (r.out.decoder) {
    ev.text = r.out.stops.flush();
    if (!r.out.stops.stopped()) ev.text += r.out.decoder->finish();  // after a stop string nothing more is shown
  }
  ev.finished = true;
  ev.finish_reason = reason;
  ev.error = error;
  ev.invalid_request = invalid_request;
  ev.metrics = finish_metrics(r);
  notify(r, std::move(ev));
  // The prefix cache may keep pages of what the request computed; those stay in use.
  const std::int64_t kept = leave_to_cache(r, reason == "error");
  if (release_) release_(r.id());
  free_pages_ += r.kv.reserved - kept;
  r.kv.reserved = 0;
  if (reason == "error")
    ++metrics_.requests_failed;
  else if (reason == "cancelled")
    ++metrics_.requests_cancelled;
  else
    ++metrics_.requests_finished;
}

std::string Scheduler::refusal(const Sequence& r) const {
  // The request's checks, again here for what reaches the scheduler without EngineApi::prepare (the
  // actor-level API, another process): the same function, the same messages.
  GenerationRequest g = r.sub->request;
  g.prompt_ids = r.seq;
  try {
    check_request(g, {limits_.context_length, 0},
                  [](const std::string& f) { return f == "prompt_ids" ? "prompt" : f; });
  } catch (const RequestError& e) {
    return e.what();
  }
  if (target_known_) {
    const std::int64_t need = r.kv.need + draft_.num_draft_tokens;
    if (pages_for(need, limits_.page_size) > total_pages_)
      return "the request needs " + std::to_string(need) + " tokens of KV cache but the cache holds " +
             std::to_string(total_pages_ * limits_.page_size) + " (--max-total-tokens)";
  }
  return {};
}

void Scheduler::submit(std::shared_ptr<const Submission> sub) {
  ++metrics_.requests_submitted;
  auto r = std::make_unique<Sequence>();
  r->sub = std::move(sub);
  const auto& g = r->sub->request;
  r->seq = r->sub->prompt;
  r->prompt_len = r->seq.size();
  r->submitted = Clock::now();
  r->seed = g.seed.value_or(limits_.default_seed);
  r->rules = g.rules;
  if (r->rules.min_tokens > 0 && r->rules.end_ids.empty() && tokenizer_)
    r->rules.end_ids = tokenizer_->end_of_generation_ids();
  r->out.stops = StopMatcher(g.stop);
  if (tokenizer_) r->out.decoder = std::make_unique<model::StreamDecoder>(*tokenizer_);
  r->max_new = new_token_budget(g, static_cast<std::int64_t>(r->prompt_len), limits_.context_length);
  r->kv.need = static_cast<std::int64_t>(r->prompt_len) + r->max_new;
  if (!target_error_.empty()) {
    retire(*r, "error", target_error_);
    return;
  }
  if (const std::string why = refusal(*r); !why.empty()) {
    retire(*r, "error", why, true);
    return;
  }
  queue_.push_back(std::move(r));
}

void Scheduler::cancel(std::uint64_t id) {
  for (auto it = queue_.begin(); it != queue_.end(); ++it)
    if ((*it)->id() == id) {
      auto r = std::move(*it);
      queue_.erase(it);
      retire(*r, "cancelled");
      return;
    }
  if (Sequence* r = find_running(id)) r->cancelled = true;
}

void Scheduler::fail_everything(const std::string& error) {
  ++epoch_;
  for (auto& r : running_) retire(*r, "error", error);
  running_.clear();
  for (auto& r : queue_) retire(*r, "error", error);
  queue_.clear();
  busy_ = false;
  flush_cache();  // what the target held may be gone with it
}

// Moves queued requests into the batch while the KV budget and max_running_requests allow; FIFO, so
// no request is overtaken. The reservation covers the prompt, max_new and one draft tree.
void Scheduler::admit() {
  while (!queue_.empty() && static_cast<std::int64_t>(running_.size()) < limits_.max_running_requests) {
    Sequence& r = *queue_.front();
    if (const std::string why = refusal(r); !why.empty()) {  // queued before the model was known
      auto gone = std::move(queue_.front());
      queue_.pop_front();
      retire(*gone, "error", why, true);
      continue;
    }
    if (const std::string why = r.constraint.matcher ? "" : start_constraint(r); !why.empty()) {
      auto gone = std::move(queue_.front());
      queue_.pop_front();
      retire(*gone, "error", why, true);
      continue;
    }
    // The longest cached prefix in whole pages, leaving at least the last prompt token to prefill
    // (its logits start the answer); the request runs on those pages, locked against eviction.
    // A partly matched page after them is copied into a page of the request's own (its reservation
    // holds it); the page it copies from stays locked until the request's prompt is cached.
    PrefixTree::Match hit;
    PrefixTree::Partial part;
    PrefixTree::Node* lock = nullptr;
    r.cache.on = cacheable(r);
    if (r.cache.on && r.prompt_len > 1) {
      const auto limit = static_cast<std::int64_t>(r.prompt_len) - 1;
      hit = tree_->match(r.seq, limit);
      part = tree_->partial(hit, r.seq, limit);
      lock = part.tokens > 0 ? part.node : hit.node;
      tree_->lock(lock);
    }
    const std::int64_t pages =
        pages_for(r.kv.need + draft_.num_draft_tokens, limits_.page_size) - static_cast<std::int64_t>(hit.pages.size());
    make_room(pages);
    if (pages > free_pages_) {
      if (lock) tree_->unlock(lock);
      break;
    }
    free_pages_ -= pages;
    r.kv.reserved = pages;
    if (r.cache.on) {
      metrics_.cache_query_tokens += static_cast<std::int64_t>(r.prompt_len);
      metrics_.cache_hit_tokens += hit.tokens + part.tokens;
      take_hit(r, lock, std::move(hit), part);
    }
    if (!r.out.decoder && tokenizer_) r.out.decoder = std::make_unique<model::StreamDecoder>(*tokenizer_);
    running_.push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
}

std::optional<StepPlan> Scheduler::next_step(bool draft_alive) {
  if (busy_ || !ready_ || !target_error_.empty()) return std::nullopt;
  for (auto it = running_.begin(); it != running_.end();) {  // cancelled requests leave between steps
    if ((*it)->cancelled) {
      retire(**it, "cancelled");
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
  admit();
  metrics_.running = static_cast<std::int64_t>(running_.size());
  metrics_.queued = static_cast<std::int64_t>(queue_.size());
  if (running_.empty()) return std::nullopt;

  StepPlan plan;
  plan.epoch = epoch_;
  plan.batch.capture = draft_.needs.hidden_layers;
  std::vector<Sequence*> decoding;
  std::int64_t prefill_budget = limits_.chunked_prefill_size;
  for (auto& rp : running_) {
    Sequence& r = *rp;
    const GenerationRequest& g = r.sub->request;
    StepItem item;
    item.req = r.id();
    item.params = g.sampling;
    item.rules = r.rules;
    item.logprobs = g.logprobs;
    item.seed = r.seed;
    if (draft_alive && g.speculative) {
      item.want_hidden = !draft_.needs.hidden_layers.empty();
      item.want_kv = draft_.needs.target_kv;
    }
    if (r.prefilled < r.prompt_len && prefill_budget > 0) rematch(r);
    if (r.cache.on) {
      item.want_kv = true;  // the page table the cache takes pages from
      item.keep_hidden = !plan.batch.capture.empty();
    }
    if (r.cache.tokens > 0 && r.prefilled == static_cast<std::size_t>(r.cache.tokens)) {
      // The first chunk after a cache hit: the target starts the request on the cached pages.
      item.prefix_pages = r.cache.pages;
      item.prefix_len = r.cache.tokens - r.cache.copy_len;
      if (r.rules.needs_prompt())  // the worker never sees the cached prompt tokens otherwise
        item.history.assign(r.seq.begin(), r.seq.begin() + static_cast<long>(r.prefilled));
      item.copy_page = r.cache.copy_page;
      item.copy_len = r.cache.copy_len;
    }
    if (r.prefilled < r.prompt_len) {
      if (prefill_budget <= 0) continue;
      const auto n = static_cast<std::size_t>(
          std::min<std::int64_t>(prefill_budget, static_cast<std::int64_t>(r.prompt_len - r.prefilled)));
      item.prefill = true;
      item.tokens.assign(r.seq.begin() + static_cast<long>(r.prefilled),
                         r.seq.begin() + static_cast<long>(r.prefilled + n));
      item.sample = r.prefilled + n == r.prompt_len;
      r.chunk = n;
      prefill_budget -= static_cast<std::int64_t>(n);
    } else {
      item.tokens = {r.seq.back()};
      item.sample = true;
      if (g.speculative) decoding.push_back(&r);
    }
    if (item.sample && r.constraint.matcher) append_mask(r, *r.constraint.matcher, item.allowed);
    r.in_step = true;
    plan.batch.items.push_back(std::move(item));
  }
  if (plan.batch.items.empty()) return std::nullopt;
  busy_ = true;
  plan.started = now_();
  // The step's shape without drafts (the cost model's inputs).
  double ctx_rows = 0;
  for (const auto& item : plan.batch.items) {
    const Sequence* r = find_running(item.req);
    const auto n = static_cast<double>(item.tokens.size());
    const double before = item.prefill ? static_cast<double>(r->prefilled) : static_cast<double>(r->seq.size() - 1);
    plan.base_rows += static_cast<std::int64_t>(item.tokens.size());
    plan.base_tokens += item.sample ? 1.0 : 0.0;
    plan.prefill = plan.prefill || item.prefill;
    plan.decoding += item.prefill ? 0 : 1;
    ctx_rows += n * (before + 0.5 * n);
  }
  plan.rows = plan.base_rows;
  plan.mean_context = plan.base_rows > 0 ? ctx_rows / static_cast<double>(plan.base_rows) : 0.0;
  if (!draft_.configured || decoding.empty()) return plan;
  if (!draft_alive) {  // the drafter is gone: plain decoding, counted
    metrics_.fallback_steps += static_cast<std::int64_t>(decoding.size());
    for (Sequence* r : decoding) ++r->m.fallbacks;
    return plan;
  }
  plan_drafts(plan, decoding);
  // Constrained requests the drafter was not asked about still draft what their grammar forces.
  for (auto& item : plan.batch.items) {
    Sequence* r = find_running(item.req);
    if (item.prefill || !r || !r->constraint.matcher || !r->sub->request.speculative) continue;
    if (std::find(plan.proposal_ids.begin(), plan.proposal_ids.end(), item.req) != plan.proposal_ids.end()) continue;
    plan.rows += force_drafts(*r, item, *r->constraint.matcher, -1);
  }
  return plan;
}

void Scheduler::step_done(const StepPlan& plan, StepResult& res) {
  if (stale(plan)) return;
  const double wall = ms_between(plan.started, now_());
  metrics_.step_wall_ms += wall;
  metrics_.step_compute_ms += res.compute_ms;
  cost_.observe_step(plan.rows, plan.mean_context, wall);
  // A drafted decode step against the same step without drafts (the feedback on the models).
  double emitted = 0;
  for (const auto& item : res.items) emitted += static_cast<double>(item.tokens.size());
  // A round in which a drafter first took in a request's prompt is a one-time prefill of its own
  // state, not what drafting costs per step: left out, as the cost model leaves it out. (The catch-up
  // after idle steps is counted: it is what sparse drafting costs.)
  const bool prefilled_drafter = plan.priming;
  // Steps that drafted only because probes were due are the budget's own measurements (priced by
  // probe_every), not its judgement: counted, the feedback scaled the costs up for each probe that
  // found a request still drafting badly — what the acceptance model already learns from it.
  if (draft_.adaptive && draft_.configured && plan.draft_levels > 0)
    spdlog::trace("draft round: {} requests, {} levels, {} catch-up rows, {:.2f} ms{}", plan.proposal_ids.size(),
                  plan.draft_levels, plan.catch_up_rows, plan.draft_ms, prefilled_drafter ? " (left out)" : "");
  if (draft_.adaptive && draft_.configured && !plan.prefill && plan.decoding > 0 && !prefilled_drafter &&
      !plan.probes_only) {
    feedback_.observe(plan.decoding, emitted, plan.draft_ms + wall, plan.draft_levels > 0);
    spdlog::trace(
        "feedback: {} requests, {} tokens in {:.2f} ms (draft {:.2f}), {} levels drafted, {} rows; gain {:.2f}, scale "
        "{:.2f}",
        plan.decoding, emitted, plan.draft_ms + wall, plan.draft_ms, plan.draft_levels, plan.rows,
        feedback_.measured_gain(plan.decoding), feedback_.penalty(plan.decoding));
  }
  ++metrics_.steps;
  const std::size_t width = draft_.needs.hidden_layers.size() * static_cast<std::size_t>(hidden_size_);
  for (auto& item : res.items) {
    auto it = std::find_if(running_.begin(), running_.end(), [&](auto& r) { return r->id() == item.req; });
    if (it == running_.end()) continue;
    Sequence& r = **it;
    r.in_step = false;
    // A fault in one request's result (a bug, an inconsistent reply) fails that request alone: it ends
    // with an error event and gives its pages back; the others in the step go on.
    std::string reason;
    try {
      reason = take_result(r, item, width);
    } catch (const std::exception& e) {
      spdlog::error("internal error in request {}: {}", r.id(), e.what());
      retire(r, "error", std::string("internal error: ") + e.what());
      running_.erase(it);
      continue;
    }
    if (r.cancelled) reason = "cancelled";
    if (!reason.empty()) {
      retire(r, reason);
      running_.erase(it);
    }
  }
  busy_ = false;
}

// One request's part of a step result: its hidden rows, KV and tokens. Returns why it ends (empty:
// it goes on). Throws std::logic_error when the result cannot belong to the request.
std::string Scheduler::take_result(Sequence& r, ItemResult& item, std::size_t width) {
  const auto P = static_cast<std::int64_t>(limits_.page_size);
  if (item.kv_length > 0) {
    // The KV holds a row for each token fed: at most the request's tokens and this step's inputs.
    const auto fed = static_cast<std::int64_t>(r.seq.size()) + static_cast<std::int64_t>(item.tokens.size());
    if (item.kv_length > fed || static_cast<std::int64_t>(item.kv_pages.size()) * P < item.kv_length)
      throw std::logic_error("the target reported " + std::to_string(item.kv_length) + " KV rows in " +
                             std::to_string(item.kv_pages.size()) + " pages for a request of " +
                             std::to_string(r.seq.size()) + " tokens");
  }
  if (!item.hidden.empty() && width > 0) {
    // Rows continue where the last ones ended; after a gap (a cache hit without kept rows) they
    // start over at their own position, and the drafter sees the gap.
    if (r.draft.hidden.empty() || item.hidden_first != r.draft.hidden_rows) {
      r.draft.hidden.clear();
      r.draft.hidden_first = item.hidden_first;
    }
    r.draft.hidden.insert(r.draft.hidden.end(), item.hidden.begin(), item.hidden.end());
    r.draft.hidden_rows = item.hidden_first + static_cast<std::int64_t>(item.hidden.size() / width);
  }
  if (item.kv_length > 0) {
    r.kv.pages = std::move(item.kv_pages);
    r.kv.length = item.kv_length;
  }
  std::string reason;
  if (r.prefilled < r.prompt_len) {
    r.prefilled += r.chunk;
    r.chunk = 0;
    if (r.prefilled == r.prompt_len) cache_prompt(r);
    if (!item.tokens.empty()) reason = emit(r, item.tokens, item.logprobs);
  } else {
    ++r.m.steps;
    ++metrics_.decode_steps;
    if (draft_.configured && r.sub->request.speculative) ++metrics_.speculative_steps;
    count_drafted(r, item);
    if (draft_.configured && r.sub->request.speculative) observe_verification(r, item);
    r.draft.depth = 0;
    reason = emit(r, item.tokens, item.logprobs);
  }
  // A request that ends inside a step's tokens (its length, a stop, the end of generation) has KV
  // rows for accepted tokens it did not keep: only the rows of its own tokens are its KV (and what the
  // prefix cache may take).
  r.kv.length = std::min<std::int64_t>(r.kv.length, static_cast<std::int64_t>(r.seq.size()));
  return reason;
}

void Scheduler::step_failed(const StepPlan& plan, const std::string& error) {
  if (stale(plan)) return;
  for (auto it = running_.begin(); it != running_.end();) {  // the step's requests cannot continue
    if ((*it)->in_step) {
      retire(**it, "error", error);
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
  busy_ = false;
}

void Scheduler::step_dropped(const StepPlan& plan) {
  if (stale(plan)) return;
  for (auto& r : running_) {
    r->in_step = false;
    r->chunk = 0;
  }
  busy_ = false;
}
}  // namespace specactor::sched
