// tests/test_actors.cpp — snapshots as actor messages (CAF 0.17.6): a local send hands the receiver
// the very same immutable object; a serializing send (remote) rebuilds an equal snapshot.
#include <doctest/doctest.h>

#include <caf/all.hpp>

#include "actors/system.hpp"
#include "actors/wire.hpp"
#include "config/resolve.hpp"

using namespace specactor;
using config::Snapshot;

namespace {

Snapshot sample_snapshot() {
  const config::ModelFacts facts{"llama", 4096, 49152, 576, 30, true, 0, 0, 0, {}, {}, {}};
  auto user = config::freeze(
      config::parse_server_args({"--model-path", "t.gguf", "--speculative-algorithm", "NGRAM", "--tp-size", "1"}));
  return config::resolve_target(user, facts, {false, "test"});
}

// Replies with the address and hash of the snapshot it received.
caf::behavior snapshot_echo(caf::event_based_actor*) {
  return {[](const Snapshot& s) {
    return caf::make_message(reinterpret_cast<std::uintptr_t>(s.get()), config::content_hash(*s));
  }};
}

}  // namespace

TEST_CASE("scheduler threads are bounded on small machines") {
  CHECK(actors::scheduler_threads(2) == 1);
  CHECK(actors::scheduler_threads(8) == 4);
  CHECK(actors::scheduler_threads(64) == 4);
  CHECK(actors::scheduler_threads(0) == 1);
}

TEST_CASE("a snapshot sent to a local actor is the same object (zero copy)") {
  caf::actor_system_config cfg;
  actors::configure_actor_system(cfg);
  caf::actor_system sys{cfg};
  const Snapshot snap = sample_snapshot();
  auto echo = sys.spawn(snapshot_echo);
  caf::scoped_actor self{sys};
  bool answered = false;
  self->request(echo, std::chrono::seconds(10), snap)
      .receive(
          [&](std::uintptr_t address, std::uint64_t hash) {
            answered = true;
            CHECK(address == reinterpret_cast<std::uintptr_t>(snap.get()));
            CHECK(hash == config::content_hash(*snap));
          },
          [&](const caf::error& err) { FAIL("request failed: " << sys.render(err)); });
  CHECK(answered);
  self->send_exit(echo, caf::exit_reason::user_shutdown);
}

TEST_CASE("a request's penalties and biases cross a process boundary: the request and the step item") {
  caf::actor_system_config cfg;
  actors::configure_actor_system(cfg);
  caf::actor_system sys{cfg};
  sched::GenerationRequest r;
  r.prompt = "hi";
  r.rules.presence_penalty = 0.5f;
  r.rules.frequency_penalty = -0.25f;
  r.rules.repetition_penalty = 1.2f;
  r.rules.bias_ids = {3, 99};
  r.rules.bias_values = {-100.0f, 2.0f};
  r.rules.min_tokens = 7;
  r.rules.end_ids = {2};
  model::StepItem item;
  item.rules = r.rules;
  item.history = {5, 6, 7};
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  REQUIRE_FALSE(sink(r, item));
  sched::GenerationRequest back;
  model::StepItem item_back;
  caf::binary_deserializer source{sys, buf};
  REQUIRE_FALSE(source(back, item_back));
  for (const kernels::LogitRules* got : {&back.rules, &item_back.rules}) {
    CHECK(got->presence_penalty == 0.5f);
    CHECK(got->frequency_penalty == -0.25f);
    CHECK(got->repetition_penalty == 1.2f);
    CHECK(got->bias_ids == r.rules.bias_ids);
    CHECK(got->bias_values == r.rules.bias_values);
    CHECK(got->min_tokens == 7);
    CHECK(got->end_ids == r.rules.end_ids);
  }
  CHECK(item_back.history == item.history);
  CHECK(back.prompt == "hi");
}

TEST_CASE("a snapshot serializes and deserializes to an equal snapshot with its log") {
  caf::actor_system_config cfg;
  actors::configure_actor_system(cfg);
  caf::actor_system sys{cfg};
  const Snapshot snap = sample_snapshot();
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  REQUIRE_FALSE(sink(snap));
  CHECK(buf.size() > 100);

  Snapshot back;
  caf::binary_deserializer source{sys, buf};
  REQUIRE_FALSE(source(back));
  REQUIRE(back);
  CHECK(back.get() != snap.get());
  CHECK(config::same_settings(*back, *snap));
  CHECK(config::content_hash(*back) == config::content_hash(*snap));
  CHECK(config::override_log_json(*back) == config::override_log_json(*snap));
  CHECK(caf::deep_to_string(snap).find("override_log") != std::string::npos);  // logs show the JSON
}
