// cli/cmd_tools.cpp — `specactor config`, `inspect`, `make-head`, `shrink` and `devices`.
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
#include "model/block_drafter.hpp"
#include "model/gguf.hpp"
#include "model/head_model.hpp"
#include "model/head_writer.hpp"
#include "model/loader.hpp"
#include "model/model_info.hpp"
#include "model/runner.hpp"
#include "model/writers.hpp"
#include "server/server.hpp"

namespace specactor::cli {

int cmd_config(const std::vector<std::string>& args) {
  const Resolved r = resolve_from_args(args);
  const sm::ModelInfo& info = r.info;
  const sc::Snapshot& target = r.target;

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
      std::cout << out.dump(2, ' ', false, json::error_handler_t::replace) << "\n";
      spdlog::critical("the target snapshot changed while the draft snapshot was derived");
      return 1;
    }
  }
  std::cout << out.dump(2, ' ', false, json::error_handler_t::replace) << "\n";
  return 0;
}

void add_inspect_flags(CLI::App& cmd, InspectOptions& o) {
  cmd.add_option("model", o.path,
                 "a GGUF model, a draft head (GGUF file or safetensors directory) or a DFLASH drafter (directory)")
      ->required();
  cmd.add_flag("--json", o.json, "print JSON");
  cmd.add_flag("--tensors", o.tensors, "also list every tensor (name, type, shape)");
  cmd.add_option("--target", o.target,
                 "draft heads: check that the head fits this target model (DFLASH drafters: required)");
}

int cmd_inspect(const InspectOptions& o) {
  const std::string& path = o.path;
  const std::string& target = o.target;
  const bool as_json = o.json, tensors = o.tensors;
  const bool hf = std::filesystem::is_directory(path) || path.ends_with(".safetensors");
  std::shared_ptr<const sm::GgufFile> gguf;
  if (!hf) gguf = sm::GgufFile::open(path);
  const std::string arch =
      gguf && gguf->has("general.architecture") ? std::string(gguf->get_string("general.architecture")) : "";
  if (hf && sm::is_block_drafter_checkpoint(path)) {  // a DFLASH/DSPARK drafter: every check is against a target
    if (target.empty())
      throw sc::ConfigError("--target: is required to inspect a block drafter (" + path +
                            "): its fields are checked against the target model it drafts for");
    sc::ServerArgs t;
    t.model_path = target;
    const sm::ModelInfo ti = sm::read_any_model_info(t);
    json j = sm::BlockDraftWeights::load(path, sm::LlamaConfig::from(ti, ""), ti.context_length, sc::LoadFormat::Auto)
                 ->config()
                 .to_json();
    j["fits_target"] = target;
    std::cout << j.dump(2, ' ', false, json::error_handler_t::replace) << "\n";
    return 0;
  }
  if (hf && !sm::is_head_checkpoint(path)) {  // a Hugging Face model checkpoint, not a head
    sc::ServerArgs m;
    m.model_path = path;
    const json j = sm::read_any_model_info(m).to_json();
    if (as_json) {
      std::cout << j.dump(2, ' ', false, json::error_handler_t::replace) << "\n";
    } else {
      for (const auto& [k, v] : j.items())
        std::cout << fmt::format("{:<18} {}\n", k, v.is_string() ? v.get<std::string>() : v.dump());
    }
    return 0;
  }
  if (hf || arch == "eagle" || arch == "eagle3" || arch == "mtp") {  // a draft head
    json j = sm::read_head_config(path).to_json();
    if (!target.empty()) {  // the start-up checks against a target
      sc::ServerArgs t;
      t.model_path = target;
      const sm::ModelInfo ti = sm::read_any_model_info(t);
      const auto hc = sm::read_head_config(path);
      j = sm::HeadWeights::load(path, hc.kind, sm::LlamaConfig::from(ti, ""), {}, false, sc::LoadFormat::Auto)
              ->config()
              .to_json();
      j["fits_target"] = target;
    }
    std::cout << j.dump(2, ' ', false, json::error_handler_t::replace) << "\n";
    return 0;
  }
  auto file = gguf;
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
    std::cout << j.dump(2, ' ', false, json::error_handler_t::replace) << "\n";
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

void add_make_head_flags(CLI::App& cmd, MakeHeadOptions& o) {
  cmd.add_option("--target", o.target, "the target model (GGUF or Hugging Face directory)")->required();
  cmd.add_option("--out", o.out, "output: a .gguf file, or a directory for --format safetensors")->required();
  cmd.add_option("--kind", o.kind,
                 "EAGLE | EAGLE3 | MTP | DFLASH | DSPARK (block drafters: always a safetensors folder)")
      ->check(CLI::IsMember({"EAGLE", "EAGLE3", "MTP", "DFLASH", "DSPARK"}));
  cmd.add_option("--format", o.format, "gguf (the heads' default) | safetensors (DFLASH, DSPARK: the only one)")
      ->check(CLI::IsMember({"gguf", "safetensors"}));
  cmd.add_option("--layers", o.layers, "MTP: next-token-prediction layers; DFLASH, DSPARK: decoder layers")
      ->check(CLI::Range(1, 8));
  cmd.add_option("--block-size", o.block_size, "DFLASH, DSPARK: tokens per block (the root and block-size − 1 drafts)")
      ->check(CLI::Range(2, 64));
  cmd.add_option("--markov-rank", o.markov_rank, "DSPARK: the Markov head's rank")
      ->check(CLI::Range(1, 4096))
      ->each([&o](const std::string&) { o.markov_rank_given = true; });
  cmd.add_option("--draft-vocab", o.draft_vocab,
                 "EAGLE3: size of the reduced draft vocabulary (default 0 = min(vocab, 4096)); DFLASH, DSPARK: "
                 "a draft vocabulary of this many ids (default 0: none)")
      ->check(integer_at_least<std::int64_t>(0));
  cmd.add_flag("--own-output", o.own_output, "EAGLE/MTP: write an own output head instead of using the target's");
  cmd.add_option("--seed", o.seed, "random seed");
}

int cmd_make_head(const MakeHeadOptions& o) {
  const std::string &target = o.target, &out = o.out, &kind = o.kind, &format = o.format;
  const std::int64_t layers = o.layers, draft_vocab = o.draft_vocab;
  const std::uint32_t seed = o.seed;
  const bool own_output = o.own_output;
  sc::ServerArgs t;
  t.model_path = target;
  const sm::ModelInfo info = sm::read_any_model_info(t);
  if (kind == "DFLASH" || kind == "DSPARK") {
    if (format == "gguf")
      throw sc::ConfigError("--format gguf: a " + kind +
                            " drafter is written as a safetensors folder (config.json + "
                            "model.safetensors), as the published DFlash checkpoints are");
    if (own_output) throw sc::ConfigError("--own-output: a " + kind + " drafter always uses the target's output head");
    sm::BlockDrafterSpec b;
    b.layers = layers;
    b.block_size = o.block_size;
    b.draft_vocab = draft_vocab;
    b.markov_rank = kind == "DSPARK" ? o.markov_rank : 0;
    b.seed = seed;
    sm::write_random_block_drafter(info, b, out);
    std::cerr << fmt::format("wrote a random {} drafter ({} layer(s), block {}) for {} to {}\n", kind, layers,
                             o.block_size, target, out);
    return 0;
  }
  if (o.markov_rank_given) throw sc::ConfigError("--markov-rank: only applies to --kind DSPARK (got " + kind + ")");
  sm::HeadSpec spec;
  spec.kind = kind == "EAGLE" ? sm::HeadKind::Eagle : kind == "EAGLE3" ? sm::HeadKind::Eagle3 : sm::HeadKind::Mtp;
  spec.layers = layers;
  spec.draft_vocab = draft_vocab;
  spec.own_output = own_output;
  spec.safetensors = format == "safetensors";
  spec.seed = seed;
  const sm::HeadConfig c = sm::write_random_head(info, spec, out);
  std::cerr << fmt::format("wrote a random {} head ({} layer(s), hidden {}) for {} to {}\n", sm::to_string(c.kind),
                           c.n_layers, c.hidden, target, out);
  return 0;
}

void add_shrink_flags(CLI::App& cmd, ShrinkOptions& o) {
  cmd.add_option("model", o.model, "the GGUF model")->required();
  cmd.add_option("--layers", o.layers, "blocks to keep")->required()->check(integer_at_least<std::int64_t>(1));
  cmd.add_option("--out", o.out, "output .gguf file")->required();
}

int cmd_shrink(const ShrinkOptions& o) {
  const std::string &model = o.model, &out = o.out;
  const std::int64_t layers = o.layers;
  const auto file = sm::GgufFile::open(model);
  sm::write_first_layers(*file, layers, out);
  std::cerr << fmt::format("wrote the first {} block(s) of {} to {} ({:.1f} MiB)\n", layers, model, out,
                           static_cast<double>(std::filesystem::file_size(out)) / 1048576.0);
  return 0;
}

int cmd_devices() {
  const sk::DeviceProbe& p = sk::probe_devices();
  json j = {{"cpu_float_path", sk::cpu_path_name(sk::cpu_path())},
            {"cpu_integer_path", sk::qpath_name(sk::qpath())},
            {"cpu_integer_path_reason", sk::qpath_reason()},
            {"cuda_compiled", p.cuda_compiled},
            {"cuda_usable", p.cuda_usable},
            {"device_count", p.device_count},
            {"device_name", p.device_name},
            {"reason", p.reason},
            {"cuda_runtime_version", p.cuda_runtime_version},
            {"nccl_version", p.nccl_version},
            {"backend", p.cuda_usable ? "cuda" : "cpu"}};
  std::cout << j.dump(2, ' ', false, json::error_handler_t::replace) << "\n";
  return 0;
}

}  // namespace specactor::cli
