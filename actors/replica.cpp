#include "actors/replica.hpp"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <cstdio>
#include <map>
#include <optional>
#include <set>

#include "actors/draft_worker.hpp"
#include "actors/engine_caf.hpp"
#include "actors/gate.hpp"
#include "actors/system.hpp"
#include "actors/wire.hpp"
#include "config/error.hpp"
#include "drafters/drafter.hpp"
#include "model/loader.hpp"

namespace specactor::actors {

namespace {

struct ReplicaState {
  // (front, the front's id) → the engine's id, while the request runs.
  std::map<std::pair<caf::actor_addr, std::uint64_t>, std::uint64_t> live;
  std::set<caf::actor_addr> fronts;  // monitored
  static inline const char* name = "specactor.replica";
};

std::string host_name() {
  char buf[256] = {};
  return ::gethostname(buf, sizeof buf - 1) == 0 ? std::string(buf) : std::string();
}

caf::behavior replica(caf::stateful_actor<ReplicaState>* self, Engine* engine) {
  // A front that went away (its process died, its connection closed) leaves nobody to read its
  // requests' tokens: they are cancelled.
  self->set_down_handler([self, engine](caf::down_msg& m) {
    auto& live = self->state.live;
    std::size_t n = 0;
    for (auto it = live.begin(); it != live.end();)
      if (it->first.first == m.source) {
        engine->cancel(it->second);
        it = live.erase(it);
        ++n;
      } else {
        ++it;
      }
    self->state.fronts.erase(m.source);
    if (n) spdlog::warn("worker: a front went away; cancelled its {} request(s)", n);
  });
  return {
      [engine](hello_atom) -> ReplicaInfo {
        ReplicaInfo r;
        r.model_json = model_identity(engine->model_info());
        r.target = engine->target_snapshot();
        r.target_hash = engine->target_hash_before_draft();
        r.snapshots = engine->snapshots();
        r.max_running = engine->max_running_requests();
        r.context_length = engine->target_snapshot()->context_length.value_or(0);
        r.host = host_name();
        r.pid = static_cast<std::int64_t>(::getpid());
        const SnapshotReport& rep = r.snapshots;
        if (rep.target_worker) r.target_worker_hash = config::hash_hex(config::content_hash(*rep.target_worker));
        if (rep.draft_worker) r.draft_worker_hash = config::hash_hex(config::content_hash(*rep.draft_worker));
        r.target_holds_resolved = rep.target_worker && rep.target_worker == rep.resolved_target;
        r.draft_holds_derived = rep.draft_worker && rep.draft_worker == rep.derived_draft;
        return r;
      },
      [self, engine](submit_atom, std::uint64_t fid, GenerationRequest& req) {
        auto front = caf::actor_cast<caf::actor>(self->current_sender());
        if (!front) return;
        const caf::actor_addr addr = front.address();
        if (self->state.fronts.insert(addr).second) self->monitor(front);
        auto me = caf::actor_cast<caf::actor>(self);
        auto on_event = [front, fid, me, addr](const TokenEvent& ev) {
          TokenEvent out = ev;
          out.id = fid;
          caf::anon_send(front, event_atom::value, fid, std::move(out));
          if (ev.finished) caf::anon_send(me, release_atom::value, addr, fid);
        };
        auto fail = [&](const std::string& why, bool invalid) {
          caf::anon_send(front, event_atom::value, fid, TokenEvent::final_error(fid, why, invalid));
        };
        try {
          self->state.live[{addr, fid}] = engine->submit(std::move(req), on_event);
        } catch (const config::ConfigError& e) {
          fail(e.what(), true);
        } catch (const std::exception& e) {
          fail(e.what(), false);
        }
      },
      [self, engine](cancel_atom, std::uint64_t fid) {
        const auto it = self->state.live.find(
            {self->current_sender() ? self->current_sender()->address() : caf::actor_addr{}, fid});
        if (it != self->state.live.end()) engine->cancel(it->second);
      },
      [self](release_atom, const caf::actor_addr& front, std::uint64_t fid) {
        self->state.live.erase({front, fid});
      },
      [engine](metrics_atom) -> EngineMetrics { return engine->metrics(); },
      [engine](flush_atom) -> std::int64_t { return engine->flush_cache(); },
  };
}

// What a draft host shares with the draft workers it spawns (immutable).
struct DraftHostModel {
  model::LoadedModel model;
  std::string identity;
};

struct DraftHostState {
  std::map<caf::actor_addr, std::vector<draft_worker_actor>> workers;  // per scheduler
  static inline const char* name = "specactor.draft_host";
};

caf::behavior draft_host(caf::stateful_actor<DraftHostState>* self, std::shared_ptr<const DraftHostModel> m) {
  // A scheduler that went away leaves its draft workers nobody to work for.
  self->set_down_handler([self](caf::down_msg& dm) {
    auto it = self->state.workers.find(dm.source);
    if (it == self->state.workers.end()) return;
    for (auto& w : it->second) self->send_exit(w, caf::exit_reason::user_shutdown);
    spdlog::info("draft host: a scheduler went away; stopped its {} draft worker(s)", it->second.size());
    self->state.workers.erase(it);
  });
  return {
      [self, m](draft_atom, config::Snapshot& snap, const std::string& identity) -> caf::result<draft_worker_actor> {
        if (!snap) return user_error("draft host: no draft snapshot was sent");
        if (identity != m->identity)
          return user_error("draft host: the scheduler's target is another model than this host's --model-path " +
                            m->model.info.path);
        drafters::DrafterFactory factory;
        try {
          factory = drafters::find_drafter(snap);
        } catch (const std::exception& e) {
          return user_error(e.what());
        }
        auto scheduler = caf::actor_cast<caf::actor>(self->current_sender());
        if (!scheduler) return user_error("draft host: an anonymous request");
        // The target's KV stays with the target: a drafter that must read it cannot run here (its
        // factory says so, and the scheduler decodes without drafts).
        auto w = self->system().spawn<caf::detached>(
            draft_worker, snap, std::move(factory),
            drafters::DraftContext{m->model.info, m->model.tokenizer, m->model.weights, nullptr});
        auto& list = self->state.workers[scheduler.address()];
        if (list.empty()) self->monitor(scheduler);
        list.push_back(w);
        spdlog::info("draft host: a draft worker for {} (draft snapshot {})",
                     config::to_string(snap->speculative_algorithm), config::hash_hex(config::content_hash(*snap)));
        return w;
      },
  };
}

}  // namespace

caf::actor spawn_replica(caf::actor_system& system, Engine& engine) {
  return system.spawn<caf::detached>(replica, &engine);
}

int run_worker(const config::ServerArgs& args, const WorkerOptions& options) {
  // SIGINT/SIGTERM are taken by sigwait below: blocked before any thread starts, so every thread
  // inherits the mask and none is interrupted.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  if (options.host.empty())
    throw config::ConfigError(
        "--host: an empty address (give 127.0.0.1 for this machine only, or an address other machines reach)");
  check_tls(options.tls, "--tls-");
  if (options.tls.on() && (options.allow_insecure || !options.secret_file.empty()))
    throw config::ConfigError(std::string(options.allow_insecure ? "--insecure" : "--secret-file") +
                              ": not with --tls-certificate (TLS with certificates is the authentication)");
  if (options.allow_insecure && !options.secret_file.empty())
    throw config::ConfigError("--secret-file: not with --insecure (which asks for no secret)");
  // Without TLS a front proves the cluster secret; --insecure asks for nothing.
  const std::string secret =
      options.tls.on() || options.allow_insecure
          ? std::string()
          : load_secret(options.secret_file.empty() ? default_secret_file() : options.secret_file, "--secret-file",
                        true);
  const bool loopback = options.host == "127.0.0.1" || options.host == "::1" || options.host == "localhost";
  if (!loopback && options.allow_insecure)
    spdlog::warn("worker: --insecure on {}: whoever reaches this port can send it actor messages", options.host);
  // TLS towards fronts is the gate's: CAF speaks plain TCP on loopback behind it. The engine's own
  // link to a remote draft host (--speculative-draft-worker-tls-*) is CAF's, with OpenSSL.
  const TlsFiles draft_tls{args.speculative_draft_worker_tls_certificate.value_or(""),
                           args.speculative_draft_worker_tls_key.value_or(""),
                           args.speculative_draft_worker_tls_ca.value_or("")};
  check_tls(draft_tls, "--speculative-draft-worker-tls-");
  caf::actor_system_config cfg;
  configure_actor_system(cfg);
  configure_network(cfg, draft_tls);
  caf::actor_system system{cfg};
  std::unique_ptr<Engine> engine;
  caf::actor rep;
  std::string what;
  std::optional<StartupSignals> watch(std::in_place, "loading");
  if (options.role == "draft") {
    auto m = std::make_shared<DraftHostModel>();
    m->model = model::load_model(args);
    m->identity = model_identity(m->model.info);
    what = "draft workers for " + m->model.info.name;
    rep = system.spawn(draft_host, std::shared_ptr<const DraftHostModel>(std::move(m)));
  } else {
    engine = create_engine_in(system, args);
    rep = spawn_replica(system, *engine);
    what = engine->model_info().name + " (target snapshot " + engine->target_hash_before_draft() + ")";
  }
  // CAF's port takes loopback connections only, on a port the system picks; the gate listens where
  // asked (SO_REUSEADDR there, so a restarted worker takes its port back while old connections linger;
  // on Linux it does not let two processes listen on one port).
  const auto inner = system.middleman().publish(rep, 0, "127.0.0.1", true);
  std::unique_ptr<Gate> gate;
  auto stop_all = [&] {
    caf::anon_send_exit(rep, caf::exit_reason::user_shutdown);
    if (engine) engine->shutdown();
  };
  if (!inner) {
    stop_all();
    throw std::runtime_error("worker: cannot listen on a loopback port (" + system.render(inner.error()) + ")");
  }
  GateOptions gopt;
  gopt.max_frame_bytes = options.max_message_bytes;
  gopt.tls_certificate = options.tls.certificate;
  gopt.tls_key = options.tls.key;
  gopt.tls_ca = options.tls.ca;
  gopt.secret = secret;
  try {
    gate = Gate::open(options.host, options.port, *inner, gopt);
  } catch (...) {
    stop_all();
    throw;
  }
  const std::uint16_t port = gate->port();
  std::printf("specactor worker: listening on %s:%u%s\n", options.host.c_str(), static_cast<unsigned>(port),
              options.tls.on()         ? " (TLS)"
              : options.allow_insecure ? " (insecure)"
                                       : "");
  std::fflush(stdout);
  spdlog::info("worker: {} on {}:{} (messages up to {} MiB)", what, options.host, port,
               options.max_message_bytes >> 20);
  watch.reset();
  int sig = 0;
  sigwait(&stop, &sig);
  spdlog::info("worker: {} received, stopping", sig == SIGINT ? "SIGINT" : "SIGTERM");
  if (engine) engine->shutdown();  // running requests end with an error event, sent before the replica stops
  gate.reset();                    // no new connections; those open close
  caf::anon_send_exit(rep, caf::exit_reason::user_shutdown);
  system.middleman().unpublish(rep, *inner);
  return 0;
}

}  // namespace specactor::actors
