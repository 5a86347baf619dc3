#include "model/chat.hpp"

#include <utility>

#include "config/error.hpp"
#include "config/input.hpp"

namespace specactor::model {

std::string_view to_string(ChatFormat f) {
  switch (f) {
    case ChatFormat::ChatML:
      return "chatml";
    case ChatFormat::Llama3:
      return "llama3";
    case ChatFormat::Gemma:
      return "gemma";
    case ChatFormat::Plain:
      return "plain";
    case ChatFormat::None:
      return "none";
  }
  return "none";
}

ChatTemplate ChatTemplate::choose(std::string_view setting, std::string_view t) {
  ChatTemplate c = detect(t);
  if (setting == "auto" || setting.empty()) return c;
  ChatTemplate forced;
  forced.model_template = c.model_template;
  if (setting == "chatml") {
    forced = c.format == ChatFormat::ChatML ? c : forced;  // keeps the model's default system turn
    forced.format = ChatFormat::ChatML;
  } else if (setting == "llama3") {
    forced.format = ChatFormat::Llama3;
  } else if (setting == "gemma") {
    forced.format = ChatFormat::Gemma;
  } else if (setting == "plain") {
    forced.format = ChatFormat::Plain;
  } else {
    throw config::ConfigError("--chat-template: expected one of auto|chatml|llama3|gemma|plain, got '" +
                              config::printable(std::string(setting)) + "'");
  }
  return forced;
}

std::string ChatTemplate::unusable_reason() const {
  if (format != ChatFormat::None) return "";
  if (model_template.empty())
    return "the model has no chat template (a base model?): send a completion, or start with --chat-template "
           "chatml|llama3|gemma|plain";
  return "the model's chat template is not one specactor renders (ChatML, Llama-3, Gemma): start with "
         "--chat-template chatml|llama3|gemma|plain, whichever the model was trained with";
}

ChatTemplate ChatTemplate::detect(std::string_view t) {
  ChatTemplate c;
  c.model_template = std::string(t);
  c.format = ChatFormat::None;
  if (t.find("<|im_start|>") != std::string_view::npos) {
    c.format = ChatFormat::ChatML;
    // SmolLM-style templates insert a literal default system turn: '<|im_start|>system\n...<|im_end|>'.
    const std::string_view open = "<|im_start|>system\n";
    const auto a = t.find(open);
    if (a != std::string_view::npos) {
      const auto b = t.find("<|im_end|>", a + open.size());
      const std::string_view body = t.substr(a + open.size(), b == std::string_view::npos ? 0 : b - a - open.size());
      // Only a literal text (no Jinja expression inside) counts as a default.
      if (b != std::string_view::npos && body.find("{{") == std::string_view::npos &&
          body.find('\'') == std::string_view::npos && body.find("' +") == std::string_view::npos)
        c.default_system = std::string(body);
    }
  } else if (t.find("<|start_header_id|>") != std::string_view::npos) {
    c.format = ChatFormat::Llama3;
  } else if (t.find("<start_of_turn>") != std::string_view::npos) {
    c.format = ChatFormat::Gemma;
  }
  return c;
}

std::vector<TextPart> ChatTemplate::render_parts(const std::vector<ChatMessage>& messages,
                                                 bool add_generation_prompt) const {
  std::vector<TextPart> out;
  auto marker = [&](const char* m) { out.push_back({m, true}); };
  auto text = [&](std::string t) {
    if (!t.empty()) out.push_back({std::move(t), false});
  };
  switch (format) {
    case ChatFormat::ChatML:
      if (!default_system.empty() && (messages.empty() || messages.front().role != "system")) {
        marker("<|im_start|>");
        text("system\n" + default_system);
        marker("<|im_end|>");
        text("\n");
      }
      for (const auto& m : messages) {
        marker("<|im_start|>");
        text(m.role + "\n" + m.content);
        marker("<|im_end|>");
        text("\n");
      }
      if (add_generation_prompt) {
        marker("<|im_start|>");
        text("assistant\n");
      }
      break;
    case ChatFormat::Llama3:
      marker("<|begin_of_text|>");
      for (const auto& m : messages) {
        marker("<|start_header_id|>");
        text(m.role);
        marker("<|end_header_id|>");
        text("\n\n" + m.content);
        marker("<|eot_id|>");
      }
      if (add_generation_prompt) {
        marker("<|start_header_id|>");
        text("assistant");
        marker("<|end_header_id|>");
        text("\n\n");
      }
      break;
    case ChatFormat::Gemma: {
      // Gemma's turns: user and model only; a system turn's text opens the first user turn.
      std::string pending_system;
      for (const auto& m : messages) {
        if (m.role == "system") {
          pending_system += m.content + "\n\n";
          continue;
        }
        marker("<start_of_turn>");
        text((m.role == "assistant" ? std::string("model") : m.role) + "\n" +
             (m.role == "user" ? std::exchange(pending_system, std::string()) : std::string()) + m.content);
        marker("<end_of_turn>");
        text("\n");
      }
      if (!pending_system.empty()) {  // only a system turn: it becomes the user turn
        marker("<start_of_turn>");
        text("user\n" + pending_system.substr(0, pending_system.size() - 2));
        marker("<end_of_turn>");
        text("\n");
      }
      if (add_generation_prompt) {
        marker("<start_of_turn>");
        text("model\n");
      }
      break;
    }
    case ChatFormat::Plain:
    case ChatFormat::None:
      for (std::size_t i = 0; i < messages.size(); ++i) text((i ? "\n\n" : "") + messages[i].content);
      if (add_generation_prompt && !messages.empty()) text("\n\n");
      break;
  }
  return out;
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  std::string out;
  for (const auto& p : render_parts(messages, add_generation_prompt)) out += p.text;
  return out;
}

}  // namespace specactor::model
