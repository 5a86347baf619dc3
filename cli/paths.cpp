#include "cli/paths.hpp"

#include <cstdlib>
#include <filesystem>
#include <vector>

namespace specactor::cli {

namespace fs = std::filesystem;

namespace {

std::string first_file(const std::vector<fs::path>& candidates) {
  std::error_code ec;
  for (const auto& p : candidates)
    if (fs::is_regular_file(p, ec)) return fs::weakly_canonical(p, ec).string();
  return "";
}

fs::path exe_dir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : exe.parent_path();
}

}  // namespace

std::string shipped_file(const std::string& relative, const std::string& installed_name) {
  const fs::path dir = exe_dir();
  std::vector<fs::path> c;
  if (!dir.empty()) {
    c.push_back(dir.parent_path() / relative);                                // build/specactor in a checkout
    c.push_back(dir.parent_path() / "share" / "specactor" / installed_name);  // bin/specactor of an install
  }
  c.push_back(fs::current_path() / relative);
  return first_file(c);
}

std::string default_model_path() {
  const std::string file = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (const char* env = std::getenv("SPECACTOR_MODELS_DIR"); env && *env)
    return first_file({fs::path(env) / fs::path(file).filename()});
  const fs::path dir = exe_dir();
  std::vector<fs::path> c;
  if (!dir.empty()) c.push_back(dir.parent_path() / file);
  c.push_back(fs::current_path() / file);
  return first_file(c);
}

}  // namespace specactor::cli
