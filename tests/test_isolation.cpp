// tests/test_isolation.cpp — the config-isolation rules (docs/architecture.md, "Configuration snapshots") that need no
// actor, with a stub model (context length 4096), plus the derive() call-site ratchet.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "config/error.hpp"
#include "config/resolve.hpp"

using namespace specactor::config;
using json = nlohmann::json;

namespace {

const ModelFacts kStubModel{"llama", 4096, 49152, 576, 30, true, 0, 0, 0, {}, {}, {}};
const RuntimeFacts kCpuOnly{false, "test"};

Snapshot user_snapshot(std::vector<std::string> extra = {}) {
  std::vector<std::string> argv = {
      "--model-path",    "target.gguf", "--speculative-algorithm", "EAGLE", "--speculative-draft-model-path",
      "head.safetensors"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return freeze(parse_server_args(argv));
}

Snapshot resolved_target(std::vector<std::string> extra = {}) {
  return resolve_target(user_snapshot(std::move(extra)), kStubModel, kCpuOnly);
}

}  // namespace

TEST_CASE("the draft's context length follows the target model") {
  const Snapshot target = resolved_target();
  const Snapshot draft = derive_draft(target, kStubModel);
  CHECK(*draft->context_length == 4096);
  CHECK(*target->context_length == 4096);
}

TEST_CASE("the target snapshot is left alone when the draft is derived") {
  for (bool with_draft_format : {false, true}) {
    CAPTURE(with_draft_format);
    const Snapshot target =
        resolved_target(with_draft_format ? std::vector<std::string>{"--speculative-draft-load-format", "dummy"}
                                          : std::vector<std::string>{});
    const json before = settings_to_json(*target);
    const std::uint64_t hash_before = content_hash(*target);
    const auto log_before = override_log_json(*target);
    const ServerArgs* address_before = target.get();

    const Snapshot draft = derive_draft(target, kStubModel);

    CHECK(draft.get() != target.get());
    CHECK(target.get() == address_before);
    CHECK(settings_to_json(*target) == before);
    CHECK(content_hash(*target) == hash_before);
    CHECK(override_log_json(*target) == log_before);
    CHECK(target->model_path == "target.gguf");
    CHECK(target->load_format == LoadFormat::Auto);
    CHECK(draft->model_path == "head.safetensors");
  }
}

TEST_CASE("the draft load format applies only when configured") {
  SUBCASE("set to dummy") {
    const Snapshot target = resolved_target({"--speculative-draft-load-format", "dummy"});
    const Snapshot draft = derive_draft(target, kStubModel);
    CHECK(draft->load_format == LoadFormat::Dummy);
    CHECK(target->load_format == LoadFormat::Auto);
  }
  SUBCASE("unset") {
    const Snapshot target = resolved_target();
    const Snapshot draft = derive_draft(target, kStubModel);
    CHECK(draft->load_format == LoadFormat::Auto);
    CHECK_FALSE(draft->override_log.back().fields.contains("load_format"));
  }
  SUBCASE("unset, target gguf") {
    const Snapshot target = resolved_target({"--load-format", "gguf"});
    CHECK(derive_draft(target, kStubModel)->load_format == LoadFormat::Gguf);
  }
}

TEST_CASE("load-time decisions reach the draft, the parent keeps its value") {
  const Snapshot parent = resolved_target();
  const Snapshot loaded = derive(parent, "load.test_decision", {{"disable_chunked_prefix_cache", true}});
  const Snapshot draft = derive_draft(loaded, kStubModel);
  CHECK(draft->disable_chunked_prefix_cache);
  CHECK(loaded->disable_chunked_prefix_cache);
  CHECK_FALSE(parent->disable_chunked_prefix_cache);
}

TEST_CASE("draft-specific fields win over resolved ones") {
  const Snapshot loaded = derive(resolved_target(), "load.test_decision", {{"context_length", 128}});
  CHECK(*loaded->context_length == 128);
  const Snapshot draft = derive_draft(loaded, kStubModel);
  CHECK(*draft->context_length == 4096);

  const Snapshot with_backends =
      // (Values other than auto and the device's are refused as not supported yet: these are the
      // supported ones that still differ from the target's auto.)
      resolved_target({"--device", "cpu", "--prefill-attention-backend", "cpu", "--decode-attention-backend", "cpu",
                       "--speculative-draft-attention-backend", "cpu", "--speculative-draft-kv-cache-dtype",
                       "float32"});
  const Snapshot d2 = derive_draft(with_backends, kStubModel);
  CHECK(d2->attention_backend == "cpu");
  CHECK_FALSE(d2->prefill_attention_backend.has_value());
  CHECK_FALSE(d2->decode_attention_backend.has_value());
  CHECK(d2->kv_cache_dtype == "float32");
  CHECK(with_backends->attention_backend == "auto");
  CHECK(with_backends->prefill_attention_backend == "cpu");
  CHECK(with_backends->kv_cache_dtype == "float16");  // auto, resolved for the fast precision on the CPU
}

TEST_CASE("the override log names every source and field, in order, and prints as JSON") {
  const Snapshot target = resolved_target({"--tp-size", "1", "--speculative-draft-load-format", "dummy"});
  const Snapshot loaded = derive(target, "load.test_decision", {{"disable_chunked_prefix_cache", true}});
  const Snapshot draft = derive_draft(loaded, kStubModel);
  const json log = override_log_json(*draft);
  std::vector<std::string> sources;
  for (const auto& e : log) sources.push_back(e["source"]);
  CHECK(sources == std::vector<std::string>{"user.argv", "load.model_config", "auto.memory", "auto.device",
                                            "auto.kv_cache_dtype", "auto.speculative", "load.test_decision",
                                            "draft.per_runner"});
  CHECK(log[0]["fields"]["speculative_algorithm"] == "EAGLE");
  CHECK(log[0]["fields"]["tp_size"] == 1);
  CHECK(log[1]["fields"] == json{{"context_length", 4096}});
  CHECK(log[4]["fields"] == json{{"kv_cache_dtype", "float16"}});
  CHECK(log[5]["fields"] == json{{"speculative_num_steps", 5},
                                 {"speculative_eagle_topk", 4},
                                 {"speculative_num_draft_tokens", 8},
                                 {"speculative_draft_p_min", 0.0},
                                 {"speculative_draft_ngram_tokens", 0},
                                 {"speculative_draft_quantization", "q8_0"}});
  CHECK(log[6]["fields"] == json{{"disable_chunked_prefix_cache", true}});
  CHECK(log[7]["fields"] ==
        json{{"context_length", 4096}, {"load_format", "dummy"}, {"model_path", "head.safetensors"}});
  // The parent's log is a prefix of the child's and was not extended.
  CHECK(override_log_json(*target).size() == 6);
  CHECK(json::parse(to_json(*draft).dump())["override_log"] == log);
}

TEST_CASE("derive: bad fields are rejected and the parent never changes") {
  const Snapshot s = resolved_target();
  const std::uint64_t h = content_hash(*s);
  CHECK_THROWS_WITH_AS(derive(s, "load.x", {{"no_such_field", 1}}),
                       "derive(load.x) --no-such-field: unknown setting 'no_such_field'", ConfigError);
  CHECK_THROWS_WITH_AS(derive(s, "load.x", {{"tp_size", "2"}}),
                       "derive(load.x) --tp-size: expected an integer, got \"2\"", ConfigError);
  CHECK_THROWS_WITH_AS(derive(s, "load.x", {{"tp_size", 0}}), "--tp-size: must be in [1, 64] (got 0)", ConfigError);
  CHECK_THROWS_WITH_AS(derive(s, "", {{"tp_size", 2}}), doctest::Contains("needs a named source"), ConfigError);
  CHECK(content_hash(*s) == h);
  CHECK(derive(s, "load.nothing", json::object()).get() == s.get());
}

TEST_CASE("no draft without an algorithm") {
  const Snapshot plain = resolve_target(freeze(parse_server_args({"--model-path", "m.gguf"})), kStubModel, kCpuOnly);
  CHECK_THROWS_WITH_AS(derive_draft(plain, kStubModel), doctest::Contains("--speculative-algorithm is NONE"),
                       ConfigError);
}

TEST_CASE("every algorithm: target untouched, draft has the per-runner fields") {
  for (const char* algo :
       {"EAGLE", "EAGLE3", "NEXTN", "MTP", "FROZEN_KV_MTP", "STANDALONE", "NGRAM", "DFLASH", "DSPARK"}) {
    CAPTURE(algo);
    std::vector<std::string> argv = {
        "--model-path", "t.gguf", "--speculative-algorithm", algo, "--speculative-draft-load-format", "dummy"};
    if (std::string(algo) != "NGRAM") argv.insert(argv.end(), {"--speculative-draft-model-path", "d"});
    const Snapshot target = resolve_target(freeze(parse_server_args(argv)), kStubModel, kCpuOnly);
    const std::uint64_t h = content_hash(*target);
    const Snapshot draft = derive_draft(target, kStubModel);
    CHECK(content_hash(*target) == h);
    CHECK(target->load_format == LoadFormat::Auto);
    CHECK(draft->load_format == LoadFormat::Dummy);
    CHECK(*draft->context_length == 4096);
    CHECK(draft->model_path == (std::string(algo) == "NGRAM" ? "t.gguf" : "d"));
  }
}

// Rule 6: outside config/, snapshots are derived only at named, counted call sites.
TEST_CASE("ratchet: derive( call sites outside config/ match the recorded baseline") {
  namespace fs = std::filesystem;
  const fs::path root = SPECACTOR_SOURCE_DIR;
  const std::regex call(R"((^|[^A-Za-z0-9_])derive\s*\()");
  int count = 0;
  std::string where;
  for (const char* dir : {"actors", "model", "kernels", "tools", "examples"}) {
    if (!fs::exists(root / dir)) continue;
    for (const auto& entry : fs::recursive_directory_iterator(root / dir)) {
      const auto ext = entry.path().extension();
      if (ext != ".cpp" && ext != ".hpp" && ext != ".cu" && ext != ".h") continue;
      std::ifstream in(entry.path());
      std::string line;
      int lineno = 0;
      while (std::getline(in, line)) {
        ++lineno;
        const auto first = line.find_first_not_of(" \t");
        if (first != std::string::npos && line.compare(first, 2, "//") == 0) continue;
        for (auto it = std::sregex_iterator(line.begin(), line.end(), call); it != std::sregex_iterator(); ++it) {
          ++count;
          where += "  " + fs::relative(entry.path(), root).string() + ":" + std::to_string(lineno) + "\n";
        }
      }
    }
  }
  std::ifstream baseline_file(root / "tests/data/derive_call_sites.txt");
  REQUIRE_MESSAGE(baseline_file, "tests/data/derive_call_sites.txt is missing");
  int baseline = -1;
  std::string text;
  while (std::getline(baseline_file, text))
    if (!text.empty() && text[0] != '#') {
      baseline = std::stoi(text);
      break;
    }
  INFO("derive( call sites outside config/:\n" << where);
  CHECK_MESSAGE(count <= baseline,
                "a new derive( call site outside config/: name its source, review it, and raise "
                "the baseline in tests/data/derive_call_sites.txt");
  CHECK_MESSAGE(count >= baseline,
                "fewer derive( call sites than recorded: lower the baseline in "
                "tests/data/derive_call_sites.txt in the same change");
}
