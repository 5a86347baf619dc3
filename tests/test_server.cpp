// tests/test_server.cpp — the HTTP API without HTTP: request parsing and validation (OpenAI chat and
// completions, sglang /generate), the max_tokens rule, response and chunk shapes, SSE framing, and
// the Prometheus text; and the HTTP layer (server/http.hpp) on a loopback port with a handler that
// answers from other threads. The end-to-end suites (tools/serve-e2e, tools/serve-hostile) drive a
// real server.
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <limits>
#include <thread>

#include "config/error.hpp"
#include "server/api.hpp"
#include "server/choices.hpp"
#include "server/http.hpp"
#include "server/metrics.hpp"
#include "server/structured.hpp"
#include "tests/support/free_port.hpp"

using namespace specactor::server;

namespace {

const ApiLimits kLimits{"smol"};

// The ApiError a parse throws (status, param), or fails the test.
ApiError error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ApiError& e) {
    return e;
  }
  FAIL("expected an ApiError");
  return ApiError(0, "");
}

}  // namespace

TEST_CASE("chat requests: messages, sampling fields, extensions") {
  const json body = json::parse(R"({
    "model": "smol", "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
      {"role": "assistant", "content": "Hello."},
      {"role": "developer", "content": "Rules."}],
    "max_completion_tokens": 12, "max_tokens": 99, "temperature": 0.5, "top_p": 0.9, "top_k": -1, "min_p": 0.05,
    "seed": 7, "stop": ["\n\n", "END"], "stream": true, "stream_options": {"include_usage": true},
    "speculative": false, "ignore_eos": true, "user": "someone", "frequency_penalty": 0})");
  const ApiRequest a = parse_chat(body, kLimits);
  CHECK(a.endpoint == Endpoint::Chat);
  const auto& r = a.request;
  REQUIRE(r.messages.size() == 4);
  CHECK(r.chat);
  CHECK(r.messages[1].content == "Hi there");
  CHECK(r.messages[3].role == "system");  // developer is the system role
  CHECK(r.max_new_tokens == 12);          // max_completion_tokens wins over max_tokens
  CHECK(a.max_tokens_name == "max_completion_tokens");
  CHECK(r.sampling.temperature == doctest::Approx(0.5));
  CHECK(r.sampling.top_k == 0);  // -1 = off
  CHECK(r.seed == std::optional<std::uint64_t>(7));
  CHECK(r.stop == std::vector<std::string>{"\n\n", "END"});
  CHECK(a.stream);
  CHECK(a.include_usage);
  CHECK(!r.speculative);
  CHECK(r.ignore_eos);

  const ApiRequest plain = parse_chat(json::parse(R"({"messages": [{"role": "user", "content": "x"}]})"), kLimits);
  CHECK(!plain.request.max_new_tokens);               // unset: the room the context leaves
  CHECK(plain.request.sampling.temperature == 0.0f);  // greedy by default
  CHECK(plain.request.speculative);
  CHECK(plain.model.empty());
}

TEST_CASE("bad requests are 400s naming the field, an unknown model is a 404") {
  struct Case {
    const char* body;
    int status;
    const char* param;
    const char* message;
  };
  const Case cases[] = {
      {R"({"messages": []})", 400, "messages", "non-empty array"},
      {R"({"messages": "hi"})", 400, "messages", "non-empty array"},
      {R"({"messages": [{"role": "robot", "content": "x"}]})", 400, "messages", "messages[0].role"},
      {R"({"messages": [{"role": "user", "content": 3}]})", 400, "messages", "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", 400, "messages", "content[0]"},
      {R"({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"})", 400, "temperature",
       "expected a finite number"},
      {R"({"messages": [{"role": "user", "content": "x"}], "temperature": -1})", 400, "temperature", ">= 0"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_p": 0})", 400, "top_p", "(0, 1]"},
      {R"({"messages": [{"role": "user", "content": "x"}], "temperature": 1e-40})", 400, "temperature",
       "must be 0 (greedy) or at least 1e-05"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_p": 1e-40})", 400, "top_p", "at least 1e-05"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_k": -5})", 400, "top_k", "top_k"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0})", 400, "max_tokens", ">= 1"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1.5})", 400, "max_tokens", "integer"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 18446744073709551615})", 400, "max_tokens",
       "out of range"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stop": [1]})", 400, "stop", "stop[0]"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stop": ""})", 400, "stop", "is empty"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stream": "yes"})", 400, "stream", "true or false"},
      {R"({"messages": [{"role": "user", "content": "x"}], "n": 0})", 400, "n", "between 1 and 16"},
      {R"({"messages": [{"role": "user", "content": "x"}], "n": 17})", 400, "n", "between 1 and 16"},
      {R"({"messages": [{"role": "user", "content": "x"}], "n": 2, "best_of": 3})", 400, "best_of", "best_of = n"},
      {R"({"messages": [{"role": "user", "content": "x"}], "echo": true})", 400, "echo", "is not supported ("},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", 400, "top_logprobs",
       "needs \"logprobs\": true"},
      {R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21})", 400, "top_logprobs",
       "between 0 and 20"},
      {R"({"messages": [{"role": "user", "content": "x"}], "logprobs": 3})", 400, "logprobs", "true or false"},
      {R"({"messages": [{"role": "user", "content": "x"}], "seed": -1})", 400, "seed", ">= 0"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stream_options": 1})", 400, "stream_options", "object"},
      {R"({"messages": [{"role": "user", "content": "x"}], "model": "gpt-4"})", 404, "model", "does not exist"},
      {R"({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"5": 101}})", 400, "logit_bias",
       "logit_bias[5]: must be a number in [-100, 100]"},
      {R"({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"five": 1}})", 400, "logit_bias",
       "expected a token id"},
      {R"({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"-5": 1}})", 400, "logit_bias",
       "expected a token id"},
      {R"({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"5": "high"}})", 400, "logit_bias",
       "expected a number"},
      {R"({"messages": [{"role": "user", "content": "x"}], "logit_bias": [5]})", 400, "logit_bias",
       "expected an object"},
      {R"({"messages": [{"role": "user", "content": "x"}], "repetition_penalty": 0})", 400, "repetition_penalty",
       "> 0"},
      {R"({"messages": [{"role": "user", "content": "x"}], "min_tokens": -1})", 400, "min_tokens", ">= 0"},
      {R"({"messages": [{"role": "user", "content": "x"}], "min_tokens": 9, "max_tokens": 4})", 400, "min_tokens",
       "at most max_tokens (4)"},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}})", 400,
       "response_format", "expected \"text\", \"json_object\" or \"json_schema\""},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema"}})", 400,
       "response_format", "response_format.json_schema: expected an object"},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema",
           "json_schema": {"name": "a", "schema": {"type": "string", "pattern": "^a$"}}}})",
       400, "response_format", "the keyword \"pattern\" is not supported"},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema",
           "json_schema": {"name": "a", "schema": {"$ref": "#/$defs/n", "$defs": {"n": {"type": "object",
           "properties": {"next": {"$ref": "#/$defs/n"}}}}}}}})",
       400, "response_format", "is recursive"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})", 400, "tools",
       "tools[0].function: expected an object"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f",
           "parameters": {"type": "object", "properties": {"x": {"format": "email"}}}}}]})",
       400, "tools", "/0/parameters/properties/x: the keyword \"format\" is not supported"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}],
           "tool_choice": {"type": "function", "function": {"name": "g"}}})",
       400, "tool_choice", "naming one of tools"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})", 400, "tool_choice",
       "needs \"tools\""},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}],
           "response_format": {"type": "json_object"}})",
       400, "response_format", "cannot be combined with tools"},
      {R"({"messages": [{"role": "tool", "content": "x"}, {"role": "assistant", "tool_calls": [{"function":
           {"name": "f", "arguments": "{bad"}}]}]})",
       400, "messages", "messages[1].tool_calls[0].function.arguments: expected a JSON object"},
      {R"({"messages": [{"role": "user", "content": "x"}], "presence_penalty": 2.5})", 400, "presence_penalty",
       "must be in [-2, 2]"},
      {R"({"messages": [{"role": "user", "content": "x"}], "frequency_penalty": "-1"})", 400, "frequency_penalty",
       "frequency_penalty"},
      {R"({"messages": [{"role": "user", "content": "x"}], "best_of": 3})", 400, "best_of", "best_of = n"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.body);
    const ApiError e = error_of([&] { parse_chat(json::parse(c.body), kLimits); });
    CHECK(e.status == c.status);
    CHECK(e.param == c.param);
    CHECK_MESSAGE(std::string(e.what()).find(c.message) != std::string::npos, e.what());
    const json b = error_body(e);  // OpenAI's shape
    CHECK(b["error"]["message"] == e.what());
    CHECK(b["error"]["param"] == c.param);
    CHECK(b["error"].contains("type"));
    CHECK(b["error"].contains("code"));
  }
  CHECK(error_of([] {
          parse_chat(json::parse(R"({"messages": [{"role": "user", "content": "x"}], "model": "gpt"})"), kLimits);
        }).code == "model_not_found");
  CHECK(error_of([] { parse_body("{bad"); }).status == 400);
  CHECK(std::string(error_of([] { parse_body("[1, 2]"); }).what()).find("JSON object") != std::string::npos);
  CHECK(std::string(error_of([] { parse_body(std::string(200, '[') + std::string(200, ']')); }).what())
            .find("nested deeper than 64") != std::string::npos);
}

TEST_CASE("structured output and tools: constraints, the tools prompt, tool turns, tool_calls whole and streamed") {
  using Kind = specactor::sched::OutputConstraint::Kind;
  const ApiRequest js = parse_chat(json::parse(R"({"messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_schema", "json_schema": {"name": "p", "strict": true,
        "schema": {"type": "object", "properties": {"zeta": {"type": "string"}, "alpha": {"type": "integer"}}}}}})"),
                                   kLimits);
  CHECK(js.request.constraint.kind == Kind::JsonSchema);
  // The schema keeps the client's key order (the grammar writes properties in it).
  CHECK(js.request.constraint.schema.find("zeta") < js.request.constraint.schema.find("alpha"));
  CHECK(parse_completion(json::parse(R"({"prompt": "x", "response_format": {"type": "json_object"}})"), kLimits)
            .request.constraint.kind == Kind::JsonObject);
  CHECK(parse_chat(
            json::parse(R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "text"}})"),
            kLimits)
            .request.constraint.kind == Kind::None);
  CHECK(parse_generate(json::parse(R"({"text": "x", "sampling_params": {"json_schema": "{\"type\": \"object\"}"}})"),
                       kLimits)
            .request.constraint.kind == Kind::JsonSchema);
  CHECK(error_of([] {
          parse_generate(json::parse(R"({"text": "x", "sampling_params": {"regex": "a+"}})"), kLimits);
        }).param == "sampling_params.regex");
  CHECK(error_of([] {
          parse_completion(
              json::parse(R"({"prompt": "x", "tools": [{"type": "function", "function": {"name": "f"}}]})"), kLimits);
        }).param == "tools");

  const char* tools = R"("tools": [
      {"type": "function", "function": {"name": "weather", "description": "Weather of a city",
       "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
      {"type": "function", "function": {"name": "time", "parameters": {"type": "object", "properties": {}}}}])";
  const ApiRequest a = parse_chat(json::parse(std::string(R"({"messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Weather in Oslo?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],)") +
                                              tools + "}"),
                                  kLimits);
  CHECK(a.tools);
  CHECK(a.request.constraint.kind == Kind::ToolCalls);
  CHECK(!a.request.constraint.tools_required);
  CHECK(a.request.constraint.tool_names == std::vector<std::string>{"weather", "time"});
  REQUIRE(a.request.messages.size() == 4);
  CHECK(a.request.messages[0].content.rfind("Be brief.\n\n# Tools", 0) == 0);
  CHECK(a.request.messages[0].content.find("\"name\":\"weather\"") != std::string::npos);
  CHECK(a.request.messages[2].content ==
        "<tool_call>\n{\"name\":\"weather\",\"arguments\":{\"city\":\"Oslo\"}}\n</tool_call>");
  CHECK(a.request.messages[3].role == "user");
  CHECK(a.request.messages[3].content == "<tool_response>\nsunny\n</tool_response>");
  const ApiRequest named = parse_chat(
      json::parse(std::string(R"({"messages": [{"role": "user", "content": "x"}], "parallel_tool_calls": false,
          "tool_choice": {"type": "function", "function": {"name": "time"}},)") +
                  tools + "}"),
      kLimits);
  CHECK(named.request.constraint.tools_required);
  CHECK(!named.request.constraint.parallel_tool_calls);
  CHECK(named.request.constraint.tool_names == std::vector<std::string>{"time"});
  CHECK(
      parse_chat(json::parse(std::string(R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "none",)") +
                             tools + "}"),
                 kLimits)
          .request.constraint.kind == Kind::None);

  // The answer: content before the calls, each call's arguments as JSON text.
  const std::string text =
      "Checking. <tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Oslo\"}}"
      "\n</tool_call>\n<tool_call>\n{\"name\": \"time\", \"arguments\": {}}\n</tool_call>";
  const ToolAnswer split = split_tool_calls(text, "x");
  CHECK(split.content == "Checking.");
  REQUIRE(split.calls.size() == 2);
  CHECK(split.calls[0].name == "weather");
  CHECK(json::parse(split.calls[0].arguments) == json{{"city", "Oslo"}});
  CHECK(split.calls[1].arguments == "{}");
  Outcome o;
  o.text = text;
  o.tools = true;
  o.finish_reason = "stop";
  const json whole = chat_response("id", 1, "smol", o);
  CHECK(whole["choices"][0]["finish_reason"] == "tool_calls");
  CHECK(whole["choices"][0]["message"]["tool_calls"].size() == 2);
  CHECK(whole["choices"][0]["message"]["tool_calls"][1]["function"]["name"] == "time");
  // Streamed in small pieces: the content stops before "<tool_call>", each call comes whole, in order.
  ChatStream stream("id", 1, "smol", true);
  std::string content, names;
  std::string finish;
  for (std::size_t i = 0; i < text.size(); i += 3) {
    specactor::sched::TokenEvent ev;
    ev.text = text.substr(i, 3);
    ev.finished = i + 3 >= text.size();
    if (ev.finished) ev.finish_reason = "stop";
    const std::string sse = stream.events(ev, nullptr);
    for (std::size_t at = sse.find("data: "); at != std::string::npos; at = sse.find("data: ", at + 1)) {
      const json chunk = json::parse(sse.substr(at + 6, sse.find('\n', at) - at - 6));
      const json& d = chunk["choices"][0]["delta"];
      if (d.contains("content")) content += d["content"].get<std::string>();
      if (d.contains("tool_calls"))
        for (const auto& c : d["tool_calls"]) names += c["function"]["name"].get<std::string>() + ";";
      if (!chunk["choices"][0]["finish_reason"].is_null()) finish = chunk["choices"][0]["finish_reason"];
    }
  }
  CHECK(content == "Checking.");
  CHECK(names == "weather;time;");
  CHECK(finish == "tool_calls");
  // Text that only looked like a call's start is content after all.
  CHECK(split_tool_calls("a <tool_c", "x").content == "a <tool_c");
  CHECK(split_tool_calls("a <tool_call>{\"name\": \"f\"}</tool_call>", "x").content ==
        "a <tool_call>{\"name\": \"f\"}</tool_call>");  // no newline after the tag: never a call, still text
  CHECK(split_tool_calls("<tool_call>\n{\"name\": \"f\", \"argu", "x").content.empty());  // cut by its length
}

TEST_CASE("n > 1: choices merged in order, usage summed, streamed chunks re-indexed, a seed per choice") {
  CHECK(parse_chat(json::parse(R"({"messages": [{"role": "user", "content": "x"}], "n": 3})"), kLimits).n == 3);
  CHECK(parse_completion(json::parse(R"({"prompt": "x", "n": 2, "best_of": 2})"), kLimits).n == 2);
  std::vector<json> parts;
  std::vector<Outcome> outs(3);
  for (std::size_t i = 0; i < 3; ++i) {
    outs[i].text = std::string("answer ").append(std::to_string(i));
    outs[i].tokens.assign(i + 1, 7);
    outs[i].prompt_tokens = 5;
    outs[i].finish_reason = "stop";
    parts.push_back(chat_response("id", 1, "smol", outs[i]));
  }
  const json merged = merge_responses(parts);
  REQUIRE(merged["choices"].size() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(merged["choices"][i]["index"] == i);
    CHECK(merged["choices"][i]["message"]["content"] == outs[i].text);
  }
  CHECK(merged["usage"]["prompt_tokens"] == 5);
  CHECK(merged["usage"]["completion_tokens"] == 6);
  CHECK(merged["usage"]["total_tokens"] == 11);
  CHECK(summed_outcome({&outs[0], &outs[1], &outs[2]}).tokens.size() == 6);
  const std::string sse = sse_event(completion_chunk("id", 1, "smol", "a", "")) + sse_done();
  const std::string re = reindex_events(sse, 2);
  CHECK(json::parse(re.substr(6, re.find('\n') - 6))["choices"][0]["index"] == 2);
  CHECK(re.substr(re.size() - sse_done().size()) == sse_done());
  CHECK(choice_seed(std::uint64_t{40}, 9, 2) == 42);
  CHECK(choice_seed(std::nullopt, 9, 2) == 11);
}

TEST_CASE("completions and /generate: prompt forms") {
  CHECK(parse_completion(json::parse(R"({"prompt": "abc"})"), kLimits).request.prompt == "abc");
  CHECK(parse_completion(json::parse(R"({"prompt": ["abc"]})"), kLimits).request.prompt == "abc");
  CHECK(parse_completion(json::parse(R"({"prompt": [1, 2, 3]})"), kLimits).request.prompt_ids ==
        std::vector<std::int32_t>{1, 2, 3});
  CHECK(error_of([] { parse_completion(json::parse(R"({"prompt": ["a", "b"]})"), kLimits); }).param == "prompt");
  CHECK(error_of([] { parse_completion(json::parse(R"({"prompt": [1, -2]})"), kLimits); }).param == "prompt");
  CHECK(error_of([] { parse_completion(json::parse(R"({"prompt": ""})"), kLimits); }).param == "prompt");
  CHECK(error_of([] { parse_completion(json::parse(R"({})"), kLimits); }).param == "prompt");

  const ApiRequest g = parse_generate(
      json::parse(R"({"text": "hi", "stream": true, "sampling_params": {"max_new_tokens": 5, "temperature": 0.7,
                      "top_k": 3, "stop": "x"}})"),
      kLimits);
  CHECK(g.endpoint == Endpoint::Generate);
  CHECK(g.request.prompt == "hi");
  CHECK(g.request.max_new_tokens == 5);
  CHECK(g.request.sampling.top_k == 3);
  CHECK(g.request.stop == std::vector<std::string>{"x"});
  CHECK(g.stream);
  CHECK(parse_generate(json::parse(R"({"input_ids": [4, 5]})"), kLimits).request.prompt_ids ==
        std::vector<std::int32_t>{4, 5});
  CHECK(error_of([] { parse_generate(json::parse(R"({"sampling_params": {}})"), kLimits); }).param == "text");
  CHECK(error_of([] {
          parse_generate(json::parse(R"({"text": "a", "sampling_params": {"max_new_tokens": 0}})"), kLimits);
        }).param == "sampling_params.max_new_tokens");
  CHECK(error_of([] {
          parse_generate(json::parse(R"({"text": "a", "sampling_params": {"temperature": "x"}})"), kLimits);
        }).param == "sampling_params.temperature");
}

// The context rule is the engine's (sched::check_request, called by EngineApi::prepare); the API names
// its fields and answers with OpenAI's code.
ApiError context_error(ApiRequest a, std::int64_t prompt_tokens, std::int64_t context_length) {
  a.request.prompt_ids.assign(static_cast<std::size_t>(prompt_tokens), 1);
  try {
    specactor::sched::check_request(a.request, {context_length, 0}, api_field_names(a));
  } catch (const specactor::sched::RequestError& e) {
    return request_error(e);
  }
  return ApiError(0, "no error");
}

TEST_CASE("max_tokens against the context: unset fits, more than fits is a 400 naming the API's field") {
  const ApiRequest a = parse_completion(json::parse(R"({"prompt": "abc"})"), kLimits);
  CHECK(context_error(a, 10, 100).status == 0);
  CHECK(specactor::sched::new_token_budget(a.request, 10, 100) == 90);
  const ApiError e =
      context_error(parse_completion(json::parse(R"({"prompt": "abc", "max_tokens": 91})"), kLimits), 10, 100);
  CHECK(e.status == 400);
  CHECK(e.param == "max_tokens");
  CHECK(e.code == "context_length_exceeded");
  CHECK(std::string(e.what()).find("you requested 101 tokens (10 in the prompt, 91 for the completion)") !=
        std::string::npos);
  CHECK(
      context_error(parse_completion(json::parse(R"({"prompt": "abc", "max_tokens": 90})"), kLimits), 10, 100).status ==
      0);
  CHECK(context_error(a, 100, 100).param == "prompt");
  CHECK(context_error(parse_chat(json::parse(R"({"messages": [{"role": "user", "content": "x"}]})"), kLimits), 100, 100)
            .param == "messages");
  CHECK(
      context_error(parse_generate(json::parse(R"({"text": "x", "sampling_params": {"max_new_tokens": 95}})"), kLimits),
                    10, 100)
          .param == "sampling_params.max_new_tokens");
  // The largest max_tokens: the requested total is printed as it is, not wrapped negative.
  const ApiError huge = context_error(
      parse_completion(json::parse(R"({"prompt": "abc", "max_tokens": 9223372036854775807})"), kLimits), 10, 100);
  CHECK(std::string(huge.what()).find("you requested 9223372036854775817 tokens") != std::string::npos);
}

TEST_CASE("responses, chunks and SSE framing") {
  Outcome o;
  o.tokens = {5, 6, 7};
  o.text = "line one\nline \"two\"";
  o.finish_reason = "length";
  o.prompt_tokens = 4;
  o.metrics.steps = 2;
  o.metrics.drafted = 4;
  o.metrics.accepted = 1;
  o.metrics.mean_accepted_length = 1.5;
  o.metrics.drafted_at = {2, 2};
  o.metrics.accepted_at = {1};
  o.metrics.cached_tokens = 2;
  const json c = chat_response("chatcmpl-1", 100, "smol", o);
  CHECK(c["object"] == "chat.completion");
  CHECK(c["choices"][0]["message"]["content"] == o.text);
  CHECK(c["choices"][0]["finish_reason"] == "length");
  CHECK(c["usage"] == json{{"prompt_tokens", 4},
                           {"completion_tokens", 3},
                           {"total_tokens", 7},
                           {"prompt_tokens_details", {{"cached_tokens", 2}}}});
  CHECK(c["speculative"]["acceptance_by_position"][0]["rate"] == doctest::Approx(0.5));
  CHECK(c["speculative"]["acceptance_by_position"][1]["accepted"] == 0);
  CHECK(completion_response("cmpl-1", 100, "smol", o)["choices"][0]["text"] == o.text);
  const json g = generate_response("1", o);
  CHECK(g["meta_info"]["spec_verify_ct"] == 2);
  CHECK(g["meta_info"]["finish_reason"]["type"] == "length");
  CHECK(g["output_ids"] == json{5, 6, 7});

  const json first = chat_chunk("x", 1, "smol", "", true, "");
  CHECK(first["choices"][0]["delta"] == json{{"role", "assistant"}, {"content", ""}});
  CHECK(first["choices"][0]["finish_reason"].is_null());
  const json last = chat_chunk("x", 1, "smol", "", false, "cancelled");
  CHECK(last["choices"][0]["delta"] == json::object());
  CHECK(last["choices"][0]["finish_reason"] == "abort");
  CHECK(usage_chunk(Endpoint::Chat, "x", 1, "smol", o)["choices"] == json::array());

  const std::string ev = sse_event(chat_chunk("x", 1, "smol", "a\nb\n\ndata: [DONE]\n\n", false, ""));
  CHECK(ev.rfind("data: {", 0) == 0);
  CHECK(ev.size() >= 2);
  CHECK(ev.substr(ev.size() - 2) == "\n\n");
  CHECK(ev.find('\n') == ev.size() - 2);  // one line: the text's newlines are escaped
  CHECK(json::parse(ev.substr(6))["choices"][0]["delta"]["content"] == "a\nb\n\ndata: [DONE]\n\n");
  CHECK(sse_done() == "data: [DONE]\n\n");
  CHECK(sse_event(json{{"t", std::string("\xff", 1)}}).find("\xEF\xBF\xBD") !=
        std::string::npos);  // bad UTF-8 replaced by U+FFFD
}

TEST_CASE("Prometheus text: families, labels, histograms") {
  Exposition x;
  x.counter("specactor:a_total", "a help\nline", 3);
  x.gauge("specactor:b", "b", 0.25, {{"k", "v\"q\\\n"}});
  x.family("specactor:c_total", "counter", "c");
  x.sample("specactor:c_total", 1, {{"position", "0"}});
  x.sample("specactor:c_total", 2, {{"position", "1"}});
  Histogram h({0.1, 1, 0.5});  // bounds are sorted
  for (double v : {0.05, 0.1, 0.3, 0.7, 5.0}) h.observe(v);
  x.histogram("specactor:h_seconds", "h", h.snapshot());
  CHECK(x.text() ==
        "# HELP specactor:a_total a help\\nline\n"
        "# TYPE specactor:a_total counter\n"
        "specactor:a_total 3\n"
        "# HELP specactor:b b\n"
        "# TYPE specactor:b gauge\n"
        "specactor:b{k=\"v\\\"q\\\\\\n\"} 0.25\n"
        "# HELP specactor:c_total c\n"
        "# TYPE specactor:c_total counter\n"
        "specactor:c_total{position=\"0\"} 1\n"
        "specactor:c_total{position=\"1\"} 2\n"
        "# HELP specactor:h_seconds h\n"
        "# TYPE specactor:h_seconds histogram\n"
        "specactor:h_seconds_bucket{le=\"0.1\"} 2\n"
        "specactor:h_seconds_bucket{le=\"0.5\"} 3\n"
        "specactor:h_seconds_bucket{le=\"1\"} 4\n"
        "specactor:h_seconds_bucket{le=\"+Inf\"} 5\n"
        "specactor:h_seconds_sum 6.15\n"
        "specactor:h_seconds_count 5\n");
  CHECK(format_value(std::numeric_limits<double>::infinity()) == "+Inf");
  CHECK(format_value(-std::numeric_limits<double>::infinity()) == "-Inf");
  CHECK(format_value(std::numeric_limits<double>::quiet_NaN()) == "NaN");
  CHECK(format_value(1e20) == "1e+20");
}

TEST_CASE("unsupported OpenAI fields: neutral values pass, others are refused, error bodies stay small") {
  // What clients send by default is accepted.
  CHECK_NOTHROW(parse_chat(json::parse(R"({"messages": [{"role": "user", "content": "x"}], "logit_bias": {},
      "presence_penalty": 0, "frequency_penalty": 0.0, "response_format": {"type": "text"}, "best_of": 1,
      "logit_bias": null})"),
                           kLimits));
  CHECK_NOTHROW(parse_completion(json::parse(R"({"prompt": "x", "echo": false, "suffix": null})"), kLimits));
  CHECK(error_of([] { parse_completion(json::parse(R"({"prompt": "x", "echo": true})"), kLimits); }).param == "echo");
  CHECK(error_of([] { parse_completion(json::parse(R"({"prompt": "x", "suffix": "end"})"), kLimits); }).param ==
        "suffix");
  // Penalties, logit_bias and min_tokens reach the request (logit_bias sorted by id).
  const ApiRequest pr = parse_completion(json::parse(R"({"prompt": "x", "presence_penalty": 0.5,
      "frequency_penalty": -0.25, "repetition_penalty": 1.3, "min_tokens": 3, "max_tokens": 8,
      "logit_bias": {"17": -100, "5": 2.5}})"),
                                         kLimits);
  const auto& rl = pr.request.rules;
  CHECK(rl.presence_penalty == 0.5f);
  CHECK(rl.frequency_penalty == -0.25f);
  CHECK(rl.repetition_penalty == 1.3f);
  CHECK(rl.min_tokens == 3);
  CHECK(rl.bias_ids == std::vector<std::int32_t>{5, 17});
  CHECK(rl.bias_values == std::vector<float>{2.5f, -100.0f});
  CHECK(rl.active());
  CHECK(rl.needs_prompt());
  CHECK(pr.request.logprobs == -1);
  // logprobs: chat's flag and top count, completions' count; the choice's object in each shape.
  CHECK(parse_chat(json::parse(R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true,
      "top_logprobs": 3})"),
                   kLimits)
            .request.logprobs == 3);
  CHECK(parse_chat(json::parse(R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true})"), kLimits)
            .request.logprobs == 0);
  CHECK(parse_completion(json::parse(R"({"prompt": "x", "logprobs": 2})"), kLimits).request.logprobs == 2);
  CHECK(error_of([] { parse_completion(json::parse(R"({"prompt": "x", "logprobs": 6})"), kLimits); }).param ==
        "logprobs");
  specactor::kernels::TokenLogprob a;
  a.token = 7;
  a.logprob = -0.5f;
  a.top_ids = {7, 9};
  a.top_logprobs = {-0.5f, -1.25f};
  auto piece = [](std::int32_t t) { return t == 7 ? std::string("ab") : std::string("\xe2\x82"); };
  const json chat = logprobs_json(Endpoint::Chat, {7}, {a}, piece);
  CHECK(chat["content"][0]["token"] == "ab");
  CHECK(chat["content"][0]["logprob"] == -0.5);
  CHECK(chat["content"][0]["bytes"] == json::array({97, 98}));
  CHECK(chat["content"][0]["top_logprobs"][1]["logprob"] == -1.25);
  CHECK(chat["content"][0]["top_logprobs"][1]["bytes"] == json::array({0xe2, 0x82}));  // a partial character
  const json comp = logprobs_json(Endpoint::Completion, {7, 7}, {a, a}, piece, 10);
  CHECK(comp["tokens"] == json::array({"ab", "ab"}));
  CHECK(comp["token_logprobs"][1] == -0.5);
  CHECK(comp["text_offset"] == json::array({10, 12}));
  CHECK(comp["top_logprobs"][0]["ab"] == -0.5);
  CHECK(logprobs_json(Endpoint::Chat, {7}, {}, piece).is_null());  // none asked
  // A parse error quoting a 4 MB token is cut to a bounded message.
  const std::string huge = "{\"a\": " + std::string(4 << 20, 'x') + "}";
  const ApiError e = error_of([&] { parse_body(huge); });
  CHECK(e.status == 400);
  CHECK(std::string(e.what()).size() <= kMaxErrorChars + 8);
}

// --- the HTTP layer -------------------------------------------------------------------------------------

namespace {

using specactor::testing::free_port;

int dial(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

void send_all(int fd, const std::string& s) {
  REQUIRE(::send(fd, s.data(), s.size(), MSG_NOSIGNAL) == ssize_t(s.size()));
}

// Everything until the server closes the connection (or 10 s pass).
std::string read_to_close(int fd) {
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  return out;
}

using Clock = std::chrono::steady_clock;

}  // namespace

TEST_CASE("http layer: answers given later from other threads, whole and streamed, reach the client") {
  std::atomic<int> closed_ok{0};
  std::vector<std::thread> workers;
  std::mutex wm;
  http::Limits limits;
  limits.threads = 1;  // one HTTP thread: a waiting exchange must not hold it
  http::Server server(
      limits, [](const http::Request&) { return std::optional<http::Response>(); },
      [&](const http::Request& req, const http::Reply& reply) {
        reply.on_close([&](bool ok) { closed_ok += ok ? 1 : 0; });
        std::lock_guard<std::mutex> lock(wm);
        if (req.path == "/later") {
          workers.emplace_back([reply] {
            std::this_thread::sleep_for(std::chrono::milliseconds(300));
            reply.send({200, "text/plain", "later", {}});
          });
        } else if (req.path == "/stream") {
          reply.stream(200, "text/event-stream");
          workers.emplace_back([reply] {
            for (int i = 0; i < 3; ++i) {
              std::this_thread::sleep_for(std::chrono::milliseconds(50));
              reply.write("part" + std::to_string(i) + ";");
            }
            reply.end();
          });
        } else {
          reply.send({200, "text/plain", "now:" + req.body, {}});
        }
      });
  const int port = free_port();
  server.listen("127.0.0.1", port);

  // While /later waits, the single HTTP thread still answers another connection at once.
  const int slow = dial(port);
  send_all(slow, "GET /later HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto t0 = Clock::now();
  const int quick = dial(port);
  send_all(quick, "POST /now HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello");
  const std::string q = read_to_close(quick);
  CHECK(Clock::now() - t0 < std::chrono::milliseconds(200));
  CHECK(q.find("200 OK") != std::string::npos);
  CHECK(q.find("now:hello") != std::string::npos);
  const std::string later = read_to_close(slow);
  CHECK(later.find("200 OK") != std::string::npos);
  CHECK(later.substr(later.size() - 5) == "later");

  const int st = dial(port);
  send_all(st, "GET /stream HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string body = read_to_close(st);
  CHECK(body.find("Transfer-Encoding: chunked") != std::string::npos);
  const auto p0 = body.find("part0;"), p1 = body.find("part1;"), p2 = body.find("part2;");
  CHECK((p0 != std::string::npos && p0 < p1 && p1 < p2 && p2 != std::string::npos));
  CHECK(body.substr(body.size() - 5) == "0\r\n\r\n");  // the last chunk: the stream ended
  for (auto& w : workers) w.join();
  server.stop();
  CHECK(closed_ok == 3);
}

TEST_CASE("http layer: a client that leaves a waiting exchange ends it (on_close false), deadlines are not extended") {
  std::atomic<int> closed_gone{0};
  std::vector<http::Reply> held;
  std::mutex hm;
  http::Limits limits;
  limits.threads = 2;
  limits.header_timeout_s = 1;
  limits.max_body_bytes = 1000;
  http::Server server(
      limits,
      [](const http::Request& r) {
        return r.path == "/refused" ? std::optional<http::Response>(http::Response{403, "text/plain", "no", {}})
                                    : std::optional<http::Response>();
      },
      [&](const http::Request&, const http::Reply& reply) {
        reply.on_close([&](bool ok) { closed_gone += ok ? 0 : 1; });
        std::lock_guard<std::mutex> lock(hm);
        held.push_back(reply);  // never answered
      });
  const int port = free_port();
  server.listen("127.0.0.1", port);

  const int c = dial(port);
  send_all(c, "GET /wait HTTP/1.1\r\nHost: x\r\n\r\n");
  // Waits for the server to take the request (on a busy machine that can take more than a moment).
  for (const auto taken = Clock::now() + std::chrono::seconds(5); server.open_exchanges() == 0 && Clock::now() < taken;)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(server.open_exchanges() == 1);
  ::close(c);
  // The exchange's close callbacks run before the server's own count drops (both on its thread, a
  // moment apart): wait for all three, so a busy machine does not read in between.
  const auto until = Clock::now() + std::chrono::seconds(3);
  while ((closed_gone == 0 || server.open_exchanges() != 0 || server.stats().clients_gone == 0) && Clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(closed_gone == 1);
  CHECK(server.open_exchanges() == 0);
  CHECK(server.stats().clients_gone == 1);

  // A trickle of header bytes does not extend the header deadline (1 s).
  const int t = dial(port);
  send_all(t, "GET /wait HTTP/1.1\r\n");
  const auto start = Clock::now();
  bool cut = false;
  for (int i = 0; i < 40 && !cut; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    cut = ::send(t, "X: y\r\n", 6, MSG_NOSIGNAL) < 0;
  }
  const double took = std::chrono::duration<double>(Clock::now() - start).count();
  ::close(t);
  CHECK(cut);
  CHECK(took < 3.0);
  CHECK(server.stats().header_timeouts == 1);

  // The precheck refuses before the body; a chunked body over the limit is a 413.
  const int r = dial(port);
  send_all(r, "GET /refused HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  CHECK(read_to_close(r).find("403") != std::string::npos);
  const int big = dial(port);
  std::string chunked = "POST /wait HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 3; ++i) chunked += "200\r\n" + std::string(512, 'a') + "\r\n";
  chunked += "0\r\n\r\n";
  send_all(big, chunked);
  CHECK(read_to_close(big).find("413") != std::string::npos);
  CHECK(server.stats().refused_body_too_large == 1);

  // A second server on the held port is refused, naming the flags.
  http::Server second(
      limits, [](const http::Request&) { return std::optional<http::Response>(); },
      [](const http::Request&, const http::Reply&) {});
  CHECK_THROWS_WITH_AS(second.listen("127.0.0.1", port), doctest::Contains("cannot listen there"),
                       specactor::config::ConfigError);
  // An empty host is refused (getaddrinfo would take it for every interface), as a worker refuses it.
  CHECK_THROWS_WITH_AS(second.listen("", 0), doctest::Contains("--host: an empty address"),
                       specactor::config::ConfigError);
  server.stop();  // the held, never-answered exchanges end too
}

TEST_CASE("http layer: connections beyond the process's file limit are refused, within it the limit is raised") {
  // This test case runs in its own process under CTest; lowering the hard limit stays there.
  rlimit rl{256, 256};
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &rl) == 0);
  std::int64_t have = 0;
  CHECK_FALSE(http::ensure_fd_limit(1000, have));
  CHECK(have == 256 - 128);  // what serve offers instead ("give at most 128")
  rl = {64, 256};
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &rl) == 0);
  CHECK(http::ensure_fd_limit(100, have));  // 100 connections + 128 spare fit under 256: raised
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &rl) == 0);
  CHECK(rl.rlim_cur == 228);
}
