// config/snapshot.hpp — immutable config snapshots and their provenance.
//
// A Snapshot is a shared pointer to a const ServerArgs: it can be shared by any number of actors
// and never changes. The only way to "change" a setting is derive(), which returns a new snapshot
// whose override log is the parent's plus one entry naming the source and the fields it set.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "config/server_args.hpp"

namespace specactor::config {

using Snapshot = std::shared_ptr<const ServerArgs>;

// Validates `args` and freezes it. `args.override_log` is kept as given (the parser fills it).
Snapshot freeze(ServerArgs args);

// A child of `parent` with `fields` ({field_name: value}) applied and (source, fields) appended to
// its override log. The parent is untouched. Throws ConfigError on an unknown field, a wrongly typed
// value, or a result that fails validate(). An empty `fields` returns `parent` itself.
Snapshot derive(const Snapshot& parent, std::string_view source, const nlohmann::json& fields);

// 64-bit FNV-1a of a text (stable across builds and machines).
std::uint64_t fnv1a(std::string_view text);
// Stable 64-bit content hash of the settings (FNV-1a over the canonical JSON; the log is excluded).
std::uint64_t content_hash(const ServerArgs& args);
std::string hash_hex(std::uint64_t hash);

// {"hash": "...", "settings": {...}, "override_log": [{"source": ..., "fields": {...}}, ...]}
nlohmann::json to_json(const ServerArgs& args);
nlohmann::json override_log_json(const ServerArgs& args);

// Inverse of to_json(): rebuilds settings and override log, validates, freezes. Throws ConfigError
// when the settings are invalid or the hash does not match them.
Snapshot snapshot_from_json(const nlohmann::json& j);

}  // namespace specactor::config
