// model/head_model.hpp — draft heads that read the target's hidden states: EAGLE (EAGLE-1/2), EAGLE3 and
// MTP (one or more next-token-prediction layers), their files (Hugging Face safetensors + config.json,
// or GGUF with the names below), the start-up checks against the target, and the CPU forward of one
// head layer. No CAF here.
//
// One head layer turns (token t, feature f) into a hidden state and draft logits:
//   EAGLE : x = fc([embed(t); f]) (+ bias); attention input = input_norm(x) when the head has one, else x
//   EAGLE3: f = fc(f) when f is the target's three captured layers (3·hidden wide), else the head's own
//           output; attention input = [input_norm(embed(t)); hidden_norm(f)] (2·hidden wide); residual f
//   MTP   : x = eh_proj([enorm(embed(t)); hnorm(f)]); attention input = input_norm(x)
// then one Llama decoder layer (RoPE attention, SiLU-gated MLP). Logits: out_norm (the head's, else
// the target's final norm) and the head's own output matrix (EAGLE3: over a reduced draft vocabulary,
// mapped back with d2t), else the target's output head. embed is always the target's embedding.
//
// GGUF heads (general.architecture "eagle" | "eagle3" | "mtp", keys under that prefix like llama's:
// embedding_length, feed_forward_length, block_count, attention.head_count(_kv), rope.freq_base,
// attention.layer_norm_rms_epsilon, vocab_size (own output head only), target_block_count;
// eagle3.aux_layers (i32 array), eagle3.d2t (i32 array)). Tensor names, ggml dims [in, out]:
//   fc.weight [k·H, H], fc.bias [H] (EAGLE, optional)           k = 2 (EAGLE), 3 (EAGLE3)
//   blk.{i}.attn_norm.weight  (EAGLE: optional; EAGLE3: the embedding norm)   blk.{i}.hidden_norm.weight (EAGLE3)
//   blk.{i}.enorm.weight, blk.{i}.hnorm.weight, blk.{i}.eh_proj.weight [2H, H], blk.{i}.out_norm.weight (MTP)
//   blk.{i}.attn_q/attn_k/attn_v/attn_output/ffn_norm/ffn_gate/ffn_up/ffn_down.weight (llama's shapes;
//   EAGLE3's q/k/v take 2H inputs), output_norm.weight and output.weight (optional; EAGLE3: required)
// Hugging Face names follow the published checkpoints: EAGLE `fc.weight`, `layers.0.*`; EAGLE3
// `fc.weight`, `midlayer.*` (with `hidden_norm`), `norm.weight`, `lm_head.weight`, `d2t`; MTP the
// DeepSeek-V3 layout `model.layers.{L+i}.{enorm,hnorm,eh_proj,shared_head.norm,shared_head.head}` with
// L = num_hidden_layers and i < num_nextn_predict_layers.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "kernels/cpu/ops.hpp"
#include "model/draft_files.hpp"
#include "model/llama.hpp"

namespace specactor::model {

enum class HeadKind { Eagle, Eagle3, Mtp };
const char* to_string(HeadKind k);

// The draft head's model config. Everything draft-only lives here (the draft vocabulary, the hot
// vocabulary of --speculative-token-map), never in the target's LlamaConfig.
struct HeadConfig {
  HeadKind kind = HeadKind::Eagle;
  std::string path, format;  // format: "gguf" | "safetensors"
  std::int64_t hidden = 0, ffn = 0, n_layers = 1, n_heads = 0, n_kv_heads = 0, head_dim = 0, rope_dim = 0;
  double rope_base = 10000.0, norm_eps = 1e-5;
  bool rope_neox = false;
  std::int64_t own_vocab = 0;            // rows of the head's own output matrix (0: the target's head)
  std::vector<std::int32_t> d2t;         // EAGLE3: draft id -> target id (empty: identity)
  std::vector<std::int32_t> aux_layers;  // target layers whose outputs feed the head (after that layer)
  std::vector<std::int32_t> hot_vocab;   // --speculative-token-map: draft id -> target id
  std::int64_t draft_vocab() const;      // logits per draft row
  std::int64_t feature_width() const { return hidden * static_cast<std::int64_t>(aux_layers.size()); }
  nlohmann::json to_json() const;
};

struct HeadLayerWeights {
  LlamaLayer layer;            // attn_norm may be null (EAGLE-1 layer 0)
  kernels::WeightMatrix proj;  // EAGLE/EAGLE3 fc, MTP eh_proj (EAGLE3: only layer 0)
  const float* proj_bias = nullptr;
  const float* emb_norm = nullptr;     // MTP enorm, EAGLE3 input_layernorm
  const float* hidden_norm = nullptr;  // MTP hnorm, EAGLE3 hidden_norm
  const float* out_norm = nullptr;     // null: the target's final norm
};

class HeadWeights {
 public:
  // Reads and checks a head against the target: hidden size, vocabulary, layer ids, shapes. Every
  // mismatch is a GgufError naming the file and both values. `frozen_kv`: the head attends into the
  // target's KV, so its attention shapes must equal the target's. `hot_vocab`: target ids the draft
  // output head keeps (FR-Spec); empty = all.
  // `quantize_to` Q8_0 or Q4_1: float matrices (F32/F16/BF16) are quantized to it at load, so the fast
  // precision's integer kernels compute them (drafts only: the target's output never depends on it);
  // F32 (the default) keeps them as stored.
  static std::shared_ptr<const HeadWeights> load(const std::string& path, HeadKind kind, const LlamaConfig& target,
                                                 const std::vector<std::int32_t>& hot_vocab, bool frozen_kv,
                                                 config::LoadFormat format,
                                                 kernels::WeightType quantize_to = kernels::WeightType::F32);
  const HeadConfig& config() const { return cfg_; }
  const std::vector<HeadLayerWeights>& layers() const { return layers_; }
  // The draft output matrix (own head, the hot rows of it, or of the target's), null = the target's.
  const kernels::WeightMatrix* output() const { return has_output_ ? &output_ : nullptr; }

 private:
  HeadConfig cfg_;
  std::shared_ptr<const TensorSource> source_;
  std::vector<HeadLayerWeights> layers_;
  kernels::WeightMatrix output_;
  bool has_output_ = false;
  std::vector<std::vector<std::uint8_t>> owned_;
};

// Reads just the config of a head file (for `specactor inspect`), kind taken from the file.
HeadConfig read_head_config(const std::string& path);

// Whether a safetensors folder (or file) is a draft head: its config.json names an Eagle, Eagle3 or
// MTP architecture or has num_nextn_predict_layers. A model checkpoint (LlamaForCausalLM) is not.
bool is_head_checkpoint(const std::string& path);

// Reads --speculative-token-map: token ids separated by whitespace or commas, or a JSON array.
// Throws GgufError naming the file and the offending entry; ids must be < vocab and unique.
std::vector<std::int32_t> read_token_map(const std::string& path, std::int64_t vocab);

// Runs head layers on the CPU for one sequence at a time, in two phases so the caller decides where
// the new K/V rows live (the head's own cache, or scratch next to the target's frozen KV):
// project() computes q/k/v (RoPE applied) for n rows; the caller stores k_rows()/v_rows(); finish()
// attends over (prefix, masked) and returns the layer's output hidden states.
class HeadRunner {
 public:
  HeadRunner(std::shared_ptr<const HeadWeights> head, std::shared_ptr<const LlamaWeights> target,
             kernels::Precision precision = kernels::Precision::Fast);
  const HeadConfig& config() const { return head_->config(); }

  // feature: n rows of `feature_width` floats (the target's features, or a head layer's outputs).
  void project(int layer, const std::int32_t* tokens, const float* feature, std::int64_t feature_width, std::int64_t n,
               const std::int32_t* positions);
  const float* k_rows() const { return k_.data(); }
  const float* v_rows() const { return v_.data(); }
  std::int64_t kv_row() const { return config().n_kv_heads * config().head_dim; }
  void finish(int layer, const kernels::KvSegment& prefix, const kernels::KvSegment& masked, const std::uint64_t* mask,
              std::vector<float>& hidden_out);
  // The rows of several sequences projected together: rows [first_row, first_row + rows) attend to
  // their own sequence's KV; everything else runs over all rows at once.
  struct AttentionPart {
    kernels::KvSegment prefix, masked;
    const std::uint64_t* mask = nullptr;
    std::int64_t first_row = 0, rows = 0;
  };
  void finish(int layer, const std::vector<AttentionPart>& parts, std::vector<float>& hidden_out);
  // finish() for the last row of each part only (hidden_out: one row per part, in order): what a
  // catch-up keeps, the root's output. The same bits as that row of finish() (every row's result is
  // its own, whatever the rows beside it); the other rows' attention, output projection and MLP are
  // not computed — a catch-up over the rows of steps that drafted nothing then costs their K/V only.
  void finish_last(int layer, const std::vector<AttentionPart>& parts, std::vector<float>& hidden_out);
  // Draft logits (n × draft_vocab) of head output rows.
  void logits(int layer, const float* hidden, std::int64_t n, std::vector<float>& out);
  // The target id of a draft id.
  std::int32_t to_target(std::int32_t draft_id) const;
  // The target's final norm applied to rows (EAGLE's features are the normed last hidden state).
  void target_norm(float* rows, std::int64_t n) const;

 private:
  void layer_tail(const LlamaLayer& ly, std::int64_t n, float* x);
  std::shared_ptr<const HeadWeights> head_;
  std::shared_ptr<const LlamaWeights> target_;
  kernels::Precision precision_;
  std::int64_t n_ = 0;
  std::vector<float> in_, x_, xn_, q_, k_, v_, att_, rope_;
  LayerTailScratch tail_;
  std::vector<float> hot_;  // FR-Spec: the hot rows of the output head, float32
  kernels::WeightMatrix hot_m_;
};

}  // namespace specactor::model
