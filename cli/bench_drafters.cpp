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
#include "model/loader.hpp"

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

std::vector<DrafterRow> bench_every_drafter(const std::vector<std::string>& server_args, const std::string& model_path,
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
  // A drafter trained for this model and shipped beside it (heads/) is benched as shipped: the
  // algorithm alone, so resolution takes the folder and its measured shape, as a user's run would.
  const bool shipped_eagle3 = !sm::shipped_eagle3_head(model_path).empty();
  for (auto kind : {sm::HeadKind::Eagle, sm::HeadKind::Eagle3, sm::HeadKind::Mtp}) {
    const std::string name(sm::to_string(kind));
    if (kind == sm::HeadKind::Eagle3 && shipped_eagle3) {
      drafters.push_back({name + " (shipped head)", {"--speculative-algorithm", name}});
      continue;
    }
    sm::HeadSpec spec;
    spec.kind = kind;
    const std::string path = (dir / (name + ".gguf")).string();
    sm::write_random_head(target, spec, path);
    drafters.push_back(
        {name + " (random head)", {"--speculative-algorithm", name, "--speculative-draft-model-path", path}});
  }
  drafters.push_back(
      {"FROZEN_KV_MTP (random head)",
       {"--speculative-algorithm", "FROZEN_KV_MTP", "--speculative-draft-model-path", (dir / "MTP.gguf").string()}});
  for (const bool dspark : {false, true}) {
    const std::string name = dspark ? "DSPARK" : "DFLASH";
    if (!sm::shipped_block_drafter(model_path, dspark).empty()) {
      drafters.push_back({name + " (shipped drafter)", {"--speculative-algorithm", name}});
      continue;
    }
    sm::BlockDrafterSpec block;  // a one-layer drafter with a block of 8; DSPARK's heads of rank 32
    if (dspark) block.markov_rank = 32;
    const std::string path = (dir / (dspark ? "dspark" : "dflash")).string();
    sm::write_random_block_drafter(target, block, path);
    drafters.push_back(
        {name + " (random drafter)", {"--speculative-algorithm", name, "--speculative-draft-model-path", path}});
  }
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

namespace specactor::cli::bench_detail {

Setting compare_setting(const std::string& spec) {
  const auto colon = spec.find(':');
  const std::string name = spec.substr(0, colon), path = colon == std::string::npos ? "" : spec.substr(colon + 1);
  const auto algo = sc::Algorithm::parse(name);
  if (!algo || *algo == sc::SpecAlgorithm::None || *algo == sc::SpecAlgorithm::Auto)
    throw sc::ConfigError(
        "--compare: expected ALGO or ALGO:PATH with a speculative algorithm (e.g. EAGLE3 or "
        "DFLASH:heads/drafter), got " +
        sc::printable(spec));
  if (colon != std::string::npos && path.empty())
    throw sc::ConfigError("--compare: " + sc::printable(spec) + " names no path after ':'");
  Setting s;
  s.label = algo->name() + (path.empty() ? "" : " (" + std::filesystem::path(path).filename().string() + ")");
  s.flags = {"--speculative-algorithm", algo->name()};
  if (!path.empty()) s.flags.insert(s.flags.end(), {"--speculative-draft-model-path", path});
  s.own_drafter = true;
  return s;
}

std::vector<std::string> setting_args(const std::vector<std::string>& spec_base, const Setting& s) {
  std::vector<std::string> args;
  for (std::size_t i = 0; i < spec_base.size(); ++i) {
    const std::string& a = spec_base[i];
    const std::string flag = a.substr(0, a.find('='));
    if (s.own_drafter &&
        (flag == "--speculative-algorithm" || flag == "--speculative-draft-model-path" || is_spec_shape_flag(flag))) {
      if (flag == a && i + 1 < spec_base.size()) ++i;  // its value
      continue;
    }
    args.push_back(a);
  }
  args.insert(args.end(), s.flags.begin(), s.flags.end());
  return args;
}

json against_first(const json& settings) {
  json out = json::array();
  const json& first = settings.at(0)["by_category"];
  for (std::size_t i = 1; i < settings.size(); ++i) {
    json cats = json::object();
    for (const auto& [cat, v] : settings[i]["by_category"].items()) {
      if (!first.contains(cat)) continue;
      const double base = first[cat]["median_speedup"].get<double>();
      cats[cat] = {{"speedup", v["median_speedup"]},
                   {"first_speedup", base},
                   {"ratio", base > 0 ? v["median_speedup"].get<double>() / base : 0.0},
                   {"mean_tau", v["mean_tau"]},
                   {"first_mean_tau", first[cat]["mean_tau"]}};
    }
    out.push_back({{"label", settings[i]["label"]}, {"by_category", cats}});
  }
  return out;
}

void print_against_first(const json& against, const std::string& first) {
  for (const auto& a : against) {
    std::cout << fmt::format("\n{} against {} (same run; speedups over plain, τ):\n", a["label"].get<std::string>(),
                             first);
    std::cout << fmt::format("  {:<10} {:>9} {:>9} {:>7} {:>7} {:>7}\n", "category", "this", "first", "ratio", "τ",
                             "τ first");
    for (const auto& [cat, v] : a["by_category"].items())
      std::cout << fmt::format("  {:<10} {:>8.2f}x {:>8.2f}x {:>6.2f}x {:>7.2f} {:>7.2f}\n", cat,
                               v["speedup"].get<double>(), v["first_speedup"].get<double>(), v["ratio"].get<double>(),
                               v["mean_tau"].get<double>(), v["first_mean_tau"].get<double>());
  }
}

}  // namespace specactor::cli::bench_detail
