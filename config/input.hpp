// config/input.hpp — untrusted bytes checked at the edge: files that must be regular files before
// they are opened (a FIFO would block the open), sizes with a named limit, JSON with a bounded depth.
// Every failure is one config::ConfigError naming the input (`what`) and what was expected.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace specactor::config {

// JSON documents given by users (settings files, model configs, overrides, token maps, safetensors
// headers) nest at most this deep; nothing specactor reads needs more than 3 levels.
constexpr int kMaxJsonDepth = 64;
// Text files read whole (settings, config.json, token maps, prompt sets, n-gram corpora).
constexpr std::size_t kMaxTextFileBytes = std::size_t{256} << 20;

// Opens `path` without blocking (O_NONBLOCK, so a FIFO returns at once), requires a regular file and
// returns the descriptor (the caller closes it) and, through `size`, its size. Errors name `what`.
int open_regular_file(const std::string& path, const std::string& what, std::size_t& size);

// The whole file as text, at most `max_bytes`.
std::string read_text_file(const std::string& path, const std::string& what, std::size_t max_bytes = kMaxTextFileBytes);

// Parses `text` as JSON nested at most kMaxJsonDepth levels; errors say "<what>: not valid JSON: …"
// or "<what>: nested deeper than 64 levels".
nlohmann::json parse_json(std::string_view text, const std::string& what);
// The same with object keys in their order (a request body: a JSON Schema's properties keep theirs).
nlohmann::ordered_json parse_ordered_json(std::string_view text, const std::string& what);

// The offset of the first byte that does not start a well-formed UTF-8 character, npos when none.
std::size_t first_invalid_utf8(std::string_view s);
// Throws ConfigError "text is not valid UTF-8: byte N (0xXX) does not start a well-formed character".
void check_utf8(std::string_view text);

// A value as one line for messages: non-printable bytes escaped, at most `max_chars` characters.
std::string printable(std::string_view s, std::size_t max_chars = 80);

// "HOST:PORT,HOST:PORT" (IPv6 as [ADDR]:PORT), each port in 1..65535, none twice. Throws
// ConfigError naming `flag` and the item.
std::vector<std::pair<std::string, std::uint16_t>> parse_addresses(const std::string& list, const std::string& flag);

}  // namespace specactor::config
