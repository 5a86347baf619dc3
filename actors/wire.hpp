// actors/wire.hpp — what crosses a process boundary between a front (actors/cluster.hpp) and an
// engine replica (actors/replica.hpp): the request, its token events, the metrics and the replica's
// description, each with an inspect() overload CAF's serializer uses, and the actor system settings
// both sides need (the middleman, the message types, heartbeats).
//
// Protocol (every message is a plain value; nothing shared):
//   front → replica  (hello_atom)                                  → ReplicaInfo
//                    (submit_atom, uint64 id, GenerationRequest)    tokens stream back as events
//                    (cancel_atom, uint64 id)
//                    (metrics_atom)                                 → EngineMetrics
//                    (flush_atom)                                   → int64 pages given up
//   replica → front  (event_atom, uint64 id, TokenEvent)            exactly one has finished = true
//   scheduler → draft host (`specactor worker --role draft`)
//                    (draft_atom, Snapshot draft, string model_json) → draft_worker_actor (spawned there)
//   then the scheduler speaks to that draft worker as to a local one (actors/draft_worker.hpp):
//   ProposeBatch (with the target's hidden rows) → Proposals, release, flush, reconf, needs.
// `id` is the front's; a replica keys requests by (front, id), so several fronts may share it.
#pragma once

#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>
#include <caf/io/middleman_actor.hpp>
#include <caf/meta/type_name.hpp>
#include <cstdint>
#include <string>

#include "actors/messages.hpp"

namespace specactor::model {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ChatMessage& x) {
  return f(caf::meta::type_name("chat_message"), x.role, x.content);
}

}  // namespace specactor::model

namespace specactor::sched {

// The constraint's kind travels as its number.
template <class Inspector>
std::enable_if_t<Inspector::reads_state, typename Inspector::result_type> inspect(Inspector& f,
                                                                                  const OutputConstraint& x) {
  auto kind = static_cast<std::int32_t>(x.kind);
  return f(caf::meta::type_name("output_constraint"), kind, x.schema, x.tool_names, x.tool_parameters, x.tools_required,
           x.parallel_tool_calls);
}

template <class Inspector>
std::enable_if_t<Inspector::writes_state, typename Inspector::result_type> inspect(Inspector& f, OutputConstraint& x) {
  std::int32_t kind = 0;
  auto result = f(caf::meta::type_name("output_constraint"), kind, x.schema, x.tool_names, x.tool_parameters,
                  x.tools_required, x.parallel_tool_calls);
  x.kind = kind >= 0 && kind <= 3 ? static_cast<OutputConstraint::Kind>(kind) : OutputConstraint::Kind::JsonSchema;
  if (kind < 0 || kind > 3) x.schema = "false";  // an unknown kind from a peer: refused at the check, not ignored
  return result;
}

// The seed and max_new_tokens are optional: each written as a flag and a value.
template <class Inspector>
std::enable_if_t<Inspector::reads_state, typename Inspector::result_type> inspect(Inspector& f,
                                                                                  const GenerationRequest& x) {
  bool has_seed = x.seed.has_value(), has_max = x.max_new_tokens.has_value();
  std::uint64_t seed = x.seed ? *x.seed : 0;
  std::int64_t max_new = x.max_new_tokens ? *x.max_new_tokens : 0;
  return f(caf::meta::type_name("generation_request"), x.prompt, x.prompt_ids, x.chat, x.system, x.messages, has_max,
           max_new, x.sampling, x.rules, x.logprobs, x.constraint, has_seed, seed, x.stop, x.ignore_eos, x.speculative);
}

template <class Inspector>
std::enable_if_t<Inspector::writes_state, typename Inspector::result_type> inspect(Inspector& f, GenerationRequest& x) {
  bool has_seed = false, has_max = false;
  std::uint64_t seed = 0;
  std::int64_t max_new = 0;
  auto result =
      f(caf::meta::type_name("generation_request"), x.prompt, x.prompt_ids, x.chat, x.system, x.messages, has_max,
        max_new, x.sampling, x.rules, x.logprobs, x.constraint, has_seed, seed, x.stop, x.ignore_eos, x.speculative);
  x.seed = has_seed ? std::optional<std::uint64_t>(seed) : std::nullopt;
  x.max_new_tokens = has_max ? std::optional<std::int64_t>(max_new) : std::nullopt;
  return result;
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RequestMetrics& x) {
  return f(caf::meta::type_name("request_metrics"), x.prompt_tokens, x.generated_tokens, x.time_to_first_token_ms,
           x.decode_tokens_per_s, x.steps, x.drafted, x.accepted, x.mean_accepted_length, x.fallbacks, x.budget_skipped,
           x.drafted_at, x.accepted_at, x.cached_tokens);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, TokenEvent& x) {
  return f(caf::meta::type_name("token_event"), x.id, x.tokens, x.logprobs, x.text, x.finished, x.finish_reason,
           x.error, x.invalid_request, x.metrics);
}

}  // namespace specactor::sched

namespace specactor::actors {

using event_atom = caf::atom_constant<caf::atom("event")>;
using hello_atom = caf::atom_constant<caf::atom("hello")>;
using draft_atom = caf::atom_constant<caf::atom("draft")>;

// What a replica says about itself when a front connects.
struct ReplicaInfo {
  std::string model_json;           // model_identity(): the front refuses a replica of another model
  config::Snapshot target;          // the replica's resolved target snapshot (as its engine holds it)
  std::string target_hash;          // its content hash before the draft snapshot was derived
  SnapshotReport snapshots;         // the objects its scheduler and workers hold (hashes on the front's side)
  std::int64_t max_running = 0;     // --max-running-requests
  std::int64_t context_length = 0;  // the resolved context length
  std::string host;                 // the host name the replica runs on
  std::int64_t pid = 0;             // its process id
  // Computed on the replica's side: the content hashes of what its target and draft workers hold
  // (the front hashes what it received beside them), and whether they hold the very objects the
  // scheduler resolved and derived (pointer identity cannot be seen across the wire).
  std::string target_worker_hash, draft_worker_hash;
  bool target_holds_resolved = false, draft_holds_derived = false;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ReplicaInfo& x) {
  return f(caf::meta::type_name("replica_info"), x.model_json, x.target, x.target_hash, x.snapshots, x.max_running,
           x.context_length, x.host, x.pid, x.target_worker_hash, x.draft_worker_hash, x.target_holds_resolved,
           x.draft_holds_derived);
}

struct WorkerAddress {
  std::string host;
  std::uint16_t port = 0;
  std::string text() const { return host + ":" + std::to_string(port); }
};

// "HOST:PORT,HOST:PORT" (IPv6 as [ADDR]:PORT). Throws config::ConfigError naming `flag`.
std::vector<WorkerAddress> parse_workers(const std::string& list, const std::string& flag = "--workers");

// TLS between a front and its workers (caf::openssl): this side's certificate and key (PEM) and the
// CA (PEM) the peer's certificate must chain to. All three or none; with them, each side presents
// its certificate and refuses a peer whose certificate does not chain to the CA (the host name is
// not checked: the CA is the trust). Without them the link is plain TCP.
struct TlsFiles {
  std::string certificate, key, ca;
  bool on() const { return !certificate.empty() || !key.empty() || !ca.empty(); }
};

// A PEM file (certificate chain, key, CA bundle) larger than this is not read.
constexpr std::size_t kMaxPemBytes = std::size_t{1} << 20;

// Checks that all three files are given, are regular PEM files of at most kMaxPemBytes, and load as
// the TLS layer loads them: the certificate chain, an unencrypted key that matches it, a CA with at
// least one certificate. ConfigError naming the flag (`prefix` + name, e.g. "--tls-" or
// "--worker-tls-") and OpenSSL's reason.
void check_tls(const TlsFiles& tls, const std::string& prefix);

// Connects like the middleman's actor, but proves `secret` to a worker's gate (actors/gate.hpp)
// before CAF speaks on the connection: use its handle for (connect_atom, host, port) to workers that
// run without --insecure and without TLS. A refusal is an error naming the address and the reason.
caf::io::middleman_actor spawn_secret_connector(caf::actor_system& system, std::string secret);

// "none": plain TCP without the secret (a worker with --insecure); else the file (empty: the
// per-user default, gate.hpp's default_secret_file()) read by load_secret without creating it.
// Returns "" for none. ConfigError naming `flag`.
std::string client_secret(const std::string& file, const std::string& flag);

// What identifies a model across processes: its ModelInfo as JSON without the file's path (another
// machine may keep the same file elsewhere).
std::string model_identity(const model::ModelInfo& info);

// Loads the middleman (and with TLS the OpenSSL manager), announces the message types above and sets
// the heartbeat: a peer that stops answering (not only one whose connection closed) is taken for
// gone after `timeout_ms`.
void configure_network(caf::actor_system_config& cfg, const TlsFiles& tls = {}, std::int64_t heartbeat_ms = 500,
                       std::int64_t timeout_ms = 5000);

}  // namespace specactor::actors
