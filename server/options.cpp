// server/options.cpp — `specactor serve`'s own flags: checked before the model loads (check_serve_options),
// turned into the HTTP layer's limits, and the descriptor limit raised for --max-connections.
#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "actors/cluster.hpp"
#include "actors/system.hpp"
#include "config/error.hpp"
#include "config/input.hpp"
#include "server/http.hpp"
#include "server/server.hpp"

namespace specactor::server {

void check_serve_options(const ServeOptions& o) {
  if (o.api_key_given && o.api_key.empty())
    throw config::ConfigError(
        "--api-key: is empty, which would turn authentication off; give a key, or leave the flag (and "
        "SPECACTOR_API_KEY) out to serve without one");
  for (std::size_t i = 0; i < o.api_key.size(); ++i) {
    const auto c = static_cast<unsigned char>(o.api_key[i]);
    if (c <= 0x20 || c == 0x7f)
      throw config::ConfigError("--api-key: has a space or control character at byte " + std::to_string(i) +
                                ", which an 'Authorization: Bearer' header cannot carry (a key of visible characters "
                                "is expected)");
  }
  if (!(o.grace_seconds >= 0 && o.grace_seconds <= kMaxGraceSeconds))
    throw config::ConfigError("--grace-period: must be in [0, " + std::to_string(static_cast<int>(kMaxGraceSeconds)) +
                              "] seconds (got " + config::printable(std::to_string(o.grace_seconds)) + ")");
  if (o.http_threads < 1 || o.http_threads > kMaxHttpThreads)
    throw config::ConfigError("--http-threads: must be in [1, " + std::to_string(kMaxHttpThreads) + "] (got " +
                              std::to_string(o.http_threads) + ")");
  if (o.max_connections < 1 || o.max_connections > kMaxConnections)
    throw config::ConfigError("--max-connections: must be in [1, " + std::to_string(kMaxConnections) + "] (got " +
                              std::to_string(o.max_connections) + ")");
  if (!o.workers.empty()) (void)actors::parse_workers(o.workers);
  if (!(o.workers_wait_seconds >= 0 && o.workers_wait_seconds <= 3600))
    throw config::ConfigError("--workers-wait: must be in [0, 3600] seconds (got " +
                              config::printable(std::to_string(o.workers_wait_seconds)) + ")");
  actors::check_tls({o.worker_tls_certificate, o.worker_tls_key, o.worker_tls_ca}, "--worker-tls-");
  if (o.routing != "cache-aware" && o.routing != "least-loaded" && o.routing != "round-robin")
    throw config::ConfigError("--routing: '" + config::printable(o.routing, 40) +
                              "' (expected cache-aware, least-loaded or round-robin)");
  for (auto [flag, v] :
       {std::pair{"--header-timeout", o.header_timeout_seconds}, std::pair{"--body-timeout", o.body_timeout_seconds}})
    if (!(v >= 0.1 && v <= 3600))
      throw config::ConfigError(std::string(flag) + ": must be in [0.1, 3600] seconds (got " +
                                config::printable(std::to_string(v)) + ")");
}

http::Limits http_limits(const ServeOptions& o) {
  http::Limits l;
  l.threads = static_cast<int>(o.http_threads);
  l.max_connections = o.max_connections;
  l.max_body_bytes = o.max_body_bytes;
  l.header_timeout_s = o.header_timeout_seconds;
  l.body_timeout_s = o.body_timeout_seconds;
  return l;
}

namespace http {

bool ensure_fd_limit(std::int64_t connections, std::int64_t& have) {
  // Each connection is one descriptor; the model files, the engine and the logs need a few more.
  const std::int64_t need = connections + 128;
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) {
    have = -1;
    return true;  // cannot tell: let accept(2) report it
  }
  const std::int64_t hard = rl.rlim_max == RLIM_INFINITY ? INT64_MAX : static_cast<std::int64_t>(rl.rlim_max);
  have = std::min(hard, INT64_MAX) - 128;
  if (static_cast<std::int64_t>(rl.rlim_cur) >= need && rl.rlim_cur != RLIM_INFINITY) return true;
  if (rl.rlim_cur == RLIM_INFINITY) return true;
  if (hard < need) return false;
  rl.rlim_cur = static_cast<rlim_t>(need);
  return ::setrlimit(RLIMIT_NOFILE, &rl) == 0;
}

}  // namespace http

}  // namespace specactor::server
