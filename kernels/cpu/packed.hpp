// kernels/cpu/packed.hpp — the packed row layout of Q8_0/Q4_0/Q4_1 matrices (see pack_matrix), shared
// by the exact (matmul.cpp) and the integer (qmatmul.cpp) kernels. Internal to kernels/cpu.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

#include "kernels/cpu/matmul.hpp"
#include "kernels/cpu/quant.hpp"

namespace specactor::kernels::packed {

constexpr bool is_packed(WeightType t) {
  return t == WeightType::Q8_0 || t == WeightType::Q4_0 || t == WeightType::Q4_1;
}
constexpr int quant_bytes(WeightType t) { return t == WeightType::Q8_0 ? 32 : 16; }
constexpr int scale_arrays(WeightType t) { return t == WeightType::Q4_1 ? 2 : 1; }

inline std::uint16_t load_u16(const std::uint8_t* p) {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// A packed row of nc 32-element chunks: [d f16 × nc] [m f16 × nc (Q4_1 only)] [quants × nc].
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
