#include "model/chat.hpp"

namespace specactor::model {

std::string_view to_string(ChatFormat f) {
  switch (f) {
    case ChatFormat::ChatML: return "chatml";
    case ChatFormat::Llama3: return "llama3";
    case ChatFormat::Plain: return "plain";
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

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  std::string out;
  switch (format) {
    case ChatFormat::ChatML:
      if (!default_system.empty() && (messages.empty() || messages.front().role != "system"))
        out += "<|im_start|>system\n" + default_system + "<|im_end|>\n";
      for (const auto& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      break;
    case ChatFormat::Llama3:
      out += "<|begin_of_text|>";
      for (const auto& m : messages)
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + m.content + "<|eot_id|>";
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
    case ChatFormat::Plain:
      for (std::size_t i = 0; i < messages.size(); ++i) out += (i ? "\n\n" : "") + messages[i].content;
      if (add_generation_prompt && !messages.empty()) out += "\n\n";
      break;
  }
  return out;
}

}  // namespace specactor::model
