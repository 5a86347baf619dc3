// fuzz/fuzz_gguf.cpp — the GGUF reader on arbitrary bytes, then what a load does with a file that
// parsed: model hyper-parameters, the tokenizer (encoding and decoding a fixed text), a shrink.
#include <vector>

#include "fuzz/fuzz_common.hpp"
#include "model/model_info.hpp"
#include "model/tokenizer.hpp"

using namespace specactor;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::expect_clean([&] {
    const auto f = model::GgufFile::parse(std::vector<std::uint8_t>(data, data + size), "fuzz.gguf");
    fuzz::expect_clean([&] { (void)model::read_model_info(*f); });
    fuzz::expect_clean([&] {
      const auto tok = model::Tokenizer::from_gguf(*f);
      const auto ids = tok->encode("Hello, world! <|im_start|>user\n12345 caf\xc3\xa9", true, true);
      (void)tok->decode(ids);
      model::StreamDecoder d(*tok);
      for (std::int32_t id = 0; id < tok->vocab_size() && id < 300; ++id) (void)d.push(id);
      (void)d.finish();
    });
  });
  return 0;
}
