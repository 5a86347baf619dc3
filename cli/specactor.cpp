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

using namespace specactor::cli;

namespace {

// `serve`'s own flags (the rest of its command line are server flags).
CLI::App* add_serve_command(CLI::App& app, specactor::server::ServeOptions& o, const std::string& footer) {
  if (const char* key = std::getenv("SPECACTOR_API_KEY")) {
    o.api_key = key;
    o.api_key_given = true;
  }
  CLI::App* serve = app.add_subcommand(
      "serve", "an OpenAI-compatible HTTP server (binds --host, --port; /v1/chat/completions, /metrics, ...)");
  serve->add_option("--api-key", o.api_key,
                    "require Authorization: Bearer KEY (default: $SPECACTOR_API_KEY; none when unset)");
  serve->add_option("--served-model-name", o.served_model_name,
                    "the model name clients use (default: the model file's name)");
  serve
      ->add_option("--max-queued-requests", o.max_queued_requests,
                   "requests waiting beyond the running batch; more are answered 503 (default 256)")
      ->check(integer_at_least<std::int64_t>(0));
  serve->add_option("--max-body-bytes", o.max_body_bytes, "largest request body; larger is 413 (default 8 MiB)")
      ->check(integer_at_least<std::int64_t>(1024));
  serve
      ->add_option(
          "--grace-period", o.grace_seconds,
          "seconds running requests may finish after SIGINT/SIGTERM (default 30; a second signal stops at once)")
      ->check(finite_number());
  serve->add_option("--http-threads", o.http_threads,
                    "HTTP threads, fixed whatever the number of connections (default 4)");
  serve->add_option("--max-connections", o.max_connections,
                    "open connections beyond this are answered 503 + Retry-After (default 1000)");
  serve
      ->add_option("--header-timeout", o.header_timeout_seconds,
                   "seconds a connection has to send all its headers, from connecting or its previous response; "
                   "also the keep-alive idle time (default 10)")
      ->check(finite_number());
  serve
      ->add_option("--body-timeout", o.body_timeout_seconds,
                   "seconds a request has to send its whole body after its headers (default 60)")
      ->check(finite_number());
  serve->add_option("--workers", o.workers,
                    "HOST:PORT,... of `specactor worker` processes: this server is their front and routes each request "
                    "(the model file is read for its tokenizer only)");
  serve->add_option("--routing", o.routing,
                    "with --workers: cache-aware (the replica with the longest cached prefix, then the least loaded; "
                    "default), least-loaded or round-robin");
  serve
      ->add_option("--workers-wait", o.workers_wait_seconds,
                   "with --workers: seconds to wait at start for the first worker to answer (default 60)")
      ->check(finite_number());
  serve->add_option("--worker-tls-certificate", o.worker_tls_certificate,
                    "with --workers: this front's certificate (PEM) for TLS to the workers");
  serve->add_option("--worker-tls-key", o.worker_tls_key, "with --workers: its private key (PEM)");
  serve->add_option("--worker-tls-ca", o.worker_tls_ca,
                    "with --workers: the CA (PEM) the workers' certificates must chain to");
  serve->add_option("--worker-secret-file", o.worker_secret_file,
                    "with --workers, without TLS: the file with the cluster secret the workers ask for (default "
                    "~/.config/specactor/cluster-secret; 'none' for workers started with --insecure)");
  serve->allow_extras()->footer(footer);
  return serve;
}

// `worker`: an engine replica (or draft workers) for other processes.
struct WorkerCommand {
  CLI::App* cmd = nullptr;
  specactor::actors::WorkerOptions opts;
  std::int64_t port = 31000, max_message_mib = 256;
};

void add_worker_command(CLI::App& app, WorkerCommand& w, const std::string& footer) {
  w.cmd = app.add_subcommand(
      "worker",
      "an engine replica for a front (`specactor serve --workers`): loads the model and listens on --host (loopback "
      "unless told otherwise) and --port over CAF's network layer");
  w.cmd->add_option("--host", w.opts.host, "the address to listen on (default 127.0.0.1: this machine only)");
  w.cmd->add_option("--port", w.port, "the TCP port (default 31000; 0 picks a free one, printed)");
  w.cmd->add_option("--tls-certificate", w.opts.tls.certificate, "this worker's certificate (PEM) for TLS");
  w.cmd->add_option("--tls-key", w.opts.tls.key, "its private key (PEM)");
  w.cmd->add_option("--tls-ca", w.opts.tls.ca, "the CA (PEM) a front's certificate must chain to");
  w.cmd
      ->add_option("--role", w.opts.role,
                   "target: an engine replica for a front (default); draft: draft workers for schedulers that "
                   "give --speculative-draft-worker HOST:PORT")
      ->check(CLI::IsMember({"target", "draft"}));
  w.cmd->add_option("--secret-file", w.opts.secret_file,
                    "without TLS: the file with the cluster secret a front must prove before it is served "
                    "(default ~/.config/specactor/cluster-secret, made with a random secret if missing)");
  w.cmd->add_flag("--insecure,--allow-insecure", w.opts.allow_insecure,
                  "plain TCP without TLS or the cluster secret: any process that reaches the port can send actor "
                  "messages (a network and machine you trust)");
  w.cmd
      ->add_option("--max-message-mib", w.max_message_mib,
                   "a peer's message larger than this many MiB closes its connection before it is read (default "
                   "256; 1..4095)")
      ->check(integer_at_least<std::int64_t>(1));
  w.cmd->allow_extras()->footer(footer);
}

// `make-data`'s own flags.
CLI::App* add_make_data_command(CLI::App& app, MakeDataOptions& data, const std::string& footer) {
  CLI::App* make_data_cmd = app.add_subcommand(
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
  make_data_cmd->allow_extras()->footer(footer);
  return make_data_cmd;
}

int run_serve(const CLI::App& serve, specactor::server::ServeOptions o) {
  if (!(o.grace_seconds >= 0)) throw sc::ConfigError("--grace-period: must be >= 0");
  o.api_key_given = o.api_key_given || serve.count("--api-key") > 0;
  o.max_connections_given = serve.count("--max-connections") > 0;
  specactor::server::check_serve_options(o);  // before the model loads
  for (const char* f : {"--routing", "--workers-wait", "--worker-tls-certificate", "--worker-tls-key",
                        "--worker-tls-ca", "--worker-secret-file"})
    if (serve.count(f) && o.workers.empty()) throw sc::ConfigError(std::string(f) + ": applies only with --workers");
  const auto rest = server_rest(serve);
  if (!o.workers.empty()) front_flags_only(rest);
  const sc::ServerArgs args = sc::parse_server_args(rest);
  spdlog::set_level(spdlog::level::from_str(args.log_level));
  return specactor::server::serve(args, o);
}

int run_worker_command(WorkerCommand& w) {
  const sc::ServerArgs args = sc::parse_server_args(server_rest(*w.cmd));
  spdlog::set_level(spdlog::level::from_str(args.log_level));
  if (w.port < 0 || w.port > 65535)
    throw sc::ConfigError("--port: must be in [0, 65535] (got " + std::to_string(w.port) + "; 0 picks a free one)");
  w.opts.port = static_cast<std::uint16_t>(w.port);
  if (w.max_message_mib > 4095)  // a BASP frame's length is 32 bits
    throw sc::ConfigError("--max-message-mib: must be in [1, 4095] (got " + std::to_string(w.max_message_mib) + ")");
  w.opts.max_message_bytes = static_cast<std::size_t>(w.max_message_mib) << 20;
  return specactor::actors::run_worker(args, w.opts);
}

// The first argument names a command (or is a flag of the application); else the message and false.
bool known_command(CLI::App& app, int argc, char** argv) {
  if (argc < 2) {
    std::fputs(app.help().c_str(), stderr);
    return false;
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
    return false;
  }
  return true;
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
  CLI::App* serve = add_serve_command(app, serve_opts, serve_flags);

  WorkerCommand worker;
  add_worker_command(app, worker, server_flags);

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
  CLI::App* make_data_cmd = add_make_data_command(app, data, server_flags);

  if (!known_command(app, argc, argv)) return 2;
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
  if (*serve) return run_serve(*serve, serve_opts);
  if (*worker.cmd) return run_worker_command(worker);
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
