// sched/budget_memory.cpp — the budget memory's key and file (see budget_memory.hpp).
#include "sched/budget_memory.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <filesystem>

#include "config/resolve.hpp"
#include "kernels/cpu/machine.hpp"
#include "kernels/cpu/matmul.hpp"
#include "sched/memory.hpp"
#include "sched/policy.hpp"

namespace specactor::sched {

namespace {

// Bytes of a file, or of the regular files in a folder (a head): tells one draft model from another
// at the same path well enough for the memory's key. 0 when it is neither.
std::uintmax_t bytes_of(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(path, ec)) return std::filesystem::file_size(path, ec);
  std::uintmax_t n = 0;
  if (std::filesystem::is_directory(path, ec))
    for (const auto& e : std::filesystem::directory_iterator(path, ec))
      if (e.is_regular_file(ec)) n += e.file_size(ec);
  return n;
}

}  // namespace

std::string budget_memory_key(const config::ServerArgs& t, const config::ServerArgs& d, const model::ModelInfo& m) {
  const std::string draft_path = d.speculative_draft_model_path ? *d.speculative_draft_model_path : std::string();
  const config::DraftShapeArgs shape = config::draft_shape_args(d);
  return fmt::format(
      "cpu={} | path={} | threads={} | precision={} | device={} | kv={} | model={} ({} bytes, {}) | "
      "draft={} {} ({} bytes) steps={} topk={} tokens={} p_min={} ngram={} suffix={} quantization={} layers={}",
      kernels::cpu_model_name(), kernels::qpath_name(kernels::qpath()), t.threads, config::to_string(t.cpu_precision),
      config::to_string(t.device), t.kv_cache_dtype, std::filesystem::path(m.path).filename().string(), m.tensor_bytes,
      m.weight_types, config::to_string(d.speculative_algorithm), draft_path, bytes_of(draft_path), shape.num_steps,
      shape.eagle_topk, shape.num_draft_tokens, shape.p_min, shape.ngram_tokens, shape.suffix_tokens,
      d.speculative_draft_quantization,
      d.speculative_draft_num_layers ? *d.speculative_draft_num_layers : std::int64_t{-1});
}

void BudgetMemory::open(Scheduler& policy, const config::ServerArgs& target, const config::ServerArgs* draft,
                        const model::ModelInfo& info) {
  auto& m = policy.metrics();
  file_.clear();
  if (!draft || draft->speculative_algorithm == config::SpecAlgorithm::None || !draft->speculative_adaptive ||
      target.speculative_budget_cache == "none") {
    m.budget_memory = "off";
    return;
  }
  const std::string& asked = target.speculative_budget_cache;
  const std::string folder = asked.empty() ? default_memory_folder() : asked;
  if (folder.empty()) {
    m.budget_memory = "off: neither $XDG_CACHE_HOME nor $HOME is set";
    return;
  }
  key_ = budget_memory_key(target, *draft, info);
  file_ = memory_file(folder, key_);
  saved_at_ = m.decode_steps;
  std::string text;
  std::string err = read_memory_file(file_, text);
  if (err.empty() && text.empty()) {
    m.budget_memory = "new " + file_;
    return;
  }
  if (err.empty()) err = policy.restore_memory(text, key_);
  if (err.empty()) {
    m.budget_memory = "read " + file_;
    spdlog::debug("budget: started from what it learned before ({})", file_);
  } else if (err == "key") {
    m.budget_memory = "new " + file_ + " (the file there was learned with another key)";
  } else {
    m.budget_memory = "ignored " + file_ + ": " + err;
    spdlog::warn("--speculative-budget-cache: {}: {}; the budget starts from nothing (the file is rewritten)", file_,
                 err);
  }
}

void BudgetMemory::save(const Scheduler& policy) {
  if (file_.empty()) return;
  saved_at_ = policy.metrics().decode_steps;
  const std::string err = write_memory_file(file_, policy.save_memory(key_));
  if (!err.empty() && !warned_) {
    warned_ = true;
    spdlog::warn("--speculative-budget-cache: {}; what the budget learned is not kept", err);
  }
}

void BudgetMemory::save_if_due(const Scheduler& policy) {
  if (!file_.empty() && policy.metrics().decode_steps - saved_at_ >= kEvery) save(policy);
}

}  // namespace specactor::sched
