// server/server.cpp — see server.hpp.
#include "server/server.hpp"

#include <httplib.h>
#include <pthread.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "actors/engine.hpp"
#include "config/error.hpp"
#include "config/snapshot.hpp"
#include "model/gguf.hpp"
#include "server/api.hpp"
#include "server/metrics.hpp"

namespace specactor::server {

namespace {

using Clock = std::chrono::steady_clock;
double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// One request's events, handed from the engine's callback to the HTTP thread.
struct Stream {
  std::mutex m;
  std::condition_variable cv;
  std::deque<actors::TokenEvent> events;
  bool finished = false;
};

// What the access log line reports about the request this HTTP thread is serving.
struct AccessInfo {
  Clock::time_point start;
  std::int64_t prompt_tokens = -1, completion_tokens = -1;
};
thread_local AccessInfo access;

const char* const kEndpointNames[] = {"chat", "completions", "generate"};

class Server {
 public:
  Server(const config::ServerArgs& args, const ServeOptions& o) : args_(args), opt_(o) {
    name_ =
        o.served_model_name.empty() ? std::filesystem::path(args.model_path).filename().string() : o.served_model_name;
    if (name_.empty()) name_ = "specactor";
    // Every streaming connection holds an HTTP thread: room for the running batch, the queue, and
    // a few more for /health, /metrics and refusals.
    const auto threads = static_cast<std::size_t>(
        std::clamp<std::int64_t>(args.max_running_requests + o.max_queued_requests + 8, 16, 1024));
    http_.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    http_.set_payload_max_length(static_cast<std::size_t>(o.max_body_bytes));
    http_.set_read_timeout(std::chrono::seconds(30));
    http_.set_write_timeout(std::chrono::seconds(30));
    // The port is this server's alone: SO_REUSEADDR (restart while old connections linger), never
    // cpp-httplib's default SO_REUSEPORT, with which a second server on the port silently shares it.
    http_.set_socket_options([](int sock) {
      int yes = 1;
      ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    });
    routes();
  }

  bool bind(const std::string& host, int port) { return http_.bind_to_port(host, port); }
  void listen() { http_.listen_after_bind(); }
  void stop_http() { http_.stop(); }

  // Loads the model (the HTTP side answers 503 meanwhile).
  void load() {
    engine_ = actors::Engine::create(args_);
    context_length_ = *engine_->target_snapshot()->context_length;
    max_running_ = engine_->target_snapshot()->max_running_requests;
    ready_ = true;
  }

  // Stop accepting, let requests finish for up to the grace period, cancel what is left.
  void drain(double grace_seconds) {
    stopping_ = true;
    std::unique_lock<std::mutex> lock(m_);
    const auto deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(grace_seconds));
    if (!idle_.wait_until(lock, deadline, [&] { return live_.empty(); })) {
      spdlog::warn("grace period over: cancelling {} request(s)", live_.size());
      for (std::uint64_t id : live_) engine_->cancel(id);
      idle_.wait_for(lock, std::chrono::seconds(10), [&] { return live_.empty(); });
    }
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
  static void send_json(httplib::Response& res, int status, const json& body) {
    res.status = status;
    res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
  }
  void send_error(httplib::Response& res, const ApiError& e) {
    if (e.status == 400 || e.status == 404) ++rejected_invalid_;
    send_json(res, e.status, error_body(e));
  }

  bool protected_path(const std::string& path) const {
    return path != "/health" && path != "/metrics" && path != "/v1/models" && path != "/ping";
  }

  // The engine once loaded; otherwise answers 503 and returns null.
  actors::Engine* engine_or_503(httplib::Response& res) {
    if (!ready_) {
      send_json(res, 503, status_error_body(503, "the model is still loading"));
      res.set_header("Retry-After", "5");
      return nullptr;
    }
    if (stopping_) {
      send_json(res, 503, status_error_body(503, "the server is shutting down"));
      return nullptr;
    }
    return engine_.get();
  }

  void routes() {
    http_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      access = AccessInfo{Clock::now()};
      if (opt_.api_key.empty() || !protected_path(req.path)) return httplib::Server::HandlerResponse::Unhandled;
      if (req.get_header_value("Authorization") == "Bearer " + opt_.api_key)
        return httplib::Server::HandlerResponse::Unhandled;
      send_json(res, 401,
                error_body(ApiError(401, "missing or wrong API key (expected Authorization: Bearer <key>)", {},
                                    "authentication_error", "invalid_api_key")));
      return httplib::Server::HandlerResponse::Handled;
    });
    http_.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      const std::string what = res.status == 404   ? "no route " + req.method + " " + req.path
                               : res.status == 413 ? "request body too large (--max-body-bytes)"
                                                   : "HTTP " + std::to_string(res.status);
      send_json(res, res.status, status_error_body(res.status, what));
    });
    http_.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "unknown error";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      spdlog::error("internal error while serving a request: {}", what);
      send_json(res, 500, status_error_body(500, "internal error: " + what));
    });
    http_.set_logger([](const httplib::Request& req, const httplib::Response& res) {
      const double ms = seconds(Clock::now() - access.start) * 1000.0;
      if (access.prompt_tokens >= 0)
        spdlog::info("{} {} {} {:.1f} ms prompt={} completion={}", req.method, req.path, res.status, ms,
                     access.prompt_tokens, access.completion_tokens);
      else
        spdlog::info("{} {} {} {:.1f} ms", req.method, req.path, res.status, ms);
    });

    http_.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      if (!ready_)
        send_json(res, 503, {{"status", "loading"}});
      else if (stopping_)
        send_json(res, 503, {{"status", "stopping"}});
      else
        send_json(res, 200, {{"status", "ok"}});
    });
    http_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      json m = {{"id", name_}, {"object", "model"}, {"created", started_}, {"owned_by", "specactor"}};
      if (ready_) m["max_model_len"] = context_length_;
      send_json(res, 200, {{"object", "list"}, {"data", json::array({m})}});
    });
    http_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) { metrics(res); });
    http_.Get("/server_info", [this](const httplib::Request&, httplib::Response& res) { server_info(res); });
    http_.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) { tokenize(req, res); });
    http_.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) { detokenize(req, res); });
    http_.Post("/v1/chat/completions",
               [this](const httplib::Request& req, httplib::Response& res) { generate(req, res, Endpoint::Chat); });
    http_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      generate(req, res, Endpoint::Completion);
    });
    http_.Post("/generate",
               [this](const httplib::Request& req, httplib::Response& res) { generate(req, res, Endpoint::Generate); });
  }

  // --- generation ---------------------------------------------------------------------------------
  void generate(const httplib::Request& req, httplib::Response& res, Endpoint ep) {
    actors::Engine* engine = engine_or_503(res);
    if (!engine) return;
    ApiRequest a;
    std::vector<std::int32_t> ids;
    try {
      const json body = parse_body(req.body);
      const ApiLimits limits{name_};
      a = ep == Endpoint::Chat         ? parse_chat(body, limits)
          : ep == Endpoint::Completion ? parse_completion(body, limits)
                                       : parse_generate(body, limits);
      // The engine's one validation; its messages name the API's fields.
      std::string param;
      try {
        engine->prepare(a.request, [&](const std::string& f) {
          param = f == "prompt_ids" ? (ep == Endpoint::Generate ? "input_ids" : "prompt") : f;
          return param;
        });
      } catch (const config::ConfigError& e) {
        const std::string msg = e.what();
        throw ApiError(400, msg, param.empty() ? msg.substr(0, msg.find(':')) : param);
      }
      ids = a.request.prompt_ids;
      resolve_max_tokens(a, static_cast<std::int64_t>(ids.size()), context_length_);
    } catch (const ApiError& e) {
      send_error(res, e);
      return;
    }
    access.prompt_tokens = static_cast<std::int64_t>(ids.size());

    auto stream = std::make_shared<Stream>();
    const auto arrived = access.start;
    std::uint64_t id = 0;
    {
      std::lock_guard<std::mutex> lock(m_);
      const auto waiting = static_cast<std::int64_t>(live_.size()) - max_running_;
      if (waiting >= opt_.max_queued_requests) {
        ++rejected_busy_;
        res.set_header("Retry-After", "1");
        send_json(res, 503,
                  error_body(ApiError(503,
                                      "too many requests waiting (--max-queued-requests " +
                                          std::to_string(opt_.max_queued_requests) + ")",
                                      {}, "service_unavailable")));
        return;
      }
      // The callback runs on an engine thread: it queues the event for this HTTP thread, keeps the
      // latency histograms, and ends the request's accounting on the final event.
      auto first = std::make_shared<bool>(true);
      auto last = std::make_shared<Clock::time_point>(arrived);
      try {
        id = engine->submit(a.request, [this, stream, first, last, arrived](const actors::TokenEvent& ev) {
          const auto now = Clock::now();
          if (!ev.tokens.empty()) {
            if (*first) {
              ttft_.observe(seconds(now - arrived));
              *first = false;
            } else {
              const double gap = seconds(now - *last) / static_cast<double>(ev.tokens.size());
              for (std::size_t i = 0; i < ev.tokens.size(); ++i) itl_.observe(gap);
            }
            *last = now;
          }
          if (ev.finished) {
            e2e_.observe(seconds(now - arrived));
            std::lock_guard<std::mutex> lock(m_);
            ++outcomes_[ev.finish_reason];
            live_.erase(ev.id);
            if (live_.empty()) idle_.notify_all();
          }
          std::lock_guard<std::mutex> lock(stream->m);
          stream->events.push_back(ev);
          if (ev.finished) stream->finished = true;
          stream->cv.notify_all();
        });
      } catch (const config::ConfigError& e) {
        send_error(res, ApiError(400, e.what()));
        return;
      } catch (const std::runtime_error& e) {
        send_json(res, 503, status_error_body(503, e.what()));
        return;
      }
      live_.insert(id);
    }
    {
      std::lock_guard<std::mutex> lock(m_);
      ++requests_[kEndpointNames[static_cast<int>(ep)]];
    }
    prompt_tokens_ += static_cast<std::int64_t>(ids.size());

    const std::string rid = (ep == Endpoint::Chat         ? "chatcmpl-"
                             : ep == Endpoint::Completion ? "cmpl-"
                                                          : "") +
                            std::to_string(started_) + "-" + std::to_string(id);
    const std::int64_t created = unix_now();
    auto outcome = std::make_shared<Outcome>();
    outcome->prompt_tokens = static_cast<std::int64_t>(ids.size());
    auto absorb = [outcome](const actors::TokenEvent& ev) {
      outcome->tokens.insert(outcome->tokens.end(), ev.tokens.begin(), ev.tokens.end());
      outcome->text += ev.text;
      if (ev.finished) {
        outcome->finish_reason = ev.finish_reason;
        outcome->error = ev.error;
        outcome->invalid_request = ev.invalid_request;
        outcome->metrics = ev.metrics;
      }
    };

    if (!a.stream) {
      std::unique_lock<std::mutex> lock(stream->m);
      stream->cv.wait(lock, [&] { return stream->finished; });
      for (const auto& ev : stream->events) absorb(ev);
      lock.unlock();
      access.completion_tokens = static_cast<std::int64_t>(outcome->tokens.size());
      if (outcome->finish_reason == "error") {
        // A request the engine refused (its KV budget, its context) is the client's: 400 naming it.
        if (outcome->invalid_request)
          send_error(res, ApiError(400, outcome->error,
                                   ep == Endpoint::Generate ? "sampling_params.max_new_tokens" : "max_tokens"));
        else
          send_json(res, 500, status_error_body(500, outcome->error));
        return;
      }
      send_json(res, 200,
                ep == Endpoint::Chat         ? chat_response(rid, created, name_, *outcome)
                : ep == Endpoint::Completion ? completion_response(rid, created, name_, *outcome)
                                             : generate_response(rid, *outcome));
      return;
    }

    // Streaming: the provider runs on this HTTP thread after the handler returns.
    auto first_chunk = std::make_shared<bool>(true);
    const bool include_usage = a.include_usage;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, stream, outcome, absorb, first_chunk, rid, created, ep, include_usage](std::size_t,
                                                                                      httplib::DataSink& sink) {
          std::deque<actors::TokenEvent> events;
          {
            std::unique_lock<std::mutex> lock(stream->m);
            stream->cv.wait_for(lock, std::chrono::milliseconds(250), [&] { return !stream->events.empty(); });
            events.swap(stream->events);
          }
          if (events.empty()) return sink.is_writable();  // a client that went away ends the stream
          std::string out;
          bool done = false;
          for (const auto& ev : events) {
            absorb(ev);
            const std::string reason = ev.finished ? ev.finish_reason : "";
            if (ev.finished && ev.finish_reason == "error") {
              out += sse_event(error_body(ev.invalid_request ? ApiError(400, ev.error, {}, "invalid_request_error")
                                                             : ApiError(500, ev.error, {}, "server_error")));
            } else if (ep == Endpoint::Chat) {
              if (!ev.text.empty() || *first_chunk || ev.finished) {
                if (*first_chunk && ev.finished && !ev.text.empty()) {
                  out += sse_event(chat_chunk(rid, created, name_, ev.text, true, ""));
                  out += sse_event(chat_chunk(rid, created, name_, "", false, reason));
                } else {
                  out += sse_event(chat_chunk(rid, created, name_, ev.text, *first_chunk, reason));
                }
                *first_chunk = false;
              }
            } else if (ep == Endpoint::Completion) {
              if (!ev.text.empty() || ev.finished)
                out += sse_event(completion_chunk(rid, created, name_, ev.text, reason));
            } else {  // sglang: cumulative text so far
              json chunk = generate_response(rid, *outcome);
              if (!ev.finished) chunk["meta_info"]["finish_reason"] = nullptr;
              out += sse_event(chunk);
            }
            if (ev.finished) done = true;
          }
          if (done) {
            access.completion_tokens = static_cast<std::int64_t>(outcome->tokens.size());
            if (include_usage && outcome->finish_reason != "error" && ep != Endpoint::Generate)
              out += sse_event(usage_chunk(ep, rid, created, name_, *outcome));
            out += sse_done();
          }
          if (!out.empty() && !sink.write(out.data(), out.size())) return false;
          if (done) sink.done();
          return true;
        },
        [this, stream, outcome, id](bool) {
          // However the stream ended (done, or the client went away): a request still running is
          // cancelled, which frees its KV pages.
          access.completion_tokens = static_cast<std::int64_t>(outcome->tokens.size());
          std::lock_guard<std::mutex> lock(stream->m);
          if (!stream->finished) {
            ++client_disconnects_;
            engine_->cancel(id);
          }
        });
  }

  // --- the other routes ---------------------------------------------------------------------------
  void tokenize(const httplib::Request& req, httplib::Response& res) {
    actors::Engine* engine = engine_or_503(res);
    if (!engine) return;
    try {
      const json body = parse_body(req.body);
      actors::GenerationRequest r;
      if (body.contains("messages")) {
        r = parse_chat(body, {name_}).request;
      } else {
        const auto it = body.find("prompt");
        if (it == body.end() || !it->is_string()) throw ApiError(400, "prompt: expected a string", "prompt");
        r.prompt = it->get<std::string>();
      }
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

  void detokenize(const httplib::Request& req, httplib::Response& res) {
    actors::Engine* engine = engine_or_503(res);
    if (!engine) return;
    try {
      const json body = parse_body(req.body);
      const auto it = body.find("tokens");
      if (it == body.end() || !it->is_array()) throw ApiError(400, "tokens: expected an array of token ids", "tokens");
      const auto tok = engine->tokenizer();
      if (!tok) throw ApiError(400, "this server has no tokenizer (--skip-tokenizer-init)");
      std::vector<std::int32_t> ids;
      for (std::size_t i = 0; i < it->size(); ++i) {
        const json& t = (*it)[i];
        if (!t.is_number_integer() || t.get<std::int64_t>() < 0 || t.get<std::int64_t>() >= tok->vocab_size())
          throw ApiError(
              400, "tokens[" + std::to_string(i) + "]: expected a token id below " + std::to_string(tok->vocab_size()),
              "tokens");
        ids.push_back(static_cast<std::int32_t>(t.get<std::int64_t>()));
      }
      send_json(res, 200, {{"prompt", tok->decode(ids)}});
    } catch (const ApiError& e) {
      send_error(res, e);
    }
  }

  void server_info(httplib::Response& res) {
    actors::Engine* engine = engine_or_503(res);
    if (!engine) return;
    const actors::SnapshotReport rep = engine->snapshots();
    json j;
    j["model"] = engine->model_info().to_json();
    j["served_model_name"] = name_;
    j["target"] = config::to_json(*rep.resolved_target);
    if (rep.derived_draft) j["draft"] = config::to_json(*rep.derived_draft);
    j["target_hash_before_draft"] = engine->target_hash_before_draft();
    j["target_hash_after_draft"] =
        config::hash_hex(config::content_hash(rep.target_worker ? *rep.target_worker : *rep.resolved_target));
    j["target_worker_holds_resolved_object"] = rep.target_worker == rep.resolved_target;
    j["draft_worker_holds_derived_object"] = rep.draft_worker && rep.draft_worker == rep.derived_draft;
    send_json(res, 200, j);
  }

  void metrics(httplib::Response& res) {
    Exposition x;
    x.gauge("specactor:model_loaded", "1 once the model is loaded and the server answers requests", ready_ ? 1 : 0);
    if (ready_) {
      const actors::EngineMetrics m = engine_->metrics();
      x.gauge("specactor:num_requests_running", "requests in the running batch", static_cast<double>(m.running));
      x.gauge("specactor:num_requests_waiting", "requests queued for the batch", static_cast<double>(m.queued));
      x.gauge("specactor:kv_pages_total", "pages of the target's KV pool", static_cast<double>(m.kv_pages_total));
      x.gauge("specactor:kv_pages_used", "KV pages reserved by admitted requests",
              static_cast<double>(m.kv_pages_total - m.kv_pages_free));
      x.counter("specactor:generation_tokens_total", "tokens generated", static_cast<double>(m.generated_tokens));
      x.counter("specactor:spec_decode_num_drafts_total", "decode steps whose request got a proposal",
                m.drafted_at.empty() ? 0.0 : static_cast<double>(m.drafted_at[0]));
      x.counter("specactor:spec_decode_num_draft_tokens_total", "draft tokens verified",
                static_cast<double>(m.drafted));
      x.counter("specactor:spec_decode_num_accepted_tokens_total", "draft tokens accepted",
                static_cast<double>(m.accepted));
      x.family("specactor:spec_decode_num_accepted_tokens_per_pos_total", "counter",
               "draft tokens accepted at each depth of the proposal (position 0 = the first draft)");
      for (std::size_t d = 0; d < m.accepted_at.size(); ++d)
        x.sample("specactor:spec_decode_num_accepted_tokens_per_pos_total", static_cast<double>(m.accepted_at[d]),
                 {{"position", std::to_string(d)}});
      x.counter("specactor:spec_decode_draft_failures_total", "times the draft worker failed",
                static_cast<double>(m.draft_failures));
      x.counter("specactor:spec_decode_fallback_steps_total", "decode steps run without a draft after a failure",
                static_cast<double>(m.fallback_steps));
      x.gauge("specactor:spec_budget_adaptive", "1 when the budget decides what is drafted and verified",
              m.adaptive ? 1 : 0);
      x.counter("specactor:spec_budget_skipped_steps_total",
                "per-request decode steps run without a draft because the budget said it would not pay",
                static_cast<double>(m.budget_skipped_steps));
      x.family("specactor:spec_budget_verified_nodes_total", "counter",
               "per-request decode steps by the number of draft nodes verified (the last bucket: that many or more)");
      for (std::size_t n = 0; n < m.verified_nodes.size(); ++n)
        x.sample("specactor:spec_budget_verified_nodes_total", static_cast<double>(m.verified_nodes[n]),
                 {{"nodes", std::to_string(n)}});
      x.gauge("specactor:spec_budget_calibration_error",
              "acceptance model: expected calibration error of its node predictions", m.calibration_error);
      x.gauge("specactor:spec_budget_step_ms", "cost model: one row's step time at a short context (ms)", m.step_ms_1);
      x.family("specactor:spec_budget_step_cost_ratio", "gauge", "cost model: c(k), k rows' step time over one row's");
      const std::vector<int> ks{1, 2, 4, 8, 16, 32};
      for (std::size_t i = 0; i < m.step_cost.size() && i < ks.size(); ++i)
        x.sample("specactor:spec_budget_step_cost_ratio", m.step_cost[i], {{"rows", std::to_string(ks[i])}});
    }
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
      x.counter("specactor:client_disconnects_total", "streams whose client went away before the end",
                static_cast<double>(client_disconnects_.load()));
    }
    x.counter("specactor:prompt_tokens_total", "prompt tokens of accepted requests",
              static_cast<double>(prompt_tokens_.load()));
    x.histogram("specactor:time_to_first_token_seconds", "from the request's arrival to its first token",
                ttft_.snapshot());
    x.histogram("specactor:inter_token_latency_seconds",
                "time between tokens (a step's wall time shared by the tokens it emitted)", itl_.snapshot());
    x.histogram("specactor:e2e_request_latency_seconds", "from arrival to the final event", e2e_.snapshot());
    res.status = 200;
    res.set_content(x.text(), "text/plain; version=0.0.4; charset=utf-8");
  }

  config::ServerArgs args_;
  ServeOptions opt_;
  std::string name_;
  std::int64_t started_ = unix_now();
  httplib::Server http_;
  std::unique_ptr<actors::Engine> engine_;
  std::atomic<bool> ready_{false}, stopping_{false};
  std::int64_t context_length_ = 0, max_running_ = 1;
  std::mutex m_;
  std::condition_variable idle_;
  std::set<std::uint64_t> live_;  // engine ids of requests that have not had their final event
  std::map<std::string, std::int64_t> outcomes_, requests_;
  std::atomic<std::int64_t> rejected_invalid_{0}, rejected_busy_{0}, client_disconnects_{0}, prompt_tokens_{0};
  Histogram ttft_{{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}};
  Histogram itl_{{0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.5}};
  Histogram e2e_{{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}};
};

}  // namespace

void check_serve_options(const ServeOptions& o) {
  if (o.api_key_given && o.api_key.empty())
    throw config::ConfigError(
        "--api-key: is empty, which would turn authentication off; give a key, or leave the flag (and "
        "SPECACTOR_API_KEY) out to serve without one");
  if (!(o.grace_seconds >= 0 && o.grace_seconds <= kMaxGraceSeconds))
    throw config::ConfigError("--grace-period: must be in [0, " + std::to_string(static_cast<int>(kMaxGraceSeconds)) +
                              "] seconds (got " + config::printable(std::to_string(o.grace_seconds)) + ")");
}

int serve(const config::ServerArgs& args, const ServeOptions& options) {
  // SIGINT/SIGTERM are taken by sigwait below, never by a handler: block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  if (args.port < 1 || args.port > 65535)
    throw config::ConfigError("--port: must be in [1, 65535] (got " + std::to_string(args.port) + ")");
  check_serve_options(options);
  Server server(args, options);
  if (!server.bind(args.host, static_cast<int>(args.port)))
    throw config::ConfigError("--host " + args.host + " --port " + std::to_string(args.port) +
                              ": cannot listen there (address in use, or not an address of this machine)");
  std::thread http([&] { server.listen(); });
  spdlog::info("listening on http://{}:{} (loading the model; /health answers 503 until it is ready)", args.host,
               args.port);
  try {
    server.load();
  } catch (...) {
    server.stop_http();
    http.join();
    throw;
  }
  spdlog::info("ready: http://{}:{}/v1 serves {}", args.host, args.port, args.model_path);
  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("{}: no new requests; {} in flight, {:.0f} s to finish", sig == SIGINT ? "SIGINT" : "SIGTERM",
               server.in_flight(), options.grace_seconds);
  server.drain(options.grace_seconds);
  server.stop_http();
  http.join();
  server.shutdown_engine();
  spdlog::info("stopped");
  return 0;
}

}  // namespace specactor::server
