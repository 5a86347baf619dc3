#include "actors/wire.hpp"

#include <caf/io/middleman.hpp>
#include <caf/timestamp.hpp>
#include <chrono>

namespace specactor::actors {

void configure_network(caf::actor_system_config& cfg, std::int64_t heartbeat_ms, std::int64_t timeout_ms) {
  cfg.load<caf::io::middleman>();
  cfg.add_message_type<GenerationRequest>("specactor::generation_request");
  cfg.add_message_type<TokenEvent>("specactor::token_event");
  cfg.add_message_type<EngineMetrics>("specactor::engine_metrics");
  cfg.add_message_type<ReplicaInfo>("specactor::replica_info");
  cfg.set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds(heartbeat_ms)});
  cfg.set("middleman.connection-timeout", caf::timespan{std::chrono::milliseconds(timeout_ms)});
}

}  // namespace specactor::actors
