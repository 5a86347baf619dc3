// kernels/cpu/packed.hpp — the packed layout of Q8_0/Q4_0/Q4_1 matrices (see pack_matrix), shared by
// the exact (matmul.cpp) and the integer (qmatmul.cpp) kernels, and split_rows() for code that reads
// whole rows (the CUDA upload).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/matmul.hpp"
#include "kernels/cpu/quant.hpp"

namespace specactor::kernels::packed {

constexpr bool is_packed(WeightType t) {
  return t == WeightType::Q8_0 || t == WeightType::Q4_0 || t == WeightType::Q4_1;
}
// The packed layout: output rows in panels of 8 (the last panel zero padded), and per panel one
// record per 32-element chunk c holding the chunk of all 8 rows:
//   [d f16 × 8] [m f16 × 8 (Q4_1 only)] [quants: groups of 4 bytes, group g of row r at g·32 + r·4]
// Quant byte i of a row's ggml block (Q8_0: 32 signed quants, element i; Q4_0/Q4_1: 16 bytes, low
// nibble element i, high nibble element 16 + i) lies at (i/4)·32 + r·4 + i%4. One 32-byte load then
// holds the same 4 (Q4: 4 + 4) elements of 8 rows, and a 4-byte activation broadcast multiplies all 8.
constexpr std::int64_t kPanel = 8;
constexpr int quant_bytes(WeightType t) { return t == WeightType::Q8_0 ? 32 : 16; }
constexpr int scale_arrays(WeightType t) { return t == WeightType::Q4_1 ? 2 : 1; }
constexpr std::int64_t panel_chunk_bytes(WeightType t) { return kPanel * (2 * scale_arrays(t) + quant_bytes(t)); }
constexpr std::int64_t scale_bytes(WeightType t) { return kPanel * 2 * scale_arrays(t); }  // offset of the quants
inline std::int64_t panel_count(std::int64_t out) { return (out + kPanel - 1) / kPanel; }
inline std::size_t packed_bytes(WeightType t, std::int64_t out, std::int64_t in) {
  return static_cast<std::size_t>(panel_count(out) * (in / 32) * panel_chunk_bytes(t));
}
inline std::size_t panel_quant_offset(int i, int r) { return static_cast<std::size_t>((i / 4) * 32 + r * 4 + i % 4); }
// Chunk c of panel p of a packed matrix of nc chunks per row.
inline const std::uint8_t* panel_chunk(const WeightMatrix& w, std::int64_t p, std::int64_t c) {
  const std::int64_t nc = w.in_dim / 32;
  return w.data + static_cast<std::size_t>((p * nc + c) * panel_chunk_bytes(w.type));
}

// The tile layout (the AMX path; pack_matrix builds it next to the panels when that path runs):
// panels of 16 output rows, and per panel one record per 32-element chunk c of all 16 rows:
//   Q8_0: [quants 512] [d f32 × 16]; Q4_0: [quants 256] [d f16 × 16] [32 bytes unused];
//   Q4_1: [quants 256] [d f16 × 16] [m f16 × 16]
// Quants, Q8_0: 8 × 64 bytes, row k = quant bytes 4k..4k+3 of rows 0..15 side by side — exactly the
// B operand of one tile product over the chunk (8 rows of 16 × 4 bytes). Q4_0/Q4_1: 4 × 64 bytes,
// block g = ggml quant bytes 4g..4g+3 of rows 0..15: its low nibbles are B row g (elements 4g..4g+3),
// its high nibbles B row 4 + g (elements 16 + 4g..), so one load, a mask and a shift make two B rows.
// Q8_0's scales are stored as the f32 values f16_to_f32 gives (exact); Q4's as the file's f16 (the
// kernel converts them, exactly: 320 bytes a record where f32 took 384, so no more bytes to stream
// than the file's own blocks). Every record is 64-byte aligned.
// The K-quants (Q4_K, Q6_K) keep their ggml rows for the other paths; their tile copy is made from
// the decoded chunks (qmatmul.cpp: the integer quants and lane scales every path uses):
//   Q4_K: [quants 256, arranged as Q4_0's: low nibble element 4g+i, high 16+4g+i] [ws f32 × 16] [wm f32 × 16]
//   Q6_K: [quants 512, the signed q − 32 arranged as Q8_0's]  [ws of elements 0–15 f32 × 16] [of 16–31 × 16]
// so B row l (after Q4's unpacking) is lane l's 4 elements of the 16 rows. The f32 scales are the
// exact products d·sc (an f16 times a 6- or 8-bit integer), so storing them changes no bit.
constexpr std::int64_t kTilePanel = 16;
constexpr bool is_kquant(WeightType t) { return t == WeightType::Q4_K || t == WeightType::Q6_K; }
constexpr bool has_tile_layout(WeightType t) { return is_packed(t) || is_kquant(t); }
constexpr std::int64_t tile_quant_bytes(WeightType t) {
  return t == WeightType::Q8_0 || t == WeightType::Q6_K ? 512 : 256;
}
constexpr std::int64_t tile_chunk_bytes(WeightType t) { return tile_quant_bytes(t) + (is_kquant(t) ? 128 : 64); }
inline std::int64_t tile_panel_count(std::int64_t out) { return (out + kTilePanel - 1) / kTilePanel; }
inline std::size_t tile_bytes(WeightType t, std::int64_t out, std::int64_t in) {
  return static_cast<std::size_t>(tile_panel_count(out) * (in / 32) * tile_chunk_bytes(t));
}
// Chunk c of tile panel p of a matrix with a tile copy.
inline const std::uint8_t* tile_chunk(const WeightMatrix& w, std::int64_t p, std::int64_t c) {
  const std::int64_t nc = w.in_dim / 32;
  return w.tiles + static_cast<std::size_t>((p * nc + c) * tile_chunk_bytes(w.type));
}
// The tile copy of a Q4_K/Q6_K matrix (ggml rows at w.data) into dst (tile_bytes, zeroed); qmatmul.cpp.
void build_kquant_tiles(const WeightMatrix& w, std::uint8_t* dst);

inline std::uint16_t load_u16(const std::uint8_t* p) {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Row o of a packed matrix gathered out of its panel: chunk c's d (f16) to d + c·step, its m (Q4_1)
// to m + c·step, its quant bytes to q + c·qstep.
inline void gather_row(const WeightMatrix& w, std::int64_t o, std::uint8_t* d, std::uint8_t* m, std::int64_t step,
                       std::uint8_t* q, std::int64_t qstep) {
  const std::int64_t nc = w.in_dim / 32, p = o / kPanel;
  const int r = static_cast<int>(o % kPanel), qb = quant_bytes(w.type);
  for (std::int64_t c = 0; c < nc; ++c) {
    const std::uint8_t* src = panel_chunk(w, p, c);
    std::memcpy(d + c * step, src + 2 * r, 2);
    if (w.type == WeightType::Q4_1) std::memcpy(m + c * step, src + 16 + 2 * r, 2);
    const std::uint8_t* qs = src + scale_bytes(w.type);
    for (int i = 0; i < qb; ++i) q[c * qstep + i] = qs[panel_quant_offset(i, r)];
  }
}

// Row o of a packed matrix as ggml blocks (the file's layout), into dst (row_stride bytes).
inline void ggml_row(const WeightMatrix& w, std::int64_t o, std::uint8_t* dst) {
  const int sa = scale_arrays(w.type);
  const std::int64_t bb = 2 * sa + quant_bytes(w.type);
  gather_row(w, o, dst, dst + 2, bb, dst + 2 * sa, bb);
}

// A row of nc 32-element chunks split into arrays (the exact precision's kernels read this):
// [d f16 × nc] [m f16 × nc (Q4_1 only)] [quants × nc].
struct PackedRow {
  const std::uint8_t* d;   // f16[nc]
  const std::uint8_t* m;   // f16[nc] (Q4_1)
  const std::uint8_t* qs;  // nc × quant_bytes
};
inline PackedRow packed_row(WeightType t, const std::uint8_t* row, std::int64_t nc) {
  PackedRow r;
  r.d = row;
  r.m = row + 2 * nc;
  r.qs = row + 2 * nc * scale_arrays(t);
  return r;
}
// Row o of a packed matrix in that split layout, into buf (row_stride bytes); returns buf.
inline const std::uint8_t* split_row(const WeightMatrix& w, std::int64_t o, std::uint8_t* buf) {
  const std::int64_t nc = w.in_dim / 32;
  gather_row(w, o, buf, buf + 2 * nc, 2, buf + 2 * nc * scale_arrays(w.type), quant_bytes(w.type));
  return buf;
}

// Every row of a matrix in the split layout (packed) or as it is (other types): what the CUDA
// kernels read. A packed matrix is copied out into `storage`.
inline const std::uint8_t* split_rows(const WeightMatrix& w, std::vector<std::uint8_t>& storage) {
  if (!w.packed) return w.data;
  storage.resize(static_cast<std::size_t>(w.out_dim) * w.row_stride);
  for (std::int64_t o = 0; o < w.out_dim; ++o)
    split_row(w, o, storage.data() + static_cast<std::size_t>(o) * w.row_stride);
  return storage.data();
}

// Checks the jobs of one matmul_many call (packed where the kernels need it, one input width, a
// multiple of 32 and at most max_in) and returns their total output rows. Both precisions call it.
inline std::int64_t checked_total_rows(const MatmulJob* jobs, int n_jobs, std::int64_t max_in) {
  std::int64_t total = 0;
  for (int j = 0; j < n_jobs; ++j) {
    const WeightMatrix& w = *jobs[j].w;
    if (is_packed(w.type) && !w.packed)
      throw std::invalid_argument("matmul: Q8_0/Q4_0/Q4_1 weights must be packed first");
    if (w.in_dim <= 0 || w.in_dim % 32 != 0 || w.in_dim > max_in || w.in_dim != jobs[0].w->in_dim)
      throw std::invalid_argument("matmul: unsupported input width " + std::to_string(w.in_dim));
    total += w.out_dim;
  }
  return total;
}

// 64-byte aligned storage for activation buffers (no vector load split across cache lines).
template <class T>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() = default;
  template <class U>
  AlignedAllocator(const AlignedAllocator<U>&) {}
  T* allocate(std::size_t n) {
    void* p = std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64);
    if (!p) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t) { std::free(p); }
  template <class U>
  bool operator==(const AlignedAllocator<U>&) const {
    return true;
  }
};

}  // namespace specactor::kernels::packed
