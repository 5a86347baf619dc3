// server/server.hpp — `specactor serve`: an OpenAI-compatible HTTP server (cpp-httplib) in front of
// the Engine facade (no CAF here). Routes:
//   POST /v1/chat/completions, /v1/completions   OpenAI requests, JSON or SSE streaming
//   POST /generate                                sglang's native form
//   POST /tokenize, /detokenize                   vLLM's forms
//   GET  /v1/models, /health (503 while loading or stopping), /server_info, /metrics (Prometheus)
// A streaming client that disconnects cancels its request; SIGINT/SIGTERM stop accepting, let
// requests finish up to a grace period (then cancel them) and return 0.
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
};

// The longest --grace-period (a week): longer ones are refused rather than overflowing the deadline.
inline constexpr double kMaxGraceSeconds = 7 * 24 * 3600.0;

// Refuses serve options that cannot work (an empty API key, a grace period beyond kMaxGraceSeconds).
void check_serve_options(const ServeOptions& options);

// Binds args.host:args.port (ConfigError when it cannot), answers /health with 503 while the
// engine loads the model, serves until SIGINT or SIGTERM, drains, and returns 0.
int serve(const config::ServerArgs& args, const ServeOptions& options);

}  // namespace specactor::server
