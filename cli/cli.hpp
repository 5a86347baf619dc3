// cli/cli.hpp — what the files of the specactor command share: flag validators that name the flag,
// server-flag handling, and each command's options and entry point (one file per command:
// cmd_generate.cpp, cmd_bench.cpp, cmd_tools.cpp; cli/specactor.cpp builds the CLI11 application).
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "actors/engine.hpp"
#include "config/server_args.hpp"
#include "model/loader.hpp"
#include "model/model_info.hpp"

namespace specactor::cli {

namespace sc = specactor::config;
namespace sm = specactor::model;
namespace sk = specactor::kernels;
namespace sa = specactor::actors;
using json = nlohmann::json;

// --- shared (cli/common.cpp) ---------------------------------------------------------------------
std::string tile_note(std::size_t bytes);
std::size_t tile_copy_bytes_of(const sm::LlamaWeights& w);
void print_server_flags();
CLI::Validator finite_number();
std::string flag_of(const std::string& field);
// Server flags (everything a subcommand does not declare itself) → the resolved target snapshot.
struct Resolved {
  sc::Snapshot target;
  sm::ModelInfo info;
};
Resolved resolve_from_args(const std::vector<std::string>& args);
double seconds_since(std::chrono::steady_clock::time_point t0);
void front_flags_only(const std::vector<std::string>& rest);
std::vector<std::string> server_rest(const CLI::App& cmd);
std::string common_server_flags(const std::vector<std::string>& fields);

// An integer that must be at least `lo` (and fit T): "--repeats: must be >= 1 (got 0)".
template <class T>
CLI::Validator integer_at_least(T lo) {
  return CLI::Validator(
      [lo](std::string& v) -> std::string {
        long long x = 0;
        std::size_t used = 0;
        try {
          x = std::stoll(v, &used);
        } catch (const std::out_of_range&) {
          return v + " is out of range [" + std::to_string(lo) + ", " + std::to_string(std::numeric_limits<T>::max()) +
                 "]";
        } catch (const std::exception&) {
        }
        if (used == 0 || used != v.size()) return "'" + v + "' is not a valid integer";
        if (x < static_cast<long long>(std::numeric_limits<T>::min()) ||
            (x > 0 &&
             static_cast<unsigned long long>(x) > static_cast<unsigned long long>(std::numeric_limits<T>::max())))
          return v + " is out of range [" + std::to_string(std::numeric_limits<T>::min()) + ", " +
                 std::to_string(std::numeric_limits<T>::max()) + "]";
        if (x < static_cast<long long>(lo)) return "must be >= " + std::to_string(lo) + " (got " + v + ")";
        return {};
      },
      "INT >= " + std::to_string(lo), "integer_at_least");
}

// --- generate (cli/cmd_generate.cpp) -------------------------------------------------------------
// `generate`'s own flags (the rest of its command line are server flags).
struct GenerateOptions {
  sa::GenerationRequest req;
  std::string prompt_file;
  std::uint64_t seed = 0;
  bool has_seed = false;
  std::int64_t max_new_tokens = 0;
  bool max_new_given = false;
  bool json = false;
  std::vector<std::string> logit_bias;        // ID=BIAS
  std::string json_schema, json_schema_file;  // constrained output (grammar/), or:
  bool json_object = false;
};
void add_generate_flags(CLI::App& cmd, GenerateOptions& o);
void take_prompt(GenerateOptions& o, bool prompt_given);
int cmd_generate(GenerateOptions o, const std::vector<std::string>& rest);

// --- bench (cli/cmd_bench.cpp) -------------------------------------------------------------------
// `bench`'s own flags. Defaults that depend on the mode are left unset (0 / empty) here.
struct BenchOptions {
  std::int64_t prompt_tokens = 256, decode_tokens = 128, repeats = 0, max_new_tokens = 64;
  std::string prompts, chart;  // prompts: default the shipped set (cli/bench_prompts.jsonl), found beside the binary
  bool json = false, sweep = false, all_drafters = false;
  std::vector<std::int64_t> concurrency{4, 16};
  std::vector<std::string> compare;  // speculative runs: more drafters (ALGO or ALGO:PATH) in the same run
  std::vector<std::int64_t> depths;  // speed run: also prefill of / decode after each of these contexts
};
void add_bench_flags(CLI::App& cmd, BenchOptions& o);
int cmd_bench(BenchOptions o, const std::vector<std::string>& rest);

// --- config, inspect, make-head, shrink, devices (cli/cmd_tools.cpp) -----------------------------
int cmd_config(const std::vector<std::string>& args);
struct InspectOptions {
  std::string path, target;
  bool json = false, tensors = false;
};
void add_inspect_flags(CLI::App& cmd, InspectOptions& o);
int cmd_inspect(const InspectOptions& o);
struct MakeHeadOptions {
  std::string target, out, kind = "EAGLE", format;  // format "": gguf for heads, safetensors for DFLASH
  std::int64_t layers = 1, draft_vocab = 0, block_size = 8, markov_rank = 32;
  bool markov_rank_given = false;
  std::uint32_t seed = 1;
  bool own_output = false;
};
void add_make_head_flags(CLI::App& cmd, MakeHeadOptions& o);
int cmd_make_head(const MakeHeadOptions& o);
struct ShrinkOptions {
  std::string model, out;
  std::int64_t layers = 0;
};
void add_shrink_flags(CLI::App& cmd, ShrinkOptions& o);
int cmd_shrink(const ShrinkOptions& o);
int cmd_devices();

}  // namespace specactor::cli
