// tests/test_cli.cpp — the specactor launcher as a user runs it: exit codes, stdout JSON, stderr
// messages.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "actors/engine.hpp"
#include "kernels/backend.hpp"
#include "tests/support/cli_run.hpp"
#include "tests/support/free_port.hpp"
#include "tests/support/gguf_writer.hpp"
#include "tests/support/random_weights.hpp"
#include "tests/support/skip.hpp"

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

using Run = specactor::testing::CliRun;
Run run(const std::string& args, int timeout_s = 300, const std::string& cwd = "") {
  return specactor::testing::run_cli(args, timeout_s, cwd);
}

std::string tiny_model() {
  static const std::string path = [] {
    const fs::path p = fs::temp_directory_path() / ("specactor_cli_tiny." + std::to_string(::getpid()) + ".gguf");
    specactor::testing::tiny_llama().write(p.string());
    return p.string();
  }();
  return path;
}

std::string default_model() {
  const std::string p = SPECACTOR_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  return fs::exists(p) ? p : "";
}

void check_draft_config(const std::string& model, std::int64_t ctx) {
  const Run r = run("config --model-path " + model +
                    " --speculative-algorithm EAGLE --speculative-draft-model-path X"
                    " --speculative-draft-load-format dummy");
  REQUIRE_MESSAGE(r.rc == 0, r.err);
  const json j = json::parse(r.out);
  CHECK(j["target"]["settings"]["load_format"] == "auto");
  CHECK(j["target"]["settings"]["context_length"] == ctx);
  CHECK(j["target"]["settings"]["model_path"] == model);
  CHECK(j["draft"]["settings"]["load_format"] == "dummy");
  CHECK(j["draft"]["settings"]["context_length"] == ctx);
  CHECK(j["draft"]["settings"]["model_path"] == "X");
  CHECK(j["target"]["override_log"].size() >= 2);
  CHECK(j["draft"]["override_log"].back()["source"] == "draft.per_runner");
  CHECK(j["target_hash_before_draft"] == j["target_hash_after_draft"]);
  CHECK(j["target_hash_before_draft"] == j["target"]["hash"]);
  CHECK(j["draft"]["hash"] != j["target"]["hash"]);
}

}  // namespace

TEST_CASE("specactor config: target and draft snapshots (tiny model)") { check_draft_config(tiny_model(), 128); }

TEST_CASE("specactor config: target and draft snapshots (default model)") {
  const std::string model = default_model();
  if (model.empty()) {
    SKIP_CASE("no default model", "models/SmolLM2-135M-Instruct.Q4_1.gguf is not fetched (run tools/setup)");
  }
  check_draft_config(model, 8192);
}

TEST_CASE("specactor: bad input gets one clear message on stderr and exit status 2") {
  // No default model for these runs (tools/setup fetched one, which `config` would otherwise take).
  ::setenv("SPECACTOR_MODELS_DIR", "/nonexistent-specactor-models", 1);
  struct Case {
    std::string args, expect;
  };
  std::vector<Case> cases = {
      {"generate --model-path " + tiny_model() + " --prompt hi --tp-size 4",
       "KV heads, which do not split into 4 equal shards (sizes that fit: 1, 2)"},
      {"config --model-path " + tiny_model() + " --tp-sise 2",
       "specactor: error: unknown flag --tp-sise (did you mean --tp-size?)"},
      {"config --model-path " + tiny_model() + " --speculative-algorithm EAGLE",
       "specactor: error: --speculative-draft-model-path: is required by --speculative-algorithm EAGLE"},
      {"config", "specactor: error: --model-path is required"},
      {"config --model-path /nonexistent.gguf", "specactor: error: /nonexistent.gguf: cannot open: No such file"},
      {"config --model-path " + tiny_model() + " --context-length 4096", "exceeds the context length of llama model"},
      {"inspect /nonexistent.gguf", "specactor: error: /nonexistent.gguf: cannot open"},
      {"inspect " + std::string(SPECACTOR_SOURCE_DIR) + "/CMakeLists.txt", "not a GGUF file (magic"},
      {"frobnicate", "specactor: error: unknown command 'frobnicate'"},
      {"generate --model-path " + tiny_model(), "specactor: error: --prompt is required"},
      {"generate --model-path " + tiny_model() + " --prompt hi --temperature -1",
       "specactor: error: --temperature: must be a finite number >= 0"},
      {"generate --model-path " + tiny_model() + " --prompt hi --top-p 0",
       "specactor: error: --top-p: must be in (0, 1]"},
      {"generate --model-path " + tiny_model() + " --prompt hi --presence-penalty 3",
       "specactor: error: --presence-penalty: must be in [-2, 2]"},
      {"generate --model-path " + tiny_model() + " --prompt hi --repetition-penalty 0",
       "specactor: error: --repetition-penalty: must be a finite number > 0 (1 = off)"},
      {"generate --model-path " + tiny_model() + " --prompt hi --json-schema '{\"type\":\"string\",\"pattern\":\"a\"}'",
       "specactor: error: --json-schema: (root): the keyword \"pattern\" is not supported"},
      {"generate --model-path " + tiny_model() + " --prompt hi --json-schema '{' --json-object",
       "specactor: error: --json-schema, --json-schema-file and --json-object: give one of them"},
      {"generate --model-path " + tiny_model() + " --prompt hi --json-schema-file /nonexistent/s.json",
       "specactor: error: --json-schema-file /nonexistent/s.json"},
      {"generate --model-path " + tiny_model() + " --prompt hi --logit-bias 5",
       "specactor: error: --logit-bias 5: expected ID=BIAS (a token id, a number)"},
      {"generate --model-path " + tiny_model() + " --prompt hi --logit-bias 5=-200",
       "specactor: error: --logit-bias[5]: must be a number in [-100, 100]"},
      {"generate --model-path " + tiny_model() + " --prompt hi --logit-bias 500=1",
       "specactor: error: --logit-bias[500]: token id 500 is outside the vocabulary (64 tokens)"},
      {"generate --model-path " + tiny_model() + " --prompt hi --min-tokens 5 --max-new-tokens 2",
       "specactor: error: --min-tokens: must be at most --max-new-tokens (2)"},
      {"generate --model-path " + tiny_model() + " --prompt hi --max-new-tokens zero",
       "specactor: error: --max-new-tokens: 'zero' is not a valid integer"},
      {"generate --model-path " + tiny_model() + " --prompt hi --max-new-tokens 0",
       "specactor: error: --max-new-tokens: must be >= 1 (got 0)"},
      {"generate --model-path " + tiny_model() + " --prompt hi --speculative-algorithm MEDUSA",
       "specactor: error: --speculative-algorithm MEDUSA: no drafter is registered under this name (registered: "},
      {"bench --model-path " + tiny_model() + " --repeats 0", "specactor: error: --repeats: must be >= 1"},
      {"bench --model-path " + tiny_model() + " --concurrency -1", "specactor: error: --concurrency: must be >= 0"},
      {"bench --model-path " + tiny_model() + " --concurrency 300", "specactor: error: --concurrency: at most 256"},
      {"generate --model-path " + tiny_model() + " --prompt hi --speculative-adaptive maybe",
       "--speculative-adaptive: expected a boolean (true|false), got 'maybe'"},
      {"bench --model-path " + tiny_model() + " --speculative-algorithm NGRAM --prompts /nonexistent.jsonl",
       "specactor: error: --prompts /nonexistent.jsonl: cannot open the file"},
      {"bench --model-path " + tiny_model() + " --prompt-tokens 4000", "exceed the context length 128"},
      {"bench --model-path " + tiny_model() + " --compare NGRAM",
       "specactor: error: --compare: only with a CPU speculative run (a --speculative-algorithm, no --sweep)"},
      {"bench --model-path " + tiny_model() + " --speculative-algorithm NGRAM --compare NGRAM --sweep",
       "specactor: error: --compare: only with a CPU speculative run"},
      {"bench --model-path " + tiny_model() + " --speculative-algorithm NGRAM --compare NONE",
       "specactor: error: --compare: expected ALGO or ALGO:PATH with a speculative algorithm"},
      {"bench --model-path " + tiny_model() + " --speculative-algorithm NGRAM --compare DFLASH:",
       "specactor: error: --compare: DFLASH: names no path after ':'"},
      {"bench --model-path " + tiny_model() + " --all-drafters --compare NGRAM",
       "specactor: error: --compare: not with --all-drafters"},
      {"serve --model-path " + tiny_model() + " --workers 127.0.0.1",
       "specactor: error: --workers: '127.0.0.1': no port (expected HOST:PORT[,HOST:PORT...]"},
      {"serve --model-path " + tiny_model() + " --workers 127.0.0.1:99999", "the port is outside 1..65535"},
      {"serve --model-path " + tiny_model() + " --workers 127.0.0.1:31000,,127.0.0.1:31001", "an empty address"},
      {"serve --model-path " + tiny_model() + " --workers 127.0.0.1:31000,127.0.0.1:31000", "listed twice"},
      {"serve --model-path " + tiny_model() + " --routing round-robin",
       "specactor: error: --routing: applies only with --workers"},
      {"serve --model-path " + tiny_model() + " --workers 127.0.0.1:31000 --routing fastest",
       "--routing: 'fastest' (expected cache-aware, least-loaded or round-robin)"},
      {"serve --model-path " + tiny_model() + " --workers 127.0.0.1:31000 --threads 2",
       "specactor: error: --threads: the workers run the model, so give it to each `specactor worker`"},
      {"worker --model-path /nonexistent.gguf --port 0", "specactor: error: /nonexistent.gguf: cannot open"},
      {"config --model-path " + tiny_model() + " --speculative-algorithm NONE --speculative-draft-worker 127.0.0.1:1",
       "--speculative-draft-worker: is set but --speculative-algorithm is NONE"},
      {"config --model-path " + tiny_model() + " --speculative-draft-worker-tls-ca /etc/hostname",
       "--speculative-draft-worker-tls-ca: applies only with --speculative-draft-worker"},
      {"config --model-path " + tiny_model() +
           " --speculative-algorithm NGRAM --speculative-draft-worker 127.0.0.1:1 --speculative-draft-worker-tls-ca "
           "/etc/hostname",
       "--speculative-draft-worker-tls-certificate: is required with the other --speculative-draft-worker-tls-* "
       "flags"},
      {"generate --model-path " + tiny_model() +
           " --prompt hi --speculative-algorithm NGRAM --speculative-draft-worker 127.0.0.1",
       "--speculative-draft-worker: '127.0.0.1': no port"},
      {"worker --model-path " + tiny_model() + " --port 0 --tls-certificate /etc/hostname",
       "--tls-key: is required with the other TLS flags"},
      {"worker --model-path " + tiny_model() + " --port 0 --role both", "--role"},
      {"worker --model-path " + tiny_model() + " --port 70000",
       "specactor: error: --port: must be in [0, 65535] (got 70000; 0 picks a free one)"},
  };
  if (!specactor::kernels::cuda_backend())  // on a GPU machine these are not errors
    for (const char* cmd : {"bench", "generate --prompt hi"})
      cases.push_back({std::string(cmd) + " --model-path " + tiny_model() + " --device cuda",
                       "specactor: error: --device cuda: no usable CUDA device ("});
  for (const auto& c : cases) {
    CAPTURE(c.args);
    const Run r = run(c.args);
    CHECK(r.rc == 2);
    CHECK(r.out.empty());
    CHECK_MESSAGE(r.err.find(c.expect) != std::string::npos, r.err);
  }
  ::unsetenv("SPECACTOR_MODELS_DIR");
}

TEST_CASE("specactor bench --all-drafters: every drafter against plain decoding, outputs identical") {
  const std::string model = default_model();
  if (model.empty()) {
    SKIP_CASE("no default model", "models/SmolLM2-135M-Instruct.Q4_1.gguf is not fetched (run tools/setup)");
  }
  const fs::path p = fs::temp_directory_path() / ("specactor_one_prompt." + std::to_string(::getpid()) + ".jsonl");
  std::ofstream(p) << "{\"category\": \"chat\", \"prompt\": \"Name three colors.\"}\n";
  const Run r = run("bench --model-path " + model + " --all-drafters --prompts " + p.string() +
                    " --max-new-tokens 8 --repeats 1 --json --log-level warn");
  fs::remove(p);
  REQUIRE_MESSAGE(r.rc == 0, r.err);
  const json j = json::parse(r.out);
  REQUIRE(j["drafters"].size() == 8);  // NGRAM, STANDALONE, EAGLE, EAGLE3, MTP, FROZEN_KV_MTP, DFLASH, DSPARK
  std::vector<std::string> labels;
  for (const auto& d : j["drafters"]) {
    CAPTURE(d.dump());
    CHECK(d["error"] == "");
    CHECK(d["outputs_identical_to_plain"] == true);
    CHECK(d["plain_tokens_per_s"].get<double>() > 0);
    labels.push_back(d["drafter"].get<std::string>());
  }
  // The default model ships an EAGLE3 head and both block drafters (heads/): those are benched, not
  // random ones; EAGLE and MTP have none shipped and stay random.
  CHECK(labels[3] == "EAGLE3 (shipped head)");
  CHECK(labels[2] == "EAGLE (random head)");
  CHECK(labels[6] == "DFLASH (shipped drafter)");
  CHECK(labels[7] == "DSPARK (shipped drafter)");
  const Run bad = run("bench --model-path " + model + " --all-drafters --speculative-algorithm NGRAM");
  CHECK(bad.rc == 2);
  CHECK(bad.err.find("--all-drafters: picks the algorithms itself") != std::string::npos);
}

TEST_CASE("specactor bench --sweep: the budget beside fixed shapes in one run, compared per category") {
  const std::string model = default_model();
  if (model.empty()) {
    SKIP_CASE("no default model", "models/SmolLM2-135M-Instruct.Q4_1.gguf is not fetched (run tools/setup)");
  }
  const fs::path p = fs::temp_directory_path() / ("specactor_sweep." + std::to_string(::getpid()) + ".jsonl");
  std::ofstream(p) << "{\"category\": \"chat\", \"prompt\": \"Count: one, two, one, two, one, two,\"}\n"
                   << "{\"category\": \"code\", \"prompt\": \"def f(x):\\n    return x\\ndef g(x):\\n    return\"}\n";
  const std::string base = "bench --model-path " + model + " --speculative-algorithm NGRAM --prompts " + p.string() +
                           " --max-new-tokens 6 --repeats 1 --concurrency 0 --json --sweep";
  const Run r = run(base);
  const Run fixed_only = run(base + " --speculative-adaptive false");
  fs::remove(p);
  REQUIRE_MESSAGE(r.rc == 0, r.err);
  const json j = json::parse(r.out);
  const json& s = j["settings"];
  REQUIRE(s.size() == 13);  // the budget, then steps {1,2,3,4,6,8} × topk {1,4}
  CHECK(s[0]["label"] == "budget");
  CHECK(s[0]["flags"].empty());
  for (std::size_t i = 1; i < s.size(); ++i) {
    const auto f = s[i]["flags"].get<std::vector<std::string>>();
    CHECK(f.size() == 8);
    CHECK(f[6] == "--speculative-adaptive");
    CHECK(f[7] == "false");
  }
  for (const auto& x : s) CHECK(x["outputs_identical_to_plain"] == true);
  // Each category's best fixed shape, found here from the settings themselves.
  REQUIRE(j["budget_vs_best_fixed"].size() == 3);  // chat, code, overall
  for (const auto& [cat_, v] : j["budget_vs_best_fixed"].items()) {
    const std::string cat = cat_;  // a plain variable: CAPTURE's lambda takes it (Clang 14)
    CAPTURE(cat);
    double best = 0;
    for (std::size_t i = 1; i < s.size(); ++i)
      best = std::max(best, s[i]["by_category"][cat]["median_speedup"].get<double>());
    CHECK(v["best_fixed_speedup"].get<double>() == best);
    CHECK(v["budget_speedup"].get<double>() == s[0]["by_category"][cat]["median_speedup"].get<double>());
    CHECK(v["ratio"].get<double>() == doctest::Approx(v["budget_speedup"].get<double>() / best));
  }
  // With the budget off the sweep is the fixed grid alone.
  REQUIRE_MESSAGE(fixed_only.rc == 0, fixed_only.err);
  const json k = json::parse(fixed_only.out);
  CHECK(k["settings"].size() == 12);
  CHECK(k["settings"][0]["label"] == "s1k1n2");
  CHECK_FALSE(k.contains("budget_vs_best_fixed"));
}

TEST_CASE("specactor bench --compare: other drafters as settings of the same run, per category against the first") {
  const std::string model = default_model();
  if (model.empty()) {
    SKIP_CASE("no default model", "models/SmolLM2-135M-Instruct.Q4_1.gguf is not fetched (run tools/setup)");
  }
  const fs::path p = fs::temp_directory_path() / ("specactor_compare." + std::to_string(::getpid()) + ".jsonl");
  std::ofstream(p) << "{\"category\": \"chat\", \"prompt\": \"Count: one, two, one, two, one, two,\"}\n"
                   << "{\"category\": \"code\", \"prompt\": \"def f(x):\\n    return x\\ndef g(x):\"}\n";
  // The first drafter's shape flags must not reach the compared ones (each runs its own default shape).
  const Run r = run("bench --model-path " + model + " --speculative-algorithm NGRAM --speculative-num-steps 2 " +
                    "--prompts " + p.string() + " --max-new-tokens 6 --repeats 1 --concurrency 0 --json " +
                    "--compare SUFFIX --compare STANDALONE:" + model);
  fs::remove(p);
  REQUIRE_MESSAGE(r.rc == 0, r.err);
  const json j = json::parse(r.out);
  REQUIRE(j["settings"].size() == 3);
  CHECK(j["settings"][0]["label"] == "NGRAM");
  CHECK(j["settings"][1]["label"] == "SUFFIX");
  CHECK(j["settings"][1]["flags"] == json{"--speculative-algorithm", "SUFFIX"});
  CHECK(j["settings"][2]["label"].get<std::string>().rfind("STANDALONE (", 0) == 0);
  CHECK(j["settings"][2]["flags"] ==
        json{"--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", model});
  for (const auto& s : j["settings"]) CHECK(s["outputs_identical_to_plain"] == true);
  REQUIRE(j["against_first"].size() == 2);
  for (std::size_t i = 0; i < 2; ++i)
    for (const auto& [cat_, v] : j["against_first"][i]["by_category"].items()) {
      const std::string cat = cat_;
      CAPTURE(cat);
      const double mine = j["settings"][i + 1]["by_category"][cat]["median_speedup"].get<double>();
      const double first = j["settings"][0]["by_category"][cat]["median_speedup"].get<double>();
      CHECK(v["speedup"].get<double>() == mine);
      CHECK(v["ratio"].get<double>() == doctest::Approx(mine / first));
    }
  CHECK(j["against_first"][0]["by_category"].size() == 3);  // chat, code, overall
}

TEST_CASE("specactor bench --concurrency: n requests in flight over the prompts, both modes the same work") {
  const std::string model = default_model();
  if (model.empty()) {
    SKIP_CASE("no default model", "models/SmolLM2-135M-Instruct.Q4_1.gguf is not fetched (run tools/setup)");
  }
  const fs::path p = fs::temp_directory_path() / ("specactor_conc." + std::to_string(::getpid()) + ".jsonl");
  std::ofstream(p) << "{\"category\": \"chat\", \"prompt\": \"Count: one, two, one, two, one, two,\"}\n"
                   << "{\"category\": \"code\", \"prompt\": \"def f(x):\\n    return x\\ndef g(x):\\n    return\"}\n";
  const Run r = run("bench --model-path " + model + " --speculative-algorithm NGRAM --prompts " + p.string() +
                    " --max-new-tokens 6 --repeats 1 --concurrency 3 --json --log-level trace");
  fs::remove(p);
  REQUIRE_MESSAGE(r.rc == 0, r.err);
  // The user's --log-level reaches the engines the bench starts (it used to be overridden by warn).
  CHECK(r.err.find("budget: request") != std::string::npos);
  const json j = json::parse(r.out);
  REQUIRE(j["concurrent"].size() == 1);
  const json& c = j["concurrent"][0];
  CHECK(c["requests"] == 3);
  CHECK(c["requests_per_run"] == 18);  // at least 6 per client, every prompt at least once
  // Two runs per mode (both orders), every request streamed: the same tokens plain and speculative.
  const auto plain = c["time"]["plain"]["tokens"].get<std::int64_t>();
  CHECK(plain > 2 * 18);
  CHECK(plain <= 2 * 18 * 6);
  CHECK(c["time"]["speculative"]["tokens"].get<std::int64_t>() == plain);
  // The same prompts in both modes; what the prefix cache gives is reported per mode.
  const auto prompt_tokens = c["time"]["plain"]["prompt_tokens"].get<std::int64_t>();
  CHECK(prompt_tokens > 0);
  CHECK(c["time"]["speculative"]["prompt_tokens"].get<std::int64_t>() == prompt_tokens);
  CHECK(c["time"]["plain"]["prompt_tokens_from_cache"].get<std::int64_t>() <= prompt_tokens);
  CHECK(c["ratio"].get<double>() ==
        doctest::Approx(c["speculative_tokens_per_s"].get<double>() / c["plain_tokens_per_s"].get<double>()));
  REQUIRE(c["pair_ratios"].size() == 2);  // one engine per order
  const double a = c["pair_ratios"][0].get<double>(), b = c["pair_ratios"][1].get<double>();
  CHECK(a > 0);
  CHECK(c["balanced_ratio"].get<double>() == doctest::Approx(std::sqrt(a * b)));
  CHECK(c["drain_plain_tokens_per_s"].get<double>() > 0);
  CHECK(c["drain_speculative_tokens_per_s"].get<double>() > 0);
}

TEST_CASE("specactor bench: a prompt's own max_new_tokens, and {previous} filled with the answer before it") {
  const std::string model = default_model();
  if (model.empty()) {
    SKIP_CASE("no default model", "models/SmolLM2-135M-Instruct.Q4_1.gguf is not fetched (run tools/setup)");
  }
  const fs::path p = fs::temp_directory_path() / ("specactor_chain." + std::to_string(::getpid()) + ".jsonl");
  std::ofstream(p) << "{\"category\": \"edit\", \"prompt\": \"Write one line of Python.\", \"max_new_tokens\": 5}\n"
                   << "{\"category\": \"edit\", \"prompt\": \"Here is a file:\\n{previous}\\nRepeat it.\"}\n";
  const Run r = run("bench --model-path " + model + " --speculative-algorithm NGRAM --prompts " + p.string() +
                    " --max-new-tokens 7 --repeats 1 --concurrency 0 --json");
  fs::remove(p);
  REQUIRE_MESSAGE(r.rc == 0, r.err);
  const json j = json::parse(r.out);
  const json& bp = j["settings"][0]["by_prompt"];
  REQUIRE(bp.size() == 2);
  CHECK(bp[0]["generated_tokens"].get<int>() == 5);  // its own limit, not the run's 7
  CHECK(bp[1]["generated_tokens"].get<int>() <= 7);
  const std::string second = bp[1]["prompt"].get<std::string>();
  CHECK(second.rfind("Here is a file:\n", 0) == 0);
  CHECK(second.find("{previous}") == std::string::npos);
  CHECK(second.size() > std::string("Here is a file:\n\nRepeat it.").size());  // the first answer went in
}

TEST_CASE("specactor bench: a malformed prompt file names the file and the line") {
  const fs::path p = fs::temp_directory_path() / ("specactor_prompts." + std::to_string(::getpid()) + ".jsonl");
  std::ofstream(p) << "{\"category\": \"chat\", \"prompt\": \"hi\"}\n{oops\n";
  const Run r = run("bench --model-path " + tiny_model() + " --speculative-algorithm NGRAM --prompts " + p.string());
  CHECK(r.rc == 2);
  CHECK_MESSAGE(r.err.find("--prompts " + p.string() + ":2: not valid JSON") != std::string::npos, r.err);
  std::ofstream(p) << "{\"category\": \"chat\"}\n";
  const Run r2 = run("bench --model-path " + tiny_model() + " --speculative-algorithm NGRAM --prompts " + p.string());
  CHECK(r2.rc == 2);
  CHECK_MESSAGE(r2.err.find(":1: expected {\"category\": ..., \"prompt\": \"...\"}") != std::string::npos, r2.err);
  std::ofstream(p) << "{\"prompt\": \"hi\"}\n{\"prompt\": \"again\", \"max_new_tokens\": 0}\n";
  const Run r3 = run("bench --model-path " + tiny_model() + " --speculative-algorithm NGRAM --prompts " + p.string());
  CHECK(r3.rc == 2);
  CHECK_MESSAGE(r3.err.find(":2: \"max_new_tokens\" must be an integer from 1 to 4096") != std::string::npos, r3.err);
  std::ofstream(p) << "{\"prompt\": \"Fix this: {previous}\"}\n";
  const Run r4 = run("bench --model-path " + tiny_model() + " --speculative-algorithm NGRAM --prompts " + p.string());
  CHECK(r4.rc == 2);
  CHECK_MESSAGE(r4.err.find(":1: {previous} in the first prompt") != std::string::npos, r4.err);
  fs::remove(p);
}

TEST_CASE("specactor inspect and devices") {
  const Run r = run("inspect --json " + tiny_model());
  REQUIRE_MESSAGE(r.rc == 0, r.err);
  const json j = json::parse(r.out);
  CHECK(j["architecture"] == "llama");
  CHECK(j["num_layers"] == 2);
  CHECK(j["vocab_size"] == 64);
  const Run text = run("inspect " + tiny_model());
  CHECK(text.rc == 0);
  CHECK(text.out.find("num_kv_heads") != std::string::npos);

  const Run d = run("devices");
  REQUIRE(d.rc == 0);
  const json dj = json::parse(d.out);
  CHECK((dj["backend"] == "cpu" || dj["backend"] == "cuda"));
  CHECK(dj["cuda_usable"] == (dj["backend"] == "cuda"));
  // The CPU's integer path and why: the reason starts with the path's name; an override is followed
  // and named (vnni256 only where the CPU has VNNI).
  const std::string ip = dj["cpu_integer_path"];
  CHECK(dj["cpu_integer_path_reason"].get<std::string>().rfind(ip, 0) == 0);
  for (const char* want : {"scalar", "vnni256"}) {
    CAPTURE(want);
    ::setenv("SPECACTOR_CPU_PATH", want, 1);
    const Run o = run("devices");
    ::unsetenv("SPECACTOR_CPU_PATH");
    REQUIRE(o.rc == 0);
    const json oj = json::parse(o.out);
    const std::string path = oj["cpu_integer_path"], why = oj["cpu_integer_path_reason"];
    CHECK(why.rfind(path, 0) == 0);
    if (std::string(want) == "scalar") {
      CHECK(path == "scalar");
      CHECK(oj["cpu_float_path"] == "scalar");
    }
    if (std::string(want) == "scalar" || ip == "avx512-vnni" || ip == "avx512-vnni-512" || ip == "amx") {
      CHECK(why.find(std::string("SPECACTOR_CPU_PATH=") + want) != std::string::npos);
      if (std::string(want) == "vnni256") CHECK(path == "avx512-vnni");
    }
  }
}

TEST_CASE("default model on the tile emulator: greedy equals the scalar path, speculative equals plain") {
  const std::string model = default_model();
  if (model.empty()) {
    SKIP_CASE("no default model", "models/SmolLM2-135M-Instruct.Q4_1.gguf is not fetched (run tools/setup)");
  }
  // A chat prompt of ~40 tokens: prefill in whole and partial tiles, then 1-row decode steps and
  // multi-row verification steps, every call of Q4_1/Q8_0 on the emulated tiles.
  // Drafts with a fixed shape, so that every decode step verifies (the budget might draft nothing here).
  auto tokens = [&](const char* path, const std::string& algorithm) {
    ::setenv("SPECACTOR_CPU_PATH", path, 1);
    const Run r = run("generate --model-path " + model +
                      " --chat --prompt 'Write a short list of three fruits and say one thing about each.'"
                      " --max-new-tokens 24 --temperature 0 --json --log-level warn --speculative-algorithm " +
                      algorithm + (algorithm == "NONE" ? "" : " --speculative-adaptive false"));
    ::unsetenv("SPECACTOR_CPU_PATH");
    REQUIRE_MESSAGE(r.rc == 0, r.err);
    const json j = json::parse(r.out);
    if (algorithm != "NONE") CHECK(j["speculative"]["drafted"].get<int>() > 0);
    return j["tokens"].get<std::vector<int>>();
  };
  const auto scalar = tokens("scalar", "NONE");
  REQUIRE(scalar.size() == 24);
  CHECK(tokens("amx-emulated", "NONE") == scalar);
  CHECK(tokens("amx-emulated", "EAGLE3") == scalar);  // the shipped head
  CHECK(tokens("amx-emulated", "NGRAM") == scalar);
  ::setenv("SPECACTOR_CPU_PATH", "amx-emulated", 1);
  const Run d = run("devices");
  ::unsetenv("SPECACTOR_CPU_PATH");
  REQUIRE(d.rc == 0);
  CHECK(json::parse(d.out)["cpu_integer_path"] == "amx-emulated");
}

// A tiny Llama whose matrices are K-quants, as a Q4_K_M file mixes them: Q4_K for q, k, o, gate and
// up, Q6_K for v, down and the output head (random valid blocks; widths multiples of 256).
std::string kquant_model() {
  static const std::string path = [] {
    specactor::testing::TinyLlamaShape shape;
    shape.hidden = 256;
    shape.ffn = 512;
    shape.heads = 4;
    shape.kv_heads = 2;
    shape.vocab = 80;
    shape.text_vocab = true;
    auto w = specactor::testing::tiny_llama(shape);
    using specactor::kernels::WeightType;
    std::uint32_t seed = 500;
    auto quant = [&](const std::string& name, WeightType t, std::uint64_t in, std::uint64_t out) {
      w.remove_tensor(name);
      w.tensor(
          name, static_cast<std::uint32_t>(t), {in, out},
          specactor::testing::random_weights(t, static_cast<std::int64_t>(out), static_cast<std::int64_t>(in), ++seed));
    };
    const std::uint64_t h = shape.hidden, f = shape.ffn, kv = h / shape.heads * shape.kv_heads;
    for (std::uint32_t l = 0; l < shape.layers; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      quant(b + "attn_q.weight", WeightType::Q4_K, h, h);
      quant(b + "attn_k.weight", WeightType::Q4_K, h, kv);
      quant(b + "attn_v.weight", WeightType::Q6_K, h, kv);
      quant(b + "attn_output.weight", WeightType::Q4_K, h, h);
      quant(b + "ffn_gate.weight", WeightType::Q4_K, h, f);
      quant(b + "ffn_up.weight", WeightType::Q4_K, h, f);
      quant(b + "ffn_down.weight", WeightType::Q6_K, f, h);
    }
    quant("output.weight", WeightType::Q6_K, h, shape.vocab);
    const fs::path p = fs::temp_directory_path() / ("specactor_cli_kquant." + std::to_string(::getpid()) + ".gguf");
    w.write(p.string());
    return p.string();
  }();
  return path;
}

TEST_CASE("K-quant model on the tile emulator: greedy equals the scalar path, speculative equals plain") {
  // Prefill of 16+ rows and verification steps of several rows: every Q4_K/Q6_K product of 2+ rows on
  // the emulated tiles (the load line says so), 1-row steps on the SIMD path; the bits must not move.
  const std::string prompt = "the cat sat on the mat and the dog sat on the log";
  auto generate = [&](const char* path, const std::string& algorithm) {
    ::setenv("SPECACTOR_CPU_PATH", path, 1);
    const Run r = run("generate --model-path " + kquant_model() + " --prompt '" + prompt +
                      "' --max-new-tokens 40 --temperature 0 --json --log-level info --speculative-algorithm " +
                      algorithm + (algorithm == "NONE" ? "" : " --speculative-adaptive false"));
    ::unsetenv("SPECACTOR_CPU_PATH");
    REQUIRE_MESSAGE(r.rc == 0, r.err);
    return std::make_pair(json::parse(r.out), r.err);
  };
  const auto [scalar, scalar_err] = generate("scalar", "NONE");
  const auto want = scalar["tokens"].get<std::vector<int>>();
  REQUIRE(want.size() == 40);
  const auto [plain, plain_err] = generate("amx-emulated", "NONE");
  CHECK(plain["tokens"].get<std::vector<int>>() == want);
  CHECK(plain_err.find("Q4_K/Q6_K calls of 1+ rows") != std::string::npos);
  CHECK(plain_err.find("MiB more memory") != std::string::npos);
  for (const char* algorithm : {"NGRAM", "SUFFIX"}) {
    const auto [spec, spec_err] = generate("amx-emulated", algorithm);
    const json& sj = spec;
    CAPTURE(algorithm);
    CHECK(sj["tokens"].get<std::vector<int>>() == want);
    CHECK(sj["speculative"]["drafted"].get<int>() > 0);
  }
}

TEST_CASE("specactor bench --depths: prefill of and decode after each context, against the bandwidth limit") {
  const Run r =
      run("bench --model-path " + tiny_model() +
          " --speculative-algorithm NONE --prompt-tokens 8 --decode-tokens 4 --repeats 1 --depths 0,40 --json "
          "--log-level warn");
  REQUIRE_MESSAGE(r.rc == 0, r.err);
  const json j = json::parse(r.out);
  CHECK(j["tile_copy_bytes"] == 0);  // float weights: no tile copy whatever the path
  CHECK(j.contains("tile_rows"));
  REQUIRE(j["depths"].size() == 2);
  CHECK(j["depths"][0]["depth"] == 0);
  CHECK(j["depths"][0]["prefill_tokens_per_s"] == 0.0);  // nothing to prefill
  CHECK(j["depths"][1]["depth"] == 40);
  CHECK(j["depths"][1]["prefill_tokens_per_s"].get<double>() > 0);
  for (const auto& d : j["depths"]) {
    CHECK(d["decode_tokens_per_s"].get<double>() > 0);
    CHECK(d["decode_tokens_per_s_without_actors"].get<double>() > 0);
    CHECK(d["fraction_of_bandwidth_ceiling"].get<double>() > 0);
  }
  // A deeper context reads more bytes per token, so its limit is lower.
  CHECK(j["depths"][1]["bytes_per_decode_token"].get<double>() >
        j["depths"][0]["bytes_per_decode_token"].get<double>());
  CHECK(!j["cpu_path_reason"].get<std::string>().empty());

  const Run deep = run("bench --model-path " + tiny_model() +
                       " --speculative-algorithm NONE --prompt-tokens 8 --decode-tokens 4 --depths 0,5000");
  CHECK(deep.rc == 2);
  CHECK_MESSAGE(deep.err.find("--depths: 5000 + --decode-tokens 4 exceed the context length 128") != std::string::npos,
                deep.err);
  const Run spec = run("bench --model-path " + tiny_model() + " --speculative-algorithm NGRAM --depths 16");
  CHECK(spec.rc == 2);
  CHECK_MESSAGE(spec.err.find("--depths: only with the CPU speed run") != std::string::npos, spec.err);
}

TEST_CASE("specactor config --help lists every flag") {
  const Run r = run("config --help");
  CHECK(r.rc == 0);
  CHECK(r.out.find("--speculative-num-draft-tokens") != std::string::npos);
  CHECK(r.out.find("--json-model-override-args") != std::string::npos);
}

TEST_CASE("specactor make-head writes heads that inspect reads and checks against a target") {
  const fs::path dir = fs::temp_directory_path() / ("specactor_cli_heads." + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (const char* kind : {"EAGLE", "EAGLE3", "MTP"})
    for (const char* format : {"gguf", "safetensors"}) {
      CAPTURE(kind);
      CAPTURE(format);
      const std::string out =
          (dir / (std::string(kind) + "_" + format + (std::string(format) == "gguf" ? ".gguf" : ""))).string();
      const Run w = run(std::string("make-head --target ") + tiny_model() + " --kind " + kind + " --format " + format +
                        " --out " + out + (std::string(kind) == "MTP" ? " --layers 2" : ""));
      REQUIRE_MESSAGE(w.rc == 0, w.err);
      const Run i = run("inspect " + out + " --target " + tiny_model());
      REQUIRE_MESSAGE(i.rc == 0, i.err);
      const json j = json::parse(i.out);
      CHECK(j["kind"] == kind);
      CHECK(j["hidden_size"] == 32);
      CHECK(j["num_layers"] == (std::string(kind) == "MTP" ? 2 : 1));
      CHECK(j["fits_target"] == tiny_model());
    }
  // A head made for another target: one message naming both values, exit status 2.
  const fs::path other = dir / "wide.gguf";
  specactor::testing::TinyLlamaShape wide;
  wide.hidden = 64;
  specactor::testing::tiny_llama(wide).write(other.string());
  REQUIRE(run("make-head --target " + other.string() + " --out " + (dir / "wide_head.gguf").string()).rc == 0);
  const Run bad = run("inspect " + (dir / "wide_head.gguf").string() + " --target " + tiny_model());
  CHECK(bad.rc == 2);
  CHECK(bad.err.find("head hidden size 64 does not match the target's 32") != std::string::npos);
  // bench with a head of another model: the drafter goes down at start, so there is no speculative
  // measurement to print; the run fails naming the reason instead of reporting a run without drafts.
  if (!default_model().empty()) {
    const fs::path prompts = dir / "one.jsonl";
    std::ofstream(prompts) << "{\"category\": \"chat\", \"prompt\": \"Name a color.\"}\n";
    const Run b =
        run("bench --model-path " + default_model() + " --speculative-algorithm EAGLE --speculative-draft-model-path " +
            (dir / "wide_head.gguf").string() + " --prompts " + prompts.string() +
            " --max-new-tokens 4 --repeats 1 --log-level error");
    CHECK(b.rc != 0);
    CHECK(b.out.find("setting EAGLE") == std::string::npos);
    CHECK_MESSAGE(b.err.find("the drafter went down (") != std::string::npos, b.err);
    CHECK_MESSAGE(b.err.find("does not match the target's 576") != std::string::npos, b.err);
  } else {
    MESSAGE("not run here (bench with a head of another model): the default model is not fetched (run tools/setup)");
  }
  const Run kind = run("make-head --target " + tiny_model() + " --kind MEDUSA --out " + (dir / "x.gguf").string());
  CHECK(kind.rc == 2);
  fs::remove_all(dir);
}

// --- the newcomer's path: what a user of llama.cpp, vLLM or sglang tries first -------------------

TEST_CASE("specactor generate: flags a newcomer types (typos, -m/--model, help, --system)") {
  // Typos of the command's own flags get a hint, like server flags do.
  const Run typo = run("generate --model-path " + tiny_model() + " --promt hi");
  CHECK(typo.rc == 2);
  CHECK_MESSAGE(typo.err.find("unknown flag --promt (did you mean --prompt?)") != std::string::npos, typo.err);
  const Run typo2 = run("generate --model-path " + tiny_model() + " -p hi --max-new-token 3");
  CHECK_MESSAGE(typo2.err.find("did you mean --max-new-tokens?") != std::string::npos, typo2.err);
  // -m and --model are --model-path.
  for (const char* flag : {"-m", "--model", "--model-path"}) {
    CAPTURE(flag);
    const Run c = run(std::string("config ") + flag + " " + tiny_model());
    REQUIRE_MESSAGE(c.rc == 0, c.err);
    CHECK(json::parse(c.out)["target"]["settings"]["model_path"] == tiny_model());
  }
  // The help of each command names the flags it needs, and the settings' docs match the code.
  const Run gh = run("generate --help");
  CHECK(gh.rc == 0);
  for (const char* f : {"--prompt", "--prompt-file", "--max-new-tokens", "--model-path", "--speculative-algorithm"})
    CHECK_MESSAGE(gh.out.find(f) != std::string::npos, f);
  const Run sh = run("serve --help");
  for (const char* f : {"--model-path", "--host", "--port", "--api-key"})
    CHECK_MESSAGE(sh.out.find(f) != std::string::npos, f);
  const Run ch = run("config --help");
  const auto line_of = [&](const std::string& flag) {
    const auto at = ch.out.find("  " + flag + " ");
    return at == std::string::npos ? std::string() : ch.out.substr(at, ch.out.find('\n', at) - at);
  };
  CHECK(line_of("--tokenizer-path").find("a tokenizer.json (BPE: byte-level, or SentencePiece") != std::string::npos);
  CHECK(line_of("--dtype").find("refused") != std::string::npos);
  CHECK(line_of("--kv-cache-dtype").find("auto = float16 on the CPU in the fast precision") != std::string::npos);
  CHECK(line_of("--speculative-accept-threshold-single").find("only 1 is accepted") != std::string::npos);
  // --system belongs to a chat.
  const Run sys = run("generate --model-path " + tiny_model() + " -p hi --system brief");
  CHECK(sys.rc == 2);
  CHECK(sys.err.find("--system: needs --chat") != std::string::npos);
  // Neither prompt flag, or both.
  CHECK(run("generate --model-path " + tiny_model()).err.find("--prompt is required (or --prompt-file FILE") !=
        std::string::npos);
  CHECK(run("generate --model-path " + tiny_model() + " -p hi --prompt-file x").err.find("give one of them") !=
        std::string::npos);
}

TEST_CASE("specactor generate on the default model: last flag wins, prompt files, the context rule, the default path") {
  const std::string model = default_model();
  if (model.empty()) {
    SKIP_CASE("no default model", "models/SmolLM2-135M-Instruct.Q4_1.gguf is not fetched (run tools/setup)");
  }
  const std::string gen = "generate --log-level warn --json -n 4 --model-path " + model;
  const Run b = run(gen + " --prompt " + specactor::testing::shell_quote("Name a color."));
  REQUIRE_MESSAGE(b.rc == 0, b.err);
  const json want = json::parse(b.out);
  // On by default: the shipped EAGLE3 head with the budget; NONE gives the same tokens without it.
  CHECK(want["speculative"]["algorithm"] == "EAGLE3");
  CHECK(want["speculative"].contains("budget_skipped_steps"));
  const Run plain =
      run(gen + " --speculative-algorithm NONE --prompt " + specactor::testing::shell_quote("Name a color."));
  REQUIRE_MESSAGE(plain.rc == 0, plain.err);
  CHECK(json::parse(plain.out)["speculative"]["algorithm"] == "NONE");
  CHECK(json::parse(plain.out)["tokens"] == want["tokens"]);
  // --json-schema: the answer is held to the schema, the same with and without speculation.
  const std::string schema =
      R"({"type":"object","properties":{"color":{"enum":["red","green","blue"]}},"required":["color"]})";
  const std::string ask = " --prompt " + specactor::testing::shell_quote("Name a color.") + " --json-schema " +
                          specactor::testing::shell_quote(schema);
  const Run js = run("generate --log-level warn --json -n 16 --model-path " + model + ask);
  const Run js_plain =
      run("generate --log-level warn --json -n 16 --speculative-algorithm NONE --model-path " + model + ask);
  REQUIRE_MESSAGE(js.rc == 0, js.err);
  REQUIRE_MESSAGE(js_plain.rc == 0, js_plain.err);
  const json answer = json::parse(json::parse(js.out)["text"].get<std::string>());
  CHECK((answer == json{{"color", "red"}} || answer == json{{"color", "green"}} || answer == json{{"color", "blue"}}));
  CHECK(json::parse(js.out)["tokens"] == json::parse(js_plain.out)["tokens"]);
  const Run auto_cfg = run("config --log-level warn --model-path " + model);
  REQUIRE_MESSAGE(auto_cfg.rc == 0, auto_cfg.err);
  CHECK(auto_cfg.out.find("auto.speculative_algorithm (a head ships for this model)") != std::string::npos);
  // tools/setup run -- --prompt X: the later --prompt replaces setup's own.
  const Run twice =
      run(gen + " --prompt 'What is two plus two?' --prompt " + specactor::testing::shell_quote("Name a color."));
  REQUIRE_MESSAGE(twice.rc == 0, twice.err);
  CHECK(json::parse(twice.out)["prompt_tokens"] == want["prompt_tokens"]);
  CHECK(json::parse(twice.out)["tokens"] == want["tokens"]);
  // The same prompt from a file and from standard input (a trailing newline is not part of it).
  const fs::path pf = fs::temp_directory_path() / ("specactor_cli_prompt." + std::to_string(::getpid()));
  std::ofstream(pf) << "Name a color.\n";
  const Run file = run(gen + " --prompt-file " + pf.string());
  REQUIRE_MESSAGE(file.rc == 0, file.err);
  CHECK(json::parse(file.out)["tokens"] == want["tokens"]);
  const Run in = run(gen + " --prompt-file - < " + pf.string());
  REQUIRE_MESSAGE(in.rc == 0, in.err);
  CHECK(json::parse(in.out)["prompt_tokens"] == want["prompt_tokens"]);
  fs::remove(pf);
  // More new tokens than the context leaves: refused, naming the flag (never shortened); unset, the
  // request gets the room the context leaves.
  const Run over = run("generate --model-path " + model + " -p hi -n 100000 --context-length 40 --ignore-eos --json");
  CHECK(over.rc == 2);
  CHECK_MESSAGE(
      over.err.find("--max-new-tokens: this model's maximum context length is 40 tokens") != std::string::npos,
      over.err);
  const Run fill = run("generate --model-path " + model + " -p hi --context-length 40 --ignore-eos --json");
  REQUIRE_MESSAGE(fill.rc == 0, fill.err);
  const json cj = json::parse(fill.out);
  CHECK(cj["finish_reason"] == "length");
  CHECK(cj["prompt_tokens"].size() + cj["tokens"].size() == 40);
  // No --model-path: the model tools/setup fetched, found from outside the checkout too.
  const Run cfg = run("config", 120, fs::temp_directory_path().string());
  REQUIRE_MESSAGE(cfg.rc == 0, cfg.err);
  CHECK(fs::equivalent(json::parse(cfg.out)["target"]["settings"]["model_path"].get<std::string>(), model));
  CHECK(cfg.err.find("no --model-path given: using the default model") != std::string::npos);
  // bench's default prompt set is found beside the binary, not in the working directory.
  const Run bench = run("bench --speculative-algorithm NGRAM --max-new-tokens 4 --repeats 1 --json --log-level warn",
                        300, fs::temp_directory_path().string());
  REQUIRE_MESSAGE(bench.rc == 0, bench.err);
  CHECK(json::parse(bench.out)["prompts"].get<std::string>().ends_with("cli/bench_prompts.jsonl"));
}

TEST_CASE("the README's example question is answered right in the default precision") {
  const std::string model = default_model();
  if (model.empty()) {
    SKIP_CASE("no default model", "models/SmolLM2-135M-Instruct.Q4_1.gguf is not fetched (run tools/setup)");
  }
  // The bare "What is the capital of France?" is a close call in the fast precision (as in llama.cpp);
  // the examples ask for one sentence, which both precisions answer right.
  for (const char* precision : {"fast", "exact"}) {
    CAPTURE(precision);
    const Run r = run("generate --log-level warn --chat -n 24 --cpu-precision " + std::string(precision) +
                      " -p 'What is the capital of France? Answer in one sentence.' --model-path " + model);
    REQUIRE_MESSAGE(r.rc == 0, r.err);
    CHECK_MESSAGE(r.out.find("Paris") != std::string::npos, r.out);
  }
}

TEST_CASE("specactor generate: Ctrl-C ends the line, prints the summary, and --json still prints its object") {
  const std::string model = default_model();
  if (model.empty()) {
    SKIP_CASE("no default model", "models/SmolLM2-135M-Instruct.Q4_1.gguf is not fetched (run tools/setup)");
  }
  const fs::path dir = fs::temp_directory_path() / ("specactor_cli_sigint." + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (const bool as_json : {false, true}) {
    CAPTURE(as_json);
    const std::string out = (dir / "out").string(), err = (dir / "err").string();
    // Started in the background, interrupted once the first output (text, or the load log) is there.
    const std::string script = std::string(SPECACTOR_BINARY) + " generate --model-path " + model +
                               " -p 'Tell me a long story.' -n 4000 --ignore-eos" + (as_json ? " --json" : "") + " > " +
                               out + " 2> " + err + " & p=$!; for i in $(seq 600); do grep -q 'loaded' " + err +
                               " && [ " + (as_json ? "1" : "-s " + out) + " ] && break; sleep 0.1; done; sleep " +
                               (as_json ? "1.5" : "0.5") + "; kill -INT $p; wait $p; echo $?";
    FILE* sh = ::popen(("timeout 120 sh -c " + specactor::testing::shell_quote(script)).c_str(), "r");
    REQUIRE(sh);
    char buf[64] = {};
    const std::string rc = std::fgets(buf, sizeof buf, sh) ? std::string(buf) : std::string();
    ::pclose(sh);
    CHECK(rc == "130\n");
    std::stringstream o, e;
    o << std::ifstream(out).rdbuf();
    e << std::ifstream(err).rdbuf();
    CHECK_MESSAGE(e.str().find("interrupted (Ctrl-C): the request was cancelled after") != std::string::npos, e.str());
    CHECK(e.str().find("generated") != std::string::npos);
    if (as_json) {
      // Nothing is printed before the object, so the interrupt may come before the first token on a
      // busy machine: the object holds exactly the tokens the summary counts.
      const json j = json::parse(o.str());
      CHECK(j["finish_reason"] == "cancelled");
      const std::string key = "cancelled after ";
      const std::size_t at = e.str().find(key);
      REQUIRE(at != std::string::npos);
      CHECK(j["tokens"].size() == std::stoul(e.str().substr(at + key.size())));
    } else {
      REQUIRE(!o.str().empty());
      CHECK(o.str().back() == '\n');
    }
  }
  fs::remove_all(dir);
}

TEST_CASE("specactor inspect: a Hugging Face model folder is a model, not a draft head") {
  const fs::path dir = fs::temp_directory_path() / ("specactor_cli_hf." + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto pair = specactor::testing::tiny_llama_pair();
  specactor::testing::write_safetensors((dir / "model.safetensors").string(), pair.hf);
  std::ofstream(dir / "config.json") << pair.config_json;
  const Run r = run("inspect --json " + dir.string());
  REQUIRE_MESSAGE(r.rc == 0, r.err);
  const json j = json::parse(r.out);
  CHECK(j["architecture"] == "llama");
  CHECK(j["num_layers"] == 2);
  CHECK(!j.contains("kind"));  // a head's config has a kind
  // Without a tokenizer source: the hint says what each way out allows.
  const Run gen = run("generate --model-path " + dir.string() + " -p hi");
  CHECK(gen.rc == 2);
  CHECK_MESSAGE(
      gen.err.find("no tokenizer.json beside the checkpoint; --tokenizer-path names one") != std::string::npos,
      gen.err);
  CHECK(gen.err.find("--skip-tokenizer-init runs it without one, for requests given as token ids only") !=
        std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("one bad request through the CLI, the embedding API and the HTTP API: one check, the same error") {
  const std::string model = default_model();
  if (model.empty()) {
    SKIP_CASE("no default model", "models/SmolLM2-135M-Instruct.Q4_1.gguf is not fetched (run tools/setup)");
  }
  // A short prompt and 100 new tokens in a 64-token context: too long everywhere, refused (never shortened), by
  // sched::check_request, each door naming the field its own way.
  const std::string why = "this model's maximum context length is 64 tokens; you requested ";
  const Run cli =
      run("generate --log-level warn --model-path " + model + " --context-length 64 -p 'Hello there' -n 100");
  CHECK(cli.rc == 2);
  const auto at = cli.err.find("specactor: error: --max-new-tokens: " + why);
  REQUIRE_MESSAGE(at != std::string::npos, cli.err);
  std::string cli_msg = cli.err.substr(at + std::string("specactor: error: --max-new-tokens: ").size());
  cli_msg = cli_msg.substr(0, cli_msg.find('\n'));

  auto engine = specactor::actors::Engine::from_argv(
      {"--model-path", model, "--context-length", "64", "--log-level", "warn", "--speculative-algorithm", "NONE"});
  specactor::actors::GenerationRequest req;
  req.prompt = "Hello there";
  req.max_new_tokens = 100;
  std::string field, embed_msg;
  try {
    (void)engine->generate(req);
  } catch (const specactor::actors::RequestError& e) {
    field = e.field;
    embed_msg = std::string(e.what()).substr(e.field.size() + 2);
    CHECK(e.code == "context_length_exceeded");
  }
  engine->shutdown();
  CHECK(field == "max_new_tokens");
  CHECK(embed_msg == cli_msg);

  const int port = specactor::testing::free_port();
  REQUIRE(port > 0);
  const std::string url = "http://127.0.0.1:" + std::to_string(port);
  // The server in the background, one curl once it is healthy, then SIGTERM.
  const std::string cmd = "timeout 120 sh -c '" + std::string(SPECACTOR_BINARY) +
                          " serve --log-level warn --model-path " + model + " --context-length 64 --port " +
                          std::to_string(port) + " >/dev/null 2>&1 & pid=$!; for i in $(seq 300); do curl -sf " + url +
                          "/health >/dev/null && break; sleep 0.1; done; printf BODY:; curl -s " + url +
                          "/v1/completions -H \"Content-Type: application/json\" -d "
                          "\"{\\\"prompt\\\": \\\"Hello there\\\", \\\"max_tokens\\\": 100}\"; kill $pid; wait $pid'";
  Run api{0, "", ""};
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    std::array<char, 4096> buf;
    for (std::size_t n; (n = std::fread(buf.data(), 1, buf.size(), p)) > 0;) api.out.append(buf.data(), n);
    api.rc = ::pclose(p);
  }
  const auto body = api.out.find("BODY:");
  REQUIRE_MESSAGE(body != std::string::npos, api.out);
  const json err = json::parse(api.out.substr(body + 5))["error"];
  CHECK(err["param"] == "max_tokens");
  CHECK(err["code"] == "context_length_exceeded");
  CHECK(err["message"] == "max_tokens: " + embed_msg);
}
