// examples/custom_drafter.cpp — a host application that adds a draft algorithm of its own under a new
// name, BIGRAM, and generates with it. BIGRAM proposes, after the context's last token, what followed
// that token the last time it appeared, then what followed that one, and so on: prompt lookup with a
// one-token key, in a few lines.
//
// It checks what the engine promises a host drafter: the factory receives the draft snapshot the
// engine derived from the target's resolved snapshot, the draft worker keeps that same snapshot, the
// target's snapshot is unchanged by it, and greedy output with BIGRAM equals plain greedy output token
// for token (the target verifies every proposal).
//
//   build/examples/custom_drafter models/SmolLM2-135M-Instruct.Q4_1.gguf [server flags...]
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "actors/engine.hpp"
#include "config/snapshot.hpp"
#include "drafters/drafter.hpp"

namespace sa = specactor::actors;
namespace sc = specactor::config;
namespace sd = specactor::drafters;

namespace {

class BigramDrafter final : public sd::Drafter {
 public:
  sd::DraftTree propose(std::uint64_t, const std::vector<std::int32_t>& context, std::int32_t max_nodes,
                        std::int32_t max_depth) override {
    // token -> what followed its latest occurrence (the context's last token has no follower yet).
    std::map<std::int32_t, std::int32_t> next;
    for (std::size_t i = 0; i + 1 < context.size(); ++i) next[context[i]] = context[i + 1];
    std::vector<std::int32_t> chain;
    std::int32_t at = context.empty() ? -1 : context.back();
    while (static_cast<std::int32_t>(chain.size()) < std::min(max_nodes, max_depth)) {
      auto it = next.find(at);
      if (it == next.end()) break;
      chain.push_back(it->second);
      at = it->second;
    }
    return sd::DraftTree::chain(std::move(chain));
  }
};

// What the factory was given (it runs on the draft worker's thread).
struct Seen {
  std::mutex mu;
  sc::Snapshot snapshot;
  int calls = 0;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: custom_drafter MODEL.gguf [server flags...]\n");
    return 2;
  }
  if (!std::filesystem::exists(argv[1])) {
    std::fprintf(stderr, "custom_drafter: %s not found (run tools/setup to fetch the default model)\n", argv[1]);
    return 77;  // CTest: skipped
  }
  Seen seen;
  sd::register_drafter("bigram", [&seen](const sc::Snapshot& draft, const sd::DraftContext&) {
    std::lock_guard lock(seen.mu);
    seen.snapshot = draft;
    ++seen.calls;
    return std::make_unique<BigramDrafter>();
  });

  std::vector<std::string> common = {"--model-path", argv[1], "--log-level", "warn"};
  common.insert(common.end(), argv + 2, argv + argc);
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), common.begin(), common.end());
    return extra;
  };
  try {
    // A fixed shape (the budget would learn to skip a drafter this simple on some prompts).
    auto spec = sa::Engine::from_argv(
        with({"--speculative-algorithm", "BIGRAM", "--speculative-num-steps", "4", "--speculative-adaptive", "false"}));
    auto plain = sa::Engine::from_argv(with({"--speculative-algorithm", "NONE"}));
    const std::string target_hash = sc::hash_hex(sc::content_hash(*spec->target_snapshot()));

    const std::vector<std::string> prompts = {
        "List the days of the week, one per line, then list them again.",
        "Write a Python function that returns the sum of a list, and a second one that returns its product."};
    bool same = true;
    for (const std::string& p : prompts) {
      sa::GenerationRequest req;
      req.prompt = p;
      req.chat = true;
      req.max_new_tokens = 64;
      const sa::GenerationResult a = spec->generate(req), b = plain->generate(req);
      std::printf("%s\n  -> %s\n", p.c_str(), a.text.c_str());
      if (a.tokens != b.tokens) {
        same = false;
        std::printf("  differs from plain greedy output: %s\n", b.text.c_str());
      }
    }
    const sa::EngineMetrics m = spec->metrics();
    const sa::SnapshotReport r = spec->snapshots();
    std::lock_guard lock(seen.mu);
    const bool one_snapshot =
        seen.calls == 1 && seen.snapshot && seen.snapshot == r.draft_worker && seen.snapshot == r.derived_draft;
    const bool target_kept = sc::hash_hex(sc::content_hash(*spec->target_snapshot())) == target_hash &&
                             spec->target_hash_before_draft() == target_hash &&
                             sc::hash_hex(sc::content_hash(*r.target_worker)) == target_hash;
    std::printf("algorithm %s: %lld drafted, %lld accepted (alpha %.2f, tau %.2f)\n", m.algorithm.c_str(),
                static_cast<long long>(m.drafted), static_cast<long long>(m.accepted), m.acceptance_rate,
                m.mean_accepted_length);
    std::printf("the factory and the draft worker hold one snapshot: %s (draft %s)\n", one_snapshot ? "yes" : "NO",
                seen.snapshot ? sc::hash_hex(sc::content_hash(*seen.snapshot)).c_str() : "none");
    std::printf("target snapshot %s unchanged: %s\n", target_hash.c_str(), target_kept ? "yes" : "NO");
    std::printf("greedy output equals plain greedy output: %s\n", same ? "yes" : "NO");
    spec->shutdown();
    plain->shutdown();
    return same && one_snapshot && target_kept && m.algorithm == "BIGRAM" && m.drafted > 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "custom_drafter: error: %s\n", e.what());
    return 2;
  }
}
