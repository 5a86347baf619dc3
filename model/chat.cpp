#include "model/chat.hpp"

namespace specactor::model {

std::string_view to_string(ChatFormat f) {
  switch (f) {
    case ChatFormat::ChatML:
      return "chatml";
    case ChatFormat::Llama3:
      return "llama3";
    case ChatFormat::Plain:
      return "plain";
  }
  return "plain";
}

ChatTemplate ChatTemplate::detect(std::string_view t) {
  ChatTemplate c;
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
    case ChatFormat::Plain:
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
