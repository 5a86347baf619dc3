// model/chat.hpp — chat formatting chosen from the model's `tokenizer.chat_template`.
// Jinja is not interpreted: the template is recognised (ChatML, Llama-3, Gemma) and rendered natively;
// a model without a template, or with another one, has no chat format until --chat-template names one
// (chat requests are refused with that advice, never rendered as guesswork).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "model/tokenizer.hpp"

namespace specactor::model {

enum class ChatFormat { ChatML, Llama3, Gemma, Plain, None };
std::string_view to_string(ChatFormat f);

struct ChatMessage {
  std::string role;  // system | user | assistant
  std::string content;
};

struct ChatTemplate {
  ChatFormat format = ChatFormat::Plain;
  std::string default_system;  // system turn the template inserts when the conversation has none

  static ChatTemplate detect(std::string_view jinja_template);
  // The format --chat-template asks for: "auto" = detect(jinja_template), else that format (throws
  // config::ConfigError on an unknown name).
  static ChatTemplate choose(std::string_view setting, std::string_view jinja_template);
  // Why chat requests cannot be formatted ("" when they can): names what the model has and the flag.
  std::string unusable_reason() const;
  std::string model_template;  // what the model's metadata held (empty: none)
  // The prompt as parts: the template's special tokens are markers, everything else (the template's
  // text and the messages' content) is text (Tokenizer::encode_parts).
  std::vector<TextPart> render_parts(const std::vector<ChatMessage>& messages, bool add_generation_prompt = true) const;
  // The same parts joined into one string (for display).
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt = true) const;
};

}  // namespace specactor::model
