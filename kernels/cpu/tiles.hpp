// kernels/cpu/tiles.hpp — the tile unit (Intel AMX: AMX-TILE and AMX-INT8) behind one small
// interface with two implementations, so a kernel written once runs on the hardware and, in tests on
// any x86-64 CPU, on a software model of it:
//   - tiles::Hardware: the instructions, in functions compiled with target attributes (the rest of
//     the build keeps its flags); usable only after amx_permission() said yes on a CPU with AMX;
//   - tiles::Emulated: the same operations written from the ISA's definition, on a per-thread copy of
//     the eight tile registers, proven bit for bit against results recorded on a real AMX CPU
//     (tests/data/amx_goldens.json, test_tiles).
// A kernel is a template over the unit: `template <class Unit> void kernel(...)`, calling
// Unit::configure(cfg), Unit::template load<T>(ptr, stride), Unit::template dpbusd<C, A, B>() …
// Tile numbers are template arguments because the instructions encode them.
//
// The ISA, palette 1: 8 tiles of at most 16 rows × 64 bytes. A configuration gives each tile its rows
// and bytes per row (colsb). load<T> reads rows × colsb bytes with a stride and zeroes the rest of the
// register; store<T> writes rows × colsb bytes and leaves the bytes past colsb in each row alone. The
// int8 dot products, for dst C (M × N dwords), src A (M × K·4 bytes) and src B (K rows × N·4 bytes):
//   C[m][n] += Σ_k Σ_{i<4} a(A[m][4k+i]) · b(B[k][4n+i])   in int32, wrapping,
// with a/b zero- or sign-extension by the instruction: dpbusd (u8 A, s8 B), dpbssd (s8, s8),
// dpbsud (s8, u8), dpbuud (u8, u8). Rows of C past M and bytes past its colsb are zeroed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace specactor::kernels::tiles {

// The 64-byte LDTILECFG operand, palette 1.
struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

constexpr int kTiles = 8, kMaxRows = 16, kMaxColsb = 64;

// Whether this CPU reports AMX-TILE and AMX-INT8 (CPUID leaf 7: EDX bits 24 and 25) and the OS
// enables the tile state (XCR0 bits 17 and 18).
bool cpu_has_amx_int8();
// Asks Linux for the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), once per
// process; true when granted. `why` says why not (no AMX, an old kernel, a container's refusal).
bool amx_permission(std::string& why);

// The software model: the eight registers and the configuration of the calling thread.
struct Emulated {
  struct State {
    TileConfig cfg;
    bool configured = false;
    alignas(64) std::uint8_t t[kTiles][kMaxRows][kMaxColsb] = {};
  };
  static State& state();

  static void configure(const TileConfig& cfg);
  static void release();
  template <int T>
  static void zero() {
    auto& r = state().t[T];
    for (auto& row : r)
      for (auto& b : row) b = 0;
  }
  template <int T>
  static void load(const void* base, std::size_t stride) {
    load_tile(T, base, stride);
  }
  template <int T>
  static void store(void* base, std::size_t stride) {
    store_tile(T, base, stride);
  }
  template <int C, int A, int B>
  static void dpbusd() {
    dot(C, A, B, false, true);
  }
  template <int C, int A, int B>
  static void dpbssd() {
    dot(C, A, B, true, true);
  }
  template <int C, int A, int B>
  static void dpbsud() {
    dot(C, A, B, true, false);
  }
  template <int C, int A, int B>
  static void dpbuud() {
    dot(C, A, B, false, false);
  }

  // Runtime-indexed forms (tests, and what the templates call).
  static void load_tile(int t, const void* base, std::size_t stride);
  static void store_tile(int t, void* base, std::size_t stride);
  static void dot(int c, int a, int b, bool signed_a, bool signed_b);
};

// The hardware, as inline assembly (the tile number is part of the instruction, so each is a template
// argument printed with %c; binutils assembles the mnemonics, no compiler flag is needed). Every call
// is valid only on a thread of a process that has amx_permission(), with a configuration loaded by
// configure() on that thread (the tile state is per thread).
struct Hardware {
  static void configure(const TileConfig& cfg);
  static void release();
  template <int T>
  static void zero();
  template <int T>
  static void load(const void* base, std::size_t stride);
  template <int T>
  static void store(void* base, std::size_t stride);
  template <int C, int A, int B>
  static void dpbusd();
  template <int C, int A, int B>
  static void dpbssd();
  template <int C, int A, int B>
  static void dpbsud();
  template <int C, int A, int B>
  static void dpbuud();
};

}  // namespace specactor::kernels::tiles

#include "kernels/cpu/tiles_hw.inc"
