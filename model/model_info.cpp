// model/model_info.cpp — ModelInfo from GGUF metadata, with the checks a forward pass relies on.
#include "model/model_info.hpp"

#include <cmath>
#include <cstdio>
#include <map>

namespace specactor::model {

std::string_view to_string(TokenizerKind k) {
  switch (k) {
    case TokenizerKind::Gpt2ByteBpe:
      return "gpt2-byte-bpe";
    case TokenizerKind::SentencePieceBpe:
      return "sentencepiece-bpe";
    case TokenizerKind::None:
      return "none";
  }
  return "none";
}

bool is_llama_family(std::string_view architecture) { return family_from_gguf(architecture) != nullptr; }

std::string bad_rope_base(double v) {
  // Below 1 the rotation frequencies grow with the dimension instead of falling (1e-300 made every
  // angle infinite); no model uses such a base.
  if (v >= 1.0 && std::isfinite(v)) return "";
  char got[32];
  std::snprintf(got, sizeof got, "%g", v);
  return std::string("must be a finite number of at least 1 (got ") + got + ")";
}

std::string bad_norm_eps(double v) {
  if (v >= 1e-12 && v < 1.0) return "";
  char got[32];
  std::snprintf(got, sizeof got, "%g", v);
  return std::string("must be in (0, 1), and at least 1e-12 (got ") + got + ")";
}

ModelInfo read_model_info(const GgufFile& f) {
  auto fail = [&](const std::string& what) -> void { throw GgufError(f.path() + ": " + what); };
  ModelInfo m;
  m.path = f.path();
  m.architecture = std::string(f.get_string("general.architecture"));
  const FamilyDesc* fam = family_from_gguf(m.architecture);
  if (!fam)
    fail("architecture '" + m.architecture + "' is not supported (supported: " + supported_architectures() + ")");
  m.family = fam->family;
  if (f.has("general.name")) m.name = std::string(f.get_string("general.name"));
  const std::string a = m.architecture + ".";

  auto positive = [&](const std::string& key) {
    const std::int64_t v = f.get_int(key);
    if (v <= 0) fail("metadata '" + key + "' = " + std::to_string(v) + ", expected a positive integer");
    return v;
  };
  m.context_length = positive(a + "context_length");
  m.num_layers = positive(a + "block_count");
  m.hidden_size = positive(a + "embedding_length");
  m.ffn_hidden_size = positive(a + "feed_forward_length");
  m.num_heads = positive(a + "attention.head_count");
  m.num_kv_heads = f.has(a + "attention.head_count_kv") ? positive(a + "attention.head_count_kv") : m.num_heads;
  if (f.has(a + "attention.key_length")) {  // qwen3, gemma3: heads wider than hidden / heads
    m.head_dim = positive(a + "attention.key_length");
    if (f.has(a + "attention.value_length") && f.get_int(a + "attention.value_length") != m.head_dim)
      fail("attention.value_length " + std::to_string(f.get_int(a + "attention.value_length")) +
           " differs from attention.key_length " + std::to_string(m.head_dim) + " (not supported)");
  } else {
    if (m.hidden_size % m.num_heads != 0)
      fail("embedding_length " + std::to_string(m.hidden_size) + " is not divisible by head_count " +
           std::to_string(m.num_heads));
    m.head_dim = m.hidden_size / m.num_heads;
  }
  if (m.head_dim % 2 != 0 || m.head_dim > 512)
    fail("the head size " + std::to_string(m.head_dim) + " must be even and at most 512");
  if (m.num_heads % m.num_kv_heads != 0)
    fail("head_count " + std::to_string(m.num_heads) + " is not divisible by head_count_kv " +
         std::to_string(m.num_kv_heads));
  m.rope_dim = f.has(a + "rope.dimension_count") ? positive(a + "rope.dimension_count") : m.head_dim;
  if (m.rope_dim > m.head_dim || m.rope_dim % 2 != 0)
    fail("rope.dimension_count " + std::to_string(m.rope_dim) + " must be even and at most the head size " +
         std::to_string(m.head_dim));
  if (f.has(a + "rope.freq_base")) m.rope_base = f.get_float(a + "rope.freq_base");
  if (const auto why = bad_rope_base(m.rope_base); !why.empty()) fail("rope.freq_base " + why);
  m.norm_eps = f.get_float(a + "attention.layer_norm_rms_epsilon");
  if (const auto why = bad_norm_eps(m.norm_eps); !why.empty()) fail("attention.layer_norm_rms_epsilon " + why);
  if (f.has(a + "rope.scaling.type")) {
    const std::string_view type = f.get_string(a + "rope.scaling.type");
    if (type == "linear" && f.has(a + "rope.scaling.factor")) {
      m.rope_linear_factor = f.get_float(a + "rope.scaling.factor");
      if (!(m.rope_linear_factor >= 1.0 && m.rope_linear_factor <= 1024.0))
        fail("rope.scaling.factor must be in [1, 1024]");
    } else if (type != "none") {
      fail("rope.scaling.type '" + std::string(type) + "' is not supported (supported: none, linear)");
    }
  }
  if (fam->sliding_layers) {
    // Gemma 3: layers 0-4 slide, layer 5 is global, and so on (llama.cpp writes only the window; the
    // pattern and the local RoPE base are the family's, unless the file names them).
    m.sliding_window = positive(a + "attention.sliding_window");
    const std::int64_t pattern =
        f.has(a + "attention.sliding_window_pattern") ? positive(a + "attention.sliding_window_pattern") : 6;
    for (std::int64_t l = 0; l < m.num_layers; ++l) m.sliding_layers.push_back((l + 1) % pattern != 0 ? 1 : 0);
    m.rope_base_local = f.has(a + "rope.freq_base_swa") ? f.get_float(a + "rope.freq_base_swa") : 10000.0;
    if (const auto why = bad_rope_base(m.rope_base_local); !why.empty()) fail("rope.freq_base_swa " + why);
  }

  if (f.has("tokenizer.ggml.model")) {
    const std::string_view tk = f.get_string("tokenizer.ggml.model");
    if (tk == "gpt2")
      m.tokenizer = TokenizerKind::Gpt2ByteBpe;
    else if (tk == "llama")
      m.tokenizer = TokenizerKind::SentencePieceBpe;
    else
      fail("tokenizer.ggml.model '" + std::string(tk) + "' is not supported (supported: gpt2, llama)");
    if (f.has("tokenizer.ggml.pre")) m.tokenizer_pre = std::string(f.get_string("tokenizer.ggml.pre"));
    if (f.has("tokenizer.ggml.bos_token_id")) m.bos_token_id = f.get_int("tokenizer.ggml.bos_token_id");
    if (f.has("tokenizer.ggml.eos_token_id")) m.eos_token_id = f.get_int("tokenizer.ggml.eos_token_id");
  }

  // Vocabulary: explicit key, else the tokenizer's token list, else the embedding's row count.
  const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
  if (f.has(a + "vocab_size"))
    m.vocab_size = positive(a + "vocab_size");
  else if (f.has("tokenizer.ggml.tokens"))
    m.vocab_size = static_cast<std::int64_t>(f.get_string_array("tokenizer.ggml.tokens").size());
  else if (embd && embd->dims.size() == 2)
    m.vocab_size = static_cast<std::int64_t>(embd->dims[1]);
  if (m.vocab_size <= 0)
    fail("cannot tell the vocabulary size (no vocab_size, tokenizer.ggml.tokens or token_embd.weight)");
  if (f.has("tokenizer.ggml.tokens")) {
    const auto n = static_cast<std::int64_t>(f.get_string_array("tokenizer.ggml.tokens").size());
    if (n != m.vocab_size)
      fail("tokenizer.ggml.tokens has " + std::to_string(n) + " entries but the vocabulary size is " +
           std::to_string(m.vocab_size));
  }
  for (auto [key, id] : {std::pair{"bos_token_id", m.bos_token_id}, std::pair{"eos_token_id", m.eos_token_id}})
    if (id >= m.vocab_size)
      fail(std::string("tokenizer.ggml.") + key + " = " + std::to_string(id) + " is outside the vocabulary");

  m.tied_embeddings = f.find_tensor("output.weight") == nullptr;
  std::map<std::string, int> counts;
  for (const auto& t : f.tensors()) {
    counts[std::string(ggml_type_info(static_cast<std::uint32_t>(t.type))->name)]++;
    m.tensor_bytes += t.n_bytes;
  }
  m.n_tensors = f.tensors().size();
  for (const auto& [name, n] : counts)
    m.weight_types += (m.weight_types.empty() ? "" : " ") + name + ":" + std::to_string(n);
  return m;
}

config::ModelFacts ModelInfo::facts() const {
  return {architecture,
          context_length,
          vocab_size,
          hidden_size,
          num_layers,
          is_llama_family(architecture),
          num_heads,
          num_kv_heads,
          ffn_hidden_size,
          /*shipped_eagle3_head=*/{},
          /*shipped_head_defaults=*/{},
          /*shipped_block_drafter=*/{}};
}

nlohmann::json ModelInfo::to_json() const {
  return {{"path", path},
          {"architecture", architecture},
          {"name", name},
          {"context_length", context_length},
          {"vocab_size", vocab_size},
          {"num_layers", num_layers},
          {"hidden_size", hidden_size},
          {"ffn_hidden_size", ffn_hidden_size},
          {"num_heads", num_heads},
          {"num_kv_heads", num_kv_heads},
          {"head_dim", head_dim},
          {"rope_dim", rope_dim},
          {"rope_base", rope_base},
          {"norm_eps", norm_eps},
          {"tokenizer", std::string(to_string(tokenizer))},
          {"tokenizer_pre", tokenizer_pre},
          {"bos_token_id", bos_token_id},
          {"eos_token_id", eos_token_id},
          {"tied_embeddings", tied_embeddings},
          {"weight_types", weight_types},
          {"n_tensors", n_tensors},
          {"tensor_bytes", tensor_bytes}};
}

}  // namespace specactor::model
