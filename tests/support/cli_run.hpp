// tests/support/cli_run.hpp — runs the specactor launcher as a user does (tests that need
// SPECACTOR_BINARY): exit status, stdout, stderr. A run is bounded by `timeout`, so a hang fails
// the test (exit status 124) instead of stalling the suite.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace specactor::testing {

struct CliRun {
  int rc;
  std::string out, err;
};

// A shell word (single-quoted) for arguments with spaces or special bytes.
inline std::string shell_quote(const std::string& s);

// `cwd`: run there instead of the test's working directory (a user outside the checkout).
inline CliRun run_cli(const std::string& args, int timeout_s = 300, const std::string& cwd = "") {
  namespace fs = std::filesystem;
  const fs::path err_path = fs::temp_directory_path() / ("specactor_cli_err." + std::to_string(::getpid()));
  const std::string cmd = (cwd.empty() ? std::string() : "cd " + shell_quote(cwd) + " && ") + "timeout " +
                          std::to_string(timeout_s) + " " + std::string(SPECACTOR_BINARY) + " " + args + " 2>" +
                          err_path.string();
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) throw std::runtime_error("popen failed");
  std::string out;
  std::array<char, 4096> buf;
  std::size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = ::pclose(p);
  std::ifstream e(err_path);
  std::stringstream ss;
  ss << e.rdbuf();
  fs::remove(err_path);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out, ss.str()};
}

// A shell word (single-quoted) for arguments with spaces or special bytes.
inline std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

}  // namespace specactor::testing
