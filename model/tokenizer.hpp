// model/tokenizer.hpp — tokenizers read from GGUF metadata.
//
//   gpt2  : byte-level BPE (GPT-2 / SmolLM / Llama-3): the text is split by the pre-tokenizer regexes
//           of `tokenizer.ggml.pre` (PCRE2 with Unicode properties), each piece's bytes are mapped to
//           printable code points and merged by rank (`tokenizer.ggml.merges`).
//   llama : SentencePiece-style BPE (Llama-2 / TinyLlama / Gemma): spaces become U+2581, pieces merge by
//           score (`tokenizer.ggml.scores`), unknown characters fall back to <0xXX> byte tokens.
// A Hugging Face tokenizer.json gives either kind (model/tokenizer_json.cpp); its SentencePiece-style
// BPE (`byte_fallback`) merges by the rank of its `merges`, as the `tokenizers` package does.
// Special (control / user-defined) tokens are matched literally in the text when asked.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "config/input.hpp"
#include "model/gguf.hpp"

namespace specactor::model {

// Every text a tokenizer encodes is checked (config/input.hpp): PCRE2 runs without its own check.
using config::check_utf8;

struct TextPart {
  std::string text;
  bool marker = false;
};

class Tokenizer {
 public:
  enum class Kind { ByteBpe, SentencePiece };

  // Throws GgufError naming the file and key when the vocabulary is missing or inconsistent.
  static std::shared_ptr<const Tokenizer> from_gguf(const GgufFile& file);
  // A Hugging Face tokenizer.json (byte-level BPE; tokenizer_config.json beside it, when present, gives
  // the end token, BOS and the chat template). Throws GgufError naming the file and field.
  static std::shared_ptr<const Tokenizer> from_tokenizer_json(const std::string& path);
  ~Tokenizer();

  // add_bos: prepend BOS when the model asks for it (tokenizer.ggml.add_bos_token) and the text does
  // not already start with it. parse_special: "<|im_start|>" in the text becomes its special token.
  std::vector<std::int32_t> encode(std::string_view text, bool add_bos = false, bool parse_special = false) const;
  // Parts marked as markers are special tokens written by a template (their token when the
  // vocabulary has it as a special token, else text); every other part is text, never parsed for
  // special tokens (chat message content: "<|im_end|>" typed by a user stays text).
  std::vector<std::int32_t> encode_parts(const std::vector<TextPart>& parts, bool add_bos = false) const;
  std::string decode(const std::vector<std::int32_t>& ids, bool skip_special = false) const;
  // The raw bytes a token stands for (special tokens: their literal text).
  std::string token_bytes(std::int32_t id) const;

  Kind kind() const { return kind_; }
  std::int64_t vocab_size() const { return static_cast<std::int64_t>(tokens_.size()); }
  std::int32_t bos_id() const { return bos_; }
  std::int32_t eos_id() const { return eos_; }
  bool adds_bos() const { return add_bos_; }
  bool is_special(std::int32_t id) const;
  // Tokens that end a generation: EOS plus the end-of-turn tokens present (<|im_end|>, <|eot_id|>, ...).
  const std::vector<std::int32_t>& end_of_generation_ids() const { return eog_; }
  bool is_end_of_generation(std::int32_t id) const;
  std::int32_t find(std::string_view token_text) const;  // -1 when absent
  const std::string& chat_template() const { return chat_template_; }
  const std::string& pre() const { return pre_; }
  // Whether decoding drops the space that encoding put before the first word (SentencePiece's prefix).
  bool strips_leading_space() const { return kind_ == Kind::SentencePiece && (add_space_prefix_ || prepend_each_); }

 private:
  Tokenizer();  // defined where Regex is complete
  std::vector<std::int32_t> encode_piece_bpe(std::string_view piece) const;
  void encode_text_bpe(std::string_view text, std::vector<std::int32_t>& out) const;
  void encode_text_spm(std::string_view text, bool at_start, std::vector<std::int32_t>& out) const;

  static std::shared_ptr<const Tokenizer> read_tokenizer_json(const std::string& path);
  void index_specials();
  void index_byte_tokens();                  // byte_tokens_ from the tokens named <0xXX>
  void add_split(const std::string& regex);  // a pre-tokenizer regex, applied after the earlier ones
  // GGUF token types (llama.cpp's): control tokens only through templates, user-defined ones in text.
  static constexpr int kTypeControl = 3, kTypeUserDefined = 4, kTypeByte = 6;
  struct Regex;
  bool nfc_ = false;            // tokenizer.json normalizer NFC: text pieces are normalized first
  bool ignore_merges_ = false;  // tokenizer.json model.ignore_merges: a piece in the vocabulary is one token
  bool spm_ranked_ = false;     // SentencePiece-style from tokenizer.json: merges by rank, not by score
  bool prepend_each_ = false;   // tokenizer.json normalizer Prepend U+2581: before every text part, not only the first
  Kind kind_ = Kind::ByteBpe;
  std::string pre_;
  std::vector<std::string> tokens_;
  std::vector<std::int32_t> types_;
  std::vector<float> scores_;
  std::unordered_map<std::string, std::int32_t> index_;
  std::unordered_map<std::string, std::int32_t> merge_rank_;  // "left right" -> rank
  std::vector<std::int32_t> special_ids_;                     // longest text first
  std::vector<std::int32_t> user_ids_;                        // the user-defined ones among them
  bool user_first_[256] = {};                                 // first bytes of their texts
  std::vector<std::unique_ptr<Regex>> split_;
  std::int32_t bos_ = -1, eos_ = -1, unk_ = -1;
  bool add_bos_ = false, add_space_prefix_ = true;
  std::vector<std::int32_t> eog_;
  std::int32_t byte_tokens_[256];  // SentencePiece <0xXX> ids (-1 when absent)
  std::string chat_template_;
};

// Streams token ids to text without ever emitting part of a UTF-8 character.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special = true) : tok_(tok), skip_special_(skip_special) {}
  // Text that became complete with this token (possibly empty).
  std::string push(std::int32_t id);
  // Whatever is left (an incomplete sequence at the end becomes U+FFFD).
  std::string finish();

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  std::string pending_;
  bool first_ = true;
};

// Unicode NFC of valid UTF-8 (ICU; ASCII returns as it is).
std::string nfc(std::string_view text);

// Length of the longest prefix of `s` made of complete UTF-8 characters (invalid bytes count as
// complete single characters, so they are never held back forever).
std::size_t complete_utf8_prefix(std::string_view s);

}  // namespace specactor::model
