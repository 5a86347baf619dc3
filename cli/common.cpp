// cli/common.cpp — what the commands share: the tile note, the validators that name the flag, server flags.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <future>
#include <iostream>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "actors/engine.hpp"
#include "actors/replica.hpp"
#include "cli/bench.hpp"
#include "cli/cli.hpp"
#include "cli/make_data.hpp"
#include "cli/paths.hpp"
#include "config/error.hpp"
#include "config/input.hpp"
#include "config/resolve.hpp"
#include "kernels/backend.hpp"
#include "kernels/cpu/machine.hpp"
#include "kernels/cpu/matmul.hpp"
#include "kernels/cpu/packed.hpp"
#include "kernels/cpu/pool.hpp"
#include "kernels/cpu/sampling.hpp"
#include "model/gguf.hpp"
#include "model/head_model.hpp"
#include "model/head_writer.hpp"
#include "model/loader.hpp"
#include "model/model_info.hpp"
#include "model/runner.hpp"
#include "model/writers.hpp"
#include "server/server.hpp"

namespace specactor::cli {

// What the AMX path adds, for the load line and bench: the row count from which products run on the
// tiles, the formats, and the memory of the tile copies (`bytes`); "" when the tiles do not run.
std::string tile_note(std::size_t bytes) {
  const std::int64_t rows = sk::qpath_tile_rows(), rows_k = sk::qpath_tile_rows_k();
  if (rows <= 0 && rows_k <= 0) return "";
  std::string which;
  if (rows > 0) which += fmt::format("Q4_0/Q4_1/Q8_0 calls of {}+ rows", rows);
  if (rows_k > 0) which += fmt::format("{}Q4_K/Q6_K calls of {}+ rows", which.empty() ? "" : ", ", rows_k);
  return fmt::format("; tiles for {}, their tile copy {:.1f} MiB more memory", which,
                     static_cast<double>(bytes) / 1048576.0);
}

// Bytes of a model's tile copies (the AMX path's second layout of its matrices).
std::size_t tile_copy_bytes_of(const sm::LlamaWeights& w) {
  std::size_t n = 0;
  auto add = [&](const sk::WeightMatrix& m) {
    if (m.tiles) n += sk::packed::tile_bytes(m.type, m.out_dim, m.in_dim);
  };
  for (const auto& L : w.layers())
    for (const auto* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.gate, &L.up, &L.down}) add(*m);
  add(w.output());
  return n;
}

void print_server_flags() {
  sc::ServerArgs defaults;
  std::printf("server flags (also accepted as keys of a --config FILE.json):\n");
  std::printf("  %-48s %s\n", "--config FILE", "JSON object of settings, applied before the command line");
  sc::for_each_field(defaults, [](std::string_view name, std::string_view doc, const auto&) {
    std::printf("  %-48s %.*s\n", sc::flag_name(name).c_str(), static_cast<int>(doc.size()), doc.data());
  });
  std::printf("\ndefaults:\n%s\n", sc::settings_to_json(defaults).dump(2).c_str());
}

// --- flag values: parsed by CLI11, checked here with messages that name the flag -----------------

// A finite number (its range is the request's, checked by sched::check_request).
CLI::Validator finite_number() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        std::size_t used = 0;
        double d = 0;
        try {
          d = std::stod(v, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != v.size()) return "'" + v + "' is not a valid number";
        if (!std::isfinite(static_cast<float>(d))) return "'" + v + "' is not a finite number";
        return {};
      },
      "NUMBER", "finite_number");
}

// A request field's name as the CLI spells it: max_new_tokens -> --max-new-tokens, the prompt -> --prompt.
std::string flag_of(const std::string& field) { return field == "prompt_ids" ? "--prompt" : sc::flag_name(field); }

Resolved resolve_from_args(const std::vector<std::string>& args) {
  auto r = sm::resolve_target(sc::parse_server_args(args));
  return {std::move(r.target), std::move(r.info)};
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A command's server flags: what CLI11 left over, checked against the settings table (a mistyped flag
// of the command itself is suggested too), with the default model when none is given and tools/setup
// fetched it.
// A front (serve --workers) runs no model: the engine's settings belong to each worker, so any but
// these is refused rather than ignored.
void front_flags_only(const std::vector<std::string>& rest) {
  static const std::vector<std::string> front = {"--model-path", "-m",     "--tokenizer-path", "--skip-tokenizer-init",
                                                 "--host",       "--port", "--log-level"};
  for (const auto& a : rest) {
    if (a.rfind("-", 0) != 0 || a == "-") continue;
    const std::string flag = a.substr(0, a.find('='));
    if (std::find(front.begin(), front.end(), flag) == front.end() &&
        flag.find_first_not_of("-0123456789.") != std::string::npos)
      throw sc::ConfigError(
          flag +
          ": the workers run the model, so give it to each `specactor worker`; a front with --workers "
          "takes only --model-path, --tokenizer-path, --skip-tokenizer-init, --host, --port and "
          "--log-level besides its own flags");
  }
}

std::vector<std::string> server_rest(const CLI::App& cmd) {
  std::vector<std::string> rest = cmd.remaining();
  std::vector<std::string> own;
  for (const CLI::Option* opt : cmd.get_options())
    for (const auto& n : opt->get_lnames()) own.push_back("--" + n);
  const sc::ServerArgs args = sc::parse_server_args(rest, own);
  if (args.model_path.empty()) {
    const std::string dflt = specactor::cli::default_model_path();
    if (!dflt.empty()) {
      spdlog::info("no --model-path given: using the default model {}", dflt);
      rest.insert(rest.end(), {"--model-path", dflt});
    }
  }
  return rest;
}

// The help footer of a command that takes server flags: the common ones with their descriptions.
std::string common_server_flags(const std::vector<std::string>& fields) {
  std::string out = "Server flags (every one, with its default: `specactor config --help`); the common ones:\n";
  sc::ServerArgs defaults;
  sc::for_each_field(defaults, [&](std::string_view name, std::string_view doc, const auto&) {
    if (std::find(fields.begin(), fields.end(), name) == fields.end()) return;
    std::string flag = sc::flag_name(name);
    if (name == "model_path") flag = "-m, " + flag;
    out += fmt::format("  {:<28} {}\n", flag, doc);
  });
  return out;
}

}  // namespace specactor::cli
