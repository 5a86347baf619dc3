// tools/specactor.cpp — the specactor command-line launcher.
//
//   specactor config  [server flags]        resolved target + derived draft snapshots as JSON
//   specactor inspect MODEL.gguf [--json]   model hyper-parameters from the GGUF metadata
//   specactor devices                       what the device probe found (CPU / CUDA / NCCL)
//   specactor bench --model-path M [--prompt-tokens N] [--decode-tokens N] [--repeats R] [--json]
//   specactor bench --model-path M --device cuda [...]   GPU decode at batch 1/16 + every drafter
//   specactor generate --model-path M --prompt P [--chat] [--max-new-tokens N] [--temperature T]
//                      [--top-p P] [--top-k K] [--min-p P] [--seed S] [--json] [server flags]
//
// Results go to stdout; logs and errors to stderr. Bad input exits with status 2 and one message.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <condition_variable>
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
#include "config/error.hpp"
#include "config/resolve.hpp"
#include "kernels/backend.hpp"
#include "kernels/cpu/machine.hpp"
#include "kernels/cpu/matmul.hpp"
#include "kernels/cpu/pool.hpp"
#include "kernels/cpu/sampling.hpp"
#include "model/gguf.hpp"
#include "model/head.hpp"
#include "model/head_writer.hpp"
#include "model/loader.hpp"
#include "model/model_info.hpp"
#include "model/runner.hpp"
#include "model/writers.hpp"
#include "tools/bench.hpp"

namespace sc = specactor::config;
namespace sm = specactor::model;
namespace sk = specactor::kernels;
namespace sa = specactor::actors;
using json = nlohmann::json;

namespace {

constexpr const char* kUsage =
    "usage: specactor <command> [options]\n"
    "\n"
    "commands:\n"
    "  config  [server flags]       print the resolved target snapshot, the derived draft snapshot\n"
    "                               (when --speculative-algorithm is set) and their override logs\n"
    "  inspect MODEL.gguf [--json]  print the model's hyper-parameters\n"
    "  inspect HEAD [--target MODEL] a draft head's config (GGUF or safetensors dir); --target checks it fits\n"
    "  make-head --target MODEL --out PATH [--kind EAGLE|EAGLE3|MTP] [--format gguf|safetensors]\n"
    "            [--layers N] [--draft-vocab N] [--own-output] [--seed S]\n"
    "                               write a randomly initialised head shaped for MODEL\n"
    "  devices                      print what the CPU/CUDA device probe found\n"
    "  shrink MODEL.gguf --layers N --out FILE.gguf\n"
    "                               the model with only its first N blocks (real weights, smaller)\n"
    "  generate --model-path M --prompt TEXT [--chat] [--max-new-tokens N] [--temperature T]\n"
    "           [--top-p P] [--top-k K] [--min-p P] [--seed S] [--json] [server flags]\n"
    "                               stream the continuation to stdout (logs and timings: stderr)\n"
    "  bench --model-path M [--prompt-tokens 256] [--decode-tokens 128] [--repeats 3] [--json]\n"
    "                               prefill and batch-1 decode speed against the measured memory\n"
    "                               bandwidth and FMA ceilings of this machine\n"
    "  bench --model-path M --speculative-algorithm A [--prompts tools/bench_prompts.jsonl]\n"
    "        [--max-new-tokens 64] [--repeats 2] [--sweep] [--chart FILE.svg] [--json] [server flags]\n"
    "                               plain vs speculative decoding side by side on a prompt set\n"
    "  bench --model-path M --device cuda [--prompt-tokens 256] [--decode-tokens 128] [--repeats 3]\n"
    "        [--prompts FILE] [--max-new-tokens 64] [--json] [server flags]\n"
    "  bench --model-path M --all-drafters [--prompts FILE] [--max-new-tokens 64] [--repeats 2] [--json]\n"
    "                               plain vs every drafter (random heads for EAGLE/EAGLE3/MTP)\n"
    "                               GPU: decode at batch 1 and 16 against the device bandwidth, then\n"
    "                               plain vs every drafter\n"
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

using specactor::actors::runtime_facts;

// Takes the command's own flags out of argv (spec: flag -> takes a value); the rest are server flags.
std::vector<std::string> take_tool_flags(const std::vector<std::string>& argv, const std::map<std::string, bool>& spec,
                                         std::map<std::string, std::string>& out) {
  std::vector<std::string> rest;
  for (std::size_t i = 0; i < argv.size(); ++i) {
    std::string flag = argv[i], value;
    bool inline_value = false;
    if (auto eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      inline_value = true;
    }
    auto it = spec.find(flag);
    if (it == spec.end()) {
      rest.push_back(argv[i]);
      continue;
    }
    if (it->second && !inline_value) {
      if (i + 1 >= argv.size()) throw sc::ConfigError(flag + ": expected a value");
      value = argv[++i];
    } else if (!it->second && !inline_value) {
      value = "true";
    }
    out[flag] = value;
  }
  return rest;
}

template <class T>
T tool_value(const std::map<std::string, std::string>& f, const std::string& flag, T dflt) {
  auto it = f.find(flag);
  if (it == f.end()) return dflt;
  const std::string& v = it->second;
  try {
    std::size_t used = 0;
    T out;
    if constexpr (std::is_same_v<T, bool>) {
      if (v == "true" || v == "1") return true;
      if (v == "false" || v == "0") return false;
      throw std::invalid_argument(v);
    } else if constexpr (std::is_floating_point_v<T>) {
      const double d = std::stod(v, &used);
      if (used == v.size() && !std::isfinite(static_cast<T>(d)))
        throw sc::ConfigError(flag + ": '" + v + "' is not a finite number");
      out = static_cast<T>(d);
    } else {
      const long long x = std::stoll(v, &used);
      if (used == v.size() &&
          (x < static_cast<long long>(std::numeric_limits<T>::min()) ||
           static_cast<unsigned long long>(x) > static_cast<unsigned long long>(std::numeric_limits<T>::max())))
        throw sc::ConfigError(flag + ": " + v + " is out of range [" + std::to_string(std::numeric_limits<T>::min()) +
                              ", " + std::to_string(std::numeric_limits<T>::max()) + "]");
      out = static_cast<T>(x);
    }
    if (used != v.size()) throw std::invalid_argument(v);
    return out;
  } catch (const sc::ConfigError&) {
    throw;
  } catch (const std::exception&) {
    throw sc::ConfigError(flag + ": '" + v + "' is not a valid " +
                          (std::is_same_v<T, bool>       ? "boolean"
                           : std::is_floating_point_v<T> ? "number"
                                                         : "integer"));
  }
}

// Parses server flags, reads the model's metadata and resolves the target snapshot.
struct Resolved {
  sc::Snapshot target;
  sm::ModelInfo info;
};
Resolved resolve_from_args(const std::vector<std::string>& args) {
  const sc::Snapshot user = sc::freeze(sc::parse_server_args(args));
  if (user->model_path.empty())
    throw sc::ConfigError(
        "--model-path is required (after tools/setup the default model is "
        "models/SmolLM2-135M-Instruct.Q4_1.gguf)");
  sm::ModelInfo info = sm::read_any_model_info(*user);
  return {sc::resolve_target(user, info.facts(), runtime_facts()), std::move(info)};
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int cmd_generate(const std::vector<std::string>& argv) {
  std::map<std::string, std::string> f;
  const auto rest = take_tool_flags(argv,
                                    {{"--prompt", true},
                                     {"--system", true},
                                     {"--chat", false},
                                     {"--max-new-tokens", true},
                                     {"--temperature", true},
                                     {"--top-p", true},
                                     {"--top-k", true},
                                     {"--min-p", true},
                                     {"--seed", true},
                                     {"--json", false},
                                     {"--ignore-eos", false},
                                     {"--stop", true}},
                                    f);
  if (!f.count("--prompt")) throw sc::ConfigError("--prompt is required");
  sa::GenerationRequest req;
  req.prompt = f.at("--prompt");
  req.chat = tool_value<bool>(f, "--chat", false);
  if (f.count("--system")) req.system = f.at("--system");
  if (f.count("--stop")) req.stop = {f.at("--stop")};
  req.max_new_tokens = tool_value<std::int64_t>(f, "--max-new-tokens", 128);
  if (req.max_new_tokens < 1)
    throw sc::ConfigError("--max-new-tokens: must be >= 1 (got " + std::to_string(req.max_new_tokens) + ")");
  auto& sp = req.sampling;
  sp.temperature = tool_value<float>(f, "--temperature", 0.0f);
  sp.top_p = tool_value<float>(f, "--top-p", 1.0f);
  sp.top_k = tool_value<std::int32_t>(f, "--top-k", 0);
  sp.min_p = tool_value<float>(f, "--min-p", 0.0f);
  if (sp.temperature < 0) throw sc::ConfigError("--temperature: must be >= 0");
  if (!(sp.top_p > 0 && sp.top_p <= 1)) throw sc::ConfigError("--top-p: must be in (0, 1]");
  if (sp.top_k < 0) throw sc::ConfigError("--top-k: must be >= 0");
  if (!(sp.min_p >= 0 && sp.min_p < 1)) throw sc::ConfigError("--min-p: must be in [0, 1)");
  if (f.count("--seed")) req.seed = static_cast<std::uint64_t>(tool_value<std::int64_t>(f, "--seed", 0));
  req.ignore_eos = tool_value<bool>(f, "--ignore-eos", false);
  const bool as_json = tool_value<bool>(f, "--json", false);

  const sc::ServerArgs args = sc::parse_server_args(rest);
  spdlog::set_level(spdlog::level::from_str(args.log_level));
  const auto t_load = std::chrono::steady_clock::now();
  auto engine = sa::Engine::create(args);
  const double load_s = seconds_since(t_load);
  if (!engine->tokenizer()) throw sc::ConfigError("--skip-tokenizer-init: generate needs a tokenizer for --prompt");
  spdlog::info("loaded {} in {:.2f} s through the actor engine ({}); cpu path {}", args.model_path, load_s,
               std::string(sc::to_string(engine->target_snapshot()->speculative_algorithm)),
               specactor::kernels::cpu_path_name(specactor::kernels::cpu_path()));
  if (req.chat && sm::ChatTemplate::detect(engine->tokenizer()->chat_template()).format == sm::ChatFormat::Plain)
    spdlog::warn("the model's chat template is not recognised (supported: ChatML, Llama-3); sending plain text");

  std::promise<sa::TokenEvent> last;
  auto done = last.get_future();
  std::vector<std::int32_t> tokens;
  std::string text;
  const auto prompt_ids = engine->tokenize(req);
  engine->submit(req, [&](const sa::TokenEvent& ev) {
    tokens.insert(tokens.end(), ev.tokens.begin(), ev.tokens.end());
    text += ev.text;
    if (!as_json && !ev.text.empty()) {
      std::fwrite(ev.text.data(), 1, ev.text.size(), stdout);
      std::fflush(stdout);
    }
    if (ev.finished) last.set_value(ev);
  });
  const sa::TokenEvent end = done.get();
  const sa::EngineMetrics em = engine->metrics();
  engine->shutdown();
  if (end.finish_reason == "error") {
    if (end.invalid_request) throw sc::ConfigError(end.error);
    throw std::runtime_error(end.error);
  }
  const auto& m = end.metrics;
  if (!as_json) std::fputc('\n', stdout);
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
                {"fallback_steps", m.fallbacks}}}};
    std::cout << j.dump(2) << "\n";
  }
  return 0;
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

int cmd_bench(const std::vector<std::string>& argv) {
  std::map<std::string, std::string> f;
  const auto rest = take_tool_flags(argv,
                                    {{"--prompt-tokens", true},
                                     {"--decode-tokens", true},
                                     {"--repeats", true},
                                     {"--json", false},
                                     {"--prompts", true},
                                     {"--sweep", false},
                                     {"--chart", true},
                                     {"--max-new-tokens", true},
                                     {"--all-drafters", false}},
                                    f);
  const sc::ServerArgs parsed = sc::parse_server_args(rest);
  if (tool_value<bool>(f, "--all-drafters", false) && parsed.device != sc::Device::Cuda) {
    // Plain vs every drafter on this device (what `bench --device cuda` ends with).
    if (parsed.speculative_algorithm != sc::SpecAlgorithm::None)
      throw sc::ConfigError("--all-drafters: picks the algorithms itself; drop --speculative-algorithm");
    const auto max_new = tool_value<std::int64_t>(f, "--max-new-tokens", 64);
    const auto repeats = tool_value<std::int64_t>(f, "--repeats", 2);
    if (max_new < 2) throw sc::ConfigError("--max-new-tokens: must be >= 2");
    if (repeats < 1) throw sc::ConfigError("--repeats: must be >= 1");
    const std::string prompts = f.count("--prompts") ? f.at("--prompts") : "tools/bench_prompts.jsonl";
    const Resolved r = resolve_from_args(rest);
    spdlog::set_level(spdlog::level::from_str(r.target->log_level));
    const auto rows = bench_every_drafter(rest, r.info, r.info.num_layers, prompts, max_new, static_cast<int>(repeats));
    if (tool_value<bool>(f, "--json", false)) {
      std::cout << json{{"model", r.target->model_path}, {"device", "cpu"}, {"drafters", drafter_rows_json(rows)}}.dump(
                       2)
                << "\n";
      return 0;
    }
    std::cout << fmt::format("specactor bench --all-drafters: {} on the CPU\n", r.target->model_path);
    print_drafter_rows(rows, prompts, max_new, repeats);
    return 0;
  }
  if (parsed.device == sc::Device::Cuda && parsed.speculative_algorithm == sc::SpecAlgorithm::None) {
    CudaBenchOptions o;
    o.prompt_tokens = tool_value<std::int64_t>(f, "--prompt-tokens", 256);
    o.decode_tokens = tool_value<std::int64_t>(f, "--decode-tokens", 128);
    o.repeats = tool_value<std::int64_t>(f, "--repeats", 3);
    o.max_new_tokens = tool_value<std::int64_t>(f, "--max-new-tokens", 64);
    if (f.count("--prompts")) o.prompts_path = f.at("--prompts");
    o.json = tool_value<bool>(f, "--json", false);
    if (o.prompt_tokens < 1) throw sc::ConfigError("--prompt-tokens: must be >= 1");
    if (o.decode_tokens < 1) throw sc::ConfigError("--decode-tokens: must be >= 1");
    if (o.repeats < 1) throw sc::ConfigError("--repeats: must be >= 1");
    if (o.max_new_tokens < 2) throw sc::ConfigError("--max-new-tokens: must be >= 2");
    return bench_cuda(rest, o);
  }
  if (parsed.speculative_algorithm != sc::SpecAlgorithm::None) {
    const auto max_new = tool_value<std::int64_t>(f, "--max-new-tokens", 64);
    if (max_new < 2) throw sc::ConfigError("--max-new-tokens: must be >= 2");
    const auto repeats = tool_value<std::int64_t>(f, "--repeats", 2);
    if (repeats < 1) throw sc::ConfigError("--repeats: must be >= 1");
    return bench_speculative(rest, f.count("--prompts") ? f.at("--prompts") : "tools/bench_prompts.jsonl", max_new,
                             static_cast<int>(repeats), tool_value<bool>(f, "--sweep", false),
                             tool_value<bool>(f, "--json", false), f.count("--chart") ? f.at("--chart") : "");
  }
  const auto prompt_tokens = tool_value<std::int64_t>(f, "--prompt-tokens", 256);
  const auto decode_tokens = tool_value<std::int64_t>(f, "--decode-tokens", 128);
  const auto repeats = tool_value<std::int64_t>(f, "--repeats", 3);
  const bool as_json = tool_value<bool>(f, "--json", false);
  if (prompt_tokens < 1) throw sc::ConfigError("--prompt-tokens: must be >= 1");
  if (decode_tokens < 1) throw sc::ConfigError("--decode-tokens: must be >= 1");
  if (repeats < 1) throw sc::ConfigError("--repeats: must be >= 1");

  const Resolved r = resolve_from_args(rest);
  const sc::ServerArgs& s = *r.target;
  spdlog::set_level(spdlog::level::from_str(s.log_level));
  if (prompt_tokens + decode_tokens > *s.context_length)
    throw sc::ConfigError("--prompt-tokens + --decode-tokens (" + std::to_string(prompt_tokens + decode_tokens) +
                          ") exceed the context length " + std::to_string(*s.context_length));
  // 1) Through the actor engine (scheduler -> target worker messages per step).
  auto engine = sa::Engine::create(sc::parse_server_args(rest));
  // A prompt of exactly prompt_tokens ids: a fixed text, repeated.
  const std::string text =
      "Speculative decoding lets a small draft propose several tokens that the large target model then verifies in "
      "one forward pass, so that every accepted token costs a fraction of a full decoding step. ";
  std::vector<std::int32_t> prompt;
  const auto piece = engine->tokenizer() ? engine->tokenizer()->encode(text) : std::vector<std::int32_t>{1, 2, 3};
  while (static_cast<std::int64_t>(prompt.size()) < prompt_tokens)
    prompt.insert(prompt.end(), piece.begin(), piece.end());
  prompt.resize(static_cast<std::size_t>(prompt_tokens));
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
  sm::KvCache kv(m.config.n_layers, m.config.n_kv_heads, m.config.head_dim, s.page_size,
                 (prompt_tokens + std::max<std::int64_t>(decode_tokens, 16) + s.page_size) / s.page_size * s.page_size +
                     s.page_size);
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
  const double kv_bytes = 2.0 * m.config.n_layers * m.config.kv_dim() * sizeof(float) * mean_ctx;
  const double bytes_per_token = static_cast<double>(m.weights->weight_bytes()) + kv_bytes;
  const double ceiling_tps = bw.read_gbps * 1e9 / bytes_per_token;
  const double achieved_gbps = bytes_per_token * decode_tps / 1e9;
  const double achieved_gflops = 2.0 * static_cast<double>(macs) * decode_tps / 1e9;
  const char* path = specactor::kernels::cpu_path_name(specactor::kernels::cpu_path());
  const char* precision_path =
      s.cpu_precision == sc::CpuPrecision::Fast ? specactor::kernels::qpath_name(specactor::kernels::qpath()) : path;
  const int threads = specactor::kernels::ComputePool::instance().threads();

  if (as_json) {
    json j = {{"model", s.model_path},
              {"cpu_path", precision_path},
              {"cpu_precision", sc::to_string(s.cpu_precision)},
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
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << fmt::format(
      "specactor bench: {} ({} layers, {:.1f} MiB of weights), --cpu-precision {} (path {}), {} threads\n",
      s.model_path, m.config.n_layers, m.weights->weight_bytes() / 1048576.0, sc::to_string(s.cpu_precision),
      precision_path, threads);
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
  return 0;
}

int cmd_config(const std::vector<std::string>& args) {
  for (const auto& a : args)
    if (a == "--help" || a == "-h") return print_server_flags(), 0;
  const sc::ServerArgs parsed = sc::parse_server_args(args);
  const sc::Snapshot user = sc::freeze(parsed);
  if (user->model_path.empty())
    throw sc::ConfigError(
        "--model-path is required (after tools/setup the default model is "
        "models/SmolLM2-135M-Instruct.Q4_1.gguf)");
  const sm::ModelInfo info = sm::read_any_model_info(*user);
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
  std::string target;
  app.add_option("--target", target, "draft heads: check that the head fits this target model");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  const bool hf = std::filesystem::is_directory(path) || path.ends_with(".safetensors");
  std::shared_ptr<const sm::GgufFile> gguf;
  if (!hf) gguf = sm::GgufFile::open(path);
  const std::string arch =
      gguf && gguf->has("general.architecture") ? std::string(gguf->get_string("general.architecture")) : "";
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
    std::cout << j.dump(2) << "\n";
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

int cmd_make_head(int argc, char** argv) {
  CLI::App app{"write a randomly initialised draft head shaped for a target model", "specactor make-head"};
  std::string target, out, kind = "EAGLE", format = "gguf";
  std::int64_t layers = 1, draft_vocab = 0;
  std::uint32_t seed = 1;
  bool own_output = false;
  app.add_option("--target", target, "the target model (GGUF or Hugging Face directory)")->required();
  app.add_option("--out", out, "output: a .gguf file, or a directory for --format safetensors")->required();
  app.add_option("--kind", kind, "EAGLE | EAGLE3 | MTP")->check(CLI::IsMember({"EAGLE", "EAGLE3", "MTP"}));
  app.add_option("--format", format, "gguf | safetensors")->check(CLI::IsMember({"gguf", "safetensors"}));
  app.add_option("--layers", layers, "MTP: next-token-prediction layers")->check(CLI::Range(1, 8));
  app.add_option("--draft-vocab", draft_vocab,
                 "EAGLE3: size of the reduced draft vocabulary (default min(vocab, 4096))");
  app.add_flag("--own-output", own_output, "EAGLE/MTP: write an own output head instead of using the target's");
  app.add_option("--seed", seed, "random seed");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
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

int cmd_shrink(int argc, char** argv) {
  CLI::App app{"write a GGUF model with only its first N transformer blocks (real weights, smaller file)",
               "specactor shrink"};
  std::string model, out;
  std::int64_t layers = 0;
  app.add_option("model", model, "the GGUF model")->required();
  app.add_option("--layers", layers, "blocks to keep")->required()->check(CLI::PositiveNumber);
  app.add_option("--out", out, "output .gguf file")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  const auto file = sm::GgufFile::open(model);
  sm::write_first_layers(*file, layers, out);
  std::cerr << fmt::format("wrote the first {} block(s) of {} to {} ({:.1f} MiB)\n", layers, model, out,
                           static_cast<double>(std::filesystem::file_size(out)) / 1048576.0);
  return 0;
}

int cmd_devices() {
  const sk::DeviceProbe& p = sk::probe_devices();
  json j = {{"cuda_compiled", p.cuda_compiled},
            {"cuda_usable", p.cuda_usable},
            {"device_count", p.device_count},
            {"device_name", p.device_name},
            {"reason", p.reason},
            {"cuda_runtime_version", p.cuda_runtime_version},
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
    if (cmd == "make-head") return cmd_make_head(argc - 1, argv + 1);
    if (cmd == "shrink") return cmd_shrink(argc - 1, argv + 1);
    if (cmd == "generate") return cmd_generate(std::vector<std::string>(argv + 2, argv + argc));
    if (cmd == "bench") return cmd_bench(std::vector<std::string>(argv + 2, argv + argc));
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
