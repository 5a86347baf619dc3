// actors/replica.hpp — an engine replica that other processes reach over CAF's network layer
// (`specactor worker`). The replica actor wraps a local Engine and speaks the protocol of
// actors/wire.hpp; a front (actors/cluster.hpp) routes requests to it.
#pragma once

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <functional>
#include <string>

#include "actors/engine.hpp"
#include "actors/wire.hpp"

namespace specactor::actors {

// The replica actor (detached: it answers metrics by asking the engine, which blocks). It keeps the
// requests of each front by the front's id, monitors the fronts and cancels the requests of one
// that goes away. `engine` must outlive it.
caf::actor spawn_replica(caf::actor_system& system, Engine& engine);

struct WorkerOptions {
  std::string host = "127.0.0.1";  // loopback unless told otherwise
  std::uint16_t port = 31000;      // 0: the system picks one (printed)
  TlsFiles tls;                    // TLS with certificates; required off loopback unless allow_insecure
  std::string secret_file;         // without TLS: the cluster secret's file (empty: the per-user default)
  bool allow_insecure = false;     // plain TCP with no secret (a network and machine you trust)
  std::size_t max_message_bytes = std::size_t{256} << 20;  // a peer's message above this closes its connection
  std::string role = "target";  // target: an engine replica; draft: draft workers for remote schedulers
};

// `specactor worker`: loads the engine, publishes the replica on a loopback port behind a gate
// (actors/gate.hpp: message size limit, handshake and message deadlines, connection limit, TLS) that
// listens on host:port (a port another process holds is refused; a front proves the cluster secret,
// or TLS with certificates, unless allow_insecure), prints "specactor worker: listening on
// HOST:PORT" on stdout, and serves until SIGINT or SIGTERM; requests in flight then end with an error event.
// `on_listening` (tests) gets the bound port. Returns the exit status. With role "draft" it loads the target model's
// weights and tokenizer (heads share them; the target's KV stays with the target) and spawns a draft worker for each
// scheduler that asks
// (--speculative-draft-worker), from the draft snapshot that scheduler derived and sent; a worker
// ends when its scheduler goes away.
int run_worker(const config::ServerArgs& args, const WorkerOptions& options);

}  // namespace specactor::actors
