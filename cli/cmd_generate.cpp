// cli/cmd_generate.cpp — `specactor generate`: one request through the engine, streamed to stdout.
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
  cmd.add_option("--presence-penalty", r.rules.presence_penalty,
                 "subtracted from the logit of every token the output already holds, [-2, 2] (default 0)")
      ->check(finite_number());
  cmd.add_option("--frequency-penalty", r.rules.frequency_penalty,
                 "subtracted per occurrence of a token in the output, [-2, 2] (default 0)")
      ->check(finite_number());
  cmd.add_option("--repetition-penalty", r.rules.repetition_penalty,
                 "tokens of the prompt or output: positive logits divided by it, negative multiplied, > 0 (default 1 = "
                 "off)")
      ->check(finite_number());
  cmd.add_option("--min-tokens", r.rules.min_tokens, "the end-of-generation tokens are held back until this many")
      ->check(integer_at_least<std::int64_t>(0));
  cmd.add_option("--logit-bias", o.logit_bias, "ID=BIAS: add BIAS, [-100, 100], to token ID's logit (repeatable)")
      ->expected(1)
      ->take_all()
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd.add_option("--seed", o.seed, "the request's sampling seed (default: --random-seed)")
      ->check(integer_at_least<std::int64_t>(0))
      ->each([&o](const std::string&) { o.has_seed = true; });
  cmd.add_option("--stop", r.stop, "a stop string (repeatable; not part of the output)")
      ->expected(1)
      ->take_all()
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd.add_option("--json-schema", o.json_schema, "hold the answer to this JSON Schema (its JSON text)");
  cmd.add_option("--json-schema-file", o.json_schema_file, "hold the answer to the JSON Schema in FILE");
  cmd.add_flag("--json-object", o.json_object, "the answer is a JSON object");
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

// --logit-bias ID=BIAS (repeatable; a later one for the same id wins) into the rules, ids ascending.
static void set_logit_bias(const std::vector<std::string>& flags, specactor::kernels::LogitRules& rules) {
  std::map<std::int32_t, float> bias;
  for (const std::string& b : flags) {
    const auto eq = b.find('=');
    std::size_t used = 0;
    long long id = -1;
    double v = 0;
    try {
      id = eq == std::string::npos ? -1 : std::stoll(b.substr(0, eq), &used);
      if (used != eq) id = -1;
      v = std::stod(b.substr(eq + 1), &used);
      if (used != b.size() - eq - 1) id = -1;
    } catch (const std::exception&) {
      id = -1;
    }
    if (id < 0 || id > std::numeric_limits<std::int32_t>::max() || !std::isfinite(v))
      throw sc::ConfigError("--logit-bias " + sc::printable(b, 60) + ": expected ID=BIAS (a token id, a number)");
    bias[static_cast<std::int32_t>(id)] = static_cast<float>(v);
  }
  for (const auto& [id, v] : bias) {
    rules.bias_ids.push_back(id);
    rules.bias_values.push_back(v);
  }
}

// --json-schema, --json-schema-file or --json-object (one of them) into the request's constraint; returns
// the flag a problem with it is reported under.
static std::string set_constraint(const GenerateOptions& o, specactor::sched::OutputConstraint& c) {
  using Kind = specactor::sched::OutputConstraint::Kind;
  if (!o.json_schema.empty() + !o.json_schema_file.empty() + o.json_object > 1)
    throw sc::ConfigError("--json-schema, --json-schema-file and --json-object: give one of them");
  if (o.json_object) c.kind = Kind::JsonObject;
  if (!o.json_schema.empty()) c.kind = Kind::JsonSchema, c.schema = o.json_schema;
  if (!o.json_schema_file.empty()) {
    c.kind = Kind::JsonSchema;
    c.schema = sc::read_text_file(o.json_schema_file, "--json-schema-file " + o.json_schema_file);
    return "--json-schema-file " + o.json_schema_file;
  }
  return o.json_object ? "--json-object" : "--json-schema";
}

int cmd_generate(GenerateOptions o, const std::vector<std::string>& rest) {
  sa::GenerationRequest& req = o.req;
  if (o.has_seed) req.seed = o.seed;
  if (o.max_new_given) req.max_new_tokens = o.max_new_tokens;
  set_logit_bias(o.logit_bias, req.rules);
  const std::string constraint_flag = set_constraint(o, req.constraint);
  const auto flag_of = [&](const std::string& field) {
    return field == "response_format" ? constraint_flag : cli::flag_of(field);
  };
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

}  // namespace specactor::cli
