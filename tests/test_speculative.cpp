// tests/test_speculative.cpp — speculative decoding end to end: for every drafter that needs no
// trained head (NGRAM chain and tree, STANDALONE with a separate draft model, self-speculative
// first-K-layers), greedy speculative output equals plain greedy output token for token on the
// shipped prompts (cli/bench_prompts.jsonl), one request at a time and 8 concurrently.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "actors/engine.hpp"
#include "config/snapshot.hpp"
#include "drafters/drafter.hpp"
#include "grammar/matcher.hpp"
#include "kernels/cpu/sampling.hpp"
#include "model/block_drafter.hpp"
#include "model/gguf.hpp"
#include "model/head_model.hpp"
#include "model/head_writer.hpp"
#include "model/llama.hpp"
#include "model/loader.hpp"
#include "model/model_info.hpp"
#include "model/runner.hpp"
#include "tests/support/draft_tree.hpp"
#include "tests/support/gguf_writer.hpp"
#include "tests/support/skip.hpp"

using namespace specactor::actors;
using namespace specactor::drafters;
namespace fs = std::filesystem;

namespace {

const std::string kDefaultModel = SPECACTOR_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf";

std::vector<std::string> shipped_prompts() {
  std::ifstream in(SPECACTOR_SOURCE_DIR "/cli/bench_prompts.jsonl");
  REQUIRE(in);
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line)["prompt"].get<std::string>());
  return out;
}

std::vector<std::vector<std::int32_t>> run(Engine& e, const std::vector<GenerationRequest>& reqs, bool concurrent) {
  std::vector<std::vector<std::int32_t>> out(reqs.size());
  if (!concurrent) {
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      const auto r = e.generate(reqs[i]);
      REQUIRE_MESSAGE(r.error.empty(), r.error);
      out[i] = r.tokens;
    }
    return out;
  }
  std::vector<std::promise<void>> done(reqs.size());
  for (std::size_t i = 0; i < reqs.size(); ++i)
    e.submit(reqs[i], [&out, &done, i](const TokenEvent& ev) {
      out[i].insert(out[i].end(), ev.tokens.begin(), ev.tokens.end());
      if (ev.finished) done[i].set_value();
    });
  for (auto& d : done) REQUIRE(d.get_future().wait_for(std::chrono::minutes(5)) == std::future_status::ready);
  return out;
}

// Greedy speculative decoding equals plain greedy decoding, request by request, alone and 8 at a
// time — in each CPU precision and KV cache type (plain and speculative compared within the same
// arithmetic): fast with its default float16 cache, exact with its float32 one, fast with bfloat16.
void check_lossless(const std::vector<std::string>& base_args, const std::vector<GenerationRequest>& reqs,
                    const std::vector<std::vector<std::string>>& configs) {
  const std::vector<std::vector<std::string>> arms = {{"--cpu-precision", "fast"},
                                                      {"--cpu-precision", "exact"},
                                                      {"--cpu-precision", "fast", "--kv-cache-dtype", "bfloat16"}};
  for (const auto& arm : arms) {
    std::string precision;
    for (const auto& a : arm) precision += a + " ";
    CAPTURE(precision);
    std::vector<std::string> base = base_args;
    base.insert(base.end(), arm.begin(), arm.end());
    auto plain = Engine::from_argv(base);
    const auto want = run(*plain, reqs, false);
    const std::vector<GenerationRequest> first8(
        reqs.begin(), reqs.begin() + static_cast<long>(std::min<std::size_t>(8, reqs.size())));
    const auto want8 = run(*plain, first8, true);
    for (std::size_t i = 0; i < first8.size(); ++i) CHECK(want8[i] == want[i]);  // batching changes nothing
    std::map<std::size_t, specactor::actors::GenerationResult> want_lp;          // plain's log probabilities
    for (std::size_t i = 0; i < reqs.size(); ++i)
      if (reqs[i].logprobs >= 0) want_lp[i] = plain->generate(reqs[i]);
    {  // the requests with penalties and biases: these must change the output, or comparing proves little
      std::vector<GenerationRequest> bare;
      std::vector<std::size_t> ruled;
      for (std::size_t i = 0; i < reqs.size(); ++i)
        if (reqs[i].rules.active()) {
          bare.push_back(reqs[i]);
          bare.back().rules = {};
          ruled.push_back(i);
        }
      const auto without = run(*plain, bare, false);
      std::size_t changed = 0;
      for (std::size_t k = 0; k < ruled.size(); ++k) changed += without[k] != want[ruled[k]];
      if (!ruled.empty()) CHECK(changed > 0);
    }
    for (std::size_t i = 0; i < reqs.size(); ++i) {  // constrained requests: held to their grammar, and changed
      if (!reqs[i].constraint.active()) continue;
      const auto got = plain->generate(reqs[i]);
      specactor::grammar::Matcher m(specactor::sched::compile_constraint(reqs[i].constraint));
      CHECK_MESSAGE(m.feed(got.text), got.text);
      if (got.finish_reason == "stop") CHECK_MESSAGE(m.accepting(), got.text);
      GenerationRequest bare = reqs[i];
      bare.constraint = {};
      CHECK(plain->generate(bare).tokens != got.tokens);
    }
    plain->shutdown();
    for (const auto& cfg : configs) {
      std::vector<std::string> args = base;
      args.insert(args.end(), cfg.begin(), cfg.end());
      std::string label;
      for (const auto& a : cfg) label += a + " ";
      CAPTURE(label);
      auto spec = Engine::from_argv(args);
      const auto single = run(*spec, reqs, false);
      const auto together = run(*spec, first8, true);
      for (std::size_t i = 0; i < reqs.size(); ++i) CHECK(single[i] == want[i]);
      for (const auto& r : reqs)  // log probabilities: the same numbers, bit for bit
        if (r.logprobs >= 0) {
          const auto got = spec->generate(r), ref = want_lp.at(static_cast<std::size_t>(&r - reqs.data()));
          REQUIRE(got.logprobs.size() == ref.logprobs.size());
          REQUIRE(got.logprobs.size() == got.tokens.size());
          for (std::size_t k = 0; k < ref.logprobs.size(); ++k) {
            CHECK(got.logprobs[k].token == ref.logprobs[k].token);
            CHECK(std::memcmp(&got.logprobs[k].logprob, &ref.logprobs[k].logprob, sizeof(float)) == 0);
            CHECK(got.logprobs[k].top_ids == ref.logprobs[k].top_ids);
            CHECK(got.logprobs[k].top_logprobs == ref.logprobs[k].top_logprobs);
            CHECK(static_cast<std::int32_t>(got.logprobs[k].top_ids.size()) == r.logprobs);
          }
        }
      for (std::size_t i = 0; i < first8.size(); ++i) CHECK(together[i] == want[i]);
      const EngineMetrics m = spec->metrics();
      CHECK(m.draft_alive);
      CHECK(m.draft_failures == 0);
      if (std::any_of(reqs.begin(), reqs.end(), [](const auto& r) { return r.constraint.active(); }))
        CHECK(m.grammar_drafts > 0);  // the grammars forced drafts (keys, brackets), verified like the drafter's
      MESSAGE(precision << ": " << label << ": τ " << m.mean_accepted_length << ", α " << m.acceptance_rate
                        << ", drafted " << m.drafted);
      spec->shutdown();
    }
  }
}

// The tiny random model these suites share (vocabulary 96, context 256), written to a temp file.
std::string write_tiny_model(const std::string& tag) {
  specactor::testing::TinyLlamaShape s;
  s.vocab = 96;
  s.context = 256;
  const std::string p =
      (fs::temp_directory_path() / ("specactor_" + tag + "." + std::to_string(::getpid()) + ".gguf")).string();
  specactor::testing::tiny_llama(s, true, 5).write(p);
  return p;
}

// Settings for the tiny model at `path` in a precision ("fast" or "exact"), 1,024 KV slots.
specactor::config::ServerArgs tiny_args(const std::string& path, const std::string& precision) {
  specactor::config::ServerArgs args;
  args.model_path = path;
  args.max_total_tokens = 1024;
  args.cpu_precision =
      precision == "fast" ? specactor::config::CpuPrecision::Fast : specactor::config::CpuPrecision::Exact;
  return args;
}

// Penalties and biases on the last three of eight requests (every lossless suite runs them): output
// penalties; a repetition penalty with a bias; min_tokens holding back a favoured end token. Also
// log probabilities and seeded sampling on others.
void add_rules(std::vector<GenerationRequest>& reqs) {
  REQUIRE(reqs.size() >= 8);
  reqs[5].rules.presence_penalty = 0.8f;
  reqs[5].rules.frequency_penalty = 0.6f;
  reqs[6].rules.repetition_penalty = 1.6f;
  reqs[6].rules.bias_ids = {3, 10, 40};
  reqs[6].rules.bias_values = {2.0f, -3.0f, 1.5f};
  reqs[4].logprobs = 3;  // and log probabilities, which must not move either
  // Seeded sampling (target-only verification draws each position's token with that position's coin):
  // the same tokens as plain sampling with the seed, whatever was drafted and the budget decided.
  reqs[3].sampling.temperature = 0.9f;
  reqs[3].sampling.top_p = 0.95f;
  reqs[3].seed = 42;
  reqs[6].sampling.temperature = 0.7f;
  reqs[6].sampling.top_k = 20;
  reqs[6].seed = 7;
  reqs[7].logprobs = 0;
  reqs[7].rules.min_tokens = 6;
  reqs[7].rules.bias_ids = {2};  // the tiny model's (and the default model's) end token
  reqs[7].rules.bias_values = {8.0f};
}

// Constrained output on the first four requests (the default model's suites: the tiny model's
// vocabulary cannot write JSON): a JSON Schema (with penalties, a bias and log probabilities), any
// JSON object, a required tool call, and a schema under seeded sampling.
void add_constraints(std::vector<GenerationRequest>& reqs) {
  REQUIRE(reqs.size() >= 8);
  using Kind = specactor::sched::OutputConstraint::Kind;
  const std::string schema =
      R"({"type":"object","properties":{"title":{"type":"string","maxLength":40},"year":{"type":"integer",)"
      R"("minimum":1900,"maximum":2100},"tags":{"type":"array","items":{"enum":["a","b","c"]}}},"required":["title"]})";
  reqs[0].constraint.kind = Kind::JsonSchema;
  reqs[0].constraint.schema = schema;
  reqs[0].logprobs = 2;  // with penalties and a bias in force too: the same numbers, speculative or not
  reqs[0].rules.presence_penalty = 0.5f;
  reqs[0].rules.bias_ids = {28};
  reqs[0].rules.bias_values = {1.5f};
  reqs[1].constraint.kind = Kind::JsonObject;
  reqs[2].constraint.kind = Kind::ToolCalls;
  reqs[2].constraint.tool_names = {"lookup", "add"};
  reqs[2].constraint.tool_parameters = {
      R"({"type":"object","properties":{"query":{"type":"string"}},"required":["query"]})",
      R"({"type":"object","properties":{"a":{"type":"number"},"b":{"type":"number"}},"required":["a","b"]})"};
  reqs[2].constraint.tools_required = true;
  reqs[3].constraint = reqs[0].constraint;  // seeded sampling (add_rules) under a schema
}

// Eight id prompts of growing length for the tiny model.
std::vector<GenerationRequest> tiny_requests(std::int64_t max_new) {
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 8; ++i) {
    GenerationRequest r;
    for (int k = 0; k < 6 + 5 * i; ++k) r.prompt_ids.push_back((k * 7 + i) % 90 + 3);
    r.max_new_tokens = max_new;
    r.ignore_eos = true;
    reqs.push_back(r);
  }
  add_rules(reqs);
  return reqs;
}

// Random heads of every kind for `model` (both formats), and the engine flags that use them.
struct Heads {
  std::string dir;
  std::vector<std::vector<std::string>> configs;
  ~Heads() { fs::remove_all(dir); }
};

std::unique_ptr<Heads> random_heads(const std::string& model, const std::string& tag) {
  auto h = std::make_unique<Heads>();
  h->dir = (fs::temp_directory_path() / ("specactor_heads_" + tag + "." + std::to_string(::getpid()))).string();
  fs::create_directories(h->dir);
  const auto info = specactor::model::read_model_info(*specactor::model::GgufFile::open(model));
  using specactor::model::HeadKind;
  auto write = [&](HeadKind kind, bool st, std::int64_t layers, bool identity, const std::string& name) {
    specactor::model::HeadSpec spec;
    spec.kind = kind;
    spec.safetensors = st;
    spec.layers = layers;
    spec.identity = identity;
    spec.seed = 11;
    const std::string p = h->dir + "/" + name;
    specactor::model::write_random_head(info, spec, p);
    return p;
  };
  const std::string eagle = write(HeadKind::Eagle, false, 1, false, "eagle.gguf");
  const std::string eagle_id = write(HeadKind::Eagle, true, 1, true, "eagle_identity");
  const std::string eagle3 = write(HeadKind::Eagle3, false, 1, false, "eagle3.gguf");
  const std::string eagle3_hf = write(HeadKind::Eagle3, true, 1, false, "eagle3_hf");
  const std::string mtp_hf = write(HeadKind::Mtp, true, 1, false, "mtp_hf");
  const std::string mtp2 = write(HeadKind::Mtp, false, 2, false, "mtp2.gguf");
  auto cfg = [](const char* algo, const std::string& path, const char* steps, const char* topk, const char* tokens) {
    return std::vector<std::string>{"--speculative-algorithm",        algo,  "--speculative-draft-model-path", path,
                                    "--speculative-num-steps",        steps, "--speculative-eagle-topk",       topk,
                                    "--speculative-num-draft-tokens", tokens};
  };
  // DFLASH block drafters: one layer with a block of 4 (all 3 drafts verified), two layers with a block
  // of 8 of which the scheduler asks for 5; DSPARK the same with Markov and confidence heads (rank 8,
  // and rank 16 over a draft vocabulary).
  auto block = [&](std::int64_t layers, std::int64_t block_size, const std::string& name, std::int64_t rank = 0,
                   std::int64_t vocab = 0) {
    specactor::model::BlockDrafterSpec spec;
    spec.layers = layers;
    spec.block_size = block_size;
    spec.markov_rank = rank;
    spec.draft_vocab = vocab;
    spec.seed = 5;
    const std::string p = h->dir + "/" + name;
    specactor::model::write_random_block_drafter(info, spec, p);
    return p;
  };
  const std::string dflash1 = block(1, 4, "dflash1"), dflash2 = block(2, 8, "dflash2");
  const std::string dspark1 = block(1, 4, "dspark1", 8), dspark2 = block(2, 8, "dspark2", 16, info.vocab_size / 2);
  h->configs = {cfg("EAGLE", eagle, "3", "1", "4"),     // chain
                cfg("EAGLE", eagle_id, "3", "3", "7"),  // tree; drafts the root again: accepts on repeats
                cfg("EAGLE3", eagle3, "3", "2", "5"),      cfg("EAGLE3", eagle3_hf, "2", "1", "3"),
                cfg("MTP", mtp_hf, "1", "1", "2"),          // one layer
                cfg("MTP", mtp2, "2", "2", "4"),            // two layers, one runner each
                cfg("FROZEN_KV_MTP", mtp2, "3", "2", "5"),  // no KV of its own
                cfg("DFLASH", dflash1, "3", "1", "4"),     cfg("DFLASH", dflash2, "5", "1", "6"),
                cfg("DSPARK", dspark1, "3", "1", "4"),     cfg("DSPARK", dspark2, "5", "1", "6")};
  // A path-probability floor and the head quantized to Q4_1 (on the tiny model: 26 of the 720 drafts
  // the identity tree makes without a floor are proposed, and every one is accepted).
  auto floored = cfg("EAGLE", eagle_id, "3", "3", "7");
  floored.insert(floored.end(), {"--speculative-draft-p-min", "0.02", "--speculative-draft-quantization", "q4_1"});
  h->configs.push_back(floored);
  // A prompt-lookup branch on a random EAGLE-3 head whose floor lets few of its own drafts through:
  // the branch proposes most nodes (matches of one token), deeper than the head's 2 steps.
  auto branch = cfg("EAGLE3", eagle3_hf, "2", "2", "4");
  branch.insert(branch.end(), {"--speculative-draft-p-min", "0.3", "--speculative-draft-ngram-tokens", "4",
                               "--speculative-draft-ngram-min-match", "1"});
  h->configs.push_back(branch);
  // The block drafters with a prompt-lookup branch (matches of one token: most steps have one) and,
  // for DFLASH, a suffix branch over earlier requests too.
  auto dflash_branch = cfg("DFLASH", dflash2, "5", "3", "9");  // and two more first drafts
  dflash_branch.insert(dflash_branch.end(),
                       {"--speculative-draft-ngram-tokens", "4", "--speculative-draft-ngram-min-match", "1",
                        "--speculative-draft-suffix-tokens", "3"});
  h->configs.push_back(dflash_branch);
  auto dspark_branch = cfg("DSPARK", dspark2, "5", "2", "8");  // and a second first draft
  dspark_branch.insert(dspark_branch.end(),
                       {"--speculative-draft-ngram-tokens", "3", "--speculative-draft-ngram-min-match", "1"});
  h->configs.push_back(dspark_branch);
  return h;
}

// The target commits toks[0..n-2] into `seq` (the root toks[n-1] comes next), capturing `layers`;
// the last committed row's logits are returned too.
specactor::model::ForwardResult commit_all_but_root(specactor::model::LlamaRunner& runner,
                                                    specactor::model::KvCache& kv, specactor::model::KvCache::Seq& seq,
                                                    const std::vector<std::int32_t>& toks,
                                                    const std::vector<int>& layers) {
  std::vector<specactor::model::ForwardSeq> b(1);
  b[0].kv = &seq;
  b[0].tokens.assign(toks.begin(), toks.end() - 1);
  b[0].logit_rows = {static_cast<std::int32_t>(b[0].tokens.size()) - 1};
  specactor::model::ForwardResult out;
  runner.forward(b, kv, out, layers);
  return out;
}

}  // namespace

TEST_CASE(
    "heads (random): EAGLE chain and tree, EAGLE3, MTP 1 and 2 layers, FROZEN_KV_MTP, DFLASH, DSPARK are lossless on "
    "the tiny model") {
  const std::string p = write_tiny_model("heads_tiny");
  auto heads = random_heads(p, "tiny");
  const auto reqs = tiny_requests(24);
  check_lossless({"--model-path", p, "--log-level", "warn", "--max-total-tokens", "4096"}, reqs, heads->configs);
  fs::remove(p);
}

TEST_CASE(
    "heads (random): every head algorithm, DFLASH and DSPARK are lossless on the default model (single and 8 "
    "concurrent)") {
  if (!fs::exists(kDefaultModel)) {
    SKIP_CASE("no default model", "models/SmolLM2-135M-Instruct.Q4_1.gguf is not fetched (run tools/setup)");
  }
  auto heads = random_heads(kDefaultModel, "default");
  std::vector<GenerationRequest> reqs;
  const auto prompts = shipped_prompts();
  for (std::size_t i = 0; i < 8; ++i) {
    GenerationRequest r;
    r.prompt = prompts[i * prompts.size() / 8];
    r.chat = true;
    r.max_new_tokens = 12;
    reqs.push_back(r);
  }
  add_rules(reqs);
  add_constraints(reqs);
  check_lossless({"--model-path", kDefaultModel, "--log-level", "warn"}, reqs, heads->configs);
}

TEST_CASE("head catch-up: finish_last gives each part's last row of finish, bit for bit, alone and joint") {
  // A catch-up keeps only the root's output; finish_last skips the other rows' attention, output
  // projection and MLP. Its rows must be exactly those finish() computes over every row.
  specactor::testing::TinyLlamaShape shape;
  shape.context = 256;
  const std::string dir = (fs::temp_directory_path() / ("specactor_finish." + std::to_string(::getpid()))).string();
  fs::create_directories(dir);
  specactor::testing::tiny_llama(shape, true, 5).write(dir + "/tiny.gguf");
  specactor::config::ServerArgs a;
  a.model_path = dir + "/tiny.gguf";
  const auto target = specactor::model::load_model(a);
  using specactor::model::HeadKind;
  for (const HeadKind kind : {HeadKind::Eagle3, HeadKind::Eagle, HeadKind::Mtp}) {
    CAPTURE(static_cast<int>(kind));
    specactor::model::HeadSpec spec;
    spec.kind = kind;
    spec.seed = 3;
    const std::string path = dir + "/head" + std::to_string(static_cast<int>(kind)) + ".gguf";
    specactor::model::write_random_head(target.info, spec, path);
    for (const auto wt : {specactor::kernels::WeightType::F32, specactor::kernels::WeightType::Q8_0}) {
      const auto head = specactor::model::HeadWeights::load(path, kind, target.config, {}, false,
                                                            specactor::config::LoadFormat::Auto, wt);
      const auto& hc = head->config();
      specactor::model::HeadRunner runner(head, target.weights);
      specactor::model::KvCache cache(1, hc.n_kv_heads, hc.head_dim, 16, 512);
      // Two sequences: 5 rows already in the KV and 7 new ones; 0 and 3 new ones.
      const std::int64_t W = hc.feature_width();
      std::vector<specactor::model::KvCache::Seq> seqs(2);
      const std::int64_t before[2] = {5, 0}, fresh[2] = {7, 3};
      std::mt19937 rng(9);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      for (int i = 0; i < 2; ++i) {  // the earlier rows: projected and stored
        if (before[i] == 0) continue;
        std::vector<std::int32_t> toks, pos;
        std::vector<float> feat(static_cast<std::size_t>(before[i] * W));
        for (auto& f : feat) f = nd(rng);
        for (std::int64_t j = 0; j < before[i]; ++j) {
          toks.push_back(static_cast<std::int32_t>(3 + j));
          pos.push_back(static_cast<std::int32_t>(j + 1));
        }
        runner.project(0, toks.data(), feat.data(), W, before[i], pos.data());
        cache.reserve(seqs[i], before[i]);
        for (std::int64_t j = 0; j < before[i]; ++j)
          cache.write(0, seqs[i], j, runner.k_rows() + j * runner.kv_row(), runner.v_rows() + j * runner.kv_row());
        seqs[i].length = before[i];
      }
      std::vector<std::int32_t> toks, pos;
      std::vector<float> feat(static_cast<std::size_t>((fresh[0] + fresh[1]) * W));
      for (auto& f : feat) f = nd(rng);
      for (int i = 0; i < 2; ++i)
        for (std::int64_t j = 0; j < fresh[i]; ++j) {
          toks.push_back(static_cast<std::int32_t>(10 + j + 7 * i));
          pos.push_back(static_cast<std::int32_t>(before[i] + j + 1));
        }
      const auto total = static_cast<std::int64_t>(toks.size());
      runner.project(0, toks.data(), feat.data(), W, total, pos.data());
      std::int64_t row = 0;
      for (int i = 0; i < 2; ++i) {
        cache.reserve(seqs[i], before[i] + fresh[i]);
        for (std::int64_t j = 0; j < fresh[i]; ++j, ++row)
          cache.write(0, seqs[i], before[i] + j, runner.k_rows() + row * runner.kv_row(),
                      runner.v_rows() + row * runner.kv_row());
        seqs[i].length = before[i] + fresh[i];
      }
      std::vector<specactor::model::HeadRunner::AttentionPart> parts;
      for (int i = 0; i < 2; ++i) {
        const auto v = cache.view(0, seqs[i]);
        parts.push_back({{v, 0, before[i]}, {v, before[i], fresh[i]}, nullptr, i == 0 ? 0 : fresh[0], fresh[i]});
      }
      std::vector<float> all, last, alone;
      runner.finish_last(0, parts, last);  // before finish(), which changes the runner's rows
      runner.project(0, toks.data(), feat.data(), W, total, pos.data());
      runner.finish(0, parts, all);
      const std::int64_t H = hc.hidden;
      REQUIRE(last.size() == static_cast<std::size_t>(2 * H));
      for (int i = 0; i < 2; ++i) {
        const std::int64_t r = parts[static_cast<std::size_t>(i)].first_row + fresh[i] - 1;
        CHECK(std::memcmp(last.data() + i * H, all.data() + r * H, static_cast<std::size_t>(H) * sizeof(float)) == 0);
      }
      // The second sequence's part alone gives the same row.
      runner.project(0, toks.data() + fresh[0], feat.data() + fresh[0] * W, W, fresh[1], pos.data() + fresh[0]);
      auto p1 = parts[1];
      p1.first_row = 0;
      runner.finish_last(0, {p1}, alone);
      CHECK(std::memcmp(alone.data(), last.data() + H, static_cast<std::size_t>(H) * sizeof(float)) == 0);
    }
  }
  fs::remove_all(dir);
}

TEST_CASE("EAGLE head plumbing: the first draft is the target's own prediction from the hidden row handed over") {
  // An identity EAGLE head (fc passes the target's normed last hidden state through, attention and
  // MLP add nothing) predicts from h_{n-2} what the target predicted there. Any misaligned row, wrong
  // layer or wrong concatenation order shows up as a different token.
  specactor::testing::TinyLlamaShape s;
  s.vocab = 96;
  s.context = 256;
  const std::string dir = (fs::temp_directory_path() / ("specactor_plumb." + std::to_string(::getpid()))).string();
  fs::create_directories(dir);
  specactor::testing::tiny_llama(s, true, 9).write(dir + "/tiny.gguf");
  specactor::config::ServerArgs a;
  a.model_path = dir + "/tiny.gguf";
  const auto target = specactor::model::load_model(a);
  specactor::model::HeadSpec spec;
  spec.identity = true;
  specactor::model::write_random_head(target.info, spec, dir + "/id.gguf");
  auto kvp = std::make_shared<specactor::model::KvCache>(target.config.n_layers, target.config.n_kv_heads,
                                                         target.config.head_dim, 16, 1024);
  for (const char* algo : {"EAGLE", "FROZEN_KV_MTP"}) {
    CAPTURE(algo);
    specactor::config::ServerArgs d = a;
    d.speculative_algorithm = std::string(algo) == "EAGLE" ? specactor::config::SpecAlgorithm::Eagle
                                                           : specactor::config::SpecAlgorithm::FrozenKvMtp;
    specactor::model::HeadSpec mspec;
    mspec.kind = specactor::model::HeadKind::Mtp;
    specactor::model::write_random_head(target.info, mspec, dir + "/mtp.gguf");
    d.speculative_draft_model_path = std::string(algo) == "EAGLE" ? dir + "/id.gguf" : dir + "/mtp.gguf";
    d.speculative_num_steps = 1;
    d.speculative_eagle_topk = 1;
    d.speculative_num_draft_tokens = 2;
    d.max_total_tokens = 1024;
    const auto snap = specactor::config::freeze(d);
    DraftContext ctx{target.info, target.tokenizer, target.weights, kvp};
    auto drafter = find_drafter(snap)(snap, ctx);
    CHECK(drafter->needs().hidden_layers ==
          std::vector<std::int32_t>{static_cast<std::int32_t>(target.config.n_layers - 1)});
    CHECK(drafter->needs().target_kv == (std::string(algo) == "FROZEN_KV_MTP"));
    specactor::model::LlamaRunner runner(target.weights, 1);
    // The K and V rows of every committed slot in every layer.
    auto committed_k = [&](const specactor::model::KvCache::Seq& seq) {
      std::vector<float> out;
      const auto row = static_cast<std::size_t>(target.config.n_kv_heads * target.config.head_dim);
      std::vector<float> k(row), v(row);
      for (std::int64_t l = 0; l < target.config.n_layers; ++l)
        for (std::int64_t slot = 0; slot < seq.length; ++slot) {
          kvp->read(l, seq, slot, k.data(), v.data());
          out.insert(out.end(), k.begin(), k.end());
          out.insert(out.end(), v.begin(), v.end());
        }
      return out;
    };
    for (int trial = 0; trial < 4; ++trial) {
      std::vector<std::int32_t> toks;
      for (int k = 0; k < 9 + 5 * trial; ++k) toks.push_back((k * 13 + trial * 5) % 90 + 3);
      specactor::model::KvCache::Seq seq;
      const specactor::model::ForwardResult out =
          commit_all_but_root(runner, *kvp, seq, toks, {static_cast<int>(target.config.n_layers - 1)});
      const std::int32_t predicted = specactor::kernels::argmax(out.logits.data(), target.config.vocab_size);
      // Bytes of the target's committed KV, to prove the drafter never wrote them.
      const std::vector<float> before = committed_k(seq);
      drafter->observe(static_cast<std::uint64_t>(trial), TargetFeatures{out.hidden[0], 0, seq.pages, seq.length});
      const DraftTree t = drafter->propose(static_cast<std::uint64_t>(trial), toks, 1, 1);
      REQUIRE(t.tokens.size() == 1);
      if (std::string(algo) == "EAGLE") CHECK(t.tokens[0] == predicted);
      const std::vector<float> after = committed_k(seq);
      CHECK(after == before);
      drafter->release(static_cast<std::uint64_t>(trial));
      kvp->release(seq);
    }
  }
  fs::remove_all(dir);
}

// A random EAGLE-3 head drafter on the tiny model, fed the target's features for toks[0..n-2] as the
// target worker would hand them over (request 1); `shape` sets the draft settings.
struct HeadDrafterFixture {
  std::string model, head;
  specactor::config::ServerArgs args;
  specactor::model::LoadedModel target;
  std::shared_ptr<specactor::model::KvCache> kv;
  std::unique_ptr<Drafter> drafter;
  specactor::model::KvCache::Seq seq;

  HeadDrafterFixture(const std::string& tag, const std::vector<std::int32_t>& toks,
                     const std::function<void(specactor::config::ServerArgs&)>& shape)
      : model(write_tiny_model(tag)), head(model + ".eagle3.gguf") {
    args.model_path = model;
    target = specactor::model::load_model(args);
    specactor::model::HeadSpec spec;
    spec.kind = specactor::model::HeadKind::Eagle3;
    spec.seed = 4;
    specactor::model::write_random_head(target.info, spec, head);
    args.speculative_algorithm = specactor::config::SpecAlgorithm::Eagle3;
    args.speculative_draft_model_path = head;
    args.max_total_tokens = 1024;
    shape(args);
    kv = std::make_shared<specactor::model::KvCache>(target.config.n_layers, target.config.n_kv_heads,
                                                     target.config.head_dim, 16, 1024);
    drafter = find_drafter(specactor::config::freeze(args))(
        specactor::config::freeze(args), DraftContext{target.info, target.tokenizer, target.weights, kv});
    std::vector<int> layers;
    for (auto l : drafter->needs().hidden_layers) layers.push_back(l);
    specactor::model::LlamaRunner runner(target.weights, 1);
    const specactor::model::ForwardResult out = commit_all_but_root(runner, *kv, seq, toks, layers);
    std::vector<float> hidden;  // the captured layers concatenated per row, as the target worker sends them
    const auto H = static_cast<std::size_t>(target.config.hidden);
    for (std::size_t r = 0; r + 1 < toks.size(); ++r)
      for (const auto& l : out.hidden)
        hidden.insert(hidden.end(), l.begin() + static_cast<long>(r * H), l.begin() + static_cast<long>((r + 1) * H));
    const std::vector<std::int32_t> no_pages;
    drafter->observe(1, TargetFeatures{hidden, 0, no_pages, 0});
  }
  // New draft settings, as a reconfigured draft worker passes them on.
  void reshape(const std::function<void(specactor::config::ServerArgs&)>& change) {
    change(args);
    drafter->reconfigure(specactor::config::freeze(args));
  }
  ~HeadDrafterFixture() {
    drafter->release(1);
    kv->release(seq);
    fs::remove(head);
    fs::remove(model);
  }
};

TEST_CASE("drafters' own prefix cache: STANDALONE and a one-layer head start on cached draft KV, drafts unchanged") {
  const std::string model = write_tiny_model("draft_cache");
  specactor::config::ServerArgs base;
  base.model_path = model;
  base.max_total_tokens = 1024;
  const auto target = specactor::model::load_model(base);
  const std::string head = model + ".eagle3.gguf";
  specactor::model::HeadSpec spec;
  spec.kind = specactor::model::HeadKind::Eagle3;
  spec.seed = 5;
  specactor::model::write_random_head(target.info, spec, head);
  auto kv = std::make_shared<specactor::model::KvCache>(target.config.n_layers, target.config.n_kv_heads,
                                                        target.config.head_dim, 16, 1024);
  // A: 40 tokens; B: A and 10 more; C: A's first 32 tokens, then others (it parts from A at index 32).
  std::vector<std::int32_t> a, b, c;
  for (int k = 0; k < 40; ++k) a.push_back((k * 17 + 3) % 90 + 3);
  b = a;
  for (int k = 0; k < 10; ++k) b.push_back((k * 7 + 1) % 90 + 3);
  c.assign(a.begin(), a.begin() + 32);
  for (int k = 0; k < 12; ++k) c.push_back((k * 11 + 5) % 90 + 3);
  for (const std::string algo : {"STANDALONE", "EAGLE3"}) {
    CAPTURE(algo);
    const bool is_head = algo == "EAGLE3";
    auto make = [&](bool cache) {
      specactor::config::ServerArgs d = base;
      d.speculative_algorithm =
          is_head ? specactor::config::SpecAlgorithm::Eagle3 : specactor::config::SpecAlgorithm::Standalone;
      d.speculative_draft_model_path = is_head ? head : model;
      d.disable_radix_cache = !cache;
      d.speculative_num_steps = 3;  // as resolution would set it (unset: nothing is drafted)
      const auto snap = specactor::config::freeze(d);
      return find_drafter(snap)(snap, DraftContext{target.info, target.tokenizer, target.weights, kv});
    };
    auto cached = make(true), plain = make(false);
    // The target's captured rows of toks[0..n-2], as the target worker hands them over.
    auto features = [&](const std::vector<std::int32_t>& toks) {
      std::vector<float> hidden;
      if (!is_head) return hidden;
      std::vector<int> layers;
      for (auto l : cached->needs().hidden_layers) layers.push_back(l);
      specactor::model::LlamaRunner runner(target.weights, 1);
      specactor::model::KvCache::Seq seq;
      const specactor::model::ForwardResult out = commit_all_but_root(runner, *kv, seq, toks, layers);
      const auto H = static_cast<std::size_t>(target.config.hidden);
      for (std::size_t r = 0; r + 1 < toks.size(); ++r)
        for (const auto& l : out.hidden)
          hidden.insert(hidden.end(), l.begin() + static_cast<long>(r * H), l.begin() + static_cast<long>((r + 1) * H));
      kv->release(seq);
      return hidden;
    };
    const std::vector<std::int32_t> no_pages;
    auto propose = [&](Drafter& d, std::uint64_t req, const std::vector<std::int32_t>& toks) {
      const std::vector<float> f = features(toks);
      if (!f.empty()) d.observe(req, TargetFeatures{f, 0, no_pages, 0});
      return d.propose(req, toks, 3, 3);
    };
    propose(*cached, 1, a);
    cached->release(1);
    // B extends A: A's whole pages are reused (STANDALONE: slots 0..31 hold t_0..t_31; the head: slot p
    // holds the pair at position p+1, so A's 39 pairs fill two whole pages too).
    const DraftTree tb = propose(*cached, 2, b), want_b = propose(*plain, 2, b);
    CHECK(cached->cache_stats().hit_tokens == 32);
    CHECK(!tb.tokens.empty());
    CHECK(tb.tokens == want_b.tokens);
    CHECK(tb.scores == want_b.scores);
    // C parts from A at token 32: STANDALONE's slots 0..31 still match; the head's slot 31 (the pair
    // at position 32) holds t_32, so only its first page matches.
    const std::int64_t before = cached->cache_stats().hit_tokens;
    const DraftTree tc = propose(*cached, 3, c), want_c = propose(*plain, 3, c);
    CHECK(cached->cache_stats().hit_tokens - before == (is_head ? 16 : 32));
    CHECK(tc.tokens == want_c.tokens);
    CHECK(tc.scores == want_c.scores);
    CHECK(plain->cache_stats().hit_tokens == 0);
    for (std::uint64_t r : {2, 3}) {
      cached->release(r);
      plain->release(r);
    }
    CHECK(cached->cache_stats().pages > 0);
    CHECK(cached->flush_cache() > 0);
    CHECK(cached->cache_stats().pages == 0);
  }
  fs::remove(head);
  fs::remove(model);
}

TEST_CASE("head drafters: a round of several requests drafts exactly what each would draft alone") {
  const std::string model = write_tiny_model("head_round");
  using specactor::model::HeadKind;
  struct Case {
    HeadKind kind;
    std::int64_t layers;
    const char* algo;
    specactor::config::SpecAlgorithm alg;
    std::int64_t steps, topk, tokens;
  };
  using specactor::config::SpecAlgorithm;
  const std::vector<Case> cases = {{HeadKind::Eagle3, 1, "EAGLE3", SpecAlgorithm::Eagle3, 3, 1, 4},
                                   {HeadKind::Eagle3, 1, "EAGLE3", SpecAlgorithm::Eagle3, 3, 2, 6},
                                   {HeadKind::Eagle, 1, "EAGLE", SpecAlgorithm::Eagle, 2, 3, 7},
                                   {HeadKind::Mtp, 2, "MTP", SpecAlgorithm::Mtp, 3, 1, 4}};
  // Three requests: a long one (its first catch-up runs alone, in chunks) and two short ones
  // (caught up together); then each gains a few tokens, as after verification, and drafts again.
  std::vector<std::vector<std::int32_t>> seqs(3);
  for (int k = 0; k < 90; ++k) seqs[0].push_back((k * 13 + 7) % 90 + 3);
  for (int k = 0; k < 12; ++k) seqs[1].push_back((k * 17 + 3) % 90 + 3);
  for (int k = 0; k < 31; ++k) seqs[2].push_back((k * 5 + 11) % 90 + 3);
  const std::vector<std::vector<std::int32_t>> start = seqs;
  for (const char* precision : {"fast", "exact"})
    for (const Case& c : cases) {
      const std::string what = std::string(precision) + " " + c.algo + " topk " + std::to_string(c.topk);
      CAPTURE(what);
      specactor::config::ServerArgs args = tiny_args(model, precision);
      const auto target = specactor::model::load_model(args);
      const std::string head = model + "." + c.algo + ".head.gguf";
      specactor::model::HeadSpec spec;
      spec.kind = c.kind;
      spec.layers = c.layers;
      spec.seed = 9;
      specactor::model::write_random_head(target.info, spec, head);
      args.speculative_algorithm = c.alg;
      args.speculative_draft_model_path = head;
      args.speculative_num_steps = c.steps;
      args.speculative_eagle_topk = c.topk;
      args.speculative_num_draft_tokens = c.tokens;
      auto kv = std::make_shared<specactor::model::KvCache>(target.config.n_layers, target.config.n_kv_heads,
                                                            target.config.head_dim, 16, 1024);
      const auto snap = specactor::config::freeze(args);
      auto make = [&] {
        return find_drafter(snap)(snap, DraftContext{target.info, target.tokenizer, target.weights, kv});
      };
      auto together = make(), alone = make();
      std::vector<int> layers;
      for (auto l : together->needs().hidden_layers) layers.push_back(l);
      std::vector<std::size_t> fed(seqs.size(), 0);  // rows handed over so far, per request
      auto hand_over = [&](std::size_t r, const std::vector<std::int32_t>& toks) {
        specactor::model::LlamaRunner runner(target.weights, 1);
        specactor::model::KvCache::Seq seq;
        const specactor::model::ForwardResult out = commit_all_but_root(runner, *kv, seq, toks, layers);
        std::vector<float> hidden;
        const auto H = static_cast<std::size_t>(target.config.hidden);
        for (std::size_t row = fed[r]; row + 1 < toks.size(); ++row)
          for (const auto& l : out.hidden)
            hidden.insert(hidden.end(), l.begin() + static_cast<long>(row * H),
                          l.begin() + static_cast<long>((row + 1) * H));
        kv->release(seq);
        const std::vector<std::int32_t> no_pages;
        for (Drafter* d : {together.get(), alone.get()})
          d->observe(r + 1, TargetFeatures{hidden, static_cast<std::int64_t>(fed[r]), no_pages, 0});
        fed[r] = toks.size() - 1;
      };
      std::size_t drafted = 0;
      for (int round = 0; round < 3; ++round) {
        CAPTURE(round);
        std::vector<ProposeArgs> args_round;
        for (std::size_t r = 0; r < seqs.size(); ++r) {
          if (round > 0)
            for (int k = 0; k < 2 + static_cast<int>(r); ++k)
              seqs[r].push_back((static_cast<int>(seqs[r].size()) * 7 + round) % 90 + 3);
          hand_over(r, seqs[r]);
          // The middle request asks for one level only in the second round.
          args_round.push_back({r + 1, &seqs[r], 7, round == 1 && r == 1 ? 1 : 4});
        }
        const std::vector<DraftTree> got = together->propose_batch(args_round);
        REQUIRE(got.size() == seqs.size());
        for (std::size_t r = 0; r < seqs.size(); ++r) {
          CAPTURE(r);
          const DraftTree want = alone->propose(r + 1, seqs[r], args_round[r].max_nodes, args_round[r].max_depth);
          CHECK(got[r].tokens == want.tokens);
          CHECK(got[r].parents == want.parents);
          CHECK(got[r].scores == want.scores);
          drafted += want.tokens.size();
        }
      }
      CHECK(drafted > 0);
      for (std::uint64_t r = 1; r <= seqs.size(); ++r) {
        together->release(r);
        alone->release(r);
      }
      seqs = start;  // the next case starts from the same sequences
      fs::remove(head);
    }
  fs::remove(model);
}

TEST_CASE("head drafters: --speculative-draft-p-min proposes exactly the nodes whose path probability reaches it") {
  std::vector<std::int32_t> toks;
  for (int k = 0; k < 20; ++k) toks.push_back((k * 11 + 4) % 90 + 3);
  HeadDrafterFixture f("pmin", toks, [](specactor::config::ServerArgs& d) {
    d.speculative_num_steps = 3;
    d.speculative_eagle_topk = 3;
    d.speculative_num_draft_tokens = 8;
    d.speculative_draft_p_min = 0.0;
  });
  auto& drafter = f.drafter;
  const DraftTree full = drafter->propose(1, toks, 7, 3);
  REQUIRE(full.tokens.size() == 7);
  REQUIRE(full.scores.size() == 7);
  for (std::size_t i = 0; i < 7; ++i) {
    CHECK(full.scores[i] > 0.0f);
    CHECK(full.scores[i] <= 1.0f);
    if (full.parents[i] >= 0) CHECK(full.scores[i] <= full.scores[static_cast<std::size_t>(full.parents[i])]);
  }
  // A floor between the scores: the proposal is the full one's nodes at or above it, same order and parents.
  std::vector<float> sorted = full.scores;
  std::sort(sorted.begin(), sorted.end());
  REQUIRE(sorted[3] > sorted[2]);
  const float floor = 0.5f * (sorted[2] + sorted[3]);
  f.reshape([&](specactor::config::ServerArgs& d) { d.speculative_draft_p_min = floor; });
  const DraftTree cut = drafter->propose(1, toks, 7, 3);
  std::vector<std::int32_t> want_tokens, want_parents, index(7, -1);
  for (std::size_t i = 0; i < 7; ++i) {
    if (full.scores[i] < floor) continue;
    index[i] = static_cast<std::int32_t>(want_tokens.size());
    want_tokens.push_back(full.tokens[i]);
    want_parents.push_back(full.parents[i] < 0 ? -1 : index[static_cast<std::size_t>(full.parents[i])]);
  }
  CHECK(want_tokens.size() == 4);
  CHECK(cut.tokens == want_tokens);
  CHECK(cut.parents == want_parents);
  // Above every path probability: no draft at all (the target decodes plainly).
  f.reshape([&](specactor::config::ServerArgs& d) {
    d.speculative_draft_p_min = std::min(0.999, static_cast<double>(sorted.back()) * 1.01);
  });
  CHECK(drafter->propose(1, toks, 7, 3).tokens.empty());
}

TEST_CASE("prompt lookup helpers: the latest longest match's continuation, merged into a tree") {
  using V = std::vector<std::int32_t>;
  // The last 3 tokens (7 8 9) recur at positions 4-6, then 7 8 9 follows; a 2-token match (8 9) recurs
  // later (9-10) but the longest suffix wins, and of its occurrences the latest.
  const V ctx = {1, 2, 3, 0, 7, 8, 9, 5, 6, 8, 9, 4, 7, 8, 9, 6, 1, 7, 8, 9};
  CHECK(latest_match_continuation(ctx, 2, 12, 3) == V{6, 1, 7});         // 7 8 9 at 12-14 (the latest) wins
  CHECK(latest_match_continuation(ctx, 2, 12, 10) == V{6, 1, 7, 8, 9});  // cut at the end of the context
  CHECK(latest_match_continuation(ctx, 4, 12, 3).empty());               // 1 7 8 9 occurs once
  CHECK(latest_match_continuation(ctx, 2, 12, 0).empty());
  CHECK(latest_match_continuation(V{4, 4}, 1, 12, 3) == V{4});
  CHECK(latest_match_continuation(V{4}, 1, 12, 3).empty());

  DraftTree t;  // root -> 6 -> 1, root -> 2
  t.tokens = {6, 2, 1};
  t.parents = {-1, -1, 0};
  t.scores = {0.5f, 0.2f, 0.3f};
  CHECK(merge_chain(t, V{6, 1, 7, 8}, 1) == 1);  // follows 6 and 1, adds 7, stops at the budget
  CHECK(t.tokens == V{6, 2, 1, 7});
  CHECK(t.parents == V{-1, -1, 0, 2});
  CHECK(t.scores.size() == 4);
  CHECK(merge_chain(t, V{2, 3}, 4) == 1);  // under the existing 2
  CHECK(t.parents.back() == 1);
  CHECK(merge_chain(t, V{9}, 4) == 1);  // a new root child
  CHECK(t.parents.back() == -1);
  DraftTree empty;
  CHECK(merge_chain(empty, V{3, 4}, 4) == 2);
  CHECK(empty.parents == V{-1, 0});
  CHECK(empty.scores.size() == 2);
}

TEST_CASE("head drafters: --speculative-draft-ngram-tokens adds the prompt-lookup continuation to the head's tree") {
  // 12 distinct tokens, then the first 5 again: the last 5 recur, followed by tokens 5..11.
  std::vector<std::int32_t> toks;
  for (int k = 0; k < 12; ++k) toks.push_back((k * 11 + 4) % 90 + 3);
  for (int k = 0; k < 5; ++k) toks.push_back(toks[static_cast<std::size_t>(k)]);
  HeadDrafterFixture f("branch", toks, [](specactor::config::ServerArgs& d) {
    d.speculative_num_steps = 2;
    d.speculative_eagle_topk = 2;
    d.speculative_num_draft_tokens = 4;
    d.speculative_draft_ngram_tokens = 0;
  });
  auto& drafter = f.drafter;
  // The scheduler's budget with a branch of 4: 3 + 4 nodes, depth max(2, 4).
  const DraftTree plain = drafter->propose(1, toks, 7, 4);
  REQUIRE(plain.tokens.size() == 3);  // the head keeps to its own shape
  f.reshape([](specactor::config::ServerArgs& d) { d.speculative_draft_ngram_tokens = 4; });
  const DraftTree both = drafter->propose(1, toks, 7, 4);
  // The head's nodes come first, unchanged; then the branch: toks[5..8] hang below the root, through
  // any head node that proposed the same token.
  REQUIRE(both.tokens.size() > plain.tokens.size());
  CHECK(std::vector<std::int32_t>(both.tokens.begin(), both.tokens.begin() + 3) == plain.tokens);
  CHECK(std::vector<std::int32_t>(both.parents.begin(), both.parents.begin() + 3) == plain.parents);
  CHECK(both.scores.size() == both.tokens.size());
  // The branch's last node is 4 deep, beyond the head's 2 steps.
  CHECK(specactor::testing::path_depth(both, std::vector<std::int32_t>(toks.begin() + 5, toks.begin() + 9)) == 4);
  // The budget the scheduler gives bounds it: with 5 nodes in all, the branch adds at most 2.
  CHECK(drafter->propose(1, toks, 5, 4).tokens.size() <= 5);
  // Less than min-match recurring: no branch.
  f.reshape([](specactor::config::ServerArgs& d) { d.speculative_draft_ngram_min_match = 6; });
  CHECK(drafter->propose(1, toks, 7, 4).tokens == plain.tokens);
}

TEST_CASE("default model: every head-free drafter is lossless on the shipped prompts (single and 8 concurrent)") {
  if (!fs::exists(kDefaultModel)) {
    SKIP_CASE("no default model", "models/SmolLM2-135M-Instruct.Q4_1.gguf is not fetched (run tools/setup)");
  }
  std::vector<GenerationRequest> reqs;
  for (const auto& p : shipped_prompts()) {
    GenerationRequest r;
    r.prompt = p;
    r.chat = true;
    r.max_new_tokens = 16;
    reqs.push_back(r);
  }
  REQUIRE(reqs.size() >= 12);
  add_rules(reqs);
  add_constraints(reqs);
  check_lossless({"--model-path", kDefaultModel, "--log-level", "warn"}, reqs,
                 {{"--speculative-algorithm", "NGRAM"},
                  {"--speculative-algorithm", "NGRAM", "--speculative-adaptive", "false"},
                  {"--speculative-algorithm", "SUFFIX"},
                  {"--speculative-algorithm", "SUFFIX", "--speculative-adaptive", "false"},
                  {"--speculative-algorithm", "NGRAM", "--speculative-num-steps", "4", "--speculative-eagle-topk", "4",
                   "--speculative-num-draft-tokens", "10"},
                  {"--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", kDefaultModel},
                  {"--speculative-algorithm", "STANDALONE", "--speculative-draft-num-layers", "8",
                   "--speculative-num-steps", "2"}});
}

TEST_CASE("self-speculation reads the target's KV: the drafts of a draft that keeps its own, nothing written") {
  const std::string model = write_tiny_model("self_spec_kv");
  std::vector<std::int32_t> toks;
  for (int k = 0; k < 41; ++k) toks.push_back((k * 29 + 7) % 90 + 3);
  for (const char* precision : {"fast", "exact"})
    for (const std::int64_t layers : {1, 2}) {  // the tiny model has 2: the whole target drafts
      const std::string what = std::string(precision) + ", " + std::to_string(layers) + " layer(s)";
      CAPTURE(what);
      specactor::config::ServerArgs args = tiny_args(model, precision);
      const auto target = specactor::model::load_model(args);
      auto kv = std::make_shared<specactor::model::KvCache>(target.config.n_layers, target.config.n_kv_heads,
                                                            target.config.head_dim, 16, 1024, true,
                                                            specactor::model::kv_type(args));
      specactor::model::LlamaRunner runner(target.weights, 1, specactor::model::cpu_precision(args));
      specactor::model::KvCache::Seq seq;
      commit_all_but_root(runner, *kv, seq, toks, {});
      args.speculative_algorithm = specactor::config::SpecAlgorithm::Standalone;
      args.speculative_draft_num_layers = layers;
      args.speculative_use_rejection_sampling = true;  // the drafts come with their whole distributions
      const auto snap = specactor::config::freeze(args);
      auto shared = find_drafter(snap)(snap, DraftContext{target.info, target.tokenizer, target.weights, kv});
      auto own = find_drafter(snap)(snap, DraftContext{target.info, target.tokenizer, target.weights, nullptr});
      CHECK(shared->needs().target_kv);
      CHECK_FALSE(own->needs().target_kv);
      std::vector<std::vector<float>> before(static_cast<std::size_t>(target.config.n_layers));
      for (std::int64_t l = 0; l < target.config.n_layers; ++l)
        for (std::int64_t slot = 0; slot < seq.length; ++slot) {
          std::vector<float> k(static_cast<std::size_t>(kv->row_floats())), v(k.size());
          kv->read(l, seq, slot, k.data(), v.data());
          before[static_cast<std::size_t>(l)].insert(before[static_cast<std::size_t>(l)].end(), k.begin(), k.end());
          before[static_cast<std::size_t>(l)].insert(before[static_cast<std::size_t>(l)].end(), v.begin(), v.end());
        }
      shared->observe(1, TargetFeatures{{}, 0, seq.pages, seq.length});
      const DraftTree a = shared->propose(1, toks, 5, 5), b = own->propose(1, toks, 5, 5);
      REQUIRE(a.tokens.size() == 5);
      CHECK(a.tokens == b.tokens);
      CHECK(a.parents == b.parents);
      // Sampled drafts carry the distributions they were drawn from: every value equal, so the draft
      // attended to exactly the KV it keeps itself in the other mode.
      specactor::kernels::SamplingParams hot;
      hot.temperature = 1.0f;
      for (Drafter* d : {shared.get(), own.get()}) d->set_sampling(2, hot, 77);
      shared->observe(2, TargetFeatures{{}, 0, seq.pages, seq.length});
      const DraftTree sa = shared->propose(2, toks, 4, 4), sb = own->propose(2, toks, 4, 4);
      REQUIRE(sa.probs.size() == 4 * static_cast<std::size_t>(target.config.vocab_size));
      CHECK(sa.tokens == sb.tokens);
      CHECK(sa.probs == sb.probs);
      if (layers == target.config.n_layers) {  // the whole model: its first draft is the target's own next token
        std::vector<std::int32_t> with_next = toks;
        with_next.push_back(0);  // commit_all_but_root leaves the last token out: all of toks is committed
        specactor::model::KvCache::Seq whole;
        const specactor::model::ForwardResult next = commit_all_but_root(runner, *kv, whole, with_next, {});
        CHECK(a.tokens[0] == specactor::kernels::argmax(next.logits.data(), target.config.vocab_size));
        kv->release(whole);
      }
      // The draft's own pool is sized for one proposal per running request: with one, a proposal of
      // the full depth (63) still fits.
      specactor::config::ServerArgs one_args = args;
      one_args.max_running_requests = 1;
      const auto one_snap = specactor::config::freeze(one_args);
      auto one = find_drafter(one_snap)(one_snap, DraftContext{target.info, target.tokenizer, target.weights, kv});
      REQUIRE(one->needs().target_kv);
      one->observe(3, TargetFeatures{{}, 0, seq.pages, seq.length});
      CHECK(one->propose(3, toks, 63, 63).tokens.size() == 63);
      CHECK(one->propose(3, toks, 63, 63).tokens.size() == 63);  // and again: the pages came back
      // A context whose committed KV the target has not handed over yet: no draft rather than a wrong one.
      std::vector<std::int32_t> longer = toks;
      longer.push_back(5);
      CHECK(shared->propose(1, longer, 5, 5).tokens.empty());
      for (std::int64_t l = 0; l < target.config.n_layers; ++l) {
        std::vector<float> now;
        for (std::int64_t slot = 0; slot < seq.length; ++slot) {
          std::vector<float> k(static_cast<std::size_t>(kv->row_floats())), v(k.size());
          kv->read(l, seq, slot, k.data(), v.data());
          now.insert(now.end(), k.begin(), k.end());
          now.insert(now.end(), v.begin(), v.end());
        }
        CHECK(now == before[static_cast<std::size_t>(l)]);  // the target's KV is only read
      }
      for (std::uint64_t r : {1, 2}) {
        shared->release(r);
        own->release(r);
      }
      kv->release(seq);
    }
  fs::remove(model);
}

TEST_CASE("tiny model: STANDALONE and self-speculation are lossless, a mismatched draft vocabulary is reported") {
  const std::string p = write_tiny_model("spec_tiny");
  const auto reqs = tiny_requests(20);
  check_lossless({"--model-path", p, "--log-level", "warn", "--max-total-tokens", "4096"}, reqs,
                 {{"--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", p},
                  {"--speculative-algorithm", "STANDALONE", "--speculative-draft-num-layers", "1"},
                  {"--speculative-algorithm", "STANDALONE", "--speculative-draft-num-layers", "2",
                   "--speculative-adaptive", "false"},
                  {"--speculative-algorithm", "NGRAM", "--speculative-eagle-topk", "3", "--speculative-num-steps", "3",
                   "--speculative-num-draft-tokens", "7"},
                  {"--speculative-algorithm", "SUFFIX", "--speculative-suffix-min-match", "1"},
                  {"--speculative-algorithm", "SUFFIX", "--speculative-suffix-min-match", "1",
                   "--speculative-suffix-cache-tokens", "64", "--speculative-adaptive", "false"}});
  if (fs::exists(kDefaultModel)) {
    auto e = Engine::from_argv({"--model-path", kDefaultModel, "--log-level", "off", "--speculative-algorithm",
                                "STANDALONE", "--speculative-draft-model-path", p});
    const EngineMetrics m = e->metrics();
    CHECK_FALSE(m.draft_alive);
    CHECK(m.draft_error.find("vocabulary of 96 tokens does not match the target's 49152") != std::string::npos);
  }
  fs::remove(p);
}

TEST_CASE("families: NGRAM and SUFFIX are lossless on tiny qwen2, qwen3 and gemma3 (answers cross its window of 16)") {
  for (const char* family : {"qwen2", "qwen3", "gemma3"}) {
    CAPTURE(std::string(family));
    const std::string p = std::string(SPECACTOR_SOURCE_DIR) + "/tests/data/families/" + family + ".gguf";
    const auto reqs = tiny_requests(24);  // prompts of 6 .. 41 tokens, 24 new: up to 65 positions
    check_lossless({"--model-path", p, "--log-level", "warn", "--max-total-tokens", "4096", "--skip-tokenizer-init"},
                   reqs,
                   {{"--speculative-algorithm", "NGRAM", "--speculative-eagle-topk", "3", "--speculative-num-steps",
                     "3", "--speculative-num-draft-tokens", "7", "--speculative-adaptive", "false"},
                    {"--speculative-algorithm", "NGRAM"},
                    {"--speculative-algorithm", "SUFFIX", "--speculative-suffix-min-match", "1",
                     "--speculative-adaptive", "false"}});
  }
}

TEST_CASE("families: random EAGLE, EAGLE3, MTP, DFLASH and DSPARK drafters on a tiny qwen3 target are lossless") {
  // The public EAGLE-3 heads and DFlash drafters for Qwen3 targets have these layouts (a llama layer over
  // the target's captured hidden states; Qwen3 layers with q/k norms injected with them).
  const std::string p = std::string(SPECACTOR_SOURCE_DIR) + "/tests/data/families/qwen3.gguf";
  auto heads = random_heads(p, "qwen3");
  // FROZEN_KV_MTP reads the target's KV with its own heads, which must be the target's: the random MTP
  // head is written 16 wide (hidden ÷ heads) and this Qwen3 has 32-wide heads, so it is refused ("head
  // dim") — not a layout the public Qwen3 drafters use.
  std::vector<std::vector<std::string>> configs;
  for (const auto& c : heads->configs)
    if (std::find(c.begin(), c.end(), "FROZEN_KV_MTP") == c.end()) configs.push_back(c);
  REQUIRE(configs.size() + 1 == heads->configs.size());
  check_lossless({"--model-path", p, "--log-level", "warn", "--max-total-tokens", "4096", "--skip-tokenizer-init"},
                 tiny_requests(20), configs);
}

TEST_CASE("sampling through the loop: speculative tokens follow the plain sampler's distribution") {
  specactor::testing::TinyLlamaShape s;
  s.vocab = 96;
  s.context = 128;
  const std::string p =
      (fs::temp_directory_path() / ("specactor_spec_dist." + std::to_string(::getpid()) + ".gguf")).string();
  specactor::testing::tiny_llama(s, true, 9).write(p);
  const std::vector<std::string> base = {"--model-path", p, "--log-level", "warn", "--max-total-tokens", "1024"};
  const int draws = 1200;
  // Histogram of the third generated token (two decode steps after the prefill's token).
  auto histogram = [&](std::vector<std::string> extra, bool ruled = false) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    auto e = Engine::from_argv(args);
    std::map<std::int32_t, int> h;
    for (int i = 0; i < draws; ++i) {
      GenerationRequest r;
      r.prompt_ids = {5, 9, 5, 9, 5};
      r.max_new_tokens = 3;
      r.ignore_eos = true;
      r.sampling.temperature = 1.0f;
      r.sampling.top_k = 6;
      if (ruled) {  // penalties and a bias: the distribution sampled is the penalised one
        r.rules.presence_penalty = 1.0f;
        r.rules.frequency_penalty = 0.5f;
        r.rules.repetition_penalty = 1.3f;
        r.rules.bias_ids = {7};
        r.rules.bias_values = {1.5f};
      }
      r.seed = static_cast<std::uint64_t>(1000 + i);
      const auto g = e->generate(r);
      REQUIRE(g.tokens.size() == 3);
      ++h[g.tokens[2]];
    }
    const EngineMetrics m = e->metrics();
    e->shutdown();
    return std::pair{h, m};
  };
  auto two_sample_chi2 = [](const std::map<std::int32_t, int>& a, const std::map<std::int32_t, int>& b, int& df) {
    std::map<std::int32_t, std::pair<int, int>> both;
    for (auto [k, v] : a) both[k].first = v;
    for (auto [k, v] : b) both[k].second = v;
    double chi = 0;
    int small_a = 0, small_b = 0;
    df = -1;
    for (auto [k, v] : both) {
      if (v.first + v.second < 10) {  // pool rare tokens
        small_a += v.first, small_b += v.second;
        continue;
      }
      chi += double(v.first - v.second) * (v.first - v.second) / (v.first + v.second);
      ++df;
    }
    if (small_a + small_b > 0) {
      chi += double(small_a - small_b) * (small_a - small_b) / (small_a + small_b);
      ++df;
    }
    return chi;
  };
  const auto [plain, pm] = histogram({});
  const auto [rejection, rm] = histogram({"--speculative-algorithm", "STANDALONE", "--speculative-draft-num-layers",
                                          "1", "--speculative-use-rejection-sampling", "--speculative-num-steps", "2",
                                          "--speculative-adaptive", "false"});
  const auto [target_only, tm] =
      histogram({"--speculative-algorithm", "NGRAM", "--speculative-num-steps", "2", "--speculative-eagle-topk", "2",
                 "--speculative-num-draft-tokens", "4", "--speculative-adaptive", "false"});
  // A random EAGLE-3 head with a prompt-lookup branch (the prompt repeats: the branch proposes). Every
  // speculative run here is at a fixed shape: on a tiny model a step costs microseconds, so the budget
  // may rightly stop drafting on a busy machine (seen in CI for all three), and then this case would
  // test nothing. That the budget never changes what is accepted is tested greedily elsewhere.
  const std::string head = p + ".eagle3.gguf";
  {
    specactor::model::HeadSpec spec;
    spec.kind = specactor::model::HeadKind::Eagle3;
    spec.seed = 3;
    specactor::model::write_random_head(specactor::model::read_model_info(*specactor::model::GgufFile::open(p)), spec,
                                        head);
  }
  const auto [hybrid, hm] = histogram({"--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", head,
                                       "--speculative-num-steps", "2", "--speculative-eagle-topk", "2",
                                       "--speculative-num-draft-tokens", "4", "--speculative-draft-ngram-tokens", "3",
                                       "--speculative-draft-ngram-min-match", "1", "--speculative-adaptive", "false"});
  // A random DFLASH drafter whose drafts are drawn from its own probabilities (rejection sampling), and
  // the same drafter's argmax chain verified by target-only sampling; a random DSPARK drafter drawing
  // each draft from the backbone's logits plus the Markov term of the draft before it.
  const std::string block = p + ".dflash", spark = p + ".dspark";
  for (const std::int64_t rank : {0, 8}) {
    specactor::model::BlockDrafterSpec spec;
    spec.block_size = 4;
    spec.seed = 4;
    spec.scale = 0.3f;  // broad draft distributions: some drafts are accepted
    spec.markov_rank = rank;
    specactor::model::write_random_block_drafter(
        specactor::model::read_model_info(*specactor::model::GgufFile::open(p)), spec, rank ? spark : block);
  }
  const std::vector<std::string> dflash = {
      "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", block,
      "--speculative-num-steps", "3",      "--speculative-adaptive",         "false"};
  auto with = [](std::vector<std::string> a, std::vector<std::string> more) {
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  const auto [dflash_rej, drm] = histogram(with(dflash, {"--speculative-use-rejection-sampling"}));
  const auto [dflash_tgt, dtm] = histogram(dflash);
  // The same chain with a second first draft and a prompt-lookup branch merged in (a tree: target-only
  // sampling verifies it).
  const auto [dflash_br, dbm] =
      histogram(with(dflash, {"--speculative-eagle-topk", "2", "--speculative-draft-ngram-tokens", "3",
                              "--speculative-draft-ngram-min-match", "1"}));
  const auto [dspark_rej, srm] = histogram({"--speculative-algorithm", "DSPARK", "--speculative-draft-model-path",
                                            spark, "--speculative-num-steps", "3", "--speculative-adaptive", "false",
                                            "--speculative-use-rejection-sampling"});
  int df1 = 0, df2 = 0, df3 = 0, df4 = 0, df5 = 0, df6 = 0, df7 = 0;
  const double chi_rej = two_sample_chi2(plain, rejection, df1), chi_tgt = two_sample_chi2(plain, target_only, df2);
  const double chi_hyb = two_sample_chi2(plain, hybrid, df3);
  const double chi_drej = two_sample_chi2(plain, dflash_rej, df4), chi_dtgt = two_sample_chi2(plain, dflash_tgt, df5);
  MESSAGE("DFLASH: rejection sampling chi2 = " << chi_drej << " (df " << df4 << ", drafted " << drm.drafted
                                               << ", accepted " << drm.accepted << "); target-only chi2 = " << chi_dtgt
                                               << " (df " << df5 << ", accepted " << dtm.accepted << ")");
  CHECK(drm.accepted > 0);
  CHECK(dtm.drafted > 0);
  const double chi_dbr = two_sample_chi2(plain, dflash_br, df7);
  MESSAGE("DFLASH with a second first draft and a prompt-lookup branch: chi2 = "
          << chi_dbr << " (df " << df7 << ", drafted " << dbm.drafted << ", accepted " << dbm.accepted << ")");
  CHECK(dbm.drafted > dtm.drafted);  // the branch proposed nodes of its own
  const double chi_srej = two_sample_chi2(plain, dspark_rej, df6);
  MESSAGE("DSPARK: rejection sampling chi2 = " << chi_srej << " (df " << df6 << ", drafted " << srm.drafted
                                               << ", accepted " << srm.accepted << ")");
  CHECK(srm.accepted > 0);
  MESSAGE("head with a prompt-lookup branch: chi2 = " << chi_hyb << " (df " << df3 << ", drafted " << hm.drafted
                                                      << ", accepted " << hm.accepted << ")");
  CHECK(hm.drafted > 0);
  MESSAGE("third-token distribution vs plain sampling: rejection sampling chi2 = "
          << chi_rej << " (df " << df1 << ", drafted " << rm.drafted << ", accepted " << rm.accepted
          << "); target-only tree sampling chi2 = " << chi_tgt << " (df " << df2 << ", drafted " << tm.drafted
          << ", accepted " << tm.accepted << ")");
  CHECK(rm.accepted > 0);
  CHECK(tm.drafted > 0);
  // p = 0.001 critical value (Wilson–Hilferty approximation of the chi-square quantile).
  auto crit = [](int df) {
    const double a = 2.0 / (9.0 * df);
    return df * std::pow(1.0 - a + 3.0902 * std::sqrt(a), 3.0);
  };
  CHECK(chi_rej < crit(df1));
  CHECK(chi_tgt < crit(df2));
  CHECK(chi_hyb < crit(df3));
  CHECK(chi_drej < crit(df4));
  CHECK(chi_dtgt < crit(df5));
  CHECK(chi_srej < crit(df6));
  CHECK(chi_dbr < crit(df7));
  // Under penalties and a bias: plain sampling moves (the rules change the distribution), and rejection
  // and target-only sampling follow the moved one.
  const std::vector<std::string> standalone = {"--speculative-algorithm",
                                               "STANDALONE",
                                               "--speculative-draft-num-layers",
                                               "1",
                                               "--speculative-use-rejection-sampling",
                                               "--speculative-num-steps",
                                               "2",
                                               "--speculative-adaptive",
                                               "false"};
  const auto [plain_r, prm] = histogram({}, true);
  const auto [rejection_r, rrm] = histogram(standalone, true);
  const auto [target_r, trm] =
      histogram({"--speculative-algorithm", "NGRAM", "--speculative-num-steps", "2", "--speculative-eagle-topk", "2",
                 "--speculative-num-draft-tokens", "4", "--speculative-adaptive", "false"},
                true);
  int dr0 = 0, dr1 = 0, dr2 = 0;
  const double chi_moved = two_sample_chi2(plain, plain_r, dr0);
  const double chi_rej_r = two_sample_chi2(plain_r, rejection_r, dr1),
               chi_tgt_r = two_sample_chi2(plain_r, target_r, dr2);
  MESSAGE("with penalties: plain moved by chi2 = " << chi_moved << " (df " << dr0 << "); rejection chi2 = " << chi_rej_r
                                                   << " (df " << dr1 << ", accepted " << rrm.accepted
                                                   << "); target-only chi2 = " << chi_tgt_r << " (df " << dr2
                                                   << ", drafted " << trm.drafted << ")");
  CHECK(chi_moved > crit(dr0));
  CHECK(rrm.accepted > 0);
  CHECK(trm.drafted > 0);
  CHECK(chi_rej_r < crit(dr1));
  CHECK(chi_tgt_r < crit(dr2));
  fs::remove_all(block);
  fs::remove_all(spark);
  fs::remove(head);
  fs::remove(p);
}

TEST_CASE("NGRAM drafter: matches in the sequence, in an external corpus, and trie proposals") {
  if (!fs::exists(kDefaultModel)) {
    SKIP_CASE("no default model", "models/SmolLM2-135M-Instruct.Q4_1.gguf is not fetched (run tools/setup)");
  }
  specactor::config::ServerArgs args;
  args.model_path = kDefaultModel;
  args.skip_tokenizer_init = false;
  const auto file = specactor::model::GgufFile::open(kDefaultModel);
  const DraftContext ctx{specactor::model::read_model_info(*file), specactor::model::Tokenizer::from_gguf(*file),
                         nullptr, nullptr};
  const auto& tok = *ctx.tokenizer;

  const std::string corpus =
      (fs::temp_directory_path() / ("specactor_corpus." + std::to_string(::getpid()) + ".txt")).string();
  std::ofstream(corpus) << "The actor model treats actors as the universal primitives of concurrent computation.\n";
  args.speculative_algorithm = specactor::config::SpecAlgorithm::Ngram;
  args.speculative_ngram_corpus_path = corpus;
  args.speculative_ngram_min_match_window_size = 2;
  const auto snap = specactor::config::freeze(args);
  auto drafter = find_drafter(snap)(snap, ctx);

  // Not in the sequence, but in the corpus: the corpus continuation is proposed.
  const auto prefix = tok.encode("We know that the actor model treats actors as the");
  const auto whole = tok.encode("The actor model treats actors as the universal primitives");
  const DraftTree t = drafter->propose(1, prefix, 4, 4);
  REQUIRE(!t.tokens.empty());
  const std::vector<std::int32_t> want(whole.end() - 3, whole.end());
  CHECK(std::vector<std::int32_t>(t.tokens.begin(), t.tokens.begin() + std::min<std::size_t>(3, t.tokens.size())) ==
        std::vector<std::int32_t>(want.begin(), want.begin() + std::min<std::size_t>(3, t.tokens.size())));
  CHECK(t.parents.front() == -1);

  // A match inside the sequence itself (prompt lookup), as a chain.
  const auto rep = tok.encode("one two three four five. one two three");
  const DraftTree c = drafter->propose(2, rep, 3, 3);
  REQUIRE(c.tokens.size() == 3);
  CHECK(tok.decode(c.tokens) == " four five.");
  CHECK(c.parents == std::vector<std::int32_t>{-1, 0, 1});

  // topk > 1: several continuations share the root in a trie (parents before children).
  args.speculative_ngram_corpus_path.reset();
  args.speculative_eagle_topk = 3;
  args.speculative_num_steps = 3;
  args.speculative_num_draft_tokens = 8;
  const auto snap3 = specactor::config::freeze(args);
  auto trie = find_drafter(snap3)(snap3, ctx);
  const auto branches = tok.encode("red apple. red car. red sky. red");
  const DraftTree tr = trie->propose(3, branches, 7, 3);
  int roots = 0;
  for (std::size_t i = 0; i < tr.parents.size(); ++i) {
    CHECK(tr.parents[i] < static_cast<std::int32_t>(i));
    roots += tr.parents[i] == -1;
  }
  CHECK(roots >= 2);
  fs::remove(corpus);
}
