// model/model_info.hpp — the hyper-parameters of a decoder model (model/family.hpp: llama, qwen2, qwen3,
// gemma3), read from GGUF metadata or a Hugging Face config.json.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "config/resolve.hpp"
#include "model/family.hpp"
#include "model/gguf.hpp"

namespace specactor::model {

enum class TokenizerKind { Gpt2ByteBpe, SentencePieceBpe, None };
std::string_view to_string(TokenizerKind k);

struct ModelInfo {
  std::string path;
  std::string architecture;          // general.architecture, e.g. "llama"
  Family family = Family::Llama;     // what the forward does differently (model/family.hpp)
  std::string name;                  // general.name (may be empty)
  std::int64_t context_length = 0;   // {arch}.context_length, tokens
  std::int64_t vocab_size = 0;       // {arch}.vocab_size, else the tokenizer's token count
  std::int64_t num_layers = 0;       // {arch}.block_count
  std::int64_t hidden_size = 0;      // {arch}.embedding_length
  std::int64_t ffn_hidden_size = 0;  // {arch}.feed_forward_length
  std::int64_t num_heads = 0;        // {arch}.attention.head_count
  std::int64_t num_kv_heads = 0;     // {arch}.attention.head_count_kv (default: num_heads)
  std::int64_t head_dim = 0;         // {arch}.attention.key_length, else hidden_size / num_heads
  std::int64_t rope_dim = 0;         // {arch}.rope.dimension_count (default: head_dim)
  double rope_base = 10000.0;        // {arch}.rope.freq_base
  double norm_eps = 1e-5;            // {arch}.attention.layer_norm_rms_epsilon
  // Sliding-window attention (gemma3): layer l attends to the last `sliding_window` positions when
  // sliding_layers[l] is 1; those layers rotate with rope_base_local. Empty = every layer global.
  std::int64_t sliding_window = 0;
  std::vector<std::uint8_t> sliding_layers;
  double rope_base_local = 0.0;
  double rope_linear_factor = 1.0;                // linear RoPE scaling of the global layers (positions ÷ factor)
  double attn_scale = 0.0;                        // query scale; 0 = 1/√head_dim
  TokenizerKind tokenizer = TokenizerKind::None;  // from tokenizer.ggml.model: gpt2 | llama
  std::string tokenizer_pre;                      // tokenizer.ggml.pre (pre-tokenizer flavour), may be empty
  std::int64_t bos_token_id = -1;
  std::int64_t eos_token_id = -1;
  bool tied_embeddings = false;  // no output.weight: the token embedding doubles as the output head
  std::string weight_types;      // e.g. "Q4_1:210 F32:61 Q8_0:1"
  std::uint64_t n_tensors = 0;
  std::uint64_t tensor_bytes = 0;  // bytes of tensor data (what a forward pass streams)

  config::ModelFacts facts() const;
  nlohmann::json to_json() const;
};

// The decoder architectures the engine runs (llama and the families of model/family.hpp).
bool is_llama_family(std::string_view architecture);

// Reads and checks the hyper-parameters. Throws GgufError naming the file and key.
ModelInfo read_model_info(const GgufFile& file);

// What a RoPE base and an RMSNorm epsilon must be, for models, heads and overrides alike: "" when the
// value is fine, else what was expected. The epsilon is used in float32, so a denormal (1e-45) is as
// good as 0 and is refused.
std::string bad_rope_base(double v);  // a finite positive number
std::string bad_norm_eps(double v);   // in [1e-12, 1)

}  // namespace specactor::model
