// model/block_drafter.hpp — block drafters (DFLASH, DSPARK), their files and the CPU forward. No CAF here.
//
// A block drafter proposes B−1 tokens in one forward pass. It has N decoder layers of its own (Qwen3's:
// RMSNorm per head on q and k, RoPE on rotate-half pairs, SiLU-gated MLP) and no embedding or output
// head: it uses the target's. Its inputs:
//   context: the target's hidden states of every committed position p, the outputs of K target layers
//            (target_layer_ids) concatenated, c_p = hidden_norm(fc(h_p)); each draft layer l turns c_p
//            into a key k_norm(W_k,l c_p) (RoPE at p) and a value W_v,l c_p, kept in the drafter's KV
//            (only committed context ever lives there);
//   block:   x = embed([root, MASK × (B−1)]) · input_embedding_scale at positions n−1 … n+B−2 (the root
//            is the newest token, not yet in the target's KV). Each layer: y = input_norm(x); q, k, v of
//            y as above; every block row attends to every context key and every block key (non-causal
//            inside the block); x += o_proj(attention); x += MLP(post_attention_norm(x)).
// Row i ≥ 1 of norm(x), through the target's output head (× output_multiplier, then softcapped when
// final_logit_softcapping > 0), gives the draft for position n−1+i.
//
// Files: a Hugging Face folder, config.json + *.safetensors, as the public DFlash checkpoints lay them
// out. config.json: architectures ["DFlashDraftModel"], hidden_size, intermediate_size,
// num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, rms_norm_eps, rope_theta (or
// rope_parameters.rope_theta), vocab_size (optional; must be the target's), and, in "dflash_config" or
// at the top level: block_size (default 16), mask_token_id, target_layer_ids; optional
// input_embedding_scale, output_multiplier, final_logit_softcapping. Tensors: fc.weight [H, K·H],
// hidden_norm.weight, norm.weight, layers.{i}.{input_layernorm,post_attention_layernorm}.weight,
// layers.{i}.self_attn.{q,k,v,o}_proj.weight, layers.{i}.self_attn.{q,k}_norm.weight [head_dim],
// layers.{i}.mlp.{gate,up,down}_proj.weight. Optional (specactor's, not in the published layout):
// draft_vocab, I32 [Vd], ascending target ids: the drafter's logits cover only those rows of the
// target's output head (Vd × H instead of V × H per drafted row), draft i meaning target id
// draft_vocab[i] — the trainer (training/train_dflash.py) scores over the same rows.
//
// DSPARK (specactor's layout, architectures ["DSparkDraftModel"], settings in "dspark_config") is the
// same backbone plus two small heads that run row by row after the block's one forward pass, so each
// draft conditions on the one before it:
//   Markov head: e_i = W1[prev_i] (W1: V × r, indexed by target id; prev_1 = the root, prev_i = draft
//                i−1); the logits of row i are U_i + W2·e_i (W2: Vd × r), U_i the backbone's logits as
//                above (after output_multiplier and softcapping);
//   confidence:  c_i = σ(w·[h_i ; e_i] + b), h_i the normed hidden row i: the predicted probability that
//                draft i is accepted when drafts 1 … i−1 were. The product c_1 ⋯ c_i is draft i's score
//                (drafters::DraftTree::scores), which the budget turns into a verification length.
// Tensors beyond DFLASH's: markov_head.w1.weight [V, r], markov_head.w2.weight [Vd, r],
// confidence_head.weight [1, H + r], confidence_head.bias [1]; "dspark_config" adds markov_rank (r) and
// optionally markov_first_row (default true; false: row 1 gets no Markov term, as its token before —
// the root — is already the block's first input, so the first draft is the backbone's own; its
// confidence still reads e_1).
// These four are read as float32 (from F32, F16 or BF16; any rank) and never quantized.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "config/server_args.hpp"
#include "kernels/cpu/matmul.hpp"
#include "kernels/cpu/ops.hpp"
#include "model/draft_files.hpp"
#include "model/llama.hpp"
#include "model/model_info.hpp"

namespace specactor::model {

struct BlockDraftConfig {
  std::string path;
  bool dspark = false;           // DSparkDraftModel: the Markov and confidence heads follow the backbone
  std::int64_t markov_rank = 0;  // DSPARK: r, the Markov head's rank
  bool markov_first_row = true;  // DSPARK: false = the first draft row gets no Markov term (the backbone's)
  std::int64_t hidden = 0, ffn = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  double rope_base = 10000.0, norm_eps = 1e-6;
  std::int64_t block_size = 16;
  std::int32_t mask_token_id = -1;
  std::vector<std::int32_t> target_layer_ids;  // target layers whose outputs feed the drafter
  double embed_scale = 1.0, output_multiplier = 1.0, logit_softcap = 0.0;
  // specactor's extension: target ids (ascending) whose output-head rows the drafter's logits cover;
  // empty = the whole vocabulary (as the published checkpoints do).
  std::vector<std::int32_t> draft_vocab;
  std::int64_t feature_width() const { return hidden * static_cast<std::int64_t>(target_layer_ids.size()); }
  std::int64_t kv_row() const { return n_kv_heads * head_dim; }
  nlohmann::json to_json() const;
};

struct BlockLayerWeights {
  LlamaLayer layer;  // attn_norm = input_layernorm, ffn_norm = post_attention_layernorm
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
};

class BlockDraftWeights {
 public:
  // Reads a DFLASH drafter and checks it against the target and the context length: every problem is a
  // GgufError naming the file and the config field or tensor. `quantize_to` as for heads (Q8_0/Q4_1
  // quantize float matrices at load; F32 keeps them).
  static std::shared_ptr<const BlockDraftWeights> load(const std::string& path, const LlamaConfig& target,
                                                       std::int64_t context_length, config::LoadFormat format,
                                                       kernels::WeightType quantize_to = kernels::WeightType::F32);
  const BlockDraftConfig& config() const { return cfg_; }
  const std::vector<BlockLayerWeights>& layers() const { return layers_; }
  const kernels::WeightMatrix& fc() const { return fc_; }
  const float* hidden_norm() const { return hidden_norm_; }
  const float* norm() const { return norm_; }
  // DSPARK only, float32 row-major: W1 [V × r], W2 [Vd × r'] (r' = r rounded up to 32, zero columns
  // past r), the confidence weights [H + r] and bias.
  const float* markov_w1() const { return w1_.data(); }
  const kernels::WeightMatrix& markov_w2() const { return w2m_; }
  const float* confidence_w() const { return conf_w_.data(); }
  float confidence_b() const { return conf_b_; }

 private:
  BlockDraftConfig cfg_;
  std::shared_ptr<const TensorSource> source_;
  std::vector<BlockLayerWeights> layers_;
  kernels::WeightMatrix fc_;
  const float* hidden_norm_ = nullptr;
  const float* norm_ = nullptr;
  std::vector<float> w1_, w2_, conf_w_;
  kernels::WeightMatrix w2m_;
  float conf_b_ = 0.0f;
  std::vector<std::vector<std::uint8_t>> owned_;
};

// Whether a checkpoint folder is a block drafter (its config.json names DFlashDraftModel or
// DSparkDraftModel).
bool is_block_drafter_checkpoint(const std::string& path);

// The CPU forward of a block drafter.
class BlockDraftRunner {
 public:
  BlockDraftRunner(std::shared_ptr<const BlockDraftWeights> drafter, std::shared_ptr<const LlamaWeights> target,
                   kernels::Precision precision);
  const BlockDraftConfig& config() const { return w_->config(); }

  // n committed positions' target features (n × feature_width) → each layer's context keys and values:
  // ctx_k(l), ctx_v(l) hold n rows of kv_row floats.
  void context(const float* features, std::int64_t n, const std::int32_t* positions);
  const float* ctx_k(int layer) const { return ctx_k_[static_cast<std::size_t>(layer)].data(); }
  const float* ctx_v(int layer) const { return ctx_v_[static_cast<std::size_t>(layer)].data(); }
  // Logits per drafted row, and the target id of logit column i.
  std::int64_t vocab() const { return out_->out_dim; }
  std::int32_t to_target(std::int64_t i) const {
    return config().draft_vocab.empty() ? static_cast<std::int32_t>(i)
                                        : config().draft_vocab[static_cast<std::size_t>(i)];
  }

  // Context rows a block takes in on its way (see block()): n committed positions' features, and where
  // each layer's keys and values of them go (n rows of kv_row floats each) before that layer's
  // attention reads its prefix.
  struct FreshContext {
    const float* features = nullptr;  // n × feature_width
    std::int64_t n = 0;
    const std::int32_t* positions = nullptr;
    std::function<void(int layer, const float* k, const float* v)> write;
  };
  // At most this many fresh context rows ride along with a block; more are taken in by context() first.
  static constexpr std::int64_t kMaxFresh = 16;

  // One block of `b` tokens (b ≤ 64) from position `first_pos`, each layer attending to prefix[layer]
  // (its context KV) and to the whole block: the logits of rows 1 … b−1 ((b−1) × vocab(), over the
  // draft vocabulary when the drafter has one). With `fresh` (n ≤ kMaxFresh rows), each layer first
  // computes those rows' keys and values in the same matrix products as the block's own rows and hands
  // them to fresh->write, so prefix[layer] must already span them: the same values as context() and a
  // write of its rows before block(), bit for bit (a row's product does not depend on the rows beside
  // it), with each layer's k/v weights read once per round instead of twice.
  void block(const std::int32_t* tokens, std::int64_t b, std::int64_t first_pos,
             const std::vector<kernels::KvSegment>& prefix, std::vector<float>& logits,
             const FreshContext* fresh = nullptr);
  // DSPARK, after block(): adds the Markov term of `prev` (the token before draft row `row`, 0-based
  // over the b−1 drafted rows) to that row's logits (vocab() floats) and returns the row's confidence.
  float markov(std::int32_t prev, std::int64_t row, float* logits_row);

 private:
  void qkv(const BlockLayerWeights& ly, const float* in, std::int64_t n, const std::int32_t* positions, bool with_q);
  void project_context(const float* features, std::int64_t n);  // c_ = hidden_norm(fc(features))
  std::shared_ptr<const BlockDraftWeights> w_;
  std::shared_ptr<const LlamaWeights> target_;
  kernels::Precision precision_;
  std::vector<std::vector<float>> ctx_k_, ctx_v_;
  std::vector<float> c_, x_, xn_, in_, e_pad_, q_, k_, v_, att_, rope_, norm_tmp_, bias_;
  std::vector<float> hot_;                        // the draft vocabulary's output rows, float32 (exact precision)
  std::vector<std::uint8_t> hot_q_, hot_packed_;  // the same as Q8_0 (fast precision), and its packed copy
  kernels::WeightMatrix hot_m_;
  LayerTailScratch tail_;
  const kernels::WeightMatrix* out_ = nullptr;  // the output head the logits use
};

// A randomly initialised DFLASH drafter for a target (the tests, `specactor make-head --kind dflash`):
// config.json + model.safetensors in `out`, weights ~ N(0, scale²), norms 1.
struct BlockDrafterSpec {
  std::int64_t layers = 1, block_size = 8;
  std::vector<std::int32_t> target_layer_ids;  // empty: three spread over the target's depth
  std::int32_t mask_token_id = -1;             // -1: the target's last id
  std::int64_t markov_rank = 0;                // > 0: a DSPARK drafter with Markov and confidence heads of this rank
  std::int64_t draft_vocab = 0;                // > 0: a draft vocabulary of the first ids of a seeded permutation
  std::uint32_t seed = 1;
  float scale = 0.02f;
  // Test-only: write config.json with these fields replaced (a JSON object text), to make malformed ones.
  std::string config_patch;
};
BlockDraftConfig write_random_block_drafter(const ModelInfo& target, const BlockDrafterSpec& spec,
                                            const std::string& out);

}  // namespace specactor::model
