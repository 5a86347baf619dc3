// model/head_writer.cpp — see head_writer.hpp.
#include "model/head_writer.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "config/error.hpp"
#include "model/writers.hpp"

namespace specactor::model {

namespace {

struct Tensor {
  std::string gguf, hf;
  std::vector<std::uint64_t> shape;  // Hugging Face order (outermost first)
  std::vector<float> values;
};

}  // namespace

HeadConfig write_random_head(const ModelInfo& t, const HeadSpec& spec, const std::string& out) {
  const std::int64_t H = spec.hidden_override > 0 ? spec.hidden_override : t.hidden_size;
  const std::int64_t nh = t.num_heads, nkv = t.num_kv_heads, hd = H / nh, F = t.ffn_hidden_size;
  const std::int64_t L = t.num_layers;
  const std::int64_t layers = spec.kind == HeadKind::Mtp ? std::max<std::int64_t>(1, spec.layers) : 1;
  const std::int64_t dv = spec.kind == HeadKind::Eagle3
                              ? (spec.draft_vocab > 0 ? spec.draft_vocab : std::min<std::int64_t>(t.vocab_size, 4096))
                              : 0;
  if (spec.kind == HeadKind::Eagle3 && (dv < 1 || dv > t.vocab_size))
    throw config::ConfigError("--draft-vocab: must be in [1, " + std::to_string(t.vocab_size) +
                              "] (the target's vocabulary), got " + std::to_string(dv));
  std::mt19937 rng(spec.seed);
  std::normal_distribution<float> dist(0.0f, spec.scale);
  std::vector<Tensor> ts;
  auto mat = [&](std::string g, std::string h, std::int64_t rows, std::int64_t cols) {
    Tensor x{std::move(g), std::move(h), {static_cast<std::uint64_t>(rows), static_cast<std::uint64_t>(cols)}, {}};
    x.values.resize(static_cast<std::size_t>(rows * cols));
    for (auto& v : x.values) v = dist(rng);
    ts.push_back(std::move(x));
  };
  auto vec = [&](std::string g, std::string h, std::int64_t n, float value) {
    ts.push_back({std::move(g),
                  std::move(h),
                  {static_cast<std::uint64_t>(n)},
                  std::vector<float>(static_cast<std::size_t>(n), value)});
  };
  const std::int64_t attn_in = spec.kind == HeadKind::Eagle3 ? 2 * H : H;
  for (std::int64_t i = 0; i < layers; ++i) {
    const std::string g = "blk." + std::to_string(i) + ".";
    const std::string h = spec.kind == HeadKind::Eagle    ? "layers." + std::to_string(i) + "."
                          : spec.kind == HeadKind::Eagle3 ? std::string("midlayer.")
                                                          : "model.layers." + std::to_string(L + i) + ".";
    if (spec.kind == HeadKind::Eagle) {
      if (i == 0) {
        mat("fc.weight", "fc.weight", H, 2 * H);
        vec("fc.bias", "fc.bias", H, 0.0f);
      }
    } else if (spec.kind == HeadKind::Eagle3) {
      mat("fc.weight", "fc.weight", H, 3 * H);
      vec(g + "attn_norm.weight", h + "input_layernorm.weight", H, 1.0f);
      vec(g + "hidden_norm.weight", h + "hidden_norm.weight", H, 1.0f);
    } else {
      vec(g + "enorm.weight", h + "enorm.weight", H, 1.0f);
      vec(g + "hnorm.weight", h + "hnorm.weight", H, 1.0f);
      mat(g + "eh_proj.weight", h + "eh_proj.weight", H, 2 * H);
      vec(g + "attn_norm.weight", h + "input_layernorm.weight", H, 1.0f);
      vec(g + "out_norm.weight", h + "shared_head.norm.weight", H, 1.0f);
    }
    mat(g + "attn_q.weight", h + "self_attn.q_proj.weight", nh * hd, attn_in);
    mat(g + "attn_k.weight", h + "self_attn.k_proj.weight", nkv * hd, attn_in);
    mat(g + "attn_v.weight", h + "self_attn.v_proj.weight", nkv * hd, attn_in);
    mat(g + "attn_output.weight", h + "self_attn.o_proj.weight", H, nh * hd);
    vec(g + "ffn_norm.weight", h + "post_attention_layernorm.weight", H, 1.0f);
    mat(g + "ffn_gate.weight", h + "mlp.gate_proj.weight", F, H);
    mat(g + "ffn_up.weight", h + "mlp.up_proj.weight", F, H);
    mat(g + "ffn_down.weight", h + "mlp.down_proj.weight", H, F);
  }
  std::vector<std::int32_t> d2t;
  if (spec.kind == HeadKind::Eagle3) {
    vec("output_norm.weight", "norm.weight", H, 1.0f);
    mat("output.weight", "lm_head.weight", dv, H);
    // The draft vocabulary: the first ids of a seeded permutation of the target's, ascending.
    std::vector<std::int32_t> perm(static_cast<std::size_t>(t.vocab_size));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    d2t.assign(perm.begin(), perm.begin() + dv);
    std::sort(d2t.begin(), d2t.end());
  } else if (spec.own_output) {
    mat("output.weight",
        spec.kind == HeadKind::Mtp ? "model.layers." + std::to_string(L) + ".shared_head.head.weight"
                                   : "lm_head.weight",
        t.vocab_size, H);
  }
  if (spec.identity) {
    for (auto& x : ts) {
      const bool out_proj =
          x.gguf.find("attn_output") != std::string::npos || x.gguf.find("ffn_down") != std::string::npos;
      if (out_proj) std::fill(x.values.begin(), x.values.end(), 0.0f);
      if (x.gguf == "fc.weight" && spec.kind == HeadKind::Eagle) {  // (H, 2H): row r picks feature r
        std::fill(x.values.begin(), x.values.end(), 0.0f);
        for (std::int64_t r = 0; r < H; ++r) x.values[static_cast<std::size_t>(r * 2 * H + H + r)] = 1.0f;
      }
    }
    if (spec.kind == HeadKind::Eagle) vec("output_norm.weight", "norm.weight", H, 1.0f);
  }
  if (!spec.drop_tensor.empty())
    ts.erase(std::remove_if(ts.begin(), ts.end(),
                            [&](const Tensor& x) { return x.gguf == spec.drop_tensor || x.hf == spec.drop_tensor; }),
             ts.end());

  const char* arch = spec.kind == HeadKind::Eagle ? "eagle" : spec.kind == HeadKind::Eagle3 ? "eagle3" : "mtp";
  if (!spec.safetensors) {
    GgufWriter w;
    const std::string a = arch;
    w.kv_str("general.architecture", a);
    w.kv_str("general.name",
             std::string("random ") + to_string(spec.kind) + " head for " + (t.name.empty() ? t.path : t.name));
    w.kv_u32(a + ".embedding_length", static_cast<std::uint32_t>(H));
    w.kv_u32(a + ".feed_forward_length", static_cast<std::uint32_t>(F));
    w.kv_u32(a + ".block_count", static_cast<std::uint32_t>(layers));
    w.kv_u32(a + ".attention.head_count", static_cast<std::uint32_t>(nh));
    w.kv_u32(a + ".attention.head_count_kv", static_cast<std::uint32_t>(nkv));
    w.kv_f32(a + ".rope.freq_base", static_cast<float>(t.rope_base));
    w.kv_f32(a + ".attention.layer_norm_rms_epsilon", static_cast<float>(t.norm_eps));
    w.kv_u32(a + ".target_block_count", static_cast<std::uint32_t>(L));
    if (spec.kind == HeadKind::Eagle3) {
      w.kv_u32(a + ".vocab_size", static_cast<std::uint32_t>(dv));
      w.kv_i32_array("eagle3.d2t", d2t);
    }
    for (const auto& x : ts) {
      std::vector<std::uint64_t> dims(x.shape.rbegin(), x.shape.rend());
      std::vector<std::uint8_t> bytes(x.values.size() * 4);
      std::memcpy(bytes.data(), x.values.data(), bytes.size());
      w.tensor(x.gguf, 0, dims, std::move(bytes));
    }
    w.write(out);
  } else {
    std::filesystem::create_directories(out);
    nlohmann::json cfg{{"hidden_size", H},
                       {"intermediate_size", F},
                       {"num_attention_heads", nh},
                       {"num_key_value_heads", nkv},
                       {"head_dim", hd},
                       {"rope_theta", t.rope_base},
                       {"rms_norm_eps", t.norm_eps},
                       {"vocab_size", t.vocab_size},
                       {"num_hidden_layers", spec.kind == HeadKind::Mtp ? L : 1},
                       {"torch_dtype", "float32"}};
    if (spec.kind == HeadKind::Eagle) cfg["architectures"] = {"LlamaForCausalLMEagle"};
    if (spec.kind == HeadKind::Eagle3) {
      cfg["architectures"] = {"LlamaForCausalLMEagle3"};
      cfg["draft_vocab_size"] = dv;
    }
    if (spec.kind == HeadKind::Mtp) {
      cfg["architectures"] = {"LlamaForCausalLMMTP"};
      cfg["num_nextn_predict_layers"] = layers;
    }
    std::ofstream(std::filesystem::path(out) / "config.json") << cfg.dump(2) << "\n";
    std::vector<std::pair<std::string, HfTensor>> hf;
    for (auto& x : ts) hf.push_back({x.hf, HfTensor{x.shape, x.values}});
    std::vector<std::int64_t> offsets;
    if (spec.kind == HeadKind::Eagle3) {  // published layout: target id = draft id + d2t[draft id], int64
      for (std::size_t i = 0; i < d2t.size(); ++i) offsets.push_back(d2t[i] - static_cast<std::int64_t>(i));
    }
    std::sort(hf.begin(), hf.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    write_safetensors((std::filesystem::path(out) / "model.safetensors").string(), hf, offsets);
  }
  return read_head_config(out);
}

}  // namespace specactor::model
