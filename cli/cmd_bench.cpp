// cli/cmd_bench.cpp — `specactor bench`: the plain speed run (prefill, batch-1 decode against the machine's limits,
// c(k), concurrency, --depths); the speculative, --all-drafters and CUDA runs are in bench_spec.cpp and bench_gpu.cpp.
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

// Prefill then greedy decode of one sequence; returns (prefill seconds, decode seconds).
std::pair<double, double> run_once(sm::LlamaRunner& runner, sm::KvCache& kv, const std::vector<std::int32_t>& prompt,
                                   std::int64_t decode_tokens, std::int64_t chunk, std::int64_t vocab) {
  sm::KvCache::Seq seq;
  sm::ForwardResult out;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t at = 0; at < prompt.size();) {
    const std::size_t n = std::min<std::size_t>(static_cast<std::size_t>(chunk), prompt.size() - at);
    std::vector<sm::ForwardSeq> b(1);
    b[0].kv = &seq;
    b[0].tokens.assign(prompt.begin() + static_cast<long>(at), prompt.begin() + static_cast<long>(at + n));
    if (at + n == prompt.size()) b[0].logit_rows = {static_cast<std::int32_t>(n - 1)};
    runner.forward(b, kv, out);
    at += n;
  }
  const double prefill = seconds_since(t0);
  const auto t1 = std::chrono::steady_clock::now();
  for (std::int64_t i = 0; i < decode_tokens; ++i) {
    std::vector<sm::ForwardSeq> b(1);
    b[0].kv = &seq;
    b[0].tokens = {specactor::kernels::argmax(out.logits.data(), vocab)};
    b[0].logit_rows = {0};
    runner.forward(b, kv, out);
  }
  const double decode = seconds_since(t1);
  kv.release(seq);
  return {prefill, decode};
}

// c(k): the time of one forward over k new query rows (every row's logits returned, as verification
// needs them) at context `ctx_tokens`, best of `repeats`, for each k. The KV rows are dropped after
// each call so every measurement sees the same context.
std::vector<std::pair<std::int64_t, double>> measure_forward_rows(sm::LlamaRunner& runner, sm::KvCache& kv,
                                                                  const std::vector<std::int32_t>& prompt,
                                                                  const std::vector<std::int64_t>& ks, int repeats,
                                                                  std::int64_t chunk) {
  sm::KvCache::Seq seq;
  sm::ForwardResult out;
  for (std::size_t at = 0; at < prompt.size();) {
    const std::size_t n = std::min<std::size_t>(static_cast<std::size_t>(chunk), prompt.size() - at);
    std::vector<sm::ForwardSeq> b(1);
    b[0].kv = &seq;
    b[0].tokens.assign(prompt.begin() + static_cast<long>(at), prompt.begin() + static_cast<long>(at + n));
    runner.forward(b, kv, out);
    at += n;
  }
  const std::int64_t base = seq.length;
  // Rounds over every k in turn (the machine's drift then moves all k alike), best per k.
  std::vector<std::pair<std::int64_t, double>> times;
  for (const std::int64_t k : ks) times.emplace_back(k, 1e30);
  for (int i = 0; i < repeats + 1; ++i) {  // round 0 is a warm-up
    for (auto& [k, best] : times) {
      std::vector<sm::ForwardSeq> b(1);
      b[0].kv = &seq;
      for (std::int64_t j = 0; j < k; ++j) {
        b[0].tokens.push_back(prompt[static_cast<std::size_t>(j) % prompt.size()]);
        b[0].logit_rows.push_back(static_cast<std::int32_t>(j));
      }
      const auto t0 = std::chrono::steady_clock::now();
      runner.forward(b, kv, out);
      if (i > 0) best = std::min(best, seconds_since(t0));
      kv.truncate(seq, base);
    }
  }
  kv.release(seq);
  return times;
}

// Aggregate decode throughput of n concurrent greedy requests through the engine: generated tokens
// of all requests ÷ wall time from the first submission to the last completion.
double concurrent_tokens_per_s(sa::Engine& engine, const std::vector<std::int32_t>& prompt, std::int64_t n,
                               std::int64_t max_new) {
  std::mutex mu;
  std::condition_variable cv;
  std::int64_t done = 0, tokens = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::int64_t i = 0; i < n; ++i) {
    sa::GenerationRequest req;
    req.prompt_ids = prompt;
    req.prompt_ids.push_back(prompt[static_cast<std::size_t>(i) % prompt.size()]);  // n different requests
    req.max_new_tokens = max_new;
    req.ignore_eos = true;
    engine.submit(req, [&](const sa::TokenEvent& ev) {
      if (!ev.finished) return;
      std::lock_guard<std::mutex> lock(mu);
      ++done;
      tokens += ev.metrics.generated_tokens;
      cv.notify_all();
    });
  }
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done == n; });
  return static_cast<double>(tokens) / seconds_since(t0);
}

void add_bench_flags(CLI::App& cmd, BenchOptions& o) {
  cmd.add_option("--prompt-tokens", o.prompt_tokens, "prefill length of the speed run (default 256)")
      ->check(integer_at_least<std::int64_t>(1));
  cmd.add_option("--decode-tokens", o.decode_tokens, "decode length of the speed run (default 128)")
      ->check(integer_at_least<std::int64_t>(1));
  cmd.add_option("--repeats", o.repeats, "rounds (default 3 for the speed run, 2 for speculative runs)")
      ->check(integer_at_least<std::int64_t>(1));
  cmd.add_option("--max-new-tokens", o.max_new_tokens, "tokens per prompt in speculative runs (default 64)")
      ->check(integer_at_least<std::int64_t>(2));
  cmd.add_option("--prompts", o.prompts,
                 "prompt set, JSON lines {\"category\", \"prompt\"} (default: the shipped cli/bench_prompts.jsonl)");
  cmd.add_option("--chart", o.chart, "speculative runs: write an SVG chart");
  cmd.add_flag("--sweep", o.sweep, "speculative runs: a grid of (steps, topk, draft tokens)");
  cmd.add_option("--concurrency", o.concurrency,
                 "speculative runs: also this many concurrent requests, aggregate tok/s with and without drafts "
                 "(default 4 16; 0 = none)")
      ->check(integer_at_least<std::int64_t>(0));
  cmd.add_option("--depths", o.depths,
                 "speed run (--speculative-algorithm NONE): also prefill of D tokens and batch-1 decode after them, "
                 "with the bandwidth limit at that depth, for each D (e.g. 0,2048,7936; 0 = decode from a 1-token "
                 "prompt)")
      ->delimiter(',')
      ->check(integer_at_least<std::int64_t>(0));
  cmd.add_flag("--all-drafters", o.all_drafters, "plain vs every drafter in one run");
  cmd.add_option("--compare", o.compare,
                 "speculative runs: also this drafter, ALGO or ALGO:PATH (its default shape; without PATH the one "
                 "shipped for the model), as a setting of the same run, reported per category against the first "
                 "(repeatable)");
  cmd.add_flag("--json", o.json, "print JSON");
}

namespace {

// Plain vs every drafter on this device (what `bench --device cuda` ends with).
int bench_all_drafters(const BenchOptions& o, const std::vector<std::string>& rest, const sc::ServerArgs& parsed) {
  if (parsed.speculative_algorithm != sc::SpecAlgorithm::None &&
      parsed.speculative_algorithm != sc::SpecAlgorithm::Auto)
    throw sc::ConfigError("--all-drafters: picks the algorithms itself; drop --speculative-algorithm");
  const std::int64_t repeats = o.repeats ? o.repeats : 2;
  const Resolved r = resolve_from_args(rest);
  spdlog::set_level(spdlog::level::from_str(r.target->log_level));
  const auto rows = bench_every_drafter(rest, r.target->model_path, r.info, r.info.num_layers, o.prompts,
                                        o.max_new_tokens, static_cast<int>(repeats));
  if (o.json) {
    std::cout << json{{"model", r.target->model_path}, {"device", "cpu"}, {"drafters", drafter_rows_json(rows)}}.dump(2)
              << "\n";
    return 0;
  }
  std::cout << fmt::format("specactor bench --all-drafters: {} on the CPU\n", r.target->model_path);
  print_drafter_rows(rows, o.prompts, o.max_new_tokens, repeats);
  return 0;
}

struct DepthRun {
  std::int64_t depth = 0;
  double prefill_tps = 0, decode_tps = 0, direct_decode_tps = 0, bytes_per_token = 0, ceiling_tps = 0;
};

// What the plain speed run measured, through the engine and of the model alone.
struct SpeedRun {
  std::int64_t prompt_tokens = 0, decode_tokens = 0, repeats = 0, deepest = 0;
  std::vector<std::int32_t> piece;  // the repeated text's tokens
  double decode_tps = 0, overhead_pct = 0, overhead_us = 0;
  std::vector<std::pair<std::int64_t, double>> concurrent;
  std::vector<DepthRun> depth_runs;
  double best_prefill = 1e30, best_decode = 1e30, prefill_tps = 0, direct_decode_tps = 0;
  std::vector<std::pair<std::int64_t, double>> rows_times;
  specactor::kernels::MemoryBandwidth bw;
  double peak_gflops = 0;
  std::uint64_t macs = 0;
  double bytes_per_token = 0, ceiling_tps = 0, achieved_gbps = 0, achieved_gflops = 0;
  std::size_t tile_bytes = 0;
  double weight_mib = 0;
  std::int64_t layers = 0;

  // The first n tokens of the repeated text (at least one).
  std::vector<std::int32_t> prompt_of(std::int64_t n) const {
    std::vector<std::int32_t> ids;
    while (static_cast<std::int64_t>(ids.size()) < std::max<std::int64_t>(n, 1))
      ids.insert(ids.end(), piece.begin(), piece.end());
    ids.resize(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)));
    return ids;
  }
};

// The run's lengths against the context, before anything loads.
void check_speed_lengths(const BenchOptions& o, const sc::ServerArgs& s, SpeedRun& run) {
  if (o.prompt_tokens + o.decode_tokens > *s.context_length)
    throw sc::ConfigError("--prompt-tokens + --decode-tokens (" + std::to_string(o.prompt_tokens + o.decode_tokens) +
                          ") exceed the context length " + std::to_string(*s.context_length));
  run.deepest = o.prompt_tokens;
  for (const std::int64_t d : o.depths) {
    if (d + o.decode_tokens > *s.context_length)
      throw sc::ConfigError("--depths: " + std::to_string(d) + " + --decode-tokens " + std::to_string(o.decode_tokens) +
                            " exceed the context length " + std::to_string(*s.context_length));
    run.deepest = std::max(run.deepest, d);
  }
}

// 1) Through the actor engine (scheduler -> target worker messages per step).
void measure_engine(const BenchOptions& o, const std::vector<std::string>& rest, SpeedRun& run) {
  const std::int64_t decode_tokens = run.decode_tokens, repeats = run.repeats;
  auto engine = sa::Engine::create(sc::parse_server_args(rest));
  // A prompt of exactly prompt_tokens ids: a fixed text, repeated.
  const std::string text =
      "Speculative decoding lets a small draft propose several tokens that the large target model then verifies in "
      "one forward pass, so that every accepted token costs a fraction of a full decoding step. ";
  run.piece = engine->tokenizer() ? engine->tokenizer()->encode(text) : std::vector<std::int32_t>{};
  if (run.piece.empty()) run.piece = {1, 2, 3};  // no tokenizer, or one that encodes none of the text (test models)
  const std::vector<std::int32_t> prompt = run.prompt_of(run.prompt_tokens);
  sa::GenerationRequest req;
  req.prompt_ids = prompt;
  req.max_new_tokens = decode_tokens + 1;  // the first token comes from the prefill
  req.ignore_eos = true;
  engine->generate(req);  // warm-up
  const sa::EngineMetrics before = engine->metrics();
  for (std::int64_t i = 0; i < repeats; ++i)
    run.decode_tps = std::max(run.decode_tps, engine->generate(req).metrics.decode_tokens_per_s);
  const sa::EngineMetrics after = engine->metrics();
  // Concurrent requests (continuous batching): a 32-token prompt each, decode_tokens new tokens.
  const std::vector<std::int32_t> short_prompt(prompt.begin(),
                                               prompt.begin() + std::min<std::int64_t>(32, run.prompt_tokens));
  for (const std::int64_t n : {1, 4, 16})
    run.concurrent.emplace_back(n, concurrent_tokens_per_s(*engine, short_prompt, n, decode_tokens));
  // --depths: batch-1 decode through the engine after each context (the first request prefills it; the
  // repeats find it in the prefix cache and measure decode only).
  for (const std::int64_t d : o.depths) {
    spdlog::info("--depths: decode after {} tokens through the engine", d);
    sa::GenerationRequest dr;
    dr.prompt_ids = run.prompt_of(d);
    dr.max_new_tokens = decode_tokens + 1;
    dr.ignore_eos = true;
    engine->generate(dr);
    DepthRun depth;
    depth.depth = d;
    for (std::int64_t i = 0; i < repeats; ++i)
      depth.decode_tps = std::max(depth.decode_tps, engine->generate(dr).metrics.decode_tokens_per_s);
    run.depth_runs.push_back(depth);
  }
  engine->shutdown();
  const double step_wall = after.step_wall_ms - before.step_wall_ms;
  const double step_compute = after.step_compute_ms - before.step_compute_ms;
  const double steps = static_cast<double>(after.steps - before.steps);
  run.overhead_pct = step_wall > 0 ? 100.0 * (step_wall - step_compute) / step_wall : 0.0;
  run.overhead_us = steps > 0 ? 1000.0 * (step_wall - step_compute) / steps : 0.0;
}

// 2) The model alone, no actors, after the engine has stopped: the kernel-level reference, c(k), and
// the bytes and multiply-adds of a decode step against the machine's limits.
void measure_model(const sc::ServerArgs& s, SpeedRun& run) {
  const std::int64_t decode_tokens = run.decode_tokens, repeats = run.repeats;
  spdlog::info("measuring the machine: memory bandwidth and peak FMA throughput");
  run.bw = specactor::kernels::measure_memory_bandwidth();
  run.peak_gflops = specactor::kernels::measure_peak_gflops();
  const sm::LoadedModel m = sm::load_model(s);
  if (s.threads > 0) specactor::kernels::ComputePool::instance().set_threads(static_cast<int>(s.threads));
  sm::KvCache kv(
      m.config.n_layers, m.config.n_kv_heads, m.config.head_dim, s.page_size,
      (run.deepest + std::max<std::int64_t>(decode_tokens, 16) + s.page_size) / s.page_size * s.page_size + s.page_size,
      true, sm::kv_type(s));
  sm::LlamaRunner runner(m.weights, static_cast<int>(s.threads), sm::cpu_precision(s));
  const std::vector<std::int32_t> prompt = run.prompt_of(run.prompt_tokens);
  run_once(runner, kv, prompt, 4, s.chunked_prefill_size, m.config.vocab_size);  // warm-up
  for (std::int64_t i = 0; i < repeats; ++i) {
    const auto [p, d] = run_once(runner, kv, prompt, decode_tokens, s.chunked_prefill_size, m.config.vocab_size);
    run.best_prefill = std::min(run.best_prefill, p);
    run.best_decode = std::min(run.best_decode, d);
  }
  run.prefill_tps = run.prompt_tokens / run.best_prefill;
  run.direct_decode_tps = decode_tokens / run.best_decode;
  for (DepthRun& depth : run.depth_runs) {  // prefill of each depth and decode after it, the model alone
    spdlog::info("--depths: prefill of {} tokens and decode after them, the model alone", depth.depth);
    const auto ids = run.prompt_of(depth.depth);
    double bp = 1e30, bd = 1e30;
    for (std::int64_t i = 0; i < repeats; ++i) {
      const auto [p, d] = run_once(runner, kv, ids, decode_tokens, s.chunked_prefill_size, m.config.vocab_size);
      bp = std::min(bp, p);
      bd = std::min(bd, d);
    }
    depth.prefill_tps = depth.depth > 0 ? static_cast<double>(ids.size()) / bp : 0.0;
    depth.direct_decode_tps = decode_tokens / bd;
  }
  // c(k) at the prompt's context (256 by default).
  run.rows_times = measure_forward_rows(runner, kv, prompt, {1, 2, 4, 8, 16},
                                        static_cast<int>(std::max<std::int64_t>(repeats, 3)), s.chunked_prefill_size);
  // Per decode step: every weight once, plus the KV cache read at the mean context of the run.
  for (const auto& L : m.weights->layers())
    for (const auto* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.gate, &L.up, &L.down})
      run.macs += static_cast<std::uint64_t>(w->out_dim * w->in_dim);
  run.macs += static_cast<std::uint64_t>(m.weights->output().out_dim * m.weights->output().in_dim);
  const double mean_ctx = run.prompt_tokens + decode_tokens / 2.0;
  const double kv_bytes = static_cast<double>(kv.bytes_per_token()) * mean_ctx;
  run.bytes_per_token = static_cast<double>(m.weights->weight_bytes()) + kv_bytes;
  run.ceiling_tps = run.bw.read_gbps * 1e9 / run.bytes_per_token;
  run.achieved_gbps = run.bytes_per_token * run.decode_tps / 1e9;
  run.achieved_gflops = 2.0 * static_cast<double>(run.macs) * run.decode_tps / 1e9;
  for (DepthRun& depth : run.depth_runs) {
    depth.bytes_per_token = static_cast<double>(m.weights->weight_bytes()) +
                            static_cast<double>(kv.bytes_per_token()) *
                                (static_cast<double>(std::max<std::int64_t>(depth.depth, 1)) + decode_tokens / 2.0);
    depth.ceiling_tps = run.bw.read_gbps * 1e9 / depth.bytes_per_token;
  }
  run.tile_bytes = tile_copy_bytes_of(*m.weights);
  run.weight_mib = m.weights->weight_bytes() / 1048576.0;
  run.layers = m.config.n_layers;
}

struct PathNames {
  const char* path;
  const char* precision_path;
  int threads;
  std::string reason, tiles;
};

PathNames path_names(const sc::ServerArgs& s, const SpeedRun& run) {
  const char* path = specactor::kernels::cpu_path_name(specactor::kernels::cpu_path());
  const bool fast = s.cpu_precision == sc::CpuPrecision::Fast;
  return {path, fast ? specactor::kernels::qpath_name(specactor::kernels::qpath()) : path,
          specactor::kernels::ComputePool::instance().threads(),
          fast ? specactor::kernels::qpath_reason() : std::string(path) + ": the exact precision's float kernels",
          fast ? tile_note(run.tile_bytes) : ""};
}

void print_speed_json(const sc::ServerArgs& s, const SpeedRun& run) {
  const PathNames names = path_names(s, run);
  const char* precision_path = names.precision_path;
  const std::string& path_reason = names.reason;
  const int threads = names.threads;
  json j = {
      {"model", s.model_path},
      {"cpu_path", precision_path},
      {"cpu_path_reason", path_reason},
      {"cpu_precision", sc::to_string(s.cpu_precision)},
      {"tile_rows", s.cpu_precision == sc::CpuPrecision::Fast ? specactor::kernels::qpath_tile_rows() : 0},
      {"tile_rows_kquant", s.cpu_precision == sc::CpuPrecision::Fast ? specactor::kernels::qpath_tile_rows_k() : 0},
      {"tile_copy_bytes", run.tile_bytes},
      {"kv_cache_dtype", s.kv_cache_dtype},
      {"threads", threads},
      {"memory_read_gbps", run.bw.read_gbps},
      {"memory_copy_gbps", run.bw.copy_gbps},
      {"peak_fma_gflops", run.peak_gflops},
      {"prompt_tokens", run.prompt_tokens},
      {"prefill_tokens_per_s", run.prefill_tps},
      {"decode_tokens", run.decode_tokens},
      {"decode_tokens_per_s", run.decode_tps},
      {"decode_tokens_per_s_without_actors", run.direct_decode_tps},
      {"actor_overhead_percent_of_step", run.overhead_pct},
      {"actor_overhead_us_per_step", run.overhead_us},
      {"bytes_per_decode_token", run.bytes_per_token},
      {"bandwidth_ceiling_tokens_per_s", run.ceiling_tps},
      {"fraction_of_bandwidth_ceiling", run.decode_tps / run.ceiling_tps},
      {"decode_gflops", run.achieved_gflops},
      {"fraction_of_peak_fma", run.peak_gflops > 0 ? run.achieved_gflops / run.peak_gflops : 0.0},
      {"repeats", run.repeats}};
  for (const auto& [k, t] : run.rows_times)
    j["forward_rows"].push_back({{"rows", k}, {"ms", 1000 * t}, {"c", t / run.rows_times[0].second}});
  for (const auto& [n, tps] : run.concurrent)
    j["concurrent"].push_back(
        {{"requests", n}, {"tokens_per_s", tps}, {"ratio_to_one", tps / run.concurrent[0].second}});
  for (const DepthRun& run : run.depth_runs)
    j["depths"].push_back({{"depth", run.depth},
                           {"prefill_tokens_per_s", run.prefill_tps},
                           {"decode_tokens_per_s", run.decode_tps},
                           {"decode_tokens_per_s_without_actors", run.direct_decode_tps},
                           {"bytes_per_decode_token", run.bytes_per_token},
                           {"bandwidth_ceiling_tokens_per_s", run.ceiling_tps},
                           {"fraction_of_bandwidth_ceiling", run.decode_tps / run.ceiling_tps}});
  std::cout << j.dump(2, ' ', false, json::error_handler_t::replace) << "\n";
}

void print_speed_text(const sc::ServerArgs& s, const SpeedRun& run) {
  const PathNames names = path_names(s, run);
  const char* precision_path = names.precision_path;
  const std::string& path_reason = names.reason;
  const std::string& tiles = names.tiles;
  const int threads = names.threads;
  std::cout << fmt::format(
      "specactor bench: {} ({} layers, {:.1f} MiB of weights), --cpu-precision {} (path {}{}), KV cache {}, {} "
      "threads\n",
      s.model_path, run.layers, run.weight_mib, sc::to_string(s.cpu_precision), precision_path, tiles, s.kv_cache_dtype,
      threads);
  std::cout << "path:     " << path_reason << "\n";
  std::cout << fmt::format(
      "machine:  memory read {:.1f} GB/s (copy {:.1f} GB/s, {} MiB buffer); peak FMA {:.1f} GFLOP/s\n",
      run.bw.read_gbps, run.bw.copy_gbps, run.bw.bytes >> 20, run.peak_gflops);
  std::cout << fmt::format("prefill:  {} tokens in {:.3f} s = {:.1f} tok/s (best of {})\n", run.prompt_tokens,
                           run.best_prefill, run.prefill_tps, run.repeats);
  std::cout << fmt::format(
      "decode:   batch 1, {} tokens: {:.1f} tok/s through the actor engine, {:.1f} tok/s calling the "
      "model directly (best of {})\n",
      run.decode_tokens, run.decode_tps, run.direct_decode_tps, run.repeats);
  std::cout << fmt::format(
      "actors:   {:.1f} us per step outside the target's compute = {:.2f}% of the step "
      "(messages, copies, scheduling)\n",
      run.overhead_us, run.overhead_pct);
  std::cout << fmt::format(
      "          {:.1f} MB read per token (weights + KV) -> bandwidth ceiling {:.1f} tok/s; "
      "reached {:.1f}% ({:.1f} GB/s)\n",
      run.bytes_per_token / 1e6, run.ceiling_tps, 100.0 * run.decode_tps / run.ceiling_tps, run.achieved_gbps);
  std::cout << fmt::format("          {:.2f} GFLOP per token -> {:.1f} GFLOP/s = {:.1f}% of the measured FMA peak\n",
                           2.0 * run.macs / 1e9, run.achieved_gflops,
                           run.peak_gflops > 0 ? 100.0 * run.achieved_gflops / run.peak_gflops : 0.0);
  std::string ck =
      fmt::format("c(k):     one forward over k query rows at context {}, ÷ 1 row (best of {}):", run.prompt_tokens,
                  std::max<std::int64_t>(run.repeats, 3));
  for (const auto& [k, t] : run.rows_times)
    ck += fmt::format("  c({})={:.2f} ({:.1f} ms)", k, t / run.rows_times[0].second, 1000 * t);
  std::cout << ck << "\n";
  std::string cc = fmt::format(
      "batching: aggregate decode tok/s of n run.concurrent requests through the engine (32-token prompts, {} new "
      "tokens each):",
      run.decode_tokens);
  for (const auto& [n, tps] : run.concurrent)
    cc += fmt::format("  n={}: {:.1f} ({:.2f}x)", n, tps, tps / run.concurrent[0].second);
  std::cout << cc << "\n";
  if (!run.depth_runs.empty())
    std::cout << fmt::format(
        "depths:   prefill of D tokens (the model alone) and batch-1 decode of {} tokens after them (through the "
        "engine; best of {}), against the bandwidth limit of the bytes each token reads (weights + KV):\n",
        run.decode_tokens, run.repeats);
  for (const DepthRun& run : run.depth_runs)
    std::cout << fmt::format(
        "          D={}: {}decode {:.1f} tok/s ({:.1f} without actors); {:.1f} MB per token -> "
        "limit {:.1f} tok/s; reached {:.1f}%\n",
        run.depth, run.depth > 0 ? fmt::format("prefill {:.1f} tok/s, ", run.prefill_tps) : "", run.decode_tps,
        run.direct_decode_tps, run.bytes_per_token / 1e6, run.ceiling_tps, 100.0 * run.decode_tps / run.ceiling_tps);
}

}  // namespace

int cmd_bench(BenchOptions o, const std::vector<std::string>& rest) {
  if (o.prompts.empty()) {
    o.prompts = specactor::cli::shipped_file("cli/bench_prompts.jsonl", "bench_prompts.jsonl");
    if (o.prompts.empty()) o.prompts = "cli/bench_prompts.jsonl";  // not found: the error names it
  }
  const sc::ServerArgs parsed = sc::parse_server_args(rest);
  if (o.all_drafters && !o.compare.empty())
    throw sc::ConfigError("--compare: not with --all-drafters, which picks the drafters itself");
  if (o.all_drafters && parsed.device != sc::Device::Cuda) return bench_all_drafters(o, rest, parsed);
  for (const std::int64_t n : o.concurrency)
    if (n > 256)
      throw sc::ConfigError("--concurrency: at most 256 concurrent requests (got " + std::to_string(n) + ")");
  // AUTO: speculative with a head that ships for the model, else the plain speed run.
  sc::Algorithm algo = parsed.speculative_algorithm;
  if (algo == sc::SpecAlgorithm::Auto) algo = resolve_from_args(rest).target->speculative_algorithm;
  if (!o.depths.empty() && (algo != sc::SpecAlgorithm::None || parsed.device == sc::Device::Cuda || o.all_drafters))
    throw sc::ConfigError(
        "--depths: only with the CPU speed run (--speculative-algorithm NONE, not --device cuda or --all-drafters)");
  if (parsed.device == sc::Device::Cuda && algo == sc::SpecAlgorithm::None) {
    CudaBenchOptions c;
    c.prompt_tokens = o.prompt_tokens;
    c.decode_tokens = o.decode_tokens;
    c.repeats = o.repeats ? o.repeats : 3;
    c.max_new_tokens = o.max_new_tokens;
    c.prompts_path = o.prompts;
    c.json = o.json;
    return bench_cuda(rest, c);
  }
  if (!o.compare.empty() && (algo == sc::SpecAlgorithm::None || o.sweep || parsed.device == sc::Device::Cuda))
    throw sc::ConfigError("--compare: only with a CPU speculative run (a --speculative-algorithm, no --sweep)");
  if (algo != sc::SpecAlgorithm::None)
    return bench_speculative(rest, o.prompts, o.max_new_tokens, static_cast<int>(o.repeats ? o.repeats : 2), o.sweep,
                             o.json, o.chart, o.concurrency, o.compare);
  SpeedRun run;
  run.prompt_tokens = o.prompt_tokens;
  run.decode_tokens = o.decode_tokens;
  run.repeats = o.repeats ? o.repeats : 3;
  const Resolved r = resolve_from_args(rest);
  const sc::ServerArgs& s = *r.target;
  spdlog::set_level(spdlog::level::from_str(s.log_level));
  check_speed_lengths(o, s, run);
  measure_engine(o, rest, run);
  measure_model(s, run);
  if (o.json)
    print_speed_json(s, run);
  else
    print_speed_text(s, run);
  return 0;
}

}  // namespace specactor::cli
