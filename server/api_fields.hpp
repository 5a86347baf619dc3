// server/api_fields.hpp — typed reads of a request body's optional fields, shared by the API's parsers
// (api.cpp, structured.cpp): a present field of the wrong type is a 400 naming it.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

#include "server/api.hpp"

namespace specactor::server::fields {

// Typed reads of optional fields; a present field of the wrong type is a 400 naming it.
inline const json* field(const json& o, const char* key) {
  auto it = o.find(key);
  return it == o.end() || it->is_null() ? nullptr : &*it;
}

inline std::string where(const std::string& prefix, const char* key) {
  return prefix.empty() ? key : prefix + "." + key;
}

inline bool get_bool(const json& o, const char* key, bool dflt, const std::string& prefix = {}) {
  const json* v = field(o, key);
  if (!v) return dflt;
  if (!v->is_boolean()) throw ApiError(400, where(prefix, key) + ": expected true or false", where(prefix, key));
  return v->get<bool>();
}

inline std::optional<double> get_number(const json& o, const char* key, const std::string& prefix = {}) {
  const json* v = field(o, key);
  if (!v) return std::nullopt;
  if (!v->is_number() || !std::isfinite(v->get<double>()))
    throw ApiError(400, where(prefix, key) + ": expected a finite number", where(prefix, key));
  return v->get<double>();
}

inline std::optional<std::int64_t> get_int(const json& o, const char* key, const std::string& prefix = {}) {
  const json* v = field(o, key);
  if (!v) return std::nullopt;
  if (v->is_number_unsigned() && v->get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))
    throw ApiError(400, where(prefix, key) + ": out of range", where(prefix, key));
  if (!v->is_number_integer()) throw ApiError(400, where(prefix, key) + ": expected an integer", where(prefix, key));
  return v->get<std::int64_t>();
}

inline std::optional<std::string> get_string(const json& o, const char* key, const std::string& prefix = {}) {
  const json* v = field(o, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) throw ApiError(400, where(prefix, key) + ": expected a string", where(prefix, key));
  return v->get<std::string>();
}

}  // namespace specactor::server::fields
