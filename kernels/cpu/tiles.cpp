#include "kernels/cpu/tiles.hpp"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <stdexcept>

namespace specactor::kernels::tiles {

namespace {

constexpr long kArchReqXcompPerm = 0x1023;  // arch_prctl: ask for an XSAVE feature's state
constexpr long kXfeatureXtiledata = 18;

std::uint64_t xcr0() {
  std::uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<std::uint64_t>(hi) << 32) | lo;
}

// A configured tile's geometry, checked as the hardware would fault on it.
void check_tile(const Emulated::State& s, int t, const char* what) {
  if (!s.configured) throw std::logic_error(std::string("tiles::Emulated: ") + what + " before configure()");
  if (t < 0 || t >= kTiles)
    throw std::logic_error(std::string("tiles::Emulated: ") + what + ": no tile " + std::to_string(t));
}

}  // namespace

namespace {
bool probe_amx_int8() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool tile = (d >> 24) & 1, int8 = (d >> 25) & 1;
  unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
  if (!__get_cpuid(1, &a1, &b1, &c1, &d1) || !((c1 >> 27) & 1)) return false;  // OSXSAVE: xgetbv works
  return tile && int8 && ((xcr0() >> 17) & 3) == 3;
}
}  // namespace

bool cpu_has_amx_int8() {
  static const bool has = probe_amx_int8();  // CPUID is slow in a VM: once
  return has;
}

bool amx_permission(std::string& why) {
  static std::once_flag once;
  static bool granted = false;
  static std::string reason;
  std::call_once(once, [] {
    if (!cpu_has_amx_int8()) {
      reason = "this CPU does not report AMX-TILE and AMX-INT8 (or the OS does not enable the tile state)";
      return;
    }
    if (::syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) {
      reason =
          std::string("Linux refused the tile state (arch_prctl ARCH_REQ_XCOMP_PERM: ") + std::strerror(errno) + ")";
      return;
    }
    granted = true;
  });
  why = reason;
  return granted;
}

Emulated::State& Emulated::state() {
  thread_local State s;
  return s;
}

void Emulated::configure(const TileConfig& cfg) {
  if (cfg.palette != 1) throw std::logic_error("tiles::Emulated: only palette 1 is modelled");
  for (int t = 0; t < kTiles; ++t)
    if (cfg.rows[t] > kMaxRows || cfg.colsb[t] > kMaxColsb)
      throw std::logic_error("tiles::Emulated: tile " + std::to_string(t) + " is configured past 16 × 64 bytes");
  State& s = state();
  s.cfg = cfg;
  s.configured = true;
  std::memset(s.t, 0, sizeof s.t);  // LDTILECFG zeroes every tile
}

void Emulated::release() {
  State& s = state();
  s.configured = false;
  std::memset(s.t, 0, sizeof s.t);
}

void Emulated::load_tile(int t, const void* base, std::size_t stride) {
  State& s = state();
  check_tile(s, t, "load");
  const int rows = s.cfg.rows[t], colsb = s.cfg.colsb[t];
  const auto* p = static_cast<const std::uint8_t*>(base);
  std::memset(s.t[t], 0, sizeof s.t[t]);  // the rest of the register is zeroed
  for (int r = 0; r < rows; ++r) std::memcpy(s.t[t][r], p + static_cast<std::size_t>(r) * stride, colsb);
}

void Emulated::store_tile(int t, void* base, std::size_t stride) {
  State& s = state();
  check_tile(s, t, "store");
  const int rows = s.cfg.rows[t], colsb = s.cfg.colsb[t];
  auto* p = static_cast<std::uint8_t*>(base);
  for (int r = 0; r < rows; ++r) std::memcpy(p + static_cast<std::size_t>(r) * stride, s.t[t][r], colsb);
}

void Emulated::dot(int c, int a, int b, bool signed_a, bool signed_b) {
  State& s = state();
  check_tile(s, c, "dot product (dst)");
  check_tile(s, a, "dot product (src1)");
  check_tile(s, b, "dot product (src2)");
  const int m_rows = s.cfg.rows[c], n = s.cfg.colsb[c] / 4, k4 = s.cfg.colsb[a] / 4;
  // What the hardware checks before it computes (a #UD there): the shapes must agree.
  if (s.cfg.rows[a] != m_rows || s.cfg.rows[b] != k4 || s.cfg.colsb[b] != s.cfg.colsb[c])
    throw std::logic_error("tiles::Emulated: dot product of tiles whose shapes do not agree");
  auto ext_a = [&](std::uint8_t v) -> std::int32_t {
    return signed_a ? static_cast<std::int32_t>(static_cast<std::int8_t>(v)) : static_cast<std::int32_t>(v);
  };
  auto ext_b = [&](std::uint8_t v) -> std::int32_t {
    return signed_b ? static_cast<std::int32_t>(static_cast<std::int8_t>(v)) : static_cast<std::int32_t>(v);
  };
  for (int m = 0; m < m_rows; ++m) {
    std::uint32_t acc[kMaxColsb / 4];
    std::memcpy(acc, s.t[c][m], sizeof acc);
    for (int k = 0; k < k4; ++k)
      for (int j = 0; j < n; ++j) {
        std::uint32_t sum = 0;  // int32 arithmetic, wrapping: done in uint32
        for (int i = 0; i < 4; ++i)
          sum += static_cast<std::uint32_t>(ext_a(s.t[a][m][4 * k + i]) * ext_b(s.t[b][k][4 * j + i]));
        acc[j] += sum;
      }
    std::memset(s.t[c][m], 0, kMaxColsb);  // bytes past colsb are zeroed
    std::memcpy(s.t[c][m], acc, static_cast<std::size_t>(n) * 4);
  }
  for (int m = m_rows; m < kMaxRows; ++m) std::memset(s.t[c][m], 0, kMaxColsb);
}

}  // namespace specactor::kernels::tiles
