// grammar/schema.cpp — JSON Schema → grammar nodes (see grammar.hpp for what is generated).
#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "grammar/grammar.hpp"

namespace specactor::grammar {

using ojson = nlohmann::ordered_json;

namespace {

// Keywords that only describe (they constrain nothing, so nothing needs honouring).
const std::set<std::string, std::less<>> kAnnotations = {"title", "description", "default",    "examples", "$schema",
                                                         "$id",   "$comment",    "deprecated", "readOnly", "writeOnly",
                                                         "$defs", "definitions", "strict",     "name"};

// a + b + c... by appends (GCC 12's -Wrestrict misfires on chains of operator+ with temporaries).
template <class... T>
std::string cat(const T&... parts) {
  std::string out;
  (out.append(parts), ...);
  return out;
}

std::string escape_pointer(const std::string& key) {
  std::string out;
  for (const char c : key) {
    if (c == '~')
      out += "~0";
    else if (c == '/')
      out += "~1";
    else
      out += c;
  }
  return out;
}

}  // namespace

class Builder {
 public:
  Builder(const ojson& doc, const Limits& limits) : doc_(&doc), limits_(limits) { g_.limits_ = limits; }

  // A whole schema document of its own (a tool's parameters): its $refs resolve inside it; errors
  // are placed under `where`.
  std::int32_t schema_of(const ojson& doc, const std::string& where) {
    const ojson* outer = std::exchange(doc_, &doc);
    try {
      const std::int32_t n = schema(doc, "", 0);
      doc_ = outer;
      return n;
    } catch (const GrammarError& e) {
      const std::string what = e.what();
      throw GrammarError(where + e.where, what.substr(what.find(": ") + 2));
    }
  }

  std::int32_t any_object() {
    Node n;
    n.kind = Kind::Object;
    n.free_keys = true;
    n.free_value = any_value();
    n.key_string = plain_string();
    return add(std::move(n), "");
  }

  std::int32_t plain_string() {
    if (string_ < 0) {
      Node n;
      n.kind = Kind::String;
      string_ = add(std::move(n), "");
    }
    return string_;
  }

  std::shared_ptr<const Grammar> finish(std::int32_t root) {
    g_.root_ = root;
    return std::make_shared<const Grammar>(std::move(g_));
  }

  std::int32_t add(Node n, const std::string& where) {
    if (static_cast<std::int32_t>(g_.nodes_.size()) >= limits_.max_nodes)
      throw GrammarError(where, "the schema needs more than " + std::to_string(limits_.max_nodes) +
                                    " grammar nodes (too large to compile)");
    g_.nodes_.push_back(std::move(n));
    return static_cast<std::int32_t>(g_.nodes_.size() - 1);
  }

  std::int32_t literals(std::vector<std::string> lits, const std::string& where) {
    std::sort(lits.begin(), lits.end());
    lits.erase(std::unique(lits.begin(), lits.end()), lits.end());
    Node n;
    n.kind = Kind::Literals;
    n.literals = std::move(lits);
    return add(std::move(n), where);
  }

  // Any JSON value, at most max_value_depth deep (the matcher's stack bound holds the nesting).
  std::int32_t any_value() {
    if (any_ >= 0) return any_;
    any_ = add({}, "");  // AnyOf, filled below (the graph is recursive here, and only here)
    const std::int32_t s = plain_string();
    Node num;
    num.kind = Kind::Number;
    const std::int32_t n = add(num, "");
    const std::int32_t lit = literals({"true", "false", "null"}, "");
    Node obj;
    obj.kind = Kind::Object;
    obj.free_keys = true;
    obj.free_value = any_;
    obj.key_string = s;
    const std::int32_t o = add(obj, "");
    Node arr;
    arr.kind = Kind::Array;
    arr.items = any_;
    const std::int32_t a = add(arr, "");
    g_.nodes_[static_cast<std::size_t>(any_)].children = {o, a, s, n, lit};
    return any_;
  }

  std::int32_t schema(const ojson& s, const std::string& where, std::int32_t depth) {
    if (depth > limits_.max_schema_depth)
      throw GrammarError(where, "nested deeper than " + std::to_string(limits_.max_schema_depth) + " levels");
    if (s.is_boolean()) {
      if (!s.get<bool>()) throw GrammarError(where, "the schema false admits no value");
      return any_value();
    }
    if (!s.is_object()) throw GrammarError(where, "expected a schema (an object or a boolean)");
    for (const auto& [k, v] : s.items()) {
      static const std::set<std::string, std::less<>> known = {"type",
                                                               "enum",
                                                               "const",
                                                               "anyOf",
                                                               "oneOf",
                                                               "allOf",
                                                               "$ref",
                                                               "properties",
                                                               "required",
                                                               "additionalProperties",
                                                               "items",
                                                               "minItems",
                                                               "maxItems",
                                                               "minLength",
                                                               "maxLength",
                                                               "minimum",
                                                               "maximum",
                                                               "exclusiveMinimum",
                                                               "exclusiveMaximum",
                                                               "minProperties",
                                                               "maxProperties"};
      if (!known.count(k) && !kAnnotations.count(k))
        throw GrammarError(where, "the keyword \"" + k + "\" is not supported");
      (void)v;
    }
    if (s.contains("oneOf")) throw GrammarError(where + "/oneOf", "\"oneOf\" is not supported (use \"anyOf\")");
    if (const auto it = s.find("$ref"); it != s.end()) {
      if (s.size() > 1 + count_annotations(s))
        throw GrammarError(where, "\"$ref\" with other constraining keywords beside it is not supported");
      return ref(*it, where + "/$ref", depth);
    }
    if (const auto it = s.find("allOf"); it != s.end()) {
      if (!it->is_array() || it->size() != 1 || s.size() > 1 + count_annotations(s))
        throw GrammarError(where + "/allOf", "\"allOf\" is supported only with one schema and nothing beside it");
      return schema((*it)[0], where + "/allOf/0", depth + 1);
    }
    if (const auto it = s.find("anyOf"); it != s.end()) {
      if (!it->is_array() || it->empty()) throw GrammarError(where + "/anyOf", "expected a non-empty array of schemas");
      if (s.size() > 1 + count_annotations(s))
        throw GrammarError(where, "\"anyOf\" with other constraining keywords beside it is not supported");
      Node n;
      for (std::size_t i = 0; i < it->size(); ++i)
        n.children.push_back(schema((*it)[i], cat(where, "/anyOf/", std::to_string(i)), depth + 1));
      return add(std::move(n), where);
    }
    if (const auto it = s.find("const"); it != s.end()) return literals({it->dump()}, where);
    if (const auto it = s.find("enum"); it != s.end()) {
      if (!it->is_array() || it->empty()) throw GrammarError(where + "/enum", "expected a non-empty array");
      std::vector<std::string> lits;
      for (const auto& v : *it) lits.push_back(v.dump());
      return literals(std::move(lits), where + "/enum");
    }
    const auto t = s.find("type");
    if (t == s.end()) {
      if (s.contains("properties")) return typed(s, "object", where, depth);
      if (s.contains("items")) return typed(s, "array", where, depth);
      return any_value();
    }
    if (t->is_string()) return typed(s, t->get<std::string>(), where, depth);
    if (!t->is_array() || t->empty()) throw GrammarError(where + "/type", "expected a type name or an array of them");
    Node n;
    for (const auto& name : *t) {
      if (!name.is_string()) throw GrammarError(where + "/type", "expected type names");
      n.children.push_back(typed(s, name.get<std::string>(), where, depth));
    }
    return n.children.size() == 1 ? n.children[0] : add(std::move(n), where);
  }

 private:
  static std::size_t count_annotations(const ojson& s) {
    std::size_t n = 0;
    for (const auto& [k, v] : s.items()) n += kAnnotations.count(k);
    return n;
  }

  std::int32_t ref(const ojson& r, const std::string& where, std::int32_t depth) {
    if (!r.is_string()) throw GrammarError(where, "expected a string");
    const std::string target = r.get<std::string>();
    std::string container;
    for (const char* prefix : {"#/$defs/", "#/definitions/"})
      if (target.rfind(prefix, 0) == 0) container = prefix;
    if (container.empty())
      throw GrammarError(
          where, "only references into \"#/$defs/\" or \"#/definitions/\" are supported, not \"" + target + "\"");
    const std::string name = target.substr(container.size());
    if (expanding_.count(target))
      throw GrammarError(where,
                         "the reference \"" + target +
                             "\" is recursive (recursive schemas are not supported: their answers are unbounded)");
    const std::string key = container == "#/$defs/" ? "$defs" : "definitions";
    const auto defs = doc_->find(key);
    if (defs == doc_->end() || !defs->is_object() || !defs->contains(name))
      throw GrammarError(where, "\"" + target + "\" names no definition");
    expanding_.insert(target);
    const std::int32_t n = schema(defs->at(name), "/" + key + "/" + escape_pointer(name), depth + 1);
    expanding_.erase(target);
    return n;
  }

  static std::int64_t count_of(const ojson& s, const char* key, const std::string& where) {
    const auto it = s.find(key);
    if (it == s.end()) return -1;
    if (!it->is_number_integer() || it->get<std::int64_t>() < 0)
      throw GrammarError(where + "/" + key, "expected a non-negative integer");
    return it->get<std::int64_t>();
  }

  static void bound(const ojson& s, const char* key, bool& has, double& value, const std::string& where) {
    const auto it = s.find(key);
    if (it == s.end()) return;
    if (!it->is_number() || !std::isfinite(it->get<double>()))
      throw GrammarError(where + "/" + key, "expected a finite number");
    has = true;
    value = it->get<double>();
  }

  std::int32_t typed(const ojson& s, const std::string& type, const std::string& where, std::int32_t depth) {
    Node n;
    if (type == "string") {
      n.kind = Kind::String;
      n.min_len = std::max<std::int64_t>(0, count_of(s, "minLength", where));
      n.max_len = count_of(s, "maxLength", where);
      if (n.max_len >= 0 && n.max_len < n.min_len) throw GrammarError(where, "maxLength is below minLength");
      return add(std::move(n), where);
    }
    if (type == "integer" || type == "number") {
      n.kind = type == "integer" ? Kind::Integer : Kind::Number;
      bound(s, "minimum", n.has_min, n.min, where);
      bound(s, "maximum", n.has_max, n.max, where);
      double emin = 0, emax = 0;
      bool has_emin = false, has_emax = false;
      bound(s, "exclusiveMinimum", has_emin, emin, where);
      bound(s, "exclusiveMaximum", has_emax, emax, where);
      if (has_emin && (!n.has_min || emin >= n.min)) n.has_min = true, n.min = emin, n.min_exclusive = true;
      if (has_emax && (!n.has_max || emax <= n.max)) n.has_max = true, n.max = emax, n.max_exclusive = true;
      if (n.kind == Kind::Integer) {  // whole, inclusive bounds
        if (n.has_min) n.min = n.min_exclusive ? std::floor(n.min) + 1 : std::ceil(n.min), n.min_exclusive = false;
        if (n.has_max) n.max = n.max_exclusive ? std::ceil(n.max) - 1 : std::floor(n.max), n.max_exclusive = false;
        for (const double b : {n.min, n.max})
          if (std::fabs(b) > 9e17) throw GrammarError(where, "integer bounds beyond ±9e17 are not supported");
      }
      if (n.has_min && n.has_max && (n.max < n.min || (n.max == n.min && (n.min_exclusive || n.max_exclusive))))
        throw GrammarError(where, "the bounds admit no number");
      return add(std::move(n), where);
    }
    if (type == "boolean") return literals({"true", "false"}, where);
    if (type == "null") return literals({"null"}, where);
    if (type == "array") {
      n.kind = Kind::Array;
      const auto items = s.find("items");
      n.items = items == s.end() ? any_value() : schema(*items, where + "/items", depth + 1);
      n.min_items = std::max<std::int64_t>(0, count_of(s, "minItems", where));
      n.max_items = count_of(s, "maxItems", where);
      if (n.max_items >= 0 && n.max_items < n.min_items) throw GrammarError(where, "maxItems is below minItems");
      return add(std::move(n), where);
    }
    if (type == "object") return object(s, where, depth);
    throw GrammarError(where + "/type", "unknown type \"" + type + "\"");
  }

  std::int32_t object(const ojson& s, const std::string& where, std::int32_t depth) {
    Node n;
    n.kind = Kind::Object;
    std::set<std::string> required;
    if (const auto r = s.find("required"); r != s.end()) {
      if (!r->is_array()) throw GrammarError(where + "/required", "expected an array of property names");
      for (const auto& name : *r) {
        if (!name.is_string()) throw GrammarError(where + "/required", "expected property names");
        required.insert(name.get<std::string>());
      }
    }
    const auto props = s.find("properties");
    const auto extra = s.find("additionalProperties");
    if (extra != s.end() && !extra->is_boolean() && !extra->is_object())
      throw GrammarError(where + "/additionalProperties", "expected a boolean or a schema");
    if (props == s.end() || (props->is_object() && props->empty())) {
      if (!required.empty()) throw GrammarError(where + "/required", "names properties the schema does not declare");
      if (extra != s.end() && extra->is_boolean() && !extra->get<bool>()) return literals({"{}"}, where);
      n.free_keys = true;
      n.key_string = plain_string();
      n.min_items = std::max<std::int64_t>(0, count_of(s, "minProperties", where));  // keys, for free objects
      n.max_items = count_of(s, "maxProperties", where);
      if (n.max_items >= 0 && n.max_items < n.min_items)
        throw GrammarError(where, "maxProperties is below minProperties");
      n.free_value = extra != s.end() && extra->is_object() ? schema(*extra, where + "/additionalProperties", depth + 1)
                                                            : any_value();
      return add(std::move(n), where);
    }
    if (!props->is_object()) throw GrammarError(where + "/properties", "expected an object of schemas");
    for (const char* k : {"minProperties", "maxProperties"})
      if (s.contains(k))
        throw GrammarError(where, std::string("\"") + k + "\" is supported only on objects without \"properties\"");
    if (static_cast<std::int32_t>(props->size()) > limits_.max_properties)
      throw GrammarError(where + "/properties",
                         "more than " + std::to_string(limits_.max_properties) + " properties in one object");
    for (const auto& [name, sub] : props->items()) {
      Node::Property p;
      p.key = ojson(name).dump();
      p.required = required.erase(name) > 0;
      p.value = schema(sub, where + "/properties/" + escape_pointer(name), depth + 1);
      n.props.push_back(std::move(p));
    }
    if (!required.empty())
      throw GrammarError(where + "/required", "names \"" + *required.begin() + "\", which is not among the properties");
    return add(std::move(n), where);
  }

  const ojson* doc_;
  Limits limits_;
  Grammar g_;
  std::int32_t any_ = -1, string_ = -1;
  std::set<std::string> expanding_;
};

std::shared_ptr<const Grammar> Grammar::from_json_schema(std::string_view text, const Limits& limits) {
  if (text.size() > limits.max_schema_bytes)
    throw GrammarError("", "the schema is " + std::to_string(text.size()) + " bytes (at most " +
                               std::to_string(limits.max_schema_bytes) + ")");
  const ojson doc = ojson::parse(text, nullptr, false);
  if (doc.is_discarded()) throw GrammarError("", "not valid JSON");
  Builder b(doc, limits);
  return b.finish(b.schema(doc, "", 0));
}

std::shared_ptr<const Grammar> Grammar::any_json_object(const Limits& limits) {
  const ojson doc = ojson::object();
  Builder b(doc, limits);
  return b.finish(b.any_object());
}

std::shared_ptr<const Grammar> Grammar::tool_calls(const std::vector<Tool>& tools, bool required, bool parallel,
                                                   const Limits& limits) {
  if (tools.empty()) throw GrammarError("", "no tools to call");
  const ojson empty = ojson::object();
  Builder b(empty, limits);
  // One call: {"name": "NAME", "arguments": ARGS}, one alternative per tool.
  Node calls;
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < tools.size(); ++i) {
    const Tool& t = tools[i];
    const std::string where = cat("/", std::to_string(i), "/parameters");
    bytes += t.parameters.size();
    if (bytes > limits.max_schema_bytes)
      throw GrammarError(
          where, "the tools' parameter schemas exceed " + std::to_string(limits.max_schema_bytes) + " bytes together");
    std::int32_t args = -1;
    if (t.parameters.empty()) {
      args = b.any_object();
    } else {
      const ojson doc = ojson::parse(t.parameters, nullptr, false);
      if (doc.is_discarded()) throw GrammarError(where, "not valid JSON");
      args = b.schema_of(doc, where);  // its $refs resolve inside this tool's own schema
    }
    Node obj;
    obj.kind = Kind::Object;
    obj.props.push_back({"\"name\"", b.literals({ojson(t.name).dump()}, ""), true});
    obj.props.push_back({"\"arguments\"", args, true});
    calls.children.push_back(b.add(std::move(obj), ""));
  }
  const std::int32_t call = calls.children.size() == 1 ? calls.children[0] : b.add(std::move(calls), "");
  auto lit = [&](std::string_view s) { return b.literals({std::string(s)}, ""); };
  auto seq = [&](std::vector<std::int32_t> parts) {
    Node n;
    n.kind = Kind::Sequence;
    n.children = std::move(parts);
    return b.add(std::move(n), "");
  };
  const std::int32_t block = seq({lit(kCallOpen), call, lit(kCallClose)});  // <tool_call>\n CALL \n</tool_call>
  Node repeat;
  repeat.kind = Kind::Repeat;
  if (required) {  // one or more blocks, "\n" between them
    repeat.items = block;
    repeat.separator = lit("\n");
    repeat.min_items = 1;
    repeat.max_items = parallel ? -1 : 1;
    return b.finish(b.add(std::move(repeat), ""));
  }
  // auto: free text up to the first "<tool_call>\n", that call, then "\n" + more blocks (parallel) or the end.
  Node free;
  free.kind = Kind::Free;
  free.trigger = std::string(kCallOpen);
  repeat.items = seq({lit("\n"), block});
  repeat.max_items = parallel ? -1 : 0;
  const std::int32_t rest = b.add(std::move(repeat), "");
  return b.finish(seq({b.add(std::move(free), ""), call, lit(kCallClose), rest}));
}

}  // namespace specactor::grammar
