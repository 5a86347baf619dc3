// config/resolve.cpp — argument parsing, load-time resolution, draft derivation.
#include "config/resolve.hpp"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "config/error.hpp"
#include "config/input.hpp"

namespace specactor::config {
namespace {

using json = nlohmann::json;

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// The closest setting (or flag of the command at hand, `command_flags`, e.g. "--prompt") to a
// mistyped one, as " (did you mean --x?)", or "" when nothing is close.
std::string suggestion(std::string_view field, const std::vector<std::string>& command_flags = {}) {
  std::string best;
  std::size_t best_d = 4;  // suggest only close matches
  for (const auto& name : field_names()) {
    std::size_t d = edit_distance(field, name);
    if (d < best_d) best_d = d, best = flag_name(name);
  }
  for (const auto& flag : command_flags) {
    if (flag.size() < 3) continue;
    std::string f = flag.substr(2);
    std::replace(f.begin(), f.end(), '-', '_');
    std::size_t d = edit_distance(field, f);
    if (d < best_d) best_d = d, best = flag;
  }
  return best.empty() ? "" : " (did you mean " + best + "?)";
}

// What users of other engines type for our flags: -m and --model (llama.cpp, vLLM, sglang's alias).
std::string canonical_flag(const std::string& flag) {
  if (flag == "-m" || flag == "--model") return "--model-path";
  return flag;
}

bool known_field(std::string_view field) {
  const auto& names = field_names();
  return std::find(names.begin(), names.end(), field) != names.end();
}

std::string field_of_flag(std::string_view flag) {
  std::string f(flag.substr(2));
  std::replace(f.begin(), f.end(), '-', '_');
  return f;
}

}  // namespace

void apply_config_file(ServerArgs& args, const std::string& path) {
  const std::string what = "--config " + path;
  const json doc = parse_json(read_text_file(path, what), what);
  if (!doc.is_object()) throw ConfigError("--config " + path + ": expected a JSON object of settings");
  json applied = json::object();
  for (const auto& [key, value] : doc.items()) {
    if (!known_field(key)) throw ConfigError("--config " + path + ": unknown setting '" + key + "'" + suggestion(key));
    set_field(args, key, value, "--config " + path + " key '" + key + "'");
    applied[key] = value;
  }
  if (!applied.empty()) args.override_log.push_back({"user.config_file:" + path, applied});
}

ServerArgs parse_server_args(const std::vector<std::string>& argv) { return parse_server_args(argv, {}); }

ServerArgs parse_server_args(const std::vector<std::string>& argv, const std::vector<std::string>& command_flags) {
  ServerArgs args;
  // Pass 1: the config file (so the command line wins regardless of order).
  for (std::size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a == "--config") {
      if (i + 1 >= argv.size()) throw ConfigError("--config: expected a JSON file path");
      apply_config_file(args, argv[++i]);
    } else if (a.rfind("--config=", 0) == 0) {
      apply_config_file(args, a.substr(9));
    }
  }
  // Pass 2: the flags.
  json applied = json::object();
  for (std::size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a == "--config") {
      ++i;
      continue;
    }
    if (a.rfind("--config=", 0) == 0) continue;
    std::string flag = a, text;
    bool has_value = false;
    if (auto eq = a.find('='); eq != std::string::npos) {
      flag = a.substr(0, eq);
      text = a.substr(eq + 1);
      has_value = true;
    }
    flag = canonical_flag(flag);
    if (flag.size() < 3 || flag.rfind("--", 0) != 0)
      throw ConfigError("unexpected argument '" + a + "' (settings are given as --flag value)");
    const std::string field = field_of_flag(flag);
    if (!known_field(field)) throw ConfigError("unknown flag " + flag + suggestion(field, command_flags));
    if (!has_value) {
      if (is_bool_field(field)) {  // a switch, or followed by its value (true|false)
        text = "true";
        if (i + 1 < argv.size() && argv[i + 1].rfind("--", 0) != 0) text = argv[++i];
      } else {
        if (i + 1 >= argv.size() || (argv[i + 1].rfind("--", 0) == 0 && argv[i + 1].size() > 2))
          throw ConfigError(flag + ": expected a value");
        text = argv[++i];
      }
    }
    json value = parse_field_text(field, text);
    set_field(args, field, value, flag);
    applied[field] = value;
  }
  if (!applied.empty()) args.override_log.push_back({"user.argv", applied});
  return args;
}

Snapshot resolve_target(const Snapshot& user, const ModelFacts& model, const RuntimeFacts& runtime) {
  Snapshot s = user;
  const std::string model_name = model.architecture + " model " + s->model_path;

  // Facts from the model file.
  {
    json f = json::object();
    if (model.context_length <= 0)
      throw ConfigError(s->model_path + ": the model reports no context length; pass --context-length");
    if (!s->context_length) {
      if (model.context_length > kMaxContextLength)
        throw ConfigError(s->model_path + ": the model reports a context length of " +
                          std::to_string(model.context_length) + " tokens, more than the " +
                          std::to_string(kMaxContextLength) + " specactor supports; pass --context-length");
      f["context_length"] = model.context_length;
    } else if (*s->context_length > model.context_length && !s->allow_context_length_above_model) {
      throw ConfigError("--context-length " + std::to_string(*s->context_length) + " exceeds the context length of " +
                        model_name + " (" + std::to_string(model.context_length) +
                        "); pass --allow-context-length-above-model to accept it");
    }
    s = derive(s, "load.model_config", f);
  }

  // Files the drafters read later: checked now, so a wrong path stops the start instead of
  // silently running without drafts.
  if (s->speculative_ngram_corpus_path) {
    std::size_t size = 0;
    ::close(open_regular_file(*s->speculative_ngram_corpus_path,
                              "--speculative-ngram-corpus-path " + *s->speculative_ngram_corpus_path, size));
  }

  // The budget's memory folder, when one is named: checked now (not created: `config` changes
  // nothing), so a path that cannot hold it stops the start instead of losing what the budget learns
  // at exit. It must be a folder, or be creatable: its nearest existing parent a writable folder.
  if (const std::string& dir = s->speculative_budget_cache; !dir.empty() && dir != "none") {
    namespace fs = std::filesystem;
    std::error_code ec;
    const std::string what = "--speculative-budget-cache " + printable(dir);
    fs::path at = fs::absolute(dir, ec);
    if (fs::exists(at, ec) && !fs::is_directory(at, ec)) throw ConfigError(what + ": not a folder");
    while (!at.empty() && !fs::exists(at, ec) && at.has_parent_path() && at.parent_path() != at) at = at.parent_path();
    if (!fs::is_directory(at, ec))
      throw ConfigError(what + ": cannot create the folder (" + at.string() + " is not a folder)");
    if (::access(at.c_str(), W_OK | X_OK) != 0)
      throw ConfigError(what + ": cannot " + (at == fs::absolute(dir, ec) ? "write in" : "create") + " the folder (" +
                        at.string() + " is not writable)");
  }

  // KV budget.
  if (!s->max_total_tokens) {
    const std::int64_t want = std::max<std::int64_t>(*s->context_length, 32768);
    const std::int64_t rounded = (want + s->page_size - 1) / s->page_size * s->page_size;
    s = derive(s, "auto.memory", {{"max_total_tokens", rounded}});
  }

  // Device and parallelism: only what the engine can actually run.
  if (s->device == Device::Cuda && !runtime.cuda_usable)
    throw ConfigError("--device cuda: no usable CUDA device (" +
                      (runtime.cuda_reason.empty() ? std::string("probe failed") : runtime.cuda_reason) +
                      "); use --device cpu or auto");
  if (s->device == Device::Cuda && !runtime.cuda_forward)
    throw ConfigError(
        "--device cuda: this build has no CUDA forward pass (configured without nvcc); use --device cpu "
        "or auto");
  if (s->device == Device::Auto)
    s = derive(s, "auto.device",
               {{"device", runtime.cuda_usable && runtime.cuda_forward &&
                                   (s->tp_size == 1 || s->tp_size <= runtime.cuda_devices) &&
                                   s->speculative_algorithm != SpecAlgorithm::FrozenKvMtp  // reads host KV
                               ? "cuda"
                               : "cpu"}});
  // Settings kept for sglang compatibility (and for the snapshot isolation they exercise) whose other
  // values nothing implements: refused here, where a user's settings enter, instead of ignored.
  {
    auto not_yet = [](const std::string& flag, const std::string& value, const std::string& why) {
      throw ConfigError(flag + " " + value + ": not supported yet (" + why + ")");
    };
    const std::string device(to_string(s->device));
    if (s->dtype != "auto" && s->dtype != "float32")
      not_yet("--dtype", s->dtype, "activations and weights are computed in float32; see --cpu-precision");
    for (const auto& [flag, v] :
         {std::pair<std::string, std::optional<std::string>>{"--attention-backend", s->attention_backend},
          {"--prefill-attention-backend", s->prefill_attention_backend},
          {"--decode-attention-backend", s->decode_attention_backend},
          {"--speculative-draft-attention-backend", s->speculative_draft_attention_backend}})
      if (v && *v != "auto" && *v != device)
        not_yet(flag, *v, "attention runs where the forward runs: --device " + device);
    if (s->disable_chunked_prefix_cache)
      not_yet("--disable-chunked-prefix-cache", "true",
              "that is sglang's chunked-prefix cache for MLA models; specactor's prefix cache is the radix cache "
              "(--disable-radix-cache)");
  }

  // KV cache element type: 16-bit on the CPU in the fast precision (half the bytes attention reads),
  // float32 in the exact precision and on CUDA (the device keeps float32 rows).
  if (s->device == Device::Cuda && s->kv_cache_dtype != "auto" && s->kv_cache_dtype != "float32")
    throw ConfigError("--kv-cache-dtype " + s->kv_cache_dtype +
                      ": the CUDA forward keeps its KV cache in float32 on the device; use float32 (or auto), or "
                      "--device cpu");
  if (s->device == Device::Cuda && s->speculative_draft_kv_cache_dtype &&
      *s->speculative_draft_kv_cache_dtype != "auto" && *s->speculative_draft_kv_cache_dtype != "float32")
    throw ConfigError("--speculative-draft-kv-cache-dtype " + *s->speculative_draft_kv_cache_dtype +
                      ": with --device cuda the draft's KV cache is float32; use float32 (or auto), or --device cpu");
  if (s->kv_cache_dtype == "auto")
    s = derive(s, "auto.kv_cache_dtype",
               {{"kv_cache_dtype",
                 s->device == Device::Cpu && s->cpu_precision == CpuPrecision::Fast ? "float16" : "float32"}});

  // Tensor parallelism: on the CPU the ranks are threads of this process (any count the model's
  // heads and MLP width divide by — checked when the weights are bound); on CUDA one device per rank.
  if (s->device == Device::Cuda && s->tp_size > 1 && s->tp_size > runtime.cuda_devices)
    throw ConfigError("--tp-size " + std::to_string(s->tp_size) + ": --device cuda runs one rank per GPU and " +
                      std::to_string(runtime.cuda_devices) + " device(s) answered");
  if (s->tp_size > 1) {
    const std::int64_t T = s->tp_size;
    std::string fits;  // the sizes that divide everything, for the message
    for (std::int64_t t = 1; t <= std::max<std::int64_t>(model.num_heads, 1); ++t)
      if (model.num_heads % t == 0 && model.num_kv_heads % t == 0 && model.ffn_hidden_size % t == 0)
        fits += (fits.empty() ? "" : ", ") + std::to_string(t);
    auto need = [&](std::int64_t n, const char* what) {
      if (n > 0 && n % T != 0)
        throw ConfigError("--tp-size " + std::to_string(T) + ": " + model_name + " has " + std::to_string(n) + " " +
                          what + ", which do not split into " + std::to_string(T) +
                          " equal shards (sizes that fit: " + fits + ")");
    };
    need(model.num_heads, "attention heads");
    need(model.num_kv_heads, "KV heads");
    need(model.ffn_hidden_size, "MLP columns");
  }
  if (s->device == Device::Cuda && s->speculative_algorithm == SpecAlgorithm::FrozenKvMtp)
    throw ConfigError(
        "--device cuda: FROZEN_KV_MTP reads the target's KV cache from host memory, but on CUDA the KV "
        "rows live on the device; use --device cpu or another algorithm");
  if (s->tp_size > 1 && s->speculative_algorithm == SpecAlgorithm::FrozenKvMtp)
    throw ConfigError("--tp-size " + std::to_string(s->tp_size) +
                      ": FROZEN_KV_MTP reads the target's whole KV cache, but with tensor parallelism each rank "
                      "holds only its own KV heads; use --tp-size 1 or another algorithm");

  // AUTO (the default): speculate with the head shipped for this model, if one ships; else plain.
  if (s->speculative_algorithm == SpecAlgorithm::Auto) {
    const bool head = !model.shipped_eagle3_head.empty();
    try {
      s = derive(s,
                 head ? "auto.speculative_algorithm (a head ships for this model)"
                      : "auto.speculative_algorithm (no head ships for this model)",
                 {{"speculative_algorithm", head ? "EAGLE3" : "NONE"}});
    } catch (const ConfigError& e) {
      throw ConfigError(std::string(e.what()) + " (--speculative-algorithm AUTO chose " + (head ? "EAGLE3" : "NONE") +
                        " for " + model_name + ")");
    }
  }

  // EAGLE3 without a head: the one shipped for this model, if any.
  bool shipped_head = false;  // the shipped head or block drafter, picked here, with its own defaults
  if (s->speculative_algorithm == SpecAlgorithm::Eagle3 &&
      (!s->speculative_draft_model_path || s->speculative_draft_model_path->empty())) {
    if (model.shipped_eagle3_head.empty())
      throw ConfigError("--speculative-draft-model-path: is required by --speculative-algorithm EAGLE3 for " +
                        model_name +
                        ": give the EAGLE3 head to load (a head ships only for SmolLM2-135M-Instruct, in heads/; "
                        "training/train_eagle3.py trains one)");
    s = derive(s, "auto.shipped_head", {{"speculative_draft_model_path", model.shipped_eagle3_head}});
    shipped_head = model.shipped_head_defaults.has_value();
  }
  // DFLASH or DSPARK without a drafter: the one shipped for this model, if any.
  if (is_block_drafter(s->speculative_algorithm) &&
      (!s->speculative_draft_model_path || s->speculative_draft_model_path->empty())) {
    const bool dspark = s->speculative_algorithm == SpecAlgorithm::Dspark;
    if (model.shipped_block_drafter.empty())
      throw ConfigError(std::string("--speculative-draft-model-path: is required by --speculative-algorithm ") +
                        (dspark ? "DSPARK" : "DFLASH") + " for " + model_name + ": give the " +
                        (dspark ? "DSpark" : "DFlash") +
                        " drafter folder to load (one ships only for SmolLM2-135M-Instruct, in heads/; "
                        "training/dflash-recipe trains one)");
    s = derive(s, "auto.shipped_drafter", {{"speculative_draft_model_path", model.shipped_block_drafter}});
    shipped_head = model.shipped_head_defaults.has_value();
  }

  // Speculative shape.
  if (s->speculative_algorithm != SpecAlgorithm::None) {
    // The shipped head's default is the shape measured fastest for it (its config.json); sglang's 5/4/8
    // tree is for large heads.
    const ShippedHeadDefaults tuned = shipped_head ? *model.shipped_head_defaults : ShippedHeadDefaults{};
    const SpecShape dflt = shipped_head ? tuned.shape : auto_spec_shape(s->speculative_algorithm, model.llama_family);
    const bool none_given = !s->speculative_num_steps && !s->speculative_eagle_topk && !s->speculative_num_draft_tokens;
    const std::int64_t steps = s->speculative_num_steps.value_or(dflt.num_steps);
    const std::int64_t topk = s->speculative_eagle_topk.value_or(none_given ? dflt.eagle_topk : 1);
    std::int64_t tokens =
        s->speculative_num_draft_tokens.value_or(std::min<std::int64_t>(dflt.num_draft_tokens, 1 + steps * topk));
    if (topk == 1) tokens = steps + 1;  // a chain verifies exactly its steps plus the root
    // A head drafter tracks a proposal's nodes in a 64-bit attention mask: the root plus steps × topk.
    const auto a = s->speculative_algorithm;
    const bool head = is_head_drafter(a);
    if (head && 1 + steps * topk > kMaxHeadDraftNodes)
      throw ConfigError("--speculative-num-steps × --speculative-eagle-topk: " + std::string(to_string(a)) +
                        " drafts at most " + std::to_string(kMaxHeadDraftNodes - 1) +
                        " nodes per step (1 + steps × topk <= " + std::to_string(kMaxHeadDraftNodes) + "), got " +
                        std::to_string(steps) + " × " + std::to_string(topk) +
                        (s->speculative_num_steps && s->speculative_eagle_topk
                             ? std::string()
                             : std::string(" (with the default for the flag not given)")));
    json f = json::object();
    if (!s->speculative_num_steps) f["speculative_num_steps"] = steps;
    if (!s->speculative_eagle_topk) f["speculative_eagle_topk"] = topk;
    if (!s->speculative_num_draft_tokens || *s->speculative_num_draft_tokens != tokens)
      f["speculative_num_draft_tokens"] = tokens;
    // Head drafters: the shipped head's floor and prompt-lookup branch go with its default shape (they
    // were measured with it); otherwise none (sglang's behaviour: the shape is drafted whole).
    if (head && !s->speculative_draft_p_min)
      f["speculative_draft_p_min"] = shipped_head && none_given ? tuned.p_min : 0.0;
    if ((head || is_block_drafter(a)) && !s->speculative_draft_ngram_tokens)
      f["speculative_draft_ngram_tokens"] = shipped_head && none_given ? tuned.ngram_tokens : 0;
    if (head && s->speculative_draft_quantization == "auto")
      f["speculative_draft_quantization"] = shipped_head ? tuned.quantization : std::string("q8_0");
    if (is_block_drafter(a) && shipped_head && s->speculative_draft_quantization == "auto")
      f["speculative_draft_quantization"] = tuned.quantization;
    s = derive(s, "auto.speculative", f);
  }
  return s;
}

DraftShapeArgs draft_shape_args(const ServerArgs& a) {
  DraftShapeArgs d;
  d.num_steps = a.speculative_num_steps.value_or(d.num_steps);
  d.eagle_topk = std::max<std::int64_t>(1, a.speculative_eagle_topk.value_or(d.eagle_topk));
  d.num_draft_tokens = a.speculative_num_draft_tokens.value_or(d.num_steps + 1);
  d.p_min = a.speculative_draft_p_min.value_or(d.p_min);
  d.ngram_tokens = a.speculative_draft_ngram_tokens.value_or(d.ngram_tokens);
  d.ngram_min_match = a.speculative_draft_ngram_min_match.value_or(d.ngram_min_match);
  d.suffix_tokens = a.speculative_draft_suffix_tokens.value_or(d.suffix_tokens);
  return d;
}

Snapshot derive_draft(const Snapshot& target_resolved, const ModelFacts& target_model) {
  const ServerArgs& t = *target_resolved;
  if (t.speculative_algorithm == SpecAlgorithm::None)
    throw ConfigError("derive_draft: --speculative-algorithm is NONE, there is no draft to configure");
  json f = json::object();
  f["context_length"] = target_model.context_length;  // the draft reads the target's positions
  if (t.speculative_draft_load_format) f["load_format"] = std::string(to_string(*t.speculative_draft_load_format));
  if (t.speculative_draft_attention_backend) {
    f["attention_backend"] = *t.speculative_draft_attention_backend;
    f["prefill_attention_backend"] = nullptr;
    f["decode_attention_backend"] = nullptr;
  }
  // "auto" (like unset) keeps the target's resolved type.
  if (t.speculative_draft_kv_cache_dtype && *t.speculative_draft_kv_cache_dtype != "auto")
    f["kv_cache_dtype"] = *t.speculative_draft_kv_cache_dtype;
  if (t.speculative_draft_model_path) f["model_path"] = *t.speculative_draft_model_path;
  // Never empty (context_length is always set), so the draft always gets its own object.
  return derive(target_resolved, "draft.per_runner", f);
}

}  // namespace specactor::config
