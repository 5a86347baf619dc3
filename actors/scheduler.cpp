// actors/scheduler.cpp — the scheduling loop. One step at a time: admit, build a batch (prefill
// chunks + decode items), ask the draft worker for proposals when there is one, run the target
// step, stream the accepted tokens, retire finished requests, repeat while there is work.
#include "actors/scheduler.hpp"

#include <spdlog/spdlog.h>

#include <caf/all.hpp>
#include <chrono>
#include <deque>
#include <optional>

#include "actors/draft_worker.hpp"
#include "actors/system.hpp"
#include "actors/target_worker.hpp"

namespace specactor::actors {

namespace {

using Clock = std::chrono::steady_clock;
double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

struct Req {
  std::shared_ptr<const Submission> sub;
  std::vector<std::int32_t> seq;  // prompt + emitted tokens
  std::size_t prompt_len = 0;
  std::size_t prefilled = 0;  // prompt tokens in the target's KV
  std::size_t chunk = 0;      // prompt tokens in the step in flight
  std::int64_t max_new = 0;
  std::int64_t reserved_pages = 0;
  std::uint64_t seed = 0;
  std::vector<std::int32_t> generated;
  std::unique_ptr<model::StreamDecoder> decoder;
  std::string held;  // text held back: it may be the start of a stop string
  bool cancelled = false;
  bool in_step = false;
  std::int32_t draft_depth = 0;  // depth of the proposal in the step in flight
  // Target features for a head drafter, gathered since the last proposal.
  std::vector<float> hidden;
  std::int64_t hidden_first = 0;  // context position of hidden's first row
  std::int64_t hidden_rows = 0;   // rows received so far (= position after the last row)
  std::vector<std::int32_t> kv_pages;
  std::int64_t kv_length = 0;
  Clock::time_point submitted, first_token;
  RequestMetrics m;
  bool decoding() const { return prefilled == prompt_len && !generated.empty(); }
};

}  // namespace

struct SchedulerState {
  config::Snapshot target_snapshot;
  config::Snapshot draft_snapshot;  // derived once the target model is loaded (null for NONE)
  target_worker_actor target;
  draft_worker_actor draft;
  DrafterNeeds needs;  // what the draft worker asked for when it came up
  std::optional<TargetInfo> info;
  std::string target_error;
  caf::error target_failure;  // what ready() answers once the target failed (keeps user vs internal)
  std::vector<caf::typed_response_promise<TargetInfo>> ready_waiters;
  bool ready = false;                // the target model is loaded and the draft worker (if any) answered once
  bool ready_on_draft_down = false;  // the draft worker failed its first answer: ready once its down is seen
  std::deque<std::unique_ptr<Req>> queue;
  std::vector<std::unique_ptr<Req>> running;
  bool busy = false;
  // Bumped whenever every request is failed at once: a reply to a step or a proposal sent before
  // carries the old value and is dropped (its requests are gone).
  std::uint64_t epoch = 0;
  std::int64_t free_pages = 0, total_pages = 0;
  EngineMetrics metrics;
  static inline const char* name = "scheduler";
};

namespace {

using Self = scheduler_actor::stateful_pointer<SchedulerState>;

void notify(Req& r, TokenEvent ev) {
  ev.id = r.sub->id;
  if (!r.sub->on_token) return;
  try {
    r.sub->on_token(ev);
  } catch (const std::exception& e) {
    spdlog::warn("request {}: the token callback threw: {}", r.sub->id, e.what());
  }
}

RequestMetrics finish_metrics(Req& r) {
  RequestMetrics m = r.m;
  m.prompt_tokens = static_cast<std::int64_t>(r.prompt_len);
  m.generated_tokens = static_cast<std::int64_t>(r.generated.size());
  const auto now = Clock::now();
  if (!r.generated.empty()) {
    m.time_to_first_token_ms = ms_between(r.submitted, r.first_token);
    const double decode_ms = ms_between(r.first_token, now);
    m.decode_tokens_per_s =
        r.generated.size() > 1 && decode_ms > 0 ? (r.generated.size() - 1) / (decode_ms / 1000.0) : 0.0;
  }
  m.mean_accepted_length = m.steps > 0 ? static_cast<double>(m.accepted + m.steps) / static_cast<double>(m.steps) : 0.0;
  return m;
}

// Ends a request: final event, KV released in both workers, budget returned.
void retire(Self self, Req& r, const std::string& reason, const std::string& error = {}, bool invalid_request = false) {
  auto& st = self->state;
  TokenEvent ev;
  if (r.decoder) ev.text = r.held + r.decoder->finish();  // after a stop string nothing is held
  r.held.clear();
  ev.finished = true;
  ev.finish_reason = reason;
  ev.error = error;
  ev.invalid_request = invalid_request;
  ev.metrics = finish_metrics(r);
  notify(r, std::move(ev));
  if (st.target) self->send(st.target, release_atom::value, r.sub->id);
  if (st.draft) self->send(st.draft, release_atom::value, r.sub->id);
  st.free_pages += r.reserved_pages;
  if (reason == "error")
    ++st.metrics.requests_failed;
  else if (reason == "cancelled")
    ++st.metrics.requests_cancelled;
  else
    ++st.metrics.requests_finished;
}

// Appends accepted tokens to a request, streams them, and checks the stop conditions.
// Returns the finish reason ("" while the request goes on).
std::string emit(Self self, Req& r, const std::vector<std::int32_t>& tokens) {
  const auto& tok = self->state.info->tokenizer;
  const GenerationRequest& g = r.sub->request;
  TokenEvent ev;
  std::string reason;
  for (std::int32_t t : tokens) {
    if (!g.ignore_eos && tok && tok->is_end_of_generation(t)) {
      reason = "stop";
      break;
    }
    if (r.generated.empty()) r.first_token = Clock::now();
    r.generated.push_back(t);
    r.seq.push_back(t);
    ev.tokens.push_back(t);
    if (r.decoder) {
      r.held += r.decoder->push(t);
      // A stop string ends the request; its text is not part of the output.
      std::size_t cut = std::string::npos;
      for (const auto& s : g.stop)
        if (!s.empty()) cut = std::min(cut, r.held.find(s));
      if (cut != std::string::npos) {
        ev.text += r.held.substr(0, cut);
        r.held.clear();
        reason = "stop";
        break;
      }
      // Hold back the longest tail that could still become a stop string.
      std::size_t keep = 0;
      for (const auto& s : g.stop)
        for (std::size_t len = std::min(s.size() - 1, r.held.size()); len > keep; --len)
          if (r.held.compare(r.held.size() - len, len, s, 0, len) == 0) {
            keep = len;
            break;
          }
      ev.text += r.held.substr(0, r.held.size() - keep);
      r.held.erase(0, r.held.size() - keep);
    }
    ++self->state.metrics.generated_tokens;
    if (static_cast<std::int64_t>(r.generated.size()) >= r.max_new) {
      reason = "length";
      break;
    }
  }
  if (!ev.tokens.empty() || !ev.text.empty()) notify(r, std::move(ev));
  return reason;
}

void tick(Self self);

void fail_everything(Self self, const std::string& error) {
  auto& st = self->state;
  ++st.epoch;
  for (auto& r : st.running) retire(self, *r, "error", error);
  st.running.clear();
  for (auto& r : st.queue) retire(self, *r, "error", error);
  st.queue.clear();
  st.busy = false;
}

// A running request by id (nullptr once it has been retired). Replies to asynchronous requests refer
// to requests by id only: a request may be retired (cancelled, failed) while its reply is in flight.
Req* find_running(SchedulerState& st, std::uint64_t id) {
  for (auto& r : st.running)
    if (r->sub->id == id) return r.get();
  return nullptr;
}

std::int64_t draft_tokens(const SchedulerState& st) {
  return st.draft_snapshot ? st.draft_snapshot->speculative_num_draft_tokens.value_or(1) : 1;
}

// Moves queued requests into the batch while the KV budget and max_running_requests allow.
void admit(Self self) {
  auto& st = self->state;
  while (!st.queue.empty() && static_cast<std::int64_t>(st.running.size()) < st.target_snapshot->max_running_requests) {
    Req& r = *st.queue.front();
    if (r.reserved_pages > st.free_pages) break;  // wait for pages (FIFO: no request is overtaken)
    st.free_pages -= r.reserved_pages;
    st.running.push_back(std::move(st.queue.front()));
    st.queue.pop_front();
  }
}

void on_step_result(Self self, StepResult& res, Clock::time_point sent) {
  auto& st = self->state;
  st.metrics.step_wall_ms += ms_between(sent, Clock::now());
  st.metrics.step_compute_ms += res.compute_ms;
  ++st.metrics.steps;
  for (auto& item : res.items) {
    auto it = std::find_if(st.running.begin(), st.running.end(), [&](auto& r) { return r->sub->id == item.req; });
    if (it == st.running.end()) continue;
    Req& r = **it;
    r.in_step = false;
    if (!item.hidden.empty()) {
      const std::size_t width = st.needs.hidden_layers.size() * static_cast<std::size_t>(st.info->info.hidden_size);
      if (r.hidden.empty()) r.hidden_first = r.hidden_rows;
      r.hidden.insert(r.hidden.end(), item.hidden.begin(), item.hidden.end());
      if (width > 0) r.hidden_rows += static_cast<std::int64_t>(item.hidden.size() / width);
    }
    if (item.kv_length > 0) {
      r.kv_pages = std::move(item.kv_pages);
      r.kv_length = item.kv_length;
    }
    std::string reason;
    if (r.prefilled < r.prompt_len) {
      r.prefilled += r.chunk;
      r.chunk = 0;
      if (!item.tokens.empty()) reason = emit(self, r, item.tokens);
    } else {
      ++r.m.steps;
      ++st.metrics.decode_steps;
      if (st.draft_snapshot && r.sub->request.speculative) ++st.metrics.speculative_steps;
      r.m.drafted += item.drafted;
      r.m.accepted += item.accepted;
      st.metrics.drafted += item.drafted;
      st.metrics.accepted += item.accepted;
      auto& da = st.metrics.drafted_at;
      auto& aa = st.metrics.accepted_at;
      if (static_cast<std::int32_t>(da.size()) < r.draft_depth) da.resize(static_cast<std::size_t>(r.draft_depth), 0);
      if (static_cast<std::int32_t>(aa.size()) < item.accepted) aa.resize(static_cast<std::size_t>(item.accepted), 0);
      for (std::int32_t d = 0; d < r.draft_depth; ++d) ++da[static_cast<std::size_t>(d)];
      for (std::int32_t d = 0; d < item.accepted; ++d) ++aa[static_cast<std::size_t>(d)];
      r.draft_depth = 0;
      reason = emit(self, r, item.tokens);
    }
    if (r.cancelled) reason = "cancelled";
    if (!reason.empty()) {
      retire(self, r, reason);
      st.running.erase(it);
    }
  }
  st.busy = false;
  tick(self);
}

void run_step(Self self, StepBatch batch) {
  const auto sent = Clock::now();
  const std::uint64_t epoch = self->state.epoch;
  if (!self->state.target) {  // gone while a proposal was out: fail_everything has run
    self->state.busy = false;
    return;
  }
  self->request(self->state.target, caf::infinite, step_atom::value, std::move(batch))
      .then(
          [self, sent, epoch](StepResult& res) {
            if (self->state.epoch == epoch) on_step_result(self, res, sent);
          },
          [self, epoch](caf::error& err) {
            if (self->state.epoch != epoch) return;
            const std::string msg = "target step failed: " + self->system().render(err);
            spdlog::error("{}", msg);
            auto& st = self->state;
            // The step's requests cannot continue; the others can.
            for (auto it = st.running.begin(); it != st.running.end();) {
              if ((*it)->in_step) {
                retire(self, **it, "error", msg);
                it = st.running.erase(it);
              } else {
                ++it;
              }
            }
            st.busy = false;
            tick(self);
          });
}

void tick(Self self) {
  auto& st = self->state;
  if (st.busy || !st.ready || !st.target_error.empty()) return;
  // Drop cancelled requests between steps.
  for (auto it = st.running.begin(); it != st.running.end();) {
    if ((*it)->cancelled) {
      retire(self, **it, "cancelled");
      it = st.running.erase(it);
    } else {
      ++it;
    }
  }
  admit(self);
  if (st.running.empty()) {
    st.metrics.running = 0;
    st.metrics.queued = static_cast<std::int64_t>(st.queue.size());
    return;
  }
  StepBatch batch;
  batch.capture = st.needs.hidden_layers;
  std::vector<Req*> decoding;
  std::int64_t prefill_budget = st.target_snapshot->chunked_prefill_size;
  const std::int64_t ctx = *st.target_snapshot->context_length;
  for (auto& rp : st.running) {
    Req& r = *rp;
    StepItem item;
    item.req = r.sub->id;
    item.params = r.sub->request.sampling;
    item.seed = r.seed;
    if (st.draft && r.sub->request.speculative) {
      item.want_hidden = !st.needs.hidden_layers.empty();
      item.want_kv = st.needs.target_kv;
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
      if (r.sub->request.speculative) decoding.push_back(&r);
    }
    r.in_step = true;
    batch.items.push_back(std::move(item));
  }
  st.metrics.running = static_cast<std::int64_t>(st.running.size());
  st.metrics.queued = static_cast<std::int64_t>(st.queue.size());
  if (batch.items.empty()) return;
  st.busy = true;

  const bool speculative = st.draft_snapshot != nullptr;
  if (!speculative || decoding.empty()) {
    run_step(self, std::move(batch));
    return;
  }
  if (!st.draft) {  // the drafter is gone: plain decoding, counted
    st.metrics.fallback_steps += static_cast<std::int64_t>(decoding.size());
    for (Req* r : decoding) ++r->m.fallbacks;
    run_step(self, std::move(batch));
    return;
  }
  ProposeBatch pb;
  std::vector<std::int32_t> limits;  // max depth per request: what may still be emitted and fit the context
  const auto steps = static_cast<std::int32_t>(st.draft_snapshot->speculative_num_steps.value_or(1));
  for (Req* r : decoding) {
    const std::int64_t remaining = r->max_new - static_cast<std::int64_t>(r->generated.size());
    const std::int64_t room = ctx - static_cast<std::int64_t>(r->seq.size());
    const auto depth =
        static_cast<std::int32_t>(std::max<std::int64_t>(0, std::min<std::int64_t>({steps, remaining - 1, room})));
    const auto nodes = depth == 0 ? 0 : static_cast<std::int32_t>(draft_tokens(st) - 1);
    limits.push_back(depth);
    pb.items.push_back({r->sub->id, std::make_shared<const std::vector<std::int32_t>>(r->seq), nodes, depth,
                        r->sub->request.sampling, r->seed, std::move(r->hidden), r->hidden_first, r->kv_pages,
                        r->kv_length});
    r->hidden.clear();
  }
  const auto sent = Clock::now();
  std::vector<std::uint64_t> ids;  // not Req*: a request may be retired before the reply comes
  for (Req* r : decoding) ids.push_back(r->sub->id);
  const std::uint64_t epoch = st.epoch;
  self->request(st.draft, caf::infinite, propose_atom::value, std::move(pb))
      .then(
          [self, batch, ids, limits, sent, epoch](Proposals& p) mutable {
            auto& s = self->state;
            if (s.epoch != epoch) return;
            s.metrics.draft_ms += ms_between(sent, Clock::now());
            for (std::size_t i = 0; i < ids.size() && i < p.tokens.size(); ++i) {
              Req* req = find_running(s, ids[i]);
              if (!req) continue;
              const auto& toks = p.tokens[i];
              const auto& pars = p.parents[i];
              // Keep only well-formed nodes within the depth limit (a drafter bug must not reach the target).
              std::vector<std::int32_t> depth(toks.size(), 0), keep_index(toks.size(), -1);
              std::vector<std::int32_t> kept_tokens, kept_parents;
              for (std::size_t j = 0; j < toks.size() && j < pars.size(); ++j) {
                const std::int32_t par = pars[j];
                if (par >= static_cast<std::int32_t>(j) || (par >= 0 && keep_index[static_cast<std::size_t>(par)] < 0))
                  continue;
                depth[j] = par < 0 ? 1 : depth[static_cast<std::size_t>(par)] + 1;
                if (depth[j] > limits[i] || static_cast<std::int64_t>(kept_tokens.size()) + 1 >= config::kMaxTreeTokens)
                  continue;
                keep_index[j] = static_cast<std::int32_t>(kept_tokens.size());
                kept_tokens.push_back(toks[j]);
                kept_parents.push_back(par < 0 ? -1 : keep_index[static_cast<std::size_t>(par)]);
              }
              std::int32_t max_depth = 0;
              for (std::size_t j = 0; j < toks.size(); ++j)
                if (keep_index[j] >= 0) max_depth = std::max(max_depth, depth[j]);
              req->draft_depth = max_depth;
              // Sampled drafts keep their q rows only when the whole chain was kept.
              const bool whole_chain = kept_tokens.size() == toks.size();
              for (auto& item : batch.items)
                if (item.req == ids[i]) {
                  item.tokens.insert(item.tokens.end(), kept_tokens.begin(), kept_tokens.end());
                  item.parents = std::move(kept_parents);
                  if (whole_chain && i < p.probs.size()) item.draft_probs = std::move(p.probs[i]);
                }
            }
            run_step(self, std::move(batch));
          },
          [self, batch, ids, epoch](caf::error& err) mutable {
            auto& s = self->state;
            if (s.epoch != epoch) return;
            // The draft worker failed mid-step: this step runs without drafts.
            spdlog::warn("draft proposal failed ({}); decoding without drafts", self->system().render(err));
            s.metrics.fallback_steps += static_cast<std::int64_t>(ids.size());
            for (std::uint64_t id : ids)
              if (Req* r = find_running(s, id)) ++r->m.fallbacks;
            run_step(self, std::move(batch));
          });
}

void spawn_draft(Self self) {
  auto& st = self->state;
  if (!st.draft_snapshot || !st.info) return;
  DrafterFactory factory;
  try {
    factory = find_drafter(st.draft_snapshot);
  } catch (const std::exception& e) {
    spdlog::error("{}; decoding without a drafter", e.what());
    ++st.metrics.draft_failures;
    st.metrics.draft_error = e.what();
    return;
  }
  // The factory and the worker get the very snapshot object derived above.
  st.draft = self->spawn<caf::detached + caf::monitored>(
      draft_worker, st.draft_snapshot, std::move(factory),
      DraftContext{st.info->info, st.info->tokenizer, st.info->weights, st.info->kv});
  st.metrics.draft_alive = true;
}

void announce_ready(Self self) {
  auto& st = self->state;
  st.metrics.algorithm = std::string(config::to_string(st.target_snapshot->speculative_algorithm));
  for (auto& rp : st.ready_waiters) rp.deliver(*st.info);
  st.ready_waiters.clear();
  st.ready = true;
  tick(self);
}

void on_target_ready(Self self, TargetInfo& info) {
  auto& st = self->state;
  st.info = info;
  st.total_pages = st.free_pages = info.kv_capacity_tokens / info.page_size;
  if (st.target_snapshot->speculative_algorithm == config::SpecAlgorithm::None) {
    announce_ready(self);
    return;
  }
  // Derived once, from the resolved target snapshot and the model the worker actually loaded.
  st.draft_snapshot = config::derive_draft(st.target_snapshot, info.info.facts());
  spawn_draft(self);
  if (!st.draft) {
    announce_ready(self);
    return;
  }
  // Ready once the draft worker is up (or has failed: then the engine decodes without drafts).
  self->request(st.draft, caf::infinite, needs_atom::value)
      .then(
          [self](DrafterNeeds& n) {
            self->state.needs = std::move(n);
            announce_ready(self);
          },
          [self](caf::error&) {
            // The worker went down before answering (its drafter could not be built). Announce once
            // its down message is recorded, so whoever waited for `ready` sees the reason in the metrics.
            if (self->state.draft)
              self->state.ready_on_draft_down = true;
            else
              announce_ready(self);
          });
}

scheduler_actor::behavior_type scheduler(scheduler_actor::stateful_pointer<SchedulerState> self,
                                         config::Snapshot target) {
  auto& st = self->state;
  st.target_snapshot = std::move(target);
  st.target = self->spawn<caf::detached + caf::monitored>(target_worker, st.target_snapshot);
  // A bug in a handler must not leave callers waiting: every request gets its final (error) event
  // before the scheduler stops.
  self->set_exception_handler([self](caf::scheduled_actor*, std::exception_ptr& eptr) -> caf::error {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(eptr);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    const std::string msg = "internal error in the scheduler: " + what;
    spdlog::error("{}", msg);
    fail_everything(self, msg);
    auto& s = self->state;
    for (auto& rp : s.ready_waiters) rp.deliver(internal_error(msg));
    s.ready_waiters.clear();
    if (s.draft) self->send_exit(s.draft, caf::exit_reason::user_shutdown);
    if (s.target) self->send_exit(s.target, caf::exit_reason::user_shutdown);
    return internal_error(msg);
  });
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& s = self->state;
    if (s.draft && dm.source == caf::actor_cast<caf::actor_addr>(s.draft)) {
      spdlog::warn("draft worker went down ({}); running requests continue without drafts",
                   self->system().render(dm.reason));
      s.draft = nullptr;
      ++s.metrics.draft_failures;
      s.metrics.draft_alive = false;
      s.metrics.draft_error = self->system().render(dm.reason);
      if (s.ready_on_draft_down) {
        s.ready_on_draft_down = false;
        announce_ready(self);
      }
      return;
    }
    if (s.target && dm.source == caf::actor_cast<caf::actor_addr>(s.target)) {
      s.target = nullptr;
      if (dm.reason == caf::exit_reason::user_shutdown || dm.reason == caf::exit_reason::normal) return;
      s.target_error = "target worker failed: " + self->system().render(dm.reason);
      s.metrics.target_error = s.target_error;
      spdlog::error("{}", s.target_error);
      fail_everything(self, s.target_error);
      s.target_failure = internal_error(s.target_error);
      for (auto& rp : s.ready_waiters) rp.deliver(s.target_failure);
      s.ready_waiters.clear();
    }
  });
  self->set_exit_handler([self](caf::exit_msg& msg) {
    auto& s = self->state;
    fail_everything(self, "the engine shut down");
    if (s.draft) self->send_exit(s.draft, msg.reason);
    if (s.target) self->send_exit(s.target, msg.reason);
    self->quit(msg.reason);
  });
  self->request(st.target, caf::infinite, info_atom::value)
      .then([self](TargetInfo& info) { on_target_ready(self, info); },
            [self](caf::error& err) {
              auto& s = self->state;
              s.target_error = error_message(err);
              s.target_failure = err;
              s.metrics.target_error = s.target_error;
              fail_everything(self, s.target_error);
              for (auto& rp : s.ready_waiters) rp.deliver(err);
              s.ready_waiters.clear();
            });

  return {
      [self](ready_atom) -> caf::result<TargetInfo> {
        auto& s = self->state;
        if (s.ready) return *s.info;
        if (!s.target_error.empty()) return s.target_failure ? s.target_failure : internal_error(s.target_error);
        auto rp = self->make_response_promise<TargetInfo>();
        s.ready_waiters.push_back(rp);
        return rp;
      },
      [self](submit_atom, std::shared_ptr<const Submission>& sub) {
        auto& s = self->state;
        ++s.metrics.requests_submitted;
        auto r = std::make_unique<Req>();
        r->sub = sub;
        r->seq = sub->prompt;
        r->prompt_len = sub->prompt.size();
        r->submitted = Clock::now();
        r->seed = sub->request.seed.value_or(static_cast<std::uint64_t>(s.target_snapshot->random_seed));
        if (s.info && s.info->tokenizer) r->decoder = std::make_unique<model::StreamDecoder>(*s.info->tokenizer);
        const std::int64_t ctx = *s.target_snapshot->context_length;
        std::string error;
        if (!s.target_error.empty())
          error = s.target_error;
        else if (r->prompt_len == 0)
          error = "prompt: is empty (at least one token is needed)";
        else if (static_cast<std::int64_t>(r->prompt_len) >= ctx)
          error = "prompt: has " + std::to_string(r->prompt_len) +
                  " tokens; the context length (--context-length) is " + std::to_string(ctx) +
                  ", which must leave room for at least one new token";
        else if (sub->request.max_new_tokens < 1)
          error = "max_new_tokens must be >= 1 (got " + std::to_string(sub->request.max_new_tokens) + ")";
        if (error.empty()) {
          r->max_new =
              std::min<std::int64_t>(sub->request.max_new_tokens, ctx - static_cast<std::int64_t>(r->prompt_len));
          const std::int64_t page = s.target_snapshot->page_size;
          const std::int64_t need = static_cast<std::int64_t>(r->prompt_len) + r->max_new + draft_tokens(s);
          r->reserved_pages = (need + page - 1) / page;
          if (s.info && r->reserved_pages > s.total_pages)
            error = "the request needs " + std::to_string(need) + " tokens of KV cache but the cache holds " +
                    std::to_string(s.total_pages * page) + " (--max-total-tokens)";
        }
        if (!error.empty()) {
          r->reserved_pages = 0;
          retire(self, *r, "error", error, s.target_error.empty());
          return;
        }
        s.queue.push_back(std::move(r));
        tick(self);
      },
      [self](cancel_atom, std::uint64_t id) {
        auto& s = self->state;
        for (auto it = s.queue.begin(); it != s.queue.end(); ++it)
          if ((*it)->sub->id == id) {
            auto r = std::move(*it);
            s.queue.erase(it);
            r->reserved_pages = 0;  // never admitted
            retire(self, *r, "cancelled");
            return;
          }
        for (auto& r : s.running)
          if (r->sub->id == id) r->cancelled = true;
        tick(self);
      },
      [self](metrics_atom) -> EngineMetrics {
        auto& s = self->state;
        EngineMetrics m = s.metrics;
        m.running = static_cast<std::int64_t>(s.running.size());
        m.queued = static_cast<std::int64_t>(s.queue.size());
        m.mean_accepted_length =
            m.speculative_steps > 0 ? static_cast<double>(m.accepted + m.speculative_steps) / m.speculative_steps : 0.0;
        m.acceptance_rate = m.drafted > 0 ? static_cast<double>(m.accepted) / m.drafted : 0.0;
        m.draft_alive = static_cast<bool>(s.draft);
        return m;
      },
      [self](snapshot_atom) -> caf::result<SnapshotReport> {
        auto& s = self->state;
        auto rp = self->make_response_promise<SnapshotReport>();
        SnapshotReport base{s.target_snapshot, nullptr, s.draft_snapshot, nullptr};
        if (!s.target) {
          rp.deliver(base);
          return rp;
        }
        self->request(s.target, std::chrono::seconds(30), snapshot_atom::value)
            .then(
                [self, rp, base](config::Snapshot& t) mutable {
                  base.target_worker = t;
                  auto& s2 = self->state;
                  if (!s2.draft) {
                    rp.deliver(base);
                    return;
                  }
                  self->request(s2.draft, std::chrono::seconds(30), snapshot_atom::value)
                      .then(
                          [rp, base](config::Snapshot& d) mutable {
                            base.draft_worker = d;
                            rp.deliver(base);
                          },
                          [rp, base](caf::error&) mutable { rp.deliver(base); });
                },
                [rp](caf::error& e) mutable { rp.deliver(e); });
        return rp;
      },
      [self](reconf_atom, config::Snapshot& snap) {
        auto& s = self->state;
        s.draft_snapshot = snap;
        if (s.draft) self->send(s.draft, reconf_atom::value, snap);
      },
      [self](restart_atom) {
        if (!self->state.draft) spawn_draft(self);
      },
      [self](tick_atom) { tick(self); },
  };
}

}  // namespace

scheduler_actor spawn_scheduler(caf::actor_system& system, config::Snapshot target) {
  return system.spawn(scheduler, std::move(target));
}

}  // namespace specactor::actors
