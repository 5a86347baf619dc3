// cli/bench_drafters.cpp — `specactor bench --all-drafters`: each drafter against plain decoding on
// the same prompts, alternating.
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "actors/engine.hpp"
#include "cli/bench.hpp"
#include "cli/bench_detail.hpp"
#include "config/error.hpp"
#include "config/input.hpp"
#include "config/resolve.hpp"
#include "model/block_drafter.hpp"
#include "model/head_writer.hpp"

namespace sa = specactor::actors;
namespace sc = specactor::config;
using json = nlohmann::json;
using namespace specactor::cli::bench_detail;

std::vector<DrafterRow> bench_each_drafter(const std::vector<std::string>& server_args,
                                           const std::vector<DrafterChoice>& drafters, const std::string& prompts_path,
                                           std::int64_t max_new, int repeats) {
  std::vector<std::string> plain_args = server_args;
  quiet_unless_asked(plain_args);
  const std::vector<Prompt> prompts = resolve_chain(plain_args, load_prompts(prompts_path), max_new);
  std::vector<DrafterRow> rows;
  for (const auto& d : drafters) {
    DrafterRow row;
    row.label = d.label;
    std::vector<std::string> args = server_args;
    args.insert(args.end(), d.flags.begin(), d.flags.end());
    quiet_unless_asked(args);
    spdlog::info("bench: plain vs {} on {} prompts", d.label, prompts.size());
    try {
      Setting s;
      run_setting(args, prompts, max_new, repeats, s);
      std::vector<double> p, q;
      for (std::size_t i = 0; i < prompts.size(); ++i) {
        p.push_back(s.plain[i].tps);
        q.push_back(s.runs[i].tps);
      }
      row.plain_tps = median(p);
      row.spec_tps = median(q);
      row.median_speedup = s.median_speedup;
      row.mean_tau = s.mean_tau;
      row.identical = s.mismatches == 0;
      // A drafter that failed to start leaves the engine decoding without drafts: not a measurement.
      if (!s.metrics.draft_error.empty()) row.error = "the drafter did not start: " + s.metrics.draft_error;
    } catch (const std::exception& e) {
      row.error = e.what();  // e.g. an algorithm this device refuses: reported, the others still run
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

std::vector<DrafterRow> bench_every_drafter(const std::vector<std::string>& server_args,
                                            const specactor::model::ModelInfo& target, std::int64_t target_layers,
                                            const std::string& prompts_path, std::int64_t max_new, int repeats) {
  namespace sm = specactor::model;
  const auto dir = std::filesystem::temp_directory_path() / ("specactor_bench_heads." + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::int64_t self_layers = std::min<std::int64_t>(8, std::max<std::int64_t>(1, target_layers / 2));
  std::vector<DrafterChoice> drafters = {{"NGRAM", {"--speculative-algorithm", "NGRAM"}},
                                         {fmt::format("STANDALONE (first {} layers)", self_layers),
                                          {"--speculative-algorithm", "STANDALONE", "--speculative-draft-num-layers",
                                           std::to_string(self_layers), "--speculative-num-steps", "2"}}};
  for (auto kind : {sm::HeadKind::Eagle, sm::HeadKind::Eagle3, sm::HeadKind::Mtp}) {
    sm::HeadSpec spec;
    spec.kind = kind;
    const std::string name(sm::to_string(kind));
    const std::string path = (dir / (name + ".gguf")).string();
    sm::write_random_head(target, spec, path);
    drafters.push_back(
        {name + " (random head)", {"--speculative-algorithm", name, "--speculative-draft-model-path", path}});
  }
  drafters.push_back(
      {"FROZEN_KV_MTP (random head)",
       {"--speculative-algorithm", "FROZEN_KV_MTP", "--speculative-draft-model-path", (dir / "MTP.gguf").string()}});
  sm::BlockDrafterSpec block;  // a one-layer drafter with a block of 8
  sm::write_random_block_drafter(target, block, (dir / "dflash").string());
  drafters.push_back(
      {"DFLASH (random drafter)",
       {"--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", (dir / "dflash").string()}});
  std::vector<DrafterRow> rows;
  try {
    rows = bench_each_drafter(server_args, drafters, prompts_path, max_new, repeats);
  } catch (...) {
    std::filesystem::remove_all(dir);
    throw;
  }
  std::filesystem::remove_all(dir);
  return rows;
}

void print_drafter_rows(const std::vector<DrafterRow>& rows, const std::string& prompts_path, std::int64_t max_new,
                        std::int64_t repeats) {
  std::cout << fmt::format(
      "plain vs each drafter on {} (greedy, up to {} new tokens, best of {} per prompt, medians):\n", prompts_path,
      max_new, repeats);
  std::cout << fmt::format("  {:<30} {:>12} {:>12} {:>9} {:>6} {:>10}\n", "drafter", "plain tok/s", "spec tok/s",
                           "speedup", "τ", "identical");
  for (const auto& r : rows) {
    if (!r.error.empty()) {
      std::cout << fmt::format("  {:<30} not run: {}\n", r.label, r.error);
      continue;
    }
    std::cout << fmt::format("  {:<30} {:>12.1f} {:>12.1f} {:>8.2f}x {:>6.2f} {:>10}\n", r.label, r.plain_tps,
                             r.spec_tps, r.median_speedup, r.mean_tau, r.identical ? "yes" : "NO");
  }
}

json drafter_rows_json(const std::vector<DrafterRow>& rows) {
  json out = json::array();
  for (const auto& r : rows)
    out.push_back({{"drafter", r.label},
                   {"plain_tokens_per_s", r.plain_tps},
                   {"speculative_tokens_per_s", r.spec_tps},
                   {"median_speedup", r.median_speedup},
                   {"mean_tau", r.mean_tau},
                   {"outputs_identical_to_plain", r.identical},
                   {"error", r.error}});
  return out;
}
