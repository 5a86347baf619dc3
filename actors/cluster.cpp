#include "actors/cluster.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/openssl/manager.hpp>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "actors/system.hpp"
#include "actors/wire.hpp"
#include "config/error.hpp"
#include "config/input.hpp"
#include "model/gguf.hpp"
#include "model/loader.hpp"

namespace specactor::actors {

// One request on its way through the front: the router alone touches it.
struct FrontSubmission {
  GenerationRequest request;  // prepared: prompt_ids set (kept for a retry)
  std::function<void(const TokenEvent&)> on_token;
};

}  // namespace specactor::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<specactor::actors::FrontSubmission>)

namespace specactor::actors {

namespace {

// The blocks of a token sequence as chained hashes: block i's hash covers tokens [0, 16(i+1)).
constexpr std::size_t kBlock = 16;

std::vector<std::uint64_t> block_chain(const std::vector<std::int32_t>& a, const std::vector<std::int32_t>& b = {}) {
  std::vector<std::uint64_t> out;
  std::uint64_t h = 0x9E3779B97F4A7C15ull;
  std::size_t n = 0;
  auto add = [&](std::int32_t t) {
    h = (h ^ static_cast<std::uint32_t>(t)) * 0x100000001B3ull;
    if (++n % kBlock == 0) {
      std::uint64_t z = h + 0x9E3779B97F4A7C15ull;  // splitmix64 finaliser: one value per block
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      out.push_back(z ^ (z >> 31));
    }
  };
  for (auto t : a) add(t);
  for (auto t : b) add(t);
  return out;
}

// What one replica has probably cached: block hashes, least recently used out.
class PrefixIndex {
 public:
  std::size_t match(const std::vector<std::uint64_t>& chain) const {
    std::size_t n = 0;
    while (n < chain.size() && blocks_.count(chain[n])) ++n;
    return n;
  }
  void insert(const std::vector<std::uint64_t>& chain) {
    for (auto h : chain) blocks_[h] = ++tick_;
    if (blocks_.size() <= kCap) return;
    std::vector<std::uint64_t> ticks;
    ticks.reserve(blocks_.size());
    for (const auto& [h, t] : blocks_) ticks.push_back(t);
    std::nth_element(ticks.begin(), ticks.begin() + static_cast<std::ptrdiff_t>(ticks.size() / 2), ticks.end());
    const std::uint64_t cut = ticks[ticks.size() / 2];
    for (auto it = blocks_.begin(); it != blocks_.end();) it = it->second < cut ? blocks_.erase(it) : std::next(it);
  }
  void clear() { blocks_.clear(); }
  std::size_t size() const { return blocks_.size(); }

 private:
  static constexpr std::size_t kCap = 1 << 18;  // 4 Mi tokens of prefixes per replica
  std::unordered_map<std::uint64_t, std::uint64_t> blocks_;
  std::uint64_t tick_ = 0;
};

enum class ReplicaState { Down, Connecting, Up, Refused };

const char* state_name(ReplicaState s) {
  switch (s) {
    case ReplicaState::Down:
      return "down";
    case ReplicaState::Connecting:
      return "connecting";
    case ReplicaState::Up:
      return "up";
    case ReplicaState::Refused:
      return "refused";
  }
  return "?";
}

struct Replica {
  WorkerAddress addr;
  ReplicaState state = ReplicaState::Down;
  caf::actor handle;
  std::string error;  // why it is down or refused
  ReplicaInfo info;
  bool has_info = false;
  std::int64_t load = 0;  // requests in flight
  std::int64_t routed = 0, routed_by_prefix = 0, retried_away = 0, failed = 0, connects = 0;
  PrefixIndex seen;
};

struct Pending {
  std::shared_ptr<FrontSubmission> sub;
  std::vector<std::uint64_t> chain;   // the prompt's blocks
  std::vector<std::int32_t> emitted;  // tokens streamed so far
  int replica = -1;
  std::uint64_t wire = 0;  // the id the replica knows this attempt by (a new one per attempt)
  std::int64_t attempts = 0;
  bool ended = false;
};

struct RouterState {
  ClusterOptions opt;
  std::string model_json;  // the front's model: a replica must report the same
  std::vector<Replica> replicas;
  std::map<std::uint64_t, Pending> pending;
  // Replicas send their events anonymously (from engine threads): an attempt's own id tells which
  // attempt an event belongs to, so a late event of an abandoned attempt is dropped.
  std::map<std::uint64_t, std::uint64_t> wire_to_id;
  std::uint64_t next_wire = 0;
  std::size_t turn = 0;                // round robin among equals
  caf::io::middleman_actor connector;  // how replicas are reached (TLS, the secret's, or plain)
  static inline const char* name = "specactor.router";

  ~RouterState() {
    for (auto& [id, p] : pending) deliver_end(id, p, "the front shut down");
  }

  static void deliver_end(std::uint64_t id, Pending& p, const std::string& why) {
    if (p.ended) return;
    p.ended = true;
    try {
      p.sub->on_token(TokenEvent::final_error(id, why));
    } catch (const std::exception&) {
    }
  }
};

using router_actor = caf::stateful_actor<RouterState>;

std::string replicas_json(const RouterState& st) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& r : st.replicas) {
    nlohmann::json j;
    j["address"] = r.addr.text();
    j["state"] = state_name(r.state);
    if (!r.error.empty()) j["error"] = r.error;
    j["in_flight"] = r.load;
    j["routed"] = r.routed;
    j["routed_by_prefix"] = r.routed_by_prefix;
    j["retried_elsewhere"] = r.retried_away;
    j["failed"] = r.failed;
    j["connects"] = r.connects;
    j["prefix_index_blocks"] = r.seen.size();
    if (r.has_info) {
      const ReplicaInfo& i = r.info;
      j["host"] = i.host;
      j["pid"] = i.pid;
      j["max_running_requests"] = i.max_running;
      j["context_length"] = i.context_length;
      const SnapshotReport& rep = i.snapshots;
      auto snap = [](const config::Snapshot& s) {
        return s ? nlohmann::json{{"hash", config::hash_hex(config::content_hash(*s))},
                                  {"snapshot", config::to_json(*s)}}
                 : nlohmann::json(nullptr);
      };
      j["target"] = snap(rep.target_worker ? rep.target_worker : rep.resolved_target);
      j["draft"] = snap(rep.draft_worker ? rep.draft_worker : rep.derived_draft);
      j["target_hash_before_draft"] = i.target_hash;
      // The hashes the replica computed of what its workers hold: equal to the front's when the
      // snapshot crossed the wire intact.
      j["target_worker_hash_on_replica"] = i.target_worker_hash;
      j["draft_worker_hash_on_replica"] = i.draft_worker_hash;
      j["target_worker_holds_resolved_object"] = i.target_holds_resolved;
      j["draft_worker_holds_derived_object"] = i.draft_holds_derived;
    }
    a.push_back(std::move(j));
  }
  return a.dump();
}

// The replica for a request: the longest cached prefix unless it is too loaded, else the least
// loaded (in turn among equals). -1 when none is up. `avoid`: a replica to skip if another is up.
int pick(RouterState& st, const Pending& p, int avoid) {
  const std::size_t n = st.replicas.size();
  if (st.opt.routing == "round-robin") {
    for (std::size_t k = 0; k < n; ++k) {
      const int i = static_cast<int>((st.turn + k) % n);
      if (st.replicas[i].state == ReplicaState::Up && i != avoid) {
        st.turn = static_cast<std::size_t>(i) + 1;
        return i;
      }
    }
    return avoid >= 0 && st.replicas[avoid].state == ReplicaState::Up ? avoid : -1;
  }
  // The longest match, and among the replicas with it the least loaded; the least loaded of all.
  int least = -1, best = -1;
  std::size_t best_match = 0;
  for (std::size_t k = 0; k < n; ++k) {
    const int i = static_cast<int>((st.turn + k) % n);
    const Replica& r = st.replicas[i];
    if (r.state != ReplicaState::Up || i == avoid) continue;
    if (least < 0 || r.load < st.replicas[least].load) least = i;
    if (st.opt.routing != "cache-aware") continue;
    const std::size_t m = r.seen.match(p.chain);
    if (m > best_match || (m == best_match && m > 0 && r.load < st.replicas[best].load)) best_match = m, best = i;
  }
  if (least < 0) return avoid >= 0 && st.replicas[avoid].state == ReplicaState::Up ? avoid : -1;
  ++st.turn;
  // The prefix decides only when it is more than half the prompt's tokens (as sglang's router's cache
  // threshold): a short shared part (a system prompt every replica has) leaves it to the load, so a
  // replica that starts empty gets work.
  if (best >= 0 && 2 * best_match * kBlock > p.sub->request.prompt_ids.size() &&
      st.replicas[best].load - st.replicas[least].load <= st.opt.balance) {
    ++st.replicas[best].routed_by_prefix;
    return best;
  }
  return least;
}

std::string reachability(const RouterState& st) {
  std::string s;
  for (const auto& r : st.replicas)
    s += (s.empty() ? "" : "; ") + r.addr.text() + ": " + state_name(r.state) +
         (r.error.empty() ? "" : " (" + r.error + ")");
  return s;
}

void dispatch(router_actor* self, std::uint64_t id, Pending& p, int avoid) {
  auto& st = self->state;
  const int i = pick(st, p, avoid);
  if (i < 0) {
    RouterState::deliver_end(id, p, "no worker is reachable: " + reachability(st));
    st.wire_to_id.erase(p.wire);
    st.pending.erase(id);
    return;
  }
  Replica& r = st.replicas[i];
  p.replica = i;
  ++p.attempts;
  ++r.load;
  ++r.routed;
  r.seen.insert(p.chain);  // the replica will have the prompt cached: the next turn goes there too
  if (p.wire) st.wire_to_id.erase(p.wire);
  p.wire = ++st.next_wire;
  st.wire_to_id[p.wire] = id;
  self->send(r.handle, submit_atom::value, p.wire, p.sub->request);
}

// A replica went away (or is stopping): what it ran is retried elsewhere when nothing streamed yet.
void lose(router_actor* self, int i, const std::string& why) {
  auto& st = self->state;
  Replica& r = st.replicas[i];
  if (r.state == ReplicaState::Up) spdlog::warn("router: worker {} went away: {}", r.addr.text(), why);
  if (r.handle) self->demonitor(r.handle);
  r.handle = nullptr;
  r.state = ReplicaState::Down;
  r.error = why;
  r.load = 0;
  r.seen.clear();  // a restarted replica has an empty cache
  std::vector<std::uint64_t> ids;
  for (auto& [id, p] : st.pending)
    if (p.replica == i) ids.push_back(id);
  for (auto id : ids) {
    Pending& p = st.pending[id];
    p.replica = -1;
    if (p.emitted.empty() && p.attempts <= st.opt.retries) {
      ++r.retried_away;
      dispatch(self, id, p, i);
    } else {
      ++r.failed;
      RouterState::deliver_end(id, p,
                               "worker " + r.addr.text() + " went away after streaming " +
                                   std::to_string(p.emitted.size()) + " tokens (" + why + ")");
      st.wire_to_id.erase(p.wire);
      st.pending.erase(id);
    }
  }
}

void try_connect(router_actor* self, int i) {
  auto& st = self->state;
  Replica& r = st.replicas[i];
  r.state = ReplicaState::Connecting;
  auto mm = st.connector;
  const std::string host = r.addr.host;
  const std::uint16_t port = r.addr.port;
  self->request(mm, std::chrono::seconds(5), caf::connect_atom::value, host, port)
      .then(
          [self, i](const caf::node_id&, caf::strong_actor_ptr& ptr, const std::set<std::string>&) {
            auto& r = self->state.replicas[i];
            if (!ptr) {
              r.state = ReplicaState::Down;
              r.error = "no actor is published there";
              return;
            }
            auto h = caf::actor_cast<caf::actor>(std::move(ptr));
            self->request(h, std::chrono::seconds(30), hello_atom::value)
                .then(
                    [self, i, h](ReplicaInfo& info) {
                      auto& st = self->state;
                      auto& r = st.replicas[i];
                      if (info.model_json != st.model_json) {
                        r.state = ReplicaState::Refused;
                        r.error = "it serves another model (" + config::printable(info.model_json, 200) + ")";
                        spdlog::error("router: worker {} refused: {}", r.addr.text(), r.error);
                        return;
                      }
                      r.info = std::move(info);
                      r.has_info = true;
                      r.handle = h;
                      r.state = ReplicaState::Up;
                      r.error.clear();
                      ++r.connects;
                      self->monitor(h);
                      spdlog::info("router: worker {} up (pid {} on {}, target snapshot {}, draft {})", r.addr.text(),
                                   r.info.pid, r.info.host, r.info.target_worker_hash,
                                   r.info.draft_worker_hash.empty() ? "none" : r.info.draft_worker_hash);
                    },
                    [self, i](caf::error& e) {
                      auto& r = self->state.replicas[i];
                      r.state = ReplicaState::Down;
                      r.error = "it did not say hello: " + self->system().render(e);
                    });
          },
          [self, i](caf::error& e) {
            auto& r = self->state.replicas[i];
            r.state = ReplicaState::Down;
            r.error = self->system().render(e);
          });
}

caf::behavior router(router_actor* self, ClusterOptions opt, std::string model_json) {
  auto& st = self->state;
  st.opt = std::move(opt);
  st.model_json = std::move(model_json);
  if (st.opt.tls.on()) {
    st.connector = self->system().openssl_manager().actor_handle();
  } else if (st.opt.secret.empty()) {
    st.connector = self->system().middleman().actor_handle();
  } else {
    st.connector = spawn_secret_connector(self->system(), st.opt.secret);
    self->link_to(st.connector);  // it ends with the router
  }
  for (const auto& a : st.opt.workers) {
    Replica r;
    r.addr = a;
    st.replicas.push_back(std::move(r));
  }
  self->set_down_handler([self](caf::down_msg& m) {
    auto& st = self->state;
    for (std::size_t i = 0; i < st.replicas.size(); ++i)
      if (st.replicas[i].handle && st.replicas[i].handle.address() == m.source)
        lose(self, static_cast<int>(i), m.reason ? self->system().render(m.reason) : "its connection closed");
  });
  self->send(self, tick_atom::value);
  const auto interval = std::chrono::milliseconds(static_cast<std::int64_t>(st.opt.reconnect_interval_s * 1000));
  return {
      [self, interval](tick_atom) {
        auto& st = self->state;
        for (std::size_t i = 0; i < st.replicas.size(); ++i)
          if (st.replicas[i].state == ReplicaState::Down) try_connect(self, static_cast<int>(i));
        self->delayed_send(self, interval, tick_atom::value);
      },
      [self](submit_atom, std::uint64_t id, std::shared_ptr<FrontSubmission>& sub) {
        Pending p;
        p.chain = block_chain(sub->request.prompt_ids);
        p.sub = std::move(sub);
        auto it = self->state.pending.emplace(id, std::move(p)).first;
        dispatch(self, id, it->second, -1);
      },
      [self](event_atom, std::uint64_t wire, TokenEvent& ev) {
        auto& st = self->state;
        const auto w = st.wire_to_id.find(wire);
        if (w == st.wire_to_id.end()) return;  // an attempt abandoned (its replica went away)
        const std::uint64_t id = w->second;
        const auto it = st.pending.find(id);
        if (it == st.pending.end() || it->second.replica < 0 || it->second.wire != wire) return;
        Pending& p = it->second;
        const int i = p.replica;
        Replica& r = st.replicas[i];
        // A replica that is stopping ends what it runs with an error: retried like a lost one.
        if (ev.finished && ev.finish_reason == "error" && !ev.invalid_request && p.emitted.empty() &&
            ev.tokens.empty() && p.attempts <= st.opt.retries && ev.error.find("shut down") != std::string::npos) {
          --r.load;
          ++r.retried_away;
          p.replica = -1;
          dispatch(self, id, p, i);
          return;
        }
        p.emitted.insert(p.emitted.end(), ev.tokens.begin(), ev.tokens.end());
        ev.id = id;
        if (ev.finished) {
          --r.load;
          r.seen.insert(block_chain(p.sub->request.prompt_ids, p.emitted));
          p.ended = true;
        }
        try {
          p.sub->on_token(ev);
        } catch (const std::exception& e) {
          spdlog::error("router: a token callback threw: {}", e.what());
        }
        if (ev.finished) {
          st.wire_to_id.erase(wire);
          st.pending.erase(it);
        }
      },
      [self](cancel_atom, std::uint64_t id) {
        auto& st = self->state;
        const auto it = st.pending.find(id);
        if (it == st.pending.end()) return;
        if (it->second.replica >= 0)
          self->send(st.replicas[it->second.replica].handle, cancel_atom::value, it->second.wire);
      },
      // The replicas now: (handles of those up, a JSON description of all).
      [self](caf::get_atom) -> std::tuple<std::vector<caf::actor>, std::string> {
        std::vector<caf::actor> up;
        for (const auto& r : self->state.replicas)
          if (r.state == ReplicaState::Up) up.push_back(r.handle);
        return {up, replicas_json(self->state)};
      },
  };
}

void add_metrics(EngineMetrics& t, const EngineMetrics& m) {
  auto add_vec = [](std::vector<std::int64_t>& a, const std::vector<std::int64_t>& b) {
    if (a.size() < b.size()) a.resize(b.size(), 0);
    for (std::size_t i = 0; i < b.size(); ++i) a[i] += b[i];
  };
  t.requests_submitted += m.requests_submitted;
  t.requests_finished += m.requests_finished;
  t.requests_failed += m.requests_failed;
  t.requests_cancelled += m.requests_cancelled;
  t.running += m.running;
  t.queued += m.queued;
  t.generated_tokens += m.generated_tokens;
  t.steps += m.steps;
  t.decode_steps += m.decode_steps;
  t.speculative_steps += m.speculative_steps;
  t.drafted += m.drafted;
  t.accepted += m.accepted;
  t.draft_failures += m.draft_failures;
  if (!m.draft_error.empty()) t.draft_error = m.draft_error;
  t.fallback_steps += m.fallback_steps;
  t.adaptive = t.adaptive || m.adaptive;
  t.budget_skipped_steps += m.budget_skipped_steps;
  t.grammar_drafts += m.grammar_drafts;
  t.grammar_masks += m.grammar_masks;
  t.grammar_masks_computed += m.grammar_masks_computed;
  t.grammar_mask_ms += m.grammar_mask_ms;
  add_vec(t.verified_nodes, m.verified_nodes);
  t.draft_alive = t.draft_alive || m.draft_alive;
  if (t.algorithm.empty()) t.algorithm = m.algorithm;
  t.step_wall_ms += m.step_wall_ms;
  t.step_compute_ms += m.step_compute_ms;
  t.draft_ms += m.draft_ms;
  add_vec(t.drafted_at, m.drafted_at);
  add_vec(t.accepted_at, m.accepted_at);
  if (!m.target_error.empty()) t.target_error = m.target_error;
  t.kv_pages_total += m.kv_pages_total;
  t.kv_pages_free += m.kv_pages_free;
  t.prefix_cache = t.prefix_cache || m.prefix_cache;
  t.cache_query_tokens += m.cache_query_tokens;
  t.cache_hit_tokens += m.cache_hit_tokens;
  t.cache_pages += m.cache_pages;
  t.cache_evicted_pages += m.cache_evicted_pages;
  t.draft_cache_query_tokens += m.draft_cache_query_tokens;
  t.draft_cache_hit_tokens += m.draft_cache_hit_tokens;
  t.draft_cache_pages += m.draft_cache_pages;
  t.draft_cache_evicted_pages += m.draft_cache_evicted_pages;
  // Per-replica model state (cost curve, calibration): the first replica's.
  if (t.step_cost.empty()) {
    t.step_cost = m.step_cost;
    t.step_ms_1 = m.step_ms_1;
    t.calibration_error = m.calibration_error;
    t.calibrated_nodes = m.calibrated_nodes;
    t.draft_score_calibration_error = m.draft_score_calibration_error;
    t.draft_scored_nodes = m.draft_scored_nodes;
    t.budget_memory = m.budget_memory;
  }
}

}  // namespace

struct Cluster::Impl {
  ClusterOptions opt;
  model::ModelInfo info;
  std::shared_ptr<const model::Tokenizer> tokenizer;
  model::ChatTemplate chat;
  std::unique_ptr<caf::actor_system_config> cfg;
  std::unique_ptr<caf::actor_system> system;
  caf::actor router;
  ReplicaInfo first;  // the first replica that answered: its target snapshot stands for the cluster's
  std::atomic<std::uint64_t> next_id{1};
  std::mutex m;
  bool stopped = false;

  std::pair<std::vector<caf::actor>, nlohmann::json> query() {
    caf::scoped_actor self{*system};
    std::pair<std::vector<caf::actor>, nlohmann::json> out;
    self->request(router, std::chrono::seconds(30), caf::get_atom::value)
        .receive(
            [&](std::vector<caf::actor>& up, std::string& j) {
              out = {std::move(up), nlohmann::json::parse(j)};
            },
            [&](caf::error& e) { throw std::runtime_error("the router did not answer: " + system->render(e)); });
    return out;
  }
};

Cluster::Cluster(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Cluster::~Cluster() { shutdown(); }

std::unique_ptr<Cluster> Cluster::connect(const config::ServerArgs& args, const ClusterOptions& options) {
  if (options.workers.empty()) throw config::ConfigError("--workers: no address given");
  if (options.routing != "cache-aware" && options.routing != "least-loaded" && options.routing != "round-robin")
    throw config::ConfigError("--routing: '" + config::printable(options.routing, 40) +
                              "' (expected cache-aware, least-loaded or round-robin)");
  auto impl = std::make_unique<Impl>();
  impl->opt = options;
  // The model's metadata and tokenizer only: the replicas hold the weights.
  impl->info = model::resolve_target(args).info;
  if (!args.skip_tokenizer_init) {
    impl->tokenizer = model::load_tokenizer(args);
    impl->chat = model::ChatTemplate::choose(args.chat_template, impl->tokenizer->chat_template());
  }
  impl->cfg = std::make_unique<caf::actor_system_config>();
  configure_actor_system(*impl->cfg);
  check_tls(options.tls, "--worker-tls-");
  configure_network(*impl->cfg, options.tls);
  impl->system = std::make_unique<caf::actor_system>(*impl->cfg);
  impl->router = impl->system->spawn(router, options, model_identity(impl->info));
  // Wait for the first replica.
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<std::int64_t>(options.connect_timeout_s * 1000));
  std::unique_ptr<Cluster> c(new Cluster(std::move(impl)));
  for (;;) {
    auto [up, j] = c->impl_->query();
    if (!up.empty()) {
      caf::scoped_actor self{*c->impl_->system};
      std::string err;
      self->request(up.front(), std::chrono::seconds(30), hello_atom::value)
          .receive([&](ReplicaInfo& info) { c->impl_->first = std::move(info); },
                   [&](caf::error& e) { err = c->impl_->system->render(e); });
      if (err.empty()) break;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      std::string why;
      for (const auto& r : j) {
        std::string e = r.value("error", r["state"].get<std::string>());
        // A worker's gate sends its challenge first: CAF reads it as a broken handshake frame
        // (malformed_basp_message) or sees the gate close (disconnect_during_handshake), by timing.
        if (!options.tls.on() && options.secret.empty() &&
            (e.find("disconnect_during_handshake") != std::string::npos ||
             e.find("malformed_basp_message") != std::string::npos))
          e += " (a worker that asks for the cluster secret closes on a front without it: give the front "
               "--worker-secret-file, or start the workers with --insecure)";
        if (options.tls.on() && e.find("handshake") != std::string::npos)
          e += ": the TLS handshake failed (do both sides' certificates chain to the CA the other trusts?)";
        why += "; " + r["address"].get<std::string>() + ": " + e;
      }
      throw config::ConfigError("--workers: no worker answered within " +
                                fmt::format("{:g}", options.connect_timeout_s) + " s" + why);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return c;
}

void Cluster::shutdown() {
  std::lock_guard<std::mutex> lock(impl_->m);
  if (impl_->stopped) return;
  impl_->stopped = true;
  {
    caf::scoped_actor self{*impl_->system};
    self->send_exit(impl_->router, caf::exit_reason::user_shutdown);
    self->wait_for(impl_->router);
  }
  impl_->router = nullptr;
  impl_->system.reset();
  impl_->cfg.reset();
}

std::uint64_t Cluster::submit(GenerationRequest request, std::function<void(const TokenEvent&)> on_token) {
  prepare(request);
  auto sub = std::make_shared<FrontSubmission>();
  sub->request = std::move(request);
  sub->on_token = std::move(on_token);
  const std::uint64_t id = impl_->next_id++;
  std::lock_guard<std::mutex> lock(impl_->m);
  if (impl_->stopped) throw std::runtime_error("the front has stopped");
  caf::anon_send(impl_->router, submit_atom::value, id, std::move(sub));
  return id;
}

void Cluster::cancel(std::uint64_t id) {
  std::lock_guard<std::mutex> lock(impl_->m);
  if (!impl_->stopped) caf::anon_send(impl_->router, cancel_atom::value, id);
}

EngineMetrics Cluster::metrics() {
  EngineMetrics total;
  const auto up = impl_->query().first;
  caf::scoped_actor self{*impl_->system};
  for (const auto& h : up)
    self->request(h, std::chrono::seconds(10), metrics_atom::value)
        .receive([&](EngineMetrics& m) { add_metrics(total, m); },
                 [&](caf::error& e) { total.target_error = "a worker's metrics: " + impl_->system->render(e); });
  total.mean_accepted_length = total.decode_steps ? static_cast<double>(total.decode_steps + total.accepted) /
                                                        static_cast<double>(total.decode_steps)
                                                  : 0.0;
  total.acceptance_rate =
      total.drafted ? static_cast<double>(total.accepted) / static_cast<double>(total.drafted) : 0.0;
  return total;
}

std::int64_t Cluster::flush_cache() {
  std::int64_t n = 0;
  const auto up = impl_->query().first;
  caf::scoped_actor self{*impl_->system};
  for (const auto& h : up)
    self->request(h, std::chrono::seconds(60), flush_atom::value)
        .receive(
            [&](std::int64_t x) { n += x; },
            [&](caf::error& e) {
              throw std::runtime_error("a worker's prefix cache could not be flushed: " + impl_->system->render(e));
            });
  return n;
}

SnapshotReport Cluster::snapshots() {
  const auto up = impl_->query().first;
  ReplicaInfo info = impl_->first;
  if (!up.empty()) {
    caf::scoped_actor self{*impl_->system};
    self->request(up.front(), std::chrono::seconds(30), hello_atom::value)
        .receive([&](ReplicaInfo& x) { info = std::move(x); }, [&](caf::error&) {});
  }
  // Pointer identity does not cross the wire: the replica said whether its workers hold the very
  // objects its scheduler resolved and derived.
  SnapshotReport r = info.snapshots;
  if (info.target_holds_resolved) r.target_worker = r.resolved_target;
  if (info.draft_holds_derived) r.draft_worker = r.derived_draft;
  return r;
}

const config::Snapshot& Cluster::target_snapshot() const { return impl_->first.target; }
const std::string& Cluster::target_hash_before_draft() const { return impl_->first.target_hash; }
const model::ModelInfo& Cluster::model_info() const { return impl_->info; }
std::shared_ptr<const model::Tokenizer> Cluster::tokenizer() const { return impl_->tokenizer; }
const model::ChatTemplate& Cluster::chat_template() const { return impl_->chat; }
std::int64_t Cluster::max_running_requests() const {
  return impl_->first.max_running * static_cast<std::int64_t>(impl_->opt.workers.size());
}
nlohmann::json Cluster::replicas() { return impl_->query().second; }

}  // namespace specactor::actors
