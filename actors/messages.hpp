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

#include "actors/drafter.hpp"
#include "actors/engine_types.hpp"
#include "config/snapshot_inspect.hpp"
#include "kernels/cpu/sampling.hpp"
#include "model/model_info.hpp"
#include "model/tokenizer.hpp"

namespace specactor::kernels {
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SamplingParams& x) {
  return f(caf::meta::type_name("sampling_params"), x.temperature, x.top_k, x.top_p, x.min_p);
}
}  // namespace specactor::kernels

namespace specactor::actors {

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

// Exception handler for the workers: the actor exits with the exception's text as its reason, so
// whoever monitors it can say what went wrong.
caf::error exit_with_message(caf::scheduled_actor*, std::exception_ptr& eptr);

// One request's share of a target step.
struct StepItem {
  std::uint64_t req = 0;
  std::vector<std::int32_t> tokens;   // a prefill chunk, or [root, draft_1 .. draft_k] when decoding
  std::vector<std::int32_t> parents;  // per draft: -1 (the root) or the index of an earlier draft; empty = chain
  std::vector<float> draft_probs;     // chain drafts sampled from q: q rows (drafts × vocab) for rejection sampling
  bool prefill = false;               // tokens are prompt tokens (else [root, drafts...])
  bool sample = false;                // produce tokens: the last prefill chunk, or a decode/verify step
  kernels::SamplingParams params;
  std::uint64_t seed = 0;    // used when the worker first sees the request
  bool want_hidden = false;  // return the batch's captured layers for this item's committed rows
  bool want_kv = false;      // return the item's committed KV page table (FROZEN_KV_MTP)
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StepItem& x) {
  return f(caf::meta::type_name("step_item"), x.req, x.tokens, x.parents, x.draft_probs, x.prefill, x.sample, x.params,
           x.seed, x.want_hidden, x.want_kv);
}

struct StepBatch {
  std::vector<StepItem> items;
  std::vector<std::int32_t> capture;  // target layers whose outputs items with want_hidden get back
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StepBatch& x) {
  return f(caf::meta::type_name("step_batch"), x.items, x.capture);
}

struct ItemResult {
  std::uint64_t req = 0;
  std::vector<std::int32_t> tokens;    // accepted drafts then the bonus token (empty for a non-final prefill chunk)
  std::int32_t accepted = 0;           // how many of the drafts were accepted
  std::int32_t drafted = 0;            // how many drafts were verified
  std::vector<float> hidden;           // want_hidden: committed rows (prefill rows, or root + accepted path)
  std::vector<std::int32_t> kv_pages;  // want_kv: the request's page table after the step
  std::int64_t kv_length = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ItemResult& x) {
  return f(caf::meta::type_name("item_result"), x.req, x.tokens, x.accepted, x.drafted, x.hidden, x.kv_pages,
           x.kv_length);
}

struct StepResult {
  std::vector<ItemResult> items;
  double compute_ms = 0;  // time the worker spent computing (the rest of a step's wall time is messaging)
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StepResult& x) {
  return f(caf::meta::type_name("step_result"), x.items, x.compute_ms);
}

// What the target worker reports once its model is loaded.
struct TargetInfo {
  model::ModelInfo info;
  std::shared_ptr<const model::Tokenizer> tokenizer;  // null with --skip-tokenizer-init
  std::int64_t kv_capacity_tokens = 0;
  std::int64_t page_size = 0;
  // Local only: the immutable weights and a read-only handle on the KV pool, for head drafters.
  std::shared_ptr<const model::LlamaWeights> weights;
  std::shared_ptr<const model::KvCache> kv;
};

// The draft worker's input: each request's whole token sequence (shared, immutable) and how many
// tokens it may propose.
struct ProposeItem {
  std::uint64_t req = 0;
  std::shared_ptr<const std::vector<std::int32_t>> context;
  std::int32_t max_nodes = 0;  // draft tokens (tree nodes without the root)
  std::int32_t max_depth = 0;
  kernels::SamplingParams params;
  std::uint64_t seed = 0;
  std::vector<float> hidden;  // target rows since the last proposal (see TargetFeatures)
  std::int64_t hidden_first = 0;
  std::vector<std::int32_t> kv_pages;
  std::int64_t kv_length = 0;
};
struct ProposeBatch {
  std::vector<ProposeItem> items;
};
struct Proposals {
  std::vector<std::vector<std::int32_t>> tokens;   // per item: draft tokens (possibly none)
  std::vector<std::vector<std::int32_t>> parents;  // per item: their parents (see DraftTree)
  std::vector<std::vector<float>> probs;           // per item: q rows when the drafter sampled
  double compute_ms = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Proposals& x) {
  return f(caf::meta::type_name("proposals"), x.tokens, x.parents, x.probs, x.compute_ms);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, DrafterNeeds& x) {
  return f(caf::meta::type_name("drafter_needs"), x.hidden_layers, x.target_kv);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SnapshotReport& x) {
  return f(caf::meta::type_name("snapshot_report"), x.resolved_target, x.target_worker, x.derived_draft,
           x.draft_worker);
}

// A submission: the request and where its tokens go (host callbacks never leave the process).
struct Submission {
  std::uint64_t id = 0;
  std::vector<std::int32_t> prompt;
  GenerationRequest request;
  std::function<void(const TokenEvent&)> on_token;
};

}  // namespace specactor::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(specactor::actors::TargetInfo)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(specactor::actors::ProposeBatch)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<const specactor::actors::Submission>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(specactor::actors::EngineMetrics)
