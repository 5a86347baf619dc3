// grammar/grammar.hpp — constrained decoding's grammar: a small graph of nodes (JSON values as a
// JSON Schema describes them, byte literals, sequences, free text up to a trigger) compiled from a
// schema, from "any JSON object", or from a set of tool declarations. The matcher (matcher.hpp)
// reads output bytes against it; the token masks (mask.hpp) say which tokens may come next. No CAF,
// nothing of the engine: sched/ owns one matcher per constrained request.
//
// What a compiled JSON Schema generates (docs/structured-output.md has the table): compact JSON
// with at most one space after ':' and ','; object properties in the schema's order (required ones
// always, optional ones may be skipped; only declared properties, so every answer validates whatever
// additionalProperties says); integers without a fraction; numbers without an exponent when bounded.
// Unsupported keywords are refused by name, never ignored.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "config/error.hpp"

namespace specactor::grammar {

// A schema (or tool list) that cannot be compiled: `where` is the JSON pointer inside it ("" for the
// root), what() is "WHERE: why" (the server prefixes the request field).
class GrammarError : public config::ConfigError {
 public:
  GrammarError(std::string where_, const std::string& why)
      : config::ConfigError((where_.empty() ? std::string("(root)") : where_) + ": " + why), where(std::move(where_)) {}
  std::string where;
};

// Bounds a hostile schema meets (each refused with a GrammarError naming it).
struct Limits {
  std::size_t max_schema_bytes = 256 * 1024;  // the schema's JSON text
  std::int32_t max_nodes = 4096;              // compiled nodes
  std::int32_t max_schema_depth = 32;         // nesting of subschemas (and of $ref expansion)
  std::int32_t max_properties = 64;           // per object
  std::int32_t max_value_depth = 24;          // nesting of generated values (frames on the matcher's stack)
  std::int32_t max_alternatives = 16;         // live alternatives (anyOf) the matcher follows at once
};

enum class Kind : std::uint8_t { AnyOf, Object, Array, String, Integer, Number, Literals, Sequence, Free, Repeat };

struct Node {
  Kind kind = Kind::AnyOf;
  std::vector<std::int32_t> children;  // AnyOf: alternatives; Sequence: parts in order
  // Object: declared properties in order (key = the JSON-quoted name), or any keys (free_keys) whose
  // values are free_value.
  struct Property {
    std::string key;
    std::int32_t value = -1;
    bool required = false;
  };
  std::vector<Property> props;
  bool free_keys = false;
  std::int32_t free_value = -1, key_string = -1;  // free_keys: the values' node and the keys' (a plain string)
  // Array (JSON's brackets) and Repeat (bare repetition, `separator` between items when >= 0): items,
  // how many.
  std::int32_t items = -1, separator = -1;
  std::int64_t min_items = 0, max_items = -1;  // -1: unbounded (also a free-keys object's key count)
  // String: length in code points (an escape counts as one).
  std::int64_t min_len = 0, max_len = -1;
  // Integer / Number bounds (an integer's are whole numbers, inclusive).
  bool has_min = false, has_max = false, min_exclusive = false, max_exclusive = false;
  double min = 0, max = 0;
  // Literals: byte strings, sorted and unique (enum/const values serialized, true/false/null, fixed text).
  std::vector<std::string> literals;
  // Free: any bytes up to and including the first occurrence of trigger.
  std::string trigger;
};

class Grammar {
 public:
  const Node& node(std::int32_t i) const { return nodes_[static_cast<std::size_t>(i)]; }
  std::int32_t root() const { return root_; }
  std::size_t size() const { return nodes_.size(); }
  const Limits& limits() const { return limits_; }

  // A JSON Schema (its JSON text). Throws GrammarError naming the keyword and its place.
  static std::shared_ptr<const Grammar> from_json_schema(std::string_view schema_text, const Limits& limits = {});
  // Any JSON object (response_format json_object).
  static std::shared_ptr<const Grammar> any_json_object(const Limits& limits = {});

  // Tool calls: each call is written as  <tool_call>\n{"name": NAME, "arguments": ARGS}\n</tool_call>
  // with ARGS valid for that function's parameters schema. `required`: the answer is one or more calls
  // (one when !parallel) and nothing else; otherwise (tool_choice auto) free text, and once the text
  // writes "<tool_call>\n" the call that follows is held to the schemas (then more calls, or the end).
  struct Tool {
    std::string name;
    std::string parameters;  // JSON Schema text ("" = any object)
  };
  static std::shared_ptr<const Grammar> tool_calls(const std::vector<Tool>& tools, bool required, bool parallel,
                                                   const Limits& limits = {});
  static constexpr std::string_view kCallOpen = "<tool_call>\n", kCallClose = "\n</tool_call>";

 private:
  friend class Builder;
  std::vector<Node> nodes_;
  std::int32_t root_ = -1;
  Limits limits_;
};

}  // namespace specactor::grammar
