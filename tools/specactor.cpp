// tools/specactor.cpp — the specactor command-line launcher.
//
//   specactor config  [server flags]        resolved target + derived draft snapshots as JSON
//   specactor inspect MODEL.gguf [--json]   model hyper-parameters from the GGUF metadata
//   specactor devices                       what the device probe found (CPU / CUDA / NCCL)
//
// Results go to stdout; logs and errors to stderr. Bad input exits with status 2 and one message.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "config/error.hpp"
#include "config/resolve.hpp"
#include "kernels/backend.hpp"
#include "model/gguf.hpp"
#include "model/model_info.hpp"

namespace sc = specactor::config;
namespace sm = specactor::model;
namespace sk = specactor::kernels;
using json = nlohmann::json;

namespace {

constexpr const char* kUsage =
    "usage: specactor <command> [options]\n"
    "\n"
    "commands:\n"
    "  config  [server flags]       print the resolved target snapshot, the derived draft snapshot\n"
    "                               (when --speculative-algorithm is set) and their override logs\n"
    "  inspect MODEL.gguf [--json]  print the model's hyper-parameters\n"
    "  devices                      print what the CPU/CUDA device probe found\n"
    "\n"
    "`specactor config --help` lists every server flag with its default.\n";

void print_server_flags() {
  sc::ServerArgs defaults;
  std::printf("server flags (also accepted as keys of a --config FILE.json):\n");
  std::printf("  %-48s %s\n", "--config FILE", "JSON object of settings, applied before the command line");
  sc::for_each_field(defaults, [](std::string_view name, std::string_view doc, const auto&) {
    std::printf("  %-48s %.*s\n", sc::flag_name(name).c_str(), static_cast<int>(doc.size()), doc.data());
  });
  std::printf("\ndefaults:\n%s\n", sc::settings_to_json(defaults).dump(2).c_str());
}

sc::RuntimeFacts runtime_facts() {
  const sk::DeviceProbe& p = sk::probe_devices();
  return {p.cuda_usable, p.reason};
}

int cmd_config(const std::vector<std::string>& args) {
  for (const auto& a : args)
    if (a == "--help" || a == "-h") return print_server_flags(), 0;
  const sc::ServerArgs parsed = sc::parse_server_args(args);
  const sc::Snapshot user = sc::freeze(parsed);
  if (user->model_path.empty())
    throw sc::ConfigError("--model-path is required (after tools/setup the default model is "
                          "models/SmolLM2-135M-Instruct.Q4_1.gguf)");
  auto file = sm::GgufFile::open(user->model_path);
  const sm::ModelInfo info = sm::read_model_info(*file);
  const sc::Snapshot target = sc::resolve_target(user, info.facts(), runtime_facts());

  json out;
  out["model"] = info.to_json();
  const std::string hash_before = sc::hash_hex(sc::content_hash(*target));
  out["target"] = sc::to_json(*target);
  if (target->speculative_algorithm != sc::SpecAlgorithm::None) {
    const sc::Snapshot draft = sc::derive_draft(target, info.facts());
    out["draft"] = sc::to_json(*draft);
    const std::string hash_after = sc::hash_hex(sc::content_hash(*target));
    out["target_hash_before_draft"] = hash_before;
    out["target_hash_after_draft"] = hash_after;
    if (hash_before != hash_after) {  // impossible by construction; reported loudly if it ever happens
      std::cout << out.dump(2) << "\n";
      spdlog::critical("the target snapshot changed while the draft snapshot was derived");
      return 1;
    }
  }
  std::cout << out.dump(2) << "\n";
  return 0;
}

int cmd_inspect(int argc, char** argv) {
  CLI::App app{"print a model's hyper-parameters", "specactor inspect"};
  std::string path;
  bool as_json = false, tensors = false;
  app.add_option("model", path, "GGUF model file")->required();
  app.add_flag("--json", as_json, "print JSON");
  app.add_flag("--tensors", tensors, "also list every tensor (name, type, shape)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  auto file = sm::GgufFile::open(path);
  const sm::ModelInfo info = sm::read_model_info(*file);
  json j = info.to_json();
  j["gguf_version"] = file->version();
  if (tensors) {
    json list = json::array();
    for (const auto& t : file->tensors())
      list.push_back({{"name", t.name},
                      {"type", sm::ggml_type_info(static_cast<std::uint32_t>(t.type))->name},
                      {"dims", t.dims},
                      {"bytes", t.n_bytes}});
    j["tensors"] = list;
  }
  if (as_json) {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  for (const auto& [k, v] : j.items()) {
    if (k == "tensors") continue;
    std::cout << fmt::format("{:<18} {}\n", k, v.is_string() ? v.get<std::string>() : v.dump());
  }
  if (tensors)
    for (const auto& t : j["tensors"])
      std::cout << fmt::format("  {:<32} {:<5} {}\n", t["name"].get<std::string>(), t["type"].get<std::string>(),
                               t["dims"].dump());
  return 0;
}

int cmd_devices() {
  const sk::DeviceProbe& p = sk::probe_devices();
  json j = {{"cuda_compiled", p.cuda_compiled}, {"cuda_usable", p.cuda_usable},
            {"device_count", p.device_count},   {"device_name", p.device_name},
            {"reason", p.reason},               {"cuda_runtime_version", p.cuda_runtime_version},
            {"nccl_version", p.nccl_version},
            {"backend", p.cuda_usable ? "cuda" : "cpu"}};
  std::cout << j.dump(2) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_default_logger(spdlog::stderr_color_mt("specactor"));
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string cmd = argv[1];
  try {
    if (cmd == "config") return cmd_config(std::vector<std::string>(argv + 2, argv + argc));
    if (cmd == "inspect") return cmd_inspect(argc - 1, argv + 1);
    if (cmd == "devices") return cmd_devices();
    if (cmd == "--help" || cmd == "-h" || cmd == "help") return std::fputs(kUsage, stdout), 0;
    if (cmd == "--version") return std::puts("specactor 0.1.0"), 0;
    std::fprintf(stderr, "specactor: error: unknown command '%s'\n\n%s", cmd.c_str(), kUsage);
    return 2;
  } catch (const sc::ConfigError& e) {
    std::fprintf(stderr, "specactor: error: %s\n", e.what());
    return 2;
  } catch (const sm::GgufError& e) {
    std::fprintf(stderr, "specactor: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "specactor: internal error: %s\n", e.what());
    return 1;
  }
}
