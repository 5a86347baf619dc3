#include "config/input.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "config/error.hpp"

namespace specactor::config {

int open_regular_file(const std::string& path, const std::string& what, std::size_t& size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw ConfigError(what + ": cannot open the file: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw ConfigError(what + ": not a regular file");
  }
  size = static_cast<std::size_t>(st.st_size);
  return fd;
}

std::string read_text_file(const std::string& path, const std::string& what, std::size_t max_bytes) {
  std::size_t size = 0;
  const int fd = open_regular_file(path, what, size);
  if (size > max_bytes) {
    ::close(fd);
    throw ConfigError(what + ": " + std::to_string(size) + " bytes, more than the limit of " +
                      std::to_string(max_bytes));
  }
  std::string out(size, '\0');
  std::size_t got = 0;
  while (got < size) {
    const ssize_t n = ::read(fd, out.data() + got, size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  ::close(fd);
  out.resize(got);
  return out;
}

namespace {

template <class Json>
Json parse_bounded(std::string_view text, const std::string& what) {
  const auto limit = [&](int depth, typename Json::parse_event_t, Json&) {
    if (depth > kMaxJsonDepth)
      throw ConfigError(what + ": nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), limit);
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for a number like 1e505
    throw ConfigError(what + ": not valid JSON: " + e.what());
  }
}

}  // namespace

nlohmann::json parse_json(std::string_view text, const std::string& what) {
  return parse_bounded<nlohmann::json>(text, what);
}

nlohmann::ordered_json parse_ordered_json(std::string_view text, const std::string& what) {
  return parse_bounded<nlohmann::ordered_json>(text, what);
}

std::string printable(std::string_view s, std::size_t max_chars) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (out.size() >= max_chars) {
      out += "…";
      break;
    }
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7F && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    }
  }
  return out;
}

std::size_t first_invalid_utf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t n;
    unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF)
      n = 2;
    else if (c >= 0xE0 && c <= 0xEF)
      n = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4)
      n = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else
      return i;
    if (i + n > s.size()) return i;
    for (std::size_t k = 1; k < n; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if (k == 1 ? (b < lo || b > hi) : (b & 0xC0) != 0x80) return i;
    }
    i += n;
  }
  return std::string_view::npos;
}

void check_utf8(std::string_view text) {
  const std::size_t bad = first_invalid_utf8(text);
  if (bad != std::string_view::npos) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02X", static_cast<unsigned>(static_cast<unsigned char>(text[bad])));
    throw config::ConfigError("text is not valid UTF-8: byte " + std::to_string(bad) + " (" + hex +
                              ") does not start a well-formed character");
  }
}

std::vector<std::pair<std::string, std::uint16_t>> parse_addresses(const std::string& list, const std::string& flag) {
  std::vector<std::pair<std::string, std::uint16_t>> out;
  std::size_t at = 0;
  while (at <= list.size()) {
    const std::size_t end = std::min(list.find(',', at), list.size());
    const std::string item = list.substr(at, end - at);
    at = end + 1;
    auto bad = [&](const std::string& why) {
      return ConfigError(flag + ": '" + printable(item, 80) + "': " + why +
                         " (expected HOST:PORT[,HOST:PORT...], e.g. 127.0.0.1:31000)");
    };
    if (item.empty()) throw bad("an empty address");
    const std::size_t colon = item.rfind(':');
    if (colon == std::string::npos || colon == 0) throw bad("no port");
    std::string host = item.substr(0, colon);
    if (host.front() == '[') {
      if (host.back() != ']' || host.size() < 3) throw bad("an IPv6 address needs its closing ']'");
      host = host.substr(1, host.size() - 2);
    }
    const std::string port = item.substr(colon + 1);
    if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos)
      throw bad("the port is not a number");
    const long p = std::stol(port);
    if (p < 1 || p > 65535) throw bad("the port is outside 1..65535");
    for (const auto& w : out)
      if (w.first == host && w.second == p) throw bad("listed twice");
    out.emplace_back(host, static_cast<std::uint16_t>(p));
    if (end == list.size()) break;
  }
  if (out.empty()) throw ConfigError(flag + ": no address given");
  return out;
}

}  // namespace specactor::config
