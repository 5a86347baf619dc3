#include "actors/wire.hpp"

#include <caf/io/middleman.hpp>
#include <caf/openssl/manager.hpp>
#include <fstream>

#include "config/error.hpp"
#include <caf/timestamp.hpp>
#include <chrono>

namespace specactor::actors {

void check_tls(const TlsFiles& tls, const std::string& prefix) {
  if (!tls.on()) return;
  for (auto [name, path] : {std::pair{"certificate", &tls.certificate}, std::pair{"key", &tls.key},
                            std::pair{"ca", &tls.ca}}) {
    if (path->empty())
      throw config::ConfigError(prefix + name + ": is required with the other TLS flags (" + prefix + "certificate, " +
                                prefix + "key and " + prefix + "ca: all three or none)");
    if (!std::ifstream(*path).good())
      throw config::ConfigError(prefix + name + " " + *path + ": cannot open the file");
  }
}

void configure_network(caf::actor_system_config& cfg, const TlsFiles& tls, std::int64_t heartbeat_ms,
                       std::int64_t timeout_ms) {
  cfg.load<caf::io::middleman>();
  if (tls.on()) {
    cfg.openssl_certificate = tls.certificate;
    cfg.openssl_key = tls.key;
    cfg.openssl_cafile = tls.ca;
    cfg.load<caf::openssl::manager>();
  }
  cfg.add_message_type<GenerationRequest>("specactor::generation_request");
  cfg.add_message_type<TokenEvent>("specactor::token_event");
  cfg.add_message_type<EngineMetrics>("specactor::engine_metrics");
  cfg.add_message_type<ReplicaInfo>("specactor::replica_info");
  cfg.set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds(heartbeat_ms)});
  cfg.set("middleman.connection-timeout", caf::timespan{std::chrono::milliseconds(timeout_ms)});
}

}  // namespace specactor::actors
