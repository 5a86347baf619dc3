// examples/host_app.cpp — a host application embedding specactor: three requests run
// concurrently through one engine, their tokens stream into per-request buffers, and the texts are
// printed when all are done.
//
//   build/examples/host_app models/SmolLM2-135M-Instruct.Q4_1.gguf [server flags...]
#include <cstdio>
#include <filesystem>
#include <future>
#include <mutex>
#include <string>
#include <vector>

#include "actors/engine.hpp"

using specactor::actors::Engine;
using specactor::actors::GenerationRequest;
using specactor::actors::TokenEvent;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: host_app MODEL.gguf [server flags...]\n");
    return 2;
  }
  if (!std::filesystem::exists(argv[1])) {
    std::fprintf(stderr, "host_app: %s not found (run tools/setup to fetch the default model)\n", argv[1]);
    return 77;  // CTest: skipped
  }
  std::vector<std::string> args = {"--model-path", argv[1], "--log-level", "warn"};
  args.insert(args.end(), argv + 2, argv + argc);
  try {
    auto engine = Engine::from_argv(args);
    const std::vector<std::string> prompts = {"What is the capital of France? Answer in one sentence.",
                                              "Name three primary colors.", "Write one sentence about the sea."};
    struct Out {
      std::string text, reason;
      std::promise<void> done;
    };
    std::vector<Out> outs(prompts.size());
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      GenerationRequest req;
      req.prompt = prompts[i];
      req.chat = true;
      req.max_new_tokens = 48;
      engine->submit(req, [&out = outs[i]](const TokenEvent& ev) {
        out.text += ev.text;  // one request's events arrive in order, from one actor
        if (ev.finished) {
          out.reason = ev.finish_reason == "error" ? "error: " + ev.error : ev.finish_reason;
          out.done.set_value();
        }
      });
    }
    for (auto& o : outs) o.done.get_future().wait();
    const auto m = engine->metrics();
    for (std::size_t i = 0; i < prompts.size(); ++i)
      std::printf("[%zu] %s\n    -> %s (%s)\n", i, prompts[i].c_str(), outs[i].text.c_str(), outs[i].reason.c_str());
    std::printf("requests finished: %lld, steps: %lld, generated tokens: %lld\n",
                static_cast<long long>(m.requests_finished), static_cast<long long>(m.steps),
                static_cast<long long>(m.generated_tokens));
    engine->shutdown();
    for (const auto& o : outs)
      if (o.reason.rfind("error", 0) == 0 || o.text.empty()) return 1;
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "host_app: error: %s\n", e.what());
    return 2;
  }
}
