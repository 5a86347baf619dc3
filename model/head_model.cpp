// model/head_model.cpp — EAGLE / EAGLE3 / MTP head files, checks and the CPU forward (see head.hpp).
#include "model/head_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>

#include "config/input.hpp"
#include "kernels/cpu/matmul.hpp"
#include "kernels/cpu/quant.hpp"
#include "kernels/cpu/rmsnorm.hpp"
#include "model/draft_files.hpp"
#include "model/safetensors.hpp"

namespace specactor::model {

namespace k = specactor::kernels;
namespace fs = std::filesystem;
using nlohmann::json;

const char* to_string(HeadKind kind) {
  switch (kind) {
    case HeadKind::Eagle:
      return "EAGLE";
    case HeadKind::Eagle3:
      return "EAGLE3";
    case HeadKind::Mtp:
      return "MTP";
  }
  return "?";
}

std::int64_t HeadConfig::draft_vocab() const {
  if (!hot_vocab.empty()) return static_cast<std::int64_t>(hot_vocab.size());
  return own_vocab;  // 0 when the head uses the target's output head (the caller knows that vocabulary)
}

json HeadConfig::to_json() const {
  json j{{"kind", to_string(kind)},
         {"path", path},
         {"format", format},
         {"hidden_size", hidden},
         {"intermediate_size", ffn},
         {"num_layers", n_layers},
         {"num_attention_heads", n_heads},
         {"num_key_value_heads", n_kv_heads},
         {"head_dim", head_dim},
         {"rope_theta", rope_base},
         {"rms_norm_eps", norm_eps},
         {"rope_neox", rope_neox},
         {"own_output_vocab", own_vocab},
         {"draft_to_target_map", !d2t.empty()},
         {"aux_hidden_layers", aux_layers},
         {"hot_vocab_size", static_cast<std::int64_t>(hot_vocab.size())}};
  return j;
}

namespace {

HeadKind kind_from_gguf_arch(const std::string& path, std::string_view arch) {
  if (arch == "eagle") return HeadKind::Eagle;
  if (arch == "eagle3") return HeadKind::Eagle3;
  if (arch == "mtp") return HeadKind::Mtp;
  throw GgufError(path + ": general.architecture is '" + std::string(arch) +
                  "', expected a draft head: eagle, eagle3 or mtp");
}

HeadKind kind_from_hf(const json& j, const std::string& where) {
  if (j.contains("architectures") && j["architectures"].is_array())
    for (const auto& a : j["architectures"]) {
      if (!a.is_string()) continue;
      const auto s = a.get<std::string>();
      if (s.find("Eagle3") != std::string::npos) return HeadKind::Eagle3;
      if (s.find("Eagle") != std::string::npos) return HeadKind::Eagle;
      if (s.find("MTP") != std::string::npos || s.find("NextN") != std::string::npos) return HeadKind::Mtp;
    }
  if (j.contains("num_nextn_predict_layers")) return HeadKind::Mtp;
  throw GgufError(where +
                  ": cannot tell the head kind (architectures naming Eagle/Eagle3/MTP, or num_nextn_predict_layers)");
}

// The config of a head file, before the checks against a target.
HeadConfig read_config(const std::string& path, std::shared_ptr<const TensorSource>* source_out) {
  HeadConfig c;
  c.path = path;
  if (is_hf_path(path)) {
    c.format = "safetensors";
    const json j = read_config_json(path);
    const std::string where = path + "/config.json";
    c.kind = kind_from_hf(j, where);
    c.hidden = cfg_int(j, where, "hidden_size");
    c.ffn = cfg_int(j, where, "intermediate_size");
    c.n_heads = cfg_int(j, where, "num_attention_heads");
    c.n_kv_heads = cfg_int(j, where, "num_key_value_heads", c.n_heads);
    c.head_dim = c.n_heads > 0 ? cfg_int(j, where, "head_dim", c.hidden / c.n_heads) : 0;
    c.rope_dim = c.head_dim;
    if (j.contains("rope_theta") && j["rope_theta"].is_number()) c.rope_base = j["rope_theta"].get<double>();
    if (j.contains("rms_norm_eps") && j["rms_norm_eps"].is_number()) c.norm_eps = j["rms_norm_eps"].get<double>();
    c.rope_neox = true;
    c.n_layers = c.kind == HeadKind::Mtp ? cfg_int(j, where, "num_nextn_predict_layers") : 1;
    if (c.kind == HeadKind::Eagle3)
      c.own_vocab = cfg_int(j, where, "draft_vocab_size", cfg_int(j, where, "vocab_size", 0));
    const json* ids = nullptr;
    if (j.contains("eagle_config") && j["eagle_config"].is_object() &&
        j["eagle_config"].contains("eagle_aux_hidden_state_layer_ids"))
      ids = &j["eagle_config"]["eagle_aux_hidden_state_layer_ids"];
    else if (j.contains("eagle_aux_hidden_state_layer_ids"))
      ids = &j["eagle_aux_hidden_state_layer_ids"];
    if (ids) {
      if (!ids->is_array()) throw GgufError(where + ": eagle_aux_hidden_state_layer_ids must be an array of layer ids");
      for (const auto& v : *ids) {
        if (!v.is_number_integer()) throw GgufError(where + ": eagle_aux_hidden_state_layer_ids must hold integers");
        c.aux_layers.push_back(v.get<std::int32_t>());
      }
    }
    if (c.kind == HeadKind::Mtp) c.aux_layers = {static_cast<std::int32_t>(cfg_int(j, where, "num_hidden_layers")) - 1};
    if (source_out) {
      auto src = SafetensorsSource::open(path);
      if (const TensorView* d = src->find("d2t")) {  // published layout: target id = draft id + d2t[draft id]
        if (d->ggml_type != 27 && d->ggml_type != 26) throw GgufError(path + ": tensor 'd2t' must be I64 or I32");
        const std::size_t esz = d->ggml_type == 27 ? 8 : 4;
        for (std::size_t i = 0; i < d->n_bytes / esz; ++i) {
          std::int64_t off = 0;
          if (esz == 8)
            std::memcpy(&off, d->data + i * 8, 8);
          else {
            std::int32_t o32;
            std::memcpy(&o32, d->data + i * 4, 4);
            off = o32;
          }
          std::int64_t id = 0;  // checked before it is narrowed: an offset of 2^62 used to wrap into range
          if (__builtin_add_overflow(static_cast<std::int64_t>(i), off, &id) || id < 0 ||
              id > std::numeric_limits<std::int32_t>::max())
            throw GgufError(path + ": d2t[" + std::to_string(i) + "] = " + std::to_string(off) + " maps draft token " +
                            std::to_string(i) + " outside any vocabulary");
          c.d2t.push_back(static_cast<std::int32_t>(id));
        }
      }
      *source_out = src;
    }
  } else {
    c.format = "gguf";
    auto file = GgufFile::open(path);
    const std::string arch(file->has("general.architecture") ? file->get_string("general.architecture") : "");
    c.kind = kind_from_gguf_arch(path, arch);
    auto key = [&](const char* k) { return arch + "." + k; };
    auto need_int = [&](const char* k) {
      if (!file->has(key(k))) throw GgufError(path + ": missing metadata key '" + key(k) + "'");
      return file->get_int(key(k));
    };
    c.hidden = need_int("embedding_length");
    c.ffn = need_int("feed_forward_length");
    c.n_layers = need_int("block_count");
    c.n_heads = need_int("attention.head_count");
    c.n_kv_heads =
        file->has(key("attention.head_count_kv")) ? file->get_int(key("attention.head_count_kv")) : c.n_heads;
    c.head_dim = c.n_heads > 0 ? c.hidden / c.n_heads : 0;
    c.rope_dim = c.head_dim;
    if (file->has(key("rope.freq_base"))) c.rope_base = file->get_float(key("rope.freq_base"));
    if (file->has(key("attention.layer_norm_rms_epsilon")))
      c.norm_eps = file->get_float(key("attention.layer_norm_rms_epsilon"));
    if (file->has(key("vocab_size"))) c.own_vocab = file->get_int(key("vocab_size"));
    if (file->has("eagle3.aux_layers"))
      for (auto v : file->get_int_array("eagle3.aux_layers")) c.aux_layers.push_back(static_cast<std::int32_t>(v));
    if (file->has("eagle3.d2t"))
      for (auto v : file->get_int_array("eagle3.d2t")) {
        if (v < 0 || v > std::numeric_limits<std::int32_t>::max())
          throw GgufError(path + ": eagle3.d2t holds " + std::to_string(v) + ", outside any vocabulary");
        c.d2t.push_back(static_cast<std::int32_t>(v));
      }
    if (file->has(key("target_block_count")) && c.kind != HeadKind::Eagle3)
      c.aux_layers = {static_cast<std::int32_t>(file->get_int(key("target_block_count"))) - 1};
    if (source_out) *source_out = std::make_shared<GgufSource>(file);
  }
  if (c.hidden <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 || c.n_heads % c.n_kv_heads != 0 ||
      c.hidden % c.n_heads != 0)
    throw GgufError(path + ": bad attention shape (hidden " + std::to_string(c.hidden) + ", heads " +
                    std::to_string(c.n_heads) + ", kv heads " + std::to_string(c.n_kv_heads) + ")");
  if (c.n_layers < 1) throw GgufError(path + ": the head has no layers");
  if (const auto why = bad_rope_base(c.rope_base); !why.empty())
    throw GgufError(path + ": the head's RoPE base " + why);
  if (const auto why = bad_norm_eps(c.norm_eps); !why.empty())
    throw GgufError(path + ": the head's RMSNorm epsilon " + why);
  return c;
}

std::string layer_prefix(const HeadConfig& c, std::int64_t i, std::int64_t target_layers) {
  if (c.format == "gguf") return "blk." + std::to_string(i) + ".";
  if (c.kind == HeadKind::Eagle) return "layers." + std::to_string(i) + ".";
  if (c.kind == HeadKind::Eagle3) return "midlayer.";
  return "model.layers." + std::to_string(target_layers + i) + ".";
}

}  // namespace

HeadConfig read_head_config(const std::string& path) { return read_config(path, nullptr); }

bool is_head_checkpoint(const std::string& path) {
  const json j = read_config_json(path);
  try {
    (void)kind_from_hf(j, path);
    return true;
  } catch (const GgufError&) {
    return false;
  }
}

std::vector<std::int32_t> read_token_map(const std::string& path, std::int64_t vocab) {
  std::string text = config::read_text_file(path, "--speculative-token-map " + path);
  std::vector<std::int64_t> ids;
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '[') {
    try {
      const json j = config::parse_json(text, "--speculative-token-map " + path);
      for (const auto& v : j) {
        if (!v.is_number_integer())
          throw GgufError(path + ": token map entries must be integers, got " + config::printable(v.dump()));
        ids.push_back(v.get<std::int64_t>());
      }
    } catch (const json::exception& e) {
      throw GgufError(path + ": the token map is not a valid JSON array: " + e.what());
    }
  } else {
    std::replace(text.begin(), text.end(), ',', ' ');
    std::istringstream is(text);
    std::string w;
    while (is >> w) {
      std::size_t used = 0;
      long long v = 0;
      try {
        v = std::stoll(w, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != w.size())
        throw GgufError(path + ": token map entry '" + config::printable(w) + "' is not a token id");
      ids.push_back(v);
    }
  }
  if (ids.empty()) throw GgufError(path + ": the token map is empty (expected token ids)");
  std::set<std::int64_t> seen;
  std::vector<std::int32_t> out;
  for (auto v : ids) {
    if (v < 0 || v >= vocab)
      throw GgufError(path + ": token id " + std::to_string(v) + " is outside the target's vocabulary of " +
                      std::to_string(vocab));
    if (!seen.insert(v).second) throw GgufError(path + ": token id " + std::to_string(v) + " is listed twice");
    out.push_back(static_cast<std::int32_t>(v));
  }
  return out;
}

std::shared_ptr<const HeadWeights> HeadWeights::load(const std::string& path, HeadKind kind, const LlamaConfig& target,
                                                     const std::vector<std::int32_t>& hot_vocab, bool frozen_kv,
                                                     config::LoadFormat format, k::WeightType quantize_to) {
  if (quantize_to != k::WeightType::F32 && quantize_to != k::WeightType::Q8_0 && quantize_to != k::WeightType::Q4_1)
    throw std::invalid_argument("HeadWeights::load: heads are quantized to Q8_0 or Q4_1 only");
  auto w = std::shared_ptr<HeadWeights>(new HeadWeights());
  HeadConfig& c = w->cfg_;
  c = read_config(path, &w->source_);
  const std::string algo = frozen_kv ? "FROZEN_KV_MTP" : to_string(kind);
  if (c.kind != kind)
    throw GgufError(path + ": this is a " + std::string(to_string(c.kind)) + " head, but --speculative-algorithm is " +
                    algo);
  auto mismatch = [&](const std::string& what, std::int64_t head, std::int64_t tgt) {
    if (head != tgt)
      throw GgufError(path + ": head " + what + " " + std::to_string(head) + " does not match the target's " +
                      std::to_string(tgt));
  };
  mismatch("hidden size", c.hidden, target.hidden);
  const auto L = static_cast<std::int32_t>(target.n_layers);
  if (c.kind == HeadKind::Eagle3) {
    if (c.aux_layers.empty())  // sglang's capture points (the inputs of layers 2, L/2, L-3), clamped for tiny models
      c.aux_layers = {std::min(1, L - 1), std::max(0, L / 2 - 1), std::max(0, L - 4)};
    if (c.aux_layers.size() != 3)
      throw GgufError(path + ": EAGLE3 reads 3 target layers, the head names " + std::to_string(c.aux_layers.size()));
    for (auto l : c.aux_layers)
      if (l < 0 || l >= L)
        throw GgufError(path + ": head reads target layer " + std::to_string(l) + " but the target has " +
                        std::to_string(L) + " layers");
  } else {
    if (!c.aux_layers.empty()) mismatch("target layer count", c.aux_layers[0] + 1, L);
    c.aux_layers = {L - 1};
  }
  if (frozen_kv) {
    mismatch("KV heads", c.n_kv_heads, target.n_kv_heads);
    mismatch("head dim", c.head_dim, target.head_dim);
    c.rope_neox = target.rope_neox;  // its queries meet keys the target rotated
    c.rope_base = target.rope_base;
    c.rope_dim = target.rope_dim;
  }
  if (!c.d2t.empty()) {
    if (c.own_vocab <= 0) throw GgufError(path + ": a draft-to-target map without a draft vocabulary size");
    mismatch("d2t length", static_cast<std::int64_t>(c.d2t.size()), c.own_vocab);
  }

  WeightBinder binder(*w->source_, format == config::LoadFormat::Dummy, w->owned_);
  CheckedBinder bind(binder, path, quantize_to, w->owned_);
  const bool hf = c.format == "safetensors";
  const std::int64_t H = c.hidden, QD = c.n_heads * c.head_dim, KD = c.n_kv_heads * c.head_dim;
  const std::int64_t attn_in = c.kind == HeadKind::Eagle3 ? 2 * H : H;
  for (std::int64_t i = 0; i < c.n_layers; ++i) {
    const std::string p = layer_prefix(c, i, target.n_layers);
    auto nm = [&](const char* gguf, const char* hf_name) { return p + (hf ? hf_name : gguf); };
    HeadLayerWeights hl;
    LlamaLayer& ly = hl.layer;
    const std::string in_norm = nm("attn_norm.weight", "input_layernorm.weight");
    if (c.kind == HeadKind::Eagle) {
      if (bind.has(in_norm)) ly.attn_norm = bind.vector(in_norm, H);  // EAGLE-1 drops layer 0's input norm
      hl.proj = bind.matrix("fc.weight", H, 2 * H);                   // the same name in both formats
      if (bind.has("fc.bias")) hl.proj_bias = bind.vector("fc.bias", H);
      const std::string norm = hf ? "norm.weight" : "output_norm.weight";
      if (bind.has(norm)) hl.out_norm = bind.vector(norm, H);
    } else if (c.kind == HeadKind::Eagle3) {
      hl.emb_norm = bind.vector(in_norm, H);
      hl.hidden_norm = bind.vector(nm("hidden_norm.weight", "hidden_norm.weight"), H);
      if (i == 0) hl.proj = bind.matrix("fc.weight", H, 3 * H);
      hl.out_norm = bind.vector(hf ? "norm.weight" : "output_norm.weight", H);
    } else {
      hl.emb_norm = bind.vector(nm("enorm.weight", "enorm.weight"), H);
      hl.hidden_norm = bind.vector(nm("hnorm.weight", "hnorm.weight"), H);
      hl.proj = bind.matrix(nm("eh_proj.weight", "eh_proj.weight"), H, 2 * H);
      ly.attn_norm = bind.vector(in_norm, H);
      hl.out_norm = bind.vector(nm("out_norm.weight", "shared_head.norm.weight"), H);
    }
    ly.wq = bind.matrix(nm("attn_q.weight", "self_attn.q_proj.weight"), QD, attn_in);
    ly.wk = bind.matrix(nm("attn_k.weight", "self_attn.k_proj.weight"), KD, attn_in);
    ly.wv = bind.matrix(nm("attn_v.weight", "self_attn.v_proj.weight"), KD, attn_in);
    ly.wo = bind.matrix(nm("attn_output.weight", "self_attn.o_proj.weight"), H, QD);
    ly.ffn_norm = bind.vector(nm("ffn_norm.weight", "post_attention_layernorm.weight"), H);
    ly.gate = bind.matrix(nm("ffn_gate.weight", "mlp.gate_proj.weight"), c.ffn, H);
    ly.up = bind.matrix(nm("ffn_up.weight", "mlp.up_proj.weight"), c.ffn, H);
    ly.down = bind.matrix(nm("ffn_down.weight", "mlp.down_proj.weight"), H, c.ffn);
    w->layers_.push_back(hl);
  }
  // The output head: the head's own (EAGLE3: over its draft vocabulary), else the target's.
  std::string own = hf ? "lm_head.weight" : "output.weight";
  if (c.kind == HeadKind::Mtp && hf) own = layer_prefix(c, 0, target.n_layers) + "shared_head.head.weight";
  if (bind.has(own)) {
    const TensorView* t = w->source_->find(own);
    const std::int64_t rows = t->dims.size() == 2 ? static_cast<std::int64_t>(t->dims[1]) : -1;
    if (c.own_vocab == 0) c.own_vocab = rows;
    if (c.d2t.empty())
      mismatch("vocabulary", rows, target.vocab_size);
    else
      mismatch("output rows", rows, c.own_vocab);
    w->output_ = bind.matrix(own, rows, H);
    w->has_output_ = true;
  } else if (c.kind == HeadKind::Eagle3) {
    throw GgufError(path + ": missing tensor '" + own + "' (EAGLE3 heads carry their own output head)");
  } else {
    c.own_vocab = 0;
  }
  for (auto t : c.d2t)
    if (t < 0 || t >= target.vocab_size)
      throw GgufError(path + ": d2t maps to token " + std::to_string(t) + ", outside the target's vocabulary of " +
                      std::to_string(target.vocab_size));
  if (!hot_vocab.empty()) {
    if (!c.d2t.empty())
      throw GgufError(path +
                      ": --speculative-token-map restricts a head over the target's vocabulary; this head has its own "
                      "draft vocabulary (d2t)");
    c.hot_vocab = hot_vocab;
  }
  return w;
}

HeadRunner::HeadRunner(std::shared_ptr<const HeadWeights> head, std::shared_ptr<const LlamaWeights> target,
                       k::Precision precision)
    : head_(std::move(head)), target_(std::move(target)), precision_(precision) {
  const HeadConfig& c = head_->config();
  // FR-Spec: the hot rows of the output head, dequantized once (the restriction is the draft's only).
  if (!c.hot_vocab.empty()) {
    const k::WeightMatrix& full = head_->output() ? *head_->output() : target_->output();
    hot_.resize(c.hot_vocab.size() * static_cast<std::size_t>(c.hidden));
    for (std::size_t i = 0; i < c.hot_vocab.size(); ++i)
      k::weight_row(full, c.hot_vocab[i], hot_.data() + i * c.hidden);
    hot_m_.type = k::WeightType::F32;
    hot_m_.out_dim = static_cast<std::int64_t>(c.hot_vocab.size());
    hot_m_.in_dim = c.hidden;
    hot_m_.data = reinterpret_cast<const std::uint8_t*>(hot_.data());
    hot_m_.row_stride = static_cast<std::size_t>(c.hidden) * sizeof(float);
  }
}

std::int32_t HeadRunner::to_target(std::int32_t id) const {
  const HeadConfig& c = head_->config();
  if (!c.hot_vocab.empty()) return c.hot_vocab[static_cast<std::size_t>(id)];
  if (!c.d2t.empty()) return c.d2t[static_cast<std::size_t>(id)];
  return id;
}

void HeadRunner::target_norm(float* rows, std::int64_t n) const {
  const auto& t = target_->config();
  std::vector<float> tmp(static_cast<std::size_t>(t.hidden));
  for (std::int64_t i = 0; i < n; ++i) {
    k::rmsnorm_cpu(tmp.data(), rows + i * t.hidden, target_->output_norm(), 1, static_cast<int>(t.hidden),
                   static_cast<float>(t.norm_eps));
    std::copy(tmp.begin(), tmp.end(), rows + i * t.hidden);
  }
}

void HeadRunner::project(int layer, const std::int32_t* tokens, const float* feature, std::int64_t fw, std::int64_t n,
                         const std::int32_t* positions) {
  const HeadConfig& c = head_->config();
  const HeadLayerWeights& hl = head_->layers()[static_cast<std::size_t>(layer)];
  const std::int64_t H = c.hidden, QD = c.n_heads * c.head_dim, KD = c.n_kv_heads * c.head_dim;
  const auto eps = static_cast<float>(c.norm_eps);
  n_ = n;
  std::vector<float> emb(static_cast<std::size_t>(n * H));
  for (std::int64_t i = 0; i < n; ++i) k::weight_row(target_->embedding(), tokens[i], emb.data() + i * H);
  x_.resize(static_cast<std::size_t>(n * H));
  const std::int64_t attn_w = c.kind == HeadKind::Eagle3 ? 2 * H : H;
  xn_.resize(static_cast<std::size_t>(n * attn_w));
  if (c.kind == HeadKind::Eagle3) {
    const HeadLayerWeights& l0 = head_->layers()[0];
    if (fw == 3 * H)
      k::matmul(l0.proj, feature, n, x_.data(), precision_);  // the target's three layers, fused
    else
      std::copy(feature, feature + n * H, x_.begin());  // the head's own output
    for (std::int64_t i = 0; i < n; ++i) {
      k::rmsnorm_cpu(xn_.data() + i * 2 * H, emb.data() + i * H, hl.emb_norm, 1, static_cast<int>(H), eps);
      k::rmsnorm_cpu(xn_.data() + i * 2 * H + H, x_.data() + i * H, hl.hidden_norm, 1, static_cast<int>(H), eps);
    }
  } else {
    in_.resize(static_cast<std::size_t>(n * 2 * H));
    for (std::int64_t i = 0; i < n; ++i) {
      float* row = in_.data() + i * 2 * H;
      if (c.kind == HeadKind::Mtp) {
        k::rmsnorm_cpu(row, emb.data() + i * H, hl.emb_norm, 1, static_cast<int>(H), eps);
        k::rmsnorm_cpu(row + H, feature + i * fw, hl.hidden_norm, 1, static_cast<int>(H), eps);
      } else {
        std::copy(emb.begin() + i * H, emb.begin() + (i + 1) * H, row);
        std::copy(feature + i * fw, feature + i * fw + H, row + H);
      }
    }
    k::matmul(hl.proj, in_.data(), n, x_.data(), precision_);
    if (hl.proj_bias)
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t d = 0; d < H; ++d) x_[static_cast<std::size_t>(i * H + d)] += hl.proj_bias[d];
    if (hl.layer.attn_norm)
      k::rmsnorm_cpu(xn_.data(), x_.data(), hl.layer.attn_norm, static_cast<int>(n), static_cast<int>(H), eps);
    else
      xn_ = x_;
  }
  q_.resize(static_cast<std::size_t>(n * QD));
  k_.resize(static_cast<std::size_t>(n * KD));
  v_.resize(k_.size());
  const k::MatmulJob qkv[3] = {{&hl.layer.wq, q_.data()}, {&hl.layer.wk, k_.data()}, {&hl.layer.wv, v_.data()}};
  k::matmul_many(qkv, 3, xn_.data(), n, precision_);
  rope_.resize(static_cast<std::size_t>(n * c.rope_dim));
  k::rope_table_cpu(positions, n, c.rope_dim, c.rope_base, rope_.data());
  k::rope_apply_cpu(q_.data(), n, c.n_heads, c.head_dim, c.rope_dim, rope_.data(), c.rope_neox);
  k::rope_apply_cpu(k_.data(), n, c.n_kv_heads, c.head_dim, c.rope_dim, rope_.data(), c.rope_neox);
}

void HeadRunner::finish(int layer, const k::KvSegment& prefix, const k::KvSegment& masked, const std::uint64_t* mask,
                        std::vector<float>& hidden) {
  finish(layer, {AttentionPart{prefix, masked, mask, 0, n_}}, hidden);
}

void HeadRunner::finish(int layer, const std::vector<AttentionPart>& parts, std::vector<float>& hidden) {
  const HeadConfig& c = head_->config();
  const LlamaLayer& ly = head_->layers()[static_cast<std::size_t>(layer)].layer;
  const std::int64_t n = n_, H = c.hidden, QD = c.n_heads * c.head_dim;
  att_.resize(static_cast<std::size_t>(n * QD));
  for (const AttentionPart& p : parts) {
    if (p.first_row < 0 || p.rows < 0 || p.first_row + p.rows > n)
      throw std::logic_error("HeadRunner::finish: an attention part outside the projected rows");
    k::attention_segments_cpu(q_.data() + p.first_row * QD, p.rows, c.n_heads, c.n_kv_heads, c.head_dim, p.prefix,
                              p.masked, p.mask, 1.0f / std::sqrt(static_cast<float>(c.head_dim)),
                              att_.data() + p.first_row * QD);
  }
  layer_tail(ly, n, x_.data());
  hidden.assign(x_.begin(), x_.begin() + n * H);
}

void HeadRunner::layer_tail(const LlamaLayer& ly, std::int64_t n, float* x) {
  const HeadConfig& c = head_->config();
  model::layer_tail(ly, n, c.hidden, c.ffn, static_cast<float>(c.norm_eps), precision_, att_.data(), x, tail_);
}

void HeadRunner::finish_last(int layer, const std::vector<AttentionPart>& parts, std::vector<float>& hidden) {
  const HeadConfig& c = head_->config();
  const LlamaLayer& ly = head_->layers()[static_cast<std::size_t>(layer)].layer;
  const auto m = static_cast<std::int64_t>(parts.size());
  const std::int64_t H = c.hidden, QD = c.n_heads * c.head_dim;
  att_.resize(static_cast<std::size_t>(m * QD));
  std::vector<float> x(static_cast<std::size_t>(m * H));
  for (std::int64_t i = 0; i < m; ++i) {
    const AttentionPart& p = parts[static_cast<std::size_t>(i)];
    if (p.first_row < 0 || p.rows < 1 || p.first_row + p.rows > n_)
      throw std::logic_error("HeadRunner::finish_last: an attention part outside the projected rows");
    const std::int64_t r = p.first_row + p.rows - 1;  // as the last of the part's p.rows queries
    k::attention_segments_cpu(q_.data() + r * QD, 1, c.n_heads, c.n_kv_heads, c.head_dim, p.prefix, p.masked,
                              p.mask ? p.mask + (p.rows - 1) : nullptr,
                              1.0f / std::sqrt(static_cast<float>(c.head_dim)), att_.data() + i * QD);
    std::copy(x_.begin() + r * H, x_.begin() + (r + 1) * H, x.begin() + i * H);
  }
  layer_tail(ly, m, x.data());
  hidden = std::move(x);
}

void HeadRunner::logits(int layer, const float* hidden, std::int64_t n, std::vector<float>& out) {
  const HeadConfig& c = head_->config();
  const std::int64_t H = c.hidden;
  const float* own_norm = head_->layers()[static_cast<std::size_t>(layer)].out_norm;
  const float* norm = own_norm ? own_norm : target_->output_norm();
  std::vector<float> rows(static_cast<std::size_t>(n * H));
  k::rmsnorm_cpu(rows.data(), hidden, norm, static_cast<int>(n), static_cast<int>(H), static_cast<float>(c.norm_eps));
  const k::WeightMatrix& m = !c.hot_vocab.empty() ? hot_m_ : head_->output() ? *head_->output() : target_->output();
  out.resize(static_cast<std::size_t>(n * m.out_dim));
  k::matmul(m, rows.data(), n, out.data(), precision_);
}

}  // namespace specactor::model
