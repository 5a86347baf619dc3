// config/server_args.hpp — every user-facing setting of specactor, with its default.
//
// The field list is written once, in SPECACTOR_SERVER_ARGS below: (C++ type, name, default, doc).
// From it come the struct members, the `--flag-name` command-line flags (sglang's names), the JSON
// config-file keys, the snapshot JSON and the content hash. After resolution a ServerArgs is only
// ever seen through `Snapshot` (config/snapshot.hpp), a pointer to const: nothing can assign to it.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace specactor::config {

// Limits shared by validation and the code that relies on them.
// A verification tree holds at most this many tokens, the root included: the tree attention mask
// is one 64-bit word per row (validation, scheduler, target worker and forward all use it).
constexpr std::int64_t kMaxTreeTokens = 64;
// A head drafter's proposal holds at most this many nodes, the root included (1 + steps × topk): the
// head's own attention mask is one 64-bit word per node (resolution refuses larger shapes).
constexpr std::int64_t kMaxHeadDraftNodes = 64;
// The longest context a sequence may have (2^30 tokens: beyond any model here, far from int64 overflow
// in token and page arithmetic).
constexpr std::int64_t kMaxContextLength = std::int64_t{1} << 30;
// The n-gram drafter's longest match window (its suffix sort compares at most this many tokens).
constexpr std::int64_t kMaxNgramWindow = 64;
// The most tokens a head drafter's prompt-lookup branch adds to a proposal (--speculative-draft-ngram-tokens).
constexpr std::int64_t kMaxNgramBranch = 16;

enum class LoadFormat { Auto, Gguf, Safetensors, Dummy };
enum class Device { Auto, Cpu, Cuda };
enum class CpuPrecision { Fast, Exact };
// Auto (the default): EAGLE3 with the head shipped for the model when one ships, else NONE; resolution
// decides, so no resolved snapshot holds Auto. Custom: an algorithm a host application registered under
// a name of its own (see Algorithm).
enum class SpecAlgorithm {
  None,
  Eagle,
  Eagle3,
  Mtp,
  FrozenKvMtp,
  Standalone,
  Ngram,
  Suffix,
  Dflash,
  Dspark,
  Auto,
  Custom
};

// Name tables for the enums: the first name of a value is the canonical one; later entries are aliases.
template <class E>
struct EnumNames;
template <>
struct EnumNames<LoadFormat> {
  static constexpr std::array<std::pair<LoadFormat, std::string_view>, 4> table{
      {{LoadFormat::Auto, "auto"},
       {LoadFormat::Gguf, "gguf"},
       {LoadFormat::Safetensors, "safetensors"},
       {LoadFormat::Dummy, "dummy"}}};
};
template <>
struct EnumNames<Device> {
  static constexpr std::array<std::pair<Device, std::string_view>, 3> table{
      {{Device::Auto, "auto"}, {Device::Cpu, "cpu"}, {Device::Cuda, "cuda"}}};
};
template <>
struct EnumNames<CpuPrecision> {
  static constexpr std::array<std::pair<CpuPrecision, std::string_view>, 2> table{
      {{CpuPrecision::Fast, "fast"}, {CpuPrecision::Exact, "exact"}}};
};
template <>
struct EnumNames<SpecAlgorithm> {
  static constexpr std::array<std::pair<SpecAlgorithm, std::string_view>, 12> table{
      {{SpecAlgorithm::None, "NONE"},
       {SpecAlgorithm::Eagle, "EAGLE"},
       {SpecAlgorithm::Eagle3, "EAGLE3"},
       {SpecAlgorithm::Mtp, "MTP"},
       {SpecAlgorithm::FrozenKvMtp, "FROZEN_KV_MTP"},
       {SpecAlgorithm::Standalone, "STANDALONE"},
       {SpecAlgorithm::Ngram, "NGRAM"},
       {SpecAlgorithm::Suffix, "SUFFIX"},
       {SpecAlgorithm::Dflash, "DFLASH"},
       {SpecAlgorithm::Dspark, "DSPARK"},
       {SpecAlgorithm::Auto, "AUTO"},
       {SpecAlgorithm::Eagle, "NEXTN"}}};  // NEXTN is sglang's alias of EAGLE
};

template <class E>
std::string_view to_string(E value) {
  for (const auto& [v, name] : EnumNames<E>::table)
    if (v == value) return name;
  return "?";
}

// The draft algorithm a setting names: a built-in (`kind`), or an algorithm a host application
// registered under a name of its own (kind Custom, `custom` = that name in upper case; see
// drafters::register_drafter). Config cannot see the registry (it sits below drafters/), so any
// well-formed name parses; the engine refuses a name nothing is registered for before it loads a model.
// Compares with a SpecAlgorithm by kind.
struct Algorithm {
  SpecAlgorithm kind = SpecAlgorithm::Auto;
  std::string custom;

  Algorithm() = default;
  Algorithm(SpecAlgorithm k) : kind(k) {}  // NOLINT: implicit, so `args.speculative_algorithm = NONE` reads well
  // A built-in's name or alias (any case), else a well-formed custom name: a letter, then letters,
  // digits or '_', at most 48 characters. Empty optional when it is neither.
  static std::optional<Algorithm> parse(std::string_view text);
  // The canonical name: the built-in's first name, or the custom name.
  std::string name() const;

  friend bool operator==(const Algorithm&, const Algorithm&) = default;
  friend bool operator==(const Algorithm& a, SpecAlgorithm k) { return a.kind == k; }
};
inline std::string to_string(const Algorithm& a) { return a.name(); }

using OptInt = std::optional<std::int64_t>;
using OptDouble = std::optional<double>;
using OptString = std::optional<std::string>;
using OptLoadFormat = std::optional<LoadFormat>;

// clang-format off
#define SPECACTOR_SERVER_ARGS(X)                                                                        \
  /* ---- model ---- */                                                                                \
  X(std::string,   model_path,                 "",        "target model: a GGUF file, or a directory with config.json + *.safetensors (alias -m, --model)") \
  X(OptString,     tokenizer_path,             {},        "the tokenizer: a GGUF file, a tokenizer.json (BPE: byte-level, or SentencePiece-style with byte fallback), or a folder holding one; unset = the GGUF model's own, or a safetensors checkpoint's tokenizer.json") \
  X(LoadFormat,    load_format,                LoadFormat::Auto, "weight format of the target: auto|gguf|safetensors|dummy (dummy = random weights, shapes from the file)") \
  X(std::string,   dtype,                      "auto",    "activation dtype: auto|float32 (auto = float32; float16 and bfloat16 are refused: not supported yet)") \
  X(OptInt,        context_length,             {},        "maximum sequence length in tokens; unset = the model's own") \
  X(bool,          allow_context_length_above_model, false, "accept a --context-length above the model's trained length") \
  X(std::string,   json_model_override_args,   "{}",      "JSON object of model hyper-parameters overriding the file's, applied when the model config is built") \
  X(bool,          skip_tokenizer_init,        false,     "do not load a tokenizer; requests must carry token ids") \
  X(std::string,   chat_template,              "auto",    "chat turns: auto (recognised from the model's tokenizer.chat_template: ChatML, Llama-3, Gemma; chat requests are refused when it is absent or not one of them) | chatml | llama3 | gemma | plain (the messages' text, blank lines between)") \
  /* ---- runtime ---- */                                                                              \
  X(Device,        device,                     Device::Auto, "compute device: auto|cpu|cuda (auto = cuda when a usable GPU exists)") \
  X(std::int64_t,  tp_size,                    1,         "tensor-parallel ranks for the target model") \
  X(std::int64_t,  threads,                    0,         "CPU compute threads; 0 = all cores") \
  X(CpuPrecision,  cpu_precision,              CpuPrecision::Fast, "CPU matrix products: fast (int8-quantized activations, integer dot products) | exact (float32 activations, matches a float64 reference to ~1e-5)") \
  X(std::string,   kv_cache_dtype,             "auto",    "KV cache element type: auto|float32|float16|bfloat16 (auto = float16 on the CPU in the fast precision, else float32; CUDA keeps float32)") \
  X(std::int64_t,  page_size,                  16,        "tokens per KV-cache page") \
  X(OptInt,        max_total_tokens,           {},        "KV-cache capacity in tokens over all requests; unset = max(context length, 32768)") \
  X(std::int64_t,  max_running_requests,       32,        "most requests decoded together in one batch") \
  X(std::int64_t,  chunked_prefill_size,       2048,      "most prompt tokens prefilled per step (longer prompts are chunked)") \
  X(bool,          disable_chunked_prefix_cache, false,   "sglang's chunked-prefix cache for MLA models (refused: specactor's prefix cache is the radix cache)") \
  X(bool,          disable_radix_cache,        false,     "do not share the KV of earlier requests' prompts and answers (the prefix cache)") \
  X(bool,          disable_cuda_graph,         false,     "--device cuda: run decode/verify steps kernel by kernel instead of as captured CUDA graphs") \
  X(std::string,   attention_backend,          "auto",    "attention kernels: auto|cpu|cuda (auto = follow --device)") \
  X(OptString,     prefill_attention_backend,  {},        "attention kernels for prefill only; unset = --attention-backend") \
  X(OptString,     decode_attention_backend,   {},        "attention kernels for decode only; unset = --attention-backend") \
  X(std::int64_t,  random_seed,                0,         "seed for sampling when a request gives none") \
  X(std::string,   log_level,                  "info",    "log level: trace|debug|info|warn|error|off") \
  /* ---- speculative decoding ---- */                                                                 \
  X(Algorithm,     speculative_algorithm,      SpecAlgorithm::Auto, "AUTO|NONE|EAGLE|EAGLE3|NEXTN (= EAGLE)|MTP|FROZEN_KV_MTP|STANDALONE|NGRAM|SUFFIX|DFLASH|DSPARK, or a name a host application registered (drafters::register_drafter); AUTO = EAGLE3 with the head shipped for the model when one ships (SmolLM2-135M-Instruct), else NONE") \
  X(bool,          speculative_adaptive,       true,      "a measured cost model and an online acceptance model choose, every step, how deep each request drafts and which nodes are verified (0 when it would not pay); false = the fixed shape every step") \
  X(std::string,   speculative_budget_cache,   "",        "folder where the adaptive budget keeps what it learned across engine starts (acceptance by draft score and depth, draft-round cost, measured gain per batch size), one small file per CPU, model, drafter and shape; empty = $XDG_CACHE_HOME/specactor/budget, else ~/.cache/specactor/budget; none = learn from nothing at every start") \
  X(OptString,     speculative_draft_model_path, {},      "draft model or head (EAGLE/EAGLE3/MTP head, standalone draft GGUF)") \
  X(OptLoadFormat, speculative_draft_load_format, {},     "weight format of the draft; unset = the target's") \
  X(std::string,   speculative_draft_worker,   "",        "HOST:PORT of a `specactor worker --role draft`: the draft worker runs in that process (the draft snapshot is derived here and sent; hidden rows travel with each proposal round); empty = in this process") \
  X(OptString,     speculative_draft_worker_tls_certificate, {}, "with --speculative-draft-worker: this engine's certificate (PEM) for TLS to the draft host") \
  X(OptString,     speculative_draft_worker_tls_key, {},  "with --speculative-draft-worker: its private key (PEM)") \
  X(OptString,     speculative_draft_worker_tls_ca, {},   "with --speculative-draft-worker: the CA (PEM) the draft host's certificate must chain to") \
  X(OptString,     speculative_draft_worker_secret_file, {}, "with --speculative-draft-worker, without TLS: the file with the cluster secret the draft host asks for (default ~/.config/specactor/cluster-secret; none: a host started with --insecure)") \
  X(OptInt,        speculative_num_steps,      {},        "draft steps per speculative step (tree depth; DFLASH/DSPARK: the chain's drafts, and the mask rows a block runs after the root); unset = automatic") \
  X(OptInt,        speculative_eagle_topk,     {},        "branches kept per draft step (DFLASH, DSPARK: first drafts proposed, the argmax continuing the chain); 1 = chain; unset = automatic") \
  X(OptInt,        speculative_num_draft_tokens, {},      "tree nodes verified per step, root included; unset = automatic") \
  X(OptDouble,     speculative_draft_p_min,    {},        "head drafters: propose only draft tokens whose path probability under the head (the product of its probabilities from the root) reaches this, and stop drafting when no branch does; 0 = the full shape; unset = automatic (0, or the shipped head's measured value)") \
  X(OptInt,        speculative_draft_ngram_tokens, {},    "model drafters (heads, DFLASH, DSPARK): add to each proposal a prompt-lookup branch of up to N tokens (what followed the latest earlier occurrence of the sequence's last tokens), merged into the drafter's tree: nodes the drafter proposed too cost nothing, new ones are verified on top of --speculative-num-draft-tokens and may reach deeper than --speculative-num-steps; 0 = off; unset = automatic (0, or the shipped head's measured value)") \
  X(OptInt,        speculative_draft_ngram_min_match, {}, "model drafters' prompt-lookup branch: the fewest last tokens that must recur earlier in the sequence (default 2)") \
  X(double,        speculative_accept_threshold_single, 1.0, "sglang's relaxed acceptance (lossy below 1): only 1 is accepted, verification is lossless") \
  X(double,        speculative_accept_threshold_acc, 1.0, "sglang's relaxed acceptance (lossy below 1): only 1 is accepted, verification is lossless") \
  X(OptString,     speculative_token_map,      {},        "hot-vocabulary file (FR-Spec): the draft's output head keeps only these token ids") \
  X(OptString,     speculative_draft_attention_backend, {}, "attention kernels of the draft; unset = the target's") \
  X(OptString,     speculative_draft_kv_cache_dtype, {},  "KV cache element type of the draft's own cache: auto|float32|float16|bfloat16; unset or auto = the target's") \
  X(std::string,   speculative_draft_quantization, "auto", "head drafters in the fast precision: the integer format float head weights are quantized to at load, q8_0|q4_1|none (none = keep them in float); auto = q8_0, or the shipped head's measured choice") \
  X(bool,          speculative_use_rejection_sampling, false, "chain rejection sampling with the draft's probabilities (topk = 1 drafters that sample)") \
  X(OptInt,        speculative_draft_num_layers, {},      "STANDALONE self-speculation: run only the target's first K layers as the draft") \
  X(std::int64_t,  speculative_ngram_min_match_window_size, 1, "NGRAM: shortest suffix matched against the context") \
  X(std::int64_t,  speculative_ngram_max_match_window_size, 12, "NGRAM (and the head drafters' prompt-lookup branch): longest suffix matched against the context") \
  X(std::int64_t,  speculative_ngram_max_bfs_breadth, 4,  "NGRAM: most candidate continuations sharing the root (1 = chain)") \
  X(OptString,     speculative_ngram_corpus_path, {},     "NGRAM: extra text corpus to match against, indexed once at start-up") \
  X(std::int64_t,  speculative_suffix_cache_tokens, 262144, "SUFFIX (and --speculative-draft-suffix-tokens): tokens of earlier requests' prompts and outputs kept to draft from; the oldest request goes first") \
  X(std::int64_t,  speculative_suffix_min_match, 3,       "SUFFIX: fewest last tokens that must match an earlier request (or earlier in this one)") \
  X(std::int64_t,  speculative_suffix_max_match, 32,      "SUFFIX: longest suffix matched") \
  X(OptInt,        speculative_draft_suffix_tokens, {},   "model drafters (heads, DFLASH, DSPARK): add a branch of up to N tokens drafted from earlier requests (as SUFFIX does), merged into the drafter's tree; 0 = off; unset = 0") \
  /* ---- server ---- */                                                                               \
  X(std::string,   host,                       "127.0.0.1", "HTTP server address") \
  X(std::int64_t,  port,                       30000,     "HTTP server port")
// clang-format on

// One entry of a snapshot's override log: who changed which fields to what.
struct OverrideEntry {
  std::string source;     // e.g. "user.argv", "load.model_config", "draft.per_runner"
  nlohmann::json fields;  // {field_name: new value, ...}
};

struct ServerArgs {
#define SPECACTOR_DECLARE_FIELD(type, name, def, doc) type name = def;
  SPECACTOR_SERVER_ARGS(SPECACTOR_DECLARE_FIELD)
#undef SPECACTOR_DECLARE_FIELD

  // Provenance, not a setting: excluded from the content hash and from settings equality.
  std::vector<OverrideEntry> override_log;
};

// Calls f(name, doc, member) for every setting, in declaration order.
template <class Args, class F>
void for_each_field(Args& args, F&& f) {
#define SPECACTOR_VISIT_FIELD(type, name, def, doc) f(std::string_view{#name}, std::string_view{doc}, args.name);
  SPECACTOR_SERVER_ARGS(SPECACTOR_VISIT_FIELD)
#undef SPECACTOR_VISIT_FIELD
}

// "speculative_num_steps" -> "--speculative-num-steps"
std::string flag_name(std::string_view field);

// Names of all settings in declaration order.
const std::vector<std::string>& field_names();

// Settings as a JSON object {field: value} (unset optionals are null).
nlohmann::json settings_to_json(const ServerArgs& args);

// Sets one field from JSON. Throws ConfigError naming `where` (a flag, file or source) when the
// field is unknown or the value has the wrong type.
void set_field(ServerArgs& args, std::string_view field, const nlohmann::json& value, std::string_view where);

// Parses a command-line value for one field ("4", "true", "EAGLE", ...) into JSON of the right type.
nlohmann::json parse_field_text(std::string_view field, std::string_view text);

// True when the field is a plain bool (a bare `--flag` means true).
bool is_bool_field(std::string_view field);

// Same settings (override logs ignored).
bool same_settings(const ServerArgs& a, const ServerArgs& b);

// Checks every range and combination rule; throws ConfigError naming the first offending flag.
void validate(const ServerArgs& args);

// The defaults of the automatic choice of (steps, topk, draft tokens).
struct SpecShape {
  std::int64_t num_steps, eagle_topk, num_draft_tokens;
};
SpecShape auto_spec_shape(const Algorithm& algo, bool llama_family_target);

// Does this algorithm load a draft model/head from --speculative-draft-model-path?
bool needs_draft_model(const ServerArgs& args);

// Is this algorithm one of the head drafters (EAGLE, EAGLE3, MTP, FROZEN_KV_MTP)?
bool is_head_drafter(const Algorithm& algo);
// DFLASH and DSPARK: one forward pass drafts a whole block.
bool is_block_drafter(const Algorithm& algo);

}  // namespace specactor::config
