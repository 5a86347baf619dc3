// fuzz/fuzz_safetensors.cpp — a Hugging Face checkpoint directory from arbitrary bytes:
// input = config.json text, the separator "\n--SAFETENSORS--\n", then the model.safetensors bytes.
#include "fuzz/fuzz_common.hpp"
#include "model/safetensors.hpp"

using namespace specactor;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const auto [cfg, st] = fuzz::split2(in, "\n--SAFETENSORS--\n");
  fuzz::write_scratch("config.json", cfg);
  const std::string model = fuzz::write_scratch("model.safetensors", st);
  fuzz::expect_clean([&] { (void)model::read_hf_model_info(model); });
  fuzz::expect_clean([&] {
    const auto src = model::SafetensorsSource::open(fuzz::scratch().string());
    for (const auto& f : src->files())
      for (const auto& [name, t] : f->tensors()) (void)src->find(name);
  });
  return 0;
}
