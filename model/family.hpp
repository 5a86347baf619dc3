// model/family.hpp — what sets the decoder families apart, in one table the loaders and every forward
// pass read (never a copy of the forward per family).
//
//   llama   the reference: RMSNorm before attention and MLP, SiLU-gated MLP, RoPE
//   qwen2   + biases on the q, k and v projections
//   qwen3   + RMSNorm over each head of q and k before RoPE (no biases)
//   gemma3  + q/k head norms, norms after attention and after the MLP as well, GELU (tanh) gated MLP,
//           embeddings × √hidden, sliding-window layers between global ones (each kind with its own
//           RoPE base), tied output head; Hugging Face stores its RMSNorm scales as w for (1 + w)
//           (GGUF files store 1 + w, which is what the forward uses either way)
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace specactor::model {

enum class Family : std::uint8_t { Llama, Qwen2, Qwen3, Gemma3 };

struct FamilyDesc {
  Family family = Family::Llama;
  std::string_view name;          // GGUF general.architecture (and what the engine reports)
  std::string_view hf_types;      // config.json model_type values read as this family, space separated
  bool qkv_bias = false;          // q/k/v projections carry biases
  bool qk_norm = false;           // RMSNorm over each head of q and k (head_dim weights) before RoPE
  bool sandwich_norms = false;    // also RMSNorm the attention output and the MLP output before the residual
  bool hf_norm_plus_one = false;  // Hugging Face RMSNorm scales are stored as w and applied as (1 + w)
  bool gelu_tanh = false;         // GELU (tanh approximation) gates the MLP instead of SiLU
  bool embed_scale = false;       // token embeddings are multiplied by √hidden
  bool gguf_neox = false;         // GGUF keeps Hugging Face's half-split RoPE pairs (llama's converter permutes)
  bool sliding_layers = false;    // sliding-window attention on most layers (gemma3: 5 of every 6)
  bool hf_tied_default = false;   // config.json without tie_word_embeddings: tied or not
  // Hugging Face tensor names of the norms after `model.layers.N.` (GGUF: attn_norm, ffn_norm,
  // post_attention_norm, post_ffw_norm).
  std::string_view hf_ffn_norm = "post_attention_layernorm.weight";
  std::string_view hf_post_attn_norm;  // sandwich norms only
  std::string_view hf_post_ffn_norm;
};

const FamilyDesc& describe(Family f);
// nullptr when the GGUF architecture / the config.json model_type is not one the engine runs.
const FamilyDesc* family_from_gguf(std::string_view architecture);
const FamilyDesc* family_from_hf(std::string_view model_type);
// "llama, qwen2, qwen3, gemma3": for errors that name what is supported.
std::string supported_architectures();

}  // namespace specactor::model
