// model/llama.hpp — the Llama-family transformer on the CPU: configuration, weights bound to the
// mmapped GGUF tensors (no copy), and a batched forward pass over a paged KV cache.
//
// Shapes (ggml order, row-major rows of `in` elements): token_embd (vocab, hidden); per layer
// attn_q (hidden, hidden), attn_k/attn_v (kv_dim, hidden), attn_output (hidden, hidden),
// ffn_gate/ffn_up (ffn, hidden), ffn_down (hidden, ffn); norms (hidden); output (vocab, hidden) or
// tied to token_embd.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "config/snapshot.hpp"
#include "kernels/backend.hpp"
#include "kernels/comm.hpp"
#include "kernels/cpu/matmul.hpp"
#include "kernels/cpu/ops.hpp"
#include "model/family.hpp"
#include "model/gguf.hpp"
#include "model/kv_cache.hpp"
#include "model/model_info.hpp"
#include "model/tensor_source.hpp"

namespace specactor::model {

// Hyper-parameters the forward pass uses, after json_model_override_args.
struct LlamaConfig {
  std::int64_t vocab_size = 0, hidden = 0, ffn = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0,
               rope_dim = 0, context_length = 0;
  double rope_base = 10000.0, norm_eps = 1e-5;
  bool rope_neox = false;                    // GGUF llama: adjacent pairs; Hugging Face checkpoints: half split
  bool tied_embeddings = false;              // Hugging Face config's tie_word_embeddings (GGUF: no output.weight)
  Family family = Family::Llama;             // model/family.hpp: what this forward does beyond llama's
  std::int64_t sliding_window = 0;           // window of the sliding layers (0: none)
  std::vector<std::uint8_t> sliding_layers;  // per layer: 1 = sliding window, RoPE base rope_base_local
  double rope_base_local = 0.0, rope_linear_factor = 1.0;
  float attn_scale = 0.0f;  // 0 = 1/√head_dim

  const FamilyDesc& desc() const { return describe(family); }
  bool sliding(std::int64_t layer) const {
    return layer < static_cast<std::int64_t>(sliding_layers.size()) && sliding_layers[static_cast<std::size_t>(layer)];
  }
  float query_scale() const { return attn_scale > 0.0f ? attn_scale : 1.0f / std::sqrt(static_cast<float>(head_dim)); }

  std::int64_t kv_dim() const { return n_kv_heads * head_dim; }
  // From the file's ModelInfo with the JSON overrides applied (the only place they are applied).
  // Throws GgufError naming the override key when it is unknown or of the wrong type.
  static LlamaConfig from(const ModelInfo& info, const std::string& json_overrides);
};

// Binds named tensors of a source as weight matrices / float vectors, checking names, shapes and
// types (errors name the file and tensor). Dummy: random F32 matrices and unit vectors of the same
// shapes. Copies it makes (repacked matrices, converted vectors) go to `owned`.
struct WeightSlice {
  std::int64_t begin = 0, end = 0;  // end 0 = everything
};

class WeightBinder {
 public:
  WeightBinder(const TensorSource& file, bool dummy, std::vector<std::vector<std::uint8_t>>& owned,
               std::uint32_t seed = 1234);
  using Slice = WeightSlice;
  // A matrix of `out` rows of `in` elements (ggml dims [in, out]); optionally only rows [rows) and
  // input columns [cols) (tensor-parallel shards; a column slice must fall on block boundaries).
  kernels::WeightMatrix matrix(const std::string& name, std::int64_t out, std::int64_t in, Slice rows = {},
                               Slice cols = {});
  // A vector of n values as float32 (only elements [slice) when given; plus_one: 1 + each value,
  // for RMSNorm scales stored as w for (1 + w)).
  const float* vector(const std::string& name, std::int64_t n, Slice slice = {}, bool plus_one = false);
  bool has(const std::string& name) const { return file_.find(name) != nullptr; }
  const TensorView& tensor(const std::string& name, const std::vector<std::uint64_t>& dims) const;

 private:
  const TensorSource& file_;
  bool dummy_;
  std::vector<std::vector<std::uint8_t>>& owned_;
  std::mt19937 rng_;
};

struct LlamaLayer {
  kernels::WeightMatrix wq, wk, wv, wo, gate, up, down;
  const float* attn_norm = nullptr;  // (hidden)
  const float* ffn_norm = nullptr;   // (hidden)
  // The families' extras (model/family.hpp), null when the family has none: q/k/v biases (this
  // rank's rows), q/k norms over one head (head_dim), norms of the attention and MLP outputs (hidden).
  const float *q_bias = nullptr, *k_bias = nullptr, *v_bias = nullptr;
  const float *q_norm = nullptr, *k_norm = nullptr;
  const float *post_attn_norm = nullptr, *post_ffn_norm = nullptr;
};

// One rank's share of a tensor-parallel model: attention heads [rank·h/T, (rank+1)·h/T) (and their KV
// heads), MLP columns [rank·F/T, ...), the matching input columns of attn_output and ffn_down. The
// embedding, norms and output head are replicated.
struct TpShard {
  int rank = 0, size = 1;
};

class LlamaWeights {
 public:
  using Progress = std::function<void(std::size_t done, std::size_t total)>;

  // Tensor names: llama.cpp's GGUF names or Hugging Face's.
  enum class Naming { Gguf, HuggingFace };

  // Binds (and pre-faults) the tensors of a Llama model. `num_layers` < 0 = all; K > 0 keeps only
  // the first K layers (self-speculative draft). load_format dummy: random F32 weights of the
  // file's shapes. Errors name the file and the tensor.
  static std::shared_ptr<const LlamaWeights> load(std::shared_ptr<const TensorSource> source, Naming naming,
                                                  const LlamaConfig& cfg, config::LoadFormat format,
                                                  std::int64_t num_layers = -1, const Progress& progress = {},
                                                  TpShard shard = {});

  const LlamaConfig& config() const { return cfg_; }
  const kernels::WeightMatrix& embedding() const { return tok_embd_; }
  const kernels::WeightMatrix& output() const { return output_; }
  const float* output_norm() const { return output_norm_; }
  const std::vector<LlamaLayer>& layers() const { return layers_; }
  std::uint64_t weight_bytes() const { return weight_bytes_; }  // bytes streamed per decode step
  const TensorSource& source() const { return *source_; }
  const TpShard& shard() const { return shard_; }
  // This rank's attention heads, KV heads and MLP width (the whole model when not sharded).
  std::int64_t local_heads() const { return cfg_.n_heads / shard_.size; }
  std::int64_t local_kv_heads() const { return cfg_.n_kv_heads / shard_.size; }
  std::int64_t local_ffn() const { return cfg_.ffn / shard_.size; }

 private:
  LlamaConfig cfg_;
  TpShard shard_;
  std::shared_ptr<const TensorSource> source_;
  kernels::WeightMatrix tok_embd_, output_;
  const float* output_norm_ = nullptr;
  std::vector<LlamaLayer> layers_;
  std::vector<std::vector<std::uint8_t>> owned_;  // repacked matrices, converted norms, dummy weights
  std::uint64_t weight_bytes_ = 0;
};

// One sequence's part of a forward batch.
struct ForwardSeq {
  KvCache::Seq* kv = nullptr;            // new tokens go to slots [kv->length, kv->length + n)
  std::vector<std::int32_t> tokens;      // n new tokens
  std::vector<std::int32_t> positions;   // RoPE positions; empty = kv->length + i
  std::vector<std::uint64_t> mask;       // tree mask, one word per new token (bit j: sees new token j); empty = causal
  std::vector<std::int32_t> logit_rows;  // indices into tokens whose logits are returned
  // Self-speculation (CPU only): the tokens also attend to `prefix_len` slots of another pool's KV
  // — prefix_kv's pages `prefix_pages`, read-only, layer l for layer l — placed before every slot of
  // `kv` (at most 64 of them); positions default to prefix_len + kv->length + i.
  const KvCache* prefix_kv = nullptr;
  const std::vector<std::int32_t>* prefix_pages = nullptr;
  std::int64_t prefix_len = 0;
};

struct ForwardResult {
  std::vector<float> logits;               // (Σ logit_rows, vocab), in batch order
  std::vector<std::vector<float>> hidden;  // per requested layer: (Σ tokens, hidden), residual stream after the layer
};

// Checks a forward batch (KV handles, lengths, token ids, logit rows, masks) and reserves its KV
// pages, all or nothing: on KvExhausted nothing stays reserved. Fills each sequence's old length and
// returns the number of logit rows. Shared by every runner.
std::int64_t prepare_batch(std::vector<ForwardSeq>& batch, KvCache& kv, std::int64_t vocab,
                           std::vector<std::int64_t>& old_len);

// A forward pass on some device over a host-managed page table (the CPU runner below, or the CUDA
// one of model/runner.hpp). One per worker; not shared across threads.
class ForwardRunner {
 public:
  virtual ~ForwardRunner() = default;
  virtual const LlamaWeights& weights() const = 0;
  // Appends every sequence's tokens to its KV cache and returns the requested logits / hidden
  // states. All-or-nothing on KV: when the pool is short, KvExhausted is thrown before anything runs.
  // Tensor parallel: every rank calls forward with the same batch and its own KV cache (its KV
  // heads only); `comm` all-reduces the attention output and MLP projections. All ranks end with
  // identical hidden states and logits.
  virtual void forward(std::vector<ForwardSeq>& batch, KvCache& kv, ForwardResult& out,
                       const std::vector<int>& hidden_layers = {}, kernels::Communicator* comm = nullptr) = 0;
  // Copies the K/V rows of slot `from` to slot `to` wherever this runner keeps them (compaction).
  virtual void copy_slot(KvCache& kv, const KvCache::Seq& seq, std::int64_t from, std::int64_t to) = 0;
  virtual std::string device() const = 0;  // "cpu", "cuda:0", ...
  // The op table of the device this runner computes on (verification runs its spec kernels).
  virtual const kernels::Backend& backend() const { return kernels::cpu_backend(); }
};

// Runs the model on the CPU; owns its scratch buffers.
class LlamaRunner final : public ForwardRunner {
 public:
  // `threads`: the size of the process's one compute pool (kernels/cpu/pool.hpp; 0 = every core).
  // `precision`: Fast (int8-quantized activations, integer dot products) or Exact (float32
  // activations; matches a float64 reference to ~1e-5). Within one precision a row's result never
  // depends on its batch.
  explicit LlamaRunner(std::shared_ptr<const LlamaWeights> weights, int threads = 0,
                       kernels::Precision precision = kernels::Precision::Fast);
  kernels::Precision precision() const { return precision_; }
  const LlamaWeights& weights() const override { return *w_; }
  void copy_slot(KvCache& kv, const KvCache::Seq& seq, std::int64_t from, std::int64_t to) override {
    kv.copy_slot(seq, from, to);
  }
  std::string device() const override { return "cpu"; }

  void forward(std::vector<ForwardSeq>& batch, KvCache& kv, ForwardResult& out,
               const std::vector<int>& hidden_layers = {}, kernels::Communicator* comm = nullptr) override;

 private:
  bool add_window_jobs(const ForwardSeq& s, const kernels::PagedKvView& view, std::int64_t old_len, std::int64_t r0,
                       std::int64_t QD);
  std::shared_ptr<const LlamaWeights> w_;
  kernels::Precision precision_;
  std::vector<float> x_, xn_, q_, k_, v_, att_, tmp_, gate_, up_, rope_cs_, rope_local_cs_, norm_tmp_;
  std::vector<std::uint64_t> window_mask_;        // sliding layers: one mask word per split-off query
  std::vector<kernels::AttentionJob> attn_jobs_;  // one per sequence, rebuilt per layer
  std::vector<KvCache::Seq> foreign_;             // per sequence: another pool's page table (prefix_kv)
  std::vector<std::vector<std::uint64_t>> own_mask_;
  std::vector<std::int32_t> pos_;
};

}  // namespace specactor::model
