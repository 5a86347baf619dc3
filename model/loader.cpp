#include "model/loader.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <type_traits>

#include "config/error.hpp"
#include "config/input.hpp"
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

namespace {

// A drafter folder `<stem><suffix>` shipped for `model_path` (see shipped_eagle3_head).
std::string shipped_drafter(const std::string& model_path, const std::string& suffix) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string file = fs::path(model_path).filename().string();
  const std::string name = file.substr(0, file.find('.')) + suffix;
  std::vector<fs::path> dirs;
  if (const char* env = std::getenv("SPECACTOR_HEADS_DIR"); env && *env) dirs.emplace_back(env);
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    dirs.push_back(exe.parent_path().parent_path() / "heads");                          // build/ of a checkout
    dirs.push_back(exe.parent_path().parent_path() / "share" / "specactor" / "heads");  // bin/ of an install
  }
  dirs.push_back(fs::absolute(model_path, ec).parent_path().parent_path() / "heads");
  for (const fs::path& d : dirs) {
    const fs::path head = d / name;
    if (fs::is_regular_file(head / "config.json", ec) && fs::is_regular_file(head / "model.safetensors", ec))
      return fs::weakly_canonical(head, ec).string();
  }
  return "";
}

}  // namespace

std::string shipped_eagle3_head(const std::string& model_path) { return shipped_drafter(model_path, "-eagle3"); }
std::string shipped_block_drafter(const std::string& model_path, bool dspark) {
  return shipped_drafter(model_path, dspark ? "-dspark" : "-dflash");
}

std::optional<config::ShippedHeadDefaults> shipped_head_defaults(const std::string& head_dir) {
  const std::string cfg = (std::filesystem::path(head_dir) / "config.json").string();
  const nlohmann::json j = config::parse_json(config::read_text_file(cfg, cfg), cfg);
  if (!j.is_object() || !j.contains("specactor") || !j["specactor"].is_object() || !j["specactor"].contains("defaults"))
    return std::nullopt;
  const nlohmann::json& d = j["specactor"]["defaults"];
  auto get = [&](const char* key, auto fallback) {
    const std::string where = cfg + ": specactor.defaults." + key;
    if (!d.is_object() || !d.contains(key)) throw config::ConfigError(where + " is missing");
    try {
      return d.at(key).get<decltype(fallback)>();
    } catch (const nlohmann::json::exception&) {
      throw config::ConfigError(where + ": expected a " +
                                (std::is_same_v<decltype(fallback), std::string> ? "string" : "number") + ", got " +
                                config::printable(d.at(key).dump()));
    }
  };
  config::ShippedHeadDefaults out;
  out.shape = {get("speculative_num_steps", std::int64_t{}), get("speculative_eagle_topk", std::int64_t{}),
               get("speculative_num_draft_tokens", std::int64_t{})};
  out.p_min = get("speculative_draft_p_min", double{});
  out.ngram_tokens = get("speculative_draft_ngram_tokens", std::int64_t{});
  out.quantization = get("speculative_draft_quantization", std::string{});
  return out;
}

ResolvedTarget resolve_target(const config::ServerArgs& user_args) {
  const config::Snapshot user = config::freeze(user_args);
  if (user->model_path.empty())
    throw config::ConfigError(
        "--model-path is required (after tools/setup the default model is "
        "models/SmolLM2-135M-Instruct.Q4_1.gguf)");
  ModelInfo info = read_any_model_info(*user);
  (void)LlamaConfig::from(info, user->json_model_override_args);  // overrides refused here, not only at load
  if (user->speculative_draft_num_layers && !info.sliding_layers.empty())
    throw config::ConfigError(
        "--speculative-draft-num-layers: self-speculation reads the target's KV from a second pool, which " +
        info.architecture +
        "'s sliding-window layers do not support; draft with NGRAM, SUFFIX or a draft model "
        "(--speculative-draft-model-path)");
  config::ModelFacts facts = info.facts();
  if (user->speculative_algorithm == config::SpecAlgorithm::Eagle3 ||
      user->speculative_algorithm == config::SpecAlgorithm::Auto) {
    facts.shipped_eagle3_head = shipped_eagle3_head(user->model_path);
    if (!facts.shipped_eagle3_head.empty())
      facts.shipped_head_defaults = shipped_head_defaults(facts.shipped_eagle3_head);
  }
  if (config::is_block_drafter(user->speculative_algorithm)) {
    facts.shipped_block_drafter =
        shipped_block_drafter(user->model_path, user->speculative_algorithm == config::SpecAlgorithm::Dspark);
    const bool by_path = user->speculative_draft_model_path && !user->speculative_draft_model_path->empty();
    if (!facts.shipped_block_drafter.empty() && !by_path) {  // resolution takes the shipped one
      facts.shipped_head_defaults = shipped_head_defaults(facts.shipped_block_drafter);
      // A block drafter takes no floor (--speculative-draft-p-min is a head drafter's): one would be ignored.
      if (facts.shipped_head_defaults && facts.shipped_head_defaults->p_min != 0.0)
        throw config::ConfigError(facts.shipped_block_drafter +
                                  "/config.json: specactor.defaults.speculative_draft_p_min: a block drafter takes no "
                                  "floor (a head drafter's setting); expected 0");
    }
  }
  config::Snapshot target = config::resolve_target(user, facts, runtime_facts());
  return {std::move(target), std::move(info)};
}

std::shared_ptr<const Tokenizer> load_tokenizer(const config::ServerArgs& s,
                                                std::shared_ptr<const GgufFile> model_file) {
  namespace fs = std::filesystem;
  if (s.tokenizer_path) {
    const std::string& p = *s.tokenizer_path;
    if (fs::is_directory(p) && fs::exists(fs::path(p) / "tokenizer.json"))
      return Tokenizer::from_tokenizer_json((fs::path(p) / "tokenizer.json").string());
    if (p.ends_with(".json")) return Tokenizer::from_tokenizer_json(p);
    return Tokenizer::from_gguf(*GgufFile::open(p));
  }
  if (uses_safetensors(s)) {
    const fs::path dir = fs::is_directory(s.model_path) ? fs::path(s.model_path) : fs::path(s.model_path).parent_path();
    if (fs::exists(dir / "tokenizer.json")) return Tokenizer::from_tokenizer_json((dir / "tokenizer.json").string());
    throw GgufError(s.model_path +
                    ": no tokenizer.json beside the checkpoint; --tokenizer-path names one (tokenizer.json, or a GGUF "
                    "of the same model), or --skip-tokenizer-init runs it without one, for requests given as token ids "
                    "only");
  }
  if (!model_file) model_file = GgufFile::open(s.model_path);
  return Tokenizer::from_gguf(*model_file);
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
  // llama's GGUF converter permuted Q/K to adjacent pairs; the other families keep the half split.
  m.config.rope_neox = naming == LlamaWeights::Naming::HuggingFace || m.config.desc().gguf_neox;
  m.weights = LlamaWeights::load(source, naming, m.config, s.load_format, num_layers, progress, shard);
  if (!s.skip_tokenizer_init) {
    m.tokenizer = load_tokenizer(s, m.file);
    if (m.tokenizer->vocab_size() != m.config.vocab_size)
      throw GgufError(s.model_path + ": the tokenizer has " + std::to_string(m.tokenizer->vocab_size()) +
                      " tokens but the model's vocabulary is " + std::to_string(m.config.vocab_size));
    m.chat = ChatTemplate::choose(s.chat_template, m.tokenizer->chat_template());
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
