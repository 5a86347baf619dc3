// fuzz/fuzz_tokenizer.cpp — arbitrary bytes through both tokenizer kinds and the chat templates.
// The first byte picks what runs: bit 0 the vocabulary (byte-level BPE or SentencePiece), bit 1
// special-token parsing, bit 2 a chat render (the rest split at the first NUL into system and user
// text; a template is also detected from the user text itself).
#include <vector>

#include "fuzz/fuzz_common.hpp"
#include "model/chat.hpp"
#include "model/tokenizer.hpp"
#include "model/writers.hpp"

using namespace specactor;

namespace {

std::shared_ptr<const model::Tokenizer> make(bool spm) {
  model::GgufWriter w;
  std::vector<std::string> tokens = {"<|im_start|>", "<|im_end|>", "<s>", "</s>"};
  std::vector<std::int32_t> types = {3, 3, 3, 3};
  if (!spm) {
    // Printable ASCII stands for itself in GPT-2's byte map; "Ġ" (U+0120) is the space.
    for (char c = '!'; c <= '~'; ++c) tokens.emplace_back(1, c), types.push_back(1);
    const std::vector<std::string> merges = {"\xc4\xa0 t", "t h", "\xc4\xa0t h", "h e",
                                             "i n",        "e r", "a n",         "\xc4\xa0 a"};
    for (const auto& m : merges) {
      const auto sp = m.find(' ');
      tokens.push_back(m.substr(0, sp) + m.substr(sp + 1));
      types.push_back(1);
    }
    tokens.emplace_back("\xc4\xa0"), types.push_back(1);
    w.kv_str("tokenizer.ggml.model", "gpt2");
    w.kv_str_array("tokenizer.ggml.merges", merges);
  } else {
    std::vector<float> scores(tokens.size(), 0.0f);
    for (const char* t : {"\xe2\x96\x81", "a", "b",
                          "\xe2\x96\x81"
                          "a",
                          "ab", "ba",
                          "\xe2\x96\x81"
                          "ab"}) {
      tokens.emplace_back(t);
      types.push_back(1);
      scores.push_back(-static_cast<float>(tokens.size()));
    }
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      tokens.emplace_back(name);
      types.push_back(6);
      scores.push_back(0);
    }
    w.kv_str("tokenizer.ggml.model", "llama");
    w.kv_f32_array("tokenizer.ggml.scores", scores);
  }
  w.kv_str_array("tokenizer.ggml.tokens", tokens);
  w.kv_i32_array("tokenizer.ggml.token_type", types);
  w.kv_u32("tokenizer.ggml.bos_token_id", 2);
  return model::Tokenizer::from_gguf(*model::GgufFile::parse(w.bytes(), spm ? "spm.gguf" : "bpe.gguf"));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const auto bpe = make(false), spm = make(true);
  if (size == 0) return 0;
  const std::uint8_t mode = data[0];
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const model::Tokenizer& tok = (mode & 1) ? *spm : *bpe;
  fuzz::expect_clean([&] {
    std::vector<std::int32_t> ids;
    if (mode & 4) {
      const auto [system, user] = fuzz::split2(text, std::string_view("\0", 1));
      model::ChatTemplate chat = model::ChatTemplate::detect(user);
      if (chat.format == model::ChatFormat::None) chat = model::ChatTemplate::detect("<|im_start|>");
      model::check_utf8(system);
      model::check_utf8(user);
      ids = tok.encode_parts(chat.render_parts({{"system", std::string(system)}, {"user", std::string(user)}}), true);
    } else {
      ids = tok.encode(text, true, (mode & 2) != 0);
    }
    model::StreamDecoder d(tok);
    std::string streamed;
    for (auto id : ids) streamed += d.push(id);
    streamed += d.finish();
    (void)tok.decode(ids);
    if (model::complete_utf8_prefix(streamed) != streamed.size()) std::abort();  // never half a character
  });
  return 0;
}
