// server/structured.cpp — see structured.hpp.
#include "server/structured.hpp"

#include "config/input.hpp"
#include "grammar/grammar.hpp"
#include "server/api_fields.hpp"

namespace specactor::server {

using namespace fields;
using Kind = sched::OutputConstraint::Kind;

namespace {

constexpr std::string_view kOpen = grammar::Grammar::kCallOpen, kClose = grammar::Grammar::kCallClose;

// A schema given in the body: its JSON text (keys in the client's order).
std::string schema_text(const json& v, const std::string& name) {
  if (!v.is_object() && !v.is_boolean()) throw ApiError(400, name + ": expected a JSON Schema object", name);
  return v.dump();
}

// The tools described to the model (a system turn), in the form the tool-call grammar holds it to.
std::string tools_prompt(const json& tools) {
  std::string s =
      "# Tools\n\nYou may call functions to help with the request. They are listed below, one JSON object "
      "per line, each with its name, what it does and a JSON Schema of its parameters:\n<tools>\n";
  for (const auto& t : tools) s += t.dump() + "\n";
  s += "</tools>\n\nTo call a function, write one block per call, exactly:\n<tool_call>\n{\"name\": "
       "\"<function name>\", \"arguments\": <its arguments as a JSON object>}\n</tool_call>";
  return s;
}

}  // namespace

void read_structured(const json& body, ApiRequest& a) {
  sched::OutputConstraint& c = a.request.constraint;
  if (const json* rf = field(body, "response_format")) {
    if (!rf->is_object()) throw ApiError(400, "response_format: expected an object with a \"type\"", "response_format");
    const std::string type = get_string(*rf, "type", "response_format").value_or("");
    if (type == "json_object") {
      c.kind = Kind::JsonObject;
    } else if (type == "json_schema") {
      const json* js = field(*rf, "json_schema");
      if (!js || !js->is_object())
        throw ApiError(400, "response_format.json_schema: expected an object with a \"schema\"", "response_format");
      const json* schema = field(*js, "schema");
      if (!schema) throw ApiError(400, "response_format.json_schema.schema: is required", "response_format");
      get_string(*js, "name", "response_format.json_schema");
      get_bool(*js, "strict", false, "response_format.json_schema");  // honoured always: every answer is held to it
      c.kind = Kind::JsonSchema;
      c.schema = schema_text(*schema, "response_format.json_schema.schema");
    } else if (type != "text") {
      throw ApiError(400, "response_format.type: expected \"text\", \"json_object\" or \"json_schema\"",
                     "response_format");
    }
  }
  const json* tools = field(body, "tools");
  const json* choice = field(body, "tool_choice");
  const bool parallel = get_bool(body, "parallel_tool_calls", true);
  if (!tools || tools->empty()) {
    if (choice && !(choice->is_string() && (*choice == "none" || *choice == "auto")))
      throw ApiError(400, "tool_choice: needs \"tools\"", "tool_choice");
    return;
  }
  if (a.endpoint != Endpoint::Chat) throw ApiError(400, "tools: only the chat endpoint takes tools", "tools");
  if (!tools->is_array()) throw ApiError(400, "tools: expected an array of {\"type\": \"function\", ...}", "tools");
  std::vector<std::string> names, params;
  json described = json::array();
  for (std::size_t i = 0; i < tools->size(); ++i) {
    const json& t = (*tools)[i];
    std::string at = "tools[";
    at.append(std::to_string(i)).append("]");
    if (!t.is_object() || get_string(t, "type", at).value_or("") != "function")
      throw ApiError(400, at + ": expected {\"type\": \"function\", \"function\": {...}}", "tools");
    const json* f = field(t, "function");
    if (!f || !f->is_object()) throw ApiError(400, at + ".function: expected an object", "tools");
    const auto name = get_string(*f, "name", at + ".function");
    if (!name || name->empty()) throw ApiError(400, at + ".function.name: is required", "tools");
    for (const auto& n : names)
      if (n == *name) throw ApiError(400, at + ".function.name: \"" + config::printable(n) + "\" twice", "tools");
    get_string(*f, "description", at + ".function");
    const json* p = field(*f, "parameters");
    names.push_back(*name);
    params.push_back(p ? schema_text(*p, at + ".function.parameters") : "");
    described.push_back(t);
  }
  std::string mode = "auto";
  if (choice && choice->is_string()) {
    mode = choice->get<std::string>();
    if (mode != "none" && mode != "auto" && mode != "required")
      throw ApiError(400, "tool_choice: expected \"none\", \"auto\", \"required\" or a named function", "tool_choice");
  } else if (choice) {
    const json* f = choice->is_object() ? field(*choice, "function") : nullptr;
    const auto name = f && f->is_object() ? get_string(*f, "name", "tool_choice.function") : std::nullopt;
    const auto it = name ? std::find(names.begin(), names.end(), *name) : names.end();
    if (!name || it == names.end())
      throw ApiError(400,
                     "tool_choice: expected {\"type\": \"function\", \"function\": {\"name\"}} naming one of tools",
                     "tool_choice");
    const auto k = static_cast<std::size_t>(it - names.begin());
    names = {names[k]};
    params = {params[k]};
    described = json::array({described[k]});
    mode = "required";
  }
  if (mode == "none") return;  // the tools are not offered: a plain answer
  if (c.active()) throw ApiError(400, "response_format: cannot be combined with tools", "response_format");
  c.kind = Kind::ToolCalls;
  c.tool_names = std::move(names);
  c.tool_parameters = std::move(params);
  c.tools_required = mode == "required";
  c.parallel_tool_calls = parallel;
  auto& msgs = a.request.messages;
  if (!msgs.empty() && msgs.front().role == "system")
    msgs.front().content += "\n\n" + tools_prompt(described);
  else
    msgs.insert(msgs.begin(), {"system", tools_prompt(described)});
  a.tools = true;
}

void read_generate_structured(const json& sp, ApiRequest& a) {
  for (const char* refused : {"regex", "ebnf", "structural_tag"})
    if (field(sp, refused))
      throw ApiError(400, std::string("sampling_params.") + refused + ": not supported (use json_schema)",
                     std::string("sampling_params.") + refused);
  if (const auto s = get_string(sp, "json_schema", "sampling_params")) {
    a.request.constraint.kind = Kind::JsonSchema;
    a.request.constraint.schema = *s;
  }
}

void read_tool_message(const json& m, const std::string& at, std::string& role, std::string& content) {
  if (role == "tool") {  // a function's result, in a user turn as the tools prompt describes
    role = "user";
    content = "<tool_response>\n" + content + "\n</tool_response>";
    return;
  }
  const json* calls = field(m, "tool_calls");
  if (role != "assistant" || !calls) return;
  if (!calls->is_array()) throw ApiError(400, at + ".tool_calls: expected an array", "messages");
  for (std::size_t i = 0; i < calls->size(); ++i) {
    std::string cat = at + ".tool_calls[";
    cat.append(std::to_string(i)).append("]");
    const json& c = (*calls)[i];
    const json* f = c.is_object() ? field(c, "function") : nullptr;
    if (!f || !f->is_object()) throw ApiError(400, cat + ".function: expected an object", "messages");
    const auto name = get_string(*f, "name", cat + ".function");
    const auto args = get_string(*f, "arguments", cat + ".function");
    if (!name) throw ApiError(400, cat + ".function.name: is required", "messages");
    const json parsed = args ? json::parse(*args, nullptr, false) : json::object();
    if (parsed.is_discarded())
      throw ApiError(400, cat + ".function.arguments: expected a JSON object as a string", "messages");
    if (!content.empty()) content += "\n";
    content += std::string(kOpen) + json{{"name", *name}, {"arguments", parsed}}.dump() + std::string(kClose);
  }
}

ToolAnswer split_tool_calls(const std::string& text, const std::string& id_prefix) {
  ToolAnswer out;
  ToolStream s(id_prefix);
  out.content = s.push(text, out.calls);
  out.content += s.finish(out.calls);
  return out;
}

json tool_calls_json(const std::vector<ToolCall>& calls, bool streamed, std::size_t first) {
  json arr = json::array();
  for (std::size_t i = 0; i < calls.size(); ++i) {
    json c;
    if (streamed) c["index"] = first + i;
    c["id"] = calls[i].id;
    c["type"] = "function";
    c["function"] = {{"name", calls[i].name}, {"arguments", calls[i].arguments}};
    arr.push_back(std::move(c));
  }
  return arr;
}

std::string ToolStream::push(const std::string& text, std::vector<ToolCall>& calls) {
  held_ += text;
  std::string content;
  if (!in_calls_) {
    const std::size_t open = held_.find(kOpen.substr(0, kOpen.size() - 1));  // "<tool_call>" (its "\n" may lag)
    if (open == std::string::npos) {
      // Hold back a tail that could still become "<tool_call>".
      std::size_t keep = 0;
      for (std::size_t k = std::min(held_.size(), kOpen.size() - 1); k > 0 && keep == 0; --k)
        if (held_.compare(held_.size() - k, k, kOpen.substr(0, k)) == 0) keep = k;
      std::size_t cut = held_.size() - keep;  // and trailing blanks (trimmed if a call follows them)
      while (cut > 0 && (held_[cut - 1] == ' ' || held_[cut - 1] == '\n')) --cut;
      content = held_.substr(0, cut);
      held_.erase(0, cut);
      return content;
    }
    content = held_.substr(0, open);
    while (!content.empty() && (content.back() == '\n' || content.back() == ' ')) {
      gap_.insert(gap_.begin(), content.back());
      content.pop_back();
    }
    held_.erase(0, open);
    in_calls_ = true;
  }
  // Complete blocks: <tool_call>\n{...}\n</tool_call>
  for (;;) {
    const std::size_t start = held_.find(kOpen);
    const std::size_t end = start == std::string::npos ? start : held_.find(kClose, start);
    if (end == std::string::npos) break;
    const std::string body = held_.substr(start + kOpen.size(), end - start - kOpen.size());
    held_.erase(0, end + kClose.size());
    const json call = json::parse(body, nullptr, false);
    if (call.is_discarded() || !call.is_object() || !call.contains("name")) continue;  // not a call after all
    ToolCall c;
    c.id = id_prefix_ + "-call-" + std::to_string(sent_++);
    c.name = call["name"].is_string() ? call["name"].get<std::string>() : call["name"].dump();
    c.arguments = call.contains("arguments") ? call["arguments"].dump() : "{}";
    calls.push_back(std::move(c));
  }
  return content;
}

std::string ToolStream::finish(std::vector<ToolCall>& calls) {
  std::string rest = push("", calls);
  // What is left: an unfinished call (the answer hit its length) is not content; text that only began
  // like one ("<tool_call>" without its newline, never constrained) is.
  if (!in_calls_ || held_.rfind(kOpen, 0) != 0) rest += (in_calls_ && calls.empty() && sent_ == 0 ? gap_ : "") + held_;
  held_.clear();
  return rest;
}

std::string ChatStream::events(const sched::TokenEvent& ev, const json& lp) {
  std::string reason = ev.finished ? ev.finish_reason : "";
  std::string text = ev.text;
  std::vector<ToolCall> calls;
  if (tools_) {
    text = calls_.push(ev.text, calls);
    if (ev.finished) text += calls_.finish(calls);
    if (reason == "stop" && calls_.calls_sent() > 0) reason = "tool_calls";
  }
  std::string out;
  if (!text.empty() || first_ || !ev.logprobs.empty() || (ev.finished && calls.empty())) {
    const bool split = ev.finished && (!text.empty() || !calls.empty());  // the finish reason in a chunk of its own
    out += sse_event(chat_chunk(id_, created_, model_, text, first_, split ? "" : reason, lp));
    first_ = false;
    if (split && calls.empty()) out += sse_event(chat_chunk(id_, created_, model_, "", false, reason));
  }
  if (!calls.empty()) {
    json chunk = chat_chunk(id_, created_, model_, "", first_, "");
    first_ = false;
    chunk["choices"][0]["delta"].erase("content");
    chunk["choices"][0]["delta"]["tool_calls"] = tool_calls_json(calls, true, calls_.calls_sent() - calls.size());
    out += sse_event(chunk);
    if (ev.finished) out += sse_event(chat_chunk(id_, created_, model_, "", false, reason));
  }
  return out;
}

json chat_message(const Outcome& o, const std::string& id, std::string& finish_reason) {
  finish_reason = openai_finish_reason(o.finish_reason);
  if (!o.tools) return {{"role", "assistant"}, {"content", o.text}};
  ToolAnswer a = split_tool_calls(o.text, id);
  json m = {{"role", "assistant"},
            {"content", a.content.empty() && !a.calls.empty() ? json(nullptr) : json(a.content)}};
  if (!a.calls.empty()) {
    m["tool_calls"] = tool_calls_json(a.calls, false);
    if (finish_reason == "stop") finish_reason = "tool_calls";
  }
  return m;
}

}  // namespace specactor::server
