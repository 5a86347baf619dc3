// cli/specactor.cpp — the specactor command-line launcher: one CLI11 application with a subcommand
// per command (generate, bench, config, inspect, make-head, shrink, devices; `specactor --help`).
// generate, bench and config also take server flags, parsed by the settings table
// (config::parse_server_args) from what the subcommand does not declare; every command resolves
// through model::resolve_target, and request ranges are checked by sched::check_request, as in the
// engine.
//
// Results go to stdout; logs and errors to stderr. Bad input exits with status 2 and one message.
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

namespace sc = specactor::config;
namespace sm = specactor::model;
namespace sk = specactor::kernels;
namespace sa = specactor::actors;
using json = nlohmann::json;

namespace {

// What the AMX path adds, for the load line and bench: the row count from which products run on the
// tiles, the formats, and the memory of the tile copies (`bytes`); "" when the tiles do not run.
std::string tile_note(std::size_t bytes) {
  if (sk::qpath_tile_rows() <= 0) return "";
  return fmt::format("; tiles for Q4_0/Q4_1/Q8_0 calls of {}+ rows, their tile copy {:.1f} MiB more memory",
                     sk::qpath_tile_rows(), static_cast<double>(bytes) / 1048576.0);
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

// Server flags (everything a subcommand does not declare itself) → the resolved target snapshot.
struct Resolved {
  sc::Snapshot target;
  sm::ModelInfo info;
};
Resolved resolve_from_args(const std::vector<std::string>& args) {
  auto r = sm::resolve_target(sc::parse_server_args(args));
  return {std::move(r.target), std::move(r.info)};
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// `generate`'s own flags (the rest of its command line are server flags).
struct GenerateOptions {
  sa::GenerationRequest req;
  std::string prompt_file;
  std::uint64_t seed = 0;
  bool has_seed = false;
  std::int64_t max_new_tokens = 0;
  bool max_new_given = false;
  bool json = false;
};

void add_generate_flags(CLI::App& cmd, GenerateOptions& o) {
  auto& r = o.req;
  // A flag given twice takes its last value, so `tools/setup run -- --prompt ...` replaces the default.
  cmd.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd.add_option("-p,--prompt", r.prompt, "the prompt text (this or --prompt-file is required)");
  cmd.add_option("--prompt-file", o.prompt_file, "read the prompt from FILE (- = standard input)");
  cmd.add_flag("--chat", r.chat, "format the prompt with the model's chat template");
  cmd.add_option("--system", r.system, "a system turn (needs --chat)");
  cmd.add_option("-n,--max-new-tokens", o.max_new_tokens,
                 "tokens to generate at most; the prompt and these must fit the context (default: until the "
                 "end-of-generation token, or as many as the context leaves)")
      ->check(integer_at_least<std::int64_t>(1))
      ->each([&o](const std::string&) { o.max_new_given = true; });
  cmd.add_option("--temperature", r.sampling.temperature, "0 = greedy (default)")->check(finite_number());
  cmd.add_option("--top-p", r.sampling.top_p, "nucleus sampling, (0, 1] (default 1 = off)")->check(finite_number());
  cmd.add_option("--top-k", r.sampling.top_k, "keep the k most likely tokens (default 0 = off)")
      ->check(integer_at_least<std::int32_t>(0));
  cmd.add_option("--min-p", r.sampling.min_p, "drop tokens below min_p × the top probability, [0, 1)")
      ->check(finite_number());
  cmd.add_option("--seed", o.seed, "the request's sampling seed (default: --random-seed)")
      ->check(integer_at_least<std::int64_t>(0))
      ->each([&o](const std::string&) { o.has_seed = true; });
  cmd.add_option("--stop", r.stop, "a stop string (repeatable; not part of the output)")
      ->expected(1)
      ->take_all()
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd.add_flag("--ignore-eos", r.ignore_eos, "go on after the end-of-generation token");
  cmd.add_flag("--json", o.json, "print tokens, text, timings and speculative metrics as JSON");
}

// The prompt of --prompt or --prompt-file (exactly one of them), and --system only with --chat.
void take_prompt(GenerateOptions& o, bool prompt_given) {
  auto& r = o.req;
  if (prompt_given && !o.prompt_file.empty())
    throw sc::ConfigError("--prompt and --prompt-file: give one of them, not both");
  if (!prompt_given && o.prompt_file.empty())
    throw sc::ConfigError("--prompt is required (or --prompt-file FILE, - for standard input)");
  if (!o.prompt_file.empty()) {
    if (o.prompt_file == "-") {
      r.prompt.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    } else {
      r.prompt = sc::read_text_file(o.prompt_file, "--prompt-file " + o.prompt_file);
    }
    while (!r.prompt.empty() && (r.prompt.back() == '\n' || r.prompt.back() == '\r')) r.prompt.pop_back();
  }
  if (!r.system.empty() && !r.chat)
    throw sc::ConfigError("--system: needs --chat (a system turn is part of the chat template)");
}

// Ctrl-C during `generate`: the first cancels the request (the summary still prints), a second one
// ends the process at once.
std::atomic<bool> g_interrupted{false};
extern "C" void on_sigint(int) {
  g_interrupted.store(true);
  std::signal(SIGINT, SIG_DFL);
}

int cmd_generate(GenerateOptions o, const std::vector<std::string>& rest) {
  sa::GenerationRequest& req = o.req;
  if (o.has_seed) req.seed = o.seed;
  if (o.max_new_given) req.max_new_tokens = o.max_new_tokens;
  specactor::sched::check_request(req, {}, flag_of);  // before the model loads; prepare checks the rest
  const bool as_json = o.json;

  const sc::ServerArgs args = sc::parse_server_args(rest);
  spdlog::set_level(spdlog::level::from_str(args.log_level));
  const auto t_load = std::chrono::steady_clock::now();
  auto engine = sa::Engine::create(args);
  const double load_s = seconds_since(t_load);
  // From here on a Ctrl-C cancels the request (before the load line, so an interruption right after it is
  // never lost: a shell starts background jobs with SIGINT ignored, and that would stay in force).
  std::signal(SIGINT, on_sigint);
  if (!engine->tokenizer()) throw sc::ConfigError("--skip-tokenizer-init: generate needs a tokenizer for --prompt");
  const bool fast = engine->target_snapshot()->cpu_precision == sc::CpuPrecision::Fast;
  spdlog::info("loaded {} in {:.2f} s through the actor engine ({}); cpu path {} ({} precision{})", args.model_path,
               load_s, std::string(sc::to_string(engine->target_snapshot()->speculative_algorithm)),
               fast ? specactor::kernels::qpath_name(specactor::kernels::qpath())
                    : specactor::kernels::cpu_path_name(specactor::kernels::cpu_path()),
               fast ? "fast" : "exact", fast ? tile_note(specactor::kernels::tile_copy_bytes()) : std::string());
  if (req.chat && sm::ChatTemplate::detect(engine->tokenizer()->chat_template()).format == sm::ChatFormat::Plain)
    spdlog::warn("the model's chat template is not recognised (supported: ChatML, Llama-3); sending plain text");

  engine->prepare(req, flag_of);  // tokenized once; submit keeps these ids
  const std::vector<std::int32_t> prompt_ids = req.prompt_ids;

  std::promise<sa::TokenEvent> last;
  auto done = last.get_future();
  std::vector<std::int32_t> tokens;
  std::string text;
  const std::uint64_t id = engine->submit(req, [&](const sa::TokenEvent& ev) {
    tokens.insert(tokens.end(), ev.tokens.begin(), ev.tokens.end());
    text += ev.text;
    if (!as_json && !ev.text.empty()) {
      std::fwrite(ev.text.data(), 1, ev.text.size(), stdout);
      std::fflush(stdout);
    }
    if (ev.finished) last.set_value(ev);
  });
  bool cancelled = false;
  while (done.wait_for(std::chrono::milliseconds(20)) != std::future_status::ready)
    if (!cancelled && g_interrupted.load()) {
      engine->cancel(id);
      cancelled = true;
    }
  std::signal(SIGINT, SIG_DFL);
  const sa::TokenEvent end = done.get();
  const sa::EngineMetrics em = engine->metrics();
  engine->shutdown();
  if (end.finish_reason == "error") {
    if (end.invalid_request) throw sc::ConfigError(end.error);
    throw std::runtime_error(end.error);
  }
  const auto& m = end.metrics;
  if (!as_json) std::fputc('\n', stdout);
  if (cancelled) spdlog::warn("interrupted (Ctrl-C): the request was cancelled after {} tokens", m.generated_tokens);
  spdlog::info(
      "prompt {} tokens, first token after {:.1f} ms; generated {} tokens, {:.1f} tok/s decode ({}); "
      "τ {:.2f}, α {:.2f}",
      m.prompt_tokens, m.time_to_first_token_ms, m.generated_tokens, m.decode_tokens_per_s, end.finish_reason,
      m.mean_accepted_length, em.acceptance_rate);
  if (as_json) {
    json j = {{"prompt_tokens", prompt_ids},
              {"tokens", tokens},
              {"text", text},
              {"finish_reason", end.finish_reason},
              {"timings",
               {{"load_s", load_s},
                {"time_to_first_token_ms", m.time_to_first_token_ms},
                {"decode_tokens_per_s", m.decode_tokens_per_s}}},
              {"speculative",
               {{"algorithm", em.algorithm},
                {"steps", m.steps},
                {"drafted", m.drafted},
                {"accepted", m.accepted},
                {"mean_accepted_length", m.mean_accepted_length},
                {"acceptance_rate", m.drafted > 0 ? static_cast<double>(m.accepted) / m.drafted : 0.0},
                {"fallback_steps", m.fallbacks},
                {"budget_skipped_steps", m.budget_skipped}}}};
    std::cout << j.dump(2, ' ', false, json::error_handler_t::replace) << "\n";
  }
  return cancelled ? 130 : 0;  // 128 + SIGINT, as a shell reports an interrupted command
}

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

// `bench`'s own flags. Defaults that depend on the mode are left unset (0 / empty) here.
struct BenchOptions {
  std::int64_t prompt_tokens = 256, decode_tokens = 128, repeats = 0, max_new_tokens = 64;
  std::string prompts, chart;  // prompts: default the shipped set (cli/bench_prompts.jsonl), found beside the binary
  bool json = false, sweep = false, all_drafters = false;
  std::vector<std::int64_t> concurrency{4, 16};
  std::vector<std::int64_t> depths;  // speed run: also prefill of / decode after each of these contexts
};

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
  cmd.add_flag("--json", o.json, "print JSON");
}

int cmd_bench(BenchOptions o, const std::vector<std::string>& rest) {
  if (o.prompts.empty()) {
    o.prompts = specactor::cli::shipped_file("cli/bench_prompts.jsonl", "bench_prompts.jsonl");
    if (o.prompts.empty()) o.prompts = "cli/bench_prompts.jsonl";  // not found: the error names it
  }
  const sc::ServerArgs parsed = sc::parse_server_args(rest);
  if (o.all_drafters && parsed.device != sc::Device::Cuda) {
    // Plain vs every drafter on this device (what `bench --device cuda` ends with).
    if (parsed.speculative_algorithm != sc::SpecAlgorithm::None &&
        parsed.speculative_algorithm != sc::SpecAlgorithm::Auto)
      throw sc::ConfigError("--all-drafters: picks the algorithms itself; drop --speculative-algorithm");
    const std::int64_t repeats = o.repeats ? o.repeats : 2;
    const Resolved r = resolve_from_args(rest);
    spdlog::set_level(spdlog::level::from_str(r.target->log_level));
    const auto rows =
        bench_every_drafter(rest, r.info, r.info.num_layers, o.prompts, o.max_new_tokens, static_cast<int>(repeats));
    if (o.json) {
      std::cout << json{{"model", r.target->model_path}, {"device", "cpu"}, {"drafters", drafter_rows_json(rows)}}.dump(
                       2)
                << "\n";
      return 0;
    }
    std::cout << fmt::format("specactor bench --all-drafters: {} on the CPU\n", r.target->model_path);
    print_drafter_rows(rows, o.prompts, o.max_new_tokens, repeats);
    return 0;
  }
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
  if (algo != sc::SpecAlgorithm::None)
    return bench_speculative(rest, o.prompts, o.max_new_tokens, static_cast<int>(o.repeats ? o.repeats : 2), o.sweep,
                             o.json, o.chart, o.concurrency);
  const std::int64_t prompt_tokens = o.prompt_tokens, decode_tokens = o.decode_tokens;
  const std::int64_t repeats = o.repeats ? o.repeats : 3;
  const bool as_json = o.json;

  const Resolved r = resolve_from_args(rest);
  const sc::ServerArgs& s = *r.target;
  spdlog::set_level(spdlog::level::from_str(s.log_level));
  if (prompt_tokens + decode_tokens > *s.context_length)
    throw sc::ConfigError("--prompt-tokens + --decode-tokens (" + std::to_string(prompt_tokens + decode_tokens) +
                          ") exceed the context length " + std::to_string(*s.context_length));
  std::int64_t deepest = prompt_tokens;
  for (const std::int64_t d : o.depths) {
    if (d + decode_tokens > *s.context_length)
      throw sc::ConfigError("--depths: " + std::to_string(d) + " + --decode-tokens " + std::to_string(decode_tokens) +
                            " exceed the context length " + std::to_string(*s.context_length));
    deepest = std::max(deepest, d);
  }
  // 1) Through the actor engine (scheduler -> target worker messages per step).
  auto engine = sa::Engine::create(sc::parse_server_args(rest));
  // A prompt of exactly prompt_tokens ids: a fixed text, repeated.
  const std::string text =
      "Speculative decoding lets a small draft propose several tokens that the large target model then verifies in "
      "one forward pass, so that every accepted token costs a fraction of a full decoding step. ";
  std::vector<std::int32_t> prompt;
  auto piece = engine->tokenizer() ? engine->tokenizer()->encode(text) : std::vector<std::int32_t>{};
  if (piece.empty()) piece = {1, 2, 3};  // no tokenizer, or one that encodes none of the text (test models)
  // The first n tokens of the repeated text (at least one).
  auto prompt_of = [&](std::int64_t n) {
    std::vector<std::int32_t> ids;
    while (static_cast<std::int64_t>(ids.size()) < std::max<std::int64_t>(n, 1))
      ids.insert(ids.end(), piece.begin(), piece.end());
    ids.resize(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)));
    return ids;
  };
  prompt = prompt_of(prompt_tokens);
  sa::GenerationRequest req;
  req.prompt_ids = prompt;
  req.max_new_tokens = decode_tokens + 1;  // the first token comes from the prefill
  req.ignore_eos = true;
  engine->generate(req);  // warm-up
  const sa::EngineMetrics before = engine->metrics();
  double decode_tps = 0;
  for (std::int64_t i = 0; i < repeats; ++i)
    decode_tps = std::max(decode_tps, engine->generate(req).metrics.decode_tokens_per_s);
  const sa::EngineMetrics after = engine->metrics();
  // Concurrent requests (continuous batching): a 32-token prompt each, decode_tokens new tokens.
  const std::vector<std::int32_t> short_prompt(prompt.begin(),
                                               prompt.begin() + std::min<std::int64_t>(32, prompt_tokens));
  std::vector<std::pair<std::int64_t, double>> concurrent;
  for (const std::int64_t n : {1, 4, 16})
    concurrent.emplace_back(n, concurrent_tokens_per_s(*engine, short_prompt, n, decode_tokens));
  // --depths: batch-1 decode through the engine after each context (the first request prefills it; the
  // repeats find it in the prefix cache and measure decode only).
  struct DepthRun {
    std::int64_t depth = 0;
    double prefill_tps = 0, decode_tps = 0, direct_decode_tps = 0, bytes_per_token = 0, ceiling_tps = 0;
  };
  std::vector<DepthRun> depth_runs;
  for (const std::int64_t d : o.depths) {
    spdlog::info("--depths: decode after {} tokens through the engine", d);
    sa::GenerationRequest dr;
    dr.prompt_ids = prompt_of(d);
    dr.max_new_tokens = decode_tokens + 1;
    dr.ignore_eos = true;
    engine->generate(dr);
    DepthRun run;
    run.depth = d;
    for (std::int64_t i = 0; i < repeats; ++i)
      run.decode_tps = std::max(run.decode_tps, engine->generate(dr).metrics.decode_tokens_per_s);
    depth_runs.push_back(run);
  }
  engine->shutdown();
  const double step_wall = after.step_wall_ms - before.step_wall_ms;
  const double step_compute = after.step_compute_ms - before.step_compute_ms;
  const double steps = static_cast<double>(after.steps - before.steps);
  const double overhead_pct = step_wall > 0 ? 100.0 * (step_wall - step_compute) / step_wall : 0.0;
  const double overhead_us = steps > 0 ? 1000.0 * (step_wall - step_compute) / steps : 0.0;

  spdlog::info("measuring the machine: memory bandwidth and peak FMA throughput");
  const auto bw = specactor::kernels::measure_memory_bandwidth();
  const double peak_gflops = specactor::kernels::measure_peak_gflops();

  // 2) The model alone, no actors, after the engine has stopped: the kernel-level reference.
  const sm::LoadedModel m = sm::load_model(s);
  if (s.threads > 0) specactor::kernels::ComputePool::instance().set_threads(static_cast<int>(s.threads));
  sm::KvCache kv(
      m.config.n_layers, m.config.n_kv_heads, m.config.head_dim, s.page_size,
      (deepest + std::max<std::int64_t>(decode_tokens, 16) + s.page_size) / s.page_size * s.page_size + s.page_size,
      true, sm::kv_type(s));
  sm::LlamaRunner runner(m.weights, static_cast<int>(s.threads), sm::cpu_precision(s));
  run_once(runner, kv, prompt, 4, s.chunked_prefill_size, m.config.vocab_size);  // warm-up
  double best_prefill = 1e30, best_decode = 1e30;
  for (std::int64_t i = 0; i < repeats; ++i) {
    const auto [p, d] = run_once(runner, kv, prompt, decode_tokens, s.chunked_prefill_size, m.config.vocab_size);
    best_prefill = std::min(best_prefill, p);
    best_decode = std::min(best_decode, d);
  }
  const double prefill_tps = prompt_tokens / best_prefill;
  const double direct_decode_tps = decode_tokens / best_decode;
  for (DepthRun& run : depth_runs) {  // prefill of each depth and decode after it, the model alone
    spdlog::info("--depths: prefill of {} tokens and decode after them, the model alone", run.depth);
    const auto ids = prompt_of(run.depth);
    double bp = 1e30, bd = 1e30;
    for (std::int64_t i = 0; i < repeats; ++i) {
      const auto [p, d] = run_once(runner, kv, ids, decode_tokens, s.chunked_prefill_size, m.config.vocab_size);
      bp = std::min(bp, p);
      bd = std::min(bd, d);
    }
    run.prefill_tps = run.depth > 0 ? static_cast<double>(ids.size()) / bp : 0.0;
    run.direct_decode_tps = decode_tokens / bd;
  }
  // c(k) at the prompt's context (256 by default).
  const auto rows_times =
      measure_forward_rows(runner, kv, prompt, {1, 2, 4, 8, 16}, static_cast<int>(std::max<std::int64_t>(repeats, 3)),
                           s.chunked_prefill_size);

  // Per decode step: every weight once, plus the KV cache read at the mean context of the run.
  std::uint64_t macs = 0;
  for (const auto& L : m.weights->layers())
    for (const auto* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.gate, &L.up, &L.down})
      macs += static_cast<std::uint64_t>(w->out_dim * w->in_dim);
  macs += static_cast<std::uint64_t>(m.weights->output().out_dim * m.weights->output().in_dim);
  const double mean_ctx = prompt_tokens + decode_tokens / 2.0;
  const double kv_bytes = static_cast<double>(kv.bytes_per_token()) * mean_ctx;
  const double bytes_per_token = static_cast<double>(m.weights->weight_bytes()) + kv_bytes;
  const double ceiling_tps = bw.read_gbps * 1e9 / bytes_per_token;
  const double achieved_gbps = bytes_per_token * decode_tps / 1e9;
  const double achieved_gflops = 2.0 * static_cast<double>(macs) * decode_tps / 1e9;
  for (DepthRun& run : depth_runs) {
    run.bytes_per_token = static_cast<double>(m.weights->weight_bytes()) +
                          static_cast<double>(kv.bytes_per_token()) *
                              (static_cast<double>(std::max<std::int64_t>(run.depth, 1)) + decode_tokens / 2.0);
    run.ceiling_tps = bw.read_gbps * 1e9 / run.bytes_per_token;
  }
  const char* path = specactor::kernels::cpu_path_name(specactor::kernels::cpu_path());
  const char* precision_path =
      s.cpu_precision == sc::CpuPrecision::Fast ? specactor::kernels::qpath_name(specactor::kernels::qpath()) : path;
  const int threads = specactor::kernels::ComputePool::instance().threads();
  const std::string path_reason = s.cpu_precision == sc::CpuPrecision::Fast
                                      ? specactor::kernels::qpath_reason()
                                      : std::string(path) + ": the exact precision's float kernels";
  const std::size_t tile_bytes = tile_copy_bytes_of(*m.weights);
  const std::string tiles = s.cpu_precision == sc::CpuPrecision::Fast ? tile_note(tile_bytes) : "";

  if (as_json) {
    json j = {{"model", s.model_path},
              {"cpu_path", precision_path},
              {"cpu_path_reason", path_reason},
              {"cpu_precision", sc::to_string(s.cpu_precision)},
              {"tile_rows", s.cpu_precision == sc::CpuPrecision::Fast ? specactor::kernels::qpath_tile_rows() : 0},
              {"tile_copy_bytes", tile_bytes},
              {"kv_cache_dtype", s.kv_cache_dtype},
              {"threads", threads},
              {"memory_read_gbps", bw.read_gbps},
              {"memory_copy_gbps", bw.copy_gbps},
              {"peak_fma_gflops", peak_gflops},
              {"prompt_tokens", prompt_tokens},
              {"prefill_tokens_per_s", prefill_tps},
              {"decode_tokens", decode_tokens},
              {"decode_tokens_per_s", decode_tps},
              {"decode_tokens_per_s_without_actors", direct_decode_tps},
              {"actor_overhead_percent_of_step", overhead_pct},
              {"actor_overhead_us_per_step", overhead_us},
              {"bytes_per_decode_token", bytes_per_token},
              {"bandwidth_ceiling_tokens_per_s", ceiling_tps},
              {"fraction_of_bandwidth_ceiling", decode_tps / ceiling_tps},
              {"decode_gflops", achieved_gflops},
              {"fraction_of_peak_fma", peak_gflops > 0 ? achieved_gflops / peak_gflops : 0.0},
              {"repeats", repeats}};
    for (const auto& [k, t] : rows_times)
      j["forward_rows"].push_back({{"rows", k}, {"ms", 1000 * t}, {"c", t / rows_times[0].second}});
    for (const auto& [n, tps] : concurrent)
      j["concurrent"].push_back({{"requests", n}, {"tokens_per_s", tps}, {"ratio_to_one", tps / concurrent[0].second}});
    for (const DepthRun& run : depth_runs)
      j["depths"].push_back({{"depth", run.depth},
                             {"prefill_tokens_per_s", run.prefill_tps},
                             {"decode_tokens_per_s", run.decode_tps},
                             {"decode_tokens_per_s_without_actors", run.direct_decode_tps},
                             {"bytes_per_decode_token", run.bytes_per_token},
                             {"bandwidth_ceiling_tokens_per_s", run.ceiling_tps},
                             {"fraction_of_bandwidth_ceiling", run.decode_tps / run.ceiling_tps}});
    std::cout << j.dump(2, ' ', false, json::error_handler_t::replace) << "\n";
    return 0;
  }
  std::cout << fmt::format(
      "specactor bench: {} ({} layers, {:.1f} MiB of weights), --cpu-precision {} (path {}{}), KV cache {}, {} "
      "threads\n",
      s.model_path, m.config.n_layers, m.weights->weight_bytes() / 1048576.0, sc::to_string(s.cpu_precision),
      precision_path, tiles, s.kv_cache_dtype, threads);
  std::cout << "path:     " << path_reason << "\n";
  std::cout << fmt::format(
      "machine:  memory read {:.1f} GB/s (copy {:.1f} GB/s, {} MiB buffer); peak FMA {:.1f} GFLOP/s\n", bw.read_gbps,
      bw.copy_gbps, bw.bytes >> 20, peak_gflops);
  std::cout << fmt::format("prefill:  {} tokens in {:.3f} s = {:.1f} tok/s (best of {})\n", prompt_tokens, best_prefill,
                           prefill_tps, repeats);
  std::cout << fmt::format(
      "decode:   batch 1, {} tokens: {:.1f} tok/s through the actor engine, {:.1f} tok/s calling the "
      "model directly (best of {})\n",
      decode_tokens, decode_tps, direct_decode_tps, repeats);
  std::cout << fmt::format(
      "actors:   {:.1f} us per step outside the target's compute = {:.2f}% of the step "
      "(messages, copies, scheduling)\n",
      overhead_us, overhead_pct);
  std::cout << fmt::format(
      "          {:.1f} MB read per token (weights + KV) -> bandwidth ceiling {:.1f} tok/s; "
      "reached {:.1f}% ({:.1f} GB/s)\n",
      bytes_per_token / 1e6, ceiling_tps, 100.0 * decode_tps / ceiling_tps, achieved_gbps);
  std::cout << fmt::format("          {:.2f} GFLOP per token -> {:.1f} GFLOP/s = {:.1f}% of the measured FMA peak\n",
                           2.0 * macs / 1e9, achieved_gflops,
                           peak_gflops > 0 ? 100.0 * achieved_gflops / peak_gflops : 0.0);
  std::string ck =
      fmt::format("c(k):     one forward over k query rows at context {}, ÷ 1 row (best of {}):", prompt_tokens,
                  std::max<std::int64_t>(repeats, 3));
  for (const auto& [k, t] : rows_times)
    ck += fmt::format("  c({})={:.2f} ({:.1f} ms)", k, t / rows_times[0].second, 1000 * t);
  std::cout << ck << "\n";
  std::string cc = fmt::format(
      "batching: aggregate decode tok/s of n concurrent requests through the engine (32-token prompts, {} new "
      "tokens each):",
      decode_tokens);
  for (const auto& [n, tps] : concurrent)
    cc += fmt::format("  n={}: {:.1f} ({:.2f}x)", n, tps, tps / concurrent[0].second);
  std::cout << cc << "\n";
  if (!depth_runs.empty())
    std::cout << fmt::format(
        "depths:   prefill of D tokens (the model alone) and batch-1 decode of {} tokens after them (through the "
        "engine; best of {}), against the bandwidth limit of the bytes each token reads (weights + KV):\n",
        decode_tokens, repeats);
  for (const DepthRun& run : depth_runs)
    std::cout << fmt::format(
        "          D={}: {}decode {:.1f} tok/s ({:.1f} without actors); {:.1f} MB per token -> "
        "limit {:.1f} tok/s; reached {:.1f}%\n",
        run.depth, run.depth > 0 ? fmt::format("prefill {:.1f} tok/s, ", run.prefill_tps) : "", run.decode_tps,
        run.direct_decode_tps, run.bytes_per_token / 1e6, run.ceiling_tps, 100.0 * run.decode_tps / run.ceiling_tps);
  return 0;
}

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

struct InspectOptions {
  std::string path, target;
  bool json = false, tensors = false;
};

void add_inspect_flags(CLI::App& cmd, InspectOptions& o) {
  cmd.add_option("model", o.path, "a GGUF model, or a draft head (GGUF file or safetensors directory)")->required();
  cmd.add_flag("--json", o.json, "print JSON");
  cmd.add_flag("--tensors", o.tensors, "also list every tensor (name, type, shape)");
  cmd.add_option("--target", o.target, "draft heads: check that the head fits this target model");
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

struct MakeHeadOptions {
  std::string target, out, kind = "EAGLE", format = "gguf";
  std::int64_t layers = 1, draft_vocab = 0;
  std::uint32_t seed = 1;
  bool own_output = false;
};

void add_make_head_flags(CLI::App& cmd, MakeHeadOptions& o) {
  cmd.add_option("--target", o.target, "the target model (GGUF or Hugging Face directory)")->required();
  cmd.add_option("--out", o.out, "output: a .gguf file, or a directory for --format safetensors")->required();
  cmd.add_option("--kind", o.kind, "EAGLE | EAGLE3 | MTP")->check(CLI::IsMember({"EAGLE", "EAGLE3", "MTP"}));
  cmd.add_option("--format", o.format, "gguf | safetensors")->check(CLI::IsMember({"gguf", "safetensors"}));
  cmd.add_option("--layers", o.layers, "MTP: next-token-prediction layers")->check(CLI::Range(1, 8));
  cmd.add_option("--draft-vocab", o.draft_vocab,
                 "EAGLE3: size of the reduced draft vocabulary (default 0 = min(vocab, 4096))")
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

struct ShrinkOptions {
  std::string model, out;
  std::int64_t layers = 0;
};

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

// One CLI11 application with a subcommand per command. generate, bench and config take server
// flags besides their own: CLI11 collects what a subcommand does not declare (allow_extras) and the
// settings table parses it (config::parse_server_args), so every server flag is declared once.
int run(int argc, char** argv) {
  CLI::App app{"specactor: speculative decoding on CAF actors", "specactor"};
  app.set_version_flag("--version", "specactor 0.1.0");
  app.require_subcommand(1, 1);
  app.footer("`specactor config --help` lists every server flag with its default.");
  const std::string server_flags = common_server_flags(
      {"model_path", "speculative_algorithm", "cpu_precision", "threads", "context_length", "max_running_requests"});
  const std::string serve_flags = common_server_flags(
      {"model_path", "host", "port", "speculative_algorithm", "cpu_precision", "threads", "max_running_requests"});

  GenerateOptions gen;
  auto* generate = app.add_subcommand("generate", "stream the continuation to stdout (logs and timings: stderr)");
  add_generate_flags(*generate, gen);
  generate->allow_extras()->footer(server_flags);

  BenchOptions bench;
  auto* benchcmd = app.add_subcommand(
      "bench",
      "speed: prefill and batch-1 decode against this machine's ceilings, c(k), concurrent requests; with "
      "--speculative-algorithm: plain vs speculative on a prompt set; --device cuda: the GPU; --all-drafters");
  add_bench_flags(*benchcmd, bench);
  benchcmd->allow_extras()->footer(server_flags);

  specactor::server::ServeOptions serve_opts;
  if (const char* key = std::getenv("SPECACTOR_API_KEY")) {
    serve_opts.api_key = key;
    serve_opts.api_key_given = true;
  }
  auto* serve = app.add_subcommand(
      "serve", "an OpenAI-compatible HTTP server (binds --host, --port; /v1/chat/completions, /metrics, ...)");
  serve->add_option("--api-key", serve_opts.api_key,
                    "require Authorization: Bearer KEY (default: $SPECACTOR_API_KEY; none when unset)");
  serve->add_option("--served-model-name", serve_opts.served_model_name,
                    "the model name clients use (default: the model file's name)");
  serve
      ->add_option("--max-queued-requests", serve_opts.max_queued_requests,
                   "requests waiting beyond the running batch; more are answered 503 (default 256)")
      ->check(integer_at_least<std::int64_t>(0));
  serve
      ->add_option("--max-body-bytes", serve_opts.max_body_bytes, "largest request body; larger is 413 (default 8 MiB)")
      ->check(integer_at_least<std::int64_t>(1024));
  serve
      ->add_option(
          "--grace-period", serve_opts.grace_seconds,
          "seconds running requests may finish after SIGINT/SIGTERM (default 30; a second signal stops at once)")
      ->check(finite_number());
  serve->add_option("--http-threads", serve_opts.http_threads,
                    "HTTP threads, fixed whatever the number of connections (default 4)");
  serve->add_option("--max-connections", serve_opts.max_connections,
                    "open connections beyond this are answered 503 + Retry-After (default 1000)");
  serve
      ->add_option("--header-timeout", serve_opts.header_timeout_seconds,
                   "seconds a connection has to send all its headers, from connecting or its previous response; "
                   "also the keep-alive idle time (default 10)")
      ->check(finite_number());
  serve
      ->add_option("--body-timeout", serve_opts.body_timeout_seconds,
                   "seconds a request has to send its whole body after its headers (default 60)")
      ->check(finite_number());
  serve->add_option("--workers", serve_opts.workers,
                    "HOST:PORT,... of `specactor worker` processes: this server is their front and routes each request "
                    "(the model file is read for its tokenizer only)");
  serve->add_option("--routing", serve_opts.routing,
                    "with --workers: cache-aware (the replica with the longest cached prefix, then the least loaded; "
                    "default), least-loaded or round-robin");
  serve
      ->add_option("--workers-wait", serve_opts.workers_wait_seconds,
                   "with --workers: seconds to wait at start for the first worker to answer (default 60)")
      ->check(finite_number());
  serve->add_option("--worker-tls-certificate", serve_opts.worker_tls_certificate,
                    "with --workers: this front's certificate (PEM) for TLS to the workers");
  serve->add_option("--worker-tls-key", serve_opts.worker_tls_key, "with --workers: its private key (PEM)");
  serve->add_option("--worker-tls-ca", serve_opts.worker_tls_ca,
                    "with --workers: the CA (PEM) the workers' certificates must chain to");
  serve->add_option("--worker-secret-file", serve_opts.worker_secret_file,
                    "with --workers, without TLS: the file with the cluster secret the workers ask for (default "
                    "~/.config/specactor/cluster-secret; 'none' for workers started with --insecure)");
  serve->allow_extras()->footer(serve_flags);

  auto* worker = app.add_subcommand(
      "worker",
      "an engine replica for a front (`specactor serve --workers`): loads the model and listens on --host (loopback "
      "unless told otherwise) and --port over CAF's network layer");
  specactor::actors::WorkerOptions worker_opts;
  worker->add_option("--host", worker_opts.host, "the address to listen on (default 127.0.0.1: this machine only)");
  std::int64_t worker_port = 31000;
  worker->add_option("--port", worker_port, "the TCP port (default 31000; 0 picks a free one, printed)");
  worker->add_option("--tls-certificate", worker_opts.tls.certificate, "this worker's certificate (PEM) for TLS");
  worker->add_option("--tls-key", worker_opts.tls.key, "its private key (PEM)");
  worker->add_option("--tls-ca", worker_opts.tls.ca, "the CA (PEM) a front's certificate must chain to");
  worker
      ->add_option("--role", worker_opts.role,
                   "target: an engine replica for a front (default); draft: draft workers for schedulers that "
                   "give --speculative-draft-worker HOST:PORT")
      ->check(CLI::IsMember({"target", "draft"}));
  worker->add_option("--secret-file", worker_opts.secret_file,
                     "without TLS: the file with the cluster secret a front must prove before it is served "
                     "(default ~/.config/specactor/cluster-secret, made with a random secret if missing)");
  worker->add_flag("--insecure,--allow-insecure", worker_opts.allow_insecure,
                   "plain TCP without TLS or the cluster secret: any process that reaches the port can send actor "
                   "messages (a network and machine you trust)");
  std::int64_t worker_max_message_mib = 256;
  worker
      ->add_option("--max-message-mib", worker_max_message_mib,
                   "a peer's message larger than this many MiB closes its connection before it is read (default "
                   "256; 1..4095)")
      ->check(integer_at_least<std::int64_t>(1));
  worker->allow_extras()->footer(server_flags);

  auto* config = app.add_subcommand(
      "config", "print the resolved target snapshot, the derived draft snapshot and their override logs");
  bool config_help = false;
  config->set_help_flag();
  config->add_flag("-h,--help", config_help, "every server flag with its description, and the defaults");
  config->allow_extras();

  InspectOptions inspect;
  add_inspect_flags(*app.add_subcommand("inspect", "print a model's hyper-parameters, or a draft head's config"),
                    inspect);
  MakeHeadOptions head;
  add_make_head_flags(
      *app.add_subcommand("make-head", "write a randomly initialised draft head shaped for a target model"), head);
  ShrinkOptions shrink;
  add_shrink_flags(
      *app.add_subcommand("shrink", "write a GGUF model with only its first N blocks (real weights, smaller file)"),
      shrink);
  auto* devices = app.add_subcommand("devices", "print what the CPU/CUDA device probe found");
  MakeDataOptions data;
  auto* make_data_cmd = app.add_subcommand(
      "make-data",
      "training data for an EAGLE-3 head: responses regenerated by the target, then its captured hidden states "
      "(resumable)");
  make_data_cmd->add_option("--prompts", data.prompts, "JSON lines: {\"prompt\"} or {\"messages\"} per line")
      ->required();
  make_data_cmd->add_option("--out", data.out, "the output folder (rerun the same command to resume)")->required();
  make_data_cmd->add_option("--max-new-tokens", data.max_new_tokens, "response length at most (default 160)")
      ->check(integer_at_least<std::int64_t>(1));
  make_data_cmd->add_option("--limit", data.limit, "use only the first N prompts (default 0 = all)")
      ->check(integer_at_least<std::int64_t>(0));
  make_data_cmd->add_option("--shard-samples", data.shard_samples, "samples per shard file (default 256)")
      ->check(integer_at_least<std::int64_t>(1));
  make_data_cmd
      ->add_option("--concurrency", data.concurrency, "requests in flight (default: --max-running-requests + 8)")
      ->check(integer_at_least<std::int64_t>(0));
  make_data_cmd
      ->add_option("--sampled-share", data.sampled_share, "share of responses sampled instead of greedy (default 0.25)")
      ->check(finite_number());
  make_data_cmd->add_option("--temperature", data.temperature, "temperature of the sampled share (default 0.8)")
      ->check(finite_number());
  make_data_cmd->add_option("--top-p", data.top_p, "top-p of the sampled share (default 0.95)")->check(finite_number());
  make_data_cmd->add_option("--aux-layers", data.aux_layers,
                            "three target layer ids to capture, e.g. 1,14,26 (default: sglang's: 1, L/2-1, L-4)");
  make_data_cmd->allow_extras()->footer(server_flags);

  if (argc < 2) {
    std::fputs(app.help().c_str(), stderr);
    return 2;
  }
  bool known = argv[1][0] == '-';
  std::string names;
  for (const CLI::App* c : app.get_subcommands([](CLI::App*) { return true; })) {
    known = known || c->get_name() == argv[1];
    names += (names.empty() ? "" : ", ") + c->get_name();
  }
  if (!known) {
    std::fprintf(stderr, "specactor: error: unknown command '%s' (commands: %s; see specactor --help)\n", argv[1],
                 names.c_str());
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    throw sc::ConfigError(e.what());
  }
  if (*generate) {
    const auto rest = server_rest(*generate);
    take_prompt(gen, generate->count("--prompt") > 0);
    return cmd_generate(gen, rest);
  }
  if (*serve) {
    if (!(serve_opts.grace_seconds >= 0)) throw sc::ConfigError("--grace-period: must be >= 0");
    serve_opts.api_key_given = serve_opts.api_key_given || serve->count("--api-key") > 0;
    serve_opts.max_connections_given = serve->count("--max-connections") > 0;
    specactor::server::check_serve_options(serve_opts);  // before the model loads
    for (const char* f : {"--routing", "--workers-wait", "--worker-tls-certificate", "--worker-tls-key",
                          "--worker-tls-ca", "--worker-secret-file"})
      if (serve->count(f) && serve_opts.workers.empty())
        throw sc::ConfigError(std::string(f) + ": applies only with --workers");
    const auto rest = server_rest(*serve);
    if (!serve_opts.workers.empty()) front_flags_only(rest);
    const sc::ServerArgs args = sc::parse_server_args(rest);
    spdlog::set_level(spdlog::level::from_str(args.log_level));
    return specactor::server::serve(args, serve_opts);
  }
  if (*worker) {
    const sc::ServerArgs args = sc::parse_server_args(server_rest(*worker));
    spdlog::set_level(spdlog::level::from_str(args.log_level));
    if (worker_port < 0 || worker_port > 65535)
      throw sc::ConfigError("--port: must be in [0, 65535] (got " + std::to_string(worker_port) +
                            "; 0 picks a free one)");
    worker_opts.port = static_cast<std::uint16_t>(worker_port);
    if (worker_max_message_mib > 4095)  // a BASP frame's length is 32 bits
      throw sc::ConfigError("--max-message-mib: must be in [1, 4095] (got " + std::to_string(worker_max_message_mib) +
                            ")");
    worker_opts.max_message_bytes = static_cast<std::size_t>(worker_max_message_mib) << 20;
    return specactor::actors::run_worker(args, worker_opts);
  }
  if (*benchcmd) return cmd_bench(bench, server_rest(*benchcmd));
  if (*config) {
    if (config_help) return print_server_flags(), 0;
    return cmd_config(server_rest(*config));
  }
  if (app.got_subcommand("inspect")) return cmd_inspect(inspect);
  if (app.got_subcommand("make-head")) return cmd_make_head(head);
  if (app.got_subcommand("shrink")) return cmd_shrink(shrink);
  if (*devices) return cmd_devices();
  if (*make_data_cmd) return make_data(data, server_rest(*make_data_cmd));
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_default_logger(spdlog::stderr_color_mt("specactor"));
  try {
    return run(argc, argv);
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
