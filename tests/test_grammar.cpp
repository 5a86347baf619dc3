// tests/test_grammar.cpp — constrained decoding's grammar (grammar/): JSON Schema compilation and its
// refusals, the byte matcher (what it accepts and rejects; random walks that never dead-end and always
// end in a value the schema admits), and token masks against a brute-force check.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <random>

#include "grammar/mask.hpp"

using namespace specactor::grammar;
using ojson = nlohmann::ordered_json;

namespace {

bool accepts(const std::shared_ptr<const Grammar>& g, std::string_view text) {
  Matcher m(g);
  return m.feed(text) && m.accepting();
}

std::string refusal(std::string_view schema) {
  try {
    Grammar::from_json_schema(schema);
  } catch (const GrammarError& e) {
    return e.what();
  }
  return "";
}

// A random output of the grammar: at each step a random byte among those allowed (ending, when
// allowed, with probability `stop`). Fails the test on a state with nothing allowed.
std::string walk(const std::shared_ptr<const Grammar>& g, std::mt19937& rng, double stop = 0.15,
                 std::size_t max_bytes = 4000) {
  Matcher m(g), nx(g);
  std::string out;
  std::vector<int> ok;
  while (out.size() < max_bytes) {
    ok.clear();
    for (int b = 0; b < 256; ++b)
      if (m.next(static_cast<std::uint8_t>(b), nx)) ok.push_back(b);
    const bool can_end = m.accepting();
    REQUIRE_MESSAGE((can_end || !ok.empty()), "dead end after: " << out);
    // Prefer closing characters now and then so walks end.
    if (can_end && (ok.empty() || std::uniform_real_distribution<>(0, 1)(rng) < stop)) return out;
    int b = ok[std::uniform_int_distribution<std::size_t>(0, ok.size() - 1)(rng)];
    for (const int pref : {'"', '}', ']'})
      if (std::uniform_real_distribution<>(0, 1)(rng) < 0.3 && std::find(ok.begin(), ok.end(), pref) != ok.end())
        b = pref;
    REQUIRE(m.next(static_cast<std::uint8_t>(b), nx));
    std::swap(m, nx);
    out.push_back(static_cast<char>(b));
  }
  FAIL("the walk did not end: " << out.substr(0, 200));
  return out;
}

}  // namespace

TEST_CASE("grammar: a schema's objects, strings, numbers, enums and arrays") {
  const auto g = Grammar::from_json_schema(R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "minLength": 1, "maxLength": 8},
      "age": {"type": "integer", "minimum": 0, "maximum": 130},
      "tags": {"type": "array", "items": {"enum": ["a", "bc", 3]}, "maxItems": 2},
      "ok": {"type": "boolean"},
      "score": {"type": ["number", "null"]}
    },
    "required": ["name", "age"],
    "additionalProperties": false})");
  CHECK(accepts(g, R"({"name":"Ann","age":42})"));
  CHECK(accepts(g, R"({"name": "Ann", "age": 42, "tags": ["a", 3], "ok": true, "score": -1.5e3})"));
  CHECK(accepts(g, R"({"name":"\u00e9\n","age":0,"score":null})"));
  CHECK(accepts(g, "{\"name\":\"h\xc3\xa9\",\"age\":130}"));
  CHECK_FALSE(accepts(g, R"({"age":42,"name":"Ann"})"));                    // schema order
  CHECK_FALSE(accepts(g, R"({"name":"Ann"})"));                             // age is required
  CHECK_FALSE(accepts(g, R"({"name":"","age":1})"));                        // minLength
  CHECK_FALSE(accepts(g, R"({"name":"123456789","age":1})"));               // maxLength
  CHECK_FALSE(accepts(g, R"({"name":"a","age":131})"));                     // maximum
  CHECK_FALSE(accepts(g, R"({"name":"a","age":-1})"));                      // minimum
  CHECK_FALSE(accepts(g, R"({"name":"a","age":4.5})"));                     // integer
  CHECK_FALSE(accepts(g, R"({"name":"a","age":1,"tags":["b"]})"));          // enum
  CHECK_FALSE(accepts(g, R"({"name":"a","age":1,"tags":["a","a","a"]})"));  // maxItems
  CHECK_FALSE(accepts(g, R"({"name":"a","age":1,"extra":1})"));             // undeclared
  CHECK_FALSE(accepts(g, R"({"name":"a","age":1)"));                        // incomplete
  CHECK_FALSE(accepts(g, R"({"name":"a\q","age":1})"));                     // bad escape
  CHECK_FALSE(accepts(g, "{\"name\":\"a\x01\",\"age\":1}"));                // control byte
  CHECK_FALSE(accepts(g, "{\"name\":\"\xff\",\"age\":1}"));                 // not UTF-8
  CHECK_FALSE(accepts(g, R"({"name":"a","age":1}x)"));                      // nothing after the value
  CHECK_FALSE(accepts(g, R"({  "name":"a","age":1})"));                     // one space at most, and only after : and ,
}

TEST_CASE("grammar: random walks never dead-end and end in values the schema admits") {
  const auto g = Grammar::from_json_schema(R"({
    "type": "object",
    "properties": {
      "id": {"type": "integer", "minimum": -20, "exclusiveMaximum": 1000},
      "ratio": {"type": "number", "minimum": 0.5, "maximum": 2},
      "neg": {"type": "number", "exclusiveMinimum": -3, "exclusiveMaximum": -2},
      "kind": {"enum": ["x", "xy", "xyz", 12, 123, null]},
      "items": {"type": "array", "minItems": 1, "maxItems": 3,
                "items": {"anyOf": [{"type": "string", "maxLength": 3},
                                    {"type": "object", "properties": {"k": {"const": "v"}}, "required": ["k"]}]}},
      "note": {"$ref": "#/$defs/note"}
    },
    "required": ["id", "ratio", "neg", "kind", "items"],
    "$defs": {"note": {"type": "string", "minLength": 2}}})");
  std::mt19937 rng(7);
  for (int i = 0; i < 300; ++i) {
    const std::string out = walk(g, rng);
    const ojson v = ojson::parse(out, nullptr, false);
    REQUIRE_MESSAGE(!v.is_discarded(), out);
    const auto id = v.at("id").get<std::int64_t>();
    CHECK((id >= -20 && id < 1000));
    const double ratio = v.at("ratio").get<double>();
    CHECK((ratio >= 0.5 && ratio <= 2));
    const double neg = v.at("neg").get<double>();
    CHECK_MESSAGE((neg > -3 && neg < -2), out);
    const ojson kind = v.at("kind");
    CHECK((kind == "x" || kind == "xy" || kind == "xyz" || kind == 12 || kind == 123 || kind.is_null()));
    CHECK((v.at("items").size() >= 1 && v.at("items").size() <= 3));
    for (const auto& it : v.at("items"))
      CHECK(((it.is_string() && it.get<std::string>().size() <= 3 * 4) || it == ojson{{"k", "v"}}));
    if (v.contains("note")) CHECK(v.at("note").get<std::string>().size() >= 2);
  }
}

TEST_CASE("grammar: any JSON object, nesting bounded") {
  const auto g = Grammar::any_json_object();
  CHECK(accepts(g, R"({"a": [1, {"b": null}, "c"], "d": {"e": [true, false, -0.5e-7]}})"));
  CHECK(accepts(g, "{}"));
  CHECK_FALSE(accepts(g, "[1]"));
  CHECK_FALSE(accepts(g, "\"x\""));
  std::string deep = "{\"a\":";
  for (int i = 0; i < 40; ++i) deep += "[";
  Matcher m(g);
  CHECK_FALSE(m.feed(deep));  // deeper than max_value_depth
  std::mt19937 rng(3);
  for (int i = 0; i < 100; ++i) {
    const std::string out = walk(g, rng, 0.3);
    const ojson v = ojson::parse(out, nullptr, false);
    REQUIRE_MESSAGE(v.is_object(), out);
  }
}

TEST_CASE("grammar: free objects' key counts (minProperties, maxProperties)") {
  const auto g = Grammar::from_json_schema(
      R"({"type":"object","additionalProperties":{"type":"integer"},"minProperties":1,"maxProperties":2})");
  CHECK(accepts(g, R"({"a": 1})"));
  CHECK(accepts(g, R"({"a": 1, "b": 2})"));
  CHECK_FALSE(accepts(g, "{}"));
  CHECK_FALSE(accepts(g, R"({"a": 1, "b": 2, "c": 3})"));
  CHECK_FALSE(accepts(g, R"({"a": "x"})"));
  CHECK(refusal(R"({"type":"object","properties":{"a":{}},"maxProperties":1})").find("only on objects without") !=
        std::string::npos);
  std::mt19937 rng(9);
  for (int i = 0; i < 100; ++i) {
    const ojson v = ojson::parse(walk(g, rng));
    CHECK((v.size() >= 1 && v.size() <= 2));
  }
}

TEST_CASE("grammar: unsupported keywords and hostile schemas are refused by name") {
  CHECK(refusal(R"({"type":"string","pattern":"^a+$"})") == "(root): the keyword \"pattern\" is not supported");
  CHECK(refusal(R"({"type":"object","properties":{"x":{"type":"string","format":"date"}}})") ==
        "/properties/x: the keyword \"format\" is not supported");
  CHECK(refusal(R"({"oneOf":[{"type":"string"}]})").find("\"oneOf\" is not supported") != std::string::npos);
  CHECK(refusal(R"({"$ref":"#/$defs/a","$defs":{"a":{"type":"array","items":{"$ref":"#/$defs/a"}}}})")
            .find("is recursive") != std::string::npos);
  CHECK(refusal(R"({"$ref":"http://example.com/s.json"})").find("only references into") != std::string::npos);
  CHECK(refusal(R"({"type":"object","required":["a"]})").find("/required") != std::string::npos);
  CHECK(refusal(R"({"type":"integer","minimum":5,"maximum":4})") == "(root): the bounds admit no number");
  CHECK(refusal(R"({"type":"strin"})") == "/type: unknown type \"strin\"");
  CHECK(refusal("{") == "(root): not valid JSON");
  CHECK(refusal("false") == "(root): the schema false admits no value");
  // Deep nesting, a huge schema, too many properties.
  std::string deep;
  for (int i = 0; i < 40; ++i) deep += R"({"type":"array","items":)";
  deep += "{}";
  for (int i = 0; i < 40; ++i) deep += "}";
  CHECK(refusal(deep).find("nested deeper than 32 levels") != std::string::npos);
  ojson wide = {{"type", "object"}, {"properties", ojson::object()}};
  for (int i = 0; i < 65; ++i) wide["properties"][std::string("p").append(std::to_string(i))] = {{"type", "string"}};
  CHECK(refusal(wide.dump()).find("more than 64 properties") != std::string::npos);
  std::string big = R"({"enum":[)";
  for (int i = 0; i < 40000; ++i) big.append(i ? ",\"" : "\"").append(std::to_string(i)).append("\"");
  big += "]}";
  CHECK(refusal(big).find("bytes (at most 262144)") != std::string::npos);
  // A schema whose expansion is exponential: each level refers to the previous one twice.
  ojson defs = ojson::object();
  defs["d0"] = {{"type", "string"}};
  for (int i = 1; i < 14; ++i) {
    const std::string prev = std::string("#/$defs/d").append(std::to_string(i - 1));
    defs[std::string("d").append(std::to_string(i))] = {
        {"type", "object"}, {"properties", {{"a", {{"$ref", prev}}}, {"b", {{"$ref", prev}}}}}};
  }
  const ojson bomb = {{"$ref", "#/$defs/d13"}, {"$defs", defs}};
  CHECK(refusal(bomb.dump()).find("more than 4096 grammar nodes") != std::string::npos);
}

TEST_CASE("grammar: a hostile grammar is bounded while decoding (alternatives, nesting, time)") {
  // 200 alternatives that agree on their first bytes: the matcher follows at most 16 at once.
  ojson alts = ojson::array();
  for (int i = 0; i < 200; ++i) {
    ojson o = {{"type", "object"}, {"properties", ojson::object()}, {"required", ojson::array()}};
    for (int k = 0; k < 3; ++k) o["properties"][std::string("k").append(std::to_string(k))] = {{"type", "integer"}};
    o["properties"][std::string("tag").append(std::to_string(i))] = {{"type", "string"}};
    alts.push_back(o);
  }
  const auto g = Grammar::from_json_schema(ojson{{"anyOf", alts}}.dump());
  Matcher m(g);
  REQUIRE(m.feed(R"({"k0": 1, "k1": 2, "k2": 3, "tag1)"));
  std::string key;
  m.key(16, key);
  CHECK(key.size() < 16 * 2 * 64);  // at most 16 stacks of two frames
  // Masks over a vocabulary of 20,000 tokens stay fast in the worst states (open strings, alternatives).
  std::vector<std::string> bytes;
  std::mt19937 rng(1);
  const std::string alphabet = "abcdefghijklmnopqrstuvwxyz0123456789{}[]\":, .-\\";
  for (int i = 0; i < 20000; ++i) {
    std::string t;
    for (int k = 0, n = 1 + static_cast<int>(rng() % 8); k < n; ++k) t += alphabet[rng() % alphabet.size()];
    bytes.push_back(t);
  }
  auto vocab =
      std::make_shared<const Vocabulary>(bytes, std::vector<bool>(bytes.size(), false), std::vector<std::int32_t>{});
  const auto t0 = std::chrono::steady_clock::now();
  Mask mask;
  for (const char* prefix : {R"({"k0": 1, "k1": 2, "k2": 3, ")", R"({"k0": 1, "k1": 2, "k2": 3, "tag7": "abc)", "{"}) {
    Matcher p(g);
    REQUIRE(p.feed(prefix));
    vocab->compute(p, mask);
  }
  Matcher deep(Grammar::any_json_object());
  REQUIRE(deep.feed(R"({"a": [[[[[[[[[[[[[[[[[[[[)"));
  vocab->compute(deep, mask);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("four worst-case masks over 20,000 tokens: " << s << " s");
  CHECK(s < 10);
}

TEST_CASE("grammar: tool calls, required and auto") {
  const std::vector<Grammar::Tool> tools = {
      {"get_weather", R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})"},
      {"add",
       R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"required":["a","b"]})"}};
  const auto one = Grammar::tool_calls(tools, true, false);
  CHECK(accepts(one, "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>"));
  CHECK_FALSE(accepts(one, "<tool_call>\n{\"name\": \"sub\", \"arguments\": {}}\n</tool_call>"));
  CHECK_FALSE(accepts(one, "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call>"));
  CHECK_FALSE(accepts(one, "Sure!"));
  const std::string two =
      "<tool_call>\n{\"name\":\"add\",\"arguments\":{\"a\":1,\"b\":2}}\n</tool_call>\n"
      "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}\n</tool_call>";
  CHECK_FALSE(accepts(one, two));  // one call unless parallel
  CHECK(accepts(Grammar::tool_calls(tools, true, true), two));
  const auto any = Grammar::tool_calls(tools, false, true);
  CHECK(accepts(any, "It is sunny."));
  CHECK(accepts(any, ""));
  CHECK(accepts(any, "Let me check. " + two));
  CHECK_FALSE(accepts(any, "Let me check. <tool_call>\n{\"name\":\"add\",\"arguments\":{\"a\":\"x\"}}"));
  std::mt19937 rng(11);
  for (int i = 0; i < 50; ++i) {
    const std::string out = walk(Grammar::tool_calls(tools, true, true), rng);
    CHECK(out.rfind("<tool_call>\n", 0) == 0);
  }
  try {
    Grammar::tool_calls({{"f", R"({"type":"object","properties":{"x":{"type":"string","pattern":"a"}}})"}}, true,
                        false);
    FAIL("expected a refusal");
  } catch (const GrammarError& e) {
    CHECK(std::string(e.what()) == "/0/parameters/properties/x: the keyword \"pattern\" is not supported");
  }
}

TEST_CASE("grammar: token masks equal a check of every token, and the cache returns them") {
  // A vocabulary of byte strings like a BPE one: single bytes, JSON pieces, words with spaces.
  std::vector<std::string> bytes;
  for (int b = 32; b < 127; ++b) bytes.emplace_back(1, static_cast<char>(b));
  for (const char* t : {"{\"",        "\":",
                        "\": ",       "\",",
                        "\", \"",     "\"}",
                        "}",          "{}",
                        "true",       "null",
                        "name",       " name",
                        "age",        "\":\"",
                        "12",         "3.",
                        ".5",         "e+",
                        "\\n",        "\\u00",
                        "\xc3\xa9",   "\xc3",
                        "\xa9",       "<tool_call>",
                        "\n",         "\n</",
                        "tool",       "_call",
                        ">\n{\"",     "\"}}",
                        "nick",       "abcdef",
                        "ab\"",       "\\\"x",
                        "\\u00e9\"}", "\xe0\xa0",
                        "\xe0\x80",   " \xf0\x9f\x98\x80",
                        "<|end|>"})
    bytes.emplace_back(t);
  std::vector<bool> special(bytes.size(), false);
  special.back() = true;  // <|end|>
  const auto end_id = static_cast<std::int32_t>(bytes.size() - 1);
  auto vocab = std::make_shared<const Vocabulary>(bytes, special, std::vector<std::int32_t>{end_id});
  const auto g =
      Grammar::from_json_schema(R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"number"},)"
                                R"("nick":{"type":"string","minLength":2,"maxLength":5}},"required":["name"]})");
  MaskCache cache(vocab);
  std::mt19937 rng(5);
  for (int run = 0; run < 60; ++run) {
    Matcher m(g);
    for (int step = 0; step < 60; ++step) {
      const Mask& mask = cache.mask(m);
      std::vector<std::int32_t> ok;
      for (std::int32_t id = 0; id < static_cast<std::int32_t>(bytes.size()); ++id) {
        Matcher probe = m;
        const bool want = id == end_id ? m.accepting() : probe.feed(bytes[static_cast<std::size_t>(id)]);
        REQUIRE_MESSAGE(allowed(mask, id) == want, "token " << id);
        if (want) ok.push_back(id);
      }
      REQUIRE(!ok.empty());
      const std::int32_t pick = ok[std::uniform_int_distribution<std::size_t>(0, ok.size() - 1)(rng)];
      if (pick == end_id) break;
      REQUIRE(m.feed(bytes[static_cast<std::size_t>(pick)]));
    }
  }
  CHECK(cache.hits() > 0);
  CHECK(cache.computed() > 0);
}
