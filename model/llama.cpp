// model/llama.cpp — Llama weights binding and the batched CPU forward pass.
#include "model/llama.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>

#include "config/error.hpp"
#include "config/input.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/pool.hpp"
#include "kernels/cpu/quant.hpp"
#include "kernels/cpu/rmsnorm.hpp"

namespace specactor::model {

namespace k = specactor::kernels;

LlamaConfig LlamaConfig::from(const ModelInfo& info, const std::string& json_overrides) {
  LlamaConfig c;
  c.vocab_size = info.vocab_size;
  c.hidden = info.hidden_size;
  c.ffn = info.ffn_hidden_size;
  c.n_layers = info.num_layers;
  c.n_heads = info.num_heads;
  c.n_kv_heads = info.num_kv_heads;
  c.head_dim = info.head_dim;
  c.rope_dim = info.rope_dim;
  c.context_length = info.context_length;
  c.tied_embeddings = info.tied_embeddings;
  c.rope_base = info.rope_base;
  c.norm_eps = info.norm_eps;
  c.family = info.family;
  c.sliding_window = info.sliding_window;
  c.sliding_layers = info.sliding_layers;
  c.rope_base_local = info.rope_base_local;
  c.rope_linear_factor = info.rope_linear_factor;
  c.attn_scale = static_cast<float>(info.attn_scale);
  const auto j = config::parse_json(json_overrides.empty() ? "{}" : json_overrides, "--json-model-override-args");
  const std::string where = info.path + ": --json-model-override-args";
  for (const auto& [key, v] : j.items()) {
    if (key == "rope_theta" && v.is_number() && bad_rope_base(v.get<double>()).empty())
      c.rope_base = v.get<double>();
    else if (key == "rms_norm_eps" && v.is_number() && bad_norm_eps(v.get<double>()).empty())
      c.norm_eps = v.get<double>();
    else if (key == "num_hidden_layers" && v.is_number_integer() && v.get<std::int64_t>() >= 1 &&
             v.get<std::int64_t>() <= info.num_layers)
      c.n_layers = v.get<std::int64_t>();
    else if (key == "rope_theta" || key == "rms_norm_eps" || key == "num_hidden_layers")
      throw GgufError(where + ": bad value " + config::printable(v.dump()) + " for '" + key + "'" +
                      (key == "num_hidden_layers" ? " (expected 1 .. " + std::to_string(info.num_layers) + ")"
                       : key == "rms_norm_eps"    ? " (expected a number in [1e-12, 1))"
                                                  : " (expected a finite number of at least 1)"));
    else
      throw GgufError(where + ": unknown key '" + config::printable(key) +
                      "' (known: rope_theta, rms_norm_eps, num_hidden_layers)");
  }
  return c;
}

namespace {

constexpr std::uint32_t kGgmlQ5_0 = 6;

// Q5_0 blocks (f16 scale d, 32 high bits, 16 bytes of low nibbles; value (q − 16)·d with q in 0..31)
// as Q8_0 blocks (the same d, int8 q − 16): the same numbers exactly, in a format the kernels compute.
std::vector<std::uint8_t> q5_0_as_q8_0(const std::uint8_t* src, std::size_t blocks) {
  std::vector<std::uint8_t> out(blocks * 34);
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::uint8_t* in = src + b * 22;
    std::uint8_t* o = out.data() + b * 34;
    o[0] = in[0];
    o[1] = in[1];
    const std::uint32_t qh = static_cast<std::uint32_t>(in[2]) | static_cast<std::uint32_t>(in[3]) << 8 |
                             static_cast<std::uint32_t>(in[4]) << 16 | static_cast<std::uint32_t>(in[5]) << 24;
    for (int j = 0; j < 16; ++j) {
      const int lo = (in[6 + j] & 0x0F) | static_cast<int>(((qh >> j) << 4) & 0x10);
      const int hi = (in[6 + j] >> 4) | static_cast<int>((qh >> (j + 12)) & 0x10);
      o[2 + j] = static_cast<std::uint8_t>(static_cast<std::int8_t>(lo - 16));
      o[2 + 16 + j] = static_cast<std::uint8_t>(static_cast<std::int8_t>(hi - 16));
    }
  }
  return out;
}

std::string shape_str(const std::vector<std::uint64_t>& d) {
  std::string s = "[";
  for (std::size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

}  // namespace

WeightBinder::WeightBinder(const TensorSource& file, bool dummy, std::vector<std::vector<std::uint8_t>>& owned,
                           std::uint32_t seed)
    : file_(file), dummy_(dummy), owned_(owned), rng_(seed) {}

const TensorView& WeightBinder::tensor(const std::string& name, const std::vector<std::uint64_t>& dims) const {
  const std::string& path = file_.path();
  const TensorView* t = file_.find(name);
  if (!t) throw GgufError(path + ": missing tensor '" + name + "' (expected shape " + shape_str(dims) + ")");
  if (t->dims != dims)
    throw GgufError(path + ": tensor '" + name + "' has shape " + shape_str(t->dims) + ", expected " + shape_str(dims));
  if (!k::weight_type_supported(t->ggml_type) && !(t->ggml_type == kGgmlQ5_0 && dims.size() == 2))
    throw GgufError(path + ": tensor '" + name + "' has type " +
                    std::string(ggml_type_info(t->ggml_type) ? ggml_type_info(t->ggml_type)->name : "?") +
                    ", which specactor cannot compute (supported: F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q4_K Q6_K, and Q5_0 "
                    "matrices, read as Q8_0)");
  return *t;
}

k::WeightMatrix WeightBinder::matrix(const std::string& name, std::int64_t out, std::int64_t in, Slice rows,
                                     Slice cols) {
  const TensorView& t = tensor(name, {static_cast<std::uint64_t>(in), static_cast<std::uint64_t>(out)});
  if (in % 32 != 0)
    throw GgufError(file_.path() + ": tensor '" + name + "' rows of " + std::to_string(in) +
                    " are not a multiple of 32");
  if (rows.end == 0) rows = {0, out};
  if (cols.end == 0) cols = {0, in};
  k::WeightMatrix full;
  full.out_dim = out;
  full.in_dim = in;
  if (dummy_) {
    // The whole matrix is drawn (same values whatever the slice), then sliced like a file's.
    std::normal_distribution<float> dist(0.0f, 0.02f);
    auto& buf = owned_.emplace_back(static_cast<std::size_t>(out * in) * sizeof(float));
    auto* f = reinterpret_cast<float*>(buf.data());
    for (std::int64_t i = 0; i < out * in; ++i) f[i] = dist(rng_);
    full.type = k::WeightType::F32;
    full.data = buf.data();
  } else if (t.ggml_type == kGgmlQ5_0) {
    auto& buf = owned_.emplace_back(q5_0_as_q8_0(t.data, static_cast<std::size_t>(out * in / 32)));
    full.type = k::WeightType::Q8_0;
    full.data = buf.data();
  } else {
    full.type = static_cast<k::WeightType>(t.ggml_type);
    full.data = t.data;
  }
  full.row_stride = k::row_bytes(full.type, static_cast<std::size_t>(in));
  k::WeightMatrix m = full;
  m.out_dim = rows.end - rows.begin;
  m.data = full.data + static_cast<std::size_t>(rows.begin) * full.row_stride;  // a row slice is a pointer offset
  if (cols.begin != 0 || cols.end != in) {
    // A column slice (tensor parallelism: the input features of this rank): copy the block range of
    // every row. The slice must start and end on a block boundary of the format.
    const std::size_t width = static_cast<std::size_t>(cols.end - cols.begin);
    const std::size_t off = k::row_bytes(full.type, static_cast<std::size_t>(cols.begin));
    const std::size_t bytes = k::row_bytes(full.type, width);
    const std::size_t blk = k::block_elems(full.type);
    if (static_cast<std::size_t>(cols.begin) % blk != 0 || width % blk != 0 || width % 32 != 0)
      throw GgufError(file_.path() + ": tensor '" + name + "' cannot be split at column " + std::to_string(cols.begin) +
                      " (not a block boundary of its format, or a slice not a multiple of 32)");
    auto& buf = owned_.emplace_back(bytes * static_cast<std::size_t>(m.out_dim));
    for (std::int64_t r = 0; r < m.out_dim; ++r)
      std::memcpy(buf.data() + static_cast<std::size_t>(r) * bytes,
                  m.data + static_cast<std::size_t>(r) * full.row_stride + off, bytes);
    m.data = buf.data();
    m.in_dim = cols.end - cols.begin;
    m.row_stride = bytes;
  }
  std::vector<std::uint8_t> packed;
  m = k::pack_matrix(m, packed);  // a copy only for the formats the SIMD loops want repacked
  if (!packed.empty()) owned_.push_back(std::move(packed));
  return m;
}

const float* WeightBinder::vector(const std::string& name, std::int64_t n, Slice slice, bool plus_one) {
  const TensorView& t = tensor(name, {static_cast<std::uint64_t>(n)});
  if (slice.end == 0) slice = {0, n};
  const bool whole = slice.begin == 0 && slice.end == n;
  if (!dummy_ && !plus_one && whole && t.ggml_type == 0 &&
      reinterpret_cast<std::uintptr_t>(t.data) % alignof(float) == 0)
    return reinterpret_cast<const float*>(t.data);
  std::vector<float> all(static_cast<std::size_t>(n), 1.0f);
  if (!dummy_)
    k::dequantize_row(static_cast<k::WeightType>(t.ggml_type), t.data, all.data(), static_cast<std::size_t>(n));
  auto& buf = owned_.emplace_back(static_cast<std::size_t>(slice.end - slice.begin) * sizeof(float));
  auto* f = reinterpret_cast<float*>(buf.data());
  for (std::int64_t i = slice.begin; i < slice.end; ++i)
    f[i - slice.begin] =
        plus_one && !dummy_ ? 1.0f + all[static_cast<std::size_t>(i)] : all[static_cast<std::size_t>(i)];
  return f;
}

std::shared_ptr<const LlamaWeights> LlamaWeights::load(std::shared_ptr<const TensorSource> file, Naming naming,
                                                       const LlamaConfig& cfg, config::LoadFormat format,
                                                       std::int64_t num_layers, const Progress& progress,
                                                       TpShard shard) {
  auto w = std::shared_ptr<LlamaWeights>(new LlamaWeights());
  w->cfg_ = cfg;
  w->shard_ = shard;
  const std::int64_t T = shard.size;
  auto divides = [&](std::int64_t n, const char* what) {
    if (T < 1 || n % T != 0)
      throw GgufError(file->path() + ": --tp-size " + std::to_string(T) + " does not divide the model's " +
                      std::to_string(n) + " " + what);
  };
  divides(cfg.n_heads, "attention heads");
  divides(cfg.n_kv_heads, "KV heads");
  divides(cfg.ffn, "MLP columns");
  if (num_layers > 0) {
    if (num_layers > cfg.n_layers)
      throw GgufError(file->path() + ": asked for the first " + std::to_string(num_layers) + " layers of a " +
                      std::to_string(cfg.n_layers) + "-layer model");
    w->cfg_.n_layers = num_layers;
  }
  w->source_ = file;
  const bool hf = naming == Naming::HuggingFace;
  auto layer_name = [hf](std::int64_t l, const char* gguf, const char* hf_name) {
    return hf ? "model.layers." + std::to_string(l) + "." + hf_name : "blk." + std::to_string(l) + "." + gguf;
  };
  WeightBinder bind(*file, format == config::LoadFormat::Dummy, w->owned_);
  const FamilyDesc& fam = cfg.desc();
  const bool plus_one = hf && fam.hf_norm_plus_one;  // GGUF files hold 1 + w already
  auto matrix = [&](const std::string& name, std::int64_t out, std::int64_t in) { return bind.matrix(name, out, in); };
  auto norm = [&](const std::string& name, std::int64_t n) { return bind.vector(name, n, {}, plus_one); };

  const LlamaConfig& c = w->cfg_;
  const std::size_t total = static_cast<std::size_t>(c.n_layers) + 2;
  w->tok_embd_ = matrix(hf ? "model.embed_tokens.weight" : "token_embd.weight", c.vocab_size, c.hidden);
  w->output_norm_ = norm(hf ? "model.norm.weight" : "output_norm.weight", c.hidden);
  const char* head = hf ? "lm_head.weight" : "output.weight";
  if (hf && !file->find(head) && !c.tied_embeddings)
    throw GgufError(file->path() + ": the output projection '" + head +
                    "' is missing and config.json does not tie the embeddings (tie_word_embeddings is false)");
  w->output_ = file->find(head) ? matrix(head, c.vocab_size, c.hidden) : w->tok_embd_;
  if (progress) progress(1, total);
  for (std::int64_t l = 0; l < c.n_layers; ++l) {
    LlamaLayer L;
    L.attn_norm = norm(layer_name(l, "attn_norm.weight", "input_layernorm.weight"), c.hidden);
    const std::int64_t r = shard.rank, QD = c.n_heads * c.head_dim, KD = c.kv_dim();
    const WeightBinder::Slice q_rows{r * QD / T, (r + 1) * QD / T}, kv_rows{r * KD / T, (r + 1) * KD / T};
    const WeightBinder::Slice f_rows{r * c.ffn / T, (r + 1) * c.ffn / T};
    L.wq = bind.matrix(layer_name(l, "attn_q.weight", "self_attn.q_proj.weight"), QD, c.hidden, q_rows);
    L.wk = bind.matrix(layer_name(l, "attn_k.weight", "self_attn.k_proj.weight"), KD, c.hidden, kv_rows);
    L.wv = bind.matrix(layer_name(l, "attn_v.weight", "self_attn.v_proj.weight"), KD, c.hidden, kv_rows);
    L.wo = bind.matrix(layer_name(l, "attn_output.weight", "self_attn.o_proj.weight"), c.hidden, QD, {}, q_rows);
    L.ffn_norm = norm(layer_name(l, "ffn_norm.weight", std::string(fam.hf_ffn_norm).c_str()), c.hidden);
    if (fam.qkv_bias) {
      L.q_bias = bind.vector(layer_name(l, "attn_q.bias", "self_attn.q_proj.bias"), c.n_heads * c.head_dim, q_rows);
      L.k_bias = bind.vector(layer_name(l, "attn_k.bias", "self_attn.k_proj.bias"), KD, kv_rows);
      L.v_bias = bind.vector(layer_name(l, "attn_v.bias", "self_attn.v_proj.bias"), KD, kv_rows);
    }
    if (fam.qk_norm) {
      L.q_norm = norm(layer_name(l, "attn_q_norm.weight", "self_attn.q_norm.weight"), c.head_dim);
      L.k_norm = norm(layer_name(l, "attn_k_norm.weight", "self_attn.k_norm.weight"), c.head_dim);
    }
    if (fam.sandwich_norms) {
      L.post_attn_norm =
          norm(layer_name(l, "post_attention_norm.weight", std::string(fam.hf_post_attn_norm).c_str()), c.hidden);
      L.post_ffn_norm =
          norm(layer_name(l, "post_ffw_norm.weight", std::string(fam.hf_post_ffn_norm).c_str()), c.hidden);
    }
    L.gate = bind.matrix(layer_name(l, "ffn_gate.weight", "mlp.gate_proj.weight"), c.ffn, c.hidden, f_rows);
    L.up = bind.matrix(layer_name(l, "ffn_up.weight", "mlp.up_proj.weight"), c.ffn, c.hidden, f_rows);
    L.down = bind.matrix(layer_name(l, "ffn_down.weight", "mlp.down_proj.weight"), c.hidden, c.ffn, {}, f_rows);
    // Pre-fault the layer's pages so the first request does not pay for the disk.
    volatile std::uint8_t sink = 0;
    for (const auto* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.gate, &L.up, &L.down}) {
      const std::size_t bytes = static_cast<std::size_t>(m->out_dim) * m->row_stride;
      for (std::size_t off = 0; off < bytes; off += 4096) sink = sink + m->data[off];
      w->weight_bytes_ += bytes;
    }
    w->layers_.push_back(L);
    if (progress) progress(static_cast<std::size_t>(l) + 2, total);
  }
  w->weight_bytes_ += static_cast<std::uint64_t>(w->output_.out_dim) * w->output_.row_stride;
  {
    volatile std::uint8_t sink = 0;
    for (const auto* m : {&w->tok_embd_, &w->output_}) {
      const std::size_t bytes = static_cast<std::size_t>(m->out_dim) * m->row_stride;
      for (std::size_t off = 0; off < bytes; off += 4096) sink = sink + m->data[off];
    }
  }
  if (progress) progress(total, total);
  return w;
}

std::int64_t prepare_batch(std::vector<ForwardSeq>& batch, KvCache& kv, std::int64_t V,
                           std::vector<std::int64_t>& old_len) {
  std::int64_t n_logits = 0;
  for (const auto& s : batch) {
    const auto n = static_cast<std::int64_t>(s.tokens.size());
    if (!s.kv) throw std::invalid_argument("forward: sequence without a KV handle");
    if (!s.positions.empty() && static_cast<std::int64_t>(s.positions.size()) != n)
      throw std::invalid_argument("forward: positions and tokens differ in length");
    static_assert(config::kMaxTreeTokens <= 64, "a tree mask row is one 64-bit word");
    if (!s.mask.empty() && (static_cast<std::int64_t>(s.mask.size()) != n || n > config::kMaxTreeTokens))
      throw std::invalid_argument("forward: a tree mask needs one word per token and at most " +
                                  std::to_string(config::kMaxTreeTokens) + " tokens");
    for (auto t : s.tokens)
      if (t < 0 || t >= V)
        throw std::invalid_argument("forward: token id " + std::to_string(t) + " outside the vocabulary");
    for (auto r : s.logit_rows)
      if (r < 0 || r >= n)
        throw std::invalid_argument("forward: logit row " + std::to_string(r) + " outside the sequence");
    if (s.prefix_kv) {
      if (!s.prefix_pages || s.prefix_len < 0 || !s.prefix_kv->has_host_storage() ||
          s.prefix_kv->pages_for(s.prefix_len) > static_cast<std::int64_t>(s.prefix_pages->size()))
        throw std::invalid_argument("forward: a KV prefix of another pool needs its pages on the host, covering it");
      if (s.kv->length + n > 64)
        throw std::invalid_argument("forward: after a KV prefix of another pool a sequence holds at most 64 slots");
    }
    n_logits += static_cast<std::int64_t>(s.logit_rows.size());
  }
  old_len.assign(batch.size(), 0);
  std::size_t reserved = 0;
  try {
    for (; reserved < batch.size(); ++reserved) {
      old_len[reserved] = batch[reserved].kv->length;
      kv.reserve(*batch[reserved].kv, old_len[reserved] + static_cast<std::int64_t>(batch[reserved].tokens.size()));
    }
  } catch (const KvExhausted&) {
    for (std::size_t i = 0; i < reserved; ++i) {
      // Give back pages taken for this call only (length is still the old one).
      KvCache::Seq& s = *batch[i].kv;
      kv.truncate(s, s.length);
    }
    throw;
  }
  return n_logits;
}

LlamaRunner::LlamaRunner(std::shared_ptr<const LlamaWeights> weights, int threads, k::Precision precision)
    : w_(std::move(weights)), precision_(precision) {
  k::ComputePool::instance().set_threads(threads);  // the engine's one pool (0 = every core)
  try {  // at start, not in the first step: a refused thread is the setting's error
    k::ComputePool::instance().start_threads();
  } catch (const std::runtime_error& e) {
    throw config::ConfigError("--threads " + std::to_string(threads) + ": " + e.what());
  }
}

// A sliding layer: a query at position p sees the keys at positions above p − window. Sequences whose
// every position is below the window need nothing more (false); the others get one attention job per
// query, over the slots it may see (committed slots hold their position; new slot j holds the
// batch's position of token j). Appends to attn_jobs_; true when it did.
bool LlamaRunner::add_window_jobs(const ForwardSeq& s, const k::PagedKvView& view, std::int64_t old_len,
                                  std::int64_t r0, std::int64_t QD) {
  const std::int64_t W = w_->config().sliding_window;
  const auto n = static_cast<std::int64_t>(s.tokens.size());
  std::int32_t max_pos = 0;
  for (std::int64_t i = 0; i < n; ++i) max_pos = std::max(max_pos, pos_[static_cast<std::size_t>(r0 + i)]);
  if (max_pos < W) return false;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t p = pos_[static_cast<std::size_t>(r0 + i)], lo = p - W + 1;  // the lowest visible position
    const std::int64_t start = std::clamp<std::int64_t>(lo, 0, old_len);            // committed slots from here
    float* q = q_.data() + (r0 + i) * QD;
    float* o = att_.data() + (r0 + i) * QD;
    if (s.mask.empty()) {
      // Causal: slots [start, old_len + i] (positions rise with the slots), the query's own slot last.
      std::int64_t first = start;
      if (lo > old_len)
        for (first = old_len; first < old_len + i && pos_[static_cast<std::size_t>(r0 + first - old_len)] < lo;)
          ++first;
      attn_jobs_.push_back({q, 1, {view, first, old_len + i - first}, {view, old_len + i, 1}, nullptr, o});
    } else {
      std::uint64_t word = s.mask[static_cast<std::size_t>(i)];
      for (std::int64_t j = 0; j < n; ++j)
        if (pos_[static_cast<std::size_t>(r0 + j)] < lo) word &= ~(1ull << j);
      window_mask_[static_cast<std::size_t>(r0 + i)] = word;
      attn_jobs_.push_back({q,
                            1,
                            {view, start, old_len - start},
                            {view, old_len, n},
                            &window_mask_[static_cast<std::size_t>(r0 + i)],
                            o});
    }
  }
  return true;
}

void LlamaRunner::forward(std::vector<ForwardSeq>& batch, KvCache& kv, ForwardResult& out,
                          const std::vector<int>& hidden_layers, k::Communicator* comm) {
  const LlamaConfig& c = w_->config();
  const std::int64_t NH = w_->local_heads(), NKV = w_->local_kv_heads();
  const std::int64_t H = c.hidden, QD = NH * c.head_dim, KD = NKV * c.head_dim, F = w_->local_ffn(), V = c.vocab_size;
  if (w_->shard().size > 1 && (!comm || comm->size() != w_->shard().size))
    throw std::invalid_argument("forward: a tensor-parallel shard needs a communicator of its group size");

  for (const auto& s : batch)
    if (s.prefix_kv && (s.prefix_kv->n_layers() < c.n_layers || s.prefix_kv->row_floats() != KD ||
                        s.prefix_kv->head_dim() != c.head_dim))
      throw std::invalid_argument("forward: a KV prefix of another pool must have this model's KV shape");
  std::vector<std::int64_t> old_len;
  const std::int64_t n_logits = prepare_batch(batch, kv, V, old_len);
  std::int64_t T = 0;
  for (const auto& s : batch) T += static_cast<std::int64_t>(s.tokens.size());

  x_.resize(static_cast<std::size_t>(T * H));
  xn_.resize(x_.size());
  q_.resize(static_cast<std::size_t>(T * QD));
  att_.resize(q_.size());
  k_.resize(static_cast<std::size_t>(T * KD));
  v_.resize(k_.size());
  tmp_.resize(static_cast<std::size_t>(T * H));
  gate_.resize(static_cast<std::size_t>(T * F));
  up_.resize(gate_.size());
  pos_.resize(static_cast<std::size_t>(T));

  {
    std::int64_t r = 0;
    for (const auto& s : batch)
      for (std::size_t i = 0; i < s.tokens.size(); ++i, ++r) {
        k::weight_row(w_->embedding(), s.tokens[i], x_.data() + r * H);
        const std::int64_t base = (s.prefix_kv ? s.prefix_len : 0) + s.kv->length;
        pos_[static_cast<std::size_t>(r)] =
            s.positions.empty() ? static_cast<std::int32_t>(base + static_cast<std::int64_t>(i)) : s.positions[i];
      }
  }
  // Sequences after another pool's KV: that pool's page table, and masks over every own slot (the
  // older ones all visible, the new ones causal or by the tree mask).
  if (std::any_of(batch.begin(), batch.end(), [](const ForwardSeq& s) { return s.prefix_kv != nullptr; })) {
    foreign_.assign(batch.size(), {});
    own_mask_.assign(batch.size(), {});
    for (std::size_t b = 0; b < batch.size(); ++b) {
      const ForwardSeq& s = batch[b];
      if (!s.prefix_kv) continue;
      foreign_[b] = {*s.prefix_pages, s.prefix_len};
      const std::uint64_t older = old_len[b] > 0 ? (~0ull >> (64 - old_len[b])) : 0;
      for (std::size_t i = 0; i < s.tokens.size(); ++i) {
        const std::uint64_t fresh = s.mask.empty() ? (~0ull >> (63 - i)) : s.mask[i];
        own_mask_[b].push_back(older | (fresh << old_len[b]));
      }
    }
  }
  out.hidden.assign(hidden_layers.size(), {});
  const FamilyDesc& fam = c.desc();
  if (fam.embed_scale) {
    const float e = std::sqrt(static_cast<float>(H));
    for (float& v : x_) v *= e;
  }
  rope_cs_.resize(static_cast<std::size_t>(T * c.rope_dim));
  k::rope_table_cpu(pos_.data(), T, c.rope_dim, c.rope_base, rope_cs_.data(), c.rope_linear_factor);
  if (!c.sliding_layers.empty()) {
    rope_local_cs_.resize(rope_cs_.size());
    k::rope_table_cpu(pos_.data(), T, c.rope_dim, c.rope_base_local, rope_local_cs_.data());
    for (const auto& s : batch)
      if (s.prefix_kv)
        throw std::invalid_argument("forward: a KV prefix of another pool is not supported with sliding-window layers");
    window_mask_.assign(static_cast<std::size_t>(T), 0);  // stable storage: jobs point into it
  }

  const float scale = c.query_scale();
  const auto eps = static_cast<float>(c.norm_eps);
  // out = RMSNorm(x) over rows of `dim` with `weight`, through a scratch buffer (x and out may be one).
  auto norm_rows = [&](float* x, const float* weight, std::int64_t rows, std::int64_t dim) {
    norm_tmp_.resize(static_cast<std::size_t>(rows * dim));
    k::rmsnorm_cpu(norm_tmp_.data(), x, weight, static_cast<int>(rows), static_cast<int>(dim), eps);
    std::copy(norm_tmp_.begin(), norm_tmp_.begin() + rows * dim, x);
  };
  auto add_bias = [](float* y, const float* bias, std::int64_t rows, std::int64_t dim) {
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t i = 0; i < dim; ++i) y[r * dim + i] += bias[i];
  };
  for (std::int64_t l = 0; l < c.n_layers; ++l) {
    const LlamaLayer& L = w_->layers()[static_cast<std::size_t>(l)];
    const bool sliding = c.sliding(l);
    const float* rope = sliding ? rope_local_cs_.data() : rope_cs_.data();
    k::rmsnorm_cpu(xn_.data(), x_.data(), L.attn_norm, static_cast<int>(T), static_cast<int>(H), eps);
    const k::MatmulJob qkv[3] = {{&L.wq, q_.data()}, {&L.wk, k_.data()}, {&L.wv, v_.data()}};
    k::matmul_many(qkv, 3, xn_.data(), T, precision_);
    if (L.q_bias) {
      add_bias(q_.data(), L.q_bias, T, QD);
      add_bias(k_.data(), L.k_bias, T, KD);
      add_bias(v_.data(), L.v_bias, T, KD);
    }
    if (L.q_norm) {
      norm_rows(q_.data(), L.q_norm, T * NH, c.head_dim);
      norm_rows(k_.data(), L.k_norm, T * NKV, c.head_dim);
    }
    k::rope_apply_cpu(q_.data(), T, NH, c.head_dim, c.rope_dim, rope, c.rope_neox);
    k::rope_apply_cpu(k_.data(), T, NKV, c.head_dim, c.rope_dim, rope, c.rope_neox);
    std::int64_t r0 = 0;
    attn_jobs_.clear();
    for (std::size_t b = 0; b < batch.size(); ++b) {
      const ForwardSeq& s = batch[b];
      const auto n = static_cast<std::int64_t>(s.tokens.size());
      for (std::int64_t i = 0; i < n; ++i)
        kv.write(l, *s.kv, old_len[b] + i, k_.data() + (r0 + i) * KD, v_.data() + (r0 + i) * KD);
      const k::PagedKvView view = kv.view(l, *s.kv);
      if (sliding && add_window_jobs(s, view, old_len[b], r0, QD)) {
        r0 += n;
        continue;
      }
      if (s.prefix_kv)
        attn_jobs_.push_back({q_.data() + r0 * QD,
                              n,
                              {s.prefix_kv->view(l, foreign_[b]), 0, s.prefix_len},
                              {view, 0, old_len[b] + n},
                              own_mask_[b].data(),
                              att_.data() + r0 * QD});
      else
        attn_jobs_.push_back({q_.data() + r0 * QD,
                              n,
                              {view, 0, old_len[b]},
                              {view, old_len[b], n},
                              s.mask.empty() ? nullptr : s.mask.data(),
                              att_.data() + r0 * QD});
      r0 += n;
    }
    // Every sequence's attention in one pass of the pool.
    k::attention_many_cpu(attn_jobs_.data(), static_cast<int>(attn_jobs_.size()), NH, NKV, c.head_dim, scale);
    k::matmul(L.wo, att_.data(), T, tmp_.data(), precision_);
    if (comm) comm->all_reduce_sum(tmp_.data(), static_cast<std::size_t>(T * H));  // the heads' partial outputs
    if (L.post_attn_norm) norm_rows(tmp_.data(), L.post_attn_norm, T, H);
    for (std::int64_t i = 0; i < T * H; ++i) x_[static_cast<std::size_t>(i)] += tmp_[static_cast<std::size_t>(i)];
    k::rmsnorm_cpu(xn_.data(), x_.data(), L.ffn_norm, static_cast<int>(T), static_cast<int>(H), eps);
    const k::MatmulJob gate_up[2] = {{&L.gate, gate_.data()}, {&L.up, up_.data()}};
    k::matmul_many(gate_up, 2, xn_.data(), T, precision_);
    if (fam.gelu_tanh)
      k::gelu_tanh_mul_cpu(gate_.data(), gate_.data(), up_.data(), T * F);
    else
      k::silu_mul_cpu(gate_.data(), gate_.data(), up_.data(), T * F);
    k::matmul(L.down, gate_.data(), T, tmp_.data(), precision_);
    if (comm) comm->all_reduce_sum(tmp_.data(), static_cast<std::size_t>(T * H));  // the MLP columns' partial outputs
    if (L.post_ffn_norm) norm_rows(tmp_.data(), L.post_ffn_norm, T, H);
    for (std::int64_t i = 0; i < T * H; ++i) x_[static_cast<std::size_t>(i)] += tmp_[static_cast<std::size_t>(i)];
    for (std::size_t h = 0; h < hidden_layers.size(); ++h)
      if (hidden_layers[h] == l) out.hidden[h] = x_;
  }
  for (std::size_t b = 0; b < batch.size(); ++b)
    batch[b].kv->length = old_len[b] + static_cast<std::int64_t>(batch[b].tokens.size());

  // Final norm and the output head, only for the rows asked for.
  std::vector<float> rows(static_cast<std::size_t>(n_logits * H));
  {
    std::int64_t r0 = 0, o = 0;
    for (const auto& s : batch) {
      for (auto r : s.logit_rows) {
        k::rmsnorm_cpu(rows.data() + o * H, x_.data() + (r0 + r) * H, w_->output_norm(), 1, static_cast<int>(H), eps);
        ++o;
      }
      r0 += static_cast<std::int64_t>(s.tokens.size());
    }
  }
  out.logits.resize(static_cast<std::size_t>(n_logits * V));
  if (n_logits > 0) k::matmul(w_->output(), rows.data(), n_logits, out.logits.data(), precision_);
}

}  // namespace specactor::model
