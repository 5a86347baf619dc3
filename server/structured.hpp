// server/structured.hpp — structured output and tool calling in the OpenAI API: `response_format`
// (json_object, json_schema), `tools` / `tool_choice` / `parallel_tool_calls` read into the request's
// sched::OutputConstraint (the engine holds every token to it); the tools described to the model in a
// system turn; tool calls and tool results in the conversation; and the answer's
// <tool_call>…</tool_call> blocks turned into OpenAI `tool_calls`, whole or streamed. Pure functions
// (tests/test_server.cpp).
#pragma once

#include <string>
#include <vector>

#include "server/api.hpp"

namespace specactor::server {

// response_format: {"type": "text" | "json_object" | "json_schema", "json_schema": {"name", "schema",
// "strict"}}; with the chat endpoint also tools, tool_choice ("none" | "auto" | "required" |
// {"type": "function", "function": {"name"}}) and parallel_tool_calls. A 400 naming the field for
// anything malformed or unsupported (a schema keyword the grammar does not honour among them).
void read_structured(const json& body, ApiRequest& a);

// sglang's /generate: sampling_params.json_schema (the schema as a string); regex and ebnf are refused.
void read_generate_structured(const json& sampling_params, ApiRequest& a);

// A chat message that is a tool's result (role "tool") or an assistant turn with tool_calls, as the
// model reads it (the result in a user turn inside <tool_response>, the calls as <tool_call> blocks).
// `role` and `content` are the message's as read so far; `at` names it for errors.
void read_tool_message(const json& m, const std::string& at, std::string& role, std::string& content);

struct ToolCall {
  std::string id, name, arguments;  // arguments: the JSON text of the arguments object
};

// The answer's text split into what it says and the calls it makes (text after the first call's
// opening is never content).
struct ToolAnswer {
  std::string content;
  std::vector<ToolCall> calls;
};
ToolAnswer split_tool_calls(const std::string& text, const std::string& id_prefix);

// OpenAI's "tool_calls" array (streamed chunks number them with "index" from `first`).
json tool_calls_json(const std::vector<ToolCall>& calls, bool streamed, std::size_t first = 0);

// A streamed answer with tools: content is passed on until a call may begin, calls are sent once each
// block is complete.
class ToolStream {
 public:
  explicit ToolStream(std::string id_prefix) : id_prefix_(std::move(id_prefix)) {}
  // New text; returns the content that can be sent now and appends completed calls to `calls`.
  std::string push(const std::string& text, std::vector<ToolCall>& calls);
  // The end: what is left as content (text that looked like the start of a call, but was not).
  std::string finish(std::vector<ToolCall>& calls);
  std::size_t calls_sent() const { return sent_; }

 private:
  std::string id_prefix_, held_, gap_;  // gap_: blanks trimmed before the first call
  bool in_calls_ = false;
  std::size_t sent_ = 0;
};

// A streamed chat answer's chunks, event by event: the role first, content, each tool call once its
// block is complete (requests with tools), the finish reason ("tool_calls" when calls were made).
class ChatStream {
 public:
  ChatStream(std::string id, std::int64_t created, std::string model, bool tools)
      : id_(std::move(id)), model_(std::move(model)), created_(created), tools_(tools), calls_(id_) {}
  // The SSE events for one engine event (not its usage chunk, not [DONE]).
  std::string events(const sched::TokenEvent& ev, const json& logprobs);

 private:
  std::string id_, model_;
  std::int64_t created_;
  bool tools_, first_ = true;
  ToolStream calls_;
};

// A whole chat answer's "message" (and its finish reason, "tool_calls" when it made calls).
json chat_message(const Outcome& o, const std::string& id, std::string& finish_reason);

}  // namespace specactor::server
