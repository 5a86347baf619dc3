#include "actors/gate.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <list>
#include <mutex>
#include <thread>
#include <vector>

#include "config/error.hpp"
#include "config/input.hpp"

namespace specactor::actors {

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kHeader = 32;  // BASP's header
constexpr std::size_t kMagic = 16, kNonce = 32, kProof = 32;
constexpr char kMagicText[kMagic + 1] = "\xffspecactorgate1";  // 0xff: no BASP operation (a CAF client closes)
constexpr char kAccepted = 1;
constexpr std::uint8_t kClientHandshake = 1;           // BASP operations: server_handshake 0, client_handshake 1,
constexpr std::uint8_t kLastOperation = 6;             // direct 2, routed 3, monitor 4, down 5, heartbeat 6
constexpr std::size_t kChunk = 64 * 1024;              // one read
constexpr std::size_t kPendingCap = 4u << 20;          // a side is read only while its output is below this
constexpr auto kCloseGrace = std::chrono::seconds(2);  // what a closing connection has to flush

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string peer_name(const sockaddr_storage& a) {
  char host[INET6_ADDRSTRLEN] = "?";
  unsigned port = 0;
  if (a.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    ::inet_ntop(AF_INET, &v4->sin_addr, host, sizeof host);
    port = ntohs(v4->sin_port);
    return std::string(host) + ":" + std::to_string(port);
  }
  if (a.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
    ::inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof host);
    port = ntohs(v6->sin6_port);
  }
  return "[" + std::string(host) + "]:" + std::to_string(port);
}

std::string ssl_reason() {
  std::string why;
  while (const unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    why = buf;
  }
  return why.empty() ? "unknown" : why;
}

void secret_proof(const std::string& secret, const unsigned char* nonce, unsigned char* out) {
  static constexpr char kContext[] = "specactor worker gate 1: a front proves the cluster secret";
  std::string msg(kContext);
  msg.append(reinterpret_cast<const char*>(nonce), kNonce);
  unsigned int len = kProof;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), reinterpret_cast<const unsigned char*>(msg.data()),
       msg.size(), out, &len);
}

struct Conn {
  int peer = -1, inner = -1;
  SSL* ssl = nullptr;
  bool tls_done = true;  // false while the TLS handshake runs
  bool proven = true;    // false until the peer proved the secret
  unsigned char nonce[kNonce] = {};
  bool peer_wants_write = false;  // TLS: the last read or handshake needs the socket writable
  std::size_t ssl_write_len = 0;  // TLS: a write to repeat with the same length
  std::string addr;
  std::string in;        // from the peer: the start of a frame not yet whole
  std::string to_inner;  // whole frames for CAF
  std::size_t to_inner_off = 0;
  std::string to_peer;  // from CAF
  std::size_t to_peer_off = 0;
  Clock::time_point opened = Clock::now(), frame_start;
  bool greeted = false;   // a whole frame has arrived
  bool in_frame = false;  // `in` holds part of a frame
  bool closing = false;
  Clock::time_point closing_since;
  std::size_t held() const { return in.size() + (to_inner.size() - to_inner_off) + (to_peer.size() - to_peer_off); }
};

}  // namespace

struct Gate::Impl {
  GateOptions opt;
  std::uint16_t inner_port = 0;
  std::uint16_t port = 0;
  int listen_fd = -1;
  int wake[2] = {-1, -1};
  SSL_CTX* ctx = nullptr;
  std::list<Conn> conns;
  std::size_t buffered = 0;  // held by every connection (the loop's own count)
  mutable std::mutex mu;
  GateStats stats;
  std::thread thread;
  std::int64_t warnings = 0;

  ~Impl() {
    for (Conn& c : conns) drop(c);
    if (listen_fd >= 0) ::close(listen_fd);
    for (int fd : wake)
      if (fd >= 0) ::close(fd);
    if (ctx) SSL_CTX_free(ctx);
  }

  template <class F>
  void count(F f) {
    std::lock_guard<std::mutex> lock(mu);
    f(stats);
  }

  // A refusal is logged, the first few and then every 100th (a flood must not flood the log).
  void refuse(Conn& c, const std::string& why, std::int64_t GateStats::*counter) {
    count([&](GateStats& s) { ++(s.*counter); });
    ++warnings;
    if (warnings <= 10 || warnings % 100 == 0)
      spdlog::warn("worker: closed the connection from {}: {}{}", c.addr, why,
                   warnings == 10 ? " (further refusals are logged every 100th)" : "");
    drop(c);
  }

  void drop(Conn& c) {
    if (c.ssl) {
      SSL_free(c.ssl);
      c.ssl = nullptr;
    }
    if (c.peer >= 0) ::close(c.peer);
    if (c.inner >= 0) ::close(c.inner);
    if (c.peer >= 0 || c.inner >= 0) count([](GateStats& s) { --s.open; });
    c.peer = c.inner = -1;
    c.in.clear();
    c.to_inner.clear();
    c.to_peer.clear();
    c.to_inner_off = c.to_peer_off = 0;
  }

  void start_closing(Conn& c) {
    if (c.closing) return;
    c.closing = true;
    c.closing_since = Clock::now();
    c.in.clear();  // a frame cut short goes nowhere
  }

  bool can_read_peer(const Conn& c) const {
    return !c.closing && buffered < opt.max_buffered_bytes && c.to_inner.size() - c.to_inner_off < kPendingCap;
  }
  bool can_read_inner(const Conn& c) const { return !c.closing && c.to_peer.size() - c.to_peer_off < kPendingCap; }

  // One connection from the queue; false when none is waiting.
  bool accept_one() {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&a), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return errno == EINTR || errno == ECONNABORTED;
    Conn c;
    c.peer = fd;
    c.addr = peer_name(a);
    count([](GateStats& s) {
      ++s.accepted;
      ++s.open;
    });
    if (static_cast<std::int64_t>(conns.size()) >= opt.max_connections) {
      refuse(c, std::to_string(opt.max_connections) + " connections are open (the limit)", &GateStats::refused_full);
      return true;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (ctx) {
      // CAF is reached once the TLS handshake (with the peer's certificate) succeeded.
    } else if (!opt.secret.empty()) {  // the challenge first; CAF is reached once the proof is right
      c.proven = false;
      if (RAND_bytes(c.nonce, sizeof c.nonce) != 1) {
        spdlog::error("worker: no random bytes for a challenge ({})", ssl_reason());
        drop(c);
        return true;
      }
      c.to_peer.assign(kMagicText, kMagic);
      c.to_peer.append(reinterpret_cast<const char*>(c.nonce), kNonce);
    } else if (!connect_inner(c)) {
      return true;
    }
    if (ctx) {
      c.ssl = SSL_new(ctx);
      if (!c.ssl || SSL_set_fd(c.ssl, fd) != 1) {
        refuse(c, "TLS: " + ssl_reason(), &GateStats::refused_tls);
        return true;
      }
      SSL_set_accept_state(c.ssl);
      c.tls_done = false;
    }
    conns.push_back(std::move(c));
    return true;
  }

  // The connection to CAF's loopback port; false (the connection dropped) when it cannot be made.
  bool connect_inner(Conn& c) {
    const int in = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(inner_port);
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (in < 0 || ::connect(in, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
      spdlog::error("worker: cannot reach its own network layer on 127.0.0.1:{} ({})", inner_port,
                    std::strerror(errno));
      if (in >= 0) ::close(in);
      drop(c);
      return false;
    }
    ::fcntl(in, F_SETFL, ::fcntl(in, F_GETFL) | O_NONBLOCK);
    int one = 1;
    ::setsockopt(in, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c.inner = in;
    return true;
  }

  // The peer's answer to the challenge (kProof bytes in `c.in`). False when the connection was closed.
  bool check_proof(Conn& c) {
    if (c.in.size() < kProof) return true;
    unsigned char want[kProof];
    secret_proof(opt.secret, c.nonce, want);
    if (CRYPTO_memcmp(want, c.in.data(), kProof) != 0) {
      refuse(c, "it did not prove the cluster secret (--secret-file)", &GateStats::refused_secret);
      return false;
    }
    c.in.erase(0, kProof);
    c.proven = true;
    c.to_peer.push_back(kAccepted);
    if (!connect_inner(c)) return false;
    return c.in.empty() || take_frames(c);
  }

  // TLS handshake progress; false when the connection was closed.
  bool handshake(Conn& c) {
    ERR_clear_error();
    const int r = SSL_do_handshake(c.ssl);
    if (r == 1) {
      c.tls_done = true;
      c.peer_wants_write = false;
      return connect_inner(c);
    }
    const int e = SSL_get_error(c.ssl, r);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
      c.peer_wants_write = e == SSL_ERROR_WANT_WRITE;
      return true;
    }
    refuse(c, "the TLS handshake failed (" + ssl_reason() + ")", &GateStats::refused_tls);
    return false;
  }

  // Checks the frames in `c.in`; moves the whole ones on. False when the connection was refused.
  bool take_frames(Conn& c) {
    std::size_t at = 0;
    while (c.in.size() - at >= kHeader) {
      const auto* h = reinterpret_cast<const unsigned char*>(c.in.data() + at);
      // A peer's first frame is its handshake (1), then handshakes and messages (1..6); a server
      // handshake (0) from a peer is not the protocol (CAF 0.17 crashed on it).
      const bool first = !c.greeted;
      if (first ? h[0] != kClientHandshake : (h[0] < kClientHandshake || h[0] > kLastOperation)) {
        refuse(c,
               "not the worker protocol (operation " + std::to_string(h[0]) +
                   (first ? " where a handshake was due)" : ")"),
               &GateStats::refused_garbage);
        return false;
      }
      const std::uint32_t len =
          (std::uint32_t{h[4]} << 24) | (std::uint32_t{h[5]} << 16) | (std::uint32_t{h[6]} << 8) | std::uint32_t{h[7]};
      if (len > opt.max_frame_bytes) {
        refuse(c,
               "a message of " + std::to_string(len) + " bytes, more than the limit of " +
                   std::to_string(opt.max_frame_bytes) + " (--max-message-mib)",
               &GateStats::refused_oversized);
        return false;
      }
      if (c.in.size() - at < kHeader + len) break;
      c.to_inner.append(c.in, at, kHeader + len);
      at += kHeader + len;
      c.greeted = true;
      count([](GateStats& s) { ++s.frames; });
    }
    c.in.erase(0, at);
    const bool partial = !c.in.empty();
    if (partial && (!c.in_frame || at > 0)) c.frame_start = Clock::now();
    c.in_frame = partial;
    return true;
  }

  // Reads what the peer sent. False when the connection was closed.
  bool read_peer(Conn& c) {
    char buf[kChunk];
    while (can_read_peer(c)) {
      ssize_t n;
      if (c.ssl) {
        ERR_clear_error();
        const int r = SSL_read(c.ssl, buf, sizeof buf);
        if (r <= 0) {
          const int e = SSL_get_error(c.ssl, r);
          if (e == SSL_ERROR_WANT_READ) return true;
          if (e == SSL_ERROR_WANT_WRITE) {
            c.peer_wants_write = true;
            return true;
          }
          if (e == SSL_ERROR_ZERO_RETURN) {
            start_closing(c);
            return true;
          }
          drop(c);
          return false;
        }
        n = r;
      } else {
        n = ::recv(c.peer, buf, sizeof buf, 0);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
        if (n < 0) {
          drop(c);
          return false;
        }
        if (n == 0) {
          start_closing(c);
          return true;
        }
      }
      c.in.append(buf, static_cast<std::size_t>(n));
      buffered += static_cast<std::size_t>(n);
      if (!c.proven) {
        if (c.in.size() > kProof + kChunk) {  // a client waits for the verdict before it speaks
          refuse(c, "it sent more than the answer to the challenge", &GateStats::refused_secret);
          return false;
        }
        if (!check_proof(c)) return false;
        continue;
      }
      if (!take_frames(c)) return false;
    }
    return true;
  }

  bool read_inner(Conn& c) {
    char buf[kChunk];
    while (can_read_inner(c)) {
      const ssize_t n = ::recv(c.inner, buf, sizeof buf, 0);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
      if (n <= 0) {
        start_closing(c);
        return true;
      }
      c.to_peer.append(buf, static_cast<std::size_t>(n));
      buffered += static_cast<std::size_t>(n);
    }
    return true;
  }

  bool write_inner(Conn& c) {
    while (c.to_inner_off < c.to_inner.size()) {
      const ssize_t n =
          ::send(c.inner, c.to_inner.data() + c.to_inner_off, c.to_inner.size() - c.to_inner_off, MSG_NOSIGNAL);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
      if (n <= 0) {
        drop(c);
        return false;
      }
      c.to_inner_off += static_cast<std::size_t>(n);
    }
    if (c.to_inner_off == c.to_inner.size()) {
      c.to_inner.clear();
      c.to_inner_off = 0;
    }
    return true;
  }

  bool write_peer(Conn& c) {
    while (c.to_peer_off < c.to_peer.size()) {
      const std::size_t rest = c.to_peer.size() - c.to_peer_off;
      ssize_t n;
      if (c.ssl) {
        const std::size_t len = c.ssl_write_len ? c.ssl_write_len : std::min<std::size_t>(rest, 1u << 20);
        ERR_clear_error();
        const int r = SSL_write(c.ssl, c.to_peer.data() + c.to_peer_off, static_cast<int>(len));
        if (r <= 0) {
          const int e = SSL_get_error(c.ssl, r);
          if (e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ) {
            c.ssl_write_len = len;
            break;
          }
          drop(c);
          return false;
        }
        c.ssl_write_len = 0;
        n = r;
      } else {
        n = ::send(c.peer, c.to_peer.data() + c.to_peer_off, rest, MSG_NOSIGNAL);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
        if (n <= 0) {
          drop(c);
          return false;
        }
      }
      c.to_peer_off += static_cast<std::size_t>(n);
    }
    if (c.to_peer_off == c.to_peer.size()) {
      c.to_peer.clear();
      c.to_peer_off = 0;
    }
    return true;
  }

  // Handshake deadlines, frame deadlines, and closing connections that have flushed.
  void sweep() {
    for (Conn& c : conns) {
      if (c.peer < 0) continue;
      if (c.closing) {
        const bool flushed = c.to_inner_off == c.to_inner.size() && c.to_peer_off == c.to_peer.size();
        if (flushed || Clock::now() - c.closing_since > kCloseGrace) drop(c);
        continue;
      }
      if (!c.greeted && seconds_since(c.opened) > opt.handshake_timeout_s) {
        refuse(c,
               std::string(c.proven ? "no handshake" : "no answer to the challenge") + " within " +
                   std::to_string(static_cast<int>(opt.handshake_timeout_s)) + " s",
               &GateStats::timed_out);
      } else if (c.in_frame && seconds_since(c.frame_start) > opt.frame_timeout_s) {
        refuse(c, "a message not finished within " + std::to_string(static_cast<int>(opt.frame_timeout_s)) + " s",
               &GateStats::timed_out);
      }
    }
    conns.remove_if([](const Conn& c) { return c.peer < 0; });
    buffered = 0;
    for (const Conn& c : conns) buffered += c.held();
    count([&](GateStats& s) { s.buffered_bytes = static_cast<std::int64_t>(buffered); });
  }

  void loop() {
    std::vector<pollfd> fds;
    std::vector<Conn*> who;
    for (;;) {
      sweep();
      fds.clear();
      who.clear();
      fds.push_back({wake[0], POLLIN, 0});
      fds.push_back({listen_fd, POLLIN, 0});
      bool pending_tls = false;
      for (Conn& c : conns) {
        short pe = 0, ie = 0;
        if (!c.tls_done) {
          pe = c.peer_wants_write ? POLLOUT : POLLIN;
        } else {
          if (can_read_peer(c)) pe |= POLLIN;
          if (c.to_peer_off < c.to_peer.size() || c.peer_wants_write) pe |= POLLOUT;
          if (can_read_inner(c)) ie |= POLLIN;
          if (c.to_inner_off < c.to_inner.size()) ie |= POLLOUT;
          if (c.ssl && can_read_peer(c) && SSL_pending(c.ssl) > 0) pending_tls = true;
        }
        fds.push_back({c.peer, pe, 0});
        fds.push_back({c.inner, ie, 0});
        who.push_back(&c);
      }
      const int n = ::poll(fds.data(), fds.size(), pending_tls ? 0 : 250);
      if (n < 0 && errno != EINTR) {
        spdlog::error("worker: poll failed: {}", std::strerror(errno));
        return;
      }
      if (fds[0].revents) return;  // stop
      if (fds[1].revents & POLLIN)
        for (int k = 0; k < 16 && accept_one(); ++k) {
        }
      for (std::size_t i = 0; i < who.size(); ++i) {
        Conn& c = *who[i];
        const short pr = fds[2 + 2 * i].revents, ir = fds[3 + 2 * i].revents;
        if (c.peer < 0) continue;
        if (!c.tls_done) {
          if (pr && !handshake(c)) continue;
          if (!c.tls_done) continue;
        }
        const bool tls_pending = c.ssl && SSL_pending(c.ssl) > 0;
        if ((pr & (POLLIN | POLLHUP | POLLERR)) || tls_pending || (c.peer_wants_write && (pr & POLLOUT))) {
          c.peer_wants_write = false;
          if (!read_peer(c)) continue;
        }
        if (ir & (POLLIN | POLLHUP | POLLERR))
          if (!read_inner(c)) continue;
        if (c.to_inner_off < c.to_inner.size() && !write_inner(c)) continue;
        if (c.to_peer_off < c.to_peer.size() && !write_peer(c)) continue;
      }
    }
  }
};

Gate::Gate(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Gate::~Gate() {
  if (impl_->thread.joinable()) {
    const char x = 1;
    [[maybe_unused]] const ssize_t w = ::write(impl_->wake[1], &x, 1);
    impl_->thread.join();
  }
}

std::uint16_t Gate::port() const { return impl_->port; }

GateStats Gate::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

std::unique_ptr<Gate> Gate::open(const std::string& host, std::uint16_t port, std::uint16_t inner_port,
                                 const GateOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->opt = options;
  impl->inner_port = inner_port;
  if (!options.tls_certificate.empty()) {
    ERR_clear_error();
    impl->ctx = SSL_CTX_new(TLS_server_method());
    auto bad = [&](const std::string& flag, const std::string& what) {
      return config::ConfigError(flag + ": " + what + " (" + ssl_reason() + ")");
    };
    if (!impl->ctx) throw config::ConfigError("TLS: cannot create an OpenSSL context (" + ssl_reason() + ")");
    SSL_CTX_set_default_passwd_cb(impl->ctx, [](char*, int, int, void*) { return 0; });
    if (SSL_CTX_use_certificate_chain_file(impl->ctx, options.tls_certificate.c_str()) != 1)
      throw bad("--tls-certificate " + options.tls_certificate, "not a usable PEM certificate");
    if (SSL_CTX_use_PrivateKey_file(impl->ctx, options.tls_key.c_str(), SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(impl->ctx) != 1)
      throw bad("--tls-key " + options.tls_key, "not the certificate's unencrypted PEM key");
    if (SSL_CTX_load_verify_locations(impl->ctx, options.tls_ca.c_str(), nullptr) != 1)
      throw bad("--tls-ca " + options.tls_ca, "holds no usable PEM certificate");
    SSL_CTX_set_verify(impl->ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
    SSL_CTX_set_mode(impl->ctx, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_ENABLE_PARTIAL_WRITE);
  }
  std::string why;
  impl->listen_fd = listen_tcp(host, port, 128, why);
  if (impl->listen_fd < 0)
    throw config::ConfigError("--port: cannot listen on " + host + ":" + std::to_string(port) + " (" + why + ")");
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  ::getsockname(impl->listen_fd, reinterpret_cast<sockaddr*>(&a), &len);
  impl->port = a.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&a)->sin6_port)
                                       : ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port);
  if (::pipe2(impl->wake, O_CLOEXEC) != 0) throw std::runtime_error("gate: pipe2 failed");
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->loop(); });
  return std::unique_ptr<Gate>(new Gate(std::move(impl)));
}

std::string prove_secret(int fd, const std::string& secret, double timeout_s) {
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  auto io = [&](bool reading, char* data, std::size_t n) -> bool {
    std::size_t done = 0;
    while (done < n) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return false;
      pollfd p{fd, static_cast<short>(reading ? POLLIN : POLLOUT), 0};
      const int r = ::poll(&p, 1, static_cast<int>(left));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
      const ssize_t k = reading ? ::recv(fd, data + done, n - done, MSG_DONTWAIT)
                                : ::send(fd, data + done, n - done, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
      if (k <= 0) return false;
      done += static_cast<std::size_t>(k);
    }
    return true;
  };
  char challenge[kMagic + kNonce];
  if (!io(true, challenge, sizeof challenge))
    return "no challenge arrived (not a specactor worker, one started with --insecure, or one with TLS)";
  if (std::memcmp(challenge, kMagicText, kMagic) != 0)
    return "what answered is not a specactor worker's gate (or one started with --insecure)";
  unsigned char proof[kProof];
  secret_proof(secret, reinterpret_cast<const unsigned char*>(challenge + kMagic), proof);
  if (!io(false, reinterpret_cast<char*>(proof), kProof)) return "the connection closed during the challenge";
  char verdict = 0;
  if (!io(true, &verdict, 1) || verdict != kAccepted)
    return "the worker refused this side's cluster secret (the secret files differ)";
  return {};
}

std::string default_secret_file() {
  const char* xdg = std::getenv("XDG_CONFIG_HOME");
  if (xdg && *xdg && xdg[0] == '/') return std::string(xdg) + "/specactor/cluster-secret";
  const char* home = std::getenv("HOME");
  if (home && *home) return std::string(home) + "/.config/specactor/cluster-secret";
  return {};
}

std::string load_secret(const std::string& path, const std::string& flag, bool create) {
  namespace fs = std::filesystem;
  const std::string what = flag + " " + config::printable(path);
  if (path.empty())
    throw config::ConfigError(flag +
                              ": no file given, and neither $XDG_CONFIG_HOME nor $HOME is set to find the "
                              "default one");
  std::error_code ec;
  if (create && !fs::exists(path, ec)) {
    const fs::path dir = fs::path(path).parent_path();
    if (!dir.empty()) {
      fs::create_directories(dir, ec);
      if (ec) throw config::ConfigError(what + ": cannot create " + dir.string() + ": " + ec.message());
    }
    unsigned char raw[32];
    if (RAND_bytes(raw, sizeof raw) != 1) throw config::ConfigError(what + ": no random bytes (" + ssl_reason() + ")");
    static const char* hex = "0123456789abcdef";
    std::string text;
    for (unsigned char b : raw) {
      text.push_back(hex[b >> 4]);
      text.push_back(hex[b & 15]);
    }
    text.push_back('\n');
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd >= 0) {  // else another process made it first: read theirs
      const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
      ::close(fd);
      if (!ok) throw config::ConfigError(what + ": cannot write the new secret");
      spdlog::info(
          "made a new cluster secret in {} (copy it to the machines of fronts and workers that "
          "connect to each other, or use TLS)",
          path);
    } else if (errno != EEXIST) {
      throw config::ConfigError(what + ": cannot create the file: " + std::strerror(errno));
    }
  }
  if (!create && !fs::exists(path, ec))
    throw config::ConfigError(what +
                              ": no such file (a worker makes it when it first starts; on another machine, "
                              "copy the workers' file here, or use TLS)");
  std::size_t size = 0;
  const int fd = config::open_regular_file(path, what, size);
  struct stat st {};
  const bool shared = ::fstat(fd, &st) == 0 && (st.st_mode & 077) != 0;
  ::close(fd);
  if (shared)
    throw config::ConfigError(what + ": other users may read or change it (mode " +
                              fmt::format("{:03o}", st.st_mode & 0777) + "); chmod 600 it");
  std::string text = config::read_text_file(path, what, 4096);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.erase(text.begin());
  if (text.size() < 16)
    throw config::ConfigError(what + ": a secret of at least 16 characters was expected (got " +
                              std::to_string(text.size()) + ")");
  return text;
}

int listen_tcp(const std::string& host, std::uint16_t port, int backlog, std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res)) {
    why = gai_strerror(rc);
    return -1;
  }
  int out = -1;
  why = "no address";
  for (addrinfo* ai = res; ai && out < 0; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) continue;
    // SO_REUSEADDR lets a restarted server take its port back while old connections linger; never
    // SO_REUSEPORT, with which a second server on the port would silently share it.
    int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, backlog) == 0) {
      out = fd;
    } else {
      why = std::string(std::strerror(errno)) + "; address in use, or not an address of this machine";
      ::close(fd);
    }
  }
  ::freeaddrinfo(res);
  return out;
}

int dial(const std::string& host, std::uint16_t port, double timeout_s, std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res)) {
    why = gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  why = "no address";
  for (addrinfo* ai = res; ai && fd < 0; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) continue;
    int r = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (r != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      r = ::poll(&p, 1, static_cast<int>(timeout_s * 1000));
      int err = 0;
      socklen_t len = sizeof err;
      if (r == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) {
        r = 0;
      } else {
        why = r == 0 ? "timed out" : std::strerror(err ? err : errno);
        r = -1;
      }
    } else if (r != 0) {
      why = std::strerror(errno);
    }
    if (r != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  if (fd >= 0) {
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  return fd;
}

}  // namespace specactor::actors
