// tests/test_main.cpp — doctest's main, compiled once and linked into every suite.
//
// The suites write scratch files (tiny models, heads, prompt files) under
// std::filesystem::temp_directory_path(). CTest runs every test case as its own process, so main
// points TMPDIR at a folder of this process's own and removes it at the end: a test run leaves
// nothing behind in /tmp (a crashed case leaves its one folder, named with its pid). XDG_CACHE_HOME
// points there too: an engine's budget memory (--speculative-budget-cache) starts empty in every
// case and never lands in the user's cache; so does XDG_CONFIG_HOME (a worker's cluster secret).
//
// A case that cannot run here calls SKIP_CASE (support/skip.hpp); a process whose every case was
// skipped, with no failure, exits with kSkipExit, which CTest reports as skipped.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <system_error>

#include "tests/support/skip.hpp"

namespace {

int g_cases = 0;    // test cases started in this process
int g_skipped = 0;  // of them, those that called mark_skipped

// Counts the test cases doctest starts (a case re-entered for its subcases counts once).
struct CaseCounter : doctest::IReporter {
  explicit CaseCounter(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData&) override { ++g_cases; }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};
REGISTER_LISTENER("specactor-case-counter", 1, CaseCounter);

}  // namespace

void specactor::testing::mark_skipped(const std::string& why, const std::string& detail) {
  ++g_skipped;
  std::cout << "SKIPPED [" << why << "]: " << detail << std::endl;
}

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
  if (rc == 0 && g_cases > 0 && g_skipped >= g_cases && !context.shouldExit()) return specactor::testing::kSkipExit;
  return rc;
}
