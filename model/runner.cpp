// model/runner.cpp — the CPU runner, or the CUDA one (see runner.hpp).
#include "model/runner.hpp"

#include <stdexcept>
#include <string>

#include "config/error.hpp"

#ifdef SPECACTOR_HAVE_CUDA
#include "kernels/cuda/device_model.hpp"
#endif

namespace specactor::model {

#ifdef SPECACTOR_HAVE_CUDA
namespace kc = specactor::kernels::cuda;

namespace {

// The forward on one GPU: the host KvCache keeps the page tables (allocation, truncation, the
// scheduler's accounting); the K/V rows live only in the device pool with the same page numbers.
class CudaLlamaRunner final : public ForwardRunner {
 public:
  CudaLlamaRunner(std::shared_ptr<const LlamaWeights> w, int device, const KvCache& kv, bool graphs)
      : w_(std::move(w)) {
    const LlamaConfig& c = w_->config();
    kc::HostModel m;
    m.vocab = c.vocab_size;
    m.hidden = c.hidden;
    m.ffn = w_->local_ffn();
    m.n_heads = w_->local_heads();
    m.n_kv_heads = w_->local_kv_heads();
    m.head_dim = c.head_dim;
    m.rope_dim = c.rope_dim;
    m.rope_base = c.rope_base;
    m.norm_eps = c.norm_eps;
    m.rope_neox = c.rope_neox;
    m.embedding = w_->embedding();
    m.output = w_->output();
    m.output_norm = w_->output_norm();
    for (const auto& L : w_->layers())
      m.layers.push_back({L.wq, L.wk, L.wv, L.wo, L.gate, L.up, L.down, L.attn_norm, L.ffn_norm});
    dev_ = std::make_unique<kc::DeviceModel>(m, device, kv.total_pages(), kv.page_size(), graphs);
  }
  const LlamaWeights& weights() const override { return *w_; }
  std::string device() const override { return "cuda:" + std::to_string(dev_->device()); }
  const kernels::Backend& backend() const override {
    const kernels::Backend* b = kernels::cuda_backend();
    return b ? *b : kernels::cpu_backend();
  }

  void forward(std::vector<ForwardSeq>& batch, KvCache& kv, ForwardResult& out, const std::vector<int>& hidden_layers,
               kernels::Communicator* comm) override {
    for (const ForwardSeq& s : batch)
      if (s.prefix_kv) throw std::invalid_argument("forward: a KV prefix of another pool runs on the CPU only");
    std::vector<std::int64_t> old_len;
    prepare_batch(batch, kv, w_->config().vocab_size, old_len);
    std::vector<kc::DeviceSeq> seqs(batch.size());
    for (std::size_t b = 0; b < batch.size(); ++b) {
      const ForwardSeq& s = batch[b];
      kc::DeviceSeq& d = seqs[b];
      d.pages = s.kv->pages.data();
      d.n_pages = static_cast<std::int64_t>(s.kv->pages.size());
      d.old_len = old_len[b];
      d.tokens = s.tokens;
      d.positions = s.positions;
      if (d.positions.empty())
        for (std::size_t i = 0; i < s.tokens.size(); ++i)
          d.positions.push_back(static_cast<std::int32_t>(old_len[b] + static_cast<std::int64_t>(i)));
      d.mask = s.mask;
      d.logit_rows = s.logit_rows;
    }
    try {
      dev_->forward(seqs, hidden_layers, out.logits, out.hidden, comm);
    } catch (...) {
      for (std::size_t b = 0; b < batch.size(); ++b) kv.truncate(*batch[b].kv, old_len[b]);  // nothing was appended
      throw;
    }
    for (std::size_t b = 0; b < batch.size(); ++b)
      batch[b].kv->length = old_len[b] + static_cast<std::int64_t>(batch[b].tokens.size());
  }

  void copy_slot(KvCache& kv, const KvCache::Seq& seq, std::int64_t from, std::int64_t to) override {
    dev_->copy_slot(seq.pages, kv.page_size(), from, to);
  }

 private:
  std::shared_ptr<const LlamaWeights> w_;
  std::unique_ptr<kc::DeviceModel> dev_;
};

}  // namespace
#endif

kernels::KvType kv_type(const config::ServerArgs& snap) {
  if (snap.kv_cache_dtype == "float16") return kernels::KvType::F16;
  if (snap.kv_cache_dtype == "bfloat16") return kernels::KvType::BF16;
  // "auto" is resolved by config::resolve_target; a snapshot made by hand without it (unit tests) gets
  // float32, the type that needs no rounding.
  return kernels::KvType::F32;
}

kernels::Precision cpu_precision(const config::ServerArgs& snap) {
  return snap.cpu_precision == config::CpuPrecision::Exact ? kernels::Precision::Exact : kernels::Precision::Fast;
}

bool cuda_forward_compiled() {
#ifdef SPECACTOR_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

std::vector<std::unique_ptr<kernels::Communicator>> make_tp_group(const config::ServerArgs& snap) {
  const int T = static_cast<int>(snap.tp_size);
#ifdef SPECACTOR_HAVE_CUDA
  if (snap.device == config::Device::Cuda) return kc::make_nccl_group(T);
#endif
  return kernels::make_cpu_group(T);
}

std::unique_ptr<ForwardRunner> make_runner(std::shared_ptr<const LlamaWeights> weights, const config::ServerArgs& snap,
                                           int rank, int threads, const KvCache& kv) {
  if (snap.device != config::Device::Cuda)
    return std::make_unique<LlamaRunner>(std::move(weights), threads, cpu_precision(snap));
  if (weights->config().family != Family::Llama)
    throw config::ConfigError("--device cuda: the CUDA forward runs the llama architecture only; '" +
                              std::string(weights->config().desc().name) + "' runs with --device cpu");
#ifdef SPECACTOR_HAVE_CUDA
  return std::make_unique<CudaLlamaRunner>(std::move(weights), rank, kv, !snap.disable_cuda_graph);
#else
  (void)rank;
  (void)kv;
  throw std::runtime_error("--device cuda: this build has no CUDA backend (configured without nvcc)");
#endif
}

}  // namespace specactor::model
