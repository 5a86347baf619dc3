// actors/gate.hpp — the byte path between a worker's port and its CAF network layer.
//
// CAF 0.17's BASP reader allocates the payload a frame header announces before a byte of it has
// arrived, and has no limit of its own: one 32-byte header announcing 4 GiB ended a worker with
// std::bad_alloc, and each connection announcing 1 GiB held ~0.7 GB. So a worker publishes its actor
// on a loopback port that only its gate connects to, and the gate listens where the user asked. For
// each peer it opens its own connection to that port and passes bytes on, checking the peer's side
// frame by frame (BASP: a 32-byte header — operation, 2 padding bytes, flags, a big-endian 32-bit
// payload length, three 64-bit fields — then the payload):
//   - a header whose operation is not what a client sends (its handshake first, then 1..6) or whose
//     payload is larger than `max_frame_bytes` closes the connection before anything of the payload
//     is kept;
//   - a frame goes on only when it is whole, so CAF allocates only for bytes the peer has sent;
//   - the first whole frame must arrive within `handshake_timeout_s` of the connection (TLS
//     handshake included), and every later frame within `frame_timeout_s` of its first byte: held
//     connections and slow drips are closed;
//   - at most `max_connections` peers at a time (more are closed at once), and a peer is read only
//     while all peers' buffered bytes together are under `max_buffered_bytes`.
// Without TLS a peer first proves the cluster secret (GateOptions::secret), unless the worker runs
// --insecure. With TLS files the gate is the TLS server (OpenSSL, files loaded and checked at start): a peer
// must present a certificate that chains to the CA, and a failed handshake costs one closed socket.
// What CAF sends back to a peer is passed on unchecked (the worker's own bytes).
// No CAF here: a thread with poll(2) and plain sockets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace specactor::actors {

struct GateOptions {
  std::size_t max_frame_bytes = std::size_t{256} << 20;
  std::size_t max_buffered_bytes = std::size_t{1} << 30;
  std::int64_t max_connections = 64;
  double handshake_timeout_s = 10;
  double frame_timeout_s = 60;
  // TLS server with a client certificate required; all three or none (checked by check_tls first).
  std::string tls_certificate, tls_key, tls_ca;
  // Without TLS: the cluster secret a peer must prove before a byte reaches CAF (empty: none, the
  // worker's --insecure). The gate sends 16 bytes of magic (the first 0xff, which a plain CAF client
  // takes for a bad frame and closes on) and a 32-byte random nonce; the peer answers with
  // HMAC-SHA256(secret, context || nonce); the gate answers one byte 1 and the link is CAF's.
  std::string secret;
};

struct GateStats {
  std::int64_t accepted = 0;           // connections taken
  std::int64_t open = 0;               // open now
  std::int64_t refused_full = 0;       // closed at once: max_connections were open
  std::int64_t refused_oversized = 0;  // a frame announced more than max_frame_bytes
  std::int64_t refused_garbage = 0;    // not a BASP operation
  std::int64_t refused_tls = 0;        // the TLS handshake failed (no certificate, another CA, not TLS)
  std::int64_t refused_secret = 0;     // a wrong answer to the challenge
  std::int64_t timed_out = 0;          // no first frame in time, or a frame not finished in time
  std::int64_t frames = 0;             // whole frames passed on
  std::int64_t buffered_bytes = 0;     // held now, all peers
};

class Gate {
 public:
  // Listens on host:port (0: a free port) and forwards to 127.0.0.1:inner_port. Throws
  // config::ConfigError naming --host/--port when it cannot listen, or the TLS flags when their files
  // do not load.
  static std::unique_ptr<Gate> open(const std::string& host, std::uint16_t port, std::uint16_t inner_port,
                                    const GateOptions& options);
  ~Gate();
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;

  std::uint16_t port() const;
  GateStats stats() const;

  struct Impl;

 private:
  explicit Gate(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The client's side of the challenge on a connected socket (blocking or not): reads the challenge,
// answers it, reads the verdict, all within `timeout_s`. Returns "" or why it failed.
std::string prove_secret(int fd, const std::string& secret, double timeout_s);

// A non-blocking listening TCP socket on host:port (SO_REUSEADDR, never SO_REUSEPORT); -1 with
// `why` when it cannot be had.
int listen_tcp(const std::string& host, std::uint16_t port, int backlog, std::string& why);

// A non-blocking TCP connection to host:port, made within `timeout_s`; -1 with `why` when it fails.
int dial(const std::string& host, std::uint16_t port, double timeout_s, std::string& why);

// The per-user cluster secret: $XDG_CONFIG_HOME/specactor/cluster-secret (an absolute
// $XDG_CONFIG_HOME), else $HOME/.config/specactor/cluster-secret; "" when neither is set.
std::string default_secret_file();

// The secret in `path` (surrounding whitespace dropped, at least 16 characters), from a regular file
// of at most 4 KiB that only its owner may read (mode 600). With `create`, a missing file is made with
// 32 random bytes in hex (mode 600). ConfigError naming `flag` and the file.
std::string load_secret(const std::string& path, const std::string& flag, bool create);

}  // namespace specactor::actors
