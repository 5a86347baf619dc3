// config/error.hpp — the error raised for bad settings: one message naming the flag/file/field.
#pragma once

#include <stdexcept>
#include <string>

namespace specactor::config {

class ConfigError : public std::runtime_error {
 public:
  explicit ConfigError(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace specactor::config
