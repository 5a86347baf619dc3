// sched/memory.cpp — the budget's learned state as text, and the file it is kept in.
#include "sched/memory.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>
#include <vector>

#include "config/error.hpp"
#include "config/input.hpp"
#include "config/snapshot.hpp"

namespace specactor::sched {

namespace {

// A (hits, seen) pair as read: seen ≥ 0, 0 ≤ hits ≤ seen, both finite; scaled down to kCap.
bool read_counts(std::istringstream& in, double& hits, double& seen) {
  if (!(in >> hits >> seen) || !std::isfinite(hits) || !std::isfinite(seen) || seen < 0 || hits < 0 || hits > seen)
    return false;
  if (seen > MemoryCodec::kCap) {
    hits *= MemoryCodec::kCap / seen;
    seen = MemoryCodec::kCap;
  }
  return true;
}

bool read_index(std::istringstream& in, int lo, int hi, int& v) {
  return static_cast<bool>(in >> v) && v >= lo && v <= hi;
}

bool at_end(std::istringstream& in) {
  std::string rest;
  return !(in >> rest);
}

}  // namespace

std::string MemoryCodec::save(const std::string& key, const AcceptanceModel& accept, const CostModel& cost,
                              const Feedback& feedback) {
  std::string out = fmt::format("{}\nkey {}\n", kHeader, key);
  for (std::size_t b = 0; b < accept.table_.size(); ++b)
    for (std::size_t d = 1; d < accept.table_[b].size(); ++d)
      if (const auto& c = accept.table_[b][d]; c.seen > 0)
        out += fmt::format("accept {} {} {} {}\n", b, d, c.hits, c.seen);
  for (std::size_t d = 1; d < accept.levels_.size(); ++d)
    if (const auto& c = accept.levels_[d]; c.seen > 0) out += fmt::format("level {} {} {}\n", d, c.hits, c.seen);
  for (std::size_t d = 1; d < accept.after_whole_.size(); ++d)
    if (const auto& c = accept.after_whole_[d]; c.seen > 0) out += fmt::format("whole {} {} {}\n", d, c.hits, c.seen);
  for (std::size_t i = 0; i < accept.rounds_.size(); ++i)
    if (const auto& c = accept.rounds_[i]; c.seen > 0) out += fmt::format("rounds {} {} {}\n", i, c.hits, c.seen);
  const std::int64_t rounds = cost.draft_rounds();
  const auto ring = static_cast<std::int64_t>(cost.draft_obs_.size());
  for (std::int64_t i = std::max<std::int64_t>(0, rounds - ring); i < rounds; ++i) {
    const auto& [levels, ms] = cost.draft_obs_[static_cast<std::size_t>(i % ring)];
    out += fmt::format("draft {} {}\n", levels, ms);
  }
  for (std::size_t b = 0; b < feedback.b_.size(); ++b) {
    const auto& k = feedback.b_[b];
    if (k.plain.n == 0 && k.spec.n == 0 && k.scale == 1) continue;
    out += fmt::format("feedback {} {} {} {} {} {} {} {}\n", b, k.scale, k.plain.tokens, k.plain.ms, k.plain.n,
                       k.spec.tokens, k.spec.ms, k.spec.n);
  }
  return out;
}

std::string MemoryCodec::restore(std::string_view text, const std::string& key, AcceptanceModel& accept,
                                 CostModel& cost, Feedback& feedback) {
  AcceptanceModel a;
  Feedback f;
  std::vector<std::pair<double, double>> drafts;
  std::istringstream lines{std::string(text)};
  std::string line;
  int n = 0;
  bool keyed = false;
  while (std::getline(lines, line)) {
    ++n;
    if (n == 1) {
      if (line != kHeader) return fmt::format("line 1: expected '{}'", kHeader);
      continue;
    }
    if (line.empty()) continue;
    std::istringstream in(line);
    std::string kind;
    in >> kind;
    const auto bad = [&](std::string_view what) {
      return fmt::format("line {}: {} ('{}')", n, what, line.substr(0, 80));
    };
    if (kind == "key") {
      if (keyed) return bad("a second key");
      if (line.size() < 4 || line.substr(4) != key) return "key";
      keyed = true;
      continue;
    }
    if (!keyed) return bad("a record before the key");
    int i = 0, d = 0;
    if (kind == "accept") {
      if (!read_index(in, 0, AcceptanceModel::kScoreBins, i) || !read_index(in, 1, AcceptanceModel::kMaxDepth, d))
        return bad("expected a score bin 0-12 and a depth 1-32");
      auto& c = a.table_[static_cast<std::size_t>(i)][static_cast<std::size_t>(d)];
      if (!read_counts(in, c.hits, c.seen) || !at_end(in)) return bad("expected hits ≤ seen, both ≥ 0");
    } else if (kind == "level" || kind == "whole") {
      if (!read_index(in, 1, AcceptanceModel::kMaxDepth, d)) return bad("expected a depth 1-32");
      auto& c = (kind == "level" ? a.levels_ : a.after_whole_)[static_cast<std::size_t>(d)];
      if (!read_counts(in, c.hits, c.seen) || !at_end(in)) return bad("expected hits ≤ seen, both ≥ 0");
    } else if (kind == "rounds") {
      if (!read_index(in, 0, static_cast<int>(a.rounds_.size()) - 1, i)) return bad("expected a round bin 0-7");
      if (!read_counts(in, a.rounds_[static_cast<std::size_t>(i)].hits, a.rounds_[static_cast<std::size_t>(i)].seen) ||
          !at_end(in))
        return bad("expected hits ≤ seen, both ≥ 0");
    } else if (kind == "draft") {
      double levels = 0, ms = 0;
      if (!(in >> levels >> ms) || !(levels >= 1) || !(ms >= 0) || !std::isfinite(ms) || !at_end(in))
        return bad("expected levels ≥ 1 and milliseconds ≥ 0");
      drafts.emplace_back(levels, ms);
    } else if (kind == "feedback") {
      if (!read_index(in, 0, static_cast<int>(f.b_.size()) - 1, i)) return bad("expected a batch bucket 0-5");
      auto& k = f.b_[static_cast<std::size_t>(i)];
      if (!(in >> k.scale >> k.plain.tokens >> k.plain.ms >> k.plain.n >> k.spec.tokens >> k.spec.ms >> k.spec.n) ||
          !at_end(in) || !(k.scale >= 1 && k.scale <= 4) || !(k.plain.tokens >= 0) || !(k.plain.ms >= 0) ||
          !(k.spec.tokens >= 0) || !(k.spec.ms >= 0) || k.plain.n < 0 || k.spec.n < 0 ||
          !std::isfinite(k.plain.tokens + k.plain.ms + k.spec.tokens + k.spec.ms))
        return bad("expected a scale 1-4, then tokens, ms and steps ≥ 0 for plain and drafted steps");
      // The step counts only gate the comparison (enough steps seen); kept small so the file stays so.
      k.plain.n = std::min<std::int64_t>(k.plain.n, 1000);
      k.spec.n = std::min<std::int64_t>(k.spec.n, 1000);
    } else {
      return bad("unknown record");
    }
  }
  if (n == 0) return "line 1: the file is empty";
  if (!keyed) return "no key line";
  // Calibration (cal_*) stays this run's own: it is reported per run.
  a.cal_pred_ = accept.cal_pred_;
  a.cal_obs_ = accept.cal_obs_;
  a.cal_n_ = accept.cal_n_;
  accept = a;
  feedback = f;
  for (const auto& [levels, ms] : drafts) cost.observe_draft(static_cast<std::int64_t>(levels), ms);
  return {};
}

std::string memory_file(const std::string& folder, const std::string& key) {
  return (std::filesystem::path(folder) / ("budget-" + config::hash_hex(config::fnv1a(key)) + ".txt")).string();
}

std::string default_memory_folder() {
  // The XDG base-directory rules ignore a relative $XDG_CACHE_HOME.
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg && *xdg && std::filesystem::path(xdg).is_absolute())
    return (std::filesystem::path(xdg) / "specactor" / "budget").string();
  const char* home = std::getenv("HOME");
  if (home && *home) return (std::filesystem::path(home) / ".cache" / "specactor" / "budget").string();
  return {};
}

std::string read_memory_file(const std::string& path, std::string& text) {
  text.clear();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return {};
  // Checked before a byte is read: the file is ours only if it is a small regular file (a FIFO
  // would block, a huge file would be read whole).
  std::size_t size = 0;
  int fd = -1;
  try {
    fd = config::open_regular_file(path, path, size);
  } catch (const config::ConfigError&) {
    return std::filesystem::is_regular_file(path, ec) ? "cannot open it for reading" : "not a regular file";
  }
  if (size > kMaxMemoryFileBytes) {
    ::close(fd);
    return std::to_string(size) + " bytes, larger than " + std::to_string(kMaxMemoryFileBytes >> 20) +
           " MiB: not a file specactor wrote";
  }
  text.assign(size, '\0');
  std::size_t got = 0;
  while (got < size) {
    const ssize_t n = ::read(fd, text.data() + got, size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      text.clear();
      return "cannot read it";
    }
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  ::close(fd);
  text.resize(got);
  return {};
}

std::string write_memory_file(const std::string& path, const std::string& text) {
  std::error_code ec;
  const std::filesystem::path p(path);
  if (std::filesystem::exists(p, ec) && !std::filesystem::is_regular_file(p, ec))
    return path + (std::filesystem::is_directory(p, ec) ? ": a directory is in the way" : ": not a regular file") +
           ", not a budget-memory file";
  if (p.has_parent_path()) {
    std::filesystem::create_directories(p.parent_path(), ec);
    if (ec) return "cannot create " + p.parent_path().string() + ": " + ec.message();
  }
  static std::atomic<int> serial{0};  // engines of one process write one at a time each
  const std::string tmp = path + fmt::format(".tmp{}-{}", static_cast<long>(::getpid()), serial++);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return "cannot write " + tmp;
    out << text;
    out.flush();
    if (!out) {
      std::filesystem::remove(tmp, ec);
      return "cannot write " + tmp;
    }
  }
  std::filesystem::rename(tmp, p, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return "cannot rename the new file onto " + path + ": " + (ec.value() ? ec.message() : "refused");
  }
  return {};
}

}  // namespace specactor::sched
