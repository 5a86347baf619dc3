// tests/support/gguf_writer.hpp — writes GGUF images for tests, including deliberately broken ones
// (it validates nothing: a test can write a wrong version, a bogus type or an offset past the end).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace specactor::testing {

class GgufWriter {
 public:
  std::uint32_t magic = 0x46554747;  // "GGUF"
  std::uint32_t version = 3;
  std::uint64_t alignment = 32;      // used to place tensor data; written only via kv_u32("general.alignment")

  // Metadata.
  void kv_u8(std::string_view key, std::uint8_t v);
  void kv_u32(std::string_view key, std::uint32_t v);
  void kv_i32(std::string_view key, std::int32_t v);
  void kv_u64(std::string_view key, std::uint64_t v);
  void kv_f32(std::string_view key, float v);
  void kv_bool(std::string_view key, bool v);
  void kv_str(std::string_view key, std::string_view v);
  void kv_str_array(std::string_view key, const std::vector<std::string>& v);
  void kv_i32_array(std::string_view key, const std::vector<std::int32_t>& v);
  void kv_f32_array(std::string_view key, const std::vector<float>& v);
  // Any type tag followed by raw value bytes (for unknown types and hand-made corruption).
  void kv_raw(std::string_view key, std::uint32_t type, const std::vector<std::uint8_t>& value_bytes);

  // A tensor: data defaults to zeros of the right size for (type, dims); `offset_override` places
  // the directory offset anywhere (for broken files).
  void tensor(std::string_view name, std::uint32_t ggml_type, std::vector<std::uint64_t> dims,
              std::vector<std::uint8_t> data = {}, std::int64_t offset_override = -1);

  // Test helpers for broken models: drop a tensor, or give it other dims (data resized to match).
  bool remove_tensor(std::string_view name);
  bool reshape_tensor(std::string_view name, std::vector<std::uint64_t> dims);

  std::vector<std::uint8_t> bytes() const;
  void write(const std::string& path) const;

  std::size_t n_kv() const { return kv_count_; }

 private:
  struct Tensor {
    std::string name;
    std::uint32_t type;
    std::vector<std::uint64_t> dims;
    std::vector<std::uint8_t> data;
    std::int64_t offset_override;
  };
  std::vector<std::uint8_t> kv_;
  std::size_t kv_count_ = 0;
  std::vector<Tensor> tensors_;
};

// Byte size of a tensor of `type` and `dims` (0 for unknown types).
std::uint64_t ggml_nbytes(std::uint32_t type, const std::vector<std::uint64_t>& dims);

// Shapes of a small Llama model for tests.
struct TinyLlamaShape {
  std::uint32_t vocab = 64, hidden = 32, ffn = 64, layers = 2, heads = 4, kv_heads = 2, context = 128;
};

// Metadata (and, unless `with_tensors` is false, F32 tensors with seeded random values) of a valid
// tiny Llama model with a byte-level vocabulary.
GgufWriter tiny_llama(const TinyLlamaShape& shape = {}, bool with_tensors = true, std::uint32_t seed = 1);

}  // namespace specactor::testing

namespace specactor::testing {

// A float32 tensor in Hugging Face (row-major, outermost first) shape order.
struct HfTensor {
  std::vector<std::uint64_t> shape;
  std::vector<float> values;
};

// Writes a single-file safetensors checkpoint (F32 tensors, sorted by name).
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, HfTensor>>& tensors);

// A random tiny Llama in Hugging Face naming (+ its config.json text), and the same model as a GGUF
// writer with llama.cpp's names and its Q/K row permutation (so both must give the same logits).
struct TinyPair {
  std::vector<std::pair<std::string, HfTensor>> hf;
  std::string config_json;
  GgufWriter gguf;
};
TinyPair tiny_llama_pair(const TinyLlamaShape& shape = {}, std::uint32_t seed = 3);

}  // namespace specactor::testing
