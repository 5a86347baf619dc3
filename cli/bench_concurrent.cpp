// cli/bench_concurrent.cpp — `specactor bench --concurrency`: n clients in flight, plain and
// speculative in turn, and the budget's summary the reports print.
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
#include "model/head_writer.hpp"

namespace sa = specactor::actors;
namespace sc = specactor::config;
using json = nlohmann::json;
using namespace specactor::cli::bench_detail;

namespace specactor::cli::bench_detail {

ConcurrentRate concurrent_run(sa::Engine& engine, const std::vector<Prompt>& prompts, std::int64_t n,
                              std::int64_t total, std::int64_t max_new, bool speculative,
                              ConcurrentTime* time = nullptr) {
  std::mutex mu;
  std::condition_variable cv;
  std::int64_t in_flight = 0, tokens = 0;
  std::string error;
  const sa::EngineMetrics before = engine.metrics();
  const auto t0 = std::chrono::steady_clock::now();
  auto on_event = [&](const sa::TokenEvent& ev) {
    std::lock_guard<std::mutex> lock(mu);
    tokens += static_cast<std::int64_t>(ev.tokens.size());
    if (!ev.finished) return;
    --in_flight;
    if (!ev.error.empty()) error = ev.error;
    cv.notify_all();
  };
  std::int64_t steady_tokens = 0;
  double steady_s = 0;
  std::unique_lock<std::mutex> lock(mu);
  for (std::int64_t i = 0; i < total; ++i) {
    cv.wait(lock, [&] { return in_flight < n || !error.empty(); });
    if (!error.empty()) break;
    if (i == total - 1 && total > n) {  // the window closes as the last request goes in
      steady_tokens = tokens;
      steady_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    ++in_flight;
    sa::GenerationRequest r;
    const Prompt& p = prompts[static_cast<std::size_t>(i) % prompts.size()];
    r.prompt = p.text;
    r.chat = p.chat;
    r.max_new_tokens = p.max_new > 0 ? p.max_new : max_new;
    r.speculative = speculative;
    lock.unlock();
    engine.submit(r, on_event);
    lock.lock();
  }
  cv.wait(lock, [&] { return in_flight == 0; });
  if (!error.empty()) throw std::runtime_error("bench: " + error);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (time) {
    const sa::EngineMetrics after = engine.metrics();
    time->wall_ms += 1e3 * s;
    time->steps += after.steps - before.steps;
    time->step_wall_ms += after.step_wall_ms - before.step_wall_ms;
    time->compute_ms += after.step_compute_ms - before.step_compute_ms;
    time->draft_ms += after.draft_ms - before.draft_ms;
    time->tokens += tokens;
    time->cache_query_tokens += after.cache_query_tokens - before.cache_query_tokens;
    time->cache_hit_tokens += after.cache_hit_tokens - before.cache_hit_tokens;
  }
  ConcurrentRate rate;
  rate.drain = s > 0 ? static_cast<double>(tokens) / s : 0.0;
  rate.steady = steady_s > 0 ? static_cast<double>(steady_tokens) / steady_s : rate.drain;
  return rate;
}

ConcurrentResult run_concurrent(const std::vector<std::string>& args, const std::vector<Prompt>& prompts,
                                std::int64_t n, std::int64_t max_new, int repeats) {
  ConcurrentResult out;
  out.requests = std::max<std::int64_t>(static_cast<std::int64_t>(prompts.size()), 6 * n);
  // Warm-up prompts outside the set: the engine's cost and acceptance models start from real steps
  // of this batch size, as they would in a server that has been running.
  std::vector<Prompt> warm;
  for (std::int64_t i = 0; i < n; ++i)
    warm.push_back({"warm-up", "Write a few sentences about the number " + std::to_string(i + 1) + ".", 0,
                    prompts.empty() || prompts.front().chat});  // completions for a set of completions
  for (int k = 0; k < repeats; ++k)
    for (bool plain_first : {true, false}) {  // plain then speculative, then the other way round
      auto engine = sa::Engine::from_argv(args);
      concurrent_run(*engine, warm, n, n, max_new, true);
      double rate[2] = {0, 0};
      for (bool speculative : {!plain_first, plain_first}) {
        engine->flush_cache();
        const ConcurrentRate v = concurrent_run(*engine, prompts, n, out.requests, max_new, speculative,
                                                speculative ? &out.spec_time : &out.plain_time);
        ConcurrentRate& best = speculative ? out.spec : out.plain;
        best.steady = std::max(best.steady, v.steady);
        best.drain = std::max(best.drain, v.drain);
        rate[speculative ? 1 : 0] = v.steady;
      }
      if (rate[0] > 0) out.pair_ratios.push_back(rate[1] / rate[0]);
      add_metrics(out.metrics, engine->metrics());
      engine->shutdown();
    }
  return out;
}

json budget_json(const sa::EngineMetrics& m) {
  return {{"adaptive", m.adaptive},
          {"decode_steps", m.speculative_steps},
          {"budget_skipped_steps", m.budget_skipped_steps},
          {"verified_nodes_histogram", m.verified_nodes},
          {"calibration_error", m.calibration_error},
          {"calibrated_nodes", m.calibrated_nodes},
          {"draft_score_calibration_error", m.draft_score_calibration_error},
          {"draft_scored_nodes", m.draft_scored_nodes},
          {"cost_model_c_k", m.step_cost},
          {"cost_model_one_row_ms", m.step_ms_1},
          {"memory", m.budget_memory}};
}

void print_budget(const json& b) {
  std::string hist;
  const auto& h = b["verified_nodes_histogram"];
  for (std::size_t n = 0; n < h.size(); ++n)
    if (h[n].get<std::int64_t>() > 0)
      hist += fmt::format(" {}{}:{}", n, n + 1 == h.size() && n == 32 ? "+" : "", h[n].get<std::int64_t>());
  std::cout << fmt::format("  budget: {}; {} of {} decode steps ran without drafts by the budget\n",
                           b["adaptive"].get<bool>() ? "adaptive" : "fixed shape (--speculative-adaptive false)",
                           b["budget_skipped_steps"].get<std::int64_t>(), b["decode_steps"].get<std::int64_t>());
  std::cout << "  draft nodes verified per step (nodes:steps):" << (hist.empty() ? " -" : hist) << "\n";
  std::string ck;
  const std::vector<int> ks{1, 2, 4, 8, 16, 32};
  for (std::size_t i = 0; i < b["cost_model_c_k"].size() && i < ks.size(); ++i)
    ck += fmt::format(" c({})={:.2f}", ks[i], b["cost_model_c_k"][i].get<double>());
  std::cout << fmt::format(
      "  acceptance model: calibration error {:.3f} over {:.0f} nodes; cost model: {:.2f} ms/row{}\n",
      b["calibration_error"].get<double>(), b["calibrated_nodes"].get<double>(),
      b["cost_model_one_row_ms"].get<double>(), ck);
  if (b.value("draft_scored_nodes", 0.0) > 0)
    std::cout << fmt::format(
        "  drafter's own scores (path probabilities of a head or DFLASH, DSPARK confidences): calibration error {:.3f} "
        "over {:.0f} nodes\n",
        b["draft_score_calibration_error"].get<double>(), b["draft_scored_nodes"].get<double>());
  if (b.contains("memory") && !b["memory"].get<std::string>().empty())
    std::cout << "  budget memory (--speculative-budget-cache) of the first engine: " << b["memory"].get<std::string>()
              << "\n";
}

}  // namespace specactor::cli::bench_detail
