// fuzz/fuzz_tokenizer_json.cpp — arbitrary bytes as a Hugging Face tokenizer.json (first byte's bit 0
// clear: the file is read, and a short text encoded with what it gives), or as text through the tiny
// Qwen2-layout tokenizer.json of tests/data/families (bit 0 set: NFC, the split regexes, the merges, the
// added tokens; bit 1: special tokens parsed), its ids decoded and streamed back.
#include <fstream>
#include <vector>

#include "fuzz/fuzz_common.hpp"
#include "model/tokenizer.hpp"

using namespace specactor;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const auto qwen =
      model::Tokenizer::from_tokenizer_json(SPECACTOR_SOURCE_DIR "/tests/data/families/qwen2/tokenizer.json");
  if (size == 0) return 0;
  const std::uint8_t mode = data[0];
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  fuzz::expect_clean([&] {
    if (mode & 1) {
      const auto ids = qwen->encode(text, false, (mode & 2) != 0);
      model::StreamDecoder d(*qwen);
      std::string streamed;
      for (auto id : ids) streamed += d.push(id);
      streamed += d.finish();
      (void)qwen->decode(ids);
      if (model::complete_utf8_prefix(streamed) != streamed.size()) std::abort();  // never half a character
      return;
    }
    const auto path = fuzz::scratch() / "tokenizer.json";
    std::ofstream(path, std::ios::binary).write(text.data(), static_cast<std::streamsize>(text.size()));
    const auto tok = model::Tokenizer::from_tokenizer_json(path.string());
    (void)tok->decode(tok->encode("Hello  world 123 caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac", true, true));
  });
  return 0;
}
