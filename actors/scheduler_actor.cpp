// actors/scheduler_actor.cpp — the scheduler actor: moves messages for the scheduling policy
// (sched/policy.hpp). One step at a time: the policy plans it, the draft worker proposes when the
// plan asks, the target worker runs it, the policy streams and retires; repeat while there is work.
#include "actors/scheduler_actor.hpp"

#include <spdlog/spdlog.h>

#include <caf/all.hpp>
#include <caf/io/middleman.hpp>
#include <caf/openssl/manager.hpp>
#include <filesystem>
#include <optional>
#include <system_error>
#include <utility>

#include "actors/draft_worker.hpp"
#include "actors/system.hpp"
#include "actors/target_worker.hpp"
#include "actors/wire.hpp"
#include "config/error.hpp"
#include "kernels/cpu/machine.hpp"
#include "kernels/cpu/matmul.hpp"
#include "sched/budget_memory.hpp"
#include "sched/policy.hpp"

namespace specactor::actors {

struct SchedulerState {
  config::Snapshot target_snapshot;
  config::Snapshot draft_snapshot;  // derived once the target model is loaded (null for NONE)
  target_worker_actor target;
  draft_worker_actor draft;
  caf::io::middleman_actor secret_connector;  // a remote draft host's link without TLS (made once)
  drafters::DrafterNeeds needs;               // what the draft worker asked for when it came up
  std::optional<TargetInfo> info;
  caf::error target_failure;  // what ready() answers once the target failed (keeps user vs internal)
  std::vector<caf::typed_response_promise<TargetInfo>> ready_waiters;
  bool ready_on_draft_down = false;  // the draft worker failed its first answer: ready once its down is seen
  // The step whose proposal round is out: answered by the draft worker's reply, its error, or — a
  // remote draft worker whose connection is lost never answers — by its down message.
  std::shared_ptr<sched::StepPlan> proposal_in_flight;
  std::unique_ptr<sched::Scheduler> policy;  // everything that is not messaging (sched/policy.hpp)
  sched::BudgetMemory memory;                // what the budget learned, kept across starts (sched/budget_memory.hpp)
  static inline const char* name = "scheduler";
};

namespace {

using Self = scheduler_actor::stateful_pointer<SchedulerState>;

void tick(Self self);
void fail_target(Self self, const std::string& error, caf::error reason);

void run_step(Self self, sched::StepPlan plan) {
  auto& st = self->state;
  if (!st.target) {  // gone while a proposal was out
    st.policy->step_dropped(plan);
    return;
  }
  auto batch = std::move(plan.batch);
  plan.batch = {};
  self->request(st.target, caf::infinite, step_atom::value, std::move(batch))
      .then(
          [self, plan](StepResult& res) {
            auto& st = self->state;
            st.policy->step_done(plan, res);
            st.memory.save_if_due(*st.policy);
            tick(self);
          },
          [self, plan](caf::error& err) {
            auto& p = *self->state.policy;
            if (p.stale(plan)) return;
            const std::string msg = "target step failed: " + self->system().render(err);
            spdlog::error("{}", msg);
            p.step_failed(plan, msg);
            // A step bounced off a stopped target worker: the worker is gone, whether or not its down
            // message has arrived yet (that message only refines the reason, below).
            const bool receiver_down = err.category() == caf::atom("system") &&
                                       err.code() == static_cast<std::uint8_t>(caf::sec::request_receiver_down);
            if (receiver_down && p.target_error().empty())
              fail_target(self, "target worker failed: " + self->system().render(err), err);
            tick(self);
          });
}

// One step: the policy plans it; a proposal round first when it drafts; then the target step.
void tick(Self self) {
  auto& st = self->state;
  auto plan = st.policy->next_step(static_cast<bool>(st.draft));
  if (!plan) return;
  if (plan->proposals.items.empty()) {
    run_step(self, std::move(*plan));
    return;
  }
  auto proposals = std::move(plan->proposals);
  plan->proposals = {};
  auto pending = std::make_shared<sched::StepPlan>(std::move(*plan));  // one of three answers runs
  st.proposal_in_flight = pending;
  self->request(st.draft, caf::infinite, propose_atom::value, std::move(proposals))
      .then(
          [self, pending](Proposals& p) {
            if (self->state.proposal_in_flight != pending) return;  // the down message came first
            self->state.proposal_in_flight.reset();
            if (self->state.policy->apply_proposals(*pending, p)) run_step(self, std::move(*pending));
          },
          [self, pending](caf::error& err) {
            if (self->state.proposal_in_flight != pending) return;
            self->state.proposal_in_flight.reset();
            // The draft worker failed mid-step: this step runs without drafts.
            if (!self->state.policy->proposals_failed(*pending)) return;
            spdlog::warn("draft proposal failed ({}); decoding without drafts", self->system().render(err));
            run_step(self, std::move(*pending));
          });
}

void fail_target(Self self, const std::string& error, caf::error reason) {
  auto& st = self->state;
  st.policy->set_target_failed(error);
  st.target_failure = std::move(reason);
  for (auto& rp : st.ready_waiters) rp.deliver(st.target_failure);
  st.ready_waiters.clear();
}

void announce_ready(Self self);
void request_needs(Self self);

// A draft worker that could not be had: the engine decodes without drafts, and says why.
void draft_unavailable(Self self, const std::string& why, bool initial) {
  spdlog::error("{}; decoding without a drafter", why);
  auto& m = self->state.policy->metrics();
  ++m.draft_failures;
  m.draft_error = why;
  if (initial) announce_ready(self);
}

// The draft worker of `--speculative-draft-worker HOST:PORT`: the draft host there spawns it from
// the draft snapshot derived here (sent over the wire) and the scheduler monitors it as a local one.
void connect_draft(Self self, bool initial) {
  auto& st = self->state;
  const std::string flag = "--speculative-draft-worker";
  std::vector<WorkerAddress> addr;
  try {
    addr = parse_workers(st.draft_snapshot->speculative_draft_worker, flag);
    if (addr.size() != 1) throw config::ConfigError(flag + ": one HOST:PORT (got " + std::to_string(addr.size()) + ")");
  } catch (const config::ConfigError& e) {
    return draft_unavailable(self, e.what(), initial);
  }
  if (!self->system().has_middleman())
    return draft_unavailable(self, flag + ": this actor system has no network layer (load caf::io::middleman)",
                             initial);
  const std::string where = addr[0].text();
  // With --speculative-draft-worker-tls-* the engine's system has the OpenSSL manager: TLS, each
  // side's certificate checked against its CA.
  // Without TLS the draft host's gate asks for the cluster secret (actors/gate.hpp), unless the file
  // is "none" (a host started with --insecure).
  caf::io::middleman_actor mm;
  if (self->system().has_openssl_manager()) {
    mm = self->system().openssl_manager().actor_handle();
  } else {
    std::string secret;
    try {
      secret = client_secret(st.draft_snapshot->speculative_draft_worker_secret_file.value_or(""),
                             "--speculative-draft-worker-secret-file");
    } catch (const config::ConfigError& e) {
      return draft_unavailable(self, e.what(), initial);
    }
    if (secret.empty()) {
      mm = self->system().middleman().actor_handle();
    } else {
      if (!st.secret_connector) st.secret_connector = spawn_secret_connector(self->system(), secret);
      mm = st.secret_connector;
    }
  }
  self->request(mm, std::chrono::seconds(10), caf::connect_atom::value, addr[0].host, addr[0].port)
      .then(
          [self, initial, where, flag](const caf::node_id&, caf::strong_actor_ptr& ptr, const std::set<std::string>&) {
            auto host = caf::actor_cast<caf::actor>(std::move(ptr));
            if (!host) return draft_unavailable(self, flag + " " + where + ": nothing is published there", initial);
            auto& st = self->state;
            self->request(host, std::chrono::seconds(120), draft_atom::value, st.draft_snapshot,
                          model_identity(st.info->info))
                .then(
                    [self, initial, where](draft_worker_actor& w) {
                      auto& st = self->state;
                      st.draft = w;
                      self->monitor(w);
                      st.policy->metrics().draft_alive = true;
                      spdlog::info("draft worker at {} (draft snapshot {} sent)", where,
                                   config::hash_hex(config::content_hash(*st.draft_snapshot)));
                      if (initial) request_needs(self);
                    },
                    [self, initial, where, flag](caf::error& e) {
                      draft_unavailable(self, flag + " " + where + ": " + error_message(e), initial);
                    });
          },
          [self, initial, where, flag](caf::error& e) {
            draft_unavailable(self, flag + " " + where + ": cannot connect (" + self->system().render(e) + ")",
                              initial);
          });
}

// `initial`: the engine is starting; it becomes ready once the worker answered what it needs (or
// could not be had).
void spawn_draft(Self self, bool initial) {
  auto& st = self->state;
  if (!st.draft_snapshot || !st.info) return;
  if (!st.draft_snapshot->speculative_draft_worker.empty()) return connect_draft(self, initial);
  drafters::DrafterFactory factory;
  try {
    factory = drafters::find_drafter(st.draft_snapshot);
  } catch (const std::exception& e) {
    return draft_unavailable(self, e.what(), initial);
  }
  // The factory and the worker get the very snapshot object derived above.
  st.draft = self->spawn<caf::detached + caf::monitored>(
      draft_worker, st.draft_snapshot, std::move(factory),
      drafters::DraftContext{st.info->info, st.info->tokenizer, st.info->weights, st.info->kv});
  st.policy->metrics().draft_alive = true;
  if (initial) request_needs(self);
}

// Starts the budget from what an engine of the same key learned before (--speculative-budget-cache).
void open_memory(Self self) {
  auto& st = self->state;
  st.memory.open(*st.policy, *st.target_snapshot, st.draft ? st.draft_snapshot.get() : nullptr, st.info->info);
}

void announce_ready(Self self) {
  auto& st = self->state;
  st.policy->metrics().algorithm = std::string(config::to_string(st.target_snapshot->speculative_algorithm));
  st.policy->set_draft(sched::draft_shape_of(st.draft_snapshot, st.needs));
  open_memory(self);
  for (auto& rp : st.ready_waiters) rp.deliver(*st.info);
  st.ready_waiters.clear();
  st.policy->set_ready();
  tick(self);
}

void on_target_ready(Self self, TargetInfo& info) {
  auto& st = self->state;
  st.info = info;
  st.policy->set_target(info.kv_capacity_tokens / info.page_size, info.tokenizer, info.info.hidden_size);
  st.policy->seed_costs(info.step_probe);
  if (st.target_snapshot->speculative_algorithm == config::SpecAlgorithm::None) {
    announce_ready(self);
    return;
  }
  // Derived once, from the resolved target snapshot and the model the worker actually loaded.
  st.draft_snapshot = config::derive_draft(st.target_snapshot, info.info.facts());
  // The tree size counts in every reservation from now on, even before the worker answers.
  st.policy->set_draft(sched::draft_shape_of(st.draft_snapshot, {}));
  spawn_draft(self, true);
}

// Ready once the draft worker is up (or has failed: then the engine decodes without drafts).
void request_needs(Self self) {
  auto& st = self->state;
  self->request(st.draft, caf::infinite, needs_atom::value)
      .then(
          [self](drafters::DrafterNeeds& n) {
            self->state.needs = std::move(n);
            // The drafter's model config (kind, block size, layers...), for /server_info and /metrics.
            self->request(self->state.draft, caf::infinite, info_atom::value)
                .then([self](std::string& cfg) { self->state.policy->metrics().draft_model = std::move(cfg); },
                      [](caf::error&) {});  // a remote worker that does not answer: nothing to show
            announce_ready(self);
          },
          [self](caf::error&) {
            // The worker went down before answering (its drafter could not be built). Announce once
            // its down message is recorded, so whoever waited for `ready` sees the reason in the metrics.
            if (self->state.draft)
              self->state.ready_on_draft_down = true;
            else
              announce_ready(self);
          });
}

// A bug in a handler must not leave callers waiting: every request gets its final (error) event
// before the scheduler stops.
caf::error on_exception(Self self, std::exception_ptr& eptr) {
  std::string what = "unknown exception";
  try {
    std::rethrow_exception(eptr);
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
  }
  const std::string msg = "internal error in the scheduler: " + what;
  spdlog::error("{}", msg);
  auto& s = self->state;
  s.policy->fail_everything(msg);
  for (auto& rp : s.ready_waiters) rp.deliver(internal_error(msg));
  s.ready_waiters.clear();
  if (s.draft) self->send_exit(s.draft, caf::exit_reason::user_shutdown);
  if (s.target) self->send_exit(s.target, caf::exit_reason::user_shutdown);
  return internal_error(msg);
}

// The draft worker going down degrades to plain decoding; the target worker going down fails the
// running requests (unless the engine is shutting it down).
void on_down(Self self, caf::down_msg& dm) {
  auto& s = self->state;
  if (s.draft && dm.source == caf::actor_cast<caf::actor_addr>(s.draft)) {
    spdlog::warn("draft worker went down ({}); running requests continue without drafts",
                 self->system().render(dm.reason));
    s.draft = nullptr;
    auto& m = s.policy->metrics();
    ++m.draft_failures;
    m.draft_alive = false;
    m.draft_error = self->system().render(dm.reason);
    if (s.ready_on_draft_down) {
      s.ready_on_draft_down = false;
      announce_ready(self);
    }
    // A proposal round it had not answered: that step runs without drafts now.
    if (auto pending = std::exchange(s.proposal_in_flight, nullptr); pending && s.policy->proposals_failed(*pending))
      run_step(self, std::move(*pending));
    return;
  }
  if (s.target && dm.source == caf::actor_cast<caf::actor_addr>(s.target)) {
    s.target = nullptr;
    if (dm.reason == caf::exit_reason::user_shutdown || dm.reason == caf::exit_reason::normal) return;
    const std::string error = "target worker failed: " + self->system().render(dm.reason);
    spdlog::error("{}", error);
    if (!s.policy->target_error().empty()) {  // already failed by a bounced step: report the real reason
      s.policy->metrics().target_error = error;
      return;
    }
    fail_target(self, error, internal_error(error));
  }
}

void on_exit(Self self, caf::exit_msg& msg) {
  auto& s = self->state;
  self->state.memory.save(*self->state.policy);
  s.policy->fail_everything("the engine shut down");
  if (s.draft) self->send_exit(s.draft, msg.reason);
  if (s.target) self->send_exit(s.target, msg.reason);
  if (s.secret_connector) self->send_exit(s.secret_connector, msg.reason);
  self->quit(msg.reason);
}

caf::result<TargetInfo> when_ready(Self self) {
  auto& s = self->state;
  if (s.policy->ready()) return *s.info;
  if (!s.policy->target_error().empty())
    return s.target_failure ? s.target_failure : internal_error(s.policy->target_error());
  auto rp = self->make_response_promise<TargetInfo>();
  s.ready_waiters.push_back(rp);
  return rp;
}

// The resolved and derived snapshots beside the ones the workers hold now (each asked in turn).
caf::result<SnapshotReport> report_snapshots(Self self) {
  auto& s = self->state;
  auto rp = self->make_response_promise<SnapshotReport>();
  SnapshotReport base{s.target_snapshot, nullptr, s.draft_snapshot, nullptr};
  if (!s.target) {
    rp.deliver(base);
    return rp;
  }
  self->request(s.target, std::chrono::seconds(30), snapshot_atom::value)
      .then(
          [self, rp, base](config::Snapshot& t) mutable {
            base.target_worker = t;
            auto& s2 = self->state;
            if (!s2.draft) {
              rp.deliver(base);
              return;
            }
            self->request(s2.draft, std::chrono::seconds(30), snapshot_atom::value)
                .then(
                    [rp, base](config::Snapshot& d) mutable {
                      base.draft_worker = d;
                      rp.deliver(base);
                    },
                    [rp, base](caf::error&) mutable { rp.deliver(base); });
          },
          [rp](caf::error& e) mutable { rp.deliver(e); });
  return rp;
}

scheduler_actor::behavior_type scheduler(scheduler_actor::stateful_pointer<SchedulerState> self,
                                         config::Snapshot target) {
  auto& st = self->state;
  st.target_snapshot = std::move(target);
  // A retired request's KV is freed in both workers (a request they never saw is ignored there).
  st.policy = std::make_unique<sched::Scheduler>(sched::limits_of(*st.target_snapshot), [self](std::uint64_t id) {
    auto& s = self->state;
    if (s.target) self->send(s.target, release_atom::value, id);
    if (s.draft) self->send(s.draft, release_atom::value, id);
  });
  // The prefix cache's page references live with the KV pages, in the target worker; its messages
  // and the release after them arrive in the order sent.
  st.policy->set_cache_sink([self](sched::CacheOps ops) {
    auto& s = self->state;
    if (s.target) self->send(s.target, cache_atom::value, ops.req, std::move(ops.keep), std::move(ops.drop));
  });
  st.target = self->spawn<caf::detached + caf::monitored>(target_worker, st.target_snapshot);
  self->set_exception_handler(
      [self](caf::scheduled_actor*, std::exception_ptr& eptr) { return on_exception(self, eptr); });
  self->set_down_handler([self](caf::down_msg& dm) { on_down(self, dm); });
  self->set_exit_handler([self](caf::exit_msg& msg) { on_exit(self, msg); });
  self->request(st.target, caf::infinite, info_atom::value)
      .then([self](TargetInfo& info) { on_target_ready(self, info); },
            [self](caf::error& err) { fail_target(self, error_message(err), err); });

  return {
      [self](ready_atom) { return when_ready(self); },
      [self](submit_atom, std::shared_ptr<const Submission>& sub) {
        self->state.policy->submit(std::move(sub));
        tick(self);
      },
      [self](cancel_atom, std::uint64_t id) {
        self->state.policy->cancel(id);
        tick(self);
      },
      [self](metrics_atom) -> EngineMetrics {
        EngineMetrics m = self->state.policy->snapshot_metrics();
        m.draft_alive = static_cast<bool>(self->state.draft);
        return m;
      },
      [self](snapshot_atom) { return report_snapshots(self); },
      [self](reconf_atom, config::Snapshot& snap) {
        auto& s = self->state;
        self->state.memory.save(
            *self->state.policy);  // under the old shape's key; what is learned from now on goes under the new one
        s.draft_snapshot = snap;
        s.policy->set_draft(sched::draft_shape_of(snap, s.needs));
        if (s.memory.kept()) open_memory(self);
        if (s.draft) self->send(s.draft, reconf_atom::value, snap);
      },
      [self](restart_atom) {
        if (!self->state.draft) spawn_draft(self, false);
      },
      [self](tick_atom) { tick(self); },
      [self](flush_atom) -> std::int64_t {
        const std::int64_t n = self->state.policy->flush_cache();
        if (self->state.draft) self->send(self->state.draft, flush_atom::value);
        tick(self);  // room for queued requests
        return n;
      },
  };
}

}  // namespace

scheduler_actor spawn_scheduler(caf::actor_system& system, config::Snapshot target) {
  return system.spawn(scheduler, std::move(target));
}

}  // namespace specactor::actors
