#include "tests/support/gguf_writer.hpp"

#include <cstring>
#include <fstream>
#include <random>
#include <stdexcept>

namespace specactor::testing {
GgufWriter tiny_llama(const TinyLlamaShape& s, bool with_tensors, std::uint32_t seed) {
  GgufWriter w;
  w.kv_str("general.architecture", "llama");
  w.kv_str("general.name", "tiny-llama-test");
  w.kv_u32("llama.context_length", s.context);
  w.kv_u32("llama.embedding_length", s.hidden);
  w.kv_u32("llama.feed_forward_length", s.ffn);
  w.kv_u32("llama.block_count", s.layers);
  w.kv_u32("llama.attention.head_count", s.heads);
  w.kv_u32("llama.attention.head_count_kv", s.kv_heads);
  w.kv_f32("llama.rope.freq_base", s.rope_base);
  w.kv_f32("llama.attention.layer_norm_rms_epsilon", s.norm_eps);
  w.kv_str("tokenizer.ggml.model", "gpt2");
  std::vector<std::string> tokens;
  if (s.text_vocab) {
    tokens = {"<unk>", "<s>", "</s>", "\u0120"};
    for (char c = 'a'; c <= 'z'; ++c) tokens.emplace_back(1, c);
    for (char c = 'A'; c <= 'Z'; ++c) tokens.emplace_back(1, c);
    for (char c = '0'; c <= '9'; ++c) tokens.emplace_back(1, c);
  }
  for (auto i = static_cast<std::uint32_t>(tokens.size()); i < s.vocab; ++i)
    tokens.push_back(std::string("t").append(std::to_string(i)));
  tokens.resize(s.vocab);
  w.kv_str_array("tokenizer.ggml.tokens", tokens);
  w.kv_str_array("tokenizer.ggml.merges", {"t 1", "t 2"});
  w.kv_u32("tokenizer.ggml.bos_token_id", 1);
  w.kv_u32("tokenizer.ggml.eos_token_id", 2);
  if (!with_tensors) return w;
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  auto f32 = [&](std::string_view name, std::vector<std::uint64_t> dims, bool ones = false) {
    std::uint64_t n = 1;
    for (auto d : dims) n *= d;
    std::vector<std::uint8_t> data(n * 4);
    for (std::uint64_t i = 0; i < n; ++i) {
      const float v = ones ? 1.0f : dist(rng);
      std::memcpy(data.data() + 4 * i, &v, 4);
    }
    w.tensor(name, 0, std::move(dims), std::move(data));
  };
  const std::uint64_t hd = s.hidden / s.heads;
  f32("token_embd.weight", {s.hidden, s.vocab});
  for (std::uint32_t l = 0; l < s.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    f32(p + "attn_norm.weight", {s.hidden}, true);
    f32(p + "attn_q.weight", {s.hidden, s.hidden});
    f32(p + "attn_k.weight", {s.hidden, hd * s.kv_heads});
    f32(p + "attn_v.weight", {s.hidden, hd * s.kv_heads});
    f32(p + "attn_output.weight", {s.hidden, s.hidden});
    f32(p + "ffn_norm.weight", {s.hidden}, true);
    f32(p + "ffn_gate.weight", {s.hidden, s.ffn});
    f32(p + "ffn_up.weight", {s.hidden, s.ffn});
    f32(p + "ffn_down.weight", {s.ffn, s.hidden});
  }
  f32("output_norm.weight", {s.hidden}, true);
  return w;
}

}  // namespace specactor::testing

#include <nlohmann/json.hpp>

namespace specactor::testing {

TinyPair tiny_llama_pair(const TinyLlamaShape& s, std::uint32_t seed) {
  TinyPair p;
  p.gguf = tiny_llama(s, false);
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  const std::uint64_t hd = s.hidden / s.heads, kvd = hd * s.kv_heads;
  auto rnd = [&](std::vector<std::uint64_t> shape, bool ones = false) {
    HfTensor t{shape, {}};
    std::uint64_t n = 1;
    for (auto d : shape) n *= d;
    t.values.resize(n);
    for (auto& v : t.values) v = ones ? 1.0f + 0.1f * dist(rng) : dist(rng);
    return t;
  };
  auto to_gguf = [&](const std::string& name, const HfTensor& t) {
    std::vector<std::uint8_t> bytes(t.values.size() * 4);
    std::memcpy(bytes.data(), t.values.data(), bytes.size());
    std::vector<std::uint64_t> dims(t.shape.rbegin(), t.shape.rend());
    p.gguf.tensor(name, 0, dims, std::move(bytes));
  };
  // llama.cpp's conversion: within each head, rows (half, i) become (i, half).
  auto permute = [&](const HfTensor& t, std::uint64_t n_head) {
    HfTensor o = t;
    const std::uint64_t in = t.shape[1], rows_per_head = t.shape[0] / n_head, half = rows_per_head / 2;
    for (std::uint64_t h = 0; h < n_head; ++h)
      for (std::uint64_t hf = 0; hf < 2; ++hf)
        for (std::uint64_t i = 0; i < half; ++i) {
          const std::uint64_t src = h * rows_per_head + hf * half + i, dst = h * rows_per_head + 2 * i + hf;
          std::memcpy(&o.values[dst * in], &t.values[src * in], in * 4);
        }
    return o;
  };
  auto add = [&](const std::string& hf_name, const std::string& gguf_name, HfTensor t,
                 std::uint64_t permute_heads = 0) {
    to_gguf(gguf_name, permute_heads ? permute(t, permute_heads) : t);
    p.hf.emplace_back(hf_name, std::move(t));
  };
  add("model.embed_tokens.weight", "token_embd.weight", rnd({s.vocab, s.hidden}));
  for (std::uint32_t l = 0; l < s.layers; ++l) {
    const std::string h = "model.layers." + std::to_string(l) + ".", g = "blk." + std::to_string(l) + ".";
    add(h + "input_layernorm.weight", g + "attn_norm.weight", rnd({s.hidden}, true));
    add(h + "self_attn.q_proj.weight", g + "attn_q.weight", rnd({s.hidden, s.hidden}), s.heads);
    add(h + "self_attn.k_proj.weight", g + "attn_k.weight", rnd({kvd, s.hidden}), s.kv_heads);
    add(h + "self_attn.v_proj.weight", g + "attn_v.weight", rnd({kvd, s.hidden}));
    add(h + "self_attn.o_proj.weight", g + "attn_output.weight", rnd({s.hidden, s.hidden}));
    add(h + "post_attention_layernorm.weight", g + "ffn_norm.weight", rnd({s.hidden}, true));
    add(h + "mlp.gate_proj.weight", g + "ffn_gate.weight", rnd({s.ffn, s.hidden}));
    add(h + "mlp.up_proj.weight", g + "ffn_up.weight", rnd({s.ffn, s.hidden}));
    add(h + "mlp.down_proj.weight", g + "ffn_down.weight", rnd({s.hidden, s.ffn}));
  }
  add("model.norm.weight", "output_norm.weight", rnd({s.hidden}, true));
  add("lm_head.weight", "output.weight", rnd({s.vocab, s.hidden}));
  p.config_json = nlohmann::json{
      {"model_type", "llama"},
      {"architectures", {"LlamaForCausalLM"}},
      {"hidden_size", s.hidden},
      {"intermediate_size", s.ffn},
      {"num_hidden_layers", s.layers},
      {"num_attention_heads", s.heads},
      {"num_key_value_heads", s.kv_heads},
      {"vocab_size", s.vocab},
      {"max_position_embeddings", s.context},
      {"rms_norm_eps", 1e-5},
      {"rope_theta", 10000.0},
      {"tie_word_embeddings",
       false}}.dump(2);
  return p;
}

}  // namespace specactor::testing
