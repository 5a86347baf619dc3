// actors/messages.hpp — atoms and message payloads shared by the scheduler, the target worker and
// the draft workers. Payloads are plain structs with inspect() overloads (serializable); large or
// host-side objects travel as shared_ptr<const T> and are marked local-only.
#pragma once

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/fwd.hpp>
#include <caf/meta/type_name.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "actors/engine_types.hpp"
#include "config/snapshot_inspect.hpp"
#include "drafters/drafter.hpp"
#include "kernels/cpu/sampling.hpp"
#include "model/model_info.hpp"
#include "model/tokenizer.hpp"
#include "sched/step.hpp"

namespace specactor::kernels {
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SamplingParams& x) {
  return f(caf::meta::type_name("sampling_params"), x.temperature, x.top_k, x.top_p, x.min_p);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, TokenLogprob& x) {
  return f(caf::meta::type_name("token_logprob"), x.token, x.logprob, x.top_ids, x.top_logprobs);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, LogitRules& x) {
  return f(caf::meta::type_name("logit_rules"), x.presence_penalty, x.frequency_penalty, x.repetition_penalty,
           x.bias_ids, x.bias_values, x.min_tokens, x.end_ids);
}
}  // namespace specactor::kernels

namespace specactor::model {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StepItem& x) {
  return f(caf::meta::type_name("step_item"), x.req, x.tokens, x.parents, x.draft_probs, x.prefill, x.sample, x.params,
           x.rules, x.history, x.logprobs, x.allowed, x.seed, x.want_hidden, x.want_kv, x.keep_hidden, x.prefix_pages,
           x.prefix_len, x.copy_page, x.copy_len);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StepBatch& x) {
  return f(caf::meta::type_name("step_batch"), x.items, x.capture);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ItemResult& x) {
  return f(caf::meta::type_name("item_result"), x.req, x.tokens, x.logprobs, x.accepted, x.drafted, x.hidden,
           x.hidden_first, x.kv_pages, x.kv_length);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StepResult& x) {
  return f(caf::meta::type_name("step_result"), x.items, x.compute_ms);
}

}  // namespace specactor::model

namespace specactor::sched {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Proposals& x) {
  return f(caf::meta::type_name("proposals"), x.tokens, x.parents, x.probs, x.scores, x.compute_ms,
           x.cache.query_tokens, x.cache.hit_tokens, x.cache.pages, x.cache.evicted_pages);
}

// A proposal round crosses the wire to a remote draft worker: the context is written as its tokens.
template <class Inspector>
std::enable_if_t<Inspector::reads_state, typename Inspector::result_type> inspect(Inspector& f, const ProposeItem& x) {
  std::vector<std::int32_t> context = x.context ? *x.context : std::vector<std::int32_t>{};
  return f(caf::meta::type_name("propose_item"), x.req, context, x.max_nodes, x.max_depth, x.params, x.seed, x.hidden,
           x.hidden_first, x.kv_pages, x.kv_length);
}

template <class Inspector>
std::enable_if_t<Inspector::writes_state, typename Inspector::result_type> inspect(Inspector& f, ProposeItem& x) {
  std::vector<std::int32_t> context;
  auto result = f(caf::meta::type_name("propose_item"), x.req, context, x.max_nodes, x.max_depth, x.params, x.seed,
                  x.hidden, x.hidden_first, x.kv_pages, x.kv_length);
  x.context = std::make_shared<const std::vector<std::int32_t>>(std::move(context));
  return result;
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ProposeBatch& x) {
  return f(caf::meta::type_name("propose_batch"), x.items);
}

// Metrics cross the wire from a replica to its front (actors/wire.hpp).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, EngineMetrics& x) {
  return f(caf::meta::type_name("engine_metrics"), x.requests_submitted, x.requests_finished, x.requests_failed,
           x.requests_cancelled, x.running, x.queued, x.generated_tokens, x.steps, x.decode_steps, x.speculative_steps,
           x.drafted, x.accepted, x.mean_accepted_length, x.acceptance_rate, x.draft_failures, x.draft_error,
           x.fallback_steps, x.adaptive, x.budget_skipped_steps, x.grammar_drafts, x.grammar_masks,
           x.grammar_masks_computed, x.grammar_mask_ms, x.verified_nodes, x.calibration_error, x.calibrated_nodes,
           x.draft_score_calibration_error, x.draft_scored_nodes, x.step_cost, x.step_ms_1, x.budget_memory,
           x.draft_alive, x.algorithm, x.step_wall_ms, x.step_compute_ms, x.draft_ms, x.drafted_at, x.accepted_at,
           x.target_error, x.kv_pages_total, x.kv_pages_free, x.prefix_cache, x.cache_query_tokens, x.cache_hit_tokens,
           x.cache_pages, x.cache_evicted_pages, x.draft_cache_query_tokens, x.draft_cache_hit_tokens,
           x.draft_cache_pages, x.draft_cache_evicted_pages);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SnapshotReport& x) {
  return f(caf::meta::type_name("snapshot_report"), x.resolved_target, x.target_worker, x.derived_draft,
           x.draft_worker);
}

}  // namespace specactor::sched

namespace specactor::drafters {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, DrafterNeeds& x) {
  return f(caf::meta::type_name("drafter_needs"), x.hidden_layers, x.target_kv);
}

}  // namespace specactor::drafters

namespace specactor::actors {

using drafters::DrafterNeeds;
using sched::ItemResult;
using sched::Proposals;
using sched::ProposeBatch;
using sched::ProposeItem;
using sched::StepBatch;
using sched::StepItem;
using sched::StepResult;
using sched::Submission;

using info_atom = caf::atom_constant<caf::atom("info")>;
using step_atom = caf::atom_constant<caf::atom("step")>;
using release_atom = caf::atom_constant<caf::atom("release")>;
using propose_atom = caf::atom_constant<caf::atom("propose")>;
using reconf_atom = caf::atom_constant<caf::atom("reconf")>;
using snapshot_atom = caf::atom_constant<caf::atom("snapshot")>;
using submit_atom = caf::atom_constant<caf::atom("submit")>;
using cancel_atom = caf::atom_constant<caf::atom("cancel")>;
using metrics_atom = caf::atom_constant<caf::atom("metrics")>;
using tick_atom = caf::atom_constant<caf::atom("tick")>;
using ready_atom = caf::atom_constant<caf::atom("ready")>;
using restart_atom = caf::atom_constant<caf::atom("restart")>;
using needs_atom = caf::atom_constant<caf::atom("needs")>;
using cache_atom = caf::atom_constant<caf::atom("cache")>;
using flush_atom = caf::atom_constant<caf::atom("flush")>;

// Exception handler for the workers: the actor exits with the exception's text as its reason, so
// whoever monitors it can say what went wrong.
caf::error exit_with_message(caf::scheduled_actor*, std::exception_ptr& eptr);

// What the target worker reports once its model is loaded.
struct TargetInfo {
  model::ModelInfo info;
  std::shared_ptr<const model::Tokenizer> tokenizer;  // null with --skip-tokenizer-init
  std::int64_t kv_capacity_tokens = 0;
  std::int64_t page_size = 0;
  // Local only: the immutable weights and a read-only handle on the KV pool, for head drafters.
  std::shared_ptr<const model::LlamaWeights> weights;
  std::shared_ptr<const model::KvCache> kv;
  // The cost probe (model::TargetStep::probe): (rows, ms) of one step; empty when not probed.
  std::vector<std::pair<std::int64_t, double>> step_probe;
};

}  // namespace specactor::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(specactor::actors::TargetInfo)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<const specactor::sched::Submission>)
