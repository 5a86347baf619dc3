// sched/policy.cpp — the scheduling policy (see scheduler.hpp).
#include "sched/policy.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "config/server_args.hpp"

namespace specactor::sched {

namespace {

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

void notify(Sequence& r, TokenEvent ev) {
  ev.id = r.id();
  if (!r.sub->on_token) return;
  try {
    r.sub->on_token(ev);
  } catch (const std::exception& e) {
    spdlog::warn("request {}: the token callback threw: {}", r.id(), e.what());
  }
}

RequestMetrics finish_metrics(const Sequence& r) {
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

std::int64_t pages_for(std::int64_t tokens, std::int64_t page) { return (tokens + page - 1) / page; }

}  // namespace

// --- StopMatcher -----------------------------------------------------------------------------------

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string StopMatcher::push(const std::string& text) {
  if (stopped_) return {};
  held_ += text;
  std::size_t cut = std::string::npos;
  for (const auto& s : stops_) cut = std::min(cut, held_.find(s));
  if (cut != std::string::npos) {
    std::string out = held_.substr(0, cut);
    held_.clear();
    stopped_ = true;
    return out;
  }
  // Hold back the longest tail that is a proper prefix of a stop string.
  std::size_t keep = 0;
  for (const auto& s : stops_)
    for (std::size_t len = std::min(s.size() - 1, held_.size()); len > keep; --len)
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        keep = len;
        break;
      }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::flush() {
  std::string out = std::move(held_);
  held_.clear();
  return out;
}

// --- settings --------------------------------------------------------------------------------------

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

DraftShape draft_shape_of(const config::Snapshot& draft, drafters::DrafterNeeds needs) {
  DraftShape d;
  if (!draft) return d;
  d.configured = true;
  d.num_draft_tokens = draft->speculative_num_draft_tokens.value_or(1);
  d.num_steps = draft->speculative_num_steps.value_or(1);
  // A head drafter's prompt-lookup branch: up to this many more nodes, as deep as it is long.
  if (const std::int64_t branch = draft->speculative_draft_ngram_tokens.value_or(0); branch > 0) {
    d.num_draft_tokens += branch;
    d.num_steps = std::max(d.num_steps, branch);
  }
  if (const std::int64_t branch = draft->speculative_draft_suffix_tokens.value_or(0); branch > 0) {
    d.num_draft_tokens += branch;
    d.num_steps = std::max(d.num_steps, branch);
  }
  d.adaptive = draft->speculative_adaptive;
  d.needs = std::move(needs);
  return d;
}

// --- Scheduler -------------------------------------------------------------------------------------

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

void Scheduler::set_draft(DraftShape shape) { draft_ = std::move(shape); }

// Every request may use the cache. A head drafter catches up on the target's hidden rows of every
// position, and the target computes none for cached positions: so with such a drafter every cacheable
// request keeps its captured rows with its pages (keep_hidden), and a hit hands them out again.
bool Scheduler::cacheable(const Sequence&) const { return tree_ != nullptr; }

void Scheduler::make_room(std::int64_t need) {
  if (!tree_ || need <= free_pages_) return;
  std::vector<std::int32_t> gone = tree_->evict(need - free_pages_);
  if (gone.empty()) return;
  free_pages_ += static_cast<std::int64_t>(gone.size());
  metrics_.cache_evicted_pages += static_cast<std::int64_t>(gone.size());
  if (cache_sink_) cache_sink_({0, {}, std::move(gone)});
}

// A prompt just prefilled goes into the tree at once (its whole pages), so requests admitted with the
// same prefix meanwhile can start on it (rematch). The pages the tree takes are the cache's from now
// on: out of the request's reservation, locked while it runs.
void Scheduler::cache_prompt(Sequence& r) {
  if (!tree_ || !r.cacheable || r.kv_length < limits_.page_size ||
      r.kv_pages.size() * static_cast<std::size_t>(limits_.page_size) < static_cast<std::size_t>(r.kv_length))
    return;
  const auto n = static_cast<std::size_t>(r.kv_length / limits_.page_size);
  const std::vector<std::int32_t> pages(r.kv_pages.begin(), r.kv_pages.begin() + static_cast<std::ptrdiff_t>(n));
  const std::vector<bool> taken = tree_->insert(r.seq, pages);
  std::vector<std::int32_t> keep;
  for (std::size_t i = 0; i < n; ++i)
    if (taken[i]) keep.push_back(pages[i]);
  const PrefixTree::Match m = tree_->match(r.seq, static_cast<std::int64_t>(n) * limits_.page_size);
  tree_->lock(m.node);
  if (r.cache_node) tree_->unlock(r.cache_node);
  r.cache_node = m.node;
  r.reserved_pages -= static_cast<std::int64_t>(keep.size());
  if (!keep.empty() && cache_sink_) cache_sink_({r.id(), std::move(keep), {}});
}

// Before a request's first prompt chunk: a longer prefix may have been cached since its admission
// (a request with the same prompt prefilled meanwhile); it starts there instead.
void Scheduler::rematch(Sequence& r) {
  if (!tree_ || !r.cacheable || r.prefilled != static_cast<std::size_t>(r.cached_tokens) || r.prompt_len < 2) return;
  const auto limit = static_cast<std::int64_t>(r.prompt_len) - 1;
  PrefixTree::Match m = tree_->match(r.seq, limit);
  const PrefixTree::Partial part = tree_->partial(m, r.seq, limit);
  if (m.tokens + part.tokens <= r.cached_tokens) return;
  PrefixTree::Node* lock = part.tokens > 0 ? part.node : m.node;
  tree_->lock(lock);
  if (r.cache_node) tree_->unlock(r.cache_node);
  const auto gained = static_cast<std::int64_t>(m.pages.size() - r.cache_pages.size());
  r.reserved_pages -= gained;  // those pages are the cache's: the reservation gives them back
  free_pages_ += gained;
  metrics_.cache_hit_tokens += m.tokens + part.tokens - r.cached_tokens;
  take_hit(r, lock, std::move(m), part);
}

// The request starts on a cache hit: whole pages, then a partly matched page to copy (if any).
void Scheduler::take_hit(Sequence& r, PrefixTree::Node* lock, PrefixTree::Match m, const PrefixTree::Partial& part) {
  r.cache_node = lock;
  r.cache_pages = std::move(m.pages);
  r.copy_page = part.tokens > 0 ? part.page : -1;
  r.copy_len = part.tokens;
  r.cached_tokens = m.tokens + part.tokens;
  r.prefilled = static_cast<std::size_t>(r.cached_tokens);
  r.m.cached_tokens = r.cached_tokens;
}

std::int64_t Scheduler::flush_cache() {
  if (!tree_) return 0;
  std::vector<std::int32_t> gone = tree_->flush();
  const auto n = static_cast<std::int64_t>(gone.size());
  free_pages_ += n;
  metrics_.cache_evicted_pages += n;
  if (cache_sink_ && n > 0) cache_sink_({0, {}, std::move(gone)});
  return n;
}

bool Scheduler::probes_allowed(std::int64_t decoding) const {
  return feedback_.penalty(decoding) < 2.0 && accept_.level_prob(1, RequestAcceptance{}) >= 0.05;
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
  m.step_ms_1 = cost_.step_ms(1, 0);
  m.step_cost.clear();
  if (m.step_ms_1 > 0)
    for (std::int64_t k : {1, 2, 4, 8, 16, 32}) m.step_cost.push_back(cost_.relative(k, 0));
  return m;
}

void Scheduler::retire(Sequence& r, const std::string& reason, const std::string& error, bool invalid_request) {
  TokenEvent ev;
  if (r.decoder) {
    ev.text = r.stops.flush();
    if (!r.stops.stopped()) ev.text += r.decoder->finish();  // after a stop string nothing more is shown
  }
  ev.finished = true;
  ev.finish_reason = reason;
  ev.error = error;
  ev.invalid_request = invalid_request;
  ev.metrics = finish_metrics(r);
  notify(r, std::move(ev));
  // The prefix cache takes what the request computed (whole pages of its committed KV); those of its
  // pages it keeps stay in use, the rest return with the request's reservation.
  std::vector<std::int32_t> keep;
  bool insert =
      tree_ && r.cacheable && reason != "error" && r.kv_length >= limits_.page_size &&
      r.kv_pages.size() * static_cast<std::size_t>(limits_.page_size) >= static_cast<std::size_t>(r.kv_length);
  if (insert) {
    const auto n = static_cast<std::size_t>(r.kv_length / limits_.page_size);
    const std::vector<std::int32_t> pages(r.kv_pages.begin(), r.kv_pages.begin() + static_cast<std::ptrdiff_t>(n));
    try {  // the tree checks its arguments before it changes: a refusal leaves it as it was
      const std::vector<bool> taken = tree_->insert(r.seq, pages);
      for (std::size_t i = 0; i < n; ++i)
        if (taken[i]) keep.push_back(pages[i]);
    } catch (const std::exception& e) {
      spdlog::error("internal error: the prefix cache refused request {}'s pages ({}); they are freed", r.id(),
                    e.what());
      insert = false;
    }
  }
  if (r.cache_node) tree_->unlock(r.cache_node);
  r.cache_node = nullptr;
  std::vector<std::int32_t> drop;
  if (insert && r.kv_length % limits_.page_size != 0) {
    // The partly filled last page becomes the tail of the node its whole pages end at: the next turn
    // of a conversation copies it instead of prefilling those tokens again.
    const auto whole = static_cast<std::size_t>(r.kv_length / limits_.page_size);
    const PrefixTree::Match m = tree_->match(r.seq, static_cast<std::int64_t>(whole) * limits_.page_size);
    if (m.tokens == static_cast<std::int64_t>(whole) * limits_.page_size && r.kv_pages.size() > whole) {
      PrefixTree::Tail t =
          tree_->set_tail(m.node,
                          std::vector<std::int32_t>(r.seq.begin() + static_cast<std::ptrdiff_t>(m.tokens),
                                                    r.seq.begin() + static_cast<std::ptrdiff_t>(r.kv_length)),
                          r.kv_pages[whole]);
      if (t.taken) keep.push_back(r.kv_pages[whole]);
      drop = std::move(t.gone);
      free_pages_ += static_cast<std::int64_t>(drop.size());
      metrics_.cache_evicted_pages += static_cast<std::int64_t>(drop.size());
    }
  }
  if ((!keep.empty() || !drop.empty()) && cache_sink_) cache_sink_({r.id(), keep, drop});
  if (release_) release_(r.id());
  free_pages_ += r.reserved_pages - static_cast<std::int64_t>(keep.size());
  r.reserved_pages = 0;
  if (reason == "error")
    ++metrics_.requests_failed;
  else if (reason == "cancelled")
    ++metrics_.requests_cancelled;
  else
    ++metrics_.requests_finished;
}

std::string Scheduler::refusal(const Sequence& r) const {
  const std::int64_t ctx = limits_.context_length;
  const auto& g = r.sub->request;
  if (r.prompt_len == 0) return "prompt: is empty (at least one token is needed)";
  if (static_cast<std::int64_t>(r.prompt_len) >= ctx)
    return "prompt: has " + std::to_string(r.prompt_len) + " tokens; the context length (--context-length) is " +
           std::to_string(ctx) + ", which must leave room for at least one new token";
  if (g.max_new_tokens < 1) return "max_new_tokens must be >= 1 (got " + std::to_string(g.max_new_tokens) + ")";
  if (target_known_) {
    const std::int64_t need = r.need_tokens + draft_.num_draft_tokens;
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
  r->stops = StopMatcher(g.stop);
  if (tokenizer_) r->decoder = std::make_unique<model::StreamDecoder>(*tokenizer_);
  r->max_new = std::max<std::int64_t>(
      0, std::min<std::int64_t>(g.max_new_tokens, limits_.context_length - static_cast<std::int64_t>(r->prompt_len)));
  r->need_tokens = static_cast<std::int64_t>(r->prompt_len) + r->max_new;
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
    // The longest cached prefix in whole pages, leaving at least the last prompt token to prefill
    // (its logits start the answer); the request runs on those pages, locked against eviction.
    // A partly matched page after them is copied into a page of the request's own (its reservation
    // holds it); the page it copies from stays locked until the request's prompt is cached.
    PrefixTree::Match hit;
    PrefixTree::Partial part;
    PrefixTree::Node* lock = nullptr;
    r.cacheable = cacheable(r);
    if (r.cacheable && r.prompt_len > 1) {
      const auto limit = static_cast<std::int64_t>(r.prompt_len) - 1;
      hit = tree_->match(r.seq, limit);
      part = tree_->partial(hit, r.seq, limit);
      lock = part.tokens > 0 ? part.node : hit.node;
      tree_->lock(lock);
    }
    const std::int64_t pages = pages_for(r.need_tokens + draft_.num_draft_tokens, limits_.page_size) -
                               static_cast<std::int64_t>(hit.pages.size());
    make_room(pages);
    if (pages > free_pages_) {
      if (lock) tree_->unlock(lock);
      break;
    }
    free_pages_ -= pages;
    r.reserved_pages = pages;
    if (r.cacheable) {
      metrics_.cache_query_tokens += static_cast<std::int64_t>(r.prompt_len);
      metrics_.cache_hit_tokens += hit.tokens + part.tokens;
      take_hit(r, lock, std::move(hit), part);
    }
    if (!r.decoder && tokenizer_) r.decoder = std::make_unique<model::StreamDecoder>(*tokenizer_);
    running_.push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
}

// Appends accepted tokens, streams them, and checks the stop conditions. Returns the finish reason
// ("" while the request goes on).
std::string Scheduler::emit(Sequence& r, const std::vector<std::int32_t>& tokens) {
  const GenerationRequest& g = r.sub->request;
  TokenEvent ev;
  std::string reason;
  for (std::int32_t t : tokens) {
    if (!g.ignore_eos && tokenizer_ && tokenizer_->is_end_of_generation(t)) {
      reason = "stop";
      break;
    }
    if (r.generated.empty()) r.first_token = Clock::now();
    r.generated.push_back(t);
    r.seq.push_back(t);
    ev.tokens.push_back(t);
    if (r.decoder) {
      ev.text += r.stops.push(r.decoder->push(t));
      if (r.stops.stopped()) {  // a stop string ends the request; its text is not part of the output
        reason = "stop";
        break;
      }
    }
    ++metrics_.generated_tokens;
    if (static_cast<std::int64_t>(r.generated.size()) >= r.max_new) {
      reason = "length";
      break;
    }
  }
  if (!ev.tokens.empty() || !ev.text.empty()) notify(r, std::move(ev));
  return reason;
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
    item.seed = r.seed;
    if (draft_alive && g.speculative) {
      item.want_hidden = !draft_.needs.hidden_layers.empty();
      item.want_kv = draft_.needs.target_kv;
    }
    if (r.prefilled < r.prompt_len && prefill_budget > 0) rematch(r);
    if (r.cacheable) {
      item.want_kv = true;  // the page table the cache takes pages from
      item.keep_hidden = !plan.batch.capture.empty();
    }
    if (r.cached_tokens > 0 && r.prefilled == static_cast<std::size_t>(r.cached_tokens)) {
      // The first chunk after a cache hit: the target starts the request on the cached pages.
      item.prefix_pages = r.cache_pages;
      item.prefix_len = r.cached_tokens - r.copy_len;
      item.copy_page = r.copy_page;
      item.copy_len = r.copy_len;
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
  return plan;
}

// How deep each decoding request drafts: the shape's limit, or with the budget what pays (0: the
// request decodes plainly this step, unless it is due for a probe).
void Scheduler::plan_drafts(StepPlan& plan, const std::vector<Sequence*>& decoding) {
  std::vector<std::int32_t> limit;
  std::vector<DepthAsk> asks;
  const double penalty = feedback_.penalty(plan.decoding);
  // Probes only where drafting could pay at this batch size (probe_pays); where it cannot, now and
  // then one (ProbeGate). Drafting is judged against what the decoding rows alone would deliver
  // (plan_depths: a prompt chunk in the step is not a reason to verify more).
  const auto dec = static_cast<double>(plan.decoding);
  std::int64_t probe_quota = std::numeric_limits<std::int64_t>::max();
  bool pays = true;
  std::int64_t every = 0;
  if (draft_.adaptive) {
    bool due = false;
    for (const Sequence* r : decoding) due = due || probe_due(r->acc);
    pays = probe_pays(static_cast<std::int32_t>(std::max<std::int64_t>(1, draft_.num_steps)), plan.base_rows, dec,
                      plan.mean_context, cost_, plan.decoding);
    every = probe_every(cost_, plan.base_rows, plan.mean_context, plan.decoding);
    probe_quota = probe_gate_.quota(pays, due, every);
  }
  for (Sequence* r : decoding) {
    // Depth: what may still be emitted (the bonus token is the last) and what fits the context.
    const std::int64_t remaining = r->max_new - static_cast<std::int64_t>(r->generated.size());
    const std::int64_t room = limits_.context_length - static_cast<std::int64_t>(r->seq.size());
    limit.push_back(static_cast<std::int32_t>(
        std::max<std::int64_t>(0, std::min<std::int64_t>({draft_.num_steps, remaining - 1, room}))));
    DepthAsk a;
    a.max_depth = limit.back();
    // A probe only where speculating has not measured as a loss for this batch size and where the
    // engine's record over all requests does not say a first draft is mostly wasted.
    // A request whose last verified draft was accepted whole may be probed whatever the record says.
    // Where probing cannot pay, a request whose drafter has not yet taken in its prompt is not probed:
    // its first round would catch the head up on every prompt row (measured: long grounded prompts
    // read 0.91-0.94x plain with drafting otherwise off, one probe each).
    const std::size_t width = draft_.needs.hidden_layers.size() * static_cast<std::size_t>(hidden_size_);
    const bool priming_cheap = r->drafter_primed || width == 0 || r->hidden.size() / width <= kProbePrimingRows;
    a.probe = probe_due(r->acc) && probe_quota > 0 && (probes_allowed(plan.decoding) || r->acc.last_whole) &&
              (pays || priming_cheap);
    if (a.probe) --probe_quota;
    // The selection after drafting verifies the likeliest node of a level, mostly; nothing when the
    // drafter proposes nothing.
    const double q = accept_.propose_prob(r->acc);
    a.rows_per_level = q;
    for (std::int32_t d = 1; d <= a.max_depth; ++d) a.level_probs.push_back(q * accept_.level_prob(d, r->acc));
    asks.push_back(std::move(a));
  }
  std::vector<std::int32_t> depth = limit;
  // A draft round that costs under 2 % of the step at full depth (prompt lookup on a busy step) runs
  // whole: the node selection after it decides what is verified, from the proposals' own scores.
  const double one_row = cost_.step_ms(1, plan.mean_context);
  std::int64_t full = 0;
  for (auto l : limit) full += l;
  const bool cheap =
      cost_.draft_rounds() > 0 && cost_.draft_ms(full) <= 0.02 * cost_.step_ms(plan.base_rows, plan.mean_context);
  if (draft_.adaptive && !cheap)
    depth = plan_depths(asks, plan.base_rows, dec, plan.mean_context, cost_, penalty, plan.decoding);
  // Measuring: a decode step without drafts now and then, so the feedback knows the plain rate.
  const bool explore = draft_.adaptive && !plan.prefill && feedback_.want_plain(plan.decoding);
  if (explore) depth.assign(depth.size(), 0);
  if (spdlog::should_log(spdlog::level::trace))
    for (std::size_t i = 0; i < asks.size(); ++i)
      spdlog::trace(
          "budget: request {} depth {} of {}{} (P(level) {:.2f} {:.2f} {:.2f}, P(proposes) {:.2f}; step of {} rows ({} "
          "decoding) "
          "{:.2f} ms, one more {:.2f}, one row {:.2f}, draft level {:.2f} ms, {} {:.2f} ms, penalty {:.2f}; "
          "probes {})",
          decoding[i]->id(), depth[i], limit[i], asks[i].probe ? " probe" : "",
          asks[i].level_probs.size() > 0 ? asks[i].level_probs[0] : 0.0,
          asks[i].level_probs.size() > 1 ? asks[i].level_probs[1] : 0.0,
          asks[i].level_probs.size() > 2 ? asks[i].level_probs[2] : 0.0, asks[i].rows_per_level, plan.base_rows,
          decoding.size(), cost_.step_ms(plan.base_rows, plan.mean_context),
          cost_.step_ms(plan.base_rows, plan.mean_context) +
              cost_.extra_ms(plan.base_rows, plan.base_rows + 1, plan.mean_context),
          one_row, cost_.draft_ms(1), limit[i], cost_.draft_ms(limit[i]), penalty,
          pays ? std::string("pay") : "held, one in " + std::to_string(every) + " steps");
  bool chosen = false;  // a draft the arithmetic chose, not only probes
  for (std::size_t i = 0; i < decoding.size(); ++i) {
    Sequence* r = decoding[i];
    if (limit[i] > 0 && !explore) note_plan(r->acc, asks[i].probe, depth[i]);
    if (depth[i] > 0 && !(asks[i].probe && depth[i] == 1)) chosen = true;
    if (depth[i] <= 0) {
      if (limit[i] > 0) {  // the budget's choice, not the end of the request
        ++metrics_.budget_skipped_steps;
        ++r->m.budget_skipped;
      }
      continue;
    }
    plan.draft_levels += depth[i];
    plan.priming = plan.priming || !r->drafter_primed;
    r->drafter_primed = true;
    if (const std::size_t width = draft_.needs.hidden_layers.size() * static_cast<std::size_t>(hidden_size_); width > 0)
      plan.catch_up_rows += static_cast<std::int64_t>(r->hidden.size() / width);
    plan.depth_limits.push_back(depth[i]);
    plan.proposal_ids.push_back(r->id());
    plan.proposals.items.push_back({r->id(), std::make_shared<const std::vector<std::int32_t>>(r->seq),
                                    static_cast<std::int32_t>(draft_.num_draft_tokens - 1), depth[i],
                                    r->sub->request.sampling, r->seed, std::move(r->hidden), r->hidden_first,
                                    r->kv_pages, r->kv_length});
    r->hidden.clear();
  }
  plan.probes_only = plan.draft_levels > 0 && !chosen;
}

bool Scheduler::apply_proposals(StepPlan& plan, Proposals& p) {
  if (stale(plan)) return false;
  const double draft_ms = ms_between(plan.started, now_());
  metrics_.draft_ms += draft_ms;
  cost_.observe_draft(plan.draft_levels, draft_ms, plan.priming);
  metrics_.draft_cache_query_tokens = p.cache.query_tokens;
  metrics_.draft_cache_hit_tokens = p.cache.hit_tokens;
  metrics_.draft_cache_pages = p.cache.pages;
  metrics_.draft_cache_evicted_pages = p.cache.evicted_pages;
  const auto& ids = plan.proposal_ids;
  // Keep only well-formed nodes (parents before children) within the depth and tree limits: a
  // drafter bug must not reach the target. Then the acceptance model's probability of each.
  struct Kept {
    Sequence* req = nullptr;
    std::vector<std::int32_t> tokens, parents, depth;
    std::vector<float> scores;
    std::vector<double> prob;
  };
  std::vector<Kept> kept(ids.size());
  std::vector<Candidate> cands;
  std::vector<std::int32_t> depth, keep_index;  // per proposal node (reused)
  for (std::size_t i = 0; i < ids.size() && i < p.tokens.size() && i < p.parents.size(); ++i) {
    Kept& k = kept[i];
    k.req = find_running(ids[i]);
    if (!k.req) continue;  // retired while the proposal was out
    const auto& toks = p.tokens[i];
    const auto& pars = p.parents[i];
    const std::vector<float>* scores =
        i < p.scores.size() && p.scores[i].size() == toks.size() ? &p.scores[i] : nullptr;
    depth.assign(toks.size(), 0);
    keep_index.assign(toks.size(), -1);
    for (std::size_t j = 0; j < toks.size() && j < pars.size(); ++j) {
      const std::int32_t par = pars[j];
      if (par < -1 || par >= static_cast<std::int32_t>(j) ||
          (par >= 0 && keep_index[static_cast<std::size_t>(par)] < 0))
        continue;
      depth[j] = par < 0 ? 1 : depth[static_cast<std::size_t>(par)] + 1;
      if (depth[j] > plan.depth_limits[i] || static_cast<std::int64_t>(k.tokens.size()) + 1 >= config::kMaxTreeTokens)
        continue;
      const std::int32_t kp = par < 0 ? -1 : keep_index[static_cast<std::size_t>(par)];
      const float sc = scores ? (*scores)[j] : -1.0f;
      double pr = accept_.node_prob(sc, depth[j], k.req->acc);
      if (kp >= 0) pr = std::min(pr, k.prob[static_cast<std::size_t>(kp)]);  // never likelier than its parent
      keep_index[j] = static_cast<std::int32_t>(k.tokens.size());
      cands.push_back({i, keep_index[j], kp, pr});
      k.tokens.push_back(toks[j]);
      k.parents.push_back(kp);
      k.depth.push_back(depth[j]);
      k.scores.push_back(sc);
      k.prob.push_back(pr);
    }
    accept_.observe_round(!k.tokens.empty(), k.req->acc);  // whether this round brought anything to verify
  }
  // The budget: which of those nodes the target verifies (all of them with a fixed shape).
  std::vector<bool> verify(cands.size(), true);
  if (draft_.adaptive)
    verify = select_nodes(cands, plan.base_rows, static_cast<double>(plan.decoding), plan.mean_context, cost_, draft_ms,
                          feedback_.penalty(plan.decoding), plan.decoding);
  plan.draft_ms = draft_ms;
  if (spdlog::should_log(spdlog::level::trace)) {
    std::string t;
    for (std::size_t c = 0; c < cands.size(); ++c) t += fmt::format(" {:.2f}{}", cands[c].prob, verify[c] ? "+" : "-");
    spdlog::trace("selection (P(accepted), + verified):{}; draft round {:.2f} ms, penalty {:.2f}", t, draft_ms,
                  feedback_.penalty(plan.decoding));
  }
  std::vector<std::vector<bool>> chosen(kept.size());
  for (std::size_t i = 0; i < kept.size(); ++i) chosen[i].assign(kept[i].tokens.size(), false);
  for (std::size_t c = 0; c < cands.size(); ++c)
    chosen[cands[c].request][static_cast<std::size_t>(cands[c].index)] = verify[c];
  // A request whose proposals the budget keeps declining gets its likeliest first node verified now
  // and then (at doubling intervals), so its own acceptance is measured and it can come back. A
  // probe's is verified always: a probe exists to measure, and one the selection declined measured
  // neither the acceptance nor what a verified row costs now (rows once dear, cheap since, stayed
  // dear in the cost model for hundreds of steps).
  if (draft_.adaptive)
    for (std::size_t i = 0; i < kept.size(); ++i) {
      Kept& k = kept[i];
      if (!k.req || k.tokens.empty()) continue;
      RequestAcceptance& a = k.req->acc;
      if (std::find(chosen[i].begin(), chosen[i].end(), true) != chosen[i].end()) {
        a.unverified_steps = 0;
        a.verify_probe_interval = 4;
        continue;
      }
      if ((++a.unverified_steps < a.verify_probe_interval || !probes_allowed(plan.decoding)) && !a.probing) continue;
      std::size_t best = k.tokens.size();
      for (std::size_t j = 0; j < k.tokens.size(); ++j)
        if (k.parents[j] < 0 && (best == k.tokens.size() || k.prob[j] > k.prob[best])) best = j;
      if (best == k.tokens.size() || k.prob[best] < 0.02) continue;
      chosen[i][best] = true;
      a.unverified_steps = 0;
      a.verify_probe_interval = std::min<std::int64_t>(64, 2 * a.verify_probe_interval);
    }
  std::int64_t added = 0;
  for (std::size_t i = 0; i < kept.size(); ++i) {
    Kept& k = kept[i];
    if (!k.req) continue;
    std::vector<std::int32_t> tokens, parents, remap(k.tokens.size(), -1);
    k.req->verified.clear();
    std::int32_t max_depth = 0;
    for (std::size_t j = 0; j < k.tokens.size(); ++j) {
      if (!chosen[i][j]) continue;
      const std::int32_t par = k.parents[j] < 0 ? -1 : remap[static_cast<std::size_t>(k.parents[j])];
      remap[j] = static_cast<std::int32_t>(tokens.size());
      tokens.push_back(k.tokens[j]);
      parents.push_back(par);
      k.req->verified.push_back({k.tokens[j], par, k.depth[j], k.scores[j], k.prob[j]});
      max_depth = std::max(max_depth, k.depth[j]);
    }
    k.req->draft_depth = max_depth;
    added += static_cast<std::int64_t>(tokens.size());
    if (max_depth > 0) rows_per_level_ = 0.9 * rows_per_level_ + 0.1 * static_cast<double>(tokens.size()) / max_depth;
    for (auto& item : plan.batch.items)
      if (item.req == ids[i]) {
        // Sampled drafts keep their q rows only when the whole chain is verified (a chain cut by the
        // budget is verified as proposed tokens, which is lossless too).
        if (i < p.probs.size() && tokens.size() == p.tokens[i].size()) item.draft_probs = std::move(p.probs[i]);
        item.tokens.insert(item.tokens.end(), tokens.begin(), tokens.end());
        item.parents = std::move(parents);
      }
  }
  plan.rows = plan.base_rows + added;
  plan.started = now_();  // from here on: the target step's wall time
  return true;
}

bool Scheduler::proposals_failed(StepPlan& plan) {
  if (stale(plan)) return false;
  plan.draft_levels = 0;  // nothing drafted: not a speculative step for the feedback
  metrics_.draft_ms += ms_between(plan.started, now_());
  plan.started = now_();
  metrics_.fallback_steps += static_cast<std::int64_t>(plan.proposal_ids.size());
  for (std::uint64_t id : plan.proposal_ids)
    if (Sequence* r = find_running(id)) ++r->m.fallbacks;
  return true;
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
    if (r.hidden.empty() || item.hidden_first != r.hidden_rows) {
      r.hidden.clear();
      r.hidden_first = item.hidden_first;
    }
    r.hidden.insert(r.hidden.end(), item.hidden.begin(), item.hidden.end());
    r.hidden_rows = item.hidden_first + static_cast<std::int64_t>(item.hidden.size() / width);
  }
  if (item.kv_length > 0) {
    r.kv_pages = std::move(item.kv_pages);
    r.kv_length = item.kv_length;
  }
  std::string reason;
  if (r.prefilled < r.prompt_len) {
    r.prefilled += r.chunk;
    r.chunk = 0;
    if (r.prefilled == r.prompt_len) cache_prompt(r);
    if (!item.tokens.empty()) reason = emit(r, item.tokens);
  } else {
    ++r.m.steps;
    ++metrics_.decode_steps;
    if (draft_.configured && r.sub->request.speculative) ++metrics_.speculative_steps;
    r.m.drafted += item.drafted;
    r.m.accepted += item.accepted;
    metrics_.drafted += item.drafted;
    metrics_.accepted += item.accepted;
    auto& da = metrics_.drafted_at;
    auto& aa = metrics_.accepted_at;
    if (static_cast<std::int32_t>(da.size()) < r.draft_depth) da.resize(static_cast<std::size_t>(r.draft_depth), 0);
    if (static_cast<std::int32_t>(aa.size()) < item.accepted) aa.resize(static_cast<std::size_t>(item.accepted), 0);
    for (std::int32_t d = 0; d < r.draft_depth; ++d) ++da[static_cast<std::size_t>(d)];
    for (std::int32_t d = 0; d < item.accepted; ++d) ++aa[static_cast<std::size_t>(d)];
    auto& rda = r.m.drafted_at;
    auto& raa = r.m.accepted_at;
    if (static_cast<std::int32_t>(rda.size()) < r.draft_depth) rda.resize(static_cast<std::size_t>(r.draft_depth), 0);
    if (static_cast<std::int32_t>(raa.size()) < item.accepted) raa.resize(static_cast<std::size_t>(item.accepted), 0);
    for (std::int32_t d = 0; d < r.draft_depth; ++d) ++rda[static_cast<std::size_t>(d)];
    for (std::int32_t d = 0; d < item.accepted; ++d) ++raa[static_cast<std::size_t>(d)];
    if (draft_.configured && r.sub->request.speculative) observe_verification(r, item);
    r.draft_depth = 0;
    reason = emit(r, item.tokens);
  }
  // A request that ends inside a step's tokens (its length, a stop, the end of generation) has KV
  // rows for accepted tokens it did not keep: only the rows of its own tokens are its KV (and what the
  // prefix cache may take).
  r.kv_length = std::min<std::int64_t>(r.kv_length, static_cast<std::int64_t>(r.seq.size()));
  return reason;
}

// What the target accepted of the nodes it verified: each node is accepted when its parent is and its
// token is the accepted one at its depth.
void Scheduler::observe_verification(Sequence& r, const ItemResult& item) {
  std::vector<bool> ok(r.verified.size(), false);
  for (std::size_t j = 0; j < r.verified.size(); ++j) {
    const auto& v = r.verified[j];
    ok[j] = v.depth <= item.accepted && (v.parent < 0 || ok[static_cast<std::size_t>(v.parent)]) &&
            static_cast<std::size_t>(v.depth) <= item.tokens.size() &&
            item.tokens[static_cast<std::size_t>(v.depth - 1)] == v.token;
    accept_.observe_node(v.score, v.depth, v.prob, ok[j], r.acc);
  }
  if (r.draft_depth > 0) accept_.observe_levels(r.draft_depth, item.accepted, r.acc);
  auto& h = metrics_.verified_nodes;
  const std::size_t n = std::min<std::size_t>(r.verified.size(), 32);
  if (h.size() <= n) h.resize(n + 1, 0);
  ++h[n];
  r.verified.clear();
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
