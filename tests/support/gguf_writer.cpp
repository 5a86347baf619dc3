#include "tests/support/gguf_writer.hpp"

#include <cstring>
#include <fstream>
#include <random>
#include <stdexcept>

namespace specactor::testing {
namespace {

template <class T> void put(std::vector<std::uint8_t>& out, T v) {
  const std::size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}
void put_str(std::vector<std::uint8_t>& out, std::string_view s) {
  put<std::uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

}  // namespace

std::uint64_t ggml_nbytes(std::uint32_t type, const std::vector<std::uint64_t>& dims) {
  std::uint64_t n = 1;
  for (auto d : dims) n *= d;
  switch (type) {
    case 0: return n * 4;               // F32
    case 1: case 30: return n * 2;      // F16, BF16
    case 2: return n / 32 * 18;         // Q4_0
    case 3: return n / 32 * 20;         // Q4_1
    case 8: return n / 32 * 34;         // Q8_0
    case 12: return n / 256 * 144;      // Q4_K
    case 14: return n / 256 * 210;      // Q6_K
    default: return 0;
  }
}

void GgufWriter::kv_raw(std::string_view key, std::uint32_t type, const std::vector<std::uint8_t>& value_bytes) {
  put_str(kv_, key);
  put<std::uint32_t>(kv_, type);
  kv_.insert(kv_.end(), value_bytes.begin(), value_bytes.end());
  ++kv_count_;
}

#define SPECACTOR_KV_SCALAR(fn, T, tag)                        \
  void GgufWriter::fn(std::string_view key, T v) {             \
    std::vector<std::uint8_t> b;                               \
    put<T>(b, v);                                              \
    kv_raw(key, tag, b);                                       \
  }
SPECACTOR_KV_SCALAR(kv_u8, std::uint8_t, 0)
SPECACTOR_KV_SCALAR(kv_u32, std::uint32_t, 4)
SPECACTOR_KV_SCALAR(kv_i32, std::int32_t, 5)
SPECACTOR_KV_SCALAR(kv_f32, float, 6)
SPECACTOR_KV_SCALAR(kv_u64, std::uint64_t, 10)
#undef SPECACTOR_KV_SCALAR

void GgufWriter::kv_bool(std::string_view key, bool v) { kv_raw(key, 7, {static_cast<std::uint8_t>(v ? 1 : 0)}); }

void GgufWriter::kv_str(std::string_view key, std::string_view v) {
  std::vector<std::uint8_t> b;
  put_str(b, v);
  kv_raw(key, 8, b);
}

void GgufWriter::kv_str_array(std::string_view key, const std::vector<std::string>& v) {
  std::vector<std::uint8_t> b;
  put<std::uint32_t>(b, 8);
  put<std::uint64_t>(b, v.size());
  for (const auto& s : v) put_str(b, s);
  kv_raw(key, 9, b);
}

void GgufWriter::kv_i32_array(std::string_view key, const std::vector<std::int32_t>& v) {
  std::vector<std::uint8_t> b;
  put<std::uint32_t>(b, 5);
  put<std::uint64_t>(b, v.size());
  for (auto x : v) put<std::int32_t>(b, x);
  kv_raw(key, 9, b);
}

void GgufWriter::kv_f32_array(std::string_view key, const std::vector<float>& v) {
  std::vector<std::uint8_t> b;
  put<std::uint32_t>(b, 6);
  put<std::uint64_t>(b, v.size());
  for (auto x : v) put<float>(b, x);
  kv_raw(key, 9, b);
}

void GgufWriter::tensor(std::string_view name, std::uint32_t ggml_type, std::vector<std::uint64_t> dims,
                        std::vector<std::uint8_t> data, std::int64_t offset_override) {
  if (data.empty()) data.assign(ggml_nbytes(ggml_type, dims), 0);
  tensors_.push_back({std::string(name), ggml_type, std::move(dims), std::move(data), offset_override});
}

bool GgufWriter::remove_tensor(std::string_view name) {
  for (auto it = tensors_.begin(); it != tensors_.end(); ++it)
    if (it->name == name) {
      tensors_.erase(it);
      return true;
    }
  return false;
}

bool GgufWriter::reshape_tensor(std::string_view name, std::vector<std::uint64_t> dims) {
  for (auto& t : tensors_)
    if (t.name == name) {
      t.data.assign(ggml_nbytes(t.type, dims), 0);
      t.dims = std::move(dims);
      return true;
    }
  return false;
}

std::vector<std::uint8_t> GgufWriter::bytes() const {
  std::vector<std::uint8_t> out;
  put<std::uint32_t>(out, magic);
  put<std::uint32_t>(out, version);
  put<std::uint64_t>(out, tensors_.size());
  put<std::uint64_t>(out, kv_count_);
  out.insert(out.end(), kv_.begin(), kv_.end());
  std::vector<std::uint64_t> offsets;
  std::uint64_t next = 0;
  for (const auto& t : tensors_) {
    offsets.push_back(next);
    next += (t.data.size() + alignment - 1) / alignment * alignment;
  }
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    const auto& t = tensors_[i];
    put_str(out, t.name);
    put<std::uint32_t>(out, static_cast<std::uint32_t>(t.dims.size()));
    for (auto d : t.dims) put<std::uint64_t>(out, d);
    put<std::uint32_t>(out, t.type);
    put<std::uint64_t>(out, t.offset_override >= 0 ? static_cast<std::uint64_t>(t.offset_override) : offsets[i]);
  }
  while (out.size() % alignment != 0) out.push_back(0);
  const std::size_t data_start = out.size();
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    out.resize(data_start + offsets[i]);
    out.insert(out.end(), tensors_[i].data.begin(), tensors_[i].data.end());
  }
  return out;
}

void GgufWriter::write(const std::string& path) const {
  const auto b = bytes();
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  if (!f) throw std::runtime_error("cannot write " + path);
}

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
  w.kv_f32("llama.rope.freq_base", 10000.0f);
  w.kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.kv_str("tokenizer.ggml.model", "gpt2");
  std::vector<std::string> tokens;
  for (std::uint32_t i = 0; i < s.vocab; ++i) tokens.push_back(std::string("t").append(std::to_string(i)));
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

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, HfTensor>>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::uint64_t off = 0;
  for (const auto& [name, t] : tensors) {
    const std::uint64_t bytes = t.values.size() * 4;
    header[name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {off, off + bytes}}};
    off += bytes;
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';
  std::ofstream f(path, std::ios::binary);
  const std::uint64_t n = h.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const auto& [name, t] : tensors)
    f.write(reinterpret_cast<const char*>(t.values.data()), static_cast<std::streamsize>(t.values.size() * 4));
  if (!f) throw std::runtime_error("cannot write " + path);
}

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
  auto add = [&](const std::string& hf_name, const std::string& gguf_name, HfTensor t, std::uint64_t permute_heads = 0) {
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
  p.config_json = nlohmann::json{{"model_type", "llama"},
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
                                 {"tie_word_embeddings", false}}
                      .dump(2);
  return p;
}

}  // namespace specactor::testing
