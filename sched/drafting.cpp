// sched/drafting.cpp — the policy's drafting seam: how deep each request drafts (plan), which of the
// drafter's nodes the target verifies (apply), and what the verification taught the budget (observe).
// The arithmetic of what pays lives in sched/budget.cpp; this file applies it to requests.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>

#include "config/resolve.hpp"
#include "config/server_args.hpp"
#include "sched/policy.hpp"
#include "sched/policy_detail.hpp"

namespace specactor::sched {

using detail::ms_between;

DraftShape draft_shape_of(const config::Snapshot& draft, drafters::DrafterNeeds needs) {
  DraftShape d;
  if (!draft) return d;
  d.configured = true;
  const config::DraftShapeArgs shape = config::draft_shape_args(*draft);
  d.num_draft_tokens = shape.num_draft_tokens;
  d.num_steps = shape.num_steps;
  // A head drafter's prompt-lookup branch: up to this many more nodes, as deep as it is long.
  if (const std::int64_t branch = shape.ngram_tokens; branch > 0) {
    d.num_draft_tokens += branch;
    d.num_steps = std::max(d.num_steps, branch);
  }
  if (const std::int64_t branch = shape.suffix_tokens; branch > 0) {
    d.num_draft_tokens += branch;
    d.num_steps = std::max(d.num_steps, branch);
  }
  d.adaptive = draft->speculative_adaptive;
  d.one_pass = draft->speculative_algorithm == config::SpecAlgorithm::Dflash ||
               draft->speculative_algorithm == config::SpecAlgorithm::Dspark;
  d.needs = std::move(needs);
  return d;
}

bool Scheduler::probes_allowed(std::int64_t decoding) const {
  return feedback_.penalty(decoding) < 2.0 && accept_.level_prob(1, RequestAcceptance{}) >= 0.05;
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
    for (const Sequence* r : decoding) due = due || probe_due(r->draft.acc);
    pays = probe_pays(static_cast<std::int32_t>(std::max<std::int64_t>(1, draft_.num_steps)), plan.base_rows, dec,
                      plan.mean_context, cost_, plan.decoding);
    every = probe_every(cost_, plan.base_rows, plan.mean_context, plan.decoding);
    probe_quota = probe_gate_.quota(pays, due, every);
  }
  for (Sequence* r : decoding) {
    // Depth: what may still be emitted (the bonus token is the last) and what fits the context.
    const std::int64_t remaining = r->max_new - static_cast<std::int64_t>(r->out.generated.size());
    const std::int64_t room = limits_.context_length - static_cast<std::int64_t>(r->seq.size());
    limit.push_back(static_cast<std::int32_t>(
        std::max<std::int64_t>(0, std::min<std::int64_t>({draft_.num_steps, remaining - 1, room}))));
    DepthAsk a;
    a.max_depth = limit.back();
    // A probe only where speculating has not measured as a loss for this batch size and where the
    // engine's record over all requests does not say a first draft is mostly wasted.
    // A request whose last verified draft was accepted whole may be probed whatever the record says.
    // Where probing cannot pay, a request whose drafter has not yet taken in its prompt is not probed:
    // its first round would catch the head up on every prompt row (docs/performance.md, 2026-12-05
    // house entry).
    const std::size_t width = draft_.needs.hidden_layers.size() * static_cast<std::size_t>(hidden_size_);
    const bool priming_cheap = r->draft.primed || width == 0 || r->draft.hidden.size() / width <= kProbePrimingRows;
    a.probe = probe_due(r->draft.acc) && probe_quota > 0 &&
              (probes_allowed(plan.decoding) || r->draft.acc.last_whole) && (pays || priming_cheap);
    if (a.probe) --probe_quota;
    // The selection after drafting verifies the likeliest node of a level, mostly; nothing when the
    // drafter proposes nothing.
    const double q = accept_.propose_prob(r->draft.acc);
    a.rows_per_level = q;
    for (std::int32_t d = 1; d <= a.max_depth; ++d) a.level_probs.push_back(q * accept_.level_prob(d, r->draft.acc));
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
    if (limit[i] > 0 && !explore) note_plan(r->draft.acc, asks[i].probe, depth[i]);
    if (depth[i] > 0 && !(asks[i].probe && depth[i] == 1)) chosen = true;
    if (depth[i] <= 0) {
      if (limit[i] > 0) {  // the budget's choice, not the end of the request
        ++metrics_.budget_skipped_steps;
        ++r->m.budget_skipped;
      }
      continue;
    }
    add_proposal(plan, *r, depth[i]);
  }
  plan.probes_only = plan.draft_levels > 0 && !chosen;
}

// The request drafts `depth` levels this step: its proposal goes into the plan with the target rows
// gathered for the drafter since its last one.
void Scheduler::add_proposal(StepPlan& plan, Sequence& r, std::int32_t depth) {
  plan.draft_levels += depth;
  plan.priming = plan.priming || !r.draft.primed;
  r.draft.primed = true;
  if (const std::size_t width = draft_.needs.hidden_layers.size() * static_cast<std::size_t>(hidden_size_); width > 0)
    plan.catch_up_rows += static_cast<std::int64_t>(r.draft.hidden.size() / width);
  plan.depth_limits.push_back(depth);
  plan.proposal_ids.push_back(r.id());
  plan.proposals.items.push_back({r.id(), std::make_shared<const std::vector<std::int32_t>>(r.seq),
                                  static_cast<std::int32_t>(draft_.num_draft_tokens - 1), depth,
                                  r.sub->request.sampling, r.seed, std::move(r.draft.hidden), r.draft.hidden_first,
                                  r.kv.pages, r.kv.length});
  r.draft.hidden.clear();
}

// A proposal's nodes the policy keeps, with what the acceptance model predicts of each.
struct KeptProposal {
  Sequence* req = nullptr;
  std::vector<std::int32_t> tokens, parents, depth;
  std::vector<float> scores;
  std::vector<double> prob;
  std::vector<grammar::Matcher> states;  // constrained: the grammar state after each node's path
};

// Keeps only well-formed nodes (parents before children) within the depth and tree limits — a
// drafter bug must not reach the target —, each with the acceptance model's probability; `cands`
// gets every kept node for the selection.
std::vector<KeptProposal> Scheduler::keep_proposals(const StepPlan& plan, const Proposals& p,
                                                    std::vector<Candidate>& cands) {
  const auto& ids = plan.proposal_ids;
  std::vector<KeptProposal> kept(ids.size());
  std::vector<std::int32_t> depth, keep_index;  // per proposal node (reused)
  for (std::size_t i = 0; i < ids.size() && i < p.tokens.size() && i < p.parents.size(); ++i) {
    KeptProposal& k = kept[i];
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
      if (k.req->constraint.matcher) {  // a draft the grammar forbids is cut here, with what follows it
        const grammar::Matcher& from = kp < 0 ? *k.req->constraint.matcher : k.states[static_cast<std::size_t>(kp)];
        grammar::Matcher next = from;
        if (!grammar_allows(*k.req, from, toks[j], next)) continue;
        k.states.push_back(std::move(next));
      }
      const float sc = scores ? (*scores)[j] : -1.0f;
      double pr = accept_.node_prob(sc, depth[j], k.req->draft.acc);
      if (kp >= 0) pr = std::min(pr, k.prob[static_cast<std::size_t>(kp)]);  // never likelier than its parent
      keep_index[j] = static_cast<std::int32_t>(k.tokens.size());
      cands.push_back({i, keep_index[j], kp, pr});
      k.tokens.push_back(toks[j]);
      k.parents.push_back(kp);
      k.depth.push_back(depth[j]);
      k.scores.push_back(sc);
      k.prob.push_back(pr);
    }
    accept_.observe_round(!k.tokens.empty(), k.req->draft.acc);  // whether this round brought anything to verify
  }
  return kept;
}

// A request whose proposals the budget keeps declining gets its likeliest first node verified now
// and then (at doubling intervals), so its own acceptance is measured and it can come back. A
// probe's is verified always: a probe exists to measure, and one the selection declined measured
// neither the acceptance nor what a verified row costs now (rows once dear, cheap since, stayed
// dear in the cost model for hundreds of steps).
void Scheduler::verify_declined(std::vector<KeptProposal>& kept, std::vector<std::vector<bool>>& chosen,
                                std::int64_t decoding) {
  for (std::size_t i = 0; i < kept.size(); ++i) {
    KeptProposal& k = kept[i];
    if (!k.req || k.tokens.empty()) continue;
    RequestAcceptance& a = k.req->draft.acc;
    if (std::find(chosen[i].begin(), chosen[i].end(), true) != chosen[i].end()) {
      a.unverified_steps = 0;
      a.verify_probe_interval = 4;
      continue;
    }
    if ((++a.unverified_steps < a.verify_probe_interval || !probes_allowed(decoding)) && !a.probing) continue;
    std::size_t best = k.tokens.size();
    for (std::size_t j = 0; j < k.tokens.size(); ++j)
      if (k.parents[j] < 0 && (best == k.tokens.size() || k.prob[j] > k.prob[best])) best = j;
    if (best == k.tokens.size() || k.prob[best] < 0.02) continue;
    chosen[i][best] = true;
    a.unverified_steps = 0;
    a.verify_probe_interval = std::min<std::int64_t>(64, 2 * a.verify_probe_interval);
  }
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
  std::vector<Candidate> cands;
  std::vector<KeptProposal> kept = keep_proposals(plan, p, cands);
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
  if (draft_.adaptive) verify_declined(kept, chosen, plan.decoding);
  std::int64_t added = 0;
  for (std::size_t i = 0; i < kept.size(); ++i) {
    KeptProposal& k = kept[i];
    if (!k.req) continue;
    std::vector<std::int32_t> tokens, parents, remap(k.tokens.size(), -1);
    std::vector<const grammar::Matcher*> kept_states;  // constrained: each verified node's grammar state
    k.req->draft.verified.clear();
    std::int32_t max_depth = 0;
    for (std::size_t j = 0; j < k.tokens.size(); ++j) {
      if (!chosen[i][j]) continue;
      const std::int32_t par = k.parents[j] < 0 ? -1 : remap[static_cast<std::size_t>(k.parents[j])];
      remap[j] = static_cast<std::int32_t>(tokens.size());
      tokens.push_back(k.tokens[j]);
      parents.push_back(par);
      k.req->draft.verified.push_back({k.tokens[j], par, k.depth[j], k.scores[j], k.prob[j]});
      if (k.req->constraint.matcher) kept_states.push_back(&k.states[j]);
      max_depth = std::max(max_depth, k.depth[j]);
    }
    k.req->draft.depth = max_depth;
    added += static_cast<std::int64_t>(tokens.size());
    if (max_depth > 0) rows_per_level_ = 0.9 * rows_per_level_ + 0.1 * static_cast<double>(tokens.size()) / max_depth;
    for (auto& item : plan.batch.items)
      if (item.req == ids[i]) {
        // Sampled drafts keep their q rows only when the whole chain is verified (a chain cut by the
        // budget is verified as proposed tokens, which is lossless too).
        if (i < p.probs.size() && tokens.size() == p.tokens[i].size()) item.draft_probs = std::move(p.probs[i]);
        item.tokens.insert(item.tokens.end(), tokens.begin(), tokens.end());
        item.parents = std::move(parents);
        if (k.req->constraint.matcher) {  // the root's row has its mask; each node's row continues its path
          for (const grammar::Matcher* m : kept_states) append_mask(*k.req, *m, item.allowed);
          // A chain (or nothing) goes on with what the grammar forces after its tip.
          bool chain = true;
          for (std::size_t j = 0; j < item.parents.size(); ++j)
            chain = chain && item.parents[j] == static_cast<std::int32_t>(j) - 1;
          const std::int32_t forced =
              chain ? force_drafts(*k.req, item, kept_states.empty() ? *k.req->constraint.matcher : *kept_states.back(),
                                   static_cast<std::int32_t>(item.tokens.size()) - 2)
                    : 0;
          if (forced > 0) item.draft_probs.clear();  // q rows cover the drafter's drafts only: verified as proposed
          added += forced;
        }
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

// The step's drafted and accepted tokens, in the request's and the engine's counters (per depth too).
void Scheduler::count_drafted(Sequence& r, const ItemResult& item) {
  r.m.drafted += item.drafted;
  r.m.accepted += item.accepted;
  metrics_.drafted += item.drafted;
  metrics_.accepted += item.accepted;
  for (auto* h : {&metrics_.drafted_at, &r.m.drafted_at}) detail::count_levels(*h, r.draft.depth);
  for (auto* h : {&metrics_.accepted_at, &r.m.accepted_at}) detail::count_levels(*h, item.accepted);
}

// What the target accepted of the nodes it verified: each node is accepted when its parent is and its
// token is the accepted one at its depth.
void Scheduler::observe_verification(Sequence& r, const ItemResult& item) {
  std::vector<bool> ok(r.draft.verified.size(), false);
  for (std::size_t j = 0; j < r.draft.verified.size(); ++j) {
    const auto& v = r.draft.verified[j];
    ok[j] = v.depth <= item.accepted && (v.parent < 0 || ok[static_cast<std::size_t>(v.parent)]) &&
            static_cast<std::size_t>(v.depth) <= item.tokens.size() &&
            item.tokens[static_cast<std::size_t>(v.depth - 1)] == v.token;
    accept_.observe_node(v.score, v.depth, v.prob, ok[j], r.draft.acc);
  }
  // (Drafts a grammar forced may follow the drafter's: its levels count only its own.)
  if (r.draft.depth > 0) accept_.observe_levels(r.draft.depth, std::min(item.accepted, r.draft.depth), r.draft.acc);
  auto& h = metrics_.verified_nodes;
  const std::size_t n = std::min<std::size_t>(r.draft.verified.size(), 32);
  if (h.size() <= n) h.resize(n + 1, 0);
  ++h[n];
  r.draft.verified.clear();
}
}  // namespace specactor::sched
