// kernels/cuda/spec.cu — CUDA twins of kernels/spec: top-k expansion, organize, build_tree (FULL mask),
// greedy tree verification, target-only tree sampling, chain rejection sampling and accepted-path row
// compaction, with the CPU versions' contracts through host vectors. Compiled wherever nvcc exists;
// parity-tested against the CPU on a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_api.hpp"

namespace specactor::kernels::cuda {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA ") + what + ": " + cudaGetErrorString(e));
}

template <class T>
T* upload(const std::vector<T>& v) {
  T* d = nullptr;
  check(cudaMalloc(&d, sizeof(T) * (v.empty() ? 1 : v.size())), "malloc");
  if (!v.empty()) check(cudaMemcpy(d, v.data(), sizeof(T) * v.size(), cudaMemcpyHostToDevice), "memcpy");
  return d;
}
template <class T>
T* alloc(std::size_t n) {
  T* d = nullptr;
  check(cudaMalloc(&d, sizeof(T) * (n ? n : 1)), "malloc");
  return d;
}
template <class T>
std::vector<T> download(const T* d, std::size_t n) {
  std::vector<T> v(n);
  if (n) check(cudaMemcpy(v.data(), d, sizeof(T) * n, cudaMemcpyDeviceToHost), "memcpy");
  return v;
}

// One thread per request: parents, child lists, depths, positions, FULL mask rows.
__global__ void build_tree_kernel(const int* parent_list, int per_req_parents, const int* selected, const int* seq_lens,
                                  const long long* mask_offsets, int b, int k, int n, int* parent, int* next_token,
                                  int* next_sibling, int* retrieve_index, int* positions, unsigned char* mask) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= b) return;
  const int* sel = selected + r * (n - 1);
  const int* pl = parent_list + r * per_req_parents;
  for (int i = 0; i < n; ++i) {
    next_token[r * n + i] = -1;
    next_sibling[r * n + i] = -1;
    retrieve_index[r * n + i] = r * n + i;
    parent[r * n + i] = -1;
  }
  for (int i = 1; i < n; ++i) {
    const int g = sel[i - 1] / k;
    int p = -1;
    if (g != 0) {
      p = -2;
      for (int j = 0; j < n - 1; ++j)
        if (g < per_req_parents && sel[j] == pl[g]) {
          p = j + 1;
          break;
        }
    }
    parent[r * n + i] = p;
  }
  for (int i = n - 1; i >= 1; --i) {
    const int p = parent[r * n + i];
    if (p == -2) continue;
    const int pi = r * n + (p < 0 ? 0 : p);
    if (next_token[pi] == -1) {
      next_token[pi] = i;
    } else {
      next_sibling[r * n + i] = next_token[pi];
      next_token[pi] = i;
    }
  }
  const int len = seq_lens[r];
  const int row = len + n;
  unsigned char* m = mask + mask_offsets[r];
  for (int i = 0; i < n; ++i) {
    int depth = 0;
    for (int j = 0; j < row; ++j) m[i * row + j] = j < len ? 1 : 0;
    int c = i;
    m[i * row + len + c] = 1;
    while (c != 0 && parent[r * n + c] != -2) {
      c = parent[r * n + c] < 0 ? 0 : parent[r * n + c];
      m[i * row + len + c] = 1;
      ++depth;
    }
    positions[r * n + i] = len + depth;
  }
}

__global__ void verify_greedy_kernel(const int* candidates, const int* retrieve_index, const int* next_token,
                                     const int* next_sibling, const int* target_predict, int b, int n, int steps1,
                                     int* predicts, int* accept_index, int* accept_num) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= b) return;
  int last = retrieve_index[r * n], cnt = 0, cur = 0;
  accept_index[r * steps1] = last;
  for (int s = 1; s < steps1; ++s) {
    cur = next_token[r * n + cur];
    while (cur != -1 && candidates[r * n + cur] != target_predict[last]) cur = next_sibling[r * n + cur];
    if (cur == -1) break;
    predicts[last] = candidates[r * n + cur];
    ++cnt;
    last = retrieve_index[r * n + cur];
    accept_index[r * steps1 + cnt] = last;
  }
  accept_num[r] = cnt;
  predicts[last] = target_predict[last];
}

__global__ void sampling_target_only_kernel(const int* candidates, const int* retrieve_index, const int* next_token,
                                            const int* next_sibling, const float* probs, long long vocab,
                                            const float* coins, const float* final_coins, int b, int n, int steps1,
                                            float th_single, float th_acc, int* predicts, int* accept_index,
                                            int* accept_num, unsigned char* rejected) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= b) return;
  unsigned char* rej = rejected + r * vocab;
  int last = retrieve_index[r * n], cnt = 0, cur = 0;
  accept_index[r * steps1] = last;
  bool any_rejected = false;
  for (int s = 1; s < steps1; ++s) {
    int child = next_token[r * n + cur];
    if (child == -1) break;
    const float coin = coins[r * n + cur];
    const float* p = probs + last * vocab;
    float acc = 0;
    bool accepted = false;
    any_rejected = false;
    while (child != -1) {
      const int tok = candidates[r * n + child];
      const float q = p[tok];
      acc += q;
      if (coin <= acc / th_acc || q >= th_single) {
        predicts[last] = tok;
        ++cnt;
        last = retrieve_index[r * n + child];
        accept_index[r * steps1 + cnt] = last;
        cur = child;
        accepted = true;
        break;
      }
      rej[tok] = 1;
      any_rejected = true;
      child = next_sibling[r * n + child];
    }
    if (!accepted) break;
    if (any_rejected)
      for (long long t = 0; t < vocab; ++t) rej[t] = 0;
    any_rejected = false;
  }
  const float* p = probs + last * vocab;
  double total = 0;
  for (long long t = 0; t < vocab; ++t) total += rej[t] ? 0.0 : p[t];
  const double target = static_cast<double>(final_coins[r]) * total;
  double acc = 0;
  int pick = -1;
  for (long long t = 0; t < vocab; ++t) {
    const double v = rej[t] ? 0.0 : p[t];
    if (v <= 0) continue;
    acc += v;
    pick = static_cast<int>(t);
    if (target < acc) break;
  }
  accept_num[r] = cnt;
  predicts[last] = pick;
}

}  // namespace

SpecTree build_tree_cuda(const std::vector<int>& parent_list, const std::vector<int>& selected,
                         const std::vector<int>& seq_lens, int b, int k, int n) {
  std::vector<long long> offsets(static_cast<std::size_t>(b) + 1, 0);
  for (int r = 0; r < b; ++r) offsets[r + 1] = offsets[r] + static_cast<long long>(n) * (seq_lens[r] + n);
  int *d_pl = upload(parent_list), *d_sel = upload(selected), *d_len = upload(seq_lens);
  long long* d_off = upload(offsets);
  const std::size_t bn = static_cast<std::size_t>(b) * n;
  int *d_par = alloc<int>(bn), *d_nt = alloc<int>(bn), *d_ns = alloc<int>(bn), *d_ri = alloc<int>(bn),
      *d_pos = alloc<int>(bn);
  unsigned char* d_mask = alloc<unsigned char>(static_cast<std::size_t>(offsets[b]));
  build_tree_kernel<<<(b + 63) / 64, 64>>>(d_pl, static_cast<int>(parent_list.size()) / b, d_sel, d_len, d_off, b, k, n,
                                           d_par, d_nt, d_ns, d_ri, d_pos, d_mask);
  check(cudaGetLastError(), "launch build_tree");
  SpecTree t;
  t.parent = download(d_par, bn);
  t.next_token = download(d_nt, bn);
  t.next_sibling = download(d_ns, bn);
  t.retrieve_index = download(d_ri, bn);
  t.positions = download(d_pos, bn);
  t.mask_full = download(d_mask, static_cast<std::size_t>(offsets[b]));
  for (void* p :
       {static_cast<void*>(d_pl), static_cast<void*>(d_sel), static_cast<void*>(d_len), static_cast<void*>(d_off),
        static_cast<void*>(d_par), static_cast<void*>(d_nt), static_cast<void*>(d_ns), static_cast<void*>(d_ri),
        static_cast<void*>(d_pos), static_cast<void*>(d_mask)})
    cudaFree(p);
  return t;
}

SpecVerified verify_tree_greedy_cuda(const std::vector<int>& candidates, const std::vector<int>& retrieve_index,
                                     const std::vector<int>& next_token, const std::vector<int>& next_sibling,
                                     const std::vector<int>& target_predict, int b, int n, int steps1) {
  int *d_c = upload(candidates), *d_ri = upload(retrieve_index), *d_nt = upload(next_token),
      *d_ns = upload(next_sibling), *d_tp = upload(target_predict);
  std::vector<int> pred(static_cast<std::size_t>(b) * n, -1), ai(static_cast<std::size_t>(b) * steps1, -1);
  int *d_pred = upload(pred), *d_ai = upload(ai), *d_an = alloc<int>(static_cast<std::size_t>(b));
  verify_greedy_kernel<<<(b + 63) / 64, 64>>>(d_c, d_ri, d_nt, d_ns, d_tp, b, n, steps1, d_pred, d_ai, d_an);
  check(cudaGetLastError(), "launch verify_tree_greedy");
  SpecVerified v{download(d_pred, pred.size()), download(d_ai, ai.size()), download(d_an, static_cast<std::size_t>(b))};
  for (int* p : {d_c, d_ri, d_nt, d_ns, d_tp, d_pred, d_ai, d_an}) cudaFree(p);
  return v;
}

SpecVerified tree_speculative_sampling_target_only_cuda(
    const std::vector<int>& candidates, const std::vector<int>& retrieve_index, const std::vector<int>& next_token,
    const std::vector<int>& next_sibling, const std::vector<float>& probs, long long vocab,
    const std::vector<float>& coins, const std::vector<float>& final_coins, int b, int n, int steps1,
    float threshold_single, float threshold_acc) {
  threshold_acc = threshold_acc < 1e-9f ? 1e-9f : threshold_acc;
  int *d_c = upload(candidates), *d_ri = upload(retrieve_index), *d_nt = upload(next_token),
      *d_ns = upload(next_sibling);
  float *d_p = upload(probs), *d_coins = upload(coins), *d_fc = upload(final_coins);
  std::vector<int> pred(static_cast<std::size_t>(b) * n, -1), ai(static_cast<std::size_t>(b) * steps1, -1);
  int *d_pred = upload(pred), *d_ai = upload(ai), *d_an = alloc<int>(static_cast<std::size_t>(b));
  unsigned char* d_rej = alloc<unsigned char>(static_cast<std::size_t>(b * vocab));
  check(cudaMemset(d_rej, 0, static_cast<std::size_t>(b * vocab)), "memset");
  sampling_target_only_kernel<<<(b + 63) / 64, 64>>>(d_c, d_ri, d_nt, d_ns, d_p, vocab, d_coins, d_fc, b, n, steps1,
                                                     threshold_single, threshold_acc, d_pred, d_ai, d_an, d_rej);
  check(cudaGetLastError(), "launch tree_speculative_sampling_target_only");
  SpecVerified v{download(d_pred, pred.size()), download(d_ai, ai.size()), download(d_an, static_cast<std::size_t>(b))};
  for (void* p :
       {static_cast<void*>(d_c), static_cast<void*>(d_ri), static_cast<void*>(d_nt), static_cast<void*>(d_ns),
        static_cast<void*>(d_p), static_cast<void*>(d_coins), static_cast<void*>(d_fc), static_cast<void*>(d_pred),
        static_cast<void*>(d_ai), static_cast<void*>(d_an), static_cast<void*>(d_rej)})
    cudaFree(p);
  return v;
}

}  // namespace specactor::kernels::cuda

namespace specactor::kernels::cuda {
namespace {

constexpr int kBlock = 256;

// k rounds of a block-wide argmax over one row (ties: the lower index), skipping picked indices.
__global__ void row_topk_kernel(const float* probs, long long vocab, int k, const float* base_scores, int step,
                                float* out_scores, int* out_tokens) {
  const int f = blockIdx.x;
  const float* row = probs + f * vocab;
  __shared__ float best_v[kBlock];
  __shared__ int best_i[kBlock];
  __shared__ int picked[64];
  const float base = step == 0 ? 1.0f : base_scores[f];
  for (int round = 0; round < k; ++round) {
    float bv = -1.0f;
    int bi = 0x7fffffff;
    for (long long t = threadIdx.x; t < vocab; t += blockDim.x) {
      bool taken = false;
      for (int j = 0; j < round; ++j) taken = taken || picked[j] == t;
      if (taken) continue;
      const float v = row[t];
      if (v > bv || (v == bv && t < bi)) bv = v, bi = static_cast<int>(t);
    }
    best_v[threadIdx.x] = bv;
    best_i[threadIdx.x] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
      if (threadIdx.x < s) {
        const float ov = best_v[threadIdx.x + s];
        const int oi = best_i[threadIdx.x + s];
        if (ov > best_v[threadIdx.x] || (ov == best_v[threadIdx.x] && oi < best_i[threadIdx.x]))
          best_v[threadIdx.x] = ov, best_i[threadIdx.x] = oi;
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      picked[round] = best_i[0];
      out_scores[f * k + round] = base * best_v[0];
      out_tokens[f * k + round] = best_i[0];
    }
    __syncthreads();
  }
}

// One thread per request: the n-1 best of len scores (ties: lower index), then sorted ascending.
__global__ void organize_kernel(const float* scores, const int* tokens, int b, int len, int n, int* selected,
                                int* draft_tokens, unsigned char* used) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= b) return;
  const float* s = scores + r * len;
  unsigned char* u = used + r * len;
  int* sel = selected + r * (n - 1);
  for (int i = 0; i < n - 1; ++i) {
    int best = -1;
    for (int c = 0; c < len; ++c)
      if (!u[c] && (best < 0 || s[c] > s[best])) best = c;
    u[best] = 1;
    sel[i] = best;
  }
  for (int i = 1; i < n - 1; ++i)  // insertion sort, ascending
    for (int j = i; j > 0 && sel[j - 1] > sel[j]; --j) {
      const int t = sel[j];
      sel[j] = sel[j - 1];
      sel[j - 1] = t;
    }
  for (int i = 0; i < n - 1; ++i) draft_tokens[r * (n - 1) + i] = tokens[r * len + sel[i]];
}

__device__ int sample_row(const float* w, long long vocab, float coin) {
  double total = 0;
  for (long long t = 0; t < vocab; ++t) total += w[t];
  const double target = static_cast<double>(coin) * total;
  double acc = 0;
  int last = -1;
  for (long long t = 0; t < vocab; ++t) {
    if (w[t] <= 0) continue;
    acc += w[t];
    last = static_cast<int>(t);
    if (target < acc) return last;
  }
  return last;
}

__global__ void chain_rejection_kernel(const int* drafts, const float* q, const float* p, long long vocab,
                                       const float* coins, const float* final_coins, int b, int k, float* residual,
                                       int* out) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= b) return;
  for (int i = 0; i <= k; ++i) out[r * (k + 1) + i] = -1;
  float* res = residual + r * vocab;
  for (int i = 0; i < k; ++i) {
    const float* qi = q + (static_cast<long long>(r) * k + i) * vocab;
    const float* pi = p + (static_cast<long long>(r) * (k + 1) + i) * vocab;
    const int x = drafts[r * k + i];
    if (coins[r * k + i] * qi[x] < pi[x]) {
      out[r * (k + 1) + i] = x;
      continue;
    }
    for (long long t = 0; t < vocab; ++t) res[t] = fmaxf(0.0f, pi[t] - qi[t]);
    out[r * (k + 1) + i] = sample_row(res, vocab, final_coins[r]);
    return;
  }
  out[r * (k + 1) + k] = sample_row(p + (static_cast<long long>(r) * (k + 1) + k) * vocab, vocab, final_coins[r]);
}

// Sequential over j (path[j] >= j keeps sources intact), parallel over a row's floats.
__global__ void compact_kernel(float* rows, long long row_floats, long long base, const int* path, int n) {
  for (int j = 1; j < n; ++j) {
    const long long from = base + path[j], to = base + j;
    if (from != to)
      for (long long e = threadIdx.x; e < row_floats; e += blockDim.x)
        rows[to * row_floats + e] = rows[from * row_floats + e];
    __syncthreads();
  }
}

}  // namespace

SpecExpand topk_expand_cuda(const std::vector<float>& probs, int n_frontier, long long vocab, int k, int step,
                            const std::vector<float>& frontier_scores) {
  if (k > 64) throw std::invalid_argument("topk_expand_cuda: k must be <= 64");
  float* d_p = upload(probs);
  float* d_fs = upload(frontier_scores.empty() ? std::vector<float>(1, 1.0f) : frontier_scores);
  const std::size_t m = static_cast<std::size_t>(n_frontier) * k;
  float* d_s = alloc<float>(m);
  int* d_t = alloc<int>(m);
  row_topk_kernel<<<n_frontier, kBlock>>>(d_p, vocab, k, d_fs, step, d_s, d_t);
  check(cudaGetLastError(), "launch topk_expand");
  SpecExpand e;
  e.scores = download(d_s, m);
  e.tokens = download(d_t, m);
  cudaFree(d_p), cudaFree(d_fs), cudaFree(d_s), cudaFree(d_t);
  // The new frontier: best k of the n_frontier*k candidates (ties: lower index), on the host.
  std::vector<int> order(m);
  for (std::size_t i = 0; i < m; ++i) order[i] = static_cast<int>(i);
  const std::size_t kk = std::min<std::size_t>(static_cast<std::size_t>(k), m);
  std::partial_sort(order.begin(), order.begin() + static_cast<long>(kk), order.end(), [&](int a, int b) {
    return e.scores[static_cast<std::size_t>(a)] > e.scores[static_cast<std::size_t>(b)] ||
           (e.scores[static_cast<std::size_t>(a)] == e.scores[static_cast<std::size_t>(b)] && a < b);
  });
  const int first_id = step == 0 ? 0 : k + k * k * (step - 1);
  if (step == 0) e.parents.push_back(-1);
  for (std::size_t i = 0; i < kk; ++i) {
    const int c = order[i];
    e.frontier_scores.push_back(e.scores[static_cast<std::size_t>(c)]);
    e.frontier_ids.push_back(first_id + c);
    e.frontier_tokens.push_back(e.tokens[static_cast<std::size_t>(c)]);
    e.parents.push_back(first_id + c);
  }
  return e;
}

void organize_draft_results_cuda(const std::vector<float>& scores, const std::vector<int>& tokens, int b, int len,
                                 int n, std::vector<int>& selected, std::vector<int>& draft_tokens) {
  float* d_s = upload(scores);
  int* d_t = upload(tokens);
  const std::size_t sn = static_cast<std::size_t>(b) * (n - 1);
  int *d_sel = alloc<int>(sn), *d_dt = alloc<int>(sn);
  unsigned char* d_used = alloc<unsigned char>(static_cast<std::size_t>(b) * len);
  check(cudaMemset(d_used, 0, static_cast<std::size_t>(b) * len), "memset");
  organize_kernel<<<(b + 63) / 64, 64>>>(d_s, d_t, b, len, n, d_sel, d_dt, d_used);
  check(cudaGetLastError(), "launch organize");
  selected = download(d_sel, sn);
  draft_tokens = download(d_dt, sn);
  cudaFree(d_s), cudaFree(d_t), cudaFree(d_sel), cudaFree(d_dt), cudaFree(d_used);
}

std::vector<int> chain_rejection_sampling_cuda(const std::vector<int>& drafts, const std::vector<float>& q,
                                               const std::vector<float>& p, long long vocab,
                                               const std::vector<float>& coins, const std::vector<float>& final_coins,
                                               int b, int k) {
  int* d_d = upload(drafts);
  float *d_q = upload(q), *d_p = upload(p), *d_c = upload(coins), *d_f = upload(final_coins);
  float* d_res = alloc<float>(static_cast<std::size_t>(b * vocab));
  int* d_out = alloc<int>(static_cast<std::size_t>(b) * (k + 1));
  chain_rejection_kernel<<<(b + 63) / 64, 64>>>(d_d, d_q, d_p, vocab, d_c, d_f, b, k, d_res, d_out);
  check(cudaGetLastError(), "launch chain_rejection_sampling");
  std::vector<int> out = download(d_out, static_cast<std::size_t>(b) * (k + 1));
  cudaFree(d_d), cudaFree(d_q), cudaFree(d_p), cudaFree(d_c), cudaFree(d_f), cudaFree(d_res), cudaFree(d_out);
  return out;
}

void compact_accepted_rows_cuda(std::vector<float>& rows, long long row_floats, long long base,
                                const std::vector<int>& path) {
  float* d_rows = upload(rows);
  int* d_path = upload(path);
  compact_kernel<<<1, kBlock>>>(d_rows, row_floats, base, d_path, static_cast<int>(path.size()));
  check(cudaGetLastError(), "launch compact");
  rows = download(d_rows, rows.size());
  cudaFree(d_rows), cudaFree(d_path);
}

}  // namespace specactor::kernels::cuda
