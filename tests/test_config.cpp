// tests/test_config.cpp — settings: the field table, parsing argv and config files, validation,
// automatic choices, and one clear message per bad flag.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "config/error.hpp"
#include "config/resolve.hpp"

using namespace specactor::config;
using json = nlohmann::json;

namespace {

ServerArgs parse(std::vector<std::string> argv) { return parse_server_args(argv); }

// The message of the ConfigError that parsing + freezing `argv` raises ("" when none).
std::string error_of(std::vector<std::string> argv) {
  try {
    freeze(parse_server_args(argv));
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

ModelFacts llama_facts(std::int64_t ctx = 4096) {
  ModelFacts f;
  f.architecture = "llama";
  f.context_length = ctx;
  f.vocab_size = 49152;
  f.hidden_size = 576;
  f.num_layers = 30;
  f.llama_family = true;
  return f;
}
RuntimeFacts no_gpu() { return {false, "no driver"}; }

std::string write_temp(const std::string& name, const std::string& text) {
  const auto p = std::filesystem::temp_directory_path() / (name + "." + std::to_string(::getpid()) + ".json");
  std::ofstream(p) << text;
  return p.string();
}

}  // namespace

TEST_CASE("every setting has a default, a flag name and a one-line doc") {
  ServerArgs a;
  int n = 0;
  for_each_field(a, [&](std::string_view name, std::string_view doc, const auto&) {
    CAPTURE(name);
    CHECK(!doc.empty());
    CHECK(doc.find('\n') == std::string_view::npos);
    CHECK(flag_name(name).rfind("--", 0) == 0);
    ++n;
  });
  CHECK(n == static_cast<int>(field_names().size()));
  for (const char* required : {"model_path",
                               "tokenizer_path",
                               "load_format",
                               "dtype",
                               "context_length",
                               "json_model_override_args",
                               "skip_tokenizer_init",
                               "device",
                               "tp_size",
                               "threads",
                               "kv_cache_dtype",
                               "page_size",
                               "max_total_tokens",
                               "max_running_requests",
                               "chunked_prefill_size",
                               "disable_chunked_prefix_cache",
                               "disable_cuda_graph",
                               "attention_backend",
                               "prefill_attention_backend",
                               "decode_attention_backend",
                               "random_seed",
                               "log_level",
                               "speculative_algorithm",
                               "speculative_draft_model_path",
                               "speculative_draft_load_format",
                               "speculative_num_steps",
                               "speculative_eagle_topk",
                               "speculative_num_draft_tokens",
                               "speculative_accept_threshold_single",
                               "speculative_accept_threshold_acc",
                               "speculative_token_map",
                               "speculative_draft_attention_backend",
                               "speculative_draft_kv_cache_dtype",
                               "speculative_use_rejection_sampling",
                               "host",
                               "port"}) {
    CAPTURE(required);
    CHECK(std::find(field_names().begin(), field_names().end(), required) != field_names().end());
  }
  CHECK(flag_name("speculative_num_steps") == "--speculative-num-steps");
  CHECK_NOTHROW(validate(a));
}

TEST_CASE("argv parsing: values, =values, bare bools, aliases, and provenance") {
  const ServerArgs a =
      parse({"--model-path", "m.gguf", "--tp-size=2", "--skip-tokenizer-init", "--speculative-algorithm", "nextn",
             "--speculative-draft-model-path", "h", "--speculative-accept-threshold-single", "0.5", "--context-length",
             "1024", "--disable-chunked-prefix-cache=false"});
  CHECK(a.model_path == "m.gguf");
  CHECK(a.tp_size == 2);
  CHECK(a.skip_tokenizer_init);
  CHECK(a.speculative_algorithm == SpecAlgorithm::Eagle);  // NEXTN is an alias of EAGLE
  CHECK(a.speculative_accept_threshold_single == 0.5);
  CHECK(a.context_length == 1024);
  CHECK_FALSE(a.disable_chunked_prefix_cache);
  REQUIRE(a.override_log.size() == 1);
  CHECK(a.override_log[0].source == "user.argv");
  CHECK(a.override_log[0].fields["tp_size"] == 2);
  CHECK(a.override_log[0].fields["speculative_algorithm"] == "EAGLE");
}

TEST_CASE("a JSON config file is applied first, the command line wins") {
  const std::string path = write_temp("cfg", R"({"tp_size": 3, "page_size": 32, "log_level": "debug"})");
  const ServerArgs a = parse({"--tp-size", "4", "--config", path});
  CHECK(a.tp_size == 4);
  CHECK(a.page_size == 32);
  CHECK(a.log_level == "debug");
  REQUIRE(a.override_log.size() == 2);
  CHECK(a.override_log[0].source == "user.config_file:" + path);
  CHECK(a.override_log[1].source == "user.argv");
  std::filesystem::remove(path);
}

TEST_CASE("bad flags and values: one clear message each, naming the flag") {
  struct Case {
    std::vector<std::string> argv;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {{"--tp-sise", "2"}, "unknown flag --tp-sise (did you mean --tp-size?)"},
      {{"--frobnicate"}, "unknown flag --frobnicate"},
      {{"--tp-size", "two"}, "--tp-size: expected an integer, got 'two'"},
      {{"--tp-size", "2.5"}, "--tp-size: expected an integer, got '2.5'"},
      {{"--tp-size"}, "--tp-size: expected a value"},
      {{"--skip-tokenizer-init=maybe"}, "--skip-tokenizer-init: expected a boolean (true|false), got 'maybe'"},
      {{"--speculative-accept-threshold-acc", "x"}, "--speculative-accept-threshold-acc: expected a number, got 'x'"},
      // A well-formed name parses (a host may have registered it; the engine refuses it otherwise).
      {{"--speculative-algorithm", "MEDUSA-2"},
       "--speculative-algorithm: expected one of "
       "NONE|EAGLE|EAGLE3|MTP|FROZEN_KV_MTP|STANDALONE|NGRAM|SUFFIX|DFLASH|DSPARK|AUTO|NEXTN, or the name of a "
       "registered "
       "drafter "
       "(a letter, then letters, digits or _), got 'MEDUSA-2'"},
      {{"--load-format", "pt"}, "--load-format: expected one of auto|gguf|safetensors|dummy, got 'pt'"},
      {{"--cpu-precision", "int8"}, "--cpu-precision: expected one of fast|exact, got 'int8'"},
      {{"--kv-cache-dtype", "fp8"}, "--kv-cache-dtype: expected one of auto|float32|float16|bfloat16, got 'fp8'"},
      {{"stray"}, "unexpected argument 'stray'"},
      {{"--tp-size", "0"}, "--tp-size: must be in [1, 64] (got 0)"},
      {{"--page-size", "0"}, "--page-size: must be in [1, 4096] (got 0)"},
      {{"--port", "70000"}, "--port: must be in [1, 65535] (got 70000)"},
      {{"--context-length", "0"}, "--context-length: must be in [1, 1073741824] (got 0)"},
      {{"--max-total-tokens", "8"}, "--max-total-tokens: must be in [16, 68719476736] (got 8)"},
      {{"--json-model-override-args", "{oops"}, "--json-model-override-args: not valid JSON"},
      {{"--json-model-override-args", "[1]"}, "--json-model-override-args: expected a JSON object, got [1]"},
      {{"--speculative-algorithm", "NGRAM", "--speculative-num-steps", "0"},
       "--speculative-num-steps: must be in [1, 64] (got 0)"},
      {{"--speculative-algorithm", "NGRAM", "--speculative-eagle-topk", "0"},
       "--speculative-eagle-topk: must be in [1, 64] (got 0)"},
      {{"--speculative-algorithm", "NGRAM", "--speculative-num-steps", "3", "--speculative-eagle-topk", "2",
        "--speculative-num-draft-tokens", "8"},
       "--speculative-num-draft-tokens: must be <= 1 + steps * topk = 7 (got 8 with --speculative-num-steps 3 and "
       "--speculative-eagle-topk 2)"},
      {{"--speculative-algorithm", "EAGLE"},
       "--speculative-draft-model-path: is required by --speculative-algorithm EAGLE: give the EAGLE head to load"},
      {{"--speculative-algorithm", "STANDALONE"},
       "--speculative-draft-model-path: is required by --speculative-algorithm STANDALONE: give a draft model (or "
       "--speculative-draft-num-layers K for self-speculation)"},
      {{"--speculative-algorithm", "NONE", "--speculative-num-steps", "3"},
       "--speculative-num-steps: is set but --speculative-algorithm is NONE; choose an algorithm or drop the flag"},
      {{"--speculative-algorithm", "NGRAM", "--speculative-draft-num-layers", "4"},
       "--speculative-draft-num-layers: only applies to --speculative-algorithm STANDALONE (got NGRAM)"},
      {{"--speculative-algorithm", "NGRAM", "--speculative-accept-threshold-single", "0"},
       "--speculative-accept-threshold-single: must be in (0, 1] (got 0.000000)"},
      {{"--speculative-algorithm", "NGRAM", "--speculative-accept-threshold-single", "0.5"},
       "--speculative-accept-threshold-single: values below 1 (sglang's lossy relaxed acceptance) are not implemented: "
       "specactor verifies losslessly only; leave it at 1 (got 0.500000)"},
      {{"--speculative-algorithm", "EAGLE3", "--speculative-accept-threshold-acc", "0.9"},
       "--speculative-accept-threshold-acc: values below 1 (sglang's lossy relaxed acceptance) are not implemented: "
       "specactor verifies losslessly only; leave it at 1 (got 0.900000)"},
      {{"--speculative-algorithm", "NGRAM", "--speculative-token-map", "hot.txt"},
       "--speculative-token-map: only applies to EAGLE and EAGLE3 drafters (got NGRAM)"},
      {{"--speculative-algorithm", "EAGLE3", "--speculative-draft-p-min", "1"},
       "--speculative-draft-p-min: must be in [0, 1) (got 1.000000)"},
      {{"--speculative-algorithm", "EAGLE3", "--speculative-draft-p-min", "-0.1"},
       "--speculative-draft-p-min: must be in [0, 1) (got -0.100000)"},
      {{"--speculative-algorithm", "NONE", "--speculative-draft-p-min", "0.2"},
       "--speculative-draft-p-min: is set but --speculative-algorithm is NONE; choose an algorithm or drop the flag"},
      {{"--speculative-algorithm", "NGRAM", "--speculative-draft-p-min", "0.2"},
       "--speculative-draft-p-min: only applies to the head drafters EAGLE, EAGLE3, MTP and FROZEN_KV_MTP (got NGRAM)"},
      {{"--speculative-algorithm", "EAGLE3", "--speculative-draft-ngram-tokens", "17"},
       "--speculative-draft-ngram-tokens: must be in [0, 16] (got 17)"},
      {{"--speculative-algorithm", "EAGLE3", "--speculative-draft-ngram-tokens", "-1"},
       "--speculative-draft-ngram-tokens: must be in [0, 16] (got -1)"},
      {{"--speculative-algorithm", "EAGLE3", "--speculative-draft-ngram-min-match", "0"},
       "--speculative-draft-ngram-min-match: must be in [1, 64] (got 0)"},
      {{"--speculative-algorithm", "NONE", "--speculative-draft-ngram-tokens", "3"},
       "--speculative-draft-ngram-tokens: is set but --speculative-algorithm is NONE; choose an algorithm or drop the "
       "flag"},
      {{"--speculative-algorithm", "NGRAM", "--speculative-draft-ngram-tokens", "3"},
       "--speculative-draft-ngram-tokens: only applies to the model drafters EAGLE, EAGLE3, MTP, FROZEN_KV_MTP, DFLASH "
       "and DSPARK (got NGRAM)"},
      {{"--speculative-algorithm", "STANDALONE", "--speculative-draft-ngram-min-match", "3"},
       "--speculative-draft-ngram-min-match: only applies to the model drafters EAGLE, EAGLE3, MTP, FROZEN_KV_MTP, "
       "DFLASH and DSPARK (got STANDALONE)"},
      {{"--speculative-algorithm", "DFLASH", "--speculative-draft-p-min", "0.2"},
       "--speculative-draft-p-min: only applies to the head drafters EAGLE, EAGLE3, MTP and FROZEN_KV_MTP (got "
       "DFLASH)"},
      {{"--speculative-algorithm", "DFLASH", "--speculative-use-rejection-sampling", "--speculative-draft-ngram-tokens",
        "3"},
       "--speculative-draft-ngram-tokens: makes the proposal a tree, and --speculative-use-rejection-sampling verifies "
       "a "
       "chain with the draft's probabilities: set it to 0 or leave rejection sampling off (got 3)"},
      {{"--speculative-algorithm", "DSPARK", "--speculative-use-rejection-sampling",
        "--speculative-draft-suffix-tokens", "2"},
       "--speculative-draft-suffix-tokens: makes the proposal a tree, and --speculative-use-rejection-sampling "
       "verifies a "
       "chain with the draft's probabilities: set it to 0 or leave rejection sampling off (got 2)"},
      {{"--speculative-algorithm", "NONE", "--speculative-draft-quantization", "q4_1"},
       "--speculative-draft-quantization: is set but --speculative-algorithm is NONE; choose an algorithm or drop the "
       "flag"},
      {{"--speculative-algorithm", "EAGLE3", "--speculative-draft-quantization", "q2_k"},
       "--speculative-draft-quantization: expected one of auto|q8_0|q4_1|none, got 'q2_k'"},
      {{"--speculative-algorithm", "STANDALONE", "--speculative-draft-num-layers", "4",
        "--speculative-draft-quantization", "q4_1"},
       "--speculative-draft-quantization: only applies to the drafters with weights of their own: EAGLE, EAGLE3, MTP, "
       "FROZEN_KV_MTP, DFLASH and DSPARK (got STANDALONE)"},
      {{"--speculative-algorithm", "NGRAM", "--speculative-use-rejection-sampling", "--speculative-eagle-topk", "2"},
       "--speculative-use-rejection-sampling: needs a chain draft (--speculative-eagle-topk 1, got 2)"},
      {{"--speculative-algorithm", "NGRAM", "--speculative-ngram-min-match-window-size", "5",
        "--speculative-ngram-max-match-window-size", "3"},
       "--speculative-ngram-max-match-window-size: must be >= --speculative-ngram-min-match-window-size (5), got 3"},
      {{"--config"}, "--config: expected a JSON file path"},
      {{"--config", "/nonexistent/x.json"}, "--config /nonexistent/x.json: cannot open the file"},
  };
  std::set<std::string> seen;
  for (const auto& c : cases) {
    CAPTURE(c.expect);
    const std::string msg = error_of(c.argv);
    CHECK_MESSAGE(msg.find(c.expect) != std::string::npos, msg);
    CHECK(seen.insert(msg).second);
  }
}

TEST_CASE("bad config files name the file and the key") {
  const std::string unknown = write_temp("unknown", R"({"tp_sise": 2})");
  CHECK(error_of({"--config", unknown}) ==
        "--config " + unknown + ": unknown setting 'tp_sise' (did you mean --tp-size?)");
  const std::string wrong = write_temp("wrong", R"({"tp_size": "2"})");
  CHECK(error_of({"--config", wrong}) == "--config " + wrong + " key 'tp_size': expected an integer, got \"2\"");
  const std::string broken = write_temp("broken", R"({"tp_size": )");
  CHECK(error_of({"--config", broken}).find("--config " + broken + ": not valid JSON") == 0);
  const std::string array = write_temp("array", "[1, 2]");
  CHECK(error_of({"--config", array}) == "--config " + array + ": expected a JSON object of settings");
  for (const auto& p : {unknown, wrong, broken, array}) std::filesystem::remove(p);
}

TEST_CASE("automatic speculative shape") {
  auto resolved = [](std::vector<std::string> argv, bool llama = true) {
    argv.insert(argv.begin(), {"--model-path", "m.gguf"});
    ModelFacts f = llama_facts();
    f.llama_family = llama;
    return resolve_target(freeze(parse_server_args(argv)), f, no_gpu());
  };
  SUBCASE("EAGLE on a Llama target: 5/4/8") {
    auto s = resolved({"--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "h"});
    CHECK(*s->speculative_num_steps == 5);
    CHECK(*s->speculative_eagle_topk == 4);
    CHECK(*s->speculative_num_draft_tokens == 8);
    CHECK(s->override_log.back().source == "auto.speculative");
  }
  SUBCASE("EAGLE3 on a non-Llama target: 3/1/4") {
    auto s = resolved({"--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "h"}, false);
    CHECK(*s->speculative_num_steps == 3);
    CHECK(*s->speculative_eagle_topk == 1);
    CHECK(*s->speculative_num_draft_tokens == 4);
  }
  SUBCASE("EAGLE3 without a head: the one shipped for the model, logged, else a clear error") {
    // The shipped head's measured settings, as its config.json carries them.
    const ShippedHeadDefaults kShippedHead{{3, 2, 5}, 0.15, 3, "q4_1"};
    ModelFacts f = llama_facts();
    f.shipped_eagle3_head = "/repo/heads/m-eagle3";
    f.shipped_head_defaults = kShippedHead;
    const Snapshot user = freeze(parse_server_args({"--model-path", "m.gguf", "--speculative-algorithm", "EAGLE3"}));
    const Snapshot s = resolve_target(user, f, no_gpu());
    CHECK(*s->speculative_draft_model_path == "/repo/heads/m-eagle3");
    bool logged = false;
    for (const auto& e : s->override_log)
      logged = logged || (e.source == "auto.shipped_head" &&
                          e.fields == json{{"speculative_draft_model_path", "/repo/heads/m-eagle3"}});
    CHECK(logged);
    CHECK(derive_draft(s, f)->model_path == "/repo/heads/m-eagle3");
    // The shipped head's own defaults (shape, path-probability floor, quantization), unless the user gives
    // them; all in the log, and in the draft's snapshot, which the drafter reads.
    CHECK(*s->speculative_num_steps == kShippedHead.shape.num_steps);
    CHECK(*s->speculative_eagle_topk == kShippedHead.shape.eagle_topk);
    CHECK(*s->speculative_num_draft_tokens == kShippedHead.shape.num_draft_tokens);
    CHECK(*s->speculative_draft_p_min == kShippedHead.p_min);
    CHECK(*s->speculative_draft_ngram_tokens == kShippedHead.ngram_tokens);
    CHECK(s->speculative_draft_quantization == kShippedHead.quantization);
    CHECK(s->override_log.back().source == "auto.speculative");
    CHECK(s->override_log.back().fields["speculative_draft_p_min"] == kShippedHead.p_min);
    CHECK(s->override_log.back().fields["speculative_draft_quantization"] == kShippedHead.quantization);
    CHECK(*derive_draft(s, f)->speculative_draft_p_min == kShippedHead.p_min);
    CHECK(*derive_draft(s, f)->speculative_draft_ngram_tokens == kShippedHead.ngram_tokens);
    const Snapshot shaped =
        resolve_target(freeze(parse_server_args({"--model-path", "m.gguf", "--speculative-algorithm", "EAGLE3",
                                                 "--speculative-num-steps", "3", "--speculative-draft-p-min", "0.35",
                                                 "--speculative-draft-quantization", "none"})),
                       f, no_gpu());
    CHECK(*shaped->speculative_num_steps == 3);
    CHECK(*shaped->speculative_num_draft_tokens == 4);
    CHECK(*shaped->speculative_draft_p_min == 0.35);
    CHECK(*shaped->speculative_draft_ngram_tokens == 0);
    CHECK(shaped->speculative_draft_quantization == "none");
    CHECK_FALSE(shaped->override_log.back().fields.contains("speculative_draft_p_min"));
    // A shape flag alone: no floor (it went with the default shape), the quantization stays the head's.
    const Snapshot chain = resolve_target(freeze(parse_server_args({"--model-path", "m.gguf", "--speculative-algorithm",
                                                                    "EAGLE3", "--speculative-eagle-topk", "1"})),
                                          f, no_gpu());
    CHECK(*chain->speculative_draft_p_min == 0.0);
    CHECK(*chain->speculative_draft_ngram_tokens == 0);
    // The branch alone keeps the default shape and its floor.
    const Snapshot branch =
        resolve_target(freeze(parse_server_args({"--model-path", "m.gguf", "--speculative-algorithm", "EAGLE3",
                                                 "--speculative-draft-ngram-tokens", "5"})),
                       f, no_gpu());
    CHECK(*branch->speculative_draft_ngram_tokens == 5);
    CHECK(*branch->speculative_num_steps == kShippedHead.shape.num_steps);
    CHECK(*branch->speculative_draft_p_min == kShippedHead.p_min);
    CHECK_FALSE(branch->override_log.back().fields.contains("speculative_draft_ngram_tokens"));
    CHECK(chain->speculative_draft_quantization == kShippedHead.quantization);
    // A head given by path: no floor and Q8_0 unless asked, whatever the shipped head's defaults.
    const Snapshot other =
        resolve_target(freeze(parse_server_args({"--model-path", "m.gguf", "--speculative-algorithm", "EAGLE3",
                                                 "--speculative-draft-model-path", "mine"})),
                       f, no_gpu());
    CHECK(*other->speculative_draft_p_min == 0.0);
    CHECK(*other->speculative_draft_ngram_tokens == 0);
    CHECK(other->speculative_draft_quantization == "q8_0");
    CHECK(resolve_target(freeze(parse_server_args({"--model-path", "m.gguf", "--speculative-algorithm", "EAGLE3",
                                                   "--speculative-draft-model-path", "mine"})),
                         f, no_gpu())
              ->speculative_draft_model_path == std::optional<std::string>("mine"));
    f.shipped_eagle3_head.clear();
    CHECK_THROWS_WITH_AS(resolve_target(user, f, no_gpu()),
                         doctest::Contains("--speculative-draft-model-path: is required by --speculative-algorithm "
                                           "EAGLE3 for llama model m.gguf"),
                         ConfigError);
  }
  SUBCASE("DFLASH without a drafter: the one shipped for the model, else one error naming the flag") {
    ModelFacts f = llama_facts();
    f.shipped_block_drafter = "/repo/heads/m-dflash";
    const Snapshot user = freeze(parse_server_args({"--model-path", "m.gguf", "--speculative-algorithm", "DFLASH"}));
    const Snapshot s = resolve_target(user, f, no_gpu());
    CHECK(*s->speculative_draft_model_path == "/repo/heads/m-dflash");
    bool logged = false;
    for (const auto& e : s->override_log)
      logged = logged || (e.source == "auto.shipped_drafter" &&
                          e.fields == json{{"speculative_draft_model_path", "/repo/heads/m-dflash"}});
    CHECK(logged);
    CHECK(*s->speculative_num_steps == 15);          // the drafter caps it at its block size − 1
    CHECK(*s->speculative_draft_ngram_tokens == 0);  // no prompt-lookup branch unless asked
    f.shipped_block_drafter.clear();
    CHECK_THROWS_WITH_AS(resolve_target(user, f, no_gpu()),
                         doctest::Contains("--speculative-draft-model-path: is required by --speculative-algorithm "
                                           "DFLASH for llama model m.gguf"),
                         ConfigError);
    // DSPARK the same way (the loader looks up <stem>-dspark for it).
    const Snapshot spark = freeze(parse_server_args({"--model-path", "m.gguf", "--speculative-algorithm", "DSPARK"}));
    CHECK_THROWS_WITH_AS(resolve_target(spark, f, no_gpu()),
                         doctest::Contains("--speculative-draft-model-path: is required by --speculative-algorithm "
                                           "DSPARK for llama model m.gguf: give the DSpark drafter folder"),
                         ConfigError);
    f.shipped_block_drafter = "/repo/heads/m-dspark";
    CHECK(*resolve_target(spark, f, no_gpu())->speculative_draft_model_path == "/repo/heads/m-dspark");
    // A shipped drafter with measured settings: its chain, branch and quantization when no shape flag
    // is given; a shape flag replaces the chain and its branch; a drafter given by path has none of them.
    f.shipped_head_defaults = ShippedHeadDefaults{{5, 1, 6}, 0.0, 3, "q4_1"};
    const Snapshot tuned = resolve_target(spark, f, no_gpu());
    CHECK(*tuned->speculative_num_steps == 5);
    CHECK(*tuned->speculative_num_draft_tokens == 6);
    CHECK(*tuned->speculative_draft_ngram_tokens == 3);
    CHECK(tuned->speculative_draft_quantization == "q4_1");
    CHECK_FALSE(tuned->speculative_draft_p_min.has_value());
    const Snapshot shaped =
        resolve_target(freeze(parse_server_args({"--model-path", "m.gguf", "--speculative-algorithm", "DSPARK",
                                                 "--speculative-num-steps", "3"})),
                       f, no_gpu());
    CHECK(*shaped->speculative_num_steps == 3);
    CHECK(*shaped->speculative_draft_ngram_tokens == 0);
    const Snapshot mine =
        resolve_target(freeze(parse_server_args({"--model-path", "m.gguf", "--speculative-algorithm", "DSPARK",
                                                 "--speculative-draft-model-path", "mine"})),
                       f, no_gpu());
    CHECK(*mine->speculative_num_steps == 15);
    CHECK(*mine->speculative_draft_ngram_tokens == 0);
    CHECK(mine->speculative_draft_quantization == "auto");
  }
  SUBCASE("AUTO (the default): EAGLE3 with the shipped head when one ships, else NONE; the log says which") {
    ModelFacts f = llama_facts();
    f.shipped_eagle3_head = "/repo/heads/m-eagle3";
    f.shipped_head_defaults = ShippedHeadDefaults{{3, 2, 5}, 0.15, 3, "q4_1"};
    const Snapshot user = freeze(parse_server_args({"--model-path", "m.gguf"}));
    CHECK(user->speculative_algorithm == SpecAlgorithm::Auto);
    const Snapshot s = resolve_target(user, f, no_gpu());
    CHECK(s->speculative_algorithm == SpecAlgorithm::Eagle3);
    CHECK(*s->speculative_draft_model_path == "/repo/heads/m-eagle3");
    CHECK(s->speculative_adaptive);
    bool logged = false;
    for (const auto& e : s->override_log)
      logged = logged || (e.source.rfind("auto.speculative_algorithm", 0) == 0 &&
                          e.fields == json{{"speculative_algorithm", "EAGLE3"}});
    CHECK(logged);
    // Head settings without an algorithm follow AUTO's choice.
    const Snapshot floor = resolve_target(
        freeze(parse_server_args({"--model-path", "m.gguf", "--speculative-draft-p-min", "0.3"})), f, no_gpu());
    CHECK(*floor->speculative_draft_p_min == 0.3);
    f.shipped_eagle3_head.clear();
    f.shipped_head_defaults.reset();
    CHECK(resolve_target(user, f, no_gpu())->speculative_algorithm == SpecAlgorithm::None);
    // Without a head the same setting has nothing to apply to: refused, saying what AUTO chose.
    CHECK_THROWS_WITH_AS(
        resolve_target(freeze(parse_server_args({"--model-path", "m.gguf", "--speculative-num-steps", "4"})), f,
                       no_gpu()),
        doctest::Contains("AUTO chose NONE"), ConfigError);
    // A draft model names no algorithm: refused before anything loads.
    CHECK_THROWS_WITH_AS(
        freeze(parse_server_args({"--model-path", "m.gguf", "--speculative-draft-model-path", "d.gguf"})),
        doctest::Contains("needs --speculative-algorithm"), ConfigError);
    // NONE turns it off; --speculative-adaptive takes a value after it, or is a switch.
    CHECK(resolve_target(freeze(parse_server_args({"--model-path", "m.gguf", "--speculative-algorithm", "NONE"})), f,
                         no_gpu())
              ->speculative_algorithm == SpecAlgorithm::None);
    CHECK_FALSE(parse_server_args({"--speculative-adaptive", "false"}).speculative_adaptive);
    CHECK(parse_server_args({"--speculative-adaptive"}).speculative_adaptive);
    CHECK_FALSE(parse_server_args({"--speculative-adaptive=false"}).speculative_adaptive);
  }
  SUBCASE("SUFFIX: a deep two-branch shape; its match lengths are checked") {
    auto s = resolved({"--speculative-algorithm", "SUFFIX"});
    CHECK(*s->speculative_num_steps == 16);
    CHECK(*s->speculative_eagle_topk == 2);
    CHECK(*s->speculative_num_draft_tokens == 24);
    CHECK_THROWS_WITH_AS(
        freeze(parse_server_args({"--speculative-algorithm", "SUFFIX", "--speculative-suffix-min-match", "8",
                                  "--speculative-suffix-max-match", "4"})),
        doctest::Contains("--speculative-suffix-max-match: must be >= --speculative-suffix-min-match"), ConfigError);
    CHECK_THROWS_WITH_AS(
        freeze(parse_server_args({"--speculative-algorithm", "SUFFIX", "--speculative-suffix-cache-tokens", "-1"})),
        doctest::Contains("--speculative-suffix-cache-tokens"), ConfigError);
    CHECK_THROWS_WITH_AS(
        freeze(parse_server_args({"--speculative-algorithm", "NGRAM", "--speculative-draft-suffix-tokens", "4"})),
        doctest::Contains("only applies to the model drafters"), ConfigError);
    // The block drafters take both branches (and rejection sampling without them).
    for (const char* algo : {"DFLASH", "DSPARK"}) {
      CAPTURE(algo);
      const Snapshot b = freeze(parse_server_args({"--speculative-algorithm", algo, "--speculative-draft-ngram-tokens",
                                                   "3", "--speculative-draft-suffix-tokens", "2"}));
      CHECK(*b->speculative_draft_ngram_tokens == 3);
      CHECK(*b->speculative_draft_suffix_tokens == 2);
      CHECK_NOTHROW(freeze(parse_server_args({"--speculative-algorithm", algo, "--speculative-use-rejection-sampling",
                                              "--speculative-draft-ngram-tokens", "0"})));
    }
  }
  SUBCASE("other algorithms: 3/1/4") {
    auto s = resolved({"--speculative-algorithm", "NGRAM"});
    CHECK(*s->speculative_num_steps == 3);
    CHECK(*s->speculative_eagle_topk == 1);
    CHECK(*s->speculative_num_draft_tokens == 4);
    CHECK_FALSE(s->speculative_draft_p_min.has_value());  // head drafters' settings stay unset
    CHECK_FALSE(s->speculative_draft_ngram_tokens.has_value());
    CHECK(s->speculative_draft_quantization == "auto");
  }
  SUBCASE("topk = 1 forces draft tokens = steps + 1") {
    auto s = resolved({"--speculative-algorithm", "NGRAM", "--speculative-num-steps", "6", "--speculative-eagle-topk",
                       "1", "--speculative-num-draft-tokens", "3"});
    CHECK(*s->speculative_num_draft_tokens == 7);
    CHECK(s->override_log.back().fields == json{{"speculative_num_draft_tokens", 7}});
  }
  SUBCASE("user values are kept") {
    auto s =
        resolved({"--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "h", "--speculative-num-steps",
                  "3", "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "6"});
    CHECK(*s->speculative_num_steps == 3);
    CHECK(*s->speculative_eagle_topk == 2);
    CHECK(*s->speculative_num_draft_tokens == 6);
  }
  SUBCASE("a head drafter's 64-node limit is a config error, given or with a default") {
    CHECK_THROWS_WITH_AS(resolved({"--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "h",
                                   "--speculative-num-steps", "8", "--speculative-eagle-topk", "8"}),
                         doctest::Contains("1 + steps × topk <= 64), got 8 × 8"), ConfigError);
    CHECK_THROWS_WITH_AS(resolved({"--speculative-algorithm", "MTP", "--speculative-draft-model-path", "h",
                                   "--speculative-num-steps", "64"},
                                  false),
                         doctest::Contains("with the default for the flag not given"), ConfigError);
    auto ok = resolved({"--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "h",
                        "--speculative-num-steps", "7", "--speculative-eagle-topk", "9"});
    CHECK(*ok->speculative_num_steps == 7);
    auto ngram = resolved({"--speculative-algorithm", "NGRAM", "--speculative-num-steps", "8",
                           "--speculative-eagle-topk", "8"});  // not a head drafter: no such limit
    CHECK(*ngram->speculative_eagle_topk == 8);
  }
}

TEST_CASE("load-time resolution: context length, KV budget, device") {
  const Snapshot user = freeze(parse({"--model-path", "m.gguf"}));
  const Snapshot t = resolve_target(user, llama_facts(8192), no_gpu());
  CHECK(*t->context_length == 8192);
  CHECK(*t->max_total_tokens == 32768);
  CHECK(t->device == Device::Cpu);
  CHECK_FALSE(user->context_length.has_value());  // the user's snapshot is untouched

  const Snapshot big = freeze(parse({"--model-path", "m.gguf", "--context-length", "10000"}));
  CHECK_THROWS_WITH_AS(resolve_target(big, llama_facts(8192), no_gpu()),
                       "--context-length 10000 exceeds the context length of llama model m.gguf (8192); pass "
                       "--allow-context-length-above-model to accept it",
                       ConfigError);
  const Snapshot allowed =
      freeze(parse({"--model-path", "m.gguf", "--context-length", "10000", "--allow-context-length-above-model"}));
  CHECK(*resolve_target(allowed, llama_facts(8192), no_gpu())->context_length == 10000);

  const Snapshot cuda = freeze(parse({"--model-path", "m.gguf", "--device", "cuda"}));
  CHECK_THROWS_WITH_AS(resolve_target(cuda, llama_facts(), no_gpu()),
                       "--device cuda: no usable CUDA device (no driver); use --device cpu or auto", ConfigError);
  CHECK_THROWS_WITH_AS(resolve_target(cuda, llama_facts(), {true, ""}),
                       doctest::Contains("--device cuda: this build has no CUDA forward pass"), ConfigError);
  const Snapshot cuda_frozen = freeze(parse({"--model-path", "m.gguf", "--device", "cuda", "--speculative-algorithm",
                                             "FROZEN_KV_MTP", "--speculative-draft-model-path", "h.gguf"}));
  CHECK_THROWS_WITH_AS(resolve_target(cuda_frozen, llama_facts(), {true, "", true, 1}),
                       doctest::Contains("--device cuda: FROZEN_KV_MTP reads the target's KV cache from host memory"),
                       ConfigError);
  CHECK(resolve_target(cuda, llama_facts(), {true, "", true})->device == Device::Cuda);
  const Snapshot auto_dev = freeze(parse({"--model-path", "m.gguf"}));
  CHECK(resolve_target(auto_dev, llama_facts(), {true, ""})->device == Device::Cpu);  // a GPU but no CUDA forward
  CHECK(resolve_target(auto_dev, llama_facts(), {true, "", true})->device == Device::Cuda);
  // auto stays on the CPU for what CUDA cannot run: more ranks than devices, FROZEN_KV_MTP.
  CHECK(resolve_target(freeze(parse({"--model-path", "m.gguf", "--tp-size", "2"})), llama_facts(), {true, "", true, 1})
            ->device == Device::Cpu);
  CHECK(resolve_target(freeze(parse({"--model-path", "m.gguf", "--speculative-algorithm", "FROZEN_KV_MTP",
                                     "--speculative-draft-model-path", "h.gguf"})),
                       llama_facts(), {true, "", true, 1})
            ->device == Device::Cpu);
  const Snapshot tp = freeze(parse({"--model-path", "m.gguf", "--tp-size", "2"}));
  CHECK(resolve_target(tp, llama_facts(), no_gpu())->tp_size == 2);  // CPU ranks: threads of this process
  ModelFacts smol = llama_facts();
  smol.num_heads = 9;
  smol.num_kv_heads = 3;
  smol.ffn_hidden_size = 1536;
  CHECK_THROWS_WITH_AS(resolve_target(tp, smol, no_gpu()),
                       "--tp-size 2: llama model m.gguf has 9 attention heads, which do not split into 2 equal shards "
                       "(sizes that fit: 1, 3)",
                       ConfigError);
  CHECK(resolve_target(freeze(parse({"--model-path", "m.gguf", "--tp-size", "3"})), smol, no_gpu())->tp_size == 3);
  const Snapshot tp_cuda = freeze(parse({"--model-path", "m.gguf", "--tp-size", "2", "--device", "cuda"}));
  CHECK_THROWS_WITH_AS(resolve_target(tp_cuda, llama_facts(), {true, "", true, 1}),
                       "--tp-size 2: --device cuda runs one rank per GPU and 1 device(s) answered", ConfigError);
  CHECK(resolve_target(tp_cuda, llama_facts(), {true, "", true, 2})->tp_size == 2);
  const Snapshot tp_frozen = freeze(parse({"--model-path", "m.gguf", "--tp-size", "3", "--speculative-algorithm",
                                           "FROZEN_KV_MTP", "--speculative-draft-model-path", "h.gguf"}));
  CHECK_THROWS_WITH_AS(resolve_target(tp_frozen, llama_facts(), no_gpu()),
                       doctest::Contains("--tp-size 3: FROZEN_KV_MTP reads the target's whole KV cache"), ConfigError);
}

TEST_CASE("KV cache type: auto is float16 on the CPU in the fast precision, else float32, and CUDA keeps float32") {
  auto resolved = [](std::vector<std::string> argv, RuntimeFacts rt) {
    argv.insert(argv.begin(), {"--model-path", "m.gguf"});
    return resolve_target(freeze(parse(argv)), llama_facts(), rt);
  };
  CHECK(resolved({}, no_gpu())->kv_cache_dtype == "float16");
  CHECK(resolved({"--cpu-precision", "exact"}, no_gpu())->kv_cache_dtype == "float32");
  CHECK(resolved({"--device", "cuda"}, {true, "", true})->kv_cache_dtype == "float32");
  CHECK(resolved({}, {true, "", true})->kv_cache_dtype == "float32");  // auto chose CUDA
  // Explicit values are honoured, in either precision.
  CHECK(resolved({"--kv-cache-dtype", "bfloat16"}, no_gpu())->kv_cache_dtype == "bfloat16");
  CHECK(resolved({"--kv-cache-dtype", "float32"}, no_gpu())->kv_cache_dtype == "float32");
  CHECK(resolved({"--cpu-precision", "exact", "--kv-cache-dtype", "float16"}, no_gpu())->kv_cache_dtype == "float16");
  // The override log says who chose it.
  const json log = override_log_json(*resolved({}, no_gpu()));
  bool logged = false;
  for (const auto& e : log)
    if (e["source"] == "auto.kv_cache_dtype" && e["fields"]["kv_cache_dtype"] == "float16") logged = true;
  CHECK(logged);
  CHECK_THROWS_WITH_AS(resolved({"--device", "cuda", "--kv-cache-dtype", "float16"}, {true, "", true}),
                       "--kv-cache-dtype float16: the CUDA forward keeps its KV cache in float32 on the device; use "
                       "float32 (or auto), or --device cpu",
                       ConfigError);
  CHECK_THROWS_WITH_AS(
      resolved({"--device", "cuda", "--speculative-draft-kv-cache-dtype", "bfloat16"}, {true, "", true}),
      doctest::Contains(
          "--speculative-draft-kv-cache-dtype bfloat16: with --device cuda the draft's KV cache is float32"),
      ConfigError);
  // The draft's own cache: unset or auto keep the target's type, a value is the draft's alone.
  const Snapshot t = resolved({"--speculative-algorithm", "NGRAM"}, no_gpu());
  CHECK(derive_draft(t, llama_facts())->kv_cache_dtype == "float16");
  const Snapshot t2 =
      resolved({"--speculative-algorithm", "NGRAM", "--speculative-draft-kv-cache-dtype", "auto"}, no_gpu());
  CHECK(derive_draft(t2, llama_facts())->kv_cache_dtype == "float16");
  const Snapshot t3 =
      resolved({"--speculative-algorithm", "NGRAM", "--speculative-draft-kv-cache-dtype", "float32"}, no_gpu());
  CHECK(derive_draft(t3, llama_facts())->kv_cache_dtype == "float32");
  CHECK(t3->kv_cache_dtype == "float16");  // the target's own is untouched
}

TEST_CASE("snapshots round-trip through JSON with their override log") {
  const Snapshot user = freeze(parse({"--model-path", "m.gguf", "--speculative-algorithm", "NGRAM"}));
  const Snapshot t = resolve_target(user, llama_facts(), no_gpu());
  const Snapshot back = snapshot_from_json(to_json(*t));
  CHECK(same_settings(*back, *t));
  CHECK(content_hash(*back) == content_hash(*t));
  CHECK(override_log_json(*back) == override_log_json(*t));
  json tampered = to_json(*t);
  tampered["settings"]["tp_size"] = 2;
  CHECK_THROWS_WITH_AS(snapshot_from_json(tampered), doctest::Contains("does not match its settings"), ConfigError);
}
