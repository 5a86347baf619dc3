// fuzz/fuzz_settings.cpp — the settings a user gives: command-line flags (the input split at NUL
// bytes into argv) or, when the input starts with '{', a --config JSON file; then the snapshot is
// frozen, resolved against fixed model facts (SmolLM2-135M's shapes) and, with a speculative
// algorithm, the draft derived.
#include <vector>

#include "config/resolve.hpp"
#include "config/server_args.hpp"
#include "config/snapshot.hpp"
#include "fuzz/fuzz_common.hpp"

using namespace specactor;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> argv;
  if (!in.empty() && in[0] == '{') {
    argv = {"--model-path", "target.gguf", "--config", fuzz::write_scratch("settings.json", in)};
  } else {
    std::size_t start = 0;
    for (std::size_t i = 0; i <= in.size(); ++i)
      if (i == in.size() || in[i] == '\0') {
        argv.emplace_back(in.substr(start, i - start));
        start = i + 1;
      }
  }
  fuzz::expect_clean([&] {
    const config::Snapshot user = config::freeze(config::parse_server_args(argv));
    if (user->model_path.empty()) return;
    const config::ModelFacts model{"llama", 4096, 49152, 576, 30, true, 0, 0, 0, {}, {}, {}};
    const config::Snapshot target = config::resolve_target(user, model, config::RuntimeFacts{false, "fuzz"});
    if (target->speculative_algorithm != config::SpecAlgorithm::None) (void)config::derive_draft(target, model);
    (void)config::settings_to_json(*target);
  });
  return 0;
}
