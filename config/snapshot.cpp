// config/snapshot.cpp — freeze, derive, hash, JSON.
#include "config/snapshot.hpp"

#include <cstdio>

#include "config/error.hpp"

namespace specactor::config {

Snapshot freeze(ServerArgs args) {
  validate(args);
  return std::make_shared<const ServerArgs>(std::move(args));
}

Snapshot derive(const Snapshot& parent, std::string_view source, const nlohmann::json& fields) {
  if (!parent) throw ConfigError("derive(" + std::string(source) + "): no parent snapshot");
  if (source.empty()) throw ConfigError("derive: every derivation needs a named source");
  if (!fields.is_object())
    throw ConfigError("derive(" + std::string(source) + "): fields must be a JSON object, got " + fields.dump());
  if (fields.empty()) return parent;
  ServerArgs child = *parent;  // copy; the parent stays as it is
  const std::string where = "derive(" + std::string(source) + ")";
  for (const auto& [field, value] : fields.items()) set_field(child, field, value, where + " " + flag_name(field));
  child.override_log.push_back({std::string(source), fields});
  validate(child);
  return std::make_shared<const ServerArgs>(std::move(child));
}

std::uint64_t fnv1a(std::string_view text) {
  std::uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

std::uint64_t content_hash(const ServerArgs& args) {
  // nlohmann::json objects keep keys sorted, so dump() is canonical for a given set of values.
  return fnv1a(settings_to_json(args).dump());
}

std::string hash_hex(std::uint64_t hash) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(hash));
  return buf;
}

nlohmann::json override_log_json(const ServerArgs& args) {
  nlohmann::json log = nlohmann::json::array();
  for (const auto& e : args.override_log) log.push_back({{"source", e.source}, {"fields", e.fields}});
  return log;
}

nlohmann::json to_json(const ServerArgs& args) {
  return {{"hash", hash_hex(content_hash(args))},
          {"settings", settings_to_json(args)},
          {"override_log", override_log_json(args)}};
}

Snapshot snapshot_from_json(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("settings") || !j["settings"].is_object())
    throw ConfigError("snapshot JSON: expected an object with 'settings'");
  ServerArgs args;
  for (const auto& [field, value] : j["settings"].items()) set_field(args, field, value, "snapshot JSON");
  if (j.contains("override_log"))
    for (const auto& e : j["override_log"])
      args.override_log.push_back({e.at("source").get<std::string>(), e.at("fields")});
  if (j.contains("hash") && j["hash"] != hash_hex(content_hash(args)))
    throw ConfigError("snapshot JSON: hash " + j["hash"].dump() + " does not match its settings");
  return freeze(std::move(args));
}

}  // namespace specactor::config
