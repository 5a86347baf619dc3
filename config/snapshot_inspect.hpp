// config/snapshot_inspect.hpp — inspect() overloads that let a Snapshot travel in actor messages.
//
// Written against the Inspector concept only (no CAF header here: config/ stays CAF-free). Local
// sends copy the shared_ptr, so the receiver sees the very same immutable object; serializing
// inspectors (remote sends, deep_to_string) write the snapshot as JSON text (settings + override
// log) and deserializing ones rebuild an equal, frozen snapshot.
#pragma once

#include <string>
#include <type_traits>

#include "config/snapshot.hpp"

namespace specactor::config {

template <class Inspector>
std::enable_if_t<Inspector::reads_state, typename Inspector::result_type> inspect(Inspector& f, const Snapshot& x) {
  std::string text = x ? to_json(*x).dump() : std::string("null");
  return f(text);
}

template <class Inspector>
std::enable_if_t<Inspector::writes_state, typename Inspector::result_type> inspect(Inspector& f, Snapshot& x) {
  std::string text;
  auto result = f(text);
  x = text == "null" ? Snapshot{} : snapshot_from_json(nlohmann::json::parse(text));
  return result;
}

}  // namespace specactor::config
