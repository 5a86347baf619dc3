// fuzz/fuzz_common.hpp — helpers shared by the libFuzzer targets (built with -DSPECACTOR_FUZZ=ON and
// clang; see fuzz/CMakeLists.txt). A target's contract: any input ends in a return or in one of the
// project's documented error types (config::ConfigError, model::GgufError, model::KvExhausted) —
// anything else (a crash, a sanitizer report, another exception type) is a finding.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "config/error.hpp"
#include "model/gguf.hpp"
#include "model/kv_cache.hpp"

namespace specactor::fuzz {

// A scratch folder per process in /dev/shm when it exists (no disk writes per input).
inline const std::filesystem::path& scratch() {
  static const std::filesystem::path dir = [] {
    const std::filesystem::path base =
        std::filesystem::exists("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path();
    const auto d = base / ("specactor_fuzz." + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

inline std::string write_scratch(const std::string& name, std::string_view bytes) {
  const auto p = scratch() / name;
  std::ofstream(p, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return p.string();
}

// Runs f; the project's documented errors are expected outcomes, any other exception aborts (a
// finding: an error path that is not one of ours, e.g. a std::out_of_range from a library).
template <class F>
void expect_clean(F&& f) {
  try {
    f();
  } catch (const config::ConfigError&) {
  } catch (const model::GgufError&) {
  } catch (const model::KvExhausted&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz: unexpected exception: %s\n", e.what());
    std::abort();
  }
}

// Splits the input at the first occurrence of `sep` (the rest is empty when absent).
inline std::pair<std::string_view, std::string_view> split2(std::string_view s, std::string_view sep) {
  const auto at = s.find(sep);
  if (at == std::string_view::npos) return {s, {}};
  return {s.substr(0, at), s.substr(at + sep.size())};
}

}  // namespace specactor::fuzz
