// actors/cluster.hpp — a front over engine replicas in other processes (`specactor serve --workers
// HOST:PORT,...`). It reads the model file's metadata and tokenizer (not its weights), validates and
// tokenizes each request itself, and routes it to a replica over CAF's network layer:
//   - the replica whose (approximate) prefix index matches the longest leading part of the prompt,
//     unless it has more than `balance` requests in flight beyond the least loaded one;
//   - otherwise the least loaded replica (ties in turn).
// The index is per replica: hashes of the prompt-and-output token blocks (16 tokens, chained) of
// the requests it served, bounded (least recently used out), like sglang's router's tree.
// A replica that dies or stops answering (heartbeat) is noticed: its requests that have streamed
// nothing are retried on another replica, the others end with finish_reason "error" and a message
// naming it; the front reconnects every `reconnect_interval_s` and takes it back when it answers.
// A replica of another model (its ModelInfo differs) is refused, with the reason in replicas().
// `routing` least-loaded or round-robin leaves the prefix out (for comparison).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "actors/engine.hpp"
#include "actors/wire.hpp"

namespace specactor::actors {

struct ClusterOptions {
  std::vector<WorkerAddress> workers;
  double connect_timeout_s = 60;    // at start: how long to wait for the first replica to answer
  double reconnect_interval_s = 1;  // how often a replica that is down is tried again
  std::int64_t retries = 2;         // times a request that streamed nothing is moved to another replica
  std::int64_t balance = 8;         // in-flight requests above the least loaded replica that override the prefix
  // cache-aware (the prefix, then the load), least-loaded (in turn among equals), round-robin.
  std::string routing = "cache-aware";
  TlsFiles tls;  // the workers listen with TLS: this front's certificate, key and the CA
  // Without TLS: the cluster secret the workers' gates ask this front to prove (actors/gate.hpp);
  // empty: plain TCP (workers started with --insecure).
  std::string secret;
};

class Cluster final : public EngineApi {
 public:
  // Throws config::ConfigError (the model file, the options) or std::runtime_error (no replica
  // answered in time, with each one's reason).
  static std::unique_ptr<Cluster> connect(const config::ServerArgs& args, const ClusterOptions& options);
  ~Cluster() override;

  std::uint64_t submit(GenerationRequest request, std::function<void(const TokenEvent&)> on_token) override;
  void cancel(std::uint64_t id) override;
  // The replicas' metrics summed (those that answer).
  EngineMetrics metrics() override;
  std::int64_t flush_cache() override;
  // The first live replica's snapshots (as its scheduler and workers hold them).
  SnapshotReport snapshots() override;
  void shutdown() override;
  const config::Snapshot& target_snapshot() const override;
  const std::string& target_hash_before_draft() const override;
  const model::ModelInfo& model_info() const override;
  std::shared_ptr<const model::Tokenizer> tokenizer() const override;
  std::int64_t max_running_requests() const override;
  nlohmann::json replicas() override;

  struct Impl;

 protected:
  const model::ChatTemplate& chat_template() const override;

 private:
  explicit Cluster(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace specactor::actors
