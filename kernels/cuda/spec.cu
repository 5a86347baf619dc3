// kernels/cuda/spec.cu — CUDA twins of kernels/spec (build_tree with the FULL mask, greedy tree
// verification, target-only tree sampling): one thread per request (or per node), same arguments
// as the CPU versions through host vectors. Compiled wherever nvcc exists; parity-tested on a GPU.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_api.hpp"

namespace specactor::kernels::cuda {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA ") + what + ": " + cudaGetErrorString(e));
}

template <class T> T* upload(const std::vector<T>& v) {
  T* d = nullptr;
  check(cudaMalloc(&d, sizeof(T) * (v.empty() ? 1 : v.size())), "malloc");
  if (!v.empty()) check(cudaMemcpy(d, v.data(), sizeof(T) * v.size(), cudaMemcpyHostToDevice), "memcpy");
  return d;
}
template <class T> T* alloc(std::size_t n) {
  T* d = nullptr;
  check(cudaMalloc(&d, sizeof(T) * (n ? n : 1)), "malloc");
  return d;
}
template <class T> std::vector<T> download(const T* d, std::size_t n) {
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
  int *d_par = alloc<int>(bn), *d_nt = alloc<int>(bn), *d_ns = alloc<int>(bn), *d_ri = alloc<int>(bn), *d_pos = alloc<int>(bn);
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
  for (void* p : {static_cast<void*>(d_pl), static_cast<void*>(d_sel), static_cast<void*>(d_len), static_cast<void*>(d_off),
                  static_cast<void*>(d_par), static_cast<void*>(d_nt), static_cast<void*>(d_ns), static_cast<void*>(d_ri),
                  static_cast<void*>(d_pos), static_cast<void*>(d_mask)})
    cudaFree(p);
  return t;
}

SpecVerified verify_tree_greedy_cuda(const std::vector<int>& candidates, const std::vector<int>& retrieve_index,
                                     const std::vector<int>& next_token, const std::vector<int>& next_sibling,
                                     const std::vector<int>& target_predict, int b, int n, int steps1) {
  int *d_c = upload(candidates), *d_ri = upload(retrieve_index), *d_nt = upload(next_token), *d_ns = upload(next_sibling),
      *d_tp = upload(target_predict);
  std::vector<int> pred(static_cast<std::size_t>(b) * n, -1), ai(static_cast<std::size_t>(b) * steps1, -1);
  int *d_pred = upload(pred), *d_ai = upload(ai), *d_an = alloc<int>(static_cast<std::size_t>(b));
  verify_greedy_kernel<<<(b + 63) / 64, 64>>>(d_c, d_ri, d_nt, d_ns, d_tp, b, n, steps1, d_pred, d_ai, d_an);
  check(cudaGetLastError(), "launch verify_tree_greedy");
  SpecVerified v{download(d_pred, pred.size()), download(d_ai, ai.size()), download(d_an, static_cast<std::size_t>(b))};
  for (int* p : {d_c, d_ri, d_nt, d_ns, d_tp, d_pred, d_ai, d_an}) cudaFree(p);
  return v;
}

SpecVerified tree_speculative_sampling_target_only_cuda(const std::vector<int>& candidates,
                                                        const std::vector<int>& retrieve_index,
                                                        const std::vector<int>& next_token,
                                                        const std::vector<int>& next_sibling,
                                                        const std::vector<float>& probs, long long vocab,
                                                        const std::vector<float>& coins,
                                                        const std::vector<float>& final_coins, int b, int n,
                                                        int steps1, float threshold_single, float threshold_acc) {
  threshold_acc = threshold_acc < 1e-9f ? 1e-9f : threshold_acc;
  int *d_c = upload(candidates), *d_ri = upload(retrieve_index), *d_nt = upload(next_token), *d_ns = upload(next_sibling);
  float *d_p = upload(probs), *d_coins = upload(coins), *d_fc = upload(final_coins);
  std::vector<int> pred(static_cast<std::size_t>(b) * n, -1), ai(static_cast<std::size_t>(b) * steps1, -1);
  int *d_pred = upload(pred), *d_ai = upload(ai), *d_an = alloc<int>(static_cast<std::size_t>(b));
  unsigned char* d_rej = alloc<unsigned char>(static_cast<std::size_t>(b * vocab));
  check(cudaMemset(d_rej, 0, static_cast<std::size_t>(b * vocab)), "memset");
  sampling_target_only_kernel<<<(b + 63) / 64, 64>>>(d_c, d_ri, d_nt, d_ns, d_p, vocab, d_coins, d_fc, b, n, steps1,
                                                     threshold_single, threshold_acc, d_pred, d_ai, d_an, d_rej);
  check(cudaGetLastError(), "launch tree_speculative_sampling_target_only");
  SpecVerified v{download(d_pred, pred.size()), download(d_ai, ai.size()), download(d_an, static_cast<std::size_t>(b))};
  for (void* p : {static_cast<void*>(d_c), static_cast<void*>(d_ri), static_cast<void*>(d_nt), static_cast<void*>(d_ns),
                  static_cast<void*>(d_p), static_cast<void*>(d_coins), static_cast<void*>(d_fc), static_cast<void*>(d_pred),
                  static_cast<void*>(d_ai), static_cast<void*>(d_an), static_cast<void*>(d_rej)})
    cudaFree(p);
  return v;
}

}  // namespace specactor::kernels::cuda
