// model/block_drafter.cpp — DFLASH and DSPARK drafter files, checks and the CPU forward (see block_drafter.hpp).
#include "model/block_drafter.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "config/input.hpp"
#include "kernels/cpu/quant.hpp"
#include "kernels/cpu/rmsnorm.hpp"
#include "model/draft_files.hpp"
#include "model/safetensors.hpp"
#include "model/writers.hpp"

namespace specactor::model {

namespace k = specactor::kernels;
namespace fs = std::filesystem;
using nlohmann::json;

json BlockDraftConfig::to_json() const {
  json j{{"kind", dspark ? "DSPARK" : "DFLASH"},
         {"path", path},
         {"format", "safetensors"},
         {"hidden_size", hidden},
         {"intermediate_size", ffn},
         {"num_layers", n_layers},
         {"num_attention_heads", n_heads},
         {"num_key_value_heads", n_kv_heads},
         {"head_dim", head_dim},
         {"rope_theta", rope_base},
         {"rms_norm_eps", norm_eps},
         {"block_size", block_size},
         {"mask_token_id", mask_token_id},
         {"target_layer_ids", target_layer_ids},
         {"input_embedding_scale", embed_scale},
         {"output_multiplier", output_multiplier},
         {"final_logit_softcapping", logit_softcap},
         {"draft_vocab_size", static_cast<std::int64_t>(draft_vocab.size())}};
  if (dspark) {
    j["markov_rank"] = markov_rank;
    j["markov_first_row"] = markov_first_row;
  }
  return j;
}

namespace {

bool names_architecture(const json& j, const std::string& arch) {
  if (!j.contains("architectures") || !j["architectures"].is_array()) return false;
  for (const auto& a : j["architectures"])
    if (a.is_string() && a.get<std::string>() == arch) return true;
  return false;
}

// A field of the drafter's own settings: "dspark_config", then "dflash_config", then the top level (as
// published).
const json* draft_field(const json& j, const char* key) {
  for (const char* group : {"dspark_config", "dflash_config"})
    if (j.contains(group) && j[group].is_object() && j[group].contains(key)) return &j[group][key];
  return j.contains(key) ? &j[key] : nullptr;
}

double draft_number(const json& j, const std::string& where, const char* key, double dflt) {
  const json* v = draft_field(j, key);
  if (!v || v->is_null()) return dflt;
  if (!v->is_number() || !std::isfinite(v->get<double>()))
    throw GgufError(where + ": '" + key + "' must be a finite number, got " + config::printable(v->dump()));
  return v->get<double>();
}

// The config of a drafter folder and its checks against the target (everything but the tensors).
BlockDraftConfig read_block_config(const std::string& path, const LlamaConfig& target, std::int64_t context_length) {
  const json j = read_config_json(path);
  const std::string where =
      (fs::is_directory(path) ? fs::path(path) : fs::path(path).parent_path()).string() + "/config.json";
  auto fail = [&](const std::string& field, const std::string& what) {
    throw GgufError(where + ": '" + field + "' " + what);
  };
  if (names_architecture(j, "DFlash2DraftModel"))
    fail("architectures",
         "is DFlash2DraftModel (convolutions and a candidate selector), which is not supported; "
         "DFLASH reads DFlashDraftModel checkpoints");
  BlockDraftConfig c;
  c.dspark = names_architecture(j, "DSparkDraftModel");
  if (!c.dspark && !names_architecture(j, "DFlashDraftModel"))
    fail("architectures", "must name DFlashDraftModel or DSparkDraftModel");
  c.path = path;
  c.hidden = cfg_int(j, where, "hidden_size");
  if (c.hidden != target.hidden)
    fail("hidden_size", "is " + std::to_string(c.hidden) + " but the target's hidden size is " +
                            std::to_string(target.hidden) + " (the drafter reads the target's hidden states)");
  c.ffn = cfg_int(j, where, "intermediate_size");
  c.n_layers = cfg_int(j, where, "num_hidden_layers");
  c.n_heads = cfg_int(j, where, "num_attention_heads");
  c.n_kv_heads = cfg_int(j, where, "num_key_value_heads", c.n_heads);
  c.head_dim = c.n_heads > 0 ? cfg_int(j, where, "head_dim", c.hidden / c.n_heads) : 0;
  if (c.n_layers < 1) fail("num_hidden_layers", "must be at least 1");
  if (c.ffn < 1) fail("intermediate_size", "must be at least 1");
  if (c.n_heads < 1 || c.n_kv_heads < 1 || c.n_heads % c.n_kv_heads != 0)
    fail("num_key_value_heads",
         "must divide num_attention_heads (" + std::to_string(c.n_heads) + "), got " + std::to_string(c.n_kv_heads));
  if (c.head_dim < 2 || c.head_dim % 2 != 0) fail("head_dim", "must be even and at least 2");
  if (j.contains("vocab_size") && cfg_int(j, where, "vocab_size") != target.vocab_size)
    fail("vocab_size", "is " + std::to_string(cfg_int(j, where, "vocab_size")) + " but the target's vocabulary has " +
                           std::to_string(target.vocab_size) +
                           " tokens (the drafter uses the target's embedding and output head)");
  if (j.contains("rms_norm_eps") && j["rms_norm_eps"].is_number()) c.norm_eps = j["rms_norm_eps"].get<double>();
  if (j.contains("rope_theta") && j["rope_theta"].is_number())
    c.rope_base = j["rope_theta"].get<double>();
  else if (j.contains("rope_parameters") && j["rope_parameters"].is_object() &&
           j["rope_parameters"].contains("rope_theta") && j["rope_parameters"]["rope_theta"].is_number())
    c.rope_base = j["rope_parameters"]["rope_theta"].get<double>();
  if (!(c.rope_base > 0) || !(c.norm_eps > 0)) fail("rope_theta", "and rms_norm_eps must be positive");
  if (j.contains("attention_bias") && j["attention_bias"] == true)
    fail("attention_bias", "is true; DFLASH drafters with attention biases are not supported");
  if (j.contains("is_causal") && j["is_causal"] == true)
    fail("is_causal", "is true; a DFLASH block attends non-causally");
  if (j.contains("layer_types") && j["layer_types"].is_array())
    for (const auto& t : j["layer_types"])
      if (t != "full_attention")
        fail("layer_types", "holds " + config::printable(t.dump()) + "; only full_attention layers are supported");
  const json* bs = draft_field(j, "block_size");
  c.block_size = bs ? (bs->is_number_integer() ? bs->get<std::int64_t>() : -1) : 16;
  if (c.block_size < 2 || c.block_size > 64)
    fail("block_size", "must be an integer in [2, 64] (a block is the root and 1 to 63 drafts), got " +
                           (bs ? config::printable(bs->dump()) : std::string("?")));
  if (c.block_size > context_length)
    fail("block_size",
         "is " + std::to_string(c.block_size) + ", beyond the context length of " + std::to_string(context_length));
  const json* mask = draft_field(j, "mask_token_id");
  if (!mask || mask->is_null())
    fail("mask_token_id", "is missing (the token id that fills the block's draft positions)");
  if (!mask->is_number_integer() || mask->get<std::int64_t>() < 0 || mask->get<std::int64_t>() >= target.vocab_size)
    fail("mask_token_id", "must be a token id below the target's vocabulary of " + std::to_string(target.vocab_size) +
                              ", got " + config::printable(mask->dump()));
  c.mask_token_id = mask->get<std::int32_t>();
  const json* ids = draft_field(j, "target_layer_ids");
  if (!ids || !ids->is_array() || ids->empty())
    fail("target_layer_ids", "must be a non-empty array of target layer ids");
  for (const auto& v : *ids) {
    if (!v.is_number_integer() || v.get<std::int64_t>() < 0 || v.get<std::int64_t>() >= target.n_layers)
      fail("target_layer_ids", "holds " + config::printable(v.dump()) + "; the target has layers 0 to " +
                                   std::to_string(target.n_layers - 1));
    c.target_layer_ids.push_back(v.get<std::int32_t>());
  }
  c.embed_scale = draft_number(j, where, "input_embedding_scale", 1.0);
  c.output_multiplier = draft_number(j, where, "output_multiplier", 1.0);
  c.logit_softcap = draft_number(j, where, "final_logit_softcapping", 0.0);
  if (c.dspark) {
    const json* r = draft_field(j, "markov_rank");
    if (!r || !r->is_number_integer() || r->get<std::int64_t>() < 1 || r->get<std::int64_t>() > 4096)
      fail("markov_rank", "must be an integer in [1, 4096] (the DSPARK Markov head's rank), got " +
                              (r ? config::printable(r->dump()) : std::string("nothing")));
    c.markov_rank = r->get<std::int64_t>();
  }
  if (const json* first = draft_field(j, "markov_first_row")) {
    if (!c.dspark) fail("markov_first_row", "is a DSPARK setting (the Markov head's), but this is a DFlashDraftModel");
    if (!first->is_boolean())
      fail("markov_first_row", "must be true or false, got " + config::printable(first->dump()));
    c.markov_first_row = first->get<bool>();
  }
  return c;
}

// A float tensor [rows, cols] (F32, F16 or BF16) as float32, checked finite; random N(0, 0.02²) for the
// dummy load format.
std::vector<float> float_table(const TensorSource& src, const std::string& path, const std::string& name,
                               std::int64_t rows, std::int64_t cols, bool dummy) {
  const TensorView* t = src.find(name);
  std::string shape = "[";  // built in steps: GCC 12 warns (-Wrestrict, falsely) on one chain of + here
  shape += std::to_string(rows);
  shape += ", ";
  shape += std::to_string(cols);
  shape += "]";
  if (!t) throw GgufError(path + ": missing tensor '" + name + "' (expected shape " + shape + ")");
  const std::vector<std::uint64_t> dims =
      rows == 1 && cols == 1
          ? std::vector<std::uint64_t>{1}
          : std::vector<std::uint64_t>{static_cast<std::uint64_t>(cols), static_cast<std::uint64_t>(rows)};
  const auto n = static_cast<std::size_t>(rows * cols);
  const bool f32 = t->ggml_type == 0, f16 = t->ggml_type == 1, bf16 = t->ggml_type == 30;
  if (t->dims != dims || !(f32 || f16 || bf16) || t->n_bytes != n * (f32 ? 4 : 2))
    throw GgufError(path + ": tensor '" + name + "' must be F32, F16 or BF16 of shape " + shape);
  std::vector<float> out(n);
  if (dummy) {
    std::mt19937 rng(static_cast<std::uint32_t>(std::hash<std::string>{}(name)));
    std::normal_distribution<float> dist(0.0f, 0.02f);
    for (auto& v : out) v = dist(rng);
    return out;
  }
  for (std::size_t i = 0; i < n; ++i) {
    std::uint16_t h = 0;
    if (!f32) std::memcpy(&h, t->data + 2 * i, 2);
    if (f32) std::memcpy(&out[i], t->data + 4 * i, 4);
    out[i] = f32 ? out[i] : f16 ? k::f16_to_f32(h) : k::bf16_to_f32(h);
    if (!std::isfinite(out[i]))
      throw GgufError(path + ": tensor '" + name + "' holds a non-finite value (" + std::to_string(out[i]) + ")");
  }
  return out;
}

// The optional draft vocabulary: I32 [Vd], strictly ascending target ids.
std::vector<std::int32_t> read_draft_vocab(const TensorView& t, const std::string& path, const LlamaConfig& target) {
  const std::string where = path + ": tensor 'draft_vocab'";
  if (t.ggml_type != 26 || t.dims.size() != 1 || t.dims[0] < 1 || t.n_bytes != t.dims[0] * 4)  // 26: ggml I32
    throw GgufError(where + " must be a non-empty I32 vector of target token ids");
  std::vector<std::int32_t> ids(t.dims[0]);
  std::memcpy(ids.data(), t.data, t.n_bytes);
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= target.vocab_size || (i > 0 && ids[i] <= ids[i - 1]))
      throw GgufError(where + " must hold strictly ascending ids below the target's vocabulary of " +
                      std::to_string(target.vocab_size) + " (entry " + std::to_string(i) + " is " +
                      std::to_string(ids[i]) + ")");
  return ids;
}

}  // namespace

bool is_block_drafter_checkpoint(const std::string& path) {
  if (!is_hf_path(path)) return false;
  try {
    const json j = read_config_json(path);
    return names_architecture(j, "DFlashDraftModel") || names_architecture(j, "DFlash2DraftModel") ||
           names_architecture(j, "DSparkDraftModel");
  } catch (const GgufError&) {
    return false;
  }
}

std::shared_ptr<const BlockDraftWeights> BlockDraftWeights::load(const std::string& path, const LlamaConfig& target,
                                                                 std::int64_t context_length, config::LoadFormat format,
                                                                 k::WeightType quantize_to) {
  if (format == config::LoadFormat::Gguf)
    throw GgufError(path +
                    ": --speculative-draft-load-format gguf: DFLASH drafters are read from a folder of "
                    "config.json and safetensors");
  if (!is_hf_path(path))
    throw GgufError(path + ": a DFLASH drafter is a folder with config.json and model.safetensors");
  auto w = std::shared_ptr<BlockDraftWeights>(new BlockDraftWeights());
  BlockDraftConfig& c = w->cfg_;
  c = read_block_config(path, target, context_length);
  w->source_ = SafetensorsSource::open(path);
  WeightBinder binder(*w->source_, format == config::LoadFormat::Dummy, w->owned_);
  CheckedBinder bind(binder, path, quantize_to, w->owned_);
  const std::int64_t H = c.hidden, QD = c.n_heads * c.head_dim, KD = c.kv_row();
  if (const TensorView* dv = w->source_->find("draft_vocab")) c.draft_vocab = read_draft_vocab(*dv, path, target);
  w->fc_ = bind.matrix("fc.weight", H, c.feature_width());
  w->hidden_norm_ = bind.vector("hidden_norm.weight", H);
  w->norm_ = bind.vector("norm.weight", H);
  for (std::int64_t i = 0; i < c.n_layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    BlockLayerWeights bl;
    LlamaLayer& ly = bl.layer;
    ly.attn_norm = bind.vector(p + "input_layernorm.weight", H);
    ly.ffn_norm = bind.vector(p + "post_attention_layernorm.weight", H);
    ly.wq = bind.matrix(p + "self_attn.q_proj.weight", QD, H);
    ly.wk = bind.matrix(p + "self_attn.k_proj.weight", KD, H);
    ly.wv = bind.matrix(p + "self_attn.v_proj.weight", KD, H);
    ly.wo = bind.matrix(p + "self_attn.o_proj.weight", H, QD);
    bl.q_norm = bind.vector(p + "self_attn.q_norm.weight", c.head_dim);
    bl.k_norm = bind.vector(p + "self_attn.k_norm.weight", c.head_dim);
    ly.gate = bind.matrix(p + "mlp.gate_proj.weight", c.ffn, H);
    ly.up = bind.matrix(p + "mlp.up_proj.weight", c.ffn, H);
    ly.down = bind.matrix(p + "mlp.down_proj.weight", H, c.ffn);
    w->layers_.push_back(bl);
  }
  if (c.dspark) {  // float32 tables, never quantized (see the header)
    const std::int64_t r = c.markov_rank;
    const std::int64_t vd = c.draft_vocab.empty() ? target.vocab_size : static_cast<std::int64_t>(c.draft_vocab.size());
    const bool dummy = format == config::LoadFormat::Dummy;
    w->w1_ = float_table(*w->source_, path, "markov_head.w1.weight", target.vocab_size, r, dummy);
    const std::vector<float> w2 = float_table(*w->source_, path, "markov_head.w2.weight", vd, r, dummy);
    // Kept as a float32 matrix [Vd × r'] for the matmul kernel, r' = r rounded up to 32 (its block), the
    // extra columns zero: their products add exact zeros.
    const std::int64_t rp = (r + 31) / 32 * 32;
    w->w2_.assign(static_cast<std::size_t>(vd * rp), 0.0f);
    for (std::int64_t v = 0; v < vd; ++v) std::copy_n(w2.begin() + v * r, r, w->w2_.begin() + v * rp);
    w->w2m_ = {k::WeightType::F32, vd, rp, reinterpret_cast<const std::uint8_t*>(w->w2_.data()),
               static_cast<std::size_t>(rp) * sizeof(float)};
    w->conf_w_ = float_table(*w->source_, path, "confidence_head.weight", 1, H + r, dummy);
    w->conf_b_ = float_table(*w->source_, path, "confidence_head.bias", 1, 1, dummy)[0];
  }
  return w;
}

BlockDraftRunner::BlockDraftRunner(std::shared_ptr<const BlockDraftWeights> drafter,
                                   std::shared_ptr<const LlamaWeights> target, k::Precision precision)
    : w_(std::move(drafter)), target_(std::move(target)), precision_(precision) {
  ctx_k_.resize(static_cast<std::size_t>(config().n_layers));
  ctx_v_.resize(ctx_k_.size());
  out_ = &target_->output();
  const auto& dv = config().draft_vocab;
  if (!dv.empty()) {  // the draft vocabulary's rows of the target's output head, dequantized once
    const std::int64_t H = config().hidden;
    hot_.resize(dv.size() * static_cast<std::size_t>(H));
    for (std::size_t i = 0; i < dv.size(); ++i) k::weight_row(target_->output(), dv[i], hot_.data() + i * H);
    hot_m_.type = k::WeightType::F32;
    hot_m_.out_dim = static_cast<std::int64_t>(dv.size());
    hot_m_.in_dim = H;
    hot_m_.data = reinterpret_cast<const std::uint8_t*>(hot_.data());
    hot_m_.row_stride = static_cast<std::size_t>(H) * sizeof(float);
    if (precision_ == k::Precision::Fast && H % 32 == 0) {
      // The fast precision reads Q8_0 rows, as the drafter's own matrices are read: a quarter of the
      // bytes, and these rows are most of what a block reads (4,096 × 576 floats for SmolLM2).
      const std::size_t q_row = k::row_bytes(k::WeightType::Q8_0, static_cast<std::size_t>(H));
      hot_q_.resize(q_row * dv.size());
      for (std::size_t i = 0; i < dv.size(); ++i)
        k::quantize_row_q8_0(hot_.data() + i * H, hot_q_.data() + i * q_row, static_cast<std::size_t>(H));
      hot_m_ = k::pack_matrix({k::WeightType::Q8_0, hot_m_.out_dim, H, hot_q_.data(), q_row, false}, hot_packed_);
      std::vector<float>().swap(hot_);
    }
    out_ = &hot_m_;
  }
}

// k (and q when with_q) of n rows of `in`, normed per head, rotated at `positions`; v of the rows.
void BlockDraftRunner::qkv(const BlockLayerWeights& bl, const float* in, std::int64_t n, const std::int32_t* positions,
                           bool with_q) {
  const BlockDraftConfig& c = config();
  const auto eps = static_cast<float>(c.norm_eps);
  const std::int64_t QD = c.n_heads * c.head_dim, KD = c.kv_row();
  k_.resize(static_cast<std::size_t>(n * KD));
  v_.resize(k_.size());
  if (with_q) q_.resize(static_cast<std::size_t>(n * QD));
  std::vector<k::MatmulJob> jobs = {{&bl.layer.wk, k_.data()}, {&bl.layer.wv, v_.data()}};
  if (with_q) jobs.push_back({&bl.layer.wq, q_.data()});
  k::matmul_many(jobs.data(), static_cast<int>(jobs.size()), in, n, precision_);
  auto head_norm = [&](std::vector<float>& x, const float* weight, std::int64_t heads) {
    norm_tmp_.resize(x.size());
    k::rmsnorm_cpu(norm_tmp_.data(), x.data(), weight, static_cast<int>(n * heads), static_cast<int>(c.head_dim), eps);
    x.swap(norm_tmp_);
  };
  head_norm(k_, bl.k_norm, c.n_kv_heads);
  if (with_q) head_norm(q_, bl.q_norm, c.n_heads);
  rope_.resize(static_cast<std::size_t>(n * c.head_dim));
  k::rope_table_cpu(positions, n, c.head_dim, c.rope_base, rope_.data());
  k::rope_apply_cpu(k_.data(), n, c.n_kv_heads, c.head_dim, c.head_dim, rope_.data(), true);
  if (with_q) k::rope_apply_cpu(q_.data(), n, c.n_heads, c.head_dim, c.head_dim, rope_.data(), true);
}

void BlockDraftRunner::project_context(const float* features, std::int64_t n) {
  const BlockDraftConfig& c = config();
  const std::int64_t H = c.hidden;
  x_.resize(static_cast<std::size_t>(n * H));
  c_.resize(x_.size());
  k::matmul(w_->fc(), features, n, x_.data(), precision_);
  k::rmsnorm_cpu(c_.data(), x_.data(), w_->hidden_norm(), static_cast<int>(n), static_cast<int>(H),
                 static_cast<float>(c.norm_eps));
}

void BlockDraftRunner::context(const float* features, std::int64_t n, const std::int32_t* positions) {
  const BlockDraftConfig& c = config();
  project_context(features, n);
  for (std::int64_t l = 0; l < c.n_layers; ++l) {
    qkv(w_->layers()[static_cast<std::size_t>(l)], c_.data(), n, positions, false);
    ctx_k_[static_cast<std::size_t>(l)] = k_;
    ctx_v_[static_cast<std::size_t>(l)] = v_;
  }
}

void BlockDraftRunner::block(const std::int32_t* tokens, std::int64_t b, std::int64_t first_pos,
                             const std::vector<k::KvSegment>& prefix, std::vector<float>& logits,
                             const FreshContext* fresh) {
  const BlockDraftConfig& c = config();
  const std::int64_t H = c.hidden, QD = c.n_heads * c.head_dim, KD = c.kv_row();
  const auto eps = static_cast<float>(c.norm_eps);
  if (b < 2 || b > 64 || static_cast<std::int64_t>(prefix.size()) != c.n_layers)
    throw std::logic_error("BlockDraftRunner::block: 2 to 64 rows and one prefix per layer");
  const std::int64_t nc = fresh ? fresh->n : 0;
  if (nc < 0 || nc > kMaxFresh || (nc > 0 && !fresh->write))
    throw std::logic_error(
        "BlockDraftRunner::block: at most kMaxFresh fresh context rows, and somewhere to write them");
  // The rows each layer's q/k/v products take: the fresh context rows (the same in every layer), then
  // the block's normed rows.
  in_.resize(static_cast<std::size_t>((nc + b) * H));
  if (nc > 0) {
    project_context(fresh->features, nc);
    std::copy(c_.begin(), c_.end(), in_.begin());
  }
  x_.resize(static_cast<std::size_t>(b * H));
  for (std::int64_t i = 0; i < b; ++i) {
    k::weight_row(target_->embedding(), tokens[i], x_.data() + i * H);
    if (c.embed_scale != 1.0)
      for (std::int64_t d = 0; d < H; ++d) x_[static_cast<std::size_t>(i * H + d)] *= static_cast<float>(c.embed_scale);
  }
  std::vector<std::int32_t> pos(static_cast<std::size_t>(nc + b));
  for (std::int64_t i = 0; i < nc; ++i) pos[static_cast<std::size_t>(i)] = fresh->positions[i];
  for (std::int64_t i = 0; i < b; ++i) pos[static_cast<std::size_t>(nc + i)] = static_cast<std::int32_t>(first_pos + i);
  const std::uint64_t all = b == 64 ? ~0ull : (1ull << b) - 1;
  const std::vector<std::uint64_t> mask(static_cast<std::size_t>(b), all);  // non-causal inside the block
  static const std::int32_t page0 = 0;
  att_.resize(static_cast<std::size_t>(b * QD));
  for (std::int64_t l = 0; l < c.n_layers; ++l) {
    const BlockLayerWeights& bl = w_->layers()[static_cast<std::size_t>(l)];
    k::rmsnorm_cpu(in_.data() + nc * H, x_.data(), bl.layer.attn_norm, static_cast<int>(b), static_cast<int>(H), eps);
    qkv(bl, in_.data(), nc + b, pos.data(), true);
    if (nc > 0) fresh->write(static_cast<int>(l), k_.data(), v_.data());
    const k::PagedKvView rows{k_.data() + nc * KD, v_.data() + nc * KD, &page0, 64, 64 * KD, KD};
    k::attention_segments_cpu(q_.data() + nc * QD, b, c.n_heads, c.n_kv_heads, c.head_dim,
                              prefix[static_cast<std::size_t>(l)], {rows, 0, b}, mask.data(),
                              1.0f / std::sqrt(static_cast<float>(c.head_dim)), att_.data());
    layer_tail(bl.layer, b, H, c.ffn, eps, precision_, att_.data(), x_.data(), tail_);
  }
  // Rows 1 … b−1: the drafter's final norm, the target's output head.
  const std::int64_t m = b - 1;
  xn_.resize(static_cast<std::size_t>(m * H));
  k::rmsnorm_cpu(xn_.data(), x_.data() + H, w_->norm(), static_cast<int>(m), static_cast<int>(H), eps);
  logits.resize(static_cast<std::size_t>(m * out_->out_dim));
  k::matmul(*out_, xn_.data(), m, logits.data(), precision_);
  const auto mult = static_cast<float>(c.output_multiplier), cap = static_cast<float>(c.logit_softcap);
  if (mult != 1.0f)
    for (float& v : logits) v *= mult;
  if (cap > 0.0f)
    for (float& v : logits) v = std::tanh(v / cap) * cap;
}

float BlockDraftRunner::markov(std::int32_t prev, std::int64_t row, float* logits_row) {
  const BlockDraftConfig& c = config();
  if (!c.dspark) throw std::logic_error("BlockDraftRunner::markov: a DSPARK drafter only");
  const std::int64_t H = c.hidden, r = c.markov_rank;
  // A lookup and r·Vd products per row: W2 · e through the float32 matmul kernel (the same bits on every
  // instruction path and in every precision), e zero-padded to W2's padded rank.
  const float* e = w_->markov_w1() + static_cast<std::int64_t>(prev) * r;  // e = W1[prev]
  const k::WeightMatrix& w2 = w_->markov_w2();
  const std::int64_t vd = out_->out_dim;
  if (row > 0 || c.markov_first_row) {  // markov_first_row false: the first row stays the backbone's
    e_pad_.assign(static_cast<std::size_t>(w2.in_dim), 0.0f);
    std::copy_n(e, r, e_pad_.begin());
    bias_.resize(static_cast<std::size_t>(vd));
    k::matmul(w2, e_pad_.data(), 1, bias_.data());
    for (std::int64_t v = 0; v < vd; ++v) logits_row[v] += bias_[static_cast<std::size_t>(v)];
  }
  const float* cw = w_->confidence_w();
  const float* h = xn_.data() + row * H;
  double z = w_->confidence_b();
  for (std::int64_t j = 0; j < H; ++j) z += static_cast<double>(cw[j]) * h[j];
  for (std::int64_t j = 0; j < r; ++j) z += static_cast<double>(cw[H + j]) * e[j];
  return static_cast<float>(1.0 / (1.0 + std::exp(-z)));
}

BlockDraftConfig write_random_block_drafter(const ModelInfo& t, const BlockDrafterSpec& spec, const std::string& out) {
  const std::int64_t H = t.hidden_size, nh = t.num_heads, nkv = t.num_kv_heads, hd = H / nh, F = t.ffn_hidden_size;
  std::vector<std::int32_t> ids = spec.target_layer_ids;
  if (ids.empty()) {
    const auto L = static_cast<std::int32_t>(t.num_layers);
    ids = {std::min(1, L - 1), std::max(0, L / 2 - 1), std::max(0, L - 2)};
  }
  std::mt19937 rng(spec.seed);
  std::normal_distribution<float> dist(0.0f, spec.scale);
  std::vector<std::pair<std::string, HfTensor>> ts;
  auto mat = [&](const std::string& name, std::int64_t rows, std::int64_t cols) {
    HfTensor x{{static_cast<std::uint64_t>(rows), static_cast<std::uint64_t>(cols)}, {}};
    x.values.resize(static_cast<std::size_t>(rows * cols));
    for (auto& v : x.values) v = dist(rng);
    ts.emplace_back(name, std::move(x));
  };
  auto ones = [&](const std::string& name, std::int64_t n) {
    ts.emplace_back(name,
                    HfTensor{{static_cast<std::uint64_t>(n)}, std::vector<float>(static_cast<std::size_t>(n), 1)});
  };
  mat("fc.weight", H, H * static_cast<std::int64_t>(ids.size()));
  ones("hidden_norm.weight", H);
  ones("norm.weight", H);
  for (std::int64_t i = 0; i < spec.layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    ones(p + "input_layernorm.weight", H);
    ones(p + "post_attention_layernorm.weight", H);
    mat(p + "self_attn.q_proj.weight", nh * hd, H);
    mat(p + "self_attn.k_proj.weight", nkv * hd, H);
    mat(p + "self_attn.v_proj.weight", nkv * hd, H);
    mat(p + "self_attn.o_proj.weight", H, nh * hd);
    ones(p + "self_attn.q_norm.weight", hd);
    ones(p + "self_attn.k_norm.weight", hd);
    mat(p + "mlp.gate_proj.weight", F, H);
    mat(p + "mlp.up_proj.weight", F, H);
    mat(p + "mlp.down_proj.weight", H, F);
  }
  std::vector<std::int32_t> vocab;
  if (spec.draft_vocab > 0) {  // the first ids of a seeded permutation, ascending
    std::vector<std::int32_t> perm(static_cast<std::size_t>(t.vocab_size));
    for (std::size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<std::int32_t>(i);
    std::shuffle(perm.begin(), perm.end(), rng);
    vocab.assign(perm.begin(), perm.begin() + std::min<std::int64_t>(spec.draft_vocab, t.vocab_size));
    std::sort(vocab.begin(), vocab.end());
  }
  if (spec.markov_rank > 0) {  // DSPARK's heads: large enough to move drafts, so the tests see them
    const std::int64_t r = spec.markov_rank,
                       vd = vocab.empty() ? t.vocab_size : static_cast<std::int64_t>(vocab.size());
    std::normal_distribution<float> wide(0.0f, 1.0f);
    auto wide_mat = [&](const std::string& name, std::int64_t rows, std::int64_t cols) {
      HfTensor x{{static_cast<std::uint64_t>(rows), static_cast<std::uint64_t>(cols)}, {}};
      x.values.resize(static_cast<std::size_t>(rows * cols));
      for (auto& v : x.values) v = wide(rng);
      ts.emplace_back(name, std::move(x));
    };
    wide_mat("markov_head.w1.weight", t.vocab_size, r);
    wide_mat("markov_head.w2.weight", vd, r);
    mat("confidence_head.weight", 1, H + r);
    ts.emplace_back("confidence_head.bias", HfTensor{{1}, {1.5f}});
  }
  std::sort(ts.begin(), ts.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  json cfg{{"architectures", {spec.markov_rank > 0 ? "DSparkDraftModel" : "DFlashDraftModel"}},
           {"model_type", "qwen3"},
           {"hidden_size", H},
           {"intermediate_size", F},
           {"num_hidden_layers", spec.layers},
           {"num_attention_heads", nh},
           {"num_key_value_heads", nkv},
           {"head_dim", hd},
           {"rms_norm_eps", t.norm_eps},
           {"rope_theta", t.rope_base},
           {"vocab_size", t.vocab_size},
           {"num_target_layers", t.num_layers},
           {"attention_bias", false},
           {"torch_dtype", "float32"},
           {"dflash_config",
            {{"block_size", spec.block_size},
             {"mask_token_id", spec.mask_token_id >= 0 ? spec.mask_token_id : t.vocab_size - 1},
             {"target_layer_ids", ids}}}};
  if (spec.markov_rank > 0) {
    cfg["dspark_config"] = cfg["dflash_config"];
    cfg["dspark_config"]["markov_rank"] = spec.markov_rank;
    cfg.erase("dflash_config");
  }
  if (!spec.config_patch.empty()) cfg.merge_patch(json::parse(spec.config_patch));
  fs::create_directories(out);
  std::ofstream(fs::path(out) / "config.json") << cfg.dump(2) << "\n";
  if (vocab.empty()) {
    write_safetensors((fs::path(out) / "model.safetensors").string(), ts, {});
  } else {  // F32 tensors and the I32 draft vocabulary
    std::vector<RawTensor> raw;
    for (const auto& [name, x] : ts) {
      RawTensor r{name, "F32", x.shape, std::vector<std::uint8_t>(x.values.size() * 4)};
      std::memcpy(r.bytes.data(), x.values.data(), r.bytes.size());
      raw.push_back(std::move(r));
    }
    RawTensor r{
        "draft_vocab", "I32", {static_cast<std::uint64_t>(vocab.size())}, std::vector<std::uint8_t>(vocab.size() * 4)};
    std::memcpy(r.bytes.data(), vocab.data(), r.bytes.size());
    raw.push_back(std::move(r));
    write_safetensors_raw((fs::path(out) / "model.safetensors").string(), raw);
  }
  BlockDraftConfig c;
  c.path = out;
  c.target_layer_ids = ids;
  c.block_size = spec.block_size;
  c.dspark = spec.markov_rank > 0;
  c.markov_rank = spec.markov_rank;
  return c;
}

}  // namespace specactor::model
