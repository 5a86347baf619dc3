#include "actors/engine.hpp"

#include <atomic>
#include <caf/all.hpp>
#include <cmath>
#include <future>
#include <map>
#include <mutex>

#include "actors/engine_caf.hpp"
#include "actors/scheduler_actor.hpp"
#include "actors/system.hpp"
#include "actors/wire.hpp"
#include "config/error.hpp"
#include "config/input.hpp"
#include "config/resolve.hpp"
#include "drafters/drafter.hpp"
#include "kernels/backend.hpp"
#include "model/chat.hpp"
#include "model/loader.hpp"
#include "model/runner.hpp"

namespace specactor::actors {

struct Engine::Impl {
  std::unique_ptr<caf::actor_system_config> own_cfg;
  std::unique_ptr<caf::actor_system> own_system;
  caf::actor_system* system = nullptr;
  scheduler_actor scheduler;
  config::Snapshot target;
  std::string target_hash;  // before the scheduler derived the draft snapshot
  TargetInfo info;
  model::ChatTemplate chat;
  std::atomic<std::uint64_t> next_id{1};
  std::once_flag stopped;
  // One submission's callback: exactly one final event reaches it, from the scheduler or, when the
  // scheduler is gone before it answered, from the engine.
  struct Delivery {
    std::mutex m;
    bool done = false;
    std::function<void(const TokenEvent&)> on_token;
  };
  // Set when the scheduler terminates (shutdown or a bug): submit() then refuses at once instead of
  // sending to an actor that will never answer, and every submission still waiting for its final
  // event gets one (a submit sent the instant the scheduler stopped included).
  struct Down {
    std::mutex m;
    bool down = false;
    std::string reason;
    std::map<std::uint64_t, std::shared_ptr<Delivery>> live;
  };
  std::shared_ptr<Down> down = std::make_shared<Down>();
};

namespace {

// A drafter named by the settings must be registered here, unless it runs in a draft worker process
// (that process checks its own registry): refused before a model is read.
config::Snapshot resolve(const config::ServerArgs& user_args) {
  if (user_args.speculative_draft_worker.empty()) drafters::check_registered(user_args);
  return model::resolve_target(user_args).target;
}

std::unique_ptr<Engine::Impl> start(caf::actor_system& sys, config::Snapshot target) {
  auto impl = std::make_unique<Engine::Impl>();
  impl->system = &sys;
  impl->target = std::move(target);
  impl->target_hash = config::hash_hex(config::content_hash(*impl->target));
  impl->scheduler = spawn_scheduler(sys, impl->target);
  caf::actor_cast<caf::abstract_actor*>(impl->scheduler)->attach_functor([down = impl->down](const caf::error& reason) {
    std::map<std::uint64_t, std::shared_ptr<Engine::Impl::Delivery>> live;
    std::string why;
    {
      std::lock_guard<std::mutex> lock(down->m);
      down->down = true;
      down->reason = why = reason ? error_message(reason) : "the engine shut down";
      live.swap(down->live);
    }
    for (auto& [id, d] : live) {
      std::lock_guard<std::mutex> lock(d->m);
      if (d->done) continue;
      d->done = true;
      try {
        d->on_token(TokenEvent::final_error(id, why));
      } catch (const std::exception&) {  // the host's callback; nothing more to tell it
      }
    }
  });
  caf::scoped_actor self{sys};
  caf::error failure;
  self->request(impl->scheduler, caf::infinite, ready_atom::value)
      .receive([&](TargetInfo& info) { impl->info = std::move(info); },
               [&](caf::error& err) { failure = std::move(err); });
  if (failure) {
    self->send_exit(impl->scheduler, caf::exit_reason::user_shutdown);
    if (is_user_error(failure)) throw config::ConfigError(error_message(failure));
    throw std::runtime_error("the engine did not start: " + error_message(failure));
  }
  if (impl->info.tokenizer)
    impl->chat = model::ChatTemplate::choose(impl->target->chat_template, impl->info.tokenizer->chat_template());
  return impl;
}

}  // namespace

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::unique_ptr<Engine> Engine::create(const config::ServerArgs& user_args) {
  config::Snapshot target = resolve(user_args);
  auto cfg = std::make_unique<caf::actor_system_config>();
  configure_actor_system(*cfg);
  // A draft worker in another process: the network layer and the message types that cross it.
  if (!target->speculative_draft_worker.empty()) {
    (void)parse_workers(target->speculative_draft_worker, "--speculative-draft-worker");
    const TlsFiles tls{target->speculative_draft_worker_tls_certificate.value_or(""),
                       target->speculative_draft_worker_tls_key.value_or(""),
                       target->speculative_draft_worker_tls_ca.value_or("")};
    check_tls(tls, "--speculative-draft-worker-tls-");
    if (!tls.on())  // a missing or shared secret file stops the start, naming the flag
      (void)client_secret(target->speculative_draft_worker_secret_file.value_or(""),
                          "--speculative-draft-worker-secret-file");
    configure_network(*cfg, tls);
  }
  auto sys = std::make_unique<caf::actor_system>(*cfg);
  std::unique_ptr<Impl> impl;
  try {
    impl = start(*sys, std::move(target));
  } catch (...) {
    sys.reset();
    throw;
  }
  impl->own_cfg = std::move(cfg);
  impl->own_system = std::move(sys);
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

std::unique_ptr<Engine> Engine::from_argv(const std::vector<std::string>& argv) {
  return create(config::parse_server_args(argv));
}

std::unique_ptr<Engine> create_engine_in(caf::actor_system& system, const config::ServerArgs& user_args) {
  return std::unique_ptr<Engine>(new Engine(start(system, resolve(user_args))));
}

Engine::~Engine() { shutdown(); }

void Engine::shutdown() {
  std::call_once(impl_->stopped, [this] {
    {
      caf::scoped_actor self{*impl_->system};
      self->send_exit(impl_->scheduler, caf::exit_reason::user_shutdown);
      self->wait_for(impl_->scheduler);
    }
    {
      std::lock_guard<std::mutex> lock(impl_->down->m);  // submit() reads the handle under this lock
      impl_->scheduler = nullptr;
      if (!impl_->down->down) {
        impl_->down->down = true;
        impl_->down->reason = "the engine shut down";
      }
    }
    impl_->own_system.reset();  // waits for every actor of an owned system
    impl_->own_cfg.reset();
  });
}

std::vector<std::int32_t> EngineApi::tokenize(const GenerationRequest& r) const {
  if (!r.prompt_ids.empty()) return r.prompt_ids;
  const auto tok = tokenizer();
  if (!tok) throw config::ConfigError("this engine has no tokenizer (--skip-tokenizer-init): pass prompt_ids");
  // Each field is checked on its own, so the message names it and the byte offset is the field's.
  for (const auto& [name, text] : {std::pair{"prompt", &r.prompt}, std::pair{"system", &r.system}}) {
    try {
      model::check_utf8(*text);
    } catch (const config::ConfigError& e) {
      throw config::ConfigError(std::string(name) + ": " + e.what());
    }
  }
  if (r.chat) {
    if (const std::string why = chat_template().unusable_reason(); !why.empty()) throw config::ConfigError(why);
  }
  if (r.chat && !r.messages.empty()) {  // a whole conversation
    for (std::size_t i = 0; i < r.messages.size(); ++i) {
      const auto& role = r.messages[i].role;
      if (role != "system" && role != "user" && role != "assistant")
        throw config::ConfigError("messages[" + std::to_string(i) + "].role: '" + config::printable(role) +
                                  "' (expected system, user or assistant)");
      try {
        model::check_utf8(r.messages[i].content);
      } catch (const config::ConfigError& e) {
        throw config::ConfigError("messages[" + std::to_string(i) + "].content: " + e.what());
      }
    }
    return tok->encode_parts(chat_template().render_parts(r.messages), true);
  }
  if (r.chat) {
    std::vector<model::ChatMessage> msgs;
    if (!r.system.empty()) msgs.push_back({"system", r.system});
    msgs.push_back({"user", r.prompt});
    return tok->encode_parts(chat_template().render_parts(msgs), true);
  }
  return tok->encode(r.prompt, true, false);
}

void EngineApi::prepare(GenerationRequest& r, const std::function<std::string(const std::string&)>& name) const {
  if (r.prompt_ids.empty()) r.prompt_ids = tokenize(r);
  sched::check_request(
      r, {target_snapshot()->context_length ? *target_snapshot()->context_length : 0, model_info().vocab_size}, name);
}

std::uint64_t Engine::submit(GenerationRequest request, std::function<void(const TokenEvent&)> on_token) {
  prepare(request);  // the scheduler checks what needs its state (context, KV budget)
  auto sub = std::make_shared<Submission>();
  sub->id = impl_->next_id++;
  sub->prompt = request.prompt_ids;
  sub->request = std::move(request);
  const std::uint64_t id = sub->id;
  auto delivery = std::make_shared<Impl::Delivery>();
  delivery->on_token = std::move(on_token);
  sub->on_token = [delivery, down = impl_->down, id](const TokenEvent& ev) {
    std::lock_guard<std::mutex> lock(delivery->m);
    if (delivery->done) return;  // the engine already ended it (the scheduler stopped)
    if (ev.finished) {
      delivery->done = true;
      std::lock_guard<std::mutex> lock_down(down->m);
      down->live.erase(id);
    }
    delivery->on_token(ev);
  };
  // Registered and sent under the lock the scheduler's termination takes: either the scheduler is
  // known to be gone (refused here) or its termination will find this submission.
  std::lock_guard<std::mutex> lock(impl_->down->m);
  if (impl_->down->down || !impl_->scheduler)
    throw std::runtime_error("the engine has stopped: " + impl_->down->reason);
  impl_->down->live.emplace(id, delivery);
  caf::anon_send(impl_->scheduler, submit_atom::value, std::shared_ptr<const Submission>(std::move(sub)));
  return id;
}

GenerationResult EngineApi::generate(GenerationRequest request) {
  auto result = std::make_shared<GenerationResult>();
  auto done = std::make_shared<std::promise<void>>();
  auto future = done->get_future();
  prepare(request);  // tokenized once: submit keeps these ids
  result->prompt_ids = request.prompt_ids;
  result->id = submit(std::move(request), [result, done](const TokenEvent& ev) {
    result->tokens.insert(result->tokens.end(), ev.tokens.begin(), ev.tokens.end());
    result->logprobs.insert(result->logprobs.end(), ev.logprobs.begin(), ev.logprobs.end());
    result->text += ev.text;
    if (ev.finished) {
      result->finish_reason = ev.finish_reason;
      result->error = ev.error;
      result->invalid_request = ev.invalid_request;
      result->metrics = ev.metrics;
      done->set_value();
    }
  });
  future.wait();
  return std::move(*result);
}

void Engine::cancel(std::uint64_t id) { caf::anon_send(impl_->scheduler, cancel_atom::value, id); }

EngineMetrics Engine::metrics() {
  caf::scoped_actor self{*impl_->system};
  EngineMetrics m;
  self->request(impl_->scheduler, std::chrono::seconds(60), metrics_atom::value)
      .receive([&](EngineMetrics& x) { m = std::move(x); },
               [&](caf::error& err) { m.target_error = "metrics unavailable: " + impl_->system->render(err); });
  return m;
}

std::int64_t Engine::flush_cache() {
  caf::scoped_actor self{*impl_->system};
  std::int64_t n = 0;
  self->request(impl_->scheduler, std::chrono::seconds(60), flush_atom::value)
      .receive([&](std::int64_t x) { n = x; },
               [&](caf::error& err) {
                 throw std::runtime_error("the prefix cache could not be flushed: " + impl_->system->render(err));
               });
  return n;
}

SnapshotReport Engine::snapshots() {
  caf::scoped_actor self{*impl_->system};
  SnapshotReport r;
  std::string error;
  self->request(impl_->scheduler, std::chrono::seconds(60), snapshot_atom::value)
      .receive([&](SnapshotReport& x) { r = std::move(x); },
               [&](caf::error& err) { error = impl_->system->render(err); });
  if (!error.empty()) throw std::runtime_error("snapshot query failed: " + error);
  return r;
}

void Engine::reconfigure_draft(const nlohmann::json& fields) {
  const SnapshotReport r = snapshots();
  if (!r.derived_draft) throw config::ConfigError("reconfigure_draft: this engine has no speculative algorithm");
  // A named, counted derive( call site outside config/ (see tests/data/derive_call_sites.txt).
  const config::Snapshot next = config::derive(r.derived_draft, "runtime.reconfigure_draft", fields);
  caf::anon_send(impl_->scheduler, reconf_atom::value, next);
}

void Engine::restart_draft() { caf::anon_send(impl_->scheduler, restart_atom::value); }

const config::Snapshot& Engine::target_snapshot() const { return impl_->target; }
const model::ModelInfo& Engine::model_info() const { return impl_->info.info; }
std::shared_ptr<const model::Tokenizer> Engine::tokenizer() const { return impl_->info.tokenizer; }
const model::ChatTemplate& Engine::chat_template() const { return impl_->chat; }

const std::string& Engine::target_hash_before_draft() const { return impl_->target_hash; }

}  // namespace specactor::actors
