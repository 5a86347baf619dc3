// tests/test_block_drafter.cpp — the DFLASH and DSPARK block drafters on their own: malformed drafters
// are refused at load naming the field, and their drafts (and logits, and DSPARK's confidences) equal an
// independent numpy forward (training/dflash_reference.py, float64) of the same random drafter on the
// same target features.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "config/error.hpp"
#include "config/snapshot.hpp"
#include "drafters/drafter.hpp"
#include "kernels/cpu/sampling.hpp"
#include "model/block_drafter.hpp"
#include "model/gguf.hpp"
#include "model/loader.hpp"
#include "model/writers.hpp"
#include "tests/support/draft_tree.hpp"
#include "tests/support/gguf_writer.hpp"
#include "tests/support/skip.hpp"

namespace fs = std::filesystem;
namespace sm = specactor::model;
namespace sc = specactor::config;
using nlohmann::json;

namespace {

struct Scratch {
  fs::path dir;
  Scratch() {
    dir = fs::temp_directory_path() / ("specactor_block." + std::to_string(::getpid()));
    fs::create_directories(dir);
  }
  ~Scratch() { fs::remove_all(dir); }
};

// The tiny target (vocabulary 96, hidden 32, 2 layers, context 128), loaded.
sm::LoadedModel tiny_target(const fs::path& dir) {
  specactor::testing::TinyLlamaShape s;
  s.vocab = 96;
  const std::string p = (dir / "tiny.gguf").string();
  specactor::testing::tiny_llama(s, true, 7).write(p);
  sc::ServerArgs a;
  a.model_path = p;
  return sm::load_model(*sc::freeze(a));
}

// A random drafter's spec: `layers` layers, a block of `block`, weights ~ N(0, scale²) from `seed`,
// DSPARK heads of rank `rank` when it is above 0.
sm::BlockDrafterSpec spec_of(std::int64_t layers, std::int64_t block, std::uint32_t seed, float scale,
                             std::int64_t rank) {
  sm::BlockDrafterSpec spec;
  spec.layers = layers;
  spec.block_size = block;
  spec.seed = seed;
  spec.scale = scale;
  spec.markov_rank = rank;
  return spec;
}

// The settings a drafter test runs a block drafter at (DSPARK when rank > 0): the tiny target, pages
// of 4, 256 tokens of KV, a context of 128.
sc::ServerArgs block_args(const sm::LoadedModel& t, const std::string& path, std::int64_t rank) {
  sc::ServerArgs a;
  a.model_path = t.info.path;
  a.speculative_algorithm = rank > 0 ? sc::SpecAlgorithm::Dspark : sc::SpecAlgorithm::Dflash;
  a.speculative_draft_model_path = path;
  a.page_size = 4;
  a.max_total_tokens = 256;
  a.context_length = 128;
  return a;
}

std::string drafter(const sm::LoadedModel& t, const fs::path& dir, const std::string& name, const std::string& patch,
                    std::int64_t layers = 1, std::int64_t block = 4) {
  sm::BlockDrafterSpec spec;
  spec.layers = layers;
  spec.block_size = block;
  spec.seed = 21;
  spec.scale = 0.3f;
  spec.config_patch = patch;
  const std::string p = (dir / name).string();
  sm::write_random_block_drafter(t.info, spec, p);
  return p;
}

}  // namespace

TEST_CASE("DFLASH files: a malformed drafter is refused at load with one error naming the field") {
  Scratch s;
  const sm::LoadedModel t = tiny_target(s.dir);
  const std::int64_t ctx = 128;
  struct Case {
    std::string patch, expect;
    std::int64_t context = 128;
  };
  const std::vector<Case> cases = {
      {R"({"hidden_size": 64})", "'hidden_size' is 64 but the target's hidden size is 32"},
      {R"({"dflash_config": {"target_layer_ids": [0, 5]}})",
       "'target_layer_ids' holds 5; the target has layers 0 to 1"},
      {R"({"dflash_config": {"block_size": 0}})", "'block_size' must be an integer in [2, 64]"},
      {R"({"dflash_config": {"block_size": 65}})", "'block_size' must be an integer in [2, 64]"},
      {R"({"dflash_config": {"block_size": 16}})", "'block_size' is 16, beyond the context length of 8", 8},
      {R"({"dflash_config": {"mask_token_id": null}})", "'mask_token_id' is missing"},
      {R"({"dflash_config": {"mask_token_id": 96}})",
       "'mask_token_id' must be a token id below the target's "
       "vocabulary of 96, got 96"},
      {R"({"vocab_size": 100})", "'vocab_size' is 100 but the target's vocabulary has 96 tokens"},
      {R"({"architectures": ["DFlash2DraftModel"]})", "'architectures' is DFlash2DraftModel"},
      {R"({"architectures": ["LlamaForCausalLM"]})", "'architectures' must name DFlashDraftModel"},
      {R"({"layer_types": ["sliding_attention"]})", "'layer_types' holds \"sliding_attention\""},
      {R"({"num_hidden_layers": 0})", "'num_hidden_layers' must be at least 1"},
      {R"({"dflash_config": {"target_layer_ids": []}})", "'target_layer_ids' must be a non-empty array"},
      {R"({"dflash_config": {"markov_first_row": false}})", "'markov_first_row' is a DSPARK setting"},
  };
  int i = 0;
  for (const Case& c : cases) {
    CAPTURE(c.patch);
    const std::string p = drafter(t, s.dir, "bad" + std::to_string(i++), c.patch);
    CHECK_THROWS_WITH_AS(sm::BlockDraftWeights::load(p, t.config, c.context, sc::LoadFormat::Auto),
                         doctest::Contains(c.expect.c_str()), sm::GgufError);
  }
  // A well-formed one loads; a GGUF load format is refused; a missing tensor is named.
  const std::string good = drafter(t, s.dir, "good", "");
  CHECK(sm::BlockDraftWeights::load(good, t.config, ctx, sc::LoadFormat::Auto)->config().block_size == 4);
  CHECK_THROWS_WITH_AS(sm::BlockDraftWeights::load(good, t.config, ctx, sc::LoadFormat::Gguf),
                       doctest::Contains("--speculative-draft-load-format gguf"), sm::GgufError);
  CHECK(sm::BlockDraftWeights::load(good, t.config, ctx, sc::LoadFormat::Auto)->config().mask_token_id == 95);
  const std::string two = drafter(t, s.dir, "two", R"({"num_hidden_layers": 2})");  // tensors for 1 layer only
  CHECK_THROWS_WITH_AS(sm::BlockDraftWeights::load(two, t.config, ctx, sc::LoadFormat::Auto),
                       doctest::Contains("layers.1.input_layernorm.weight"), sm::GgufError);
}

TEST_CASE(
    "DSPARK files: a malformed drafter is refused naming the field, and the algorithm must match the checkpoint") {
  Scratch s;
  const sm::LoadedModel t = tiny_target(s.dir);
  auto dspark = [&](const std::string& name, const std::string& patch) {
    sm::BlockDrafterSpec spec;
    spec.block_size = 4;
    spec.markov_rank = 8;
    spec.config_patch = patch;
    const std::string p = (s.dir / name).string();
    sm::write_random_block_drafter(t.info, spec, p);
    return p;
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"dspark_config": {"markov_rank": null}})", "'markov_rank' must be an integer in [1, 4096]"},
      {R"({"dspark_config": {"markov_rank": 0}})", "'markov_rank' must be an integer in [1, 4096]"},
      {R"({"dspark_config": {"markov_rank": 16}})", "tensor 'markov_head.w1.weight'"},  // the file holds rank 8
      {R"({"dspark_config": {"mask_token_id": null}})", "'mask_token_id' is missing"},
      {R"({"hidden_size": 48})", "'hidden_size' is 48 but the target's hidden size is 32"},
      {R"({"dspark_config": {"markov_first_row": 0}})", "'markov_first_row' must be true or false, got 0"},
  };
  int i = 0;
  for (const auto& c : cases) {
    const std::string patch = c.first, expect = c.second;  // plain variables: CAPTURE's lambda takes them (Clang 14)
    CAPTURE(patch);
    CHECK_THROWS_WITH_AS(
        sm::BlockDraftWeights::load(dspark("bad" + std::to_string(i++), patch), t.config, 128, sc::LoadFormat::Auto),
        doctest::Contains(expect.c_str()), sm::GgufError);
  }
  const std::string good = dspark("good", "");
  const auto w = sm::BlockDraftWeights::load(good, t.config, 128, sc::LoadFormat::Auto);
  CHECK(w->config().dspark);
  CHECK(w->config().markov_rank == 8);
  CHECK(w->config().markov_first_row);  // the default
  CHECK(w->config().to_json()["kind"] == "DSPARK");
  CHECK_FALSE(sm::BlockDraftWeights::load(dspark("first", R"({"dspark_config": {"markov_first_row": false}})"),
                                          t.config, 128, sc::LoadFormat::Auto)
                  ->config()
                  .markov_first_row);
  // The algorithm must name what the checkpoint is: one error naming the flag either way.
  sm::BlockDrafterSpec plain;
  plain.block_size = 4;
  const std::string dflash = (s.dir / "dflash").string();
  sm::write_random_block_drafter(t.info, plain, dflash);
  for (const auto& t2 : {std::tuple{sc::SpecAlgorithm::Dflash, good, "is a DSPARK drafter"},
                         std::tuple{sc::SpecAlgorithm::Dspark, dflash, "is a DFLASH drafter"}}) {
    const sc::SpecAlgorithm algo = std::get<0>(t2);
    const std::string path = std::get<1>(t2);
    const char* expect = std::get<2>(t2);
    sc::ServerArgs a;
    a.model_path = t.info.path;
    a.speculative_algorithm = algo;
    a.speculative_draft_model_path = path;
    a.max_total_tokens = 256;
    const std::string name(sc::to_string(sc::Algorithm(algo)));
    CHECK_THROWS_WITH(specactor::drafters::find_drafter(name)(sc::freeze(a), {t.info, t.tokenizer, t.weights, nullptr}),
                      doctest::Contains(expect));
  }
}

namespace {

// The drafter's KV of `n` context rows (float32), filled through the runner: what the drafter's own
// catch-up does, written out here so the runner's logits can be compared.
std::vector<float> runner_logits(const std::shared_ptr<const sm::BlockDraftWeights>& w,
                                 const std::shared_ptr<const sm::LlamaWeights>& target, const std::vector<float>& feat,
                                 const std::vector<std::int32_t>& tokens, std::int64_t rows = 0,
                                 bool markov_first = false) {
  const auto& c = w->config();
  if (rows <= 0) rows = c.block_size;
  const auto n = static_cast<std::int64_t>(tokens.size());
  sm::BlockDraftRunner r(w, target, specactor::kernels::Precision::Exact);
  sm::KvCache kv(c.n_layers, c.n_kv_heads, c.head_dim, 4, 256, true, specactor::kernels::KvType::F32);
  sm::KvCache::Seq seq;
  kv.reserve(seq, n - 1);
  std::vector<std::int32_t> pos(static_cast<std::size_t>(n - 1));
  for (std::int64_t i = 0; i < n - 1; ++i) pos[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);
  r.context(feat.data(), n - 1, pos.data());
  for (std::int64_t l = 0; l < c.n_layers; ++l)
    for (std::int64_t i = 0; i < n - 1; ++i)
      kv.write(l, seq, i, r.ctx_k(static_cast<int>(l)) + i * c.kv_row(), r.ctx_v(static_cast<int>(l)) + i * c.kv_row());
  seq.length = n - 1;
  std::vector<specactor::kernels::KvSegment> prefix;
  for (std::int64_t l = 0; l < c.n_layers; ++l) prefix.push_back({kv.view(l, seq), 0, n - 1});
  std::vector<std::int32_t> block(static_cast<std::size_t>(rows), c.mask_token_id);
  block[0] = tokens.back();
  std::vector<float> logits;
  r.block(block.data(), rows, n - 1, prefix, logits);
  if (markov_first) r.markov(tokens.back(), 0, logits.data());  // DSPARK: the first row as its drafts see it
  kv.release(seq);
  return logits;
}

sm::HfTensor rows_of(const specactor::kernels::WeightMatrix& m) {
  sm::HfTensor t{{static_cast<std::uint64_t>(m.out_dim), static_cast<std::uint64_t>(m.in_dim)}, {}};
  t.values.resize(static_cast<std::size_t>(m.out_dim * m.in_dim));
  for (std::int64_t r = 0; r < m.out_dim; ++r) specactor::kernels::weight_row(m, r, t.values.data() + r * m.in_dim);
  return t;
}

// A proposal's drafts against one reference entry, and their scores: DSPARK's, the product of the
// reference's confidences up to each draft; DFLASH's, the product of each row's softmax at its draft
// (the argmax of the reference's logits). Returns the entry's closest call between its best two logits.
double check_drafts(const specactor::drafters::DraftTree& tree, const json& r, bool dspark) {
  double closest = 1e9;
  for (double m : r["margins"].get<std::vector<double>>()) closest = std::min(closest, m);
  CHECK(closest > 1e-4);  // no near-tie between the reference's best two logits: the drafts are comparable
  CHECK(tree.tokens == r["tokens"].get<std::vector<std::int32_t>>());
  std::vector<double> factors;
  if (dspark) {
    factors = r["confidences"].get<std::vector<double>>();
  } else {
    for (const auto& row : r["logits"]) {
      const auto l = row.get<std::vector<double>>();
      const double top = *std::max_element(l.begin(), l.end());
      double sum = 0;
      for (const double x : l) sum += std::exp(x - top);
      factors.push_back(1.0 / sum);
    }
  }
  REQUIRE(tree.scores.size() == factors.size());
  double survival = 1.0;
  for (std::size_t i = 0; i < factors.size(); ++i) {
    survival *= factors[i];
    CHECK(std::abs(tree.scores[i] - survival) < 1e-5);
  }
  return closest;
}

// One random drafter against the numpy reference: features handed over in two parts, a proposal after
// each; the drafts through the drafter, the logits through the runner.
void check_against_reference(const std::string& python, const sm::LoadedModel& t, const std::string& path,
                             const fs::path& case_dir) {
  const auto w = sm::BlockDraftWeights::load(path, t.config, 128, sc::LoadFormat::Auto);
  const auto& c = w->config();
  const bool dspark = c.dspark;
  // Context: 14 tokens; features of the 13 committed ones; first proposal after 6 tokens.
  std::mt19937 rng(5);
  std::uniform_int_distribution<std::int32_t> tok(0, 94);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  std::vector<std::int32_t> tokens(14);
  for (auto& x : tokens) x = tok(rng);
  std::vector<float> feat(static_cast<std::size_t>(13 * c.feature_width()));
  for (auto& x : feat) x = gauss(rng);
  const std::vector<std::size_t> contexts = {6, 14};
  fs::create_directories(case_dir);
  sm::write_safetensors((case_dir / "target.safetensors").string(),
                        {{"embed", rows_of(t.weights->embedding())}, {"output", rows_of(t.weights->output())}});
  sm::write_safetensors((case_dir / "features.safetensors").string(),
                        {{"features", sm::HfTensor{{13, static_cast<std::uint64_t>(c.feature_width())}, feat}}});
  std::ofstream(case_dir / "case.json")
      << json{{"drafter", path}, {"tokens", tokens}, {"contexts", contexts}, {"short_rows", 3}}.dump();
  const std::string cmd = python + " " SPECACTOR_SOURCE_DIR "/training/dflash_reference.py " + case_dir.string() +
                          " > " + (case_dir / "log").string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream log_in(case_dir / "log");
  const std::string log((std::istreambuf_iterator<char>(log_in)), std::istreambuf_iterator<char>());
  REQUIRE_MESSAGE(rc == 0, log);
  const json ref = json::parse(std::ifstream(case_dir / "reference.json"));

  // Through the drafter: features handed over in two parts, a proposal after each.
  sc::ServerArgs a = block_args(t, path, dspark ? 1 : 0);
  a.cpu_precision = sc::CpuPrecision::Exact;
  a.kv_cache_dtype = "float32";
  a.speculative_num_steps = c.block_size - 1;  // the whole block (resolution caps the steps at it)
  auto d = specactor::drafters::find_drafter(dspark ? "DSPARK" : "DFLASH")(sc::freeze(a),
                                                                           {t.info, t.tokenizer, t.weights, nullptr});
  bool markov_moved = false;  // DSPARK: the Markov term changed some draft from the backbone's argmax
  const std::vector<std::int32_t> no_pages;
  std::size_t handed = 0;
  for (std::size_t k = 0; k < contexts.size(); ++k) {
    const std::size_t n = contexts[k];
    CAPTURE(n);
    const json& r = ref["contexts"][k];
    const std::vector<float> part(feat.begin() + static_cast<long>(handed * c.feature_width()),
                                  feat.begin() + static_cast<long>((n - 1) * c.feature_width()));
    d->observe(1, {part, static_cast<std::int64_t>(handed), no_pages, 0});
    handed = n - 1;
    const std::vector<std::int32_t> ctx(tokens.begin(), tokens.begin() + static_cast<long>(n));
    const auto tree = d->propose(1, ctx, 63, 63);
    const double closest = check_drafts(tree, r, dspark);
    CHECK(tree.parents == std::vector<std::int32_t>{-1, 0, 1, 2, 3});
    if (dspark) {
      const auto base = r["base_logits"].get<std::vector<std::vector<double>>>();
      for (std::size_t i = 0; i < base.size(); ++i) {
        const auto best = std::max_element(base[i].begin(), base[i].end()) - base[i].begin();
        const auto mine = std::max_element(r["logits"][i].begin(), r["logits"][i].end()) - r["logits"][i].begin();
        markov_moved = markov_moved || best != mine;
      }
    }
    // The runner's logits (the backbone's), row by row.
    const std::vector<float> got = runner_logits(w, t.weights, feat, ctx);
    const auto ref_logits = r[dspark ? "base_logits" : "logits"].get<std::vector<std::vector<double>>>();
    const std::size_t V = ref_logits.at(0).size();
    REQUIRE(got.size() == ref_logits.size() * V);
    double worst = 0;
    for (std::size_t i = 0; i < ref_logits.size(); ++i)
      for (std::size_t v = 0; v < V; ++v) worst = std::max(worst, std::abs(got[i * V + v] - ref_logits[i][v]));
    MESSAGE("context " << n << ": drafts " << json(tree.tokens).dump() << ", largest logit difference " << worst
                       << ", closest call " << closest);
    CHECK(worst < 1e-5);
    if (dspark && !c.markov_first_row) {  // the first draft is the backbone's argmax (the runner's row 1)
      const auto col = std::max_element(got.begin(), got.begin() + static_cast<long>(V)) - got.begin();
      CHECK(tree.tokens.at(0) == (c.draft_vocab.empty() ? col : c.draft_vocab[static_cast<std::size_t>(col)]));
    }
  }
  if (dspark) CHECK(markov_moved);
  // A depth below the block runs a block of that many rows and the root (3 here): the reference's
  // forward over 3 rows, not the first drafts of the whole block.
  const json& short_ref = ref["contexts"][2];
  REQUIRE(short_ref["rows"] == 3);
  check_drafts(d->propose(1, tokens, 63, 2), short_ref, dspark);
}

}  // namespace

TEST_CASE(
    "DFLASH and DSPARK forward: drafts, logits and confidences equal the numpy reference "
    "(training/dflash_reference.py)") {
  const std::string python = SPECACTOR_SOURCE_DIR "/.venv-train/bin/python";
  if (!fs::exists(python))
    SKIP_CASE("no training venv", "the numpy reference runs in .venv-train (training/train-venv)");
  Scratch s;
  const sm::LoadedModel t = tiny_target(s.dir);
  // Two layers, a block of 6, softcapped and scaled logits: every optional step of the forward; once over
  // the whole vocabulary, once over a draft vocabulary of 40 ids; DFLASH, then DSPARK (Markov rank 8),
  // then DSPARK without the first row's Markov term (markov_first_row false).
  struct Kind {
    std::int64_t rank;
    bool first_row;
  };
  for (const Kind kind : {Kind{0, true}, Kind{8, true}, Kind{8, false}})
    for (const std::int64_t vocab : {0, 40}) {
      const std::int64_t rank = kind.rank;
      const bool first_row = kind.first_row;
      CAPTURE(vocab);
      CAPTURE(rank);
      CAPTURE(first_row);
      sm::BlockDrafterSpec spec = spec_of(2, 6, 21, 0.3f, rank);
      spec.draft_vocab = vocab;
      spec.config_patch = R"({"dflash_config": {"output_multiplier": 0.7, "final_logit_softcapping": 9.0,
                            "input_embedding_scale": 1.5}})";
      if (!first_row)
        spec.config_patch = R"({"dflash_config": {"output_multiplier": 0.7, "final_logit_softcapping": 9.0,
                              "input_embedding_scale": 1.5}, "dspark_config": {"markov_first_row": false}})";
      const std::string name = std::to_string(vocab) + "_" + std::to_string(rank) + (first_row ? "" : "_nofirst");
      const std::string path = (s.dir / ("drafter" + name)).string();
      sm::write_random_block_drafter(t.info, spec, path);
      check_against_reference(python, t, path, s.dir / ("case" + name));
    }
}

TEST_CASE(
    "DFLASH and DSPARK: the chain keeps to --speculative-num-steps, and a prompt-lookup branch is merged into it") {
  Scratch s;
  const sm::LoadedModel t = tiny_target(s.dir);
  // 12 distinct tokens, then the first 5 again: the last 5 recur, followed by tokens 5..11.
  std::vector<std::int32_t> toks;
  for (int k = 0; k < 12; ++k) toks.push_back((k * 11 + 4) % 90 + 3);
  for (int k = 0; k < 5; ++k) toks.push_back(toks[static_cast<std::size_t>(k)]);
  for (const std::int64_t rank : {0, 8}) {
    CAPTURE(rank);
    sm::BlockDrafterSpec spec;
    spec.layers = 1;
    spec.block_size = 8;
    spec.seed = 4;
    spec.markov_rank = rank;
    const std::string path = (s.dir / ("branch" + std::to_string(rank))).string();
    sm::write_random_block_drafter(t.info, spec, path);
    const auto w = sm::BlockDraftWeights::load(path, t.config, 128, sc::LoadFormat::Auto);
    sc::ServerArgs a = block_args(t, path, rank);
    a.cpu_precision = sc::CpuPrecision::Exact;  // the runner's logits below are the drafter's, to the bit
    a.kv_cache_dtype = "float32";
    a.speculative_num_steps = 2;
    a.speculative_draft_ngram_tokens = 0;
    auto d = specactor::drafters::find_drafter(rank > 0 ? "DSPARK" : "DFLASH")(
        sc::freeze(a), {t.info, t.tokenizer, t.weights, nullptr});
    std::mt19937 rng(3);
    std::normal_distribution<float> gauss(0.0f, 1.0f);
    std::vector<float> feat(static_cast<std::size_t>((toks.size() - 1) * w->config().feature_width()));
    for (auto& x : feat) x = gauss(rng);
    const std::vector<std::int32_t> no_pages;
    d->observe(1, {feat, 0, no_pages, 0});
    // The scheduler's budget with a branch of 4: 2 + 4 nodes, depth max(2, 4). Without the branch the
    // chain has the 2 steps, not the 4 the depth would allow.
    const specactor::drafters::DraftTree chain = d->propose(1, toks, 6, 4);
    REQUIRE(chain.tokens.size() == 2);
    CHECK(chain.parents == std::vector<std::int32_t>{-1, 0});
    CHECK(chain.scores.size() == 2u);  // DSPARK: confidences; DFLASH: path probabilities
    a.speculative_draft_ngram_tokens = 4;
    d->reconfigure(sc::freeze(a));
    const specactor::drafters::DraftTree both = d->propose(1, toks, 6, 4);
    // The chain first, unchanged; then the branch toks[5..8] below the root, through a chain node
    // that drafted the same token.
    REQUIRE(both.tokens.size() > 2);
    CHECK(both.tokens.size() <= 6);
    CHECK(std::vector<std::int32_t>(both.tokens.begin(), both.tokens.begin() + 2) == chain.tokens);
    CHECK(std::vector<std::int32_t>(both.parents.begin(), both.parents.begin() + 2) == chain.parents);
    // The branch's last node is 4 deep, beyond the chain's 2 steps.
    CHECK(specactor::testing::path_depth(both, std::vector<std::int32_t>(toks.begin() + 5, toks.begin() + 9)) == 4);
    // The chain keeps its scores; the branch's own nodes have none (-1).
    REQUIRE(both.scores.size() == both.tokens.size());
    CHECK(std::vector<float>(both.scores.begin(), both.scores.begin() + 2) == chain.scores);
    for (std::size_t j = 2; j < both.scores.size(); ++j) CHECK(both.scores[j] == -1.0f);
    // The budget bounds it: 3 nodes in all leave the branch 1.
    CHECK(d->propose(1, toks, 3, 4).tokens.size() == 3);
    // --speculative-eagle-topk 3: the chain, then the first row's next two likeliest tokens as leaves
    // below the root (DSPARK: after the root's Markov term, and without a confidence of their own).
    a.speculative_draft_ngram_tokens = 0;
    a.speculative_eagle_topk = 3;
    d->reconfigure(sc::freeze(a));
    const specactor::drafters::DraftTree wide = d->propose(1, toks, 6, 4);
    REQUIRE(wide.tokens.size() == 4);
    CHECK(std::vector<std::int32_t>(wide.tokens.begin(), wide.tokens.begin() + 2) == chain.tokens);
    CHECK(wide.parents == std::vector<std::int32_t>{-1, 0, -1, -1});
    {  // the first row (DSPARK: with the root's Markov term), ranked: the argmax, then the two leaves
      const std::vector<float> logits = runner_logits(w, t.weights, feat, toks, 3, rank > 0);  // the root and 2 rows
      std::vector<std::int32_t> order(96);
      for (std::int32_t j = 0; j < 96; ++j) order[static_cast<std::size_t>(j)] = j;
      std::stable_sort(order.begin(), order.end(), [&](std::int32_t x, std::int32_t y) {
        return logits[static_cast<std::size_t>(x)] > logits[static_cast<std::size_t>(y)];
      });
      CHECK(wide.tokens[0] == order[0]);
      CHECK(wide.tokens[2] == order[1]);
      CHECK(wide.tokens[3] == order[2]);
      double sum = 0;
      for (std::int32_t j = 0; j < 96; ++j) sum += std::exp(static_cast<double>(logits[static_cast<std::size_t>(j)]));
      auto prob = [&](std::size_t j) {
        return std::exp(static_cast<double>(logits[static_cast<std::size_t>(wide.tokens[j])])) / sum;
      };
      REQUIRE(wide.scores.size() == 4);
      if (rank == 0) {  // DFLASH: scored by their probabilities in the first row, as the first draft is
        for (const std::size_t j : {0, 2, 3}) CHECK(wide.scores[j] == doctest::Approx(prob(j)).epsilon(1e-4));
      } else {  // DSPARK: what the first draft's confidence leaves, split as the row splits the rest
        const double c1 = wide.scores[0];
        CHECK(c1 > 0.0);
        CHECK(c1 < 1.0);
        for (const std::size_t j : {2, 3})
          CHECK(wide.scores[j] == doctest::Approx((1.0 - c1) * prob(j) / (1.0 - prob(0))).epsilon(1e-4));
        CHECK(wide.scores[2] >= wide.scores[3]);
      }
    }
    CHECK(d->propose(1, toks, 3, 4).tokens.size() == 3);  // the budget leaves one leaf
  }
}

TEST_CASE("DFLASH and DSPARK: context rows taken in with a block equal those taken in before it, bit for bit") {
  Scratch s;
  const sm::LoadedModel t = tiny_target(s.dir);
  namespace k = specactor::kernels;
  for (const std::int64_t rank : {0, 8})
    for (const k::Precision precision : {k::Precision::Exact, k::Precision::Fast}) {
      CAPTURE(rank);
      CAPTURE(k::precision_name(precision));
      const sm::BlockDrafterSpec spec = spec_of(2, 6, 9, 0.3f, rank);
      const std::string path = (s.dir / ("fresh" + std::to_string(rank))).string();
      sm::write_random_block_drafter(t.info, spec, path);
      const auto w =
          sm::BlockDraftWeights::load(path, t.config, 128, sc::LoadFormat::Auto,
                                      precision == k::Precision::Fast ? k::WeightType::Q8_0 : k::WeightType::F32);
      const auto& c = w->config();
      const std::int64_t n = 31, row = c.kv_row();  // 30 committed positions, the root at 30
      std::mt19937 rng(11);
      std::normal_distribution<float> gauss(0.0f, 1.0f);
      std::vector<float> feat(static_cast<std::size_t>((n - 1) * c.feature_width()));
      for (auto& x : feat) x = gauss(rng);
      std::vector<std::int32_t> pos(static_cast<std::size_t>(n - 1));
      for (std::int64_t i = 0; i < n - 1; ++i) pos[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);
      std::vector<std::int32_t> block(4, c.mask_token_id);
      block[0] = 17;
      // The runner: all 30 rows through context(), or 20 there and the last 10 with the block.
      auto run = [&](std::int64_t before, std::vector<float>& first, std::vector<float>& again) {
        sm::BlockDraftRunner r(w, t.weights, precision);
        sm::KvCache kv(c.n_layers, c.n_kv_heads, c.head_dim, 4, 256, true, k::KvType::F16);
        sm::KvCache::Seq seq;
        kv.reserve(seq, n - 1);
        r.context(feat.data(), before, pos.data());
        for (std::int64_t l = 0; l < c.n_layers; ++l)
          for (std::int64_t i = 0; i < before; ++i)
            kv.write(l, seq, i, r.ctx_k(static_cast<int>(l)) + i * row, r.ctx_v(static_cast<int>(l)) + i * row);
        std::vector<k::KvSegment> prefix;
        for (std::int64_t l = 0; l < c.n_layers; ++l) prefix.push_back({kv.view(l, seq), 0, n - 1});
        const sm::BlockDraftRunner::FreshContext fresh{
            feat.data() + before * c.feature_width(), n - 1 - before, pos.data() + before,
            [&](int l, const float* kk, const float* vv) {
              for (std::int64_t i = before; i < n - 1; ++i)
                kv.write(l, seq, i, kk + (i - before) * row, vv + (i - before) * row);
            }};
        r.block(block.data(), 4, n - 1, prefix, first, before < n - 1 ? &fresh : nullptr);
        r.block(block.data(), 4, n - 1, prefix, again);  // what the KV now holds, read back
        kv.release(seq);
      };
      std::vector<float> a1, a2, b1, b2;
      run(n - 1, a1, a2);
      run(20, b1, b2);
      CHECK(a1 == b1);
      CHECK(a2 == b2);
      CHECK(a1 == a2);
      // The drafter: 30 rows at once (a backlog past kMaxFresh, taken in before the block), or in
      // parts of 10 (each with its block): the same drafts and scores.
      sc::ServerArgs a = block_args(t, path, rank);
      a.cpu_precision = precision == k::Precision::Fast ? sc::CpuPrecision::Fast : sc::CpuPrecision::Exact;
      a.speculative_num_steps = 3;
      a.speculative_eagle_topk = 2;
      a.speculative_draft_ngram_tokens = 0;
      std::vector<std::int32_t> toks(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i)
        toks[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((i * 7 + 3) % 90);
      const std::vector<std::int32_t> no_pages;
      auto drafter_of = [&] {
        return specactor::drafters::find_drafter(rank > 0 ? "DSPARK" : "DFLASH")(
            sc::freeze(a), {t.info, t.tokenizer, t.weights, nullptr});
      };
      auto whole = drafter_of();
      whole->observe(1, {feat, 0, no_pages, 0});
      const auto once = whole->propose(1, toks, 5, 3);
      auto parts = drafter_of();
      specactor::drafters::DraftTree last;
      for (std::int64_t upto = 10; upto <= n - 1; upto += 10) {
        const std::vector<float> part(feat.begin() + (upto - 10) * c.feature_width(),
                                      feat.begin() + upto * c.feature_width());
        parts->observe(1, {part, upto - 10, no_pages, 0});
        last = parts->propose(1, std::vector<std::int32_t>(toks.begin(), toks.begin() + upto + 1), 5, 3);
        CHECK(last.tokens.size() == 4u);
      }
      CHECK(last.tokens == once.tokens);
      CHECK(last.parents == once.parents);
      CHECK(last.scores == once.scores);
    }
}

TEST_CASE("a shipped block drafter's measured settings come from its config.json, and a floor there is refused") {
  // The layout a checkout has: models/<stem>.gguf beside heads/<stem>-dflash.
  Scratch s;
  fs::create_directories(s.dir / "models");
  const sm::LoadedModel t = tiny_target(s.dir / "models");
  auto ship = [&](const std::string& defaults) {
    sm::BlockDrafterSpec spec;
    spec.block_size = 8;
    spec.seed = 2;
    spec.config_patch = R"({"specactor": {"defaults": )" + defaults + "}}";
    fs::remove_all(s.dir / "heads");
    sm::write_random_block_drafter(t.info, spec, (s.dir / "heads" / "tiny-dflash").string());
  };
  sc::ServerArgs a;
  a.model_path = (s.dir / "models" / "tiny.gguf").string();
  a.speculative_algorithm = sc::SpecAlgorithm::Dflash;
  ship(R"({"speculative_num_steps": 4, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 5,
           "speculative_draft_p_min": 0, "speculative_draft_ngram_tokens": 2, "speculative_draft_quantization": "q4_1"})");
  const sc::Snapshot r = sm::resolve_target(a).target;
  CHECK(*r->speculative_draft_model_path == fs::weakly_canonical(s.dir / "heads" / "tiny-dflash").string());
  CHECK(*r->speculative_num_steps == 4);
  CHECK(*r->speculative_draft_ngram_tokens == 2);
  CHECK(r->speculative_draft_quantization == "q4_1");
  ship(R"({"speculative_num_steps": 4, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 5,
           "speculative_draft_p_min": 0.2, "speculative_draft_ngram_tokens": 2, "speculative_draft_quantization": "q4_1"})");
  CHECK_THROWS_WITH_AS(sm::resolve_target(a),
                       doctest::Contains("specactor.defaults.speculative_draft_p_min: a block "
                                         "drafter takes no floor (a head drafter's setting); expected 0"),
                       sc::ConfigError);
}
