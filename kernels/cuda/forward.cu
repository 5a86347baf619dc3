// kernels/cuda/forward.cu — DeviceModel: one rank's Llama weights and KV pool in device memory and
// the batched forward over them (see device_model.hpp). Decode/verify steps (up to kGraphTokens
// tokens) are captured as CUDA graphs per (tokens, logit rows) shape once seen twice: the step's
// inputs go to fixed device buffers first, so one graph serves every step of that shape.
//
// Every product runs the dequantising mat-vec kernel, whatever the batch width: a row's result then
// never depends on the rows batched with it, so greedy outputs are the same alone, batched, and
// speculative (as on the CPU). The dequantise + cuBLAS SGEMM path (ops.cuh gemm_rows, the backend's
// matmul_wide) would change a row's rounding with the batch width, so the forward does not use it.
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/packed.hpp"
#include "kernels/cuda/ops.cuh"

namespace specactor::kernels::cuda {

using detail::check;
using detail::DMat;

namespace {

constexpr long long kGraphTokens = 64;  // the widest step captured as a graph
constexpr double kMiB = 1024.0 * 1024.0;

std::size_t matrix_bytes(const WeightMatrix& m) { return static_cast<std::size_t>(m.out_dim) * m.row_stride; }

}  // namespace

struct DeviceModel::Impl {
  HostModel cfg;  // shapes (the host pointers in it are not used after the upload)
  int device = 0;
  cudaStream_t stream = nullptr;
  std::vector<void*> allocations;
  struct Layer {
    DMat wq, wk, wv, wo, gate, up, down;
    float* attn_norm = nullptr;
    float* ffn_norm = nullptr;
  };
  DMat embedding, output;
  float* output_norm = nullptr;
  std::vector<Layer> layers;
  std::uint64_t weight_bytes = 0, kv_bytes = 0;
  long long page_size = 0, row = 0, page_stride = 0, layer_stride = 0, n_pages = 0;
  float *k_pool = nullptr, *v_pool = nullptr;
  // Scratch, grown on demand (growing drops the captured graphs: they hold the old pointers).
  long long cap_tokens = 0, cap_logits = 0, cap_pages = 0, cap_seqs = 0;
  float *x = nullptr, *xn = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *att = nullptr, *tmp = nullptr,
        *gate = nullptr, *up = nullptr, *rows = nullptr, *logits = nullptr;
  int *tokens = nullptr, *positions = nullptr, *row_seq = nullptr, *row_idx = nullptr, *seq_new = nullptr,
      *pages = nullptr, *logit_rows = nullptr;
  long long *seq_old = nullptr, *seq_page_off = nullptr;
  unsigned long long* row_mask = nullptr;
  unsigned char* row_has_mask = nullptr;
  std::vector<float> host_stage;  // host-memory communicators
  bool graphs_enabled = false;
  struct Graph {
    int seen = 0;
    cudaGraphExec_t exec = nullptr;
  };
  std::map<std::pair<long long, long long>, Graph> graphs;
  std::int64_t captured = 0;

  template <class T>
  T* alloc(std::size_t n, const char* what) {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, sizeof(T) * (n ? n : 1));
    if (e != cudaSuccess) {
      cudaGetLastError();
      std::size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      throw DeviceOutOfMemory("CUDA device " + std::to_string(device) + ": cannot allocate " +
                              std::to_string(static_cast<double>(sizeof(T) * n) / kMiB) + " MiB for " + what + " (" +
                              std::to_string(static_cast<double>(free_b) / kMiB) + " MiB free)");
    }
    allocations.push_back(p);
    return static_cast<T*>(p);
  }

  DMat upload(const WeightMatrix& m, const std::string& name) {
    if (!computable_on_device(m))
      throw std::runtime_error(
          "CUDA forward: tensor " + name + " has ggml type " + std::to_string(static_cast<unsigned>(m.type)) +
          ", which the CUDA kernels do not compute (F32 F16 BF16 Q8_0 Q4_0 Q4_1); use --device cpu");
    auto* d = alloc<std::uint8_t>(matrix_bytes(m), name.c_str());
    std::vector<std::uint8_t> rows;  // packed panels → the split row layout the device kernels read
    check(cudaMemcpy(d, packed::split_rows(m, rows), matrix_bytes(m), cudaMemcpyHostToDevice), "upload weights");
    weight_bytes += matrix_bytes(m);
    return {static_cast<std::uint32_t>(m.type), m.out_dim, m.in_dim, d, m.row_stride};
  }

  float* upload_vec(const float* v, long long n, const char* what) {
    float* d = alloc<float>(static_cast<std::size_t>(n), what);
    check(cudaMemcpy(d, v, sizeof(float) * static_cast<std::size_t>(n), cudaMemcpyHostToDevice), "upload vector");
    return d;
  }

  void drop_graphs() {
    for (auto& [key, g] : graphs)
      if (g.exec) cudaGraphExecDestroy(g.exec);
    graphs.clear();
  }

  // Scratch for T tokens, L logit rows, P page-table entries, S sequences.
  void ensure(long long T, long long L, long long P, long long S) {
    const long long H = cfg.hidden, QD = cfg.n_heads * cfg.head_dim, KD = row, F = cfg.ffn, V = cfg.vocab;
    if (T > cap_tokens) {
      drop_graphs();
      const long long c = std::max(T, 2 * cap_tokens);
      x = alloc<float>(c * H, "activations");
      xn = alloc<float>(c * H, "activations");
      tmp = alloc<float>(c * H, "activations");
      q = alloc<float>(c * QD, "queries");
      att = alloc<float>(c * QD, "attention output");
      k = alloc<float>(c * KD, "keys");
      v = alloc<float>(c * KD, "values");
      gate = alloc<float>(c * F, "MLP");
      up = alloc<float>(c * F, "MLP");
      tokens = alloc<int>(c, "tokens");
      positions = alloc<int>(c, "positions");
      row_seq = alloc<int>(c, "row metadata");
      row_idx = alloc<int>(c, "row metadata");
      row_mask = alloc<unsigned long long>(c, "tree masks");
      row_has_mask = alloc<unsigned char>(c, "tree masks");
      cap_tokens = c;
    }
    if (L > cap_logits) {
      drop_graphs();
      const long long c = std::max(L, 2 * cap_logits);
      rows = alloc<float>(c * H, "output rows");
      logits = alloc<float>(c * V, "logits");
      logit_rows = alloc<int>(c, "logit rows");
      cap_logits = c;
    }
    if (P > cap_pages) {
      drop_graphs();
      const long long c = std::max(P, 2 * cap_pages);
      pages = alloc<int>(c, "page tables");
      cap_pages = c;
    }
    if (S > cap_seqs) {
      drop_graphs();
      const long long c = std::max(S, 2 * cap_seqs);
      seq_old = alloc<long long>(c, "sequence metadata");
      seq_page_off = alloc<long long>(c, "sequence metadata");
      seq_new = alloc<int>(c, "sequence metadata");
      cap_seqs = c;
    }
  }

  void matmul(const DMat& m, const float* in, long long T, float* out) { detail::launch_matvec(m, in, T, out, stream); }

  void all_reduce(float* d, long long n, Communicator* comm) {
    if (!comm || comm->size() == 1) return;
    check(cudaStreamSynchronize(stream), "synchronize before all-reduce");
    if (comm->device_memory()) {
      comm->all_reduce_sum(d, static_cast<std::size_t>(n));
    } else {
      host_stage.resize(static_cast<std::size_t>(n));
      check(cudaMemcpy(host_stage.data(), d, sizeof(float) * static_cast<std::size_t>(n), cudaMemcpyDeviceToHost),
            "stage");
      comm->all_reduce_sum(host_stage.data(), static_cast<std::size_t>(n));
      check(cudaMemcpy(d, host_stage.data(), sizeof(float) * static_cast<std::size_t>(n), cudaMemcpyHostToDevice),
            "stage");
    }
  }

  // The kernels of one forward (everything after the inputs are in their device buffers). With
  // `capture` layers requested, their rows are copied out after each such layer (not in graphs).
  void run(long long T, long long n_logits, const std::vector<int>& capture, std::vector<std::vector<float>>* hidden,
           Communicator* comm) {
    const long long H = cfg.hidden, QD = cfg.n_heads * cfg.head_dim, F = cfg.ffn;
    const float eps = static_cast<float>(cfg.norm_eps);
    const float scale = 1.0f / std::sqrt(static_cast<float>(cfg.head_dim));
    const detail::AttnRows r{row_seq, row_idx, seq_old, seq_new, seq_page_off, pages, row_mask, row_has_mask};
    detail::launch_embedding(embedding, tokens, T, x, stream);
    for (std::size_t l = 0; l < layers.size(); ++l) {
      const Layer& L = layers[l];
      detail::launch_rmsnorm(xn, x, L.attn_norm, T, H, eps, stream);
      matmul(L.wq, xn, T, q);
      matmul(L.wk, xn, T, k);
      matmul(L.wv, xn, T, v);
      detail::launch_rope(q, T, cfg.n_heads, cfg.head_dim, cfg.rope_dim, positions, cfg.rope_base, cfg.rope_neox,
                          stream);
      detail::launch_rope(k, T, cfg.n_kv_heads, cfg.head_dim, cfg.rope_dim, positions, cfg.rope_base, cfg.rope_neox,
                          stream);
      float* kl = k_pool + static_cast<long long>(l) * layer_stride;
      float* vl = v_pool + static_cast<long long>(l) * layer_stride;
      detail::launch_kv_write(k, v, T, row, kl, vl, page_size, page_stride, r, stream);
      detail::launch_attention(q, T, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, kl, vl, page_size, page_stride, r,
                               scale, att, stream);
      matmul(L.wo, att, T, tmp);
      all_reduce(tmp, T * H, comm);
      detail::launch_add(x, tmp, T * H, stream);
      detail::launch_rmsnorm(xn, x, L.ffn_norm, T, H, eps, stream);
      matmul(L.gate, xn, T, gate);
      matmul(L.up, xn, T, up);
      detail::launch_silu_mul(gate, gate, up, T * F, stream);
      matmul(L.down, gate, T, tmp);
      all_reduce(tmp, T * H, comm);
      detail::launch_add(x, tmp, T * H, stream);
      for (std::size_t h = 0; h < capture.size(); ++h)
        if (hidden && capture[h] == static_cast<int>(l)) {
          (*hidden)[h].resize(static_cast<std::size_t>(T * H));
          check(cudaMemcpyAsync((*hidden)[h].data(), x, sizeof(float) * static_cast<std::size_t>(T * H),
                                cudaMemcpyDeviceToHost, stream),
                "copy hidden rows");
        }
    }
    (void)QD;
    if (n_logits > 0) {
      detail::launch_gather_rows(x, logit_rows, n_logits, H, rows, stream);
      detail::launch_rmsnorm(rows, rows, output_norm, n_logits, H, eps, stream);
      matmul(output, rows, n_logits, logits);
    }
  }
};

DeviceModel::DeviceModel(const HostModel& m, int device, std::int64_t kv_pages, std::int64_t page_size,
                         bool cuda_graphs)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.cfg = m;
  s.device = device;
  check(cudaSetDevice(device), "set device");
  // Everything this model will hold, checked against the free memory before the first allocation.
  std::uint64_t weights = matrix_bytes(m.embedding) + (m.output.data == m.embedding.data ? 0 : matrix_bytes(m.output)) +
                          sizeof(float) * static_cast<std::uint64_t>(m.hidden);
  for (const auto& L : m.layers) {
    for (const WeightMatrix* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.gate, &L.up, &L.down}) weights += matrix_bytes(*w);
    weights += 2 * sizeof(float) * static_cast<std::uint64_t>(m.hidden);
  }
  s.page_size = page_size;
  s.row = m.n_kv_heads * m.head_dim;
  s.page_stride = page_size * s.row;
  s.n_pages = kv_pages;
  s.layer_stride = kv_pages * s.page_stride;
  const std::uint64_t kv = 2 * sizeof(float) * static_cast<std::uint64_t>(s.layer_stride) * m.layers.size();
  // Activations and logits of a 2048-token step (grown on demand beyond).
  const std::uint64_t scratch_guess =
      sizeof(float) * 2048ull * static_cast<std::uint64_t>(6 * m.hidden + 3 * m.n_heads * m.head_dim + 2 * m.ffn) +
      sizeof(float) * 64ull * static_cast<std::uint64_t>(m.vocab);
  std::size_t free_b = 0, total_b = 0;
  check(cudaMemGetInfo(&free_b, &total_b), "memory info");
  if (weights + kv + scratch_guess > free_b) {
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, device);
    throw DeviceOutOfMemory("CUDA device " + std::to_string(device) + " (" + prop.name + "): needs about " +
                            std::to_string(static_cast<long long>((weights + kv + scratch_guess) / kMiB)) +
                            " MiB (weights " + std::to_string(static_cast<long long>(weights / kMiB)) + ", KV pool " +
                            std::to_string(static_cast<long long>(kv / kMiB)) + " for " +
                            std::to_string(kv_pages * page_size) + " tokens, scratch " +
                            std::to_string(static_cast<long long>(scratch_guess / kMiB)) + ") but " +
                            std::to_string(static_cast<long long>(free_b / kMiB)) +
                            " MiB are free; lower --max-total-tokens or use more --tp-size ranks");
  }
  check(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking), "create stream");
  s.embedding = s.upload(m.embedding, "token_embd");
  s.output = m.output.data == m.embedding.data ? s.embedding : s.upload(m.output, "output");
  s.output_norm = s.upload_vec(m.output_norm, m.hidden, "output_norm");
  for (std::size_t l = 0; l < m.layers.size(); ++l) {
    const HostLayer& L = m.layers[l];
    const std::string p = "blk." + std::to_string(l) + ".";
    Impl::Layer d;
    d.wq = s.upload(L.wq, p + "attn_q");
    d.wk = s.upload(L.wk, p + "attn_k");
    d.wv = s.upload(L.wv, p + "attn_v");
    d.wo = s.upload(L.wo, p + "attn_output");
    d.gate = s.upload(L.gate, p + "ffn_gate");
    d.up = s.upload(L.up, p + "ffn_up");
    d.down = s.upload(L.down, p + "ffn_down");
    d.attn_norm = s.upload_vec(L.attn_norm, m.hidden, "attn_norm");
    d.ffn_norm = s.upload_vec(L.ffn_norm, m.hidden, "ffn_norm");
    s.layers.push_back(d);
  }
  s.k_pool = s.alloc<float>(static_cast<std::size_t>(s.layer_stride) * m.layers.size(), "the K pool");
  s.v_pool = s.alloc<float>(static_cast<std::size_t>(s.layer_stride) * m.layers.size(), "the V pool");
  s.kv_bytes = kv;
  s.graphs_enabled = cuda_graphs;
}

DeviceModel::~DeviceModel() {
  if (!impl_) return;
  cudaSetDevice(impl_->device);
  impl_->drop_graphs();
  if (impl_->stream) cudaStreamDestroy(impl_->stream);
  for (void* p : impl_->allocations) cudaFree(p);
}

void DeviceModel::forward(const std::vector<DeviceSeq>& batch, const std::vector<int>& hidden_layers,
                          std::vector<float>& logits, std::vector<std::vector<float>>& hidden, Communicator* comm) {
  Impl& s = *impl_;
  check(cudaSetDevice(s.device), "set device");
  long long T = 0, L = 0, P = 0;
  for (const auto& q : batch) {
    T += static_cast<long long>(q.tokens.size());
    L += static_cast<long long>(q.logit_rows.size());
    P += q.n_pages;
  }
  const long long S = static_cast<long long>(batch.size());
  s.ensure(T, L, P, S);
  // Inputs, laid out on the host, then one copy each into the fixed device buffers.
  std::vector<int> tokens, positions, row_seq, row_idx, seq_new, pages, logit_rows;
  std::vector<long long> seq_old, seq_page_off;
  std::vector<unsigned long long> row_mask;
  std::vector<unsigned char> has_mask;
  long long row0 = 0;
  for (std::size_t b = 0; b < batch.size(); ++b) {
    const DeviceSeq& q = batch[b];
    seq_old.push_back(q.old_len);
    seq_new.push_back(static_cast<int>(q.tokens.size()));
    seq_page_off.push_back(static_cast<long long>(pages.size()));
    pages.insert(pages.end(), q.pages, q.pages + q.n_pages);
    for (std::size_t i = 0; i < q.tokens.size(); ++i) {
      tokens.push_back(q.tokens[i]);
      positions.push_back(q.positions[i]);
      row_seq.push_back(static_cast<int>(b));
      row_idx.push_back(static_cast<int>(i));
      row_mask.push_back(q.mask.empty() ? 0ull : q.mask[i]);
      has_mask.push_back(q.mask.empty() ? 0 : 1);
    }
    for (auto r : q.logit_rows) logit_rows.push_back(static_cast<int>(row0 + r));
    row0 += static_cast<long long>(q.tokens.size());
  }
  auto put = [&](auto* dst, const auto& v) {
    if (!v.empty())
      check(cudaMemcpyAsync(dst, v.data(), sizeof(v[0]) * v.size(), cudaMemcpyHostToDevice, s.stream), "upload inputs");
  };
  put(s.tokens, tokens);
  put(s.positions, positions);
  put(s.row_seq, row_seq);
  put(s.row_idx, row_idx);
  put(s.row_mask, row_mask);
  put(s.row_has_mask, has_mask);
  put(s.seq_old, seq_old);
  put(s.seq_new, seq_new);
  put(s.seq_page_off, seq_page_off);
  put(s.pages, pages);
  put(s.logit_rows, logit_rows);

  hidden.assign(hidden_layers.size(), {});
  const bool graphable = s.graphs_enabled && T <= kGraphTokens && hidden_layers.empty() && (!comm || comm->size() == 1);
  if (graphable) {
    Impl::Graph& g = s.graphs[{T, L}];
    if (!g.exec && ++g.seen >= 2) {  // the first time runs eagerly (cuBLAS and the allocator warm up)
      cudaGraph_t graph = nullptr;
      check(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal), "begin capture");
      try {
        s.run(T, L, {}, nullptr, nullptr);
      } catch (...) {
        cudaStreamEndCapture(s.stream, &graph);
        if (graph) cudaGraphDestroy(graph);
        throw;
      }
      check(cudaStreamEndCapture(s.stream, &graph), "end capture");
      const cudaError_t e = cudaGraphInstantiate(&g.exec, graph, 0);
      cudaGraphDestroy(graph);
      check(e, "instantiate graph");
      ++s.captured;
    }
    if (g.exec)
      check(cudaGraphLaunch(g.exec, s.stream), "launch graph");
    else
      s.run(T, L, {}, nullptr, nullptr);
  } else {
    s.run(T, L, hidden_layers, &hidden, comm);
  }
  logits.resize(static_cast<std::size_t>(L * s.cfg.vocab));
  if (L > 0)
    check(cudaMemcpyAsync(logits.data(), s.logits, sizeof(float) * logits.size(), cudaMemcpyDeviceToHost, s.stream),
          "download logits");
  check(cudaStreamSynchronize(s.stream), "forward");
}

void DeviceModel::copy_slot(const std::vector<std::int32_t>& pages, std::int64_t page_size, std::int64_t from,
                            std::int64_t to) {
  Impl& s = *impl_;
  if (from == to) return;
  check(cudaSetDevice(s.device), "set device");
  const long long from_off = static_cast<long long>(pages[static_cast<std::size_t>(from / page_size)]) * s.page_stride +
                             (from % page_size) * s.row;
  const long long to_off = static_cast<long long>(pages[static_cast<std::size_t>(to / page_size)]) * s.page_stride +
                           (to % page_size) * s.row;
  detail::launch_copy_slot(s.k_pool, s.v_pool, static_cast<long long>(s.layers.size()), s.layer_stride, s.row, from_off,
                           to_off, s.stream);
  check(cudaStreamSynchronize(s.stream), "copy slot");
}

int DeviceModel::device() const { return impl_->device; }
std::uint64_t DeviceModel::weight_bytes() const { return impl_->weight_bytes; }
std::uint64_t DeviceModel::kv_bytes() const { return impl_->kv_bytes; }
std::int64_t DeviceModel::graphs_captured() const { return impl_->captured; }

}  // namespace specactor::kernels::cuda
