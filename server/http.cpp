// server/http.cpp — see http.hpp.
//
// How an exchange runs on libmicrohttpd (MHD): the access handler is called when the headers are in
// (the precheck and the limits run; a refusal is queued at once and MHD skips the body), then once per
// piece of the body (counted, kept up to the limit), then with the body complete (the Handler runs).
// If the Handler has not answered yet, the connection is suspended — it leaves MHD's event loop and
// holds no thread — and Reply::send/stream/write/end resume it; MHD then calls the access handler
// again, which queues what is ready. A stream is a response of unknown length whose reader hands out
// what write() gave and suspends the connection when it has nothing; write() and end() resume it.
// Suspended connections are invisible to MHD (no timeout, no disconnect detection), so a watchdog
// thread peeks at their sockets; it also enforces the header and body deadlines, by shutting the
// socket down (MHD then sees the end of the connection and closes it in its own thread).
#include "server/http.hpp"

#include <fcntl.h>
#include <microhttpd.h>
#include <netdb.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

#include "actors/gate.hpp"
#include "config/error.hpp"

namespace specactor::server::http {

namespace {

using Clock = std::chrono::steady_clock;

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

Clock::duration secs(double s) { return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s)); }

const char* reason_phrase(int status) {
  switch (status) {
    case 413:
      return "request body too large (--max-body-bytes)";
    case 431:
      return "request headers too large";
    default:
      return "";
  }
}

// A JSON error body of the OpenAI shape, for the refusals this layer makes itself.
std::string error_json(int status, const std::string& message) {
  const char* type = status == 413   ? "request_too_large"
                     : status == 503 ? "service_unavailable"
                                     : "invalid_request_error";
  std::string m;
  for (char c : message) {
    if (c == '"' || c == '\\') m += '\\';
    m += c;
  }
  return std::string("{\"error\":{\"message\":\"") + m + "\",\"type\":\"" + type + "\",\"param\":null,\"code\":null}}";
}

}  // namespace

std::string Request::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (iequals(k, name)) return v;
  return {};
}

// One TCP connection (MHD's socket context).
struct Conn {
  enum class Phase { Headers, Body, Active } phase = Phase::Headers;
  int fd = -1;
  Clock::time_point since = Clock::now();
  std::shared_ptr<Reply::Exchange> ex;  // the exchange in progress
  bool cut = false;                     // the watchdog shut its socket down
};

struct Reply::Exchange {
  std::mutex m;
  MHD_Connection* conn = nullptr;
  const std::atomic<bool>* closing = nullptr;  // the server is stopping
  Request req;
  Clock::time_point start = Clock::now();
  int fd = -1;
  bool too_large = false, dispatched = false, counted = false, suspended = false, queued = false, closed = false,
       gone = false;
  enum class Kind { None, Whole, Stream } kind = Kind::None;
  Response whole;           // Kind::Whole
  int stream_status = 200;  // Kind::Stream
  std::string stream_type;
  Headers stream_headers;
  std::string pending;  // written, not yet handed to MHD
  std::size_t pending_off = 0;
  bool ended = false;
  int status = 0;  // what was queued
  std::function<void(bool)> on_close;
  std::string note;
  std::optional<Response> refusal;  // the precheck's, for a request without a body

  void resume_locked() {
    if (suspended && !closed) {
      suspended = false;
      MHD_resume_connection(conn);
    }
  }
};

struct Server::Impl {
  Limits limits;
  Precheck precheck;
  Handler handler;
  MHD_Daemon* daemon = nullptr;
  int listen_fd = -1;
  std::atomic<bool> closing{false};

  mutable std::mutex g;  // conns and the counters below
  std::set<Conn*> conns;
  Stats stats;
  std::int64_t open_exchanges = 0;

  std::mutex wm;
  std::condition_variable wcv;
  bool watchdog_stop = false;
  std::thread watchdog;

  // --- MHD callbacks ------------------------------------------------------------------------------
  static void notify_connection(void* cls, MHD_Connection* c, void** socket_context,
                                MHD_ConnectionNotificationCode code) {
    auto& s = *static_cast<Impl*>(cls);
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
      auto* cn = new Conn;
      if (const MHD_ConnectionInfo* info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD))
        cn->fd = info->connect_fd;
      *socket_context = cn;
      std::lock_guard<std::mutex> lock(s.g);
      s.conns.insert(cn);
      s.stats.connections_open = static_cast<std::int64_t>(s.conns.size());
    } else if (auto* cn = static_cast<Conn*>(*socket_context)) {
      {
        // Under g, so the watchdog never shuts down a descriptor MHD has closed (it closes after this).
        std::lock_guard<std::mutex> lock(s.g);
        s.conns.erase(cn);
        s.stats.connections_open = static_cast<std::int64_t>(s.conns.size());
      }
      delete cn;
      *socket_context = nullptr;
    }
  }

  static Conn* conn_of(MHD_Connection* c) {
    const MHD_ConnectionInfo* info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return info ? static_cast<Conn*>(info->socket_context) : nullptr;
  }

  static MHD_Result collect_header(void* cls, MHD_ValueKind, const char* key, const char* value) {
    static_cast<Request*>(cls)->headers.emplace_back(key ? key : "", value ? value : "");
    return MHD_YES;
  }

  // Queues a whole response. Called on the connection's MHD thread without x.m (MHD locks the
  // response while it reads a stream, and the reader takes x.m: never the other way round).
  static MHD_Result queue_whole(MHD_Connection* c, Reply::Exchange& x, const Response& r, bool close_after) {
    MHD_Response* resp =
        MHD_create_response_from_buffer(r.body.size(), const_cast<char*>(r.body.data()), MHD_RESPMEM_MUST_COPY);
    return resp ? queue(c, x, resp, r, close_after) : MHD_NO;
  }

  // Gives `resp` r's status, Content-Type and headers, queues it, and marks the exchange answered.
  static MHD_Result queue(MHD_Connection* c, Reply::Exchange& x, MHD_Response* resp, const Response& r,
                          bool close_after) {
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, r.content_type.c_str());
    for (const auto& [k, v] : r.headers) MHD_add_response_header(resp, k.c_str(), v.c_str());
    if (close_after) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    const MHD_Result ok = MHD_queue_response(c, static_cast<unsigned>(r.status), resp);
    MHD_destroy_response(resp);
    std::lock_guard<std::mutex> lock(x.m);
    x.queued = true;
    x.status = r.status;
    return ok;
  }

  static ssize_t read_stream(void* cls, uint64_t, char* buf, size_t max) {
    auto& x = **static_cast<std::shared_ptr<Reply::Exchange>*>(cls);
    std::lock_guard<std::mutex> lock(x.m);
    if (x.pending_off < x.pending.size()) {
      const std::size_t n = std::min(max, x.pending.size() - x.pending_off);
      std::memcpy(buf, x.pending.data() + x.pending_off, n);
      x.pending_off += n;
      if (x.pending_off == x.pending.size()) {
        x.pending.clear();
        x.pending_off = 0;
      }
      return static_cast<ssize_t>(n);
    }
    if (x.ended) return MHD_CONTENT_READER_END_OF_STREAM;
    if (x.gone || *x.closing) return MHD_CONTENT_READER_END_WITH_ERROR;
    x.suspended = true;
    MHD_suspend_connection(x.conn);
    return 0;
  }

  static void free_stream(void* cls) { delete static_cast<std::shared_ptr<Reply::Exchange>*>(cls); }

  // Queues what the exchange has ready, or suspends the connection until it has something.
  static MHD_Result serve(MHD_Connection* c, const std::shared_ptr<Reply::Exchange>& xp) {
    Reply::Exchange& x = *xp;
    Response whole;
    bool is_whole = false;
    {
      std::lock_guard<std::mutex> lock(x.m);
      if (x.queued) return MHD_YES;
      if (x.kind == Reply::Exchange::Kind::None) {
        if (x.gone || *x.closing) return MHD_NO;  // nothing to send, nobody to send it to: close
        x.suspended = true;
        MHD_suspend_connection(c);
        return MHD_YES;
      }
      is_whole = x.kind == Reply::Exchange::Kind::Whole;
      if (is_whole) {
        whole = std::move(x.whole);
      } else {
        whole.status = x.stream_status;
        whole.content_type = x.stream_type;
        whole.headers = x.stream_headers;
      }
    }
    // The response is made and queued outside x.m (see queue_whole).
    if (is_whole) return queue_whole(c, x, whole, false);
    auto* holder = new std::shared_ptr<Reply::Exchange>(xp);
    MHD_Response* resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 << 10, &read_stream, holder, &free_stream);
    if (!resp) {
      delete holder;
      return MHD_NO;
    }
    return queue(c, x, resp, whole, false);
  }

  // The headers are in: the exchange is made, and the limits and the precheck may refuse it at once.
  static MHD_Result on_headers(Impl& s, MHD_Connection* c, const char* url, const char* method, const char* version,
                               void** con_cls) {
    auto xp = std::make_shared<Reply::Exchange>();
    auto& x = *xp;
    x.conn = c;
    x.closing = &s.closing;
    x.req.method = method ? method : "";
    x.req.path = url ? url : "";
    x.req.version = version ? version : "";
    MHD_get_connection_values(c, MHD_HEADER_KIND, &collect_header, &x.req);
    *con_cls = new std::shared_ptr<Reply::Exchange>(xp);
    std::int64_t open = 0;
    if (Conn* cn = conn_of(c)) {
      x.fd = cn->fd;
      std::lock_guard<std::mutex> lock(s.g);
      cn->phase = Conn::Phase::Body;
      cn->since = Clock::now();
      cn->ex = xp;
      open = static_cast<std::int64_t>(s.conns.size());
    }
    auto refuse = [&](int status, const std::string& why, Headers extra = {}) {
      Response r{status, "application/json", error_json(status, why), std::move(extra)};
      return queue_whole(c, x, r, true);
    };
    if (x.req.headers.size() > s.limits.max_headers) {
      std::lock_guard<std::mutex> lock(s.g);
      ++s.stats.refused_header_too_large;
      return refuse(431, "too many header lines (at most " + std::to_string(s.limits.max_headers) + ")");
    }
    if (open > s.limits.max_connections) {
      {
        std::lock_guard<std::mutex> lock(s.g);
        ++s.stats.refused_connection_cap;
      }
      return refuse(503,
                    "too many open connections (--max-connections " + std::to_string(s.limits.max_connections) + ")",
                    {{"Retry-After", "1"}});
    }
    const std::string length = x.req.header("Content-Length");
    if (!length.empty()) {
      // MHD has refused a malformed length already; here it is digits.
      errno = 0;
      const unsigned long long n = std::strtoull(length.c_str(), nullptr, 10);
      if (errno == ERANGE || n > static_cast<unsigned long long>(s.limits.max_body_bytes)) {
        std::lock_guard<std::mutex> lock(s.g);
        ++s.stats.refused_body_too_large;
        return refuse(413, std::string(reason_phrase(413)) + ": Content-Length " + length.substr(0, 24) + " is over " +
                               std::to_string(s.limits.max_body_bytes) + " bytes");
      }
    }
    if (s.closing) return refuse(503, "the server is shutting down");
    if (std::optional<Response> r = s.precheck(x.req)) {
      const std::string te = x.req.header("Transfer-Encoding");
      if ((length.empty() || length == "0") && te.empty()) {
        x.refusal = std::move(*r);  // no body: answered when MHD has the request complete, keeping the connection
        return MHD_YES;
      }
      return queue_whole(c, x, *r, true);  // MHD skips the body and closes the connection after
    }
    return MHD_YES;
  }

  static MHD_Result access(void* cls, MHD_Connection* c, const char* url, const char* method, const char* version,
                           const char* upload_data, size_t* upload_size, void** con_cls) {
    auto& s = *static_cast<Impl*>(cls);
    auto* holder = static_cast<std::shared_ptr<Reply::Exchange>*>(*con_cls);
    if (!holder) return on_headers(s, c, url, method, version, con_cls);  // the headers are in
    const std::shared_ptr<Reply::Exchange> xp = *holder;
    Reply::Exchange& x = *xp;
    if (*upload_size > 0) {  // a piece of the body
      if (!x.too_large) {
        if (x.req.body.size() + *upload_size > static_cast<std::size_t>(s.limits.max_body_bytes)) {
          x.too_large = true;  // the rest is read and dropped (within the body deadline), then 413
          std::string().swap(x.req.body);
        } else {
          x.req.body.append(upload_data, *upload_size);
        }
      }
      *upload_size = 0;
      return MHD_YES;
    }
    if (!x.dispatched) {  // the body is complete
      x.dispatched = true;
      if (Conn* cn = conn_of(c)) {
        std::lock_guard<std::mutex> lock(s.g);
        cn->phase = Conn::Phase::Active;
        cn->since = Clock::now();
      }
      if (x.refusal) {
        return queue_whole(c, x, *x.refusal, false);
      }
      if (x.too_large) {
        {
          std::lock_guard<std::mutex> lock(s.g);
          ++s.stats.refused_body_too_large;
        }
        Response r{413,
                   "application/json",
                   error_json(413, std::string(reason_phrase(413)) + ": over " +
                                       std::to_string(s.limits.max_body_bytes) + " bytes"),
                   {}};
        return queue_whole(c, x, r, true);
      }
      {
        std::lock_guard<std::mutex> lock(s.g);
        ++s.open_exchanges;
      }
      x.counted = true;
      Reply reply;
      reply.x_ = xp;
      try {
        s.handler(x.req, reply);
      } catch (const std::exception& e) {
        spdlog::error("internal error while serving {} {}: {}", x.req.method, x.req.path, e.what());
        reply.send({500, "application/json", error_json(500, "internal error"), {}});
      }
    }
    return serve(c, xp);
  }

  static void completed(void* cls, MHD_Connection* c, void** con_cls, MHD_RequestTerminationCode toe) {
    auto& s = *static_cast<Impl*>(cls);
    auto* holder = static_cast<std::shared_ptr<Reply::Exchange>*>(*con_cls);
    if (!holder) return;
    const std::shared_ptr<Reply::Exchange> xp = *holder;
    delete holder;
    *con_cls = nullptr;
    Reply::Exchange& x = *xp;
    std::function<void(bool)> on_close;
    bool ok = false, gone = false;
    std::string note;
    {
      std::lock_guard<std::mutex> lock(x.m);
      x.closed = true;
      ok = toe == MHD_REQUEST_TERMINATED_COMPLETED_OK && x.queued;
      gone = x.gone;
      on_close.swap(x.on_close);
    }
    if (Conn* cn = conn_of(c)) {
      std::lock_guard<std::mutex> lock(s.g);
      cn->phase = Conn::Phase::Headers;
      cn->since = Clock::now();
      cn->ex.reset();
    }
    if (on_close) on_close(ok);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - x.start).count();
    int status = 0;
    {
      std::lock_guard<std::mutex> lock(x.m);  // the note may come from the caller's thread
      note = x.note;
      status = x.queued ? x.status : 0;
    }
    if (ok)
      spdlog::info("{} {} {} {:.1f} ms{}{}", x.req.method, x.req.path, status, ms, note.empty() ? "" : " ", note);
    else
      spdlog::info("{} {} {} {:.1f} ms, ended early ({}){}{}", x.req.method, x.req.path, status, ms,
                   gone                                            ? "client gone"
                   : toe == MHD_REQUEST_TERMINATED_DAEMON_SHUTDOWN ? "server stopped"
                                                                   : "cut",
                   note.empty() ? "" : " ", note);
    if (x.counted) {
      std::lock_guard<std::mutex> lock(s.g);
      --s.open_exchanges;
    }
  }

  static void mhd_log(void*, const char* fmt, va_list ap) {
    char buf[512];
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    std::string line(buf);
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    spdlog::debug("http: {}", line);
  }

  // --- the watchdog: deadlines and clients gone -------------------------------------------------------
  void watch() {
    std::unique_lock<std::mutex> wl(wm);
    while (!watchdog_stop) {
      wcv.wait_for(wl, std::chrono::milliseconds(100));
      if (watchdog_stop) break;
      std::vector<std::shared_ptr<Reply::Exchange>> gone;
      {
        std::lock_guard<std::mutex> lock(g);
        const auto now = Clock::now();
        for (Conn* cn : conns) {
          if (cn->cut || cn->fd < 0) continue;
          if ((cn->phase == Conn::Phase::Headers && now - cn->since > secs(limits.header_timeout_s)) ||
              (cn->phase == Conn::Phase::Body && now - cn->since > secs(limits.body_timeout_s))) {
            ++(cn->phase == Conn::Phase::Headers ? stats.header_timeouts : stats.body_timeouts);
            cn->cut = true;
            ::shutdown(cn->fd, SHUT_RDWR);
            continue;
          }
          if (cn->phase != Conn::Phase::Active || !cn->ex) continue;
          Reply::Exchange& x = *cn->ex;
          std::lock_guard<std::mutex> xl(x.m);
          if (!x.suspended || x.gone) continue;
          char b;
          const ssize_t n = ::recv(cn->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
          if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            x.gone = true;
            ++stats.clients_gone;
            x.resume_locked();  // MHD closes it: the handler or the reader sees `gone`
          }
        }
      }
    }
  }
};

// --- Reply ----------------------------------------------------------------------------------------------

void Reply::send(Response r) const {
  std::lock_guard<std::mutex> lock(x_->m);
  if (x_->closed || x_->kind != Exchange::Kind::None) return;
  x_->kind = Exchange::Kind::Whole;
  x_->whole = std::move(r);
  x_->resume_locked();
}

void Reply::stream(int status, std::string content_type, Headers headers) const {
  std::lock_guard<std::mutex> lock(x_->m);
  if (x_->closed || x_->kind != Exchange::Kind::None) return;
  x_->kind = Exchange::Kind::Stream;
  x_->stream_status = status;
  x_->stream_type = std::move(content_type);
  x_->stream_headers = std::move(headers);
  x_->resume_locked();
}

void Reply::write(std::string data) const {
  std::lock_guard<std::mutex> lock(x_->m);
  // Before stream() too (the engine may answer before the handler has said how): kept until then.
  if (x_->closed || x_->kind == Exchange::Kind::Whole || x_->ended) return;
  x_->pending += data;
  x_->resume_locked();
}

void Reply::end() const {
  std::lock_guard<std::mutex> lock(x_->m);
  if (x_->closed || x_->kind == Exchange::Kind::Whole) return;
  x_->ended = true;
  x_->resume_locked();
}

void Reply::on_close(std::function<void(bool)> f) const {
  std::lock_guard<std::mutex> lock(x_->m);
  x_->on_close = std::move(f);
}

bool Reply::closed() const {
  std::lock_guard<std::mutex> lock(x_->m);
  return x_->closed;
}

void Reply::log_note(std::string note) const {
  std::lock_guard<std::mutex> lock(x_->m);
  x_->note = std::move(note);
}

// --- Server ---------------------------------------------------------------------------------------------

Server::Server(Limits limits, Precheck precheck, Handler handler) : impl_(std::make_unique<Impl>()) {
  impl_->limits = limits;
  impl_->precheck = std::move(precheck);
  impl_->handler = std::move(handler);
}

Server::~Server() { stop(); }

void Server::listen(const std::string& host, int port) {
  Impl& s = *impl_;
  if (host.empty())
    throw config::ConfigError(
        "--host: an empty address (give 127.0.0.1 for this machine only, or 0.0.0.0 / :: for every interface)");
  const std::string where = "--host " + host + " --port " + std::to_string(port);
  std::string why;
  s.listen_fd = actors::listen_tcp(host, static_cast<std::uint16_t>(port), s.limits.backlog, why);
  if (s.listen_fd < 0) throw config::ConfigError(where + ": cannot listen there (" + why + ")");

  unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
  const auto idle = static_cast<unsigned>(std::max(1.0, s.limits.send_idle_timeout_s));
  const auto cap = static_cast<unsigned>(std::min<std::int64_t>(s.limits.max_connections + 64, 1 << 30));
  if (s.limits.threads > 1) {
    s.daemon = MHD_start_daemon(
        flags, 0, nullptr, nullptr, &Impl::access, &s, MHD_OPTION_LISTEN_SOCKET, s.listen_fd,
        MHD_OPTION_THREAD_POOL_SIZE, static_cast<unsigned>(s.limits.threads), MHD_OPTION_CONNECTION_LIMIT, cap,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, s.limits.max_header_bytes, MHD_OPTION_CONNECTION_TIMEOUT, idle,
        MHD_OPTION_NOTIFY_COMPLETED, &Impl::completed, &s, MHD_OPTION_NOTIFY_CONNECTION, &Impl::notify_connection, &s,
        MHD_OPTION_EXTERNAL_LOGGER, &Impl::mhd_log, &s, MHD_OPTION_END);
  } else {
    s.daemon =
        MHD_start_daemon(flags, 0, nullptr, nullptr, &Impl::access, &s, MHD_OPTION_LISTEN_SOCKET, s.listen_fd,
                         MHD_OPTION_CONNECTION_LIMIT, cap, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
                         s.limits.max_header_bytes, MHD_OPTION_CONNECTION_TIMEOUT, idle, MHD_OPTION_NOTIFY_COMPLETED,
                         &Impl::completed, &s, MHD_OPTION_NOTIFY_CONNECTION, &Impl::notify_connection, &s,
                         MHD_OPTION_EXTERNAL_LOGGER, &Impl::mhd_log, &s, MHD_OPTION_END);
  }
  if (!s.daemon) {
    ::close(s.listen_fd);
    s.listen_fd = -1;
    throw config::ConfigError(where + ": the HTTP server (libmicrohttpd) did not start");
  }
  s.watchdog = std::thread([&s] { s.watch(); });
}

void Server::stop() {
  Impl& s = *impl_;
  if (!s.daemon) return;
  s.closing = true;
  {
    std::lock_guard<std::mutex> wl(s.wm);
    s.watchdog_stop = true;
  }
  s.wcv.notify_all();
  if (s.watchdog.joinable()) s.watchdog.join();
  const MHD_socket lfd = MHD_quiesce_daemon(s.daemon);  // no new connections; the socket is ours again
  {
    // MHD must not be stopped with suspended connections: resume them; they see `closing` and end.
    std::lock_guard<std::mutex> lock(s.g);
    for (Conn* cn : s.conns)
      if (cn->ex) {
        std::lock_guard<std::mutex> xl(cn->ex->m);
        cn->ex->resume_locked();
      }
  }
  MHD_stop_daemon(s.daemon);
  s.daemon = nullptr;
  if (lfd != MHD_INVALID_SOCKET) ::close(lfd);
  s.listen_fd = -1;
}

std::int64_t Server::open_exchanges() const {
  std::lock_guard<std::mutex> lock(impl_->g);
  return impl_->open_exchanges;
}

Stats Server::stats() const {
  std::lock_guard<std::mutex> lock(impl_->g);
  return impl_->stats;
}

}  // namespace specactor::server::http
