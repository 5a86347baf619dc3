#include "actors/wire.hpp"

#include <caf/io/middleman.hpp>
#include <caf/openssl/manager.hpp>
#include <caf/timestamp.hpp>
#include <chrono>
#include <fstream>

#include "actors/draft_worker.hpp"
#include "config/error.hpp"
#include "config/input.hpp"

namespace specactor::actors {

std::vector<WorkerAddress> parse_workers(const std::string& list, const std::string& flag) {
  std::vector<WorkerAddress> out;
  std::size_t at = 0;
  while (at <= list.size()) {
    const std::size_t end = std::min(list.find(',', at), list.size());
    const std::string item = list.substr(at, end - at);
    at = end + 1;
    auto bad = [&](const std::string& why) {
      return config::ConfigError(flag + ": '" + config::printable(item, 80) + "': " + why +
                                 " (expected HOST:PORT[,HOST:PORT...], e.g. 127.0.0.1:31000)");
    };
    if (item.empty()) throw bad("an empty address");
    const std::size_t colon = item.rfind(':');
    if (colon == std::string::npos || colon == 0) throw bad("no port");
    std::string host = item.substr(0, colon);
    if (host.front() == '[') {
      if (host.back() != ']' || host.size() < 3) throw bad("an IPv6 address needs its closing ']'");
      host = host.substr(1, host.size() - 2);
    }
    const std::string port = item.substr(colon + 1);
    if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos)
      throw bad("the port is not a number");
    const long p = std::stol(port);
    if (p < 1 || p > 65535) throw bad("the port is outside 1..65535");
    for (const auto& w : out)
      if (w.host == host && w.port == p) throw bad("listed twice");
    out.push_back({host, static_cast<std::uint16_t>(p)});
    if (end == list.size()) break;
  }
  if (out.empty()) throw config::ConfigError(flag + ": no address given");
  return out;
}

std::string model_identity(const model::ModelInfo& info) {
  nlohmann::json j = info.to_json();
  j.erase("path");
  return j.dump();
}

void check_tls(const TlsFiles& tls, const std::string& prefix) {
  if (!tls.on()) return;
  for (auto [name, path] :
       {std::pair{"certificate", &tls.certificate}, std::pair{"key", &tls.key}, std::pair{"ca", &tls.ca}}) {
    if (path->empty())
      throw config::ConfigError(prefix + name + ": is required with the other TLS flags (" + prefix + "certificate, " +
                                prefix + "key and " + prefix + "ca: all three or none)");
    if (!std::ifstream(*path).good()) throw config::ConfigError(prefix + name + " " + *path + ": cannot open the file");
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
  cfg.add_message_type<config::Snapshot>("specactor::snapshot");
  cfg.add_message_type<ProposeBatch>("specactor::propose_batch");
  cfg.add_message_type<Proposals>("specactor::proposals");
  cfg.add_message_type<DrafterNeeds>("specactor::drafter_needs");
  cfg.add_message_type<draft_worker_actor>("specactor::draft_worker_actor");
  cfg.set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds(heartbeat_ms)});
  cfg.set("middleman.connection-timeout", caf::timespan{std::chrono::milliseconds(timeout_ms)});
}

}  // namespace specactor::actors
