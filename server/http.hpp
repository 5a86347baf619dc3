// server/http.hpp — the HTTP/1.1 layer of `specactor serve`: event-driven, on libmicrohttpd (Debian's
// libmicrohttpd-dev), no CAF and no engine here.
//
// What it guarantees whatever the clients do:
//   - a fixed number of threads (Limits::threads), however many connections are open; a request that
//     waits for the engine, and a stream between two writes, holds no thread (the connection is
//     suspended and resumed by Reply);
//   - the request line and headers fit in Limits::max_header_bytes and Limits::max_headers (else 431);
//     the body in Limits::max_body_bytes, counted for chunked bodies too (else 413, before reading
//     when Content-Length says so);
//   - deadlines a trickle cannot extend: all headers within header_timeout_s of the connection's
//     start (or of the end of its previous exchange, so it is also the keep-alive idle time); the
//     whole body within body_timeout_s of the last header; after that the connection is closed;
//   - beyond Limits::max_connections open connections, requests get 503 + Retry-After;
//   - the port is bound with SO_REUSEADDR only (a second server on a held port fails to bind), the
//     listen backlog is Limits::backlog;
//   - a client that goes away while its exchange waits is noticed (every 100 ms) and the exchange
//     ends: Reply::on_close(false) runs, so the caller can cancel the work.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace specactor::server::http {

struct Limits {
  int threads = 4;                          // HTTP threads, fixed
  std::int64_t max_connections = 1000;      // open connections beyond this get 503 + Retry-After
  std::int64_t max_body_bytes = 8 << 20;    // larger bodies: 413
  std::size_t max_header_bytes = 32 << 10;  // request line + headers (libmicrohttpd's per-connection memory)
  std::size_t max_headers = 100;            // header lines beyond this: 431
  double header_timeout_s = 10;             // connect (or previous exchange's end) → last header
  double body_timeout_s = 60;               // last header → last body byte
  double send_idle_timeout_s = 60;          // a response the client stops reading for this long is cut
  int backlog = 1024;                       // listen(2) backlog
};

using Headers = std::vector<std::pair<std::string, std::string>>;

struct Request {
  std::string method, path, version;  // path as sent, without the query string
  Headers headers;                    // in the order sent
  std::string body;
  // The first header of that name (case-insensitive), or "" when absent.
  std::string header(std::string_view name) const;
};

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  Headers headers;
};

// The answer to one exchange, a cheap handle that may be copied to any thread. Exactly one of:
// send() a whole response; or stream() to begin a body of unknown length, write() parts of it, end()
// it. Calls after the exchange ended (closed()) do nothing.
class Reply {
 public:
  void send(Response r) const;
  void stream(int status, std::string content_type, Headers headers = {}) const;
  void write(std::string data) const;
  void end() const;
  // Runs once when the exchange ends: ok = the whole response went out; false = the client went away,
  // a deadline cut it, or the server stopped first. Set it before anything can end the exchange
  // (in the handler, before handing the Reply on).
  void on_close(std::function<void(bool ok)> f) const;
  bool closed() const;
  // Appended to the exchange's access-log line (e.g. token counts).
  void log_note(std::string note) const;

  struct Exchange;

 private:
  friend class Server;
  std::shared_ptr<Exchange> x_;
};

// Counters of what the layer refused or cut (for /metrics).
struct Stats {
  std::int64_t connections_open = 0;
  std::int64_t refused_connection_cap = 0, refused_header_too_large = 0, refused_body_too_large = 0;
  std::int64_t header_timeouts = 0, body_timeouts = 0, clients_gone = 0;
};

class Server {
 public:
  // Runs when a request's headers are in, before its body is read: a Response refuses the request
  // without reading the body (authentication, an unknown route, a Content-Type).
  using Precheck = std::function<std::optional<Response>(const Request& head)>;
  // Runs on an HTTP thread once the body is in; answers through the Reply now or later, from any thread.
  using Handler = std::function<void(const Request&, const Reply&)>;

  Server(Limits limits, Precheck precheck, Handler handler);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds host:port exclusively and starts the threads; throws config::ConfigError naming --host and
  // --port when it cannot (address in use, not an address of this machine).
  void listen(const std::string& host, int port);
  // Ends every exchange (waiting ones end as the client gone; streams end without their last
  // chunk), closes every connection and the port. Idempotent.
  void stop();
  // Exchanges whose handler ran and whose response has not finished going out.
  std::int64_t open_exchanges() const;
  Stats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The file-descriptor limit this process needs for `connections` open connections, raised to that
// (within the hard limit) — false when the hard limit is lower; `have` gets what is possible.
bool ensure_fd_limit(std::int64_t connections, std::int64_t& have);

}  // namespace specactor::server::http
