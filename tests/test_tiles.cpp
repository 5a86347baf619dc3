// tests/test_tiles.cpp — the tile unit (kernels/cpu/tiles.hpp): the software model against results a
// real AMX CPU computed (tests/data/amx_goldens.json, recorded on an Intel Xeon with AMX-INT8 by the
// program in the shared goldens folder), and, on a CPU with AMX, the hardware against the same
// results and against the model on random shapes.
#include <doctest/doctest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/tiles.hpp"

using namespace specactor::kernels::tiles;
using json = nlohmann::json;

namespace {

json goldens() {
  std::ifstream f(SPECACTOR_SOURCE_DIR "/tests/data/amx_goldens.json");
  REQUIRE(f.good());
  return json::parse(f);
}

template <class T>
std::vector<T> values(const json& a) {
  std::vector<T> v;
  for (const auto& x : a) v.push_back(static_cast<T>(x.get<long long>()));
  return v;
}

// One golden case through `Unit`: tmm0 = C, tmm1 = A, tmm2 = B, loads with the case's strides, the op,
// then a store into a buffer filled with 0x5A5A5A5A (what the recording did). Returns the stored words.
template <class Unit>
std::vector<std::int32_t> run_case(const json& c) {
  const int M = c["M"], kb = c["A_colsb"], nb = c["C_colsb"];
  const std::size_t sa = c["A_stride"], sb = c["B_stride"], sc = c["C_stride"];
  const auto A = values<std::uint8_t>(c["A_bytes"]), B = values<std::uint8_t>(c["B_bytes"]);
  const auto Cin = values<std::int32_t>(c["C_in_int32_bits"]);
  TileConfig cfg;
  cfg.rows[0] = static_cast<std::uint8_t>(M);
  cfg.colsb[0] = static_cast<std::uint16_t>(nb);
  cfg.rows[1] = static_cast<std::uint8_t>(M);
  cfg.colsb[1] = static_cast<std::uint16_t>(kb);
  cfg.rows[2] = static_cast<std::uint8_t>(kb / 4);
  cfg.colsb[2] = static_cast<std::uint16_t>(nb);
  Unit::configure(cfg);
  Unit::template load<0>(Cin.data(), sc);
  Unit::template load<1>(A.data(), sa);
  Unit::template load<2>(B.data(), sb);
  const std::string op = c["op"];
  if (op == "tdpbusd") Unit::template dpbusd<0, 1, 2>();
  if (op == "tdpbssd") Unit::template dpbssd<0, 1, 2>();
  if (op == "tdpbsud") Unit::template dpbsud<0, 1, 2>();
  if (op == "tdpbuud") Unit::template dpbuud<0, 1, 2>();
  std::vector<std::int32_t> out(Cin.size(), 0x5A5A5A5A);
  Unit::template store<0>(out.data(), sc);
  Unit::release();
  return out;
}

}  // namespace

TEST_CASE("tile emulator: every integer case recorded on a real AMX CPU, bit for bit") {
  const json g = goldens();
  int checked = 0;
  for (const auto& c : g["cases"]) {
    if (c["op"] == "tdpbf16ps") continue;  // BF16 rounding is not modelled (see tiles.hpp): no BF16 path uses it
    CAPTURE(c["op"].get<std::string>());
    CAPTURE(c["M"].get<int>());
    CAPTURE(c["A_colsb"].get<int>());
    CAPTURE(c["C_colsb"].get<int>());
    CHECK(run_case<Emulated>(c) == values<std::int32_t>(c["C_out_int32_bits"]));
    ++checked;
  }
  CHECK(checked == 24);  // 4 ops × 6 shapes, the last one wrapping past INT32_MAX
}

TEST_CASE("tile emulator: a corrupted operand or a wrong sign changes the result (the check can fail)") {
  const json g = goldens();
  json c = g["cases"][0];  // tdpbusd 16 × 64
  const auto want = values<std::int32_t>(c["C_out_int32_bits"]);
  c["op"] = "tdpbssd";  // A read as signed
  CHECK(run_case<Emulated>(c) != want);
  c["op"] = "tdpbusd";
  c["A_bytes"][5] = (c["A_bytes"][5].get<int>() + 1) % 256;
  CHECK(run_case<Emulated>(c) != want);
}

TEST_CASE(
    "tile unit on this CPU: with AMX the hardware reproduces the goldens and the emulator, without it a clear "
    "refusal") {
  std::string why;
  const bool granted = amx_permission(why);
  if (!cpu_has_amx_int8()) {
    CHECK_FALSE(granted);
    CHECK(why.find("does not report AMX") != std::string::npos);
    MESSAGE("this CPU has no AMX-INT8: the refusal is what was checked (" << why << ")");
    return;
  }
  REQUIRE_MESSAGE(granted, why);  // a container that refuses the tile state says so here
  const json g = goldens();
  for (const auto& c : g["cases"]) {
    if (c["op"] == "tdpbf16ps") continue;
    CAPTURE(c["op"].get<std::string>());
    CAPTURE(c["M"].get<int>());
    CHECK(run_case<Hardware>(c) == values<std::int32_t>(c["C_out_int32_bits"]));
  }
  // Random shapes and operands: hardware and emulator agree bit for bit.
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    json c;
    const int ops = static_cast<int>(rng() % 4);
    c["op"] = std::vector<std::string>{"tdpbusd", "tdpbssd", "tdpbsud", "tdpbuud"}[static_cast<std::size_t>(ops)];
    const int M = 1 + static_cast<int>(rng() % 16), kb = 4 * (1 + static_cast<int>(rng() % 16)),
              nb = 4 * (1 + static_cast<int>(rng() % 16));
    const int sa = kb + 4 * static_cast<int>(rng() % 4), sb = nb + 4 * static_cast<int>(rng() % 4),
              sc = nb + 4 * static_cast<int>(rng() % 4);
    c["M"] = M;
    c["A_colsb"] = kb;
    c["C_colsb"] = nb;
    c["A_stride"] = sa;
    c["B_stride"] = sb;
    c["C_stride"] = sc;
    std::vector<long long> A(static_cast<std::size_t>(M * sa)), B(static_cast<std::size_t>(kb / 4 * sb)),
        C(static_cast<std::size_t>(M * sc / 4));
    for (auto& x : A) x = rng() % 256;
    for (auto& x : B) x = rng() % 256;
    for (auto& x : C) x = static_cast<std::int32_t>(rng());
    c["A_bytes"] = A;
    c["B_bytes"] = B;
    c["C_in_int32_bits"] = C;
    CAPTURE(trial);
    CHECK(run_case<Hardware>(c) == run_case<Emulated>(c));
  }
}
