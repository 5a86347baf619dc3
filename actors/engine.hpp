// actors/engine.hpp — specactor embedded in a host application. No CAF types needed:
//
//   auto engine = specactor::actors::Engine::from_argv({"--model-path", "models/…gguf"});
//   auto id = engine->submit({.prompt = "Hello", .max_new_tokens = 32},
//                            [](const specactor::actors::TokenEvent& ev) { std::cout << ev.text; });
//   auto result = engine->generate({.prompt = "Hi", .chat = true});   // blocking
//   engine->shutdown();
//
// Token callbacks run on the engine's actor threads: keep them short and thread-safe.
// (To run inside an existing caf::actor_system, see actors/engine_caf.hpp.)
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "actors/engine_types.hpp"
#include "config/resolve.hpp"
#include "config/snapshot.hpp"
#include "model/chat.hpp"
#include "model/loader.hpp"
#include "model/model_info.hpp"
#include "model/tokenizer.hpp"

namespace caf {
class actor_system;
}

namespace specactor::actors {

// What the server and the CLI use of an engine: a local one (Engine) or a front over engine replicas
// in other processes (actors/cluster.hpp). Tokenizing and validating a request are the same for
// both (the tokenizer, the chat template and the vocabulary come from the model file).
class EngineApi {
 public:
  virtual ~EngineApi() = default;
  // Queues a request; `on_token` receives each step's accepted tokens and a final event. Validates it
  // first (prepare); throws config::ConfigError naming the field.
  virtual std::uint64_t submit(GenerationRequest request, std::function<void(const TokenEvent&)> on_token) = 0;
  // Submits and waits for the whole result.
  GenerationResult generate(GenerationRequest request);
  virtual void cancel(std::uint64_t id) = 0;
  virtual EngineMetrics metrics() = 0;
  // Empties the prefix cache of every page no running request uses (sglang's /flush_cache);
  // returns how many pages it gave up.
  virtual std::int64_t flush_cache() = 0;
  virtual SnapshotReport snapshots() = 0;
  // Stops; requests in flight end with an error event. Idempotent.
  virtual void shutdown() = 0;
  virtual const config::Snapshot& target_snapshot() const = 0;
  // The content hash (hex) of the target snapshot as resolved, taken before the draft snapshot was
  // derived; a running server shows it beside the target worker's hash now.
  virtual const std::string& target_hash_before_draft() const = 0;
  virtual const model::ModelInfo& model_info() const = 0;
  virtual std::shared_ptr<const model::Tokenizer> tokenizer() const = 0;
  // Requests that may run at once (the server queues beyond this).
  virtual std::int64_t max_running_requests() const { return target_snapshot()->max_running_requests; }
  // The replicas behind a front (their addresses, state and snapshots with hashes); null for a local engine.
  virtual nlohmann::json replicas() { return nullptr; }
  // The prompt ids a request would be tokenized to (chat template applied when asked).
  std::vector<std::int32_t> tokenize(const GenerationRequest& request) const;
  // The one validation of a request (the server, the CLI and submit call it): its text's UTF-8 and chat
  // roles, the prompt tokenized once into request.prompt_ids (kept when already given), then
  // sched::check_request with the model's context length and vocabulary — the field ranges, ids inside
  // the vocabulary and the context rule (fields named by `name` when given, e.g. the API's spelling).
  // Throws sched::RequestError (a config::ConfigError) naming the field; the scheduler checks the KV
  // budget at admission.
  void prepare(GenerationRequest& request, const std::function<std::string(const std::string&)>& name = {}) const;

 protected:
  virtual const model::ChatTemplate& chat_template() const = 0;
};

class Engine final : public EngineApi {
 public:
  // Resolves the user's settings against the model file and this machine, starts the actors and
  // waits until the target model is loaded. Throws config::ConfigError / model::GgufError /
  // std::runtime_error with one clear message.
  static std::unique_ptr<Engine> create(const config::ServerArgs& user_args);
  static std::unique_ptr<Engine> from_argv(const std::vector<std::string>& argv);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  std::uint64_t submit(GenerationRequest request, std::function<void(const TokenEvent&)> on_token) override;
  void cancel(std::uint64_t id) override;
  EngineMetrics metrics() override;
  std::int64_t flush_cache() override;
  // A new draft snapshot derived from the current one (e.g. {"speculative_num_steps": 2}); it
  // reaches the draft worker between steps. The target's snapshot is not touched.
  void reconfigure_draft(const nlohmann::json& fields);
  // Spawns a new draft worker after a failure (a no-op while one is alive).
  void restart_draft();
  // Stops the actors; requests in flight end with "error: the engine shut down". Idempotent.
  void shutdown() override;

  SnapshotReport snapshots() override;
  const config::Snapshot& target_snapshot() const override;
  const std::string& target_hash_before_draft() const override;
  const model::ModelInfo& model_info() const override;
  std::shared_ptr<const model::Tokenizer> tokenizer() const override;

  struct Impl;

 protected:
  const model::ChatTemplate& chat_template() const override;

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  friend std::unique_ptr<Engine> create_engine_in(caf::actor_system& system, const config::ServerArgs& user_args);
  std::unique_ptr<Impl> impl_;
};

// What this machine can run, as resolution needs it (model/loader.hpp; the engine, the CLI and the
// benchmarks resolve with model::resolve_target and these facts).
using model::runtime_facts;

}  // namespace specactor::actors
