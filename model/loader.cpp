#include "model/loader.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "config/error.hpp"
#include "config/resolve.hpp"
#include "kernels/backend.hpp"
#include "model/runner.hpp"
#include "model/safetensors.hpp"

namespace specactor::model {

bool uses_safetensors(const config::ServerArgs& s) {
  if (s.load_format == config::LoadFormat::Safetensors) return true;
  if (s.load_format == config::LoadFormat::Gguf) return false;
  return std::filesystem::is_directory(s.model_path) || s.model_path.ends_with(".safetensors");
}

ModelInfo read_any_model_info(const config::ServerArgs& s) {
  if (uses_safetensors(s)) return read_hf_model_info(s.model_path);
  return read_model_info(*GgufFile::open(s.model_path));
}

config::RuntimeFacts runtime_facts() {
  const auto& probe = kernels::probe_devices();
  return {probe.cuda_usable, probe.reason, cuda_forward_compiled(), probe.device_count};
}

std::string shipped_eagle3_head(const std::string& model_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string file = fs::path(model_path).filename().string();
  const std::string name = file.substr(0, file.find('.')) + "-eagle3";
  std::vector<fs::path> dirs;
  if (const char* env = std::getenv("SPECACTOR_HEADS_DIR"); env && *env) dirs.emplace_back(env);
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) dirs.push_back(exe.parent_path().parent_path() / "heads");
  dirs.push_back(fs::absolute(model_path, ec).parent_path().parent_path() / "heads");
  for (const fs::path& d : dirs) {
    const fs::path head = d / name;
    if (fs::is_regular_file(head / "config.json", ec) && fs::is_regular_file(head / "model.safetensors", ec))
      return fs::weakly_canonical(head, ec).string();
  }
  return "";
}

ResolvedTarget resolve_target(const config::ServerArgs& user_args) {
  const config::Snapshot user = config::freeze(user_args);
  if (user->model_path.empty())
    throw config::ConfigError(
        "--model-path is required (after tools/setup the default model is "
        "models/SmolLM2-135M-Instruct.Q4_1.gguf)");
  ModelInfo info = read_any_model_info(*user);
  (void)LlamaConfig::from(info, user->json_model_override_args);  // overrides refused here, not only at load
  config::ModelFacts facts = info.facts();
  if (user->speculative_algorithm == config::SpecAlgorithm::Eagle3)
    facts.shipped_eagle3_head = shipped_eagle3_head(user->model_path);
  config::Snapshot target = config::resolve_target(user, facts, runtime_facts());
  return {std::move(target), std::move(info)};
}

LoadedModel load_model(const config::ServerArgs& s, const LlamaWeights::Progress& progress, std::int64_t num_layers,
                       TpShard shard) {
  LoadedModel m;
  std::shared_ptr<const TensorSource> source;
  LlamaWeights::Naming naming = LlamaWeights::Naming::Gguf;
  if (uses_safetensors(s)) {
    m.info = read_hf_model_info(s.model_path);
    source = SafetensorsSource::open(s.model_path);
    naming = LlamaWeights::Naming::HuggingFace;
  } else {
    m.file = GgufFile::open(s.model_path);
    m.info = read_model_info(*m.file);
    source = std::make_shared<GgufSource>(m.file);
  }
  m.config = LlamaConfig::from(m.info, s.json_model_override_args);
  m.config.rope_neox = naming == LlamaWeights::Naming::HuggingFace;  // GGUF conversion permuted Q/K to adjacent pairs
  m.weights = LlamaWeights::load(source, naming, m.config, s.load_format, num_layers, progress, shard);
  if (!s.skip_tokenizer_init) {
    std::shared_ptr<const GgufFile> tok_file = m.file;
    if (s.tokenizer_path) tok_file = GgufFile::open(*s.tokenizer_path);
    if (!tok_file)
      throw GgufError(s.model_path +
                      ": a safetensors checkpoint takes its tokenizer from --tokenizer-path FILE.gguf "
                      "(tokenizer.json is not read); or pass --skip-tokenizer-init");
    m.tokenizer = Tokenizer::from_gguf(*tok_file);
    if (m.tokenizer->vocab_size() != m.config.vocab_size)
      throw GgufError(s.model_path + ": the tokenizer has " + std::to_string(m.tokenizer->vocab_size()) +
                      " tokens but the model's vocabulary is " + std::to_string(m.config.vocab_size));
    m.chat = ChatTemplate::detect(m.tokenizer->chat_template());
  }
  return m;
}

LlamaWeights::Progress terminal_progress(std::string label) {
  if (!::isatty(2)) return {};
  return [label = std::move(label)](std::size_t done, std::size_t total) {
    const int width = 30;
    const int fill = total ? static_cast<int>(width * done / total) : width;
    std::fprintf(stderr, "\r%s [%.*s%*s] %zu/%zu", label.c_str(), fill, "##############################", width - fill,
                 "", done, total);
    if (done >= total) std::fputc('\n', stderr);
    std::fflush(stderr);
  };
}

}  // namespace specactor::model
