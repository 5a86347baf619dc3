// server/server.cpp — see server.hpp.
#include "server/server.hpp"

#include <pthread.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "actors/cluster.hpp"
#include "actors/engine.hpp"
#include "actors/system.hpp"
#include "config/error.hpp"
#include "config/snapshot.hpp"
#include "model/gguf.hpp"
#include "server/api.hpp"
#include "server/choices.hpp"
#include "server/http.hpp"
#include "server/metrics.hpp"

namespace specactor::server {

namespace {

using Clock = std::chrono::steady_clock;
double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

const char* const kEndpointNames[] = {"chat", "completions", "generate"};

http::Response json_response(int status, const json& body, http::Headers headers = {}) {
  return {status, "application/json", body.dump(-1, ' ', false, json::error_handler_t::replace), std::move(headers)};
}

void send_json(const http::Reply& res, int status, const json& body, http::Headers headers = {}) {
  res.send(json_response(status, body, std::move(headers)));
}

// One generation request's state between the engine's callbacks (engine threads) and the HTTP side.
struct Live {
  std::mutex m;
  std::uint64_t id = 0;
  bool submitted = false;  // id is the engine's
  Outcome outcome;
  bool finished = false, client_gone = false;  // the final event came; the exchange ended before it
  std::unique_ptr<ChatStream> chat;            // a streamed chat answer's chunks
  std::shared_ptr<Choices> group;              // n > 1: the request's choices (this is choice `index`)
  std::size_t index = 0;
  Clock::time_point arrived, last;
  bool first_token = true;
};

class Server {
 public:
  Server(const config::ServerArgs& args, const ServeOptions& o)
      : args_(args),
        opt_(o),
        http_(
            http_limits(o), [this](const http::Request& r) { return precheck(r); },
            [this](const http::Request& r, const http::Reply& res) { route(r, res); }) {
    name_ =
        o.served_model_name.empty() ? std::filesystem::path(args.model_path).filename().string() : o.served_model_name;
    if (name_.empty()) name_ = "specactor";
  }

  void listen(const std::string& host, int port) { http_.listen(host, port); }
  void stop_http() { http_.stop(); }

  // Loads the model (the HTTP side answers 503 meanwhile).
  void load() {
    if (opt_.workers.empty()) {
      engine_ = actors::Engine::create(args_);
    } else {
      actors::ClusterOptions c;
      c.workers = actors::parse_workers(opt_.workers);
      c.routing = opt_.routing;
      c.connect_timeout_s = opt_.workers_wait_seconds;
      c.tls = {opt_.worker_tls_certificate, opt_.worker_tls_key, opt_.worker_tls_ca};
      if (!c.tls.on()) c.secret = actors::client_secret(opt_.worker_secret_file, "--worker-secret-file");
      engine_ = actors::Cluster::connect(args_, c);
    }
    context_length_ = *engine_->target_snapshot()->context_length;
    max_running_ = engine_->max_running_requests();
    ready_ = true;
  }

  // Nothing left: every engine request has had its final event and every response is out.
  bool drained() {
    std::lock_guard<std::mutex> lock(m_);
    return live_.empty() && http_.open_exchanges() == 0;
  }
  void begin_drain() { stopping_ = true; }
  // The grace period is over: cancel what runs; those requests end as errors (503), not as successes.
  std::size_t cut_all() {
    grace_cut_ = true;
    std::lock_guard<std::mutex> lock(m_);
    for (const auto& [id, l] : live_) engine_->cancel(id);
    return live_.size();
  }

  void shutdown_engine() {
    if (engine_) engine_->shutdown();
  }

  std::size_t in_flight() {
    std::lock_guard<std::mutex> lock(m_);
    return live_.size();
  }

 private:
  // --- plumbing -----------------------------------------------------------------------------------
  void send_error(const http::Reply& res, const ApiError& e) {
    if (e.status == 400 || e.status == 404) ++rejected_invalid_;
    send_json(res, e.status, error_body(e));
  }

  bool protected_path(const std::string& path) const {
    return path != "/health" && path != "/metrics" && path != "/v1/models";
  }

  // Before the body is read: the route, the API key, the Content-Type.
  std::optional<http::Response> precheck(const http::Request& req) {
    const auto it = routes_.find(req.path);
    if (it == routes_.end())
      return json_response(404,
                           status_error_body(404, "no route " + config::printable(req.method + " " + req.path, 200)));
    if (it->second.method != req.method && !(req.method == "HEAD" && it->second.method == "GET"))
      return json_response(405, status_error_body(405, req.path + " takes " + it->second.method),
                           {{"Allow", it->second.method}});
    if (!opt_.api_key.empty() && protected_path(req.path) && req.header("Authorization") != "Bearer " + opt_.api_key)
      return json_response(
          401, error_body(ApiError(401, "missing or wrong API key (expected Authorization: Bearer <key>)", {},
                                   "authentication_error", "invalid_api_key")));
    if (req.method == "POST") {
      const std::string type = req.header("Content-Type");
      // JSON only: a web page cannot send it to this (unauthenticated, local) server without a CORS preflight.
      if (!type.empty() && !is_json_type(type))
        return json_response(
            415, status_error_body(415, "Content-Type: expected application/json (got " + config::printable(type, 80) +
                                            "; with curl -d, add -H 'Content-Type: application/json')"));
    }
    return std::nullopt;
  }

  void route(const http::Request& req, const http::Reply& res) {
    const auto it = routes_.find(req.path);
    if (it == routes_.end()) return send_json(res, 404, status_error_body(404, "no route"));
    it->second.fn(req, res);
  }

  // The engine once loaded; otherwise answers 503 and returns null.
  actors::EngineApi* engine_or_503(const http::Reply& res) {
    if (!ready_) {
      send_json(res, 503, status_error_body(503, "the model is still loading"), {{"Retry-After", "5"}});
      return nullptr;
    }
    if (stopping_) {
      send_json(res, 503, status_error_body(503, "the server is shutting down"), {{"Connection", "close"}});
      return nullptr;
    }
    return engine_.get();
  }

  struct RouteEntry {
    std::string method;
    std::function<void(const http::Request&, const http::Reply&)> fn;
  };
  std::map<std::string, RouteEntry> make_routes() {
    std::map<std::string, RouteEntry> r;
    r["/health"] = {"GET", [this](const http::Request&, const http::Reply& res) {
                      if (!ready_)
                        send_json(res, 503, {{"status", "loading"}});
                      else if (stopping_)
                        send_json(res, 503, {{"status", "stopping"}});
                      else
                        send_json(res, 200, {{"status", "ok"}});
                    }};
    r["/v1/models"] = {
        "GET", [this](const http::Request&, const http::Reply& res) {
          json m = {{"id", name_}, {"object", "model"}, {"created", started_}, {"owned_by", "specactor"}};
          if (ready_) m["max_model_len"] = context_length_;
          send_json(res, 200, {{"object", "list"}, {"data", json::array({m})}});
        }};
    r["/metrics"] = {"GET", [this](const http::Request&, const http::Reply& res) { metrics(res); }};
    r["/server_info"] = {"GET", [this](const http::Request&, const http::Reply& res) { server_info(res); }};
    r["/flush_cache"] = {"POST", [this](const http::Request&, const http::Reply& res) {
                           actors::EngineApi* engine = engine_or_503(res);
                           if (!engine) return;
                           try {
                             const std::int64_t n = engine->flush_cache();
                             send_json(res, 200, {{"flushed_pages", n}});
                           } catch (const std::exception& e) {
                             send_json(res, 503, status_error_body(503, e.what()));
                           }
                         }};
    r["/tokenize"] = {"POST", [this](const http::Request& q, const http::Reply& res) { tokenize(q, res); }};
    r["/detokenize"] = {"POST", [this](const http::Request& q, const http::Reply& res) { detokenize(q, res); }};
    r["/v1/chat/completions"] = {
        "POST", [this](const http::Request& q, const http::Reply& res) { generate(q, res, Endpoint::Chat); }};
    r["/v1/completions"] = {
        "POST", [this](const http::Request& q, const http::Reply& res) { generate(q, res, Endpoint::Completion); }};
    r["/generate"] = {"POST",
                      [this](const http::Request& q, const http::Reply& res) { generate(q, res, Endpoint::Generate); }};
    return r;
  }

  // --- generation ---------------------------------------------------------------------------------
  ApiError shutdown_error() const {
    return ApiError(
        503,
        fmt::format("the server shut down before this request finished (--grace-period {:g} s)", opt_.grace_seconds),
        {}, "service_unavailable");
  }

  // The request parsed and validated by the engine (prepare: the context rule included), its messages
  // naming the API's fields; a 400 answered and nothing when it is refused.
  std::optional<ApiRequest> parse_request(const http::Request& req, const http::Reply& res, Endpoint ep,
                                          actors::EngineApi& engine) {
    try {
      const json body = parse_body(req.body);
      const ApiLimits limits{name_};
      ApiRequest a = ep == Endpoint::Chat         ? parse_chat(body, limits)
                     : ep == Endpoint::Completion ? parse_completion(body, limits)
                                                  : parse_generate(body, limits);
      try {
        engine.prepare(a.request, api_field_names(a));
      } catch (const sched::RequestError& e) {
        throw request_error(e);
      } catch (const config::ConfigError& e) {  // the text itself (UTF-8, chat roles): named in its message
        const std::string msg = e.what();
        throw ApiError(400, msg, msg.substr(0, msg.find_first_of(":[")));
      }
      return a;
    } catch (const ApiError& e) {
      send_error(res, e);
      return std::nullopt;
    }
  }

  // How one request is answered.
  struct Answer {
    Endpoint ep;
    std::string rid;
    std::int64_t created;
    bool streamed, include_usage;
    std::string budget_param;
  };

  // Runs on an engine thread for each event: keeps the latency histograms, the outcome, and answers
  // (a streamed request's chunk; a whole request's response on the final event).
  void deliver(Live& live, const actors::TokenEvent& ev, const http::Reply& res, const Answer& ans) {
    const auto now = Clock::now();
    std::unique_lock<std::mutex> lock(live.m);
    if (!ev.tokens.empty()) {
      if (live.first_token) {
        ttft_.observe(seconds(now - live.arrived));
        live.first_token = false;
      } else {
        const double gap = seconds(now - live.last) / static_cast<double>(ev.tokens.size());
        for (std::size_t i = 0; i < ev.tokens.size(); ++i) itl_.observe(gap);
      }
      live.last = now;
    }
    Outcome& o = live.outcome;
    o.tokens.insert(o.tokens.end(), ev.tokens.begin(), ev.tokens.end());
    o.logprobs.insert(o.logprobs.end(), ev.logprobs.begin(), ev.logprobs.end());
    o.text += ev.text;
    if (ev.finished) {
      o.finish_reason = ev.finish_reason;
      o.error = ev.error;
      o.invalid_request = ev.invalid_request;
      o.metrics = ev.metrics;
      live.finished = true;
      e2e_.observe(seconds(now - live.arrived));
      res.log_note("prompt=" + std::to_string(o.prompt_tokens) + " completion=" + std::to_string(o.tokens.size()));
    }
    std::unique_lock<std::mutex> group;  // n > 1: one choice at a time writes, and the last one ends
    bool last = true;
    if (live.group) {
      group = std::unique_lock<std::mutex>(live.group->m);
      if (ev.finished) last = ++live.group->finished == live.group->n;
    }
    if (ans.streamed) {
      const std::optional<ApiError> cut = grace_cut_ ? std::optional<ApiError>(shutdown_error()) : std::nullopt;
      std::string out = stream_events({ans.ep, ans.rid, name_, ans.created, ans.include_usage}, ev, o, live.chat.get(),
                                      cut, last, live.group ? summed_outcome(live.group->outcomes) : o,
                                      live.group ? std::optional<std::size_t>(live.index) : std::nullopt);
      if (!out.empty()) res.write(std::move(out));
      if (ev.finished && last) res.end();
    } else if (ev.finished && live.group && (live.group->answered || (!last && o.finish_reason != "error"))) {
      if (!live.group->answered)
        live.group->responses[live.index] =
            whole_response(ans.ep, ans.rid, ans.created, name_, o);  // the others still run
    } else if (ev.finished) {
      if (live.group) live.group->answered = true;
      if (o.finish_reason == "error") {
        // A request the engine refused (its KV budget, its context) is the client's: 400 naming it.
        if (o.invalid_request)
          send_error(res, ApiError(400, o.error, ans.budget_param));
        else
          send_json(res, 500, status_error_body(500, o.error));
      } else if (o.finish_reason == "cancelled" && grace_cut_) {
        send_json(res, 503, error_body(shutdown_error()));
      } else if (live.group) {
        live.group->responses[live.index] = whole_response(ans.ep, ans.rid, ans.created, name_, o);
        send_json(res, 200, merge_responses(live.group->responses));
      } else {
        send_json(res, 200, whole_response(ans.ep, ans.rid, ans.created, name_, o));
      }
    }
    if (group.owns_lock()) group.unlock();
    if (ev.finished) {
      lock.unlock();
      // Last: once live_ is empty and the response is out, the drain may end.
      std::lock_guard<std::mutex> g(m_);
      ++outcomes_[ev.finish_reason];
      live_.erase(ev.id);
    }
  }

  void generate(const http::Request& req, const http::Reply& res, Endpoint ep) {
    actors::EngineApi* engine = engine_or_503(res);
    if (!engine) return;
    std::optional<ApiRequest> parsed = parse_request(req, res, ep, *engine);
    if (!parsed) return;
    ApiRequest& a = *parsed;
    const std::vector<std::int32_t> ids = a.request.prompt_ids;

    const std::string rid = (ep == Endpoint::Chat         ? "chatcmpl-"
                             : ep == Endpoint::Completion ? "cmpl-"
                                                          : "gen-") +
                            std::to_string(next_id_++);
    const bool streamed = a.stream;
    const Answer ans{ep, rid, unix_now(), streamed, a.include_usage, a.max_tokens_name};
    // n > 1: a Live per choice, one HTTP answer.
    const std::size_t n = static_cast<std::size_t>(a.n);
    std::vector<std::shared_ptr<Live>> lives;
    auto group = n > 1 ? std::make_shared<Choices>() : nullptr;
    const std::uint64_t base_seed = std::random_device{}();
    for (std::size_t i = 0; i < n; ++i) {
      auto live = std::make_shared<Live>();
      live->outcome.prompt_tokens = static_cast<std::int64_t>(ids.size());
      live->outcome.tools = a.tools;
      if (streamed && ep == Endpoint::Chat) live->chat = std::make_unique<ChatStream>(rid, ans.created, name_, a.tools);
      if (a.request.logprobs >= 0)
        live->outcome.piece = [tok = engine->tokenizer()](std::int32_t t) { return tok ? tok->decode({t}) : ""; };
      live->arrived = live->last = Clock::now();
      live->group = group;
      live->index = i;
      if (group) group->outcomes.push_back(&live->outcome);
      lives.push_back(std::move(live));
    }
    if (group) {
      group->n = n;
      group->responses.assign(n, json());
    }
    std::lock_guard<std::mutex> lock(m_);
    const auto waiting = static_cast<std::int64_t>(live_.size()) - max_running_;
    if (waiting >= opt_.max_queued_requests) {
      ++rejected_busy_;
      send_json(
          res, 503,
          error_body(ApiError(
              503, "too many requests waiting (--max-queued-requests " + std::to_string(opt_.max_queued_requests) + ")",
              {}, "service_unavailable")),
          {{"Retry-After", "1"}});
      return;
    }
    // The client going away (a stream closed, or the watchdog's disconnect) cancels the request (every
    // choice), which frees its KV pages.
    res.on_close([this, lives](bool) {
      for (const auto& live : lives) {
        std::lock_guard<std::mutex> l(live->m);
        if (!live->finished && !live->client_gone) {
          live->client_gone = true;
          if (live->index == 0) ++client_disconnects_;
          if (live->submitted) engine_->cancel(live->id);
        }
      }
    });
    if (streamed) res.stream(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
    for (std::size_t i = 0; i < n; ++i) {
      const auto& live = lives[i];
      auto on_event = [this, live, res, ans](const actors::TokenEvent& ev) { deliver(*live, ev, res, ans); };
      actors::GenerationRequest r = a.request;
      if (group) r.seed = choice_seed(a.request.seed, base_seed, i);
      std::unique_lock<std::mutex> l(live->m);  // the callback waits for the id
      try {
        live->id = engine->submit(r, on_event);
        live->submitted = true;
      } catch (const std::runtime_error& e) {  // nothing ran (a later choice: the earlier ones are cancelled)
        l.unlock();
        for (std::size_t k = 0; k < i; ++k) engine->cancel(lives[k]->id);
        if (group) group->answered = true;
        if (dynamic_cast<const config::ConfigError*>(&e))
          send_error(res, ApiError(400, e.what()));
        else
          send_json(res, 503, status_error_body(503, e.what()));
        return;
      }
      if (live->client_gone) engine_->cancel(live->id);
      live_.emplace(live->id, live);
    }
    ++requests_[kEndpointNames[static_cast<int>(ep)]];
    prompt_tokens_ += static_cast<std::int64_t>(ids.size());
  }

  // --- the other routes ---------------------------------------------------------------------------
  void tokenize(const http::Request& req, const http::Reply& res) {
    actors::EngineApi* engine = engine_or_503(res);
    if (!engine) return;
    try {
      const actors::GenerationRequest r = parse_tokenize(parse_body(req.body), {name_});
      std::vector<std::int32_t> ids;
      try {
        ids = engine->tokenize(r);
      } catch (const config::ConfigError& e) {
        throw ApiError(400, e.what(), "prompt");
      }
      send_json(res, 200, {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", context_length_}});
    } catch (const ApiError& e) {
      send_error(res, e);
    }
  }

  void detokenize(const http::Request& req, const http::Reply& res) {
    actors::EngineApi* engine = engine_or_503(res);
    if (!engine) return;
    try {
      const json body = parse_body(req.body);
      const auto tok = engine->tokenizer();
      if (!tok) throw ApiError(400, "this server has no tokenizer (--skip-tokenizer-init)");
      send_json(res, 200, {{"prompt", tok->decode(parse_detokenize(body, tok->vocab_size()))}});
    } catch (const ApiError& e) {
      send_error(res, e);
    }
  }

  void server_info(const http::Reply& res) {
    actors::EngineApi* engine = engine_or_503(res);
    if (!engine) return;
    const actors::SnapshotReport rep = engine->snapshots();
    json j;
    j["model"] = engine->model_info().to_json();
    j["served_model_name"] = name_;
    j["target"] = config::to_json(*rep.resolved_target);
    if (rep.derived_draft) j["draft"] = config::to_json(*rep.derived_draft);
    // The drafter's own model config (heads: shapes and vocabularies; DFLASH: the block size, the
    // target layers it reads), as its worker reported it.
    if (const std::string d = engine->metrics().draft_model; !d.empty()) j["drafter"] = json::parse(d, nullptr, false);
    j["target_hash_before_draft"] = engine->target_hash_before_draft();
    j["target_hash_after_draft"] =
        config::hash_hex(config::content_hash(rep.target_worker ? *rep.target_worker : *rep.resolved_target));
    j["target_worker_holds_resolved_object"] = rep.target_worker == rep.resolved_target;
    j["draft_worker_holds_derived_object"] = rep.draft_worker && rep.draft_worker == rep.derived_draft;
    if (json replicas = engine->replicas(); !replicas.is_null()) j["replicas"] = std::move(replicas);
    send_json(res, 200, j);
  }

  void metrics(const http::Reply& res) {
    Exposition x;
    x.gauge("specactor:model_loaded", "1 once the model is loaded and the server answers requests", ready_ ? 1 : 0);
    if (ready_) add_engine_metrics(x, engine_->metrics());
    {
      std::lock_guard<std::mutex> lock(m_);
      x.family("specactor:request_success_total", "counter", "requests by how they ended");
      for (const char* r : {"stop", "length", "cancelled", "error"})
        x.sample("specactor:request_success_total", static_cast<double>(outcomes_[r]), {{"finished_reason", r}});
      x.family("specactor:requests_total", "counter", "generation requests accepted, by endpoint");
      for (const char* e : kEndpointNames)
        x.sample("specactor:requests_total", static_cast<double>(requests_[e]), {{"endpoint", e}});
      x.family("specactor:requests_rejected_total", "counter", "requests refused before they ran");
      x.sample("specactor:requests_rejected_total", static_cast<double>(rejected_invalid_.load()),
               {{"reason", "invalid"}});
      x.sample("specactor:requests_rejected_total", static_cast<double>(rejected_busy_.load()), {{"reason", "busy"}});
      x.counter("specactor:client_disconnects_total", "requests whose client went away before the end",
                static_cast<double>(client_disconnects_.load()));
    }
    const http::Stats h = http_.stats();
    x.gauge("specactor:http_connections_open", "open HTTP connections", static_cast<double>(h.connections_open));
    add_http_refusals(x, h);
    x.counter("specactor:prompt_tokens_total", "prompt tokens of accepted requests",
              static_cast<double>(prompt_tokens_.load()));
    x.histogram("specactor:time_to_first_token_seconds", "from the request's arrival to its first token",
                ttft_.snapshot());
    x.histogram("specactor:inter_token_latency_seconds",
                "time between tokens (a step's wall time shared by the tokens it emitted)", itl_.snapshot());
    x.histogram("specactor:e2e_request_latency_seconds", "from arrival to the final event", e2e_.snapshot());
    res.send({200, "text/plain; version=0.0.4; charset=utf-8", x.text(), {}});
  }

  config::ServerArgs args_;
  ServeOptions opt_;
  std::string name_;
  std::int64_t started_ = unix_now();
  std::map<std::string, RouteEntry> routes_ = make_routes();
  std::atomic<bool> ready_{false}, stopping_{false}, grace_cut_{false};
  std::int64_t context_length_ = 0, max_running_ = 1;
  std::atomic<std::uint64_t> next_id_{0};
  std::mutex m_;
  std::map<std::uint64_t, std::shared_ptr<Live>> live_;  // engine requests that have not had their final event
  std::map<std::string, std::int64_t> outcomes_, requests_;
  std::atomic<std::int64_t> rejected_invalid_{0}, rejected_busy_{0}, client_disconnects_{0}, prompt_tokens_{0};
  Histogram ttft_{{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}};
  Histogram itl_{{0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.5}};
  Histogram e2e_{{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}};
  // Last, destroyed first: the engine (whose callbacks use the members above), and before it the
  // HTTP layer (whose handlers use the engine).
  std::unique_ptr<actors::EngineApi> engine_;
  http::Server http_;
};

}  // namespace

int serve(const config::ServerArgs& args, const ServeOptions& given) {
  // SIGINT/SIGTERM are taken by sigtimedwait below, never by a handler: block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // A client that resets a connection must not kill the server (libmicrohttpd sends with MSG_NOSIGNAL; this is for the
  // rest).
  std::signal(SIGPIPE, SIG_IGN);

  if (args.port < 1 || args.port > 65535)
    throw config::ConfigError("--port: must be in [1, 65535] (got " + std::to_string(args.port) + ")");
  ServeOptions options = given;
  check_serve_options(options);
  std::int64_t fds = 0;
  if (!http::ensure_fd_limit(options.max_connections, fds)) {
    if (options.max_connections_given)
      throw config::ConfigError("--max-connections " + std::to_string(options.max_connections) +
                                ": this process may open only " + std::to_string(fds + 128) +
                                " files (ulimit -n); give at most " + std::to_string(std::max<std::int64_t>(fds, 1)));
    options.max_connections = std::max<std::int64_t>(fds, 1);
    http::ensure_fd_limit(options.max_connections, fds);
    spdlog::warn("--max-connections: {} (what this process's file limit allows)", options.max_connections);
  }
  Server server(args, options);
  server.listen(args.host, static_cast<int>(args.port));
  spdlog::info("listening on http://{}:{} (loading the model; /health answers 503 until it is ready)", args.host,
               args.port);
  try {
    const actors::StartupSignals watch(options.workers.empty() ? "loading" : "the wait for the workers");
    server.load();
  } catch (...) {
    server.stop_http();
    throw;
  }
  spdlog::info("ready: http://{}:{}/v1 serves {}", args.host, args.port, args.model_path);
  int sig = 0;
  sigwait(&signals, &sig);
  const char* name = sig == SIGINT ? "SIGINT" : "SIGTERM";
  spdlog::info("{}: no new requests; {} in flight, {:.0f} s to finish (a second signal stops at once)", name,
               server.in_flight(), options.grace_seconds);
  server.begin_drain();
  // Wait for the drain, with an ear for a second signal.
  const auto grace_end =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.grace_seconds));
  auto wait_until = [&](Clock::time_point until) {  // true: drained; false: the time came; throws on a signal
    const timespec tick{0, 20'000'000};
    while (!server.drained()) {
      if (Clock::now() >= until) return false;
      if (const int second = sigtimedwait(&signals, nullptr, &tick); second > 0) {
        sig = second;
        throw std::runtime_error("second signal");
      }
    }
    return true;
  };
  int rc = 0;
  try {
    if (!wait_until(grace_end)) {
      spdlog::warn("grace period over: cancelling {} request(s); they end with 503", server.cut_all());
      if (!wait_until(Clock::now() + std::chrono::seconds(10)))
        spdlog::warn("{} response(s) still going out after 10 s: closing them", server.in_flight());
    }
  } catch (const std::runtime_error&) {
    spdlog::warn("second signal: stopping now ({} request(s) cut)", server.cut_all());
    rc = 128 + sig;
  }
  server.stop_http();
  server.shutdown_engine();
  spdlog::info("stopped");
  return rc;
}

}  // namespace specactor::server
