// tests/test_target_step.cpp — model::TargetStep without an actor system: a plain greedy run, a
// verified chain and a verified tree against it (accepted tokens, the bonus, the KV compaction to
// the accepted path), captured hidden rows, refused batches that leave the step usable, a full KV
// pool, and two tensor-parallel ranks on the CPU communicator giving one rank's tokens with the
// same KV lengths on both ranks.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <thread>

#include "kernels/comm.hpp"
#include "model/gguf.hpp"
#include "model/safetensors.hpp"
#include "model/target_step.hpp"
#include "tests/support/gguf_writer.hpp"

using namespace specactor;
using model::StepBatch;
using model::StepItem;
using model::StepResult;
using model::TargetStep;

namespace {

struct Tiny {
  model::LlamaConfig cfg;
  std::shared_ptr<const model::TensorSource> source;
};

Tiny tiny_model(const testing::TinyLlamaShape& shape, const std::string& tag) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("specactor_step_" + tag + "." + std::to_string(::getpid()) + ".gguf"))
          .string();
  testing::tiny_llama(shape, true, 11).write(path);
  auto file = model::GgufFile::open(path);
  std::filesystem::remove(path);  // the mapping stays valid
  return {model::LlamaConfig::from(model::read_model_info(*file), ""), std::make_shared<model::GgufSource>(file)};
}

std::unique_ptr<TargetStep> make_step(const Tiny& m, std::int64_t max_tokens = 256, model::TpShard shard = {},
                                      std::shared_ptr<kernels::Communicator> comm = nullptr) {
  auto w = model::LlamaWeights::load(m.source, model::LlamaWeights::Naming::Gguf, m.cfg, config::LoadFormat::Auto, -1,
                                     {}, shard);
  auto kv = std::make_shared<model::KvCache>(m.cfg.n_layers, w->local_kv_heads(), m.cfg.head_dim, 16, max_tokens);
  auto runner = std::make_unique<model::LlamaRunner>(w, 1);
  return std::make_unique<TargetStep>(std::move(kv), std::move(runner), std::move(comm));
}

StepItem prefill(std::uint64_t req, std::vector<std::int32_t> prompt) {
  StepItem it;
  it.req = req;
  it.tokens = std::move(prompt);
  it.prefill = true;
  it.sample = true;
  return it;
}

StepItem decode(std::uint64_t req, std::vector<std::int32_t> tokens, std::vector<std::int32_t> parents = {}) {
  StepItem it;
  it.req = req;
  it.tokens = std::move(tokens);
  it.parents = std::move(parents);
  it.sample = true;
  return it;
}

StepResult one(TargetStep& step, StepItem it) {
  StepBatch b;
  b.items.push_back(std::move(it));
  return step.run(b);
}

const std::vector<std::int32_t> kPrompt = {5, 17, 33, 2, 41, 40, 9, 12};

// One decode step of a single token that also returns the last layer's output for it.
StepResult decode_seen(TargetStep& step, std::uint64_t req, std::int32_t token) {
  StepBatch b;
  b.capture = {1};
  b.items.push_back(decode(req, {token}));
  b.items[0].want_hidden = true;
  return step.run(b);
}

// Plain greedy decoding, one token per step: the reference the verified steps must reproduce.
// `seen[i]`: the last layer's output for the row of out[i] (i >= 1), which reads every earlier KV row.
std::vector<std::int32_t> plain(TargetStep& step, std::uint64_t req, int n,
                                std::vector<std::vector<float>>* seen = nullptr) {
  std::vector<std::int32_t> out = {one(step, prefill(req, kPrompt)).items[0].tokens.at(0)};
  if (seen) seen->assign(1, {});
  while (static_cast<int>(out.size()) < n) {
    const StepResult r = decode_seen(step, req, out.back());
    if (seen) seen->push_back(r.items[0].hidden);
    out.push_back(r.items[0].tokens.at(0));
  }
  return out;
}

// A token that is not `t` (a draft the target must reject).
std::int32_t other_than(std::int32_t t) { return t == 3 ? 4 : 3; }

}  // namespace

TEST_CASE("target step, one rank: a verified chain and a verified tree reproduce plain greedy decoding") {
  const Tiny m = tiny_model({}, "one");
  auto step = make_step(m);
  std::vector<std::vector<float>> seen;                           // seen[i]: the row of g[i - 1] read back from KV
  const std::vector<std::int32_t> g = plain(*step, 1, 6, &seen);  // g[0] after the prompt, then g[1] ...
  const auto P = static_cast<std::int64_t>(kPrompt.size());
  CHECK(step->length(1) == P + 5);

  SUBCASE("chain: two drafts right, the third wrong") {
    CHECK(one(*step, prefill(2, kPrompt)).items[0].tokens == std::vector<std::int32_t>{g[0]});
    const StepResult r = one(*step, decode(2, {g[0], g[1], g[2], other_than(g[3])}));
    CHECK(r.items[0].drafted == 3);
    CHECK(r.items[0].accepted == 2);
    CHECK(r.items[0].tokens == std::vector<std::int32_t>{g[1], g[2], g[3]});
    CHECK(step->length(2) == P + 3);  // root + two accepted drafts stay; the rejected row is freed
    const StepResult next = decode_seen(*step, 2, g[3]);
    CHECK(next.items[0].tokens == std::vector<std::int32_t>{g[4]});
    CHECK(next.items[0].hidden == seen[4]);  // bit for bit: the kept rows are plain decoding's rows
  }
  SUBCASE("tree: the accepted branch is not the first one, so its rows move forward") {
    one(*step, prefill(3, kPrompt));
    // Nodes: 0 root g0; 1 wrong (child of root); 2 g1 (child of root); 3 g2 (child of 2); 4 wrong (child of 3).
    const StepResult r = one(*step, decode(3, {g[0], other_than(g[1]), g[1], g[2], other_than(g[3])}, {-1, -1, 1, 2}));
    CHECK(r.items[0].accepted == 2);
    CHECK(r.items[0].tokens == std::vector<std::int32_t>{g[1], g[2], g[3]});
    CHECK(step->length(3) == P + 3);
    // The next steps read the compacted rows, bit for bit plain decoding's (a rejected node's row left
    // in place of an accepted one changes them).
    const StepResult next = decode_seen(*step, 3, g[3]);
    CHECK(next.items[0].tokens == std::vector<std::int32_t>{g[4]});
    CHECK(next.items[0].hidden == seen[4]);
    CHECK(decode_seen(*step, 3, g[4]).items[0].hidden == seen[5]);
  }
  step->release(1);
  CHECK(step->length(1) == -1);
}

TEST_CASE("target step: captured layers come back for the committed rows only") {
  const Tiny m = tiny_model({}, "hidden");
  auto step = make_step(m);
  const std::vector<std::int32_t> g = plain(*step, 1, 3);
  StepBatch b;
  b.capture = {0, 1};
  b.items.push_back(prefill(2, kPrompt));
  b.items[0].want_hidden = true;
  const auto H = static_cast<std::size_t>(m.cfg.hidden);
  CHECK(step->run(b).items[0].hidden.size() == kPrompt.size() * 2 * H);
  b.items[0] = decode(2, {g[0], g[1], other_than(g[2])});
  b.items[0].want_hidden = true;
  const StepResult r = step->run(b);
  CHECK(r.items[0].accepted == 1);
  CHECK(r.items[0].hidden.size() == 2 * 2 * H);  // the root and one accepted draft, two layers each
}

TEST_CASE("target step: a refused batch or a full KV pool fails the step and leaves the step usable") {
  const Tiny m = tiny_model({}, "refused");
  auto step = make_step(m, 32);
  one(*step, prefill(1, kPrompt));
  const std::int64_t len = step->length(1);
  CHECK_THROWS_WITH_AS(one(*step, decode(1, std::vector<std::int32_t>(65, 3))),
                       "target worker: more than 64 tree tokens", model::StepFailed);
  StepBatch bad_layer;
  bad_layer.capture = {7};
  bad_layer.items.push_back(decode(1, {3}));
  bad_layer.items[0].want_hidden = true;
  CHECK_THROWS_WITH_AS(step->run(bad_layer), "target worker: cannot capture layer 7 of 2", model::StepFailed);
  CHECK_THROWS_AS(one(*step, prefill(2, std::vector<std::int32_t>(40, 7))), model::StepFailed);  // 48 > 32 tokens
  CHECK(step->length(1) == len);  // nothing ran for the refused steps
  CHECK(one(*step, decode(1, {3})).items[0].tokens.size() == 1);
  CHECK(step->length(1) == len + 1);
}

TEST_CASE("target step, two ranks: the follower applies rank 0's decisions, tokens equal one rank's") {
  testing::TinyLlamaShape shape = testing::tp_divisible_shape();
  const Tiny m = tiny_model(shape, "tp");
  auto single = make_step(m);
  std::vector<std::vector<float>> seen;
  const std::vector<std::int32_t> g = plain(*single, 1, 5, &seen);

  auto group = kernels::make_cpu_group(2);
  std::shared_ptr<kernels::Communicator> c0 = std::move(group[0]), c1 = std::move(group[1]);
  auto leader = make_step(m, 256, {0, 2}, c0);
  auto follower = make_step(m, 256, {1, 2}, c1);
  auto run = [&](StepItem it) {
    StepBatch b;
    b.items.push_back(std::move(it));
    std::thread other;
    const StepResult r = leader->run(b, [&] { other = std::thread([&] { follower->follow(b); }); });
    other.join();
    return r;
  };
  CHECK(run(prefill(1, kPrompt)).items[0].tokens == std::vector<std::int32_t>{g[0]});
  const StepResult r = run(decode(1, {g[0], other_than(g[1]), g[1], g[2]}, {-1, -1, 1}));
  CHECK(r.items[0].tokens == std::vector<std::int32_t>{g[1], g[2], g[3]});
  CHECK(leader->length(1) == follower->length(1));
  StepItem next = decode(1, {g[3]});
  next.want_hidden = true;
  const StepResult after = [&] {
    StepBatch b;
    b.capture = {1};
    b.items.push_back(next);
    std::thread other;
    const StepResult res = leader->run(b, [&] { other = std::thread([&] { follower->follow(b); }); });
    other.join();
    return res;
  }();
  CHECK(after.items[0].tokens == std::vector<std::int32_t>{g[4]});
  // The row reads every rank's compacted KV heads; TP sums in another order, so within rounding.
  REQUIRE(after.items[0].hidden.size() == seen[4].size());
  float worst = 0.0f;
  for (std::size_t i = 0; i < seen[4].size(); ++i)
    worst = std::max(worst, std::abs(after.items[0].hidden[i] - seen[4][i]) / (1.0f + std::abs(seen[4][i])));
  CHECK(worst < 1e-4f);
  CHECK(follower->length(1) == static_cast<std::int64_t>(kPrompt.size()) + 4);
  leader->release(1);
  follower->release(1);
  CHECK(follower->sequences() == 0);
}

TEST_CASE("target step: captured rows kept with cached pages come back after a hit, bit for bit") {
  const Tiny m = tiny_model({}, "rows");
  auto step = make_step(m, 512);
  const auto H = static_cast<std::size_t>(m.cfg.hidden);
  const std::size_t W = 2 * H;  // layers 0 and 1
  std::vector<std::int32_t> prompt;
  for (int k = 0; k < 40; ++k) prompt.push_back(static_cast<std::int32_t>((k * 7) % 50 + 2));
  auto run = [&](StepItem it, std::vector<std::int32_t> capture = {0, 1}) {
    StepBatch b;
    b.capture = std::move(capture);
    b.items.push_back(std::move(it));
    return step->run(b);
  };
  // Reference: request 1 decodes plainly, one token per step, returning every row.
  StepItem p1 = prefill(1, prompt);
  p1.want_hidden = true;
  StepResult r = run(p1);
  std::vector<float> rows = r.items[0].hidden;
  std::vector<std::int32_t> g = {r.items[0].tokens.at(0)};
  while (g.size() < 30) {
    StepItem d = decode(1, {g.back()});
    d.want_hidden = true;
    r = run(d);
    rows.insert(rows.end(), r.items[0].hidden.begin(), r.items[0].hidden.end());
    g.push_back(r.items[0].tokens.at(0));
  }
  // Request 2 keeps its rows (returning none) while verified trees are accepted along a branch that
  // is not the first: the kept rows are the compacted, accepted ones.
  StepItem p2 = prefill(2, prompt);
  p2.keep_hidden = true;
  CHECK(run(p2).items[0].hidden.empty());
  std::size_t at = 0;  // g[at] is the root
  while (step->length(2) < 64) {
    StepItem d = decode(2, {g[at], other_than(g[at + 1]), g[at + 1], g[at + 2]}, {-1, -1, 1});
    d.keep_hidden = true;
    r = run(d);
    REQUIRE(r.items[0].accepted == 2);
    at += 3;
  }
  StepItem want_kv = decode(2, {g[at]});
  want_kv.want_kv = true;
  const std::vector<std::int32_t> table = run(want_kv).items[0].kv_pages;
  REQUIRE(table.size() >= 4);
  const std::vector<std::int32_t> cached(table.begin(), table.begin() + 4);  // 64 slots in pages of 16
  step->cache_ops(2, cached, {});
  step->release(2);

  // Request 3 starts on the cached pages and asks for rows: the prefix's rows first, then its own.
  StepItem hit = prefill(3, {g[24], g[25]});  // slots 40..63 hold g[0..23]
  REQUIRE(static_cast<std::int64_t>(prompt.size()) + 24 == 64);
  hit.prefix_pages = cached;
  hit.prefix_len = 64;
  hit.want_hidden = true;
  r = run(hit);
  CHECK(r.items[0].hidden_first == 0);
  REQUIRE(r.items[0].hidden.size() == 66 * W);
  CHECK(std::equal(r.items[0].hidden.begin(), r.items[0].hidden.end(), rows.begin()));
  CHECK(r.items[0].tokens == std::vector<std::int32_t>{g[26]});

  // A partly matched page: three whole pages, then slots 48..52 copied out of the fourth into a page
  // of the request's own; the rows and the next token are those of the cache-less run.
  StepItem part = prefill(7, {g[13], g[14]});  // slot 53 holds g[13]
  part.prefix_pages = {cached[0], cached[1], cached[2]};
  part.prefix_len = 48;
  part.copy_page = cached[3];
  part.copy_len = 5;
  part.want_hidden = true;
  r = run(part);
  CHECK(r.items[0].hidden_first == 0);
  REQUIRE(r.items[0].hidden.size() == 55 * W);
  CHECK(std::equal(r.items[0].hidden.begin(), r.items[0].hidden.end(), rows.begin()));
  CHECK(r.items[0].tokens == std::vector<std::int32_t>{g[15]});
  CHECK(step->length(7) == 55);
  StepItem bad = prefill(8, {g[13]});
  bad.copy_page = 9999;
  bad.copy_len = 5;
  CHECK_THROWS_AS(run(bad), model::StepFailed);
  CHECK(step->length(8) == -1);

  // Other layers than the kept ones: no prefix rows, the gap is said by hidden_first.
  StepItem other = hit;
  other.req = 4;
  r = run(other, {1});
  CHECK(r.items[0].hidden_first == 64);
  CHECK(r.items[0].hidden.size() == 2 * H);

  // Pages taken into the cache from a request that kept no rows give none.
  StepItem p5 = prefill(5, std::vector<std::int32_t>(prompt.begin(), prompt.begin() + 33));
  p5.want_kv = true;
  const std::vector<std::int32_t> t5 = run(p5).items[0].kv_pages;
  step->cache_ops(5, {t5[0], t5[1]}, {});
  StepItem miss = prefill(6, {prompt[32]});
  miss.prefix_pages = {t5[0], t5[1]};
  miss.prefix_len = 32;
  miss.want_hidden = true;
  r = run(miss);
  CHECK(r.items[0].hidden_first == 32);
  CHECK(r.items[0].hidden.size() == W);
  for (const std::int32_t p : cached) step->cache_ops(0, {}, {p});
  step->cache_ops(0, {}, {t5[0], t5[1]});
  for (std::uint64_t req : {1, 3, 4, 5, 6, 7}) step->release(req);
  CHECK(step->kv()->free_pages() == step->kv()->total_pages());
}

TEST_CASE("target step: the cost probe times every size in turns, within its pool share, and gives the pool back") {
  const Tiny m = tiny_model({}, "probe");
  // A pool of 1,024 tokens: half of it (512) holds the prompt, the warm step and three rounds of
  // 1 + 2 + … + 32 rows (66 + 3 · 63 = 255).
  auto step = make_step(m, 1024);
  const std::int64_t free_before = step->kv()->free_pages();
  std::vector<std::int64_t> seen;  // the rows of every timed batch, in order
  const auto probe = step->probe(static_cast<std::int32_t>(m.cfg.vocab_size), 1e9, [&](const StepBatch& b) {
    if (!b.items.empty() && !b.items[0].prefill) seen.push_back(static_cast<std::int64_t>(b.items[0].tokens.size()));
  });
  CHECK(step->probe_error().empty());
  REQUIRE(probe.size() == 6);
  for (std::size_t i = 0; i < probe.size(); ++i) {
    CHECK(probe[i].first == (std::int64_t{1} << i));
    CHECK(probe[i].second > 0);
  }
  // The warm step, then the sizes in turns: 1, 2, 4 … 32, three times over.
  const std::vector<std::int64_t> rounds = {2, 1, 2, 4, 8, 16, 32, 1, 2, 4, 8, 16, 32, 1, 2, 4, 8, 16, 32};
  CHECK(seen == rounds);
  CHECK(step->kv()->free_pages() == free_before);
  // A pool whose half holds the prompt and not much more: the small sizes only, measured in turns.
  auto small = make_step(m, 256);  // half: 128 tokens = 66 + 62 rows
  seen.clear();
  const auto few = small->probe(static_cast<std::int32_t>(m.cfg.vocab_size), 1e9, [&](const StepBatch& b) {
    if (!b.items.empty() && !b.items[0].prefill) seen.push_back(static_cast<std::int64_t>(b.items[0].tokens.size()));
  });
  REQUIRE(!few.empty());
  CHECK(few.size() < 6);
  CHECK(few.back().first < 32);
  CHECK(small->kv()->free_pages() == small->kv()->total_pages());
  // Nothing timed when the budget is already spent.
  CHECK(make_step(m, 1024)->probe(static_cast<std::int32_t>(m.cfg.vocab_size), 0.0).empty());
}
