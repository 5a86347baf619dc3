// kernels/cuda/ops.cu — the forward's CUDA kernels (device-pointer launchers, ops.cuh) and their
// host-pointer twins for the parity tests (device_model.hpp). Contracts: those of the CPU kernels in
// kernels/cpu/ (same layouts, same tree-mask convention); results agree within float rounding.
#include <cuda_fp16.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/packed.hpp"
#include "kernels/cuda/ops.cuh"

namespace specactor::kernels::cuda {
namespace detail {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA ") + what + ": " + cudaGetErrorString(e));
}

void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("cuBLAS ") + what + ": status " + std::to_string(static_cast<int>(s)));
}

namespace {

constexpr std::uint32_t kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 8, kBF16 = 30;
constexpr int kBlock = 128;  // threads of the row-wise kernels (a power of two; the reductions rely on it)

__device__ __forceinline__ float half_at(const std::uint8_t* p) {
  return __half2float(*reinterpret_cast<const __half*>(p));
}

// Element i of a weight row (packed layout for the block types; see kernels/cpu/matmul.cpp).
__device__ __forceinline__ float wval(std::uint32_t type, const std::uint8_t* row, long long in, long long i) {
  switch (type) {
    case kF32:
      return reinterpret_cast<const float*>(row)[i];
    case kF16:
      return half_at(row + 2 * i);
    case kBF16:
      return __uint_as_float(static_cast<unsigned>(reinterpret_cast<const unsigned short*>(row)[i]) << 16);
    default: {
      const long long nc = in / 32, c = i / 32;
      const int j = static_cast<int>(i % 32);
      const float d = half_at(row + 2 * c);
      if (type == kQ8_0) return static_cast<float>(reinterpret_cast<const signed char*>(row + 2 * nc + 32 * c)[j]) * d;
      const std::uint8_t* qs = row + 2 * nc * (type == kQ4_1 ? 2 : 1) + 16 * c;
      const int b = qs[j & 15];
      const int nib = j < 16 ? (b & 15) : (b >> 4);
      if (type == kQ4_0) return static_cast<float>(nib - 8) * d;
      return fmaf(d, static_cast<float>(nib), half_at(row + 2 * nc + 2 * c));  // Q4_1: d·q + m
    }
  }
}

__device__ float block_max(float v, float* red) {
  red[threadIdx.x] = v;
  __syncthreads();
  for (int s = kBlock / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
    __syncthreads();
  }
  const float r = red[0];
  __syncthreads();
  return r;
}

__device__ float block_sum(float v, float* red) {
  red[threadIdx.x] = v;
  __syncthreads();
  for (int s = kBlock / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
    __syncthreads();
  }
  const float r = red[0];
  __syncthreads();
  return r;
}

__global__ void embedding_kernel(DMat w, const int* tokens, float* out) {
  const std::uint8_t* row = w.data + static_cast<std::size_t>(tokens[blockIdx.x]) * w.stride;
  float* y = out + static_cast<long long>(blockIdx.x) * w.in;
  for (long long i = threadIdx.x; i < w.in; i += blockDim.x) y[i] = wval(w.type, row, w.in, i);
}

__global__ void rmsnorm_rows_kernel(float* out, const float* x, const float* w, long long dim, float eps) {
  __shared__ double partial[kBlock];
  const float* xr = x + static_cast<long long>(blockIdx.x) * dim;
  float* yr = out + static_cast<long long>(blockIdx.x) * dim;
  double ss = 0.0;
  for (long long i = threadIdx.x; i < dim; i += blockDim.x) ss += static_cast<double>(xr[i]) * xr[i];
  partial[threadIdx.x] = ss;
  __syncthreads();
  for (int s = kBlock / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  const float scale = static_cast<float>(1.0 / sqrt(partial[0] / static_cast<double>(dim) + eps));
  for (long long i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = xr[i] * scale * w[i];
}

// One warp per output feature, up to kMatvecRows activation rows sharing each decoded weight.
__global__ void matvec_kernel(DMat w, const float* x, int rows, float* y) {
  const long long o = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (o >= w.out) return;
  const std::uint8_t* row = w.data + static_cast<std::size_t>(o) * w.stride;
  float acc[kMatvecRows];
#pragma unroll
  for (int r = 0; r < kMatvecRows; ++r) acc[r] = 0.0f;
  for (long long i = lane; i < w.in; i += 32) {
    const float wv = wval(w.type, row, w.in, i);
#pragma unroll
    for (int r = 0; r < kMatvecRows; ++r)
      if (r < rows) acc[r] = fmaf(wv, x[r * w.in + i], acc[r]);
  }
#pragma unroll
  for (int r = 0; r < kMatvecRows; ++r) {
    float v = acc[r];
    for (int s = 16; s > 0; s >>= 1) v += __shfl_xor_sync(0xffffffffu, v, s);
    if (lane == 0 && r < rows) y[r * w.out + o] = v;
  }
}

__global__ void dequant_kernel(DMat w, float* dense) {
  const long long idx = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= w.out * w.in) return;
  const long long o = idx / w.in, i = idx % w.in;
  dense[idx] = wval(w.type, w.data + static_cast<std::size_t>(o) * w.stride, w.in, i);
}

__global__ void rope_kernel(float* x, long long n_heads, long long head_dim, long long rope_dim, const int* positions,
                            double base, bool neox) {
  const long long t = blockIdx.x, half = rope_dim / 2;
  for (long long k = threadIdx.x; k < n_heads * half; k += blockDim.x) {
    const long long h = k / half, i = k % half;
    const double theta = positions[t] * pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(rope_dim));
    const float c = static_cast<float>(cos(theta)), s = static_cast<float>(sin(theta));
    float* v = x + (t * n_heads + h) * head_dim;
    const long long a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    const float x0 = v[a], x1 = v[b];
    v[a] = x0 * c - x1 * s;
    v[b] = x0 * s + x1 * c;
  }
}

__global__ void silu_mul_kernel(float* out, const float* gate, const float* up, long long n) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float g = gate[i];
  out[i] = g / (1.0f + expf(-g)) * up[i];
}

__global__ void add_kernel(float* x, const float* y, long long n) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] += y[i];
}

__device__ __forceinline__ long long slot_offset(const int* pages, long long slot, long long page_size,
                                                 long long page_stride, long long row) {
  return static_cast<long long>(pages[slot / page_size]) * page_stride + (slot % page_size) * row;
}

__global__ void kv_write_kernel(const float* k, const float* v, long long row, float* k_layer, float* v_layer,
                                long long page_size, long long page_stride, AttnRows r) {
  const int t = blockIdx.x, seq = r.row_seq[t];
  const long long slot = r.seq_old_len[seq] + r.row_idx[t];
  const long long off = slot_offset(r.pages + r.seq_page_off[seq], slot, page_size, page_stride, row);
  for (long long d = threadIdx.x; d < row; d += blockDim.x) {
    k_layer[off + d] = k[t * row + d];
    v_layer[off + d] = v[t * row + d];
  }
}

// One block per (query row, head): tiles of kBlock slots, online softmax (running max and sum), the
// output accumulated by thread d for dimension d. head_dim <= kBlock.
__global__ void attention_kernel(const float* q, long long n_heads, long long n_kv_heads, long long head_dim,
                                 const float* k_layer, const float* v_layer, long long page_size, long long page_stride,
                                 AttnRows r, float scale, float* out) {
  __shared__ float qs[kBlock], p[kBlock], red[kBlock];
  const int t = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
  const int seq = r.row_seq[t], i = r.row_idx[t];
  const long long old_len = r.seq_old_len[seq], n_ctx = old_len + r.seq_n_new[seq];
  const int* pages = r.pages + r.seq_page_off[seq];
  const bool has_mask = r.row_has_mask[t] != 0;
  const unsigned long long mask = r.row_mask[t];
  const long long row = n_kv_heads * head_dim, kvh = h / (n_heads / n_kv_heads);
  if (tid < head_dim) qs[tid] = q[(t * n_heads + h) * head_dim + tid];
  __syncthreads();
  float acc = 0.0f, m_run = -INFINITY, l_run = 0.0f;
  for (long long base = 0; base < n_ctx; base += kBlock) {
    const long long s = base + tid;
    float sc = -INFINITY;
    if (s < n_ctx) {
      const long long j = s - old_len;
      const bool visible = s < old_len || (has_mask ? ((mask >> j) & 1ull) != 0 : j <= i);
      if (visible) {
        const float* kr = k_layer + slot_offset(pages, s, page_size, page_stride, row) + kvh * head_dim;
        float dot = 0.0f;
        for (long long d = 0; d < head_dim; ++d) dot = fmaf(qs[d], kr[d], dot);
        sc = dot * scale;
      }
    }
    const float tile_max = block_max(sc, red);
    const float new_m = fmaxf(m_run, tile_max);
    if (new_m == -INFINITY) continue;  // nothing visible yet (the same for every thread)
    const float pe = sc == -INFINITY ? 0.0f : expf(sc - new_m);
    p[tid] = pe;
    const float tile_sum = block_sum(pe, red);  // its barriers also publish p[]
    const float corr = m_run == -INFINITY ? 0.0f : expf(m_run - new_m);
    l_run = l_run * corr + tile_sum;
    acc *= corr;
    if (tid < head_dim) {
      const long long n = n_ctx - base < kBlock ? n_ctx - base : kBlock;
      for (long long jj = 0; jj < n; ++jj)
        if (p[jj] != 0.0f)
          acc = fmaf(p[jj], v_layer[slot_offset(pages, base + jj, page_size, page_stride, row) + kvh * head_dim + tid],
                     acc);
    }
    m_run = new_m;
    __syncthreads();  // p[] is rewritten by the next tile
  }
  if (tid < head_dim) out[(t * n_heads + h) * head_dim + tid] = l_run > 0.0f ? acc / l_run : 0.0f;
}

__global__ void gather_rows_kernel(const float* x, const int* rows, long long dim, float* out) {
  const float* src = x + static_cast<long long>(rows[blockIdx.x]) * dim;
  float* dst = out + static_cast<long long>(blockIdx.x) * dim;
  for (long long i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = src[i];
}

__global__ void copy_slot_kernel(float* k_pool, float* v_pool, long long layer_stride, long long row,
                                 long long from_off, long long to_off) {
  const long long base = static_cast<long long>(blockIdx.x) * layer_stride;
  for (long long d = threadIdx.x; d < row; d += blockDim.x) {
    k_pool[base + to_off + d] = k_pool[base + from_off + d];
    v_pool[base + to_off + d] = v_pool[base + from_off + d];
  }
}

// The first index of the row's maximum (the CPU's argmax).
__global__ void argmax_kernel(const float* logits, long long vocab, int* out) {
  __shared__ float bv[kBlock];
  __shared__ long long bi[kBlock];
  const float* x = logits + static_cast<long long>(blockIdx.x) * vocab;
  float best = -INFINITY;
  long long idx = -1;
  for (long long i = threadIdx.x; i < vocab; i += blockDim.x)
    if (idx < 0 || x[i] > best) {
      best = x[i];
      idx = i;
    }
  bv[threadIdx.x] = best;
  bi[threadIdx.x] = idx;
  __syncthreads();
  for (int s = kBlock / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      const float ov = bv[threadIdx.x + s];
      const long long oi = bi[threadIdx.x + s];
      if (oi >= 0 && (bi[threadIdx.x] < 0 || ov > bv[threadIdx.x] || (ov == bv[threadIdx.x] && oi < bi[threadIdx.x]))) {
        bv[threadIdx.x] = ov;
        bi[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = static_cast<int>(bi[0] < 0 ? 0 : bi[0]);
}

__global__ void softmax_t_kernel(const float* logits, long long vocab, float temperature, float* probs) {
  __shared__ float red[kBlock];
  const float* x = logits + static_cast<long long>(blockIdx.x) * vocab;
  float* y = probs + static_cast<long long>(blockIdx.x) * vocab;
  float mx = -INFINITY;
  for (long long i = threadIdx.x; i < vocab; i += blockDim.x) mx = fmaxf(mx, x[i]);
  mx = block_max(mx, red);
  const double inv_t = 1.0 / temperature;
  float sum = 0.0f;
  for (long long i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float e = static_cast<float>(exp((static_cast<double>(x[i]) - mx) * inv_t));
    y[i] = e;
    sum += e;
  }
  sum = block_sum(sum, red);
  for (long long i = threadIdx.x; i < vocab; i += blockDim.x) y[i] /= sum;
}

unsigned blocks(long long n, int per) { return static_cast<unsigned>((n + per - 1) / per); }

}  // namespace

void launch_embedding(const DMat& w, const int* tokens, long long n, float* out, cudaStream_t st) {
  if (n == 0) return;
  embedding_kernel<<<static_cast<unsigned>(n), kBlock, 0, st>>>(w, tokens, out);
  check(cudaGetLastError(), "launch embedding");
}

void launch_rmsnorm(float* out, const float* x, const float* w, long long rows, long long dim, float eps,
                    cudaStream_t st) {
  if (rows == 0) return;
  rmsnorm_rows_kernel<<<static_cast<unsigned>(rows), kBlock, 0, st>>>(out, x, w, dim, eps);
  check(cudaGetLastError(), "launch rmsnorm");
}

void launch_matvec(const DMat& w, const float* x, long long rows, float* y, cudaStream_t st) {
  const int warps_per_block = 4;
  for (long long r0 = 0; r0 < rows; r0 += kMatvecRows) {
    const int n = static_cast<int>(rows - r0 < kMatvecRows ? rows - r0 : kMatvecRows);
    matvec_kernel<<<blocks(w.out, warps_per_block), 32 * warps_per_block, 0, st>>>(w, x + r0 * w.in, n, y + r0 * w.out);
    check(cudaGetLastError(), "launch matvec");
  }
}

void launch_dequant(const DMat& w, float* dense, cudaStream_t st) {
  dequant_kernel<<<blocks(w.out * w.in, 256), 256, 0, st>>>(w, dense);
  check(cudaGetLastError(), "launch dequant");
}

void gemm_rows(cublasHandle_t h, const float* dense, long long out, long long in, const float* x, long long rows,
               float* y) {
  // Column-major view: y_c (out × rows) = dense_c(in × out)ᵀ · x_c (in × rows).
  const float one = 1.0f, zero = 0.0f;
  check_blas(
      cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(out), static_cast<int>(rows), static_cast<int>(in),
                  &one, dense, static_cast<int>(in), x, static_cast<int>(in), &zero, y, static_cast<int>(out)),
      "sgemm");
}

void launch_rope(float* x, long long n_tok, long long n_heads, long long head_dim, long long rope_dim,
                 const int* positions, double base, bool neox, cudaStream_t st) {
  if (n_tok == 0) return;
  rope_kernel<<<static_cast<unsigned>(n_tok), kBlock, 0, st>>>(x, n_heads, head_dim, rope_dim, positions, base, neox);
  check(cudaGetLastError(), "launch rope");
}

void launch_silu_mul(float* out, const float* gate, const float* up, long long n, cudaStream_t st) {
  if (n == 0) return;
  silu_mul_kernel<<<blocks(n, 256), 256, 0, st>>>(out, gate, up, n);
  check(cudaGetLastError(), "launch silu_mul");
}

void launch_add(float* x, const float* y, long long n, cudaStream_t st) {
  if (n == 0) return;
  add_kernel<<<blocks(n, 256), 256, 0, st>>>(x, y, n);
  check(cudaGetLastError(), "launch add");
}

void launch_kv_write(const float* k, const float* v, long long T, long long row, float* k_layer, float* v_layer,
                     long long page_size, long long page_stride, const AttnRows& r, cudaStream_t st) {
  if (T == 0) return;
  kv_write_kernel<<<static_cast<unsigned>(T), kBlock, 0, st>>>(k, v, row, k_layer, v_layer, page_size, page_stride, r);
  check(cudaGetLastError(), "launch kv_write");
}

void launch_attention(const float* q, long long T, long long n_heads, long long n_kv_heads, long long head_dim,
                      const float* k_layer, const float* v_layer, long long page_size, long long page_stride,
                      const AttnRows& r, float scale, float* out, cudaStream_t st) {
  if (T == 0) return;
  if (head_dim > kBlock)
    throw std::runtime_error("CUDA attention: head_dim " + std::to_string(head_dim) + " > " + std::to_string(kBlock));
  attention_kernel<<<dim3(static_cast<unsigned>(T), static_cast<unsigned>(n_heads)), kBlock, 0, st>>>(
      q, n_heads, n_kv_heads, head_dim, k_layer, v_layer, page_size, page_stride, r, scale, out);
  check(cudaGetLastError(), "launch attention");
}

void launch_gather_rows(const float* x, const int* rows, long long n, long long dim, float* out, cudaStream_t st) {
  if (n == 0) return;
  gather_rows_kernel<<<static_cast<unsigned>(n), kBlock, 0, st>>>(x, rows, dim, out);
  check(cudaGetLastError(), "launch gather_rows");
}

void launch_copy_slot(float* k_pool, float* v_pool, long long layers, long long layer_stride, long long row,
                      long long from_off, long long to_off, cudaStream_t st) {
  copy_slot_kernel<<<static_cast<unsigned>(layers), kBlock, 0, st>>>(k_pool, v_pool, layer_stride, row, from_off,
                                                                     to_off);
  check(cudaGetLastError(), "launch copy_slot");
}

void launch_argmax(const float* logits, long long rows, long long vocab, int* out, cudaStream_t st) {
  if (rows == 0) return;
  argmax_kernel<<<static_cast<unsigned>(rows), kBlock, 0, st>>>(logits, vocab, out);
  check(cudaGetLastError(), "launch argmax");
}

void launch_softmax_t(const float* logits, long long rows, long long vocab, float temperature, float* probs,
                      cudaStream_t st) {
  if (rows == 0) return;
  softmax_t_kernel<<<static_cast<unsigned>(rows), kBlock, 0, st>>>(logits, vocab, temperature, probs);
  check(cudaGetLastError(), "launch softmax");
}

}  // namespace detail

// --- host-pointer twins (parity tests) --------------------------------------------------------------

namespace {

using detail::check;

// A device buffer freed on scope exit (so a failing CUDA call in a test leaks nothing).
template <class T>
struct Buf {
  T* p = nullptr;
  explicit Buf(std::size_t n) { check(cudaMalloc(&p, sizeof(T) * (n ? n : 1)), "malloc"); }
  Buf(const T* host, std::size_t n) : Buf(n) {
    if (n) check(cudaMemcpy(p, host, sizeof(T) * n, cudaMemcpyHostToDevice), "memcpy");
  }
  ~Buf() { cudaFree(p); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  void to_host(T* host, std::size_t n) const {
    if (n) check(cudaMemcpy(host, p, sizeof(T) * n, cudaMemcpyDeviceToHost), "memcpy");
  }
};

detail::DMat device_view(const WeightMatrix& w, const Buf<std::uint8_t>& bytes) {
  return {static_cast<std::uint32_t>(w.type), w.out_dim, w.in_dim, bytes.p, w.row_stride};
}

void require_supported(const WeightMatrix& w) {
  if (!computable_on_device(w))
    throw std::runtime_error("CUDA kernels: weight type " + std::to_string(static_cast<unsigned>(w.type)) +
                             (w.packed ? "" : " (unpacked)") + " is not computed on the device");
}

}  // namespace

bool computable_on_device(const WeightMatrix& w) {
  const auto t = static_cast<std::uint32_t>(w.type);
  if (t == detail::kF32 || t == detail::kF16 || t == detail::kBF16) return true;
  return (t == detail::kQ8_0 || t == detail::kQ4_0 || t == detail::kQ4_1) && w.packed;
}

void embedding_rows_cuda(const WeightMatrix& w, const std::vector<std::int32_t>& tokens, float* out) {
  require_supported(w);
  std::vector<std::uint8_t> split;  // packed panels → the split row layout the device kernels read
  Buf<std::uint8_t> bytes(packed::split_rows(w, split), static_cast<std::size_t>(w.out_dim) * w.row_stride);
  Buf<int> tok(tokens.data(), tokens.size());
  Buf<float> y(tokens.size() * static_cast<std::size_t>(w.in_dim));
  detail::launch_embedding(device_view(w, bytes), tok.p, static_cast<long long>(tokens.size()), y.p, nullptr);
  y.to_host(out, tokens.size() * static_cast<std::size_t>(w.in_dim));
}

void matmul_cuda(const WeightMatrix& w, const float* x, std::int64_t rows, float* y, bool gemm) {
  require_supported(w);
  std::vector<std::uint8_t> split;  // packed panels → the split row layout the device kernels read
  Buf<std::uint8_t> bytes(packed::split_rows(w, split), static_cast<std::size_t>(w.out_dim) * w.row_stride);
  Buf<float> dx(x, static_cast<std::size_t>(rows * w.in_dim)), dy(static_cast<std::size_t>(rows * w.out_dim));
  const detail::DMat m = device_view(w, bytes);
  if (gemm) {
    Buf<float> dense(static_cast<std::size_t>(w.out_dim * w.in_dim));
    detail::launch_dequant(m, dense.p, nullptr);
    cublasHandle_t h = nullptr;
    detail::check_blas(cublasCreate(&h), "create");
    try {
      detail::gemm_rows(h, dense.p, w.out_dim, w.in_dim, dx.p, rows, dy.p);
    } catch (...) {
      cublasDestroy(h);
      throw;
    }
    cublasDestroy(h);
  } else {
    detail::launch_matvec(m, dx.p, rows, dy.p, nullptr);
  }
  dy.to_host(y, static_cast<std::size_t>(rows * w.out_dim));
}

void rope_cuda(float* x, std::int64_t n_tok, std::int64_t n_heads, std::int64_t head_dim, std::int64_t rope_dim,
               const std::int32_t* positions, double base, bool neox) {
  const std::size_t n = static_cast<std::size_t>(n_tok * n_heads * head_dim);
  Buf<float> dx(x, n);
  Buf<int> pos(positions, static_cast<std::size_t>(n_tok));
  detail::launch_rope(dx.p, n_tok, n_heads, head_dim, rope_dim, pos.p, base, neox, nullptr);
  dx.to_host(x, n);
}

void silu_mul_cuda(float* out, const float* gate, const float* up, std::int64_t n) {
  Buf<float> g(gate, static_cast<std::size_t>(n)), u(up, static_cast<std::size_t>(n)), y(static_cast<std::size_t>(n));
  detail::launch_silu_mul(y.p, g.p, u.p, n, nullptr);
  y.to_host(out, static_cast<std::size_t>(n));
}

void attention_cuda(const float* q, std::int64_t n_q, std::int64_t n_heads, std::int64_t n_kv_heads,
                    std::int64_t head_dim, const float* k_pool, const float* v_pool, std::int64_t n_pages,
                    const std::int32_t* pages, std::int64_t page_size, std::int64_t n_prefix, const std::uint64_t* mask,
                    float scale, float* out) {
  const std::int64_t row = n_kv_heads * head_dim, pool = n_pages * page_size * row;
  const std::int64_t used_pages = (n_prefix + n_q + page_size - 1) / page_size;
  Buf<float> dq(q, static_cast<std::size_t>(n_q * n_heads * head_dim)), dk(k_pool, static_cast<std::size_t>(pool)),
      dv(v_pool, static_cast<std::size_t>(pool)), dout(static_cast<std::size_t>(n_q * n_heads * head_dim));
  Buf<int> dpages(pages, static_cast<std::size_t>(used_pages));
  std::vector<int> row_seq(static_cast<std::size_t>(n_q), 0), row_idx(static_cast<std::size_t>(n_q));
  std::vector<unsigned long long> row_mask(static_cast<std::size_t>(n_q), 0);
  std::vector<unsigned char> has(static_cast<std::size_t>(n_q), mask ? 1 : 0);
  for (std::int64_t i = 0; i < n_q; ++i) {
    row_idx[static_cast<std::size_t>(i)] = static_cast<int>(i);
    if (mask) row_mask[static_cast<std::size_t>(i)] = mask[i];
  }
  const long long old_len = n_prefix, off = 0;
  const int n_new = static_cast<int>(n_q);
  Buf<int> d_seq(row_seq.data(), row_seq.size()), d_idx(row_idx.data(), row_idx.size()), d_new(&n_new, 1);
  Buf<long long> d_old(&old_len, 1), d_off(&off, 1);
  Buf<unsigned long long> d_mask(row_mask.data(), row_mask.size());
  Buf<unsigned char> d_has(has.data(), has.size());
  const detail::AttnRows r{d_seq.p, d_idx.p, d_old.p, d_new.p, d_off.p, dpages.p, d_mask.p, d_has.p};
  detail::launch_attention(dq.p, n_q, n_heads, n_kv_heads, head_dim, dk.p, dv.p, page_size, page_size * row, r, scale,
                           dout.p, nullptr);
  dout.to_host(out, static_cast<std::size_t>(n_q * n_heads * head_dim));
}

std::vector<std::int32_t> argmax_rows_cuda(const float* logits, std::int64_t rows, std::int64_t vocab) {
  Buf<float> x(logits, static_cast<std::size_t>(rows * vocab));
  Buf<int> ids(static_cast<std::size_t>(rows));
  detail::launch_argmax(x.p, rows, vocab, ids.p, nullptr);
  std::vector<std::int32_t> out(static_cast<std::size_t>(rows));
  ids.to_host(out.data(), out.size());
  return out;
}

void softmax_temperature_cuda(const float* logits, std::int64_t rows, std::int64_t vocab, float temperature,
                              float* probs) {
  Buf<float> x(logits, static_cast<std::size_t>(rows * vocab)), y(static_cast<std::size_t>(rows * vocab));
  detail::launch_softmax_t(x.p, rows, vocab, temperature, y.p, nullptr);
  y.to_host(probs, static_cast<std::size_t>(rows * vocab));
}

double measure_device_bandwidth_gbps(int device, std::size_t bytes) {
  check(cudaSetDevice(device), "set device");
  Buf<std::uint8_t> a(bytes), b(bytes);
  check(cudaMemset(a.p, 1, bytes), "memset");
  cudaEvent_t start = nullptr, stop = nullptr;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  check(cudaMemcpy(b.p, a.p, bytes, cudaMemcpyDeviceToDevice), "warm-up copy");
  const int reps = 10;
  check(cudaEventRecord(start), "event");
  for (int i = 0; i < reps; ++i)
    check(cudaMemcpyAsync(i % 2 ? a.p : b.p, i % 2 ? b.p : a.p, bytes, cudaMemcpyDeviceToDevice), "copy");
  check(cudaEventRecord(stop), "event");
  check(cudaEventSynchronize(stop), "event");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return 2.0 * static_cast<double>(bytes) * reps / (ms * 1e-3) / 1e9;
}

}  // namespace specactor::kernels::cuda
