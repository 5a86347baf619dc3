// cli/bench_gpu.cpp — `specactor bench --device cuda`: the device's measured copy bandwidth, decode
// tokens/s of the CUDA forward at batch 1 and 16 (the model called directly, prompt prefilled first)
// with the share of that bandwidth reached, then plain vs every drafter through the engine on the
// shipped prompts (the EAGLE3 head and block drafters shipped for the model where they exist, random
// heads otherwise: a random head's speedup measures overhead, not a trained head's acceptance).
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "actors/engine.hpp"
#include "cli/bench.hpp"
#include "config/error.hpp"
#include "config/resolve.hpp"
#include "kernels/backend.hpp"
#include "kernels/cpu/sampling.hpp"
#include "model/loader.hpp"
#include "model/runner.hpp"
#ifdef SPECACTOR_HAVE_CUDA
#include "kernels/cuda/device_model.hpp"
#endif

namespace sc = specactor::config;
namespace sm = specactor::model;
using json = nlohmann::json;

#ifdef SPECACTOR_HAVE_CUDA  // what only a CUDA build measures
namespace {

struct BatchResult {
  std::int64_t batch = 0;
  double tokens_per_s = 0, bytes_per_step = 0, achieved_gbps = 0;
};

// Prefills `batch` copies of the prompt, then decodes `decode` greedy steps of all of them together;
// returns the decode rate (best of `repeats`).
BatchResult decode_batch(sm::ForwardRunner& runner, sm::KvCache& kv, const sm::LlamaConfig& c,
                         std::uint64_t weight_bytes, const std::vector<std::int32_t>& prompt, std::int64_t batch,
                         std::int64_t decode, std::int64_t chunk, std::int64_t repeats) {
  BatchResult r;
  r.batch = batch;
  double best = 1e30;
  for (std::int64_t rep = 0; rep < repeats + 1; ++rep) {  // the first round warms up (graphs are captured)
    std::vector<sm::KvCache::Seq> seqs(static_cast<std::size_t>(batch));
    std::vector<std::int32_t> next(static_cast<std::size_t>(batch));
    sm::ForwardResult out;
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::size_t at = 0; at < prompt.size();) {
        const std::size_t n = std::min<std::size_t>(static_cast<std::size_t>(chunk), prompt.size() - at);
        std::vector<sm::ForwardSeq> fs(1);
        fs[0].kv = &seqs[static_cast<std::size_t>(b)];
        fs[0].tokens.assign(prompt.begin() + static_cast<long>(at), prompt.begin() + static_cast<long>(at + n));
        if (at + n == prompt.size()) fs[0].logit_rows = {static_cast<std::int32_t>(n - 1)};
        runner.forward(fs, kv, out);
        at += n;
        if (at == prompt.size())
          next[static_cast<std::size_t>(b)] = specactor::kernels::argmax(out.logits.data(), c.vocab_size);
      }
    const auto t0 = std::chrono::steady_clock::now();
    for (std::int64_t step = 0; step < decode; ++step) {
      std::vector<sm::ForwardSeq> fs(static_cast<std::size_t>(batch));
      for (std::int64_t b = 0; b < batch; ++b) {
        fs[static_cast<std::size_t>(b)].kv = &seqs[static_cast<std::size_t>(b)];
        fs[static_cast<std::size_t>(b)].tokens = {next[static_cast<std::size_t>(b)]};
        fs[static_cast<std::size_t>(b)].logit_rows = {0};
      }
      runner.forward(fs, kv, out);
      for (std::int64_t b = 0; b < batch; ++b)
        next[static_cast<std::size_t>(b)] =
            specactor::kernels::argmax(out.logits.data() + b * c.vocab_size, c.vocab_size);
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) best = std::min(best, secs);
    for (auto& s : seqs) kv.release(s);
  }
  r.tokens_per_s = static_cast<double>(batch * decode) / best;
  // Per step: every weight once, every sequence's K and V at the mean context of the run.
  const double mean_ctx = static_cast<double>(prompt.size()) + decode / 2.0;
  r.bytes_per_step = static_cast<double>(weight_bytes) +
                     static_cast<double>(batch) * 2.0 * c.n_layers * c.kv_dim() * sizeof(float) * mean_ctx;
  r.achieved_gbps = r.bytes_per_step * (static_cast<double>(decode) / best) / 1e9;
  return r;
}

}  // namespace
#endif

int bench_cuda(const std::vector<std::string>& server_args, const CudaBenchOptions& o) {
#ifndef SPECACTOR_HAVE_CUDA
  (void)server_args;
  (void)o;
  throw sc::ConfigError("--device cuda: this build has no CUDA backend (configured without nvcc)");
#else
  const auto [s, info] = sm::resolve_target(sc::parse_server_args(server_args));
  spdlog::set_level(spdlog::level::from_str(s->log_level));
  const auto& probe = specactor::kernels::probe_devices();
  spdlog::info("bench: measuring the device's copy bandwidth");
  const double bw = specactor::kernels::cuda::measure_device_bandwidth_gbps(0);

  const sm::LoadedModel m = sm::load_model(*s);
  const auto& c = m.config;
  const std::int64_t per_seq = o.prompt_tokens + o.decode_tokens + 2 * s->page_size;
  sm::KvCache kv(c.n_layers, c.n_kv_heads, c.head_dim, s->page_size, 16 * per_seq, false);
  auto runner = sm::make_runner(m.weights, *s, 0, 0, kv);
  std::vector<std::int32_t> prompt;
  const std::vector<std::int32_t> piece =
      m.tokenizer
          ? m.tokenizer->encode("Speculative decoding lets a small draft propose tokens that the target verifies. ")
          : std::vector<std::int32_t>{1, 2, 3};
  while (static_cast<std::int64_t>(prompt.size()) < o.prompt_tokens)
    prompt.insert(prompt.end(), piece.begin(), piece.end());
  prompt.resize(static_cast<std::size_t>(o.prompt_tokens));
  std::vector<BatchResult> batches;
  for (std::int64_t b : {1, 16}) {
    spdlog::info("bench: CUDA decode at batch {}", b);
    batches.push_back(decode_batch(*runner, kv, c, m.weights->weight_bytes(), prompt, b, o.decode_tokens,
                                   s->chunked_prefill_size, o.repeats));
  }
  runner.reset();  // the engines below take the device memory

  // Plain vs each drafter (shipped ones where the model has them, random heads otherwise).
  const auto rows = bench_every_drafter(server_args, s->model_path, m.info, c.n_layers, o.prompts_path,
                                        o.max_new_tokens, static_cast<int>(o.repeats));

  if (o.json) {
    json j = {{"model", s->model_path},
              {"device", probe.device_name},
              {"device_copy_gbps", bw},
              {"weight_bytes", m.weights->weight_bytes()},
              {"prompt_tokens", o.prompt_tokens},
              {"decode_tokens", o.decode_tokens},
              {"repeats", o.repeats},
              {"cuda_graphs", !s->disable_cuda_graph}};
    for (const auto& b : batches)
      j["decode"].push_back({{"batch", b.batch},
                             {"tokens_per_s", b.tokens_per_s},
                             {"bytes_per_step", b.bytes_per_step},
                             {"achieved_gbps", b.achieved_gbps},
                             {"fraction_of_device_bandwidth", b.achieved_gbps / bw}});
    j["drafters"] = drafter_rows_json(rows);
    std::cout << j.dump(2, ' ', false, json::error_handler_t::replace) << "\n";
    return 0;
  }
  std::cout << fmt::format(
      "specactor bench --device cuda: {} on {} ({:.1f} MiB of weights on the device), CUDA graphs {}\n", s->model_path,
      probe.device_name, m.weights->weight_bytes() / 1048576.0, s->disable_cuda_graph ? "off" : "on");
  std::cout << fmt::format("device:   copy bandwidth {:.0f} GB/s (read + write, measured)\n", bw);
  for (const auto& b : batches)
    std::cout << fmt::format(
        "decode:   batch {:>2}: {:.1f} tok/s ({:.2f} MB per step) -> {:.1f} GB/s = {:.1f}% of the "
        "device bandwidth (best of {}, {} prompt tokens, {} steps)\n",
        b.batch, b.tokens_per_s, b.bytes_per_step / 1e6, b.achieved_gbps, 100.0 * b.achieved_gbps / bw, o.repeats,
        o.prompt_tokens, o.decode_tokens);
  std::cout << "\n";
  print_drafter_rows(rows, o.prompts_path, o.max_new_tokens, o.repeats);
  return 0;
#endif
}
