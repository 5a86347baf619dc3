// fuzz/fuzz_head.cpp — what a draft head brings: the first byte picks a --speculative-token-map file
// (text or JSON, read against a 64-token vocabulary), a head's config.json (with a safetensors file
// after "\n--SAFETENSORS--\n"), or a head GGUF file bound against a tiny target's shapes.
#include <filesystem>

#include "fuzz/fuzz_common.hpp"
#include "model/head_model.hpp"
#include "model/llama.hpp"

using namespace specactor;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  model::LlamaConfig target;
  target.vocab_size = 64, target.hidden = 32, target.ffn = 64, target.n_layers = 2, target.n_heads = 4,
  target.n_kv_heads = 2, target.head_dim = 8, target.rope_dim = 8, target.context_length = 128;
  switch (data[0] % 3) {
    case 0:
      fuzz::expect_clean([&] { (void)model::read_token_map(fuzz::write_scratch("map.txt", rest), 64); });
      break;
    case 1: {
      const auto [cfg, st] = fuzz::split2(rest, "\n--SAFETENSORS--\n");
      const auto dir = fuzz::scratch() / "head";
      std::filesystem::create_directories(dir);
      fuzz::write_scratch("head/config.json", cfg);
      fuzz::write_scratch("head/model.safetensors", st);
      fuzz::expect_clean([&] { (void)model::read_head_config(dir.string()); });
      fuzz::expect_clean([&] {
        (void)model::HeadWeights::load(dir.string(), model::HeadKind::Eagle, target, {}, false,
                                       config::LoadFormat::Auto);
      });
      break;
    }
    default: {
      const std::string path = fuzz::write_scratch("head.gguf", rest);
      for (auto kind : {model::HeadKind::Eagle, model::HeadKind::Eagle3, model::HeadKind::Mtp})
        fuzz::expect_clean(
            [&] { (void)model::HeadWeights::load(path, kind, target, {}, false, config::LoadFormat::Auto); });
    }
  }
  return 0;
}
