// server/server.hpp — `specactor serve`: an OpenAI-compatible HTTP server (server/http.hpp, on
// libmicrohttpd) in front of the Engine facade (no CAF here). Routes:
//   POST /v1/chat/completions, /v1/completions   OpenAI requests, JSON or SSE streaming
//   POST /generate                                sglang's native form
//   POST /tokenize, /detokenize                   vLLM's forms
//   GET  /v1/models, /health (503 while loading or stopping), /server_info, /metrics (Prometheus)
// A client that disconnects (streamed or not) cancels its request. SIGINT/SIGTERM: new requests get
// 503, running ones finish and their responses go out in full (streams with their last chunk and
// [DONE]) for up to the grace period; what is still running then is cancelled and answered as an
// error (503, or an SSE error event); serve() returns 0. A second signal stops at once (128 + signal).
#pragma once

#include <cstdint>
#include <string>

#include "config/server_args.hpp"

namespace specactor::server {

struct ServeOptions {
  std::string api_key;                     // empty: no authentication
  bool api_key_given = false;              // --api-key or SPECACTOR_API_KEY was set (an empty one is refused)
  std::string served_model_name;           // empty: the model file's name
  std::int64_t max_queued_requests = 256;  // waiting beyond the running batch; more → 503 + Retry-After
  std::int64_t max_body_bytes = 8 << 20;   // larger request bodies → 413
  double grace_seconds = 30;               // after SIGINT/SIGTERM: how long running requests may finish
  std::int64_t http_threads = 4;           // HTTP threads, whatever the number of connections
  std::int64_t max_connections = 1000;     // open connections beyond this get 503 + Retry-After
  bool max_connections_given = false;      // else lowered to what the file limit allows
  double header_timeout_seconds = 10;      // all headers within this of connecting / the previous response
  double body_timeout_seconds = 60;        // the whole body within this of the last header
  // A front over engine replicas (`specactor worker` processes): "HOST:PORT,..."; empty: the engine
  // runs in this process.
  std::string workers;
  std::string routing = "cache-aware";  // with workers: cache-aware | least-loaded | round-robin
  double workers_wait_seconds = 60;     // with workers: how long to wait at start for the first one
  std::string worker_tls_certificate, worker_tls_key, worker_tls_ca;  // with workers: TLS (all three or none)
  // with workers, without TLS: the cluster secret's file (empty: the per-user default), or "none"
  // for workers started with --insecure.
  std::string worker_secret_file;
};

inline constexpr std::int64_t kMaxHttpThreads = 256;
inline constexpr std::int64_t kMaxConnections = 1 << 20;

// The longest --grace-period (a week): longer ones are refused rather than overflowing the deadline.
inline constexpr double kMaxGraceSeconds = 7 * 24 * 3600.0;

// Refuses serve options that cannot work (an empty API key, a grace period beyond kMaxGraceSeconds,
// thread and connection counts and timeouts out of range).
void check_serve_options(const ServeOptions& options);
namespace http {
struct Limits;
}
// The HTTP layer's limits from the options (server/options.cpp).
http::Limits http_limits(const ServeOptions& options);

// Binds args.host:args.port exclusively (ConfigError when it cannot), answers /health with 503 while
// the engine loads the model, serves until SIGINT or SIGTERM, drains, and returns 0 (128 + the
// signal when a second one cut the drain short).
int serve(const config::ServerArgs& args, const ServeOptions& options);

}  // namespace specactor::server
