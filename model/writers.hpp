// model/writers.hpp — writes GGUF and safetensors files: test models, randomly initialised draft heads
// (specactor make-head). The GGUF writer validates nothing, so tests can also write broken files on
// purpose (a wrong version, a bogus type, an offset past the end).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace specactor::model {

class GgufWriter {
 public:
  std::uint32_t magic = 0x46554747;  // "GGUF"
  std::uint32_t version = 3;
  std::uint64_t alignment = 32;  // used to place tensor data; written only via kv_u32("general.alignment")

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

class GgufFile;
// Writes `in` with only its first `layers` transformer blocks: every metadata entry copied, the
// architecture's block_count set to `layers`, the tensors of blocks >= layers left out, all others
// copied byte for byte. A smaller real-weight model (`specactor shrink`), e.g. for a machine that
// cannot receive the whole file. Throws GgufError when `in` has no block_count or fewer blocks.
void write_first_layers(const GgufFile& in, std::int64_t layers, const std::string& out);

// Byte size of a tensor of `type` and `dims` (0 for unknown types).
std::uint64_t ggml_nbytes(std::uint32_t type, const std::vector<std::uint64_t>& dims);

// A float32 tensor in Hugging Face (row-major, outermost first) shape order.
struct HfTensor {
  std::vector<std::uint64_t> shape;
  std::vector<float> values;
};

// Writes a single-file safetensors checkpoint (F32 tensors, sorted by name).
// `d2t`, when given, is added as the I64 tensor "d2t" (EAGLE3's draft-to-target offsets).
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, HfTensor>>& tensors,
                       const std::vector<std::int64_t>& d2t = {});

// A tensor of any safetensors dtype ("F16", "I32", "U8", ...): shape and its little-endian bytes.
struct RawTensor {
  std::string name, dtype;
  std::vector<std::uint64_t> shape;
  std::vector<std::uint8_t> bytes;
};
// Writes `tensors` (in the given order) with `metadata` (string values) to `path` through a
// temporary file renamed into place, so a reader never sees half a file. Throws std::runtime_error.
void write_safetensors_raw(const std::string& path, const std::vector<RawTensor>& tensors,
                           const std::map<std::string, std::string>& metadata = {});

}  // namespace specactor::model
