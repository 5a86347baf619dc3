// tests/test_sched.cpp — the scheduling policy (sched/policy.hpp) without an actor system: stop
// strings, admission under the KV budget, chunked prefill, proposal limits and tree clean-up, stale
// replies after a failure (the proposal / target-death race), cancellation, fallbacks and metrics.
#include <doctest/doctest.h>

#include <chrono>
#include <map>
#include <random>

#include "config/server_args.hpp"
#include "model/gguf.hpp"
#include "sched/policy.hpp"
#include "tests/support/gguf_writer.hpp"

using namespace specactor;
using namespace specactor::sched;

namespace {

// Token i < 26 is the letter 'a' + i; token 26 is the end of generation.
std::shared_ptr<const model::Tokenizer> letters() {
  std::vector<std::string> tokens;
  for (char c = 'a'; c <= 'z'; ++c) tokens.emplace_back(1, c);
  tokens.push_back("<|im_end|>");
  std::vector<std::int32_t> types(tokens.size(), 1);
  types.back() = 3;
  model::GgufWriter w;
  w.kv_str("tokenizer.ggml.model", "gpt2");
  w.kv_str_array("tokenizer.ggml.tokens", tokens);
  w.kv_i32_array("tokenizer.ggml.token_type", types);
  w.kv_str_array("tokenizer.ggml.merges", {});
  w.kv_u32("tokenizer.ggml.eos_token_id", 26);
  return model::Tokenizer::from_gguf(*model::GgufFile::parse(w.bytes(), "letters.gguf"));
}
constexpr std::int32_t kEos = 26;
std::int32_t tok(char c) { return c - 'a'; }

// Every event a request received, by id.
struct Events {
  std::map<std::uint64_t, std::vector<TokenEvent>> by_id;
  const TokenEvent& final_event(std::uint64_t id) {
    REQUIRE(!by_id[id].empty());
    REQUIRE(by_id[id].back().finished);
    return by_id[id].back();
  }
  std::string text(std::uint64_t id) {
    std::string s;
    for (const auto& e : by_id[id]) s += e.text;
    return s;
  }
  std::size_t finals(std::uint64_t id) {
    std::size_t n = 0;
    for (const auto& e : by_id[id]) n += e.finished;
    return n;
  }
};

struct Fixture {
  Events events;
  std::vector<std::uint64_t> released;
  Limits limits;
  std::unique_ptr<Scheduler> s;

  explicit Fixture(Limits l = {}, std::int64_t kv_pages = 64) : limits(l) {
    if (limits.context_length == 0) limits.context_length = 64;
    limits.page_size = l.page_size;
    s = std::make_unique<Scheduler>(limits, [this](std::uint64_t id) { released.push_back(id); });
    s->set_target(kv_pages, letters(), 4);
    s->set_ready();
  }
  std::uint64_t submit(std::uint64_t id, std::vector<std::int32_t> prompt, std::int64_t max_new = 8,
                       std::vector<std::string> stop = {}, bool speculative = true) {
    auto sub = std::make_shared<Submission>();
    sub->id = id;
    sub->prompt = std::move(prompt);
    sub->request.max_new_tokens = max_new;
    sub->request.stop = std::move(stop);
    sub->request.speculative = speculative;
    sub->on_token = [this](const TokenEvent& ev) { events.by_id[ev.id].push_back(ev); };
    s->submit(std::move(sub));
    return id;
  }
  // Answers every item of the plan with `tokens` (a prefill chunk that does not sample gets none).
  void answer(const StepPlan& plan, const std::map<std::uint64_t, std::vector<std::int32_t>>& tokens,
              std::int32_t accepted = 0) {
    StepResult res;
    for (const auto& it : plan.batch.items) {
      ItemResult r;
      r.req = it.req;
      if (it.sample) r.tokens = tokens.count(it.req) ? tokens.at(it.req) : std::vector<std::int32_t>{tok('z')};
      r.drafted = static_cast<std::int32_t>(it.tokens.size()) - 1;
      r.accepted = it.prefill ? 0 : accepted;
      res.items.push_back(std::move(r));
    }
    s->step_done(plan, res);
  }
};

DraftShape chain_draft(std::int64_t steps, std::int64_t tokens) {
  DraftShape d;
  d.configured = true;
  d.num_steps = steps;
  d.num_draft_tokens = tokens;
  return d;
}

}  // namespace

TEST_CASE("stop strings: held back while they may still match, cut where they do") {
  StopMatcher m({"END", "xy"});
  CHECK(m.push("abc") == "abc");
  CHECK(m.push("dE") == "d");  // "E" may start "END"
  CHECK(m.push("N") == "");    // "EN" too
  CHECK(m.push("o") == "ENo");
  CHECK(m.push("x") == "");
  CHECK(!m.stopped());
  CHECK(m.push("yzzz") == "");  // "xy" matched: nothing after it is shown
  CHECK(m.stopped());
  CHECK(m.push("more") == "");
  CHECK(m.flush() == "");

  StopMatcher tail({"ab"});
  CHECK(tail.push("za") == "z");
  CHECK(tail.flush() == "a");  // the request ended without the stop string: the held text is output

  StopMatcher none({"", ""});  // empty stop strings are ignored
  CHECK(none.push("abc") == "abc");
  CHECK(!none.stopped());

  StopMatcher inside({"cd"});
  CHECK(inside.push("abcdef") == "ab");  // several tokens' text at once
  CHECK(inside.stopped());
}

TEST_CASE("refusals end the request at once, as the request's own error") {
  Limits l;
  l.context_length = 16;
  l.page_size = 4;
  Fixture f(l, /*kv_pages=*/3);  // 12 tokens of KV
  f.submit(1, {});
  f.submit(2, std::vector<std::int32_t>(16, tok('a')));
  f.submit(3, {tok('a')}, 0);
  f.submit(4, std::vector<std::int32_t>(10, tok('a')), 5);  // 10 + 5 + 1 = 16 tokens > 12
  CHECK(f.events.final_event(1).error.find("prompt: is empty") != std::string::npos);
  CHECK(f.events.final_event(2).error.find("prompt: this model's maximum context length is 16 tokens") !=
        std::string::npos);
  CHECK(f.events.final_event(3).error.find("max_new_tokens: must be >= 1") != std::string::npos);
  CHECK(f.events.final_event(4).error.find("--max-total-tokens") != std::string::npos);
  for (std::uint64_t id = 1; id <= 4; ++id) {
    CHECK(f.events.final_event(id).invalid_request);
    CHECK(f.events.final_event(id).finish_reason == "error");
  }
  CHECK(f.s->queued() == 0);
  CHECK(f.s->free_pages() == 3);
  CHECK(f.s->metrics().requests_failed == 4);
  CHECK(!f.s->next_step(false));
}

TEST_CASE("admission: FIFO under the KV budget and max_running_requests, pages come back at retirement") {
  Limits l;
  l.context_length = 64;
  l.page_size = 4;
  l.max_running_requests = 2;
  Fixture f(l, /*kv_pages=*/6);          // 24 tokens
  f.submit(1, {tok('a'), tok('b')}, 6);  // 2 + 6 + 1 = 9 tokens: 3 pages
  f.submit(2, {tok('a')}, 2);            // 4 tokens: 1 page
  f.submit(3, {tok('a')}, 2);            // fits the pages, not max_running_requests
  auto plan = f.s->next_step(false);
  REQUIRE(plan);
  CHECK(f.s->running() == 2);
  CHECK(f.s->queued() == 1);
  CHECK(f.s->free_pages() == 2);
  CHECK(!f.s->next_step(false));  // a step is in flight
  f.answer(*plan, {{1, {tok('x')}}, {2, {tok('y')}}});
  plan = f.s->next_step(false);
  REQUIRE(plan);
  f.answer(*plan, {{1, {tok('x')}}, {2, {tok('y')}}});  // request 2 reaches max_new = 2
  CHECK(f.events.final_event(2).finish_reason == "length");
  CHECK(f.events.text(2) == "yy");
  CHECK(f.released == std::vector<std::uint64_t>{2});
  plan = f.s->next_step(false);  // request 3 takes request 2's place and page
  REQUIRE(plan);
  CHECK(f.s->running() == 2);
  CHECK(f.s->free_pages() == 2);

  // A big request waits at the head of the queue; a small one behind it is not let past.
  Fixture g(l, 6);
  g.submit(1, std::vector<std::int32_t>(8, tok('a')), 8);  // 17 tokens: 5 pages
  g.submit(2, std::vector<std::int32_t>(4, tok('a')), 4);  // 9 tokens: 3 pages (5 + 3 > 6)
  g.submit(3, {tok('a')}, 1);                              // 3 tokens: 1 page, but behind 2
  auto p = g.s->next_step(false);
  REQUIRE(p);
  CHECK(p->batch.items.size() == 1);
  CHECK(g.s->queued() == 2);
}

TEST_CASE("chunked prefill: one budget per step, shared by the requests in order") {
  Limits l;
  l.context_length = 64;
  l.chunked_prefill_size = 5;
  l.max_running_requests = 4;
  Fixture f(l);
  f.submit(1, std::vector<std::int32_t>(7, tok('a')));
  f.submit(2, std::vector<std::int32_t>(3, tok('b')));
  auto plan = f.s->next_step(false);
  REQUIRE(plan);
  REQUIRE(plan->batch.items.size() == 1);  // request 1 takes the whole budget
  CHECK(plan->batch.items[0].tokens.size() == 5);
  CHECK(plan->batch.items[0].prefill);
  CHECK(!plan->batch.items[0].sample);
  f.answer(*plan, {});
  plan = f.s->next_step(false);
  REQUIRE(plan->batch.items.size() == 2);
  CHECK(plan->batch.items[0].tokens.size() == 2);  // the rest of request 1, which samples now
  CHECK(plan->batch.items[0].sample);
  CHECK(plan->batch.items[1].tokens.size() == 3);  // and request 2 whole
  f.answer(*plan, {{1, {tok('c')}}, {2, {tok('d')}}});
  plan = f.s->next_step(false);
  REQUIRE(plan->batch.items.size() == 2);
  for (const auto& it : plan->batch.items) {
    CHECK(!it.prefill);
    CHECK(it.tokens.size() == 1);  // decode: the last token is the root
  }
  CHECK(plan->batch.items[0].tokens[0] == tok('c'));
  CHECK(plan->batch.items[1].tokens[0] == tok('d'));
}

TEST_CASE("end of generation and stop strings finish a request, text never shows the stop string") {
  Limits l;
  l.max_running_requests = 2;
  Fixture f(l);
  f.submit(1, {tok('a')}, 20, {"cd"});
  f.submit(2, {tok('a')}, 20);
  auto plan = f.s->next_step(false);
  f.answer(*plan, {{1, {tok('a')}}, {2, {tok('q')}}});
  plan = f.s->next_step(false);
  f.answer(*plan, {{1, {tok('b'), tok('c'), tok('d'), tok('e')}}, {2, {tok('r'), kEos, tok('s')}}});
  CHECK(f.events.final_event(1).finish_reason == "stop");
  CHECK(f.events.text(1) == "ab");
  CHECK(f.events.final_event(2).finish_reason == "stop");
  CHECK(f.events.text(2) == "qr");  // nothing after the end of generation
  CHECK(f.events.final_event(2).metrics.generated_tokens == 2);
  CHECK(f.events.finals(1) == 1);
  CHECK(f.events.finals(2) == 1);
}

TEST_CASE("proposals: depth limited by max_new and the context, malformed nodes dropped, q rows kept whole") {
  Limits l;
  l.context_length = 12;
  l.max_running_requests = 4;
  Fixture f(l);
  f.s->set_draft(chain_draft(/*steps=*/4, /*tokens=*/8));
  f.submit(1, {tok('a')}, 3);                              // 3 to emit: depth ≤ 2 (the bonus token is the last)
  f.submit(2, std::vector<std::int32_t>(8, tok('a')), 4);  // context 12: max_new 4 fills it; after one token room 3
  f.submit(3, {tok('a')}, 9, {}, /*speculative=*/false);   // opted out: no proposal
  auto plan = f.s->next_step(true);
  REQUIRE(plan);
  CHECK(plan->proposals.items.empty());  // prefill steps do not draft
  f.answer(*plan, {{1, {tok('b')}}, {2, {tok('b')}}, {3, {tok('b')}}});
  plan = f.s->next_step(true);
  REQUIRE(plan);
  REQUIRE(plan->proposals.items.size() == 2);
  CHECK(plan->proposal_ids == std::vector<std::uint64_t>{1, 2});
  // Request 1: 2 tokens left → depth 1. Request 2: max_new = 12 - 8 = 4, 3 left → depth 2 (room 3).
  CHECK(plan->depth_limits == std::vector<std::int32_t>{1, 2});
  CHECK(plan->proposals.items[0].max_nodes == 7);
  CHECK(*plan->proposals.items[0].context == std::vector<std::int32_t>{tok('a'), tok('b')});

  Proposals p;
  // Request 1: a chain of 3 with q rows; depth limit 1 keeps only the first node (q rows dropped).
  p.tokens.push_back({tok('c'), tok('d'), tok('e')});
  p.parents.push_back({-1, 0, 1});
  p.probs.push_back(std::vector<float>(3 * 27, 1.0f / 27));
  // Request 2: a tree with a forward reference (2 → 3), a node under a dropped parent, a bad parent.
  p.tokens.push_back({tok('c'), tok('d'), tok('e'), tok('f'), tok('g')});
  p.parents.push_back({-1, 0, 3, -1, -7});
  p.probs.push_back({});
  CHECK(f.s->apply_proposals(*plan, p));
  const auto& it1 = plan->batch.items[0];
  CHECK(it1.tokens == std::vector<std::int32_t>{tok('b'), tok('c')});
  CHECK(it1.parents == std::vector<std::int32_t>{-1});
  CHECK(it1.draft_probs.empty());
  const auto& it2 = plan->batch.items[1];
  CHECK(it2.tokens == std::vector<std::int32_t>{tok('b'), tok('c'), tok('d'), tok('f')});
  CHECK(it2.parents == std::vector<std::int32_t>{-1, 0, -1});
  CHECK(plan->batch.items[2].tokens.size() == 1);  // request 3 decodes plainly
  f.answer(*plan, {{1, {tok('c'), tok('x')}}, {2, {tok('c'), tok('d'), tok('y')}}, {3, {tok('z')}}});
  CHECK(f.events.final_event(1).finish_reason == "length");  // b, c, x = 3 tokens
  CHECK(f.events.text(1) == "bcx");
}

TEST_CASE("budget: a request's first proposal round (the drafter takes in its prompt) is left out of the draft cost") {
  Limits l;
  l.max_running_requests = 2;
  Fixture f(l);
  f.s->set_draft(chain_draft(/*steps=*/2, /*tokens=*/3));  // a fixed shape: every decode step drafts
  auto propose = [&](StepPlan& plan, std::size_t n) {
    Proposals p;
    for (std::size_t i = 0; i < n; ++i) {
      p.tokens.push_back({tok('x')});
      p.parents.push_back({-1});
      p.probs.push_back({});
    }
    CHECK(f.s->apply_proposals(plan, p));
  };
  f.submit(1, {tok('a'), tok('b')}, 30);
  auto plan = f.s->next_step(true);  // prefill
  f.answer(*plan, {{1, {tok('c')}}});
  plan = f.s->next_step(true);
  REQUIRE(plan->proposals.items.size() == 1);
  CHECK(plan->priming);
  propose(*plan, 1);
  CHECK(f.s->cost().draft_rounds() == 0);  // the prompt's one-time catch-up: left out
  f.answer(*plan, {{1, {tok('d')}}});
  plan = f.s->next_step(true);
  REQUIRE(plan->proposals.items.size() == 1);
  CHECK_FALSE(plan->priming);  // however long its catch-up, a later round is what drafting costs
  propose(*plan, 1);
  CHECK(f.s->cost().draft_rounds() == 1);
  f.answer(*plan, {{1, {tok('e')}}});
  // A second request: the round that first drafts for it primes again, with the first request in it.
  f.submit(2, {tok('a')}, 30);
  plan = f.s->next_step(true);  // request 2's prefill beside request 1's decode
  if (!plan->proposals.items.empty()) propose(*plan, plan->proposals.items.size());
  f.answer(*plan, {{1, {tok('f')}}, {2, {tok('b')}}});
  const auto rounds = f.s->cost().draft_rounds();
  plan = f.s->next_step(true);
  REQUIRE(plan->proposals.items.size() == 2);
  CHECK(plan->priming);
  propose(*plan, 2);
  CHECK(f.s->cost().draft_rounds() == rounds);
}

TEST_CASE("proposals: the tree is cut at the node limit") {
  Fixture f;
  f.s->set_draft(chain_draft(1, 200));
  f.submit(1, {tok('a')}, 30);
  auto plan = f.s->next_step(true);
  f.answer(*plan, {{1, {tok('b')}}});
  plan = f.s->next_step(true);
  REQUIRE(plan->proposals.items.size() == 1);
  Proposals p;
  p.tokens.push_back(std::vector<std::int32_t>(150, tok('c')));
  p.parents.push_back(std::vector<std::int32_t>(150, -1));  // 150 children of the root
  p.probs.push_back({});
  CHECK(f.s->apply_proposals(*plan, p));
  CHECK(static_cast<std::int64_t>(plan->batch.items[0].tokens.size()) == config::kMaxTreeTokens);
}

TEST_CASE("stale replies: a proposal or step answered after every request failed changes nothing") {
  // The race the scheduler actor once lost: the target dies while a proposal is out. fail_everything
  // retires (and frees) every request; the proposal's reply arrives afterwards and must not touch them.
  Limits l;
  l.max_running_requests = 4;
  Fixture f(l);
  f.s->set_draft(chain_draft(3, 4));
  f.submit(1, {tok('a')}, 10);
  f.submit(2, {tok('a')}, 10);
  auto plan = f.s->next_step(true);
  f.answer(*plan, {{1, {tok('b')}}, {2, {tok('b')}}});
  plan = f.s->next_step(true);
  REQUIRE(plan->proposals.items.size() == 2);
  f.s->fail_everything("target worker failed: boom");
  CHECK(f.events.final_event(1).error == "target worker failed: boom");
  CHECK(!f.events.final_event(1).invalid_request);
  CHECK(f.s->running() == 0);
  Proposals p;
  p.tokens = {{tok('c')}, {tok('c')}};
  p.parents = {{-1}, {-1}};
  p.probs = {{}, {}};
  CHECK(!f.s->apply_proposals(*plan, p));
  CHECK(!f.s->proposals_failed(*plan));
  f.answer(*plan, {{1, {tok('c')}}, {2, {tok('c')}}});  // ignored
  f.s->step_failed(*plan, "late");                      // ignored
  CHECK(f.events.finals(1) == 1);
  CHECK(f.events.finals(2) == 1);
  CHECK(f.s->metrics().requests_failed == 2);
  CHECK(f.s->metrics().steps == 1);
  // The policy goes on: a new request runs.
  f.submit(3, {tok('a')}, 1);
  plan = f.s->next_step(false);
  REQUIRE(plan);
  f.answer(*plan, {{3, {tok('q')}}});
  CHECK(f.events.final_event(3).finish_reason == "length");
}

TEST_CASE("cancel: queued requests end at once, running ones at the step boundary, even mid-proposal") {
  Limits l;
  l.max_running_requests = 1;
  Fixture f(l);
  f.s->set_draft(chain_draft(2, 3));
  f.submit(1, {tok('a')}, 10);
  f.submit(2, {tok('a')}, 10);
  auto plan = f.s->next_step(true);
  f.s->cancel(2);  // queued
  CHECK(f.events.final_event(2).finish_reason == "cancelled");
  f.answer(*plan, {{1, {tok('b')}}});
  plan = f.s->next_step(true);
  REQUIRE(plan->proposals.items.size() == 1);
  f.s->cancel(1);  // running, its proposal out
  Proposals p;
  p.tokens = {{tok('c'), tok('d')}};
  p.parents = {{-1, 0}};
  p.probs = {{}};
  CHECK(f.s->apply_proposals(*plan, p));
  f.answer(*plan, {{1, {tok('c'), tok('d'), tok('e')}}}, 2);
  CHECK(f.events.final_event(1).finish_reason == "cancelled");
  CHECK(f.events.finals(1) == 1);
  CHECK(f.released == std::vector<std::uint64_t>{2, 1});
  CHECK(f.s->metrics().requests_cancelled == 2);
}

TEST_CASE("a failed step ends its own requests, a missing drafter counts fallbacks, metrics add up") {
  Limits l;
  l.chunked_prefill_size = 4;
  l.max_running_requests = 4;
  Fixture f(l);
  f.s->set_draft(chain_draft(2, 3));
  f.submit(1, {tok('a')}, 10);
  f.submit(2, std::vector<std::int32_t>(9, tok('a')), 10);  // still prefilling in the second step
  auto plan = f.s->next_step(false);
  f.answer(*plan, {{1, {tok('b')}}});
  plan = f.s->next_step(false);  // the drafter is gone: request 1 decodes without drafts
  CHECK(plan->proposals.items.empty());
  CHECK(f.s->metrics().fallback_steps == 1);
  f.answer(*plan, {{1, {tok('c')}}});
  plan = f.s->next_step(true);
  REQUIRE(plan->proposals.items.size() == 1);  // request 2 is still prefilling: only 1 drafts
  Proposals p;
  p.tokens = {{tok('d'), tok('e')}};
  p.parents = {{-1, 0}};
  p.probs = {{}};
  CHECK(f.s->apply_proposals(*plan, p));
  f.answer(*plan, {{1, {tok('d'), tok('e'), tok('f')}}, {2, {tok('x')}}}, 2);
  const EngineMetrics m = f.s->snapshot_metrics();
  CHECK(m.drafted == 2);
  CHECK(m.accepted == 2);
  CHECK(m.acceptance_rate == doctest::Approx(1.0));
  CHECK(m.drafted_at == std::vector<std::int64_t>{1, 1});
  CHECK(m.accepted_at == std::vector<std::int64_t>{1, 1});
  CHECK(m.speculative_steps == 2);  // request 1's two decode steps (request 2 prefilled until now)
  CHECK(m.mean_accepted_length == doctest::Approx(2.0));
  CHECK(f.events.text(1) == "bcdef");

  plan = f.s->next_step(false);  // both decode now; the target fails this step
  REQUIRE(plan->batch.items.size() == 2);
  f.submit(3, {tok('a')}, 2);  // queued while the step is out: not part of it
  f.s->step_failed(*plan, "target step failed: x");
  CHECK(f.events.final_event(1).error == "target step failed: x");
  CHECK(f.events.final_event(2).error == "target step failed: x");
  plan = f.s->next_step(false);
  REQUIRE(plan);
  CHECK(plan->batch.items.size() == 1);
  CHECK(plan->batch.items[0].req == 3);
}

TEST_CASE("before the target is known, requests wait, a target failure fails them and later ones") {
  Limits l;
  l.context_length = 32;
  l.page_size = 4;
  l.max_running_requests = 4;
  Events events;
  Scheduler s(l, {});
  auto sub = [&](std::uint64_t id, std::size_t prompt) {
    auto x = std::make_shared<Submission>();
    x->id = id;
    x->prompt.assign(prompt, tok('a'));
    x->request.max_new_tokens = 8;
    x->on_token = [&](const TokenEvent& ev) { events.by_id[ev.id].push_back(ev); };
    s.submit(x);
  };
  sub(1, 4);
  sub(2, 20);  // fits the context; the KV budget is checked once it is known
  CHECK(!s.next_step(false));
  s.set_target(/*kv_pages=*/5, letters(), 4);  // 20 tokens of KV
  s.set_ready();
  auto plan = s.next_step(false);
  REQUIRE(plan);
  CHECK(plan->batch.items.size() == 1);  // 1 runs; 2 (29 tokens) is refused at admission
  CHECK(events.final_event(2).invalid_request);
  CHECK(events.final_event(2).error.find("--max-total-tokens") != std::string::npos);
  s.set_target_failed("target worker failed: oom");
  CHECK(events.final_event(1).error == "target worker failed: oom");
  CHECK(s.stale(*plan));
  sub(3, 2);
  CHECK(events.final_event(3).error == "target worker failed: oom");
  CHECK(!events.final_event(3).invalid_request);
  CHECK(!s.next_step(false));
}

namespace {

// A step result for one request as a target with the prefix cache answers it: the page table and the
// rows its KV holds after the step.
void answer_kv(Fixture& f, const StepPlan& plan, std::uint64_t id, std::vector<std::int32_t> tokens,
               std::vector<std::int32_t> pages, std::int64_t kv_length, std::int32_t accepted = 0) {
  StepResult res;
  for (const auto& it : plan.batch.items) {
    ItemResult r;
    r.req = it.req;
    if (it.req == id) {
      r.tokens = std::move(tokens);
      r.kv_pages = pages;
      r.kv_length = kv_length;
      r.accepted = accepted;
    } else if (it.sample) {
      r.tokens = {tok('z')};
    }
    res.items.push_back(std::move(r));
  }
  f.s->step_done(plan, res);
}

}  // namespace

// The fault `specactor bench --speculative-algorithm NGRAM` hit ("PrefixTree::insert: 5 pages but 79
// tokens"): a verify step accepted more tokens than max_new_tokens left room for; the request kept
// fewer tokens than its KV had rows, and at retirement the cache was offered pages past its tokens.
TEST_CASE("prefix cache: a request that ends inside a step's accepted tokens offers only its own tokens' rows") {
  Limits l;
  l.page_size = 4;
  l.prefix_cache = true;
  Fixture f(l);
  std::vector<std::int64_t> kept;
  f.s->set_cache_sink([&](CacheOps ops) { kept.push_back(static_cast<std::int64_t>(ops.keep.size())); });
  f.submit(1, {tok('a'), tok('b'), tok('c'), tok('d'), tok('e'), tok('f'), tok('g'), tok('h')}, 3);
  auto plan = f.s->next_step(false);
  REQUIRE(plan);
  answer_kv(f, *plan, 1, {tok('i')}, {0, 1}, 8);  // the prompt: 2 whole pages, cached at once
  plan = f.s->next_step(false);
  REQUIRE(plan);
  // 'i' and 4 accepted drafts were fed (13 rows, 4 pages); only 'j' and 'k' fit in max_new 3.
  answer_kv(f, *plan, 1, {tok('j'), tok('k'), tok('l'), tok('m'), tok('n')}, {0, 1, 2, 3}, 13, 4);
  const TokenEvent& fin = f.events.final_event(1);
  CHECK(fin.finish_reason == "length");
  CHECK(fin.error.empty());
  CHECK(f.events.text(1) == "ijk");
  // 11 tokens: 2 whole pages (cached with the prompt) and a tail of 3 tokens in page 2.
  REQUIRE(f.s->prefix_tree());
  CHECK(f.s->prefix_tree()->cached_pages() == 3);
  CHECK(f.s->metrics().requests_failed == 0);
  // The same prompt again starts on the cached pages and the partly filled page.
  f.submit(2,
           {tok('a'), tok('b'), tok('c'), tok('d'), tok('e'), tok('f'), tok('g'), tok('h'), tok('i'), tok('j'),
            tok('k'), tok('q')},
           2);
  plan = f.s->next_step(false);
  REQUIRE(plan);
  REQUIRE(plan->batch.items.size() == 1);
  CHECK(plan->batch.items[0].prefix_len == 8);
  CHECK(plan->batch.items[0].copy_len == 3);
}

TEST_CASE("containment: an inconsistent result fails its own request and frees its pages, the others go on") {
  Limits l;
  l.page_size = 4;
  l.max_running_requests = 2;
  Fixture f(l, 16);
  f.submit(1, {tok('a'), tok('b')}, 4);
  f.submit(2, {tok('c'), tok('d')}, 4);
  auto plan = f.s->next_step(false);
  REQUIRE(plan);
  REQUIRE(plan->batch.items.size() == 2);
  CHECK(f.s->snapshot_metrics().kv_pages_free < 16);
  // Request 1's reply claims 40 KV rows in one page: it cannot be its own.
  answer_kv(f, *plan, 1, {tok('x')}, {0}, 40);
  const TokenEvent& fin = f.events.final_event(1);
  CHECK(fin.finish_reason == "error");
  CHECK(fin.error.find("internal error") != std::string::npos);
  CHECK(fin.error.find("40 KV rows") != std::string::npos);
  CHECK(f.events.finals(1) == 1);
  CHECK(f.s->metrics().requests_failed == 1);
  CHECK(std::count(f.released.begin(), f.released.end(), 1u) == 1);
  // Request 2 goes on to its end; every page is free again.
  for (int i = 0; i < 8 && f.events.finals(2) == 0; ++i) {
    plan = f.s->next_step(false);
    REQUIRE(plan);
    f.answer(*plan, {{2, {tok('y')}}});
  }
  CHECK(f.events.final_event(2).finish_reason == "length");
  CHECK(f.events.text(2) == "zyyy");
  CHECK(f.s->snapshot_metrics().kv_pages_free == 16);
  CHECK(!f.s->next_step(false));
}

namespace {

// A simulated machine under the scheduler, on its own clock: a target step costs `step` ms plus `row`
// ms per row after the first, a draft round `level` ms per level; each drafted node is accepted with
// probability `p` (a chain stops at its first rejection).
struct SimMachine {
  double step = 10, row = 1, level = 0.5, p = 0.7;
};

struct Simulation {
  Fixture f;
  Clock::time_point now = Clock::time_point{} + std::chrono::hours(1);
  std::mt19937 rng{7};
  std::int64_t sampled = 0;

  static Limits limits() {
    Limits l;
    l.context_length = 1 << 16;
    return l;
  }
  explicit Simulation(const SimMachine& m) : f(limits(), 4200) {
    f.s->set_clock([this] { return now; });
    DraftShape d = chain_draft(/*steps=*/4, /*tokens=*/5);
    d.adaptive = true;
    f.s->set_draft(d);
    std::vector<std::pair<std::int64_t, double>> probe;  // what the start-up probe measures
    for (std::int64_t r : {1, 2, 4, 8, 16}) probe.emplace_back(r, m.step + m.row * static_cast<double>(r - 1));
    f.s->seed_costs(probe);
  }
  void advance(double ms) { now += std::chrono::microseconds(static_cast<std::int64_t>(ms * 1000.0)); }
  // Runs `steps` decode steps of one long request; returns in how many of them a drafted row was verified.
  std::int64_t run(const SimMachine& m, std::int64_t steps) {
    if (f.s->running() == 0) {
      f.submit(1, {tok('a'), tok('b')}, 60000);
      auto plan = f.s->next_step(true);
      REQUIRE(plan);
      advance(m.step);
      f.answer(*plan, {{1, {tok('c')}}});
    }
    std::bernoulli_distribution accept(m.p);
    std::int64_t verified_steps = 0;
    for (std::int64_t i = 0; i < steps; ++i) {
      auto plan = f.s->next_step(true);
      REQUIRE(plan);
      REQUIRE(plan->batch.items.size() == 1);
      if (!plan->proposals.items.empty()) {
        Proposals p;
        const std::int32_t depth = plan->depth_limits[0];
        p.tokens.push_back(std::vector<std::int32_t>(static_cast<std::size_t>(depth), tok('x')));
        p.parents.emplace_back();
        for (std::int32_t d = 0; d < depth; ++d) p.parents.back().push_back(d - 1);
        p.probs.emplace_back();
        advance(m.level * depth);
        REQUIRE(f.s->apply_proposals(*plan, p));
      }
      const auto rows = static_cast<std::int64_t>(plan->batch.items[0].tokens.size());
      advance(m.step + m.row * static_cast<double>(rows - 1));
      std::int32_t acc = 0;
      while (acc < rows - 1 && accept(rng)) ++acc;
      verified_steps += rows > 1;
      std::vector<std::int32_t> out(static_cast<std::size_t>(acc), tok('x'));  // the accepted drafts
      out.push_back(tok('z'));                                                 // and the target's own token
      f.answer(*plan, {{1, out}}, acc);
    }
    return verified_steps;
  }
};

}  // namespace

TEST_CASE("budget: a memory learned where rows were dear does not keep drafting off once rows are cheap") {
  // Learned in a busy hour: the start-up probe saw cheap rows, but every step then cost as if one
  // more verified row took 90 % of a step (drafting loses there: the feedback measures it)...
  const SimMachine dear{10, 9, 0.5, 0.7};
  const SimMachine cheap{10, 0.3, 0.5, 0.7};
  Simulation before(cheap);
  before.run(dear, 600);
  const std::int64_t late = before.run(dear, 200);
  CAPTURE(late);
  CHECK(late <= 40);  // the budget learned to leave drafting (mostly) off there
  const std::string memory = before.f.s->save_memory("k");
  REQUIRE(memory.find("feedback 0 ") != std::string::npos);
  // The worst such a memory can also say: drafted steps measured at half plain's rate, the costs
  // scaled to the limit (x4).
  std::string memory_worst = memory.substr(0, memory.find("feedback 0 "));
  memory_worst += "feedback 0 4 5 50 20 5 100 20\n";
  // ... and restored on one where a row costs 3 % of a step (drafting pays: ~1.6x at depth 3).
  Simulation fresh(cheap);
  Simulation after(cheap), worst(cheap);
  REQUIRE(worst.f.s->restore_memory(memory_worst, "k") == "");
  CHECK(worst.f.s->feedback().penalty(1) == doctest::Approx(4.0));
  REQUIRE(after.f.s->restore_memory(memory, "k") == "");
  std::vector<std::int64_t> fresh_runs, after_runs, same_runs, worst_runs;
  for (int block = 0; block < 6; ++block) {
    fresh_runs.push_back(fresh.run(cheap, 50));
    after_runs.push_back(after.run(cheap, 50));
    same_runs.push_back(before.run(cheap, 50));
    worst_runs.push_back(worst.run(cheap, 50));
  }
  std::string runs;
  for (std::size_t i = 0; i < fresh_runs.size(); ++i)
    runs += std::to_string(fresh_runs[i]) + "/" + std::to_string(after_runs[i]) + "/" + std::to_string(same_runs[i]) +
            "/" + std::to_string(worst_runs[i]) + " ";
  CAPTURE(runs);  // per 50 steps: no memory / the busy hour's / the same engine on / the worst memory
  // Without a memory it drafts at once. With the one learned in the busy hour, and with the worst a
  // memory can say, it drafts as often from the start: the step costs are measured afresh. The engine
  // that lived through the busy hour drafts again within a few hundred steps: its probes measure the
  // cheap rows and the busy hour's medians stop counting.
  CHECK(fresh_runs[0] >= 40);
  for (std::size_t i = 0; i < after_runs.size(); ++i) {
    CHECK(after_runs[i] >= 40);
    CHECK(worst_runs[i] >= 40);
  }
  CHECK(same_runs[3] + same_runs[4] + same_runs[5] >= 120);
}

TEST_CASE("budget: where probing cannot pay, no probe makes a head take in a long prompt it never drafted for") {
  // A head drafter (captured rows of width 4): a request with a 300-token prompt and one with a
  // 10-token prompt, on a machine where one more row costs 90 % of a step (the probes are held back).
  for (const std::int64_t prompt_len : {300, 10}) {
    CAPTURE(prompt_len);
    Limits l;
    l.context_length = 4096;
    Fixture f(l, 400);
    Clock::time_point now = Clock::time_point{} + std::chrono::hours(1);
    f.s->set_clock([&] { return now; });
    f.s->set_target(400, letters(), 4);
    DraftShape d = chain_draft(3, 4);
    d.adaptive = true;
    d.needs.hidden_layers = {1};
    f.s->set_draft(d);
    f.s->seed_costs({{1, 10.0}, {2, 19.0}, {4, 37.0}, {8, 73.0}});
    std::vector<std::int32_t> prompt(static_cast<std::size_t>(prompt_len), tok('a'));
    f.submit(1, prompt, 400);
    std::int64_t fed = 0, rounds = 0, primed_rows = 0;
    for (int i = 0; i < 400; ++i) {
      auto plan = f.s->next_step(true);
      if (!plan) break;
      if (!plan->proposals.items.empty()) {
        ++rounds;
        primed_rows += static_cast<std::int64_t>(plan->proposals.items[0].hidden.size() / 4);
        Proposals p;
        p.tokens.push_back({tok('x')});
        p.parents.push_back({-1});
        p.probs.emplace_back();
        REQUIRE(f.s->apply_proposals(*plan, p));
      }
      StepResult res;
      for (const auto& it : plan->batch.items) {
        ItemResult r;
        r.req = it.req;
        const auto n = static_cast<std::int64_t>(it.tokens.size());
        if (it.sample) r.tokens = {tok('z')};
        r.drafted = it.prefill ? 0 : static_cast<std::int32_t>(n) - 1;
        r.hidden.assign(static_cast<std::size_t>((it.prefill ? n : 1) * 4), 0.5f);  // the committed rows
        r.hidden_first = fed;
        fed += it.prefill ? n : 1;
        res.items.push_back(std::move(r));
      }
      now += std::chrono::milliseconds(10 + 9 * (plan->rows - 1));
      f.s->step_done(*plan, res);
    }
    CAPTURE(rounds);
    CAPTURE(primed_rows);
    if (prompt_len > static_cast<std::int64_t>(kProbePrimingRows))
      CHECK(rounds == 0);  // never a round that would first catch the head up on 300 rows
    else
      CHECK(rounds >= 1);  // a short prompt is still probed now and then
  }
}
