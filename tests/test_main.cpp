// tests/test_main.cpp — doctest's main, compiled once and linked into every suite.
//
// The suites write scratch files (tiny models, heads, prompt files) under
// std::filesystem::temp_directory_path(). CTest runs every test case as its own process, so main
// points TMPDIR at a folder of this process's own and removes it at the end: a test run leaves
// nothing behind in /tmp (a crashed case leaves its one folder, named with its pid). XDG_CACHE_HOME
// points there too: an engine's budget memory (--speculative-budget-cache) starts empty in every
// case and never lands in the user's cache; so does XDG_CONFIG_HOME (a worker's cluster secret).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path scratch = fs::temp_directory_path(ec) / ("specactor-test." + std::to_string(::getpid()));
  const bool own = !ec && fs::create_directories(scratch, ec) && !ec;
  if (own) {
    ::setenv("TMPDIR", scratch.c_str(), 1);
    ::setenv("XDG_CACHE_HOME", (scratch / "cache").c_str(), 1);
    ::setenv("XDG_CONFIG_HOME", (scratch / "config").c_str(), 1);  // a worker's cluster secret, likewise
  }
  doctest::Context context(argc, argv);
  const int rc = context.run();
  if (own) fs::remove_all(scratch, ec);
  return rc;
}
