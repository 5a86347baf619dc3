// cli/bench_spec.cpp — `specactor bench --speculative-algorithm ...`: plain decoding and the
// speculative setting(s) side by side in one process, on the same prompts, through the engine.
// Prints per category and overall: decode tokens/s of each, their ratio, τ, α, per-position
// acceptance, and whether the greedy outputs were identical; --sweep tries a grid of
// (steps, topk, draft tokens); --chart writes an SVG of speedup and τ per setting.
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

namespace specactor::cli::bench_detail {

// Sums the counters of one engine's run into `t` (the last run's model state: cost curve, calibration).
void add_metrics(sa::EngineMetrics& t, const sa::EngineMetrics& m) {
  auto add_vec = [](std::vector<std::int64_t>& a, const std::vector<std::int64_t>& b) {
    if (a.size() < b.size()) a.resize(b.size(), 0);
    for (std::size_t i = 0; i < b.size(); ++i) a[i] += b[i];
  };
  const auto keep_drafted = t.drafted_at, keep_accepted = t.accepted_at, keep_hist = t.verified_nodes;
  const sa::EngineMetrics before = t;
  t = m;
  t.drafted_at = keep_drafted;
  t.accepted_at = keep_accepted;
  t.verified_nodes = keep_hist;
  add_vec(t.drafted_at, m.drafted_at);
  add_vec(t.accepted_at, m.accepted_at);
  add_vec(t.verified_nodes, m.verified_nodes);
  t.drafted += before.drafted;
  t.accepted += before.accepted;
  t.speculative_steps += before.speculative_steps;
  t.budget_skipped_steps += before.budget_skipped_steps;
  t.draft_ms += before.draft_ms;
  t.step_wall_ms += before.step_wall_ms;
  t.step_compute_ms += before.step_compute_ms;
  t.acceptance_rate = t.drafted > 0 ? static_cast<double>(t.accepted) / static_cast<double>(t.drafted) : 0.0;
  if (!before.budget_memory.empty()) t.budget_memory = before.budget_memory;  // what the first engine started from
}

// Of per-engine ratios taken in both orders equally often: whichever mode runs second in an engine
// gains (its prompts are in the prefix cache by then), and a geometric mean cancels that gain.
double geometric_mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += std::log(x);
  return v.empty() ? 0.0 : std::exp(s / static_cast<double>(v.size()));
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<Prompt> load_prompts(const std::string& path) {
  if (!std::filesystem::exists(path))
    throw sc::ConfigError("--prompts " + path +
                          ": cannot open the file (run from the repository root, or pass --prompts FILE)");
  std::istringstream in(sc::read_text_file(path, "--prompts " + path));
  std::vector<Prompt> out;
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {  // parse_error, out_of_range (a number like 1e505)
      throw sc::ConfigError("--prompts " + path + ":" + std::to_string(lineno) + ": not valid JSON: " + e.what());
    }
    if (!j.is_object() || !j.contains("prompt") || !j["prompt"].is_string())
      throw sc::ConfigError("--prompts " + path + ":" + std::to_string(lineno) +
                            ": expected {\"category\": ..., \"prompt\": \"...\"}");
    if (j.contains("category") && !j["category"].is_string())
      throw sc::ConfigError("--prompts " + path + ":" + std::to_string(lineno) + ": \"category\" must be a string");
    Prompt pr{j.value("category", "all"), j["prompt"].get<std::string>()};
    if (j.contains("chat")) {
      if (!j["chat"].is_boolean())
        throw sc::ConfigError("--prompts " + path + ":" + std::to_string(lineno) + ": \"chat\" must be true or false");
      pr.chat = j["chat"].get<bool>();
    }
    if (j.contains("max_new_tokens")) {
      const json& m = j["max_new_tokens"];
      if (!m.is_number_integer() || m.get<std::int64_t>() < 1 || m.get<std::int64_t>() > 4096)
        throw sc::ConfigError("--prompts " + path + ":" + std::to_string(lineno) +
                              ": \"max_new_tokens\" must be an integer from 1 to 4096");
      pr.max_new = m.get<std::int64_t>();
    }
    if (out.empty() && pr.text.find(kPrevious) != std::string::npos)
      throw sc::ConfigError("--prompts " + path + ":" + std::to_string(lineno) +
                            ": {previous} in the first prompt: there is no answer before it to put there");
    out.push_back(std::move(pr));
  }
  if (out.empty()) throw sc::ConfigError("--prompts " + path + ": no prompts");
  return out;
}

// What of an answer goes into the next prompt's {previous}: the first fenced block's contents (a
// model that rewrites a file usually fences it and talks around it), else the whole answer.
std::string answer_body(const std::string& text) {
  const auto open = text.find("```");
  if (open == std::string::npos) return text;
  const auto body = text.find('\n', open);
  if (body == std::string::npos) return text;
  const auto close = text.find("```", body + 1);
  return text.substr(body + 1, close == std::string::npos ? std::string::npos : close - body - 1);
}

// Fills every {previous} with the answer to the prompt before it (greedy, plain, in an engine of its
// own, so no drafter being measured has seen these answers). Greedy decoding is deterministic and
// speculation lossless, so the measured runs answer the earlier prompts the same way.
std::vector<Prompt> resolve_chain(const std::vector<std::string>& args, std::vector<Prompt> prompts,
                                  std::int64_t max_new) {
  bool any = false;
  for (const auto& p : prompts) any = any || p.text.find(kPrevious) != std::string::npos;
  if (!any) return prompts;
  spdlog::info("bench: answering the prompts that a {{previous}} refers to");
  auto engine = sa::Engine::from_argv(args);
  for (std::size_t i = 0; i + 1 < prompts.size(); ++i) {
    if (prompts[i + 1].text.find(kPrevious) == std::string::npos) continue;
    sa::GenerationRequest r;
    r.prompt = prompts[i].text;
    r.chat = prompts[i].chat;
    r.max_new_tokens = prompts[i].max_new > 0 ? prompts[i].max_new : max_new;
    r.speculative = false;
    const sa::GenerationResult g = engine->generate(r);
    if (!g.error.empty()) throw std::runtime_error("bench: prompt " + std::to_string(i + 1) + ": " + g.error);
    const std::string body = answer_body(g.text);
    std::string& next = prompts[i + 1].text;
    for (auto at = next.find(kPrevious); at != std::string::npos; at = next.find(kPrevious, at + body.size()))
      next.replace(at, kPrevious.size(), body);
  }
  engine->shutdown();
  return prompts;
}

// Plain and speculative decoding of every prompt, alternating per prompt (a request can opt out of
// drafting), so both see the same machine state — plain first in even rounds, speculative first in
// odd ones; each prompt's best decode rate of `repeats` rounds counts (this machine is shared and noisy). Every round
// has an engine of its own: a drafter that remembers earlier requests (SUFFIX) sees the prompts before this one in the
// set, never this prompt's own earlier run.
void run_prompts(const std::vector<std::string>& args, const std::vector<Prompt>& prompts, std::int64_t max_new,
                 int repeats, std::vector<Run>& plain, std::vector<Run>& spec, sa::EngineMetrics& metrics) {
  plain.assign(prompts.size(), {});
  spec.assign(prompts.size(), {});
  sa::EngineMetrics total;
  for (int k = 0; k < repeats; ++k) {
    auto engine = sa::Engine::from_argv(args);
    sa::GenerationRequest warm;
    warm.prompt = "Hello";
    warm.chat = prompts.empty() || prompts.front().chat;
    warm.max_new_tokens = 4;
    warm.speculative = false;
    engine->generate(warm);
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      sa::GenerationRequest r;
      r.prompt = prompts[i].text;
      r.chat = prompts[i].chat;
      r.max_new_tokens = prompts[i].max_new > 0 ? prompts[i].max_new : max_new;
      // The order alternates between rounds: whichever runs second on a prompt decodes measurably
      // slower (~4 % here, on prompts that drafted nothing), so a fixed order would favour one side.
      const bool spec_first = k % 2 == 1;
      for (bool speculative : {spec_first, !spec_first}) {
        r.speculative = speculative;
        const sa::GenerationResult g = engine->generate(r);
        if (!g.error.empty() && g.invalid_request)  // the prompt's fault: name it
          throw specactor::config::ConfigError("--prompts: prompt " + std::to_string(i + 1) + " ('" +
                                               specactor::config::printable(prompts[i].text.substr(0, 40)) +
                                               "'): " + g.error);
        if (!g.error.empty()) throw std::runtime_error("bench: " + g.error);
        Run& best = speculative ? spec[i] : plain[i];
        if (k == 0 || g.metrics.decode_tokens_per_s > best.tps)
          best = {g.tokens, g.metrics.decode_tokens_per_s, g.metrics.mean_accepted_length, g.metrics.drafted,
                  g.metrics.accepted};
      }
      std::fprintf(stderr, ".");
    }
    add_metrics(total, engine->metrics());
    engine->shutdown();
  }
  std::fprintf(stderr, "\n");
  metrics = total;
}

// Runs one setting and summarises it (median speedup over prompts, mean τ, α, identical outputs).
void run_setting(const std::vector<std::string>& args, const std::vector<Prompt>& prompts, std::int64_t max_new,
                 int repeats, Setting& s) {
  run_prompts(args, prompts, max_new, repeats, s.plain, s.runs, s.metrics);
  std::vector<double> speedups;
  double tau = 0;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    if (s.runs[i].tokens != s.plain[i].tokens) ++s.mismatches;
    if (s.plain[i].tps > 0) speedups.push_back(s.runs[i].tps / s.plain[i].tps);
    tau += s.runs[i].tau;
  }
  s.median_speedup = median(speedups);
  s.mean_tau = tau / static_cast<double>(prompts.size());
  s.alpha = s.metrics.acceptance_rate;
}

void write_chart(const std::string& path, const std::vector<Setting>& settings) {
  const int w = 120 + 90 * static_cast<int>(settings.size()), h = 360, base = 300;
  double max_v = 1.0;
  for (const auto& s : settings) max_v = std::max({max_v, s.median_speedup, s.mean_tau});
  auto y = [&](double v) { return base - static_cast<int>(240.0 * v / max_v); };
  std::ofstream o(path);
  if (!o) throw sc::ConfigError("--chart " + path + ": cannot write the file");
  o << "<svg xmlns='http://www.w3.org/2000/svg' width='" << w << "' height='" << h
    << "' font-family='sans-serif' font-size='11'>\n";
  o << "<text x='10' y='20' font-size='14'>specactor bench: median decode speedup vs plain, and mean accepted length "
       "τ</text>\n";
  o << "<line x1='60' y1='" << base << "' x2='" << w - 20 << "' y2='" << base << "' stroke='black'/>\n";
  o << "<line x1='60' y1='" << y(1.0) << "' x2='" << w - 20 << "' y2='" << y(1.0)
    << "' stroke='gray' stroke-dasharray='4'/>\n";
  o << "<text x='10' y='" << y(1.0) + 4 << "'>1.0</text>\n";
  for (std::size_t i = 0; i < settings.size(); ++i) {
    const int x = 80 + 90 * static_cast<int>(i);
    const auto& s = settings[i];
    o << "<rect x='" << x << "' y='" << y(s.median_speedup) << "' width='30' height='" << base - y(s.median_speedup)
      << "' fill='#3b7dd8'/>\n";
    o << "<rect x='" << x + 32 << "' y='" << y(s.mean_tau) << "' width='30' height='" << base - y(s.mean_tau)
      << "' fill='#e08a2c'/>\n";
    o << "<text x='" << x << "' y='" << y(s.median_speedup) - 3 << "'>" << fmt::format("{:.2f}", s.median_speedup)
      << "</text>\n";
    o << "<text x='" << x + 32 << "' y='" << y(s.mean_tau) - 3 << "'>" << fmt::format("{:.2f}", s.mean_tau)
      << "</text>\n";
    o << "<text x='" << x << "' y='" << base + 15 << "' font-size='9'>" << s.label << "</text>\n";
  }
  o << "<rect x='" << w - 170 << "' y='30' width='10' height='10' fill='#3b7dd8'/><text x='" << w - 155
    << "' y='39'>speedup (median)</text>\n";
  o << "<rect x='" << w - 170 << "' y='45' width='10' height='10' fill='#e08a2c'/><text x='" << w - 155
    << "' y='54'>τ (mean)</text>\n";
  o << "</svg>\n";
}

// The engines a bench starts log warnings only, unless the user asked for a level (--log-level trace
// shows the budget's decisions): a flag the user gave is honoured, not overridden.
void quiet_unless_asked(std::vector<std::string>& args) {
  for (const auto& a : args)
    if (a == "--log-level" || a.rfind("--log-level=", 0) == 0) return;
  args.insert(args.end(), {"--log-level", "warn"});
}

bool is_spec_shape_flag(const std::string& a) {
  return a == "--speculative-num-steps" || a == "--speculative-eagle-topk" || a == "--speculative-num-draft-tokens";
}

}  // namespace specactor::cli::bench_detail

using namespace specactor::cli::bench_detail;

namespace {

// The user's server flags for the speculative engines; with --sweep the grid replaces their shape flags.
std::vector<std::string> spec_base_args(const std::vector<std::string>& server_args, bool sweep) {
  std::vector<std::string> spec_base;
  for (std::size_t i = 0; i < server_args.size(); ++i) {
    const std::string& a = server_args[i];
    const bool takes_value = i + 1 < server_args.size() && server_args[i + 1].rfind("--", 0) != 0;
    if (sweep && is_spec_shape_flag(a)) {
      if (takes_value) ++i;
      continue;
    }
    spec_base.push_back(a);
  }
  quiet_unless_asked(spec_base);
  return spec_base;
}

// The settings to run: the user's, or with --sweep the grid (and the budget's row first when it is on).
std::vector<Setting> make_settings(const sc::ServerArgs& user, bool sweep, const std::string& algo) {
  std::vector<Setting> settings;
  // With the budget on (the default), the sweep's first row is the budget at the drafter's default
  // shape and the grid's rows are fixed shapes (--speculative-adaptive false), all in the same run.
  const bool budget_row = sweep && user.speculative_adaptive;
  if (budget_row) {
    Setting st;
    st.label = "budget";
    settings.push_back(std::move(st));
  }
  if (sweep) {
    const auto a = user.speculative_algorithm;  // STANDALONE drafts chains only
    const bool tree_capable = a == sc::SpecAlgorithm::Ngram || a == sc::SpecAlgorithm::Eagle ||
                              a == sc::SpecAlgorithm::Eagle3 || a == sc::SpecAlgorithm::Mtp;
    for (int steps : {1, 2, 3, 4, 6, 8})
      for (int topk : tree_capable ? std::vector<int>{1, 4} : std::vector<int>{1}) {
        const int n = topk == 1 ? steps + 1 : std::min(1 + steps * topk, 2 * steps + 4);
        Setting st;
        st.label = fmt::format("s{}k{}n{}", steps, topk, n);
        st.flags = {"--speculative-num-steps",        std::to_string(steps),
                    "--speculative-eagle-topk",       std::to_string(topk),
                    "--speculative-num-draft-tokens", std::to_string(n)};
        if (budget_row) st.flags.insert(st.flags.end(), {"--speculative-adaptive", "false"});
        settings.push_back(std::move(st));
      }
  } else {
    Setting st;
    st.label = algo;
    settings.push_back(std::move(st));
  }

  return settings;
}

// Per category for each setting, per prompt, and the budget's summary.
json settings_json(const std::vector<Setting>& settings, const std::vector<Prompt>& prompts) {
  std::map<std::string, std::vector<std::size_t>> by_cat;
  for (std::size_t i = 0; i < prompts.size(); ++i) by_cat[prompts[i].category].push_back(i);
  by_cat["overall"] = {};
  for (std::size_t i = 0; i < prompts.size(); ++i) by_cat["overall"].push_back(i);
  json out = json::array();
  for (const auto& s : settings) {
    json pos = json::array();
    for (std::size_t d = 0; d < s.metrics.drafted_at.size(); ++d) {
      const double acc = d < s.metrics.accepted_at.size() ? static_cast<double>(s.metrics.accepted_at[d]) : 0.0;
      pos.push_back(s.metrics.drafted_at[d] ? acc / static_cast<double>(s.metrics.drafted_at[d]) : 0.0);
    }
    json cats = json::object();
    for (const auto& [cat, idx] : by_cat) {
      std::vector<double> p, q, r;
      double tau = 0;
      for (auto i : idx) {
        p.push_back(s.plain[i].tps);
        q.push_back(s.runs[i].tps);
        if (s.plain[i].tps > 0) r.push_back(s.runs[i].tps / s.plain[i].tps);
        tau += s.runs[i].tau;
      }
      cats[cat] = {{"plain_tokens_per_s", median(p)},
                   {"speculative_tokens_per_s", median(q)},
                   {"median_speedup", median(r)},
                   {"mean_tau", tau / static_cast<double>(idx.size())}};
    }
    json per_prompt = json::array();
    for (std::size_t i = 0; i < prompts.size(); ++i)
      per_prompt.push_back({{"category", prompts[i].category},
                            {"plain_tokens_per_s", s.plain[i].tps},
                            {"speculative_tokens_per_s", s.runs[i].tps},
                            {"speedup", s.plain[i].tps > 0 ? s.runs[i].tps / s.plain[i].tps : 0.0},
                            {"tau", s.runs[i].tau},
                            {"drafted", s.runs[i].drafted},
                            {"accepted", s.runs[i].accepted},
                            {"identical", s.runs[i].tokens == s.plain[i].tokens},
                            {"generated_tokens", s.plain[i].tokens.size()},
                            {"prompt", prompts[i].text}});
    out.push_back({{"label", s.label},
                   {"flags", s.flags},
                   {"median_speedup", s.median_speedup},
                   {"mean_tau", s.mean_tau},
                   {"alpha", s.alpha},
                   {"acceptance_by_position", pos},
                   {"drafter",
                    s.metrics.draft_model.empty() ? json(nullptr) : json::parse(s.metrics.draft_model, nullptr, false)},
                   {"outputs_identical_to_plain", s.mismatches == 0},
                   {"mismatched_prompts", s.mismatches},
                   {"draft_ms", s.metrics.draft_ms},
                   {"verify_ms", s.metrics.step_compute_ms},
                   {"overhead_ms", s.metrics.step_wall_ms - s.metrics.step_compute_ms},
                   {"by_category", cats},
                   {"by_prompt", per_prompt},
                   {"budget", budget_json(s.metrics)}});
  }
  return out;
}

// The budget against the best fixed shape of each category (each category its own best).
json budget_vs_best_fixed(const json& settings) {
  json cmp = json::object();
  const json& b = settings[0]["by_category"];
  for (const auto& [cat, v] : b.items()) {
    double best_fixed = 0;
    std::string label;
    for (std::size_t i = 1; i < settings.size(); ++i) {
      const double x = settings[i]["by_category"][cat]["median_speedup"].get<double>();
      if (x > best_fixed) best_fixed = x, label = settings[i]["label"].get<std::string>();
    }
    const double mine = v["median_speedup"].get<double>();
    cmp[cat] = {{"budget_speedup", mine},
                {"best_fixed", label},
                {"best_fixed_speedup", best_fixed},
                {"ratio", best_fixed > 0 ? mine / best_fixed : 0.0}};
  }
  return cmp;
}

// Concurrent requests with the chosen (or best) setting: aggregate throughput with and without drafts.
json concurrent_json(const std::vector<std::string>& args, const std::vector<Prompt>& prompts,
                     const std::vector<std::int64_t>& concurrency, std::int64_t max_new, int repeats) {
  json out = json::array();
  for (std::int64_t n : concurrency)
    if (n > 0) {
      spdlog::info("bench: {} concurrent requests, plain and speculative alternating", n);
      const ConcurrentResult r = run_concurrent(args, prompts, n, max_new, repeats);
      out.push_back({{"requests", n},
                     {"requests_per_run", r.requests},
                     {"plain_tokens_per_s", r.plain.steady},
                     {"speculative_tokens_per_s", r.spec.steady},
                     {"ratio", r.plain.steady > 0 ? r.spec.steady / r.plain.steady : 0.0},
                     {"pair_ratios", r.pair_ratios},
                     {"balanced_ratio", geometric_mean(r.pair_ratios)},
                     {"drain_plain_tokens_per_s", r.plain.drain},
                     {"drain_speculative_tokens_per_s", r.spec.drain},
                     {"drain_ratio", r.plain.drain > 0 ? r.spec.drain / r.plain.drain : 0.0},
                     {"time", {{"plain", r.plain_time.to_json()}, {"speculative", r.spec_time.to_json()}}},
                     {"budget", budget_json(r.metrics)}});
    }
  return out;
}

void print_settings(const json& j, const std::string& algo, std::size_t prompt_count, const std::string& prompts_path,
                    std::int64_t max_new, int repeats) {
  const std::size_t n_prompts = prompt_count;
  std::cout << fmt::format(
      "specactor bench: plain vs {} on {} prompts ({}), greedy, up to {} new tokens each, best of "
      "{} alternating runs per prompt\n",
      algo, n_prompts, prompts_path, max_new, repeats);
  for (const auto& s : j["settings"]) {
    std::cout << fmt::format("\nsetting {}: median speedup {:.2f}x, mean τ {:.2f}, α {:.2f}, outputs identical: {}\n",
                             s["label"].get<std::string>(), s["median_speedup"].get<double>(),
                             s["mean_tau"].get<double>(), s["alpha"].get<double>(),
                             s["outputs_identical_to_plain"].get<bool>() ? "yes" : "NO");
    std::cout << fmt::format("  {:<10} {:>12} {:>12} {:>9} {:>7}\n", "category", "plain tok/s", "spec tok/s", "speedup",
                             "τ");
    for (const auto& [cat, v] : s["by_category"].items())
      std::cout << fmt::format("  {:<10} {:>12.1f} {:>12.1f} {:>8.2f}x {:>7.2f}\n", cat,
                               v["plain_tokens_per_s"].get<double>(), v["speculative_tokens_per_s"].get<double>(),
                               v["median_speedup"].get<double>(), v["mean_tau"].get<double>());
    std::string pos;
    for (const auto& a : s["acceptance_by_position"]) pos += fmt::format(" {:.2f}", a.get<double>());
    std::cout << "  acceptance by position:" << (pos.empty() ? " (no drafts)" : pos) << "\n";
    if (s["drafter"].is_object() && s["drafter"].contains("block_size"))
      std::cout << fmt::format(
          "  block: {} tokens trained (a pass runs the root and one row per draft asked, up to {})\n",
          s["drafter"]["block_size"].get<std::int64_t>(), s["drafter"]["block_size"].get<std::int64_t>() - 1);
    std::cout << fmt::format("  time: draft {:.0f} ms, verify {:.0f} ms, actor overhead {:.1f} ms\n",
                             s["draft_ms"].get<double>(), s["verify_ms"].get<double>(), s["overhead_ms"].get<double>());
    print_budget(s["budget"]);
  }
}

void print_comparisons(const json& j, const Setting& best, bool sweep) {
  if (sweep) std::cout << fmt::format("\nbest setting: {} ({:.2f}x)\n", best.label, best.median_speedup);
  if (j.contains("budget_vs_best_fixed")) {
    std::cout << "\nthe budget against each category's best fixed shape (same run):\n";
    std::cout << fmt::format("  {:<10} {:>8} {:>12} {:>9} {:>7}\n", "category", "budget", "best fixed", "speedup",
                             "ratio");
    for (const auto& [cat, v] : j["budget_vs_best_fixed"].items())
      std::cout << fmt::format("  {:<10} {:>7.2f}x {:>12} {:>8.2f}x {:>6.2f}x\n", cat,
                               v["budget_speedup"].get<double>(), v["best_fixed"].get<std::string>(),
                               v["best_fixed_speedup"].get<double>(), v["ratio"].get<double>());
  }
  for (const auto& c : j["concurrent"]) {
    std::cout << fmt::format(
        "\nconcurrent: {} requests in flight ({}, {} requests a run): aggregate {:.1f} tok/s plain, {:.1f} tok/s "
        "speculative = {:.2f}x while {} were in flight; {:.2f}x to the last completion ({:.1f} / {:.1f} tok/s)\n",
        c["requests"].get<std::int64_t>(), best.label, c["requests_per_run"].get<std::int64_t>(),
        c["plain_tokens_per_s"].get<double>(), c["speculative_tokens_per_s"].get<double>(), c["ratio"].get<double>(),
        c["requests"].get<std::int64_t>(), c["drain_ratio"].get<double>(), c["drain_plain_tokens_per_s"].get<double>(),
        c["drain_speculative_tokens_per_s"].get<double>());
    std::string pairs;
    for (const auto& x : c["pair_ratios"]) pairs += fmt::format(" {:.2f}", x.get<double>());
    std::cout << fmt::format(
        "  each engine's adjacent runs, speculative ÷ plain (orders alternating):{} (geometric mean {:.2f})\n", pairs,
        c["balanced_ratio"].get<double>());
    for (const char* mode : {"plain", "speculative"}) {
      const auto& t = c["time"][mode];
      const auto steps = std::max<std::int64_t>(1, t["target_steps"].get<std::int64_t>());
      std::cout << fmt::format(
          "  {:<11} {} target steps, {:.2f} tokens and {:.2f} ms each (compute {:.2f}, drafting {:.2f})\n", mode, steps,
          static_cast<double>(t["tokens"].get<std::int64_t>()) / static_cast<double>(steps),
          t["wall_ms"].get<double>() / static_cast<double>(steps),
          t["compute_ms"].get<double>() / static_cast<double>(steps),
          t["draft_ms"].get<double>() / static_cast<double>(steps));
    }
    print_budget(c["budget"]);
  }
}

}  // namespace

int bench_speculative(const std::vector<std::string>& server_args, const std::string& prompts_path,
                      std::int64_t max_new, int repeats, bool sweep, bool as_json, const std::string& chart,
                      const std::vector<std::int64_t>& concurrency, const std::vector<std::string>& compare) {
  const sc::ServerArgs user = sc::parse_server_args(server_args);
  spdlog::set_level(spdlog::level::from_str(user.log_level));
  const std::string algo(sc::to_string(user.speculative_algorithm));
  const std::vector<std::string> spec_base = spec_base_args(server_args, sweep);
  const std::vector<Prompt> prompts = resolve_chain(spec_base, load_prompts(prompts_path), max_new);
  std::vector<Setting> settings = make_settings(user, sweep, algo);
  for (const auto& c : compare) settings.push_back(compare_setting(c));
  for (auto& s : settings) {
    const std::vector<std::string> args = setting_args(spec_base, s);
    spdlog::info("bench: {} {} on {} prompts, plain and speculative alternating", algo, s.label, prompts.size());
    run_setting(args, prompts, max_new, repeats, s);
    // A drafter that went down leaves the engine decoding without drafts: not a measurement.
    if (!s.metrics.draft_error.empty())
      throw std::runtime_error("bench: " + algo + " " + s.label + ": the drafter went down (" + s.metrics.draft_error +
                               "), so the speculative runs decoded without drafts; nothing to report");
  }

  // Per category for the chosen (or best) setting.
  const auto best = std::max_element(settings.begin(), settings.end(), [](const Setting& a, const Setting& b) {
    return a.median_speedup < b.median_speedup;
  });
  json j;
  j["algorithm"] = algo;
  j["prompts"] = prompts_path;
  j["max_new_tokens"] = max_new;
  j["repeats"] = repeats;
  j["settings"] = settings_json(settings, prompts);
  j["best"] = best->label;
  if (sweep && user.speculative_adaptive) j["budget_vs_best_fixed"] = budget_vs_best_fixed(j["settings"]);
  if (!compare.empty()) j["against_first"] = against_first(j["settings"]);
  j["concurrent"] = concurrent_json(setting_args(spec_base, *best), prompts, concurrency, max_new, repeats);
  if (!chart.empty()) write_chart(chart, settings);
  if (as_json) {
    std::cout << j.dump(2, ' ', false, json::error_handler_t::replace) << "\n";
    return 0;
  }
  print_settings(j, algo, prompts.size(), prompts_path, max_new, repeats);
  print_comparisons(j, *best, sweep);
  if (!compare.empty()) print_against_first(j["against_first"], settings.front().label);
  if (!chart.empty()) std::cout << "chart: " << chart << "\n";
  return 0;
}
