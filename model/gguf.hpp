// model/gguf.hpp — a validating, memory-mapped reader of GGUF v2/v3 files (header, key/values,
// tensor directory). Every malformation is a GgufError naming the file and what is wrong; nothing
// in a file can make the reader read past the mapping.
//
// Layout (little endian): "GGUF" u32 version u64 n_tensors u64 n_kv, n_kv × (string key, u32 type,
// value), n_tensors × (string name, u32 n_dims, u64 dims[n_dims], u32 ggml_type, u64 offset), padding
// to `general.alignment` (default 32), then the tensor data; offsets are relative to its start.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace specactor::model {

class GgufError : public std::runtime_error {
 public:
  explicit GgufError(const std::string& what) : std::runtime_error(what) {}
};

// Metadata value types (the GGUF spec's numbering).
enum class GgufType : std::uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  Bool = 7,
  String = 8,
  Array = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};
std::string_view gguf_type_name(GgufType t);
// Bytes of one scalar of a numeric/bool type (0 for strings and arrays).
std::size_t gguf_scalar_size(GgufType t);

// Tensor element types (ggml's numbering). Only the ones with a known block layout are accepted.
enum class GgmlType : std::uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  BF16 = 30,
};
struct GgmlTypeInfo {
  std::string_view name;
  std::uint32_t block_elems;  // elements per block
  std::uint32_t block_bytes;  // bytes per block
};
// Layout of a ggml type; nullptr for types this reader does not know.
const GgmlTypeInfo* ggml_type_info(std::uint32_t type);

struct GgufValue {
  GgufType type = GgufType::U8;
  // Scalars (and strings) when type != Array. Strings point into the mapping.
  std::variant<std::uint64_t, std::int64_t, double, bool, std::string_view> scalar;
  // Arrays: element type and count; numeric elements stay in the mapping (`raw`, unaligned),
  // strings are listed, nested arrays are parsed recursively.
  GgufType elem_type = GgufType::U8;
  std::uint64_t count = 0;
  const std::uint8_t* raw = nullptr;
  std::vector<std::string_view> strings;
  std::vector<GgufValue> nested;
};

struct GgufTensorInfo {
  std::string name;
  GgmlType type;
  std::vector<std::uint64_t> dims;  // ggml order: dims[0] is the contiguous (row) dimension
  std::uint64_t offset = 0;         // relative to the data section
  std::uint64_t n_elements = 0;
  std::uint64_t n_bytes = 0;
  const std::uint8_t* data = nullptr;  // into the mapping
};

class GgufFile {
 public:
  // Maps and validates `path`. Throws GgufError.
  static std::shared_ptr<const GgufFile> open(const std::string& path);
  // Validates an in-memory image, which the returned object keeps; `name` is used in messages.
  static std::shared_ptr<const GgufFile> parse(std::vector<std::uint8_t> image, std::string name);

  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  std::uint32_t version() const { return version_; }
  std::uint64_t alignment() const { return alignment_; }
  std::size_t file_size() const { return size_; }
  std::uint64_t data_offset() const { return data_offset_; }

  const std::map<std::string, GgufValue, std::less<>>& metadata() const { return kv_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;

  bool has(std::string_view key) const { return kv_.find(key) != kv_.end(); }
  // Typed getters: GgufError naming the file and key when missing or of another type.
  std::uint64_t get_uint(std::string_view key) const;  // any unsigned/non-negative integer type
  std::int64_t get_int(std::string_view key) const;    // any integer type
  double get_float(std::string_view key) const;        // F32/F64 (integers accepted)
  bool get_bool(std::string_view key) const;
  std::string_view get_string(std::string_view key) const;
  const std::vector<std::string_view>& get_string_array(std::string_view key) const;
  std::vector<std::int64_t> get_int_array(std::string_view key) const;
  std::vector<double> get_float_array(std::string_view key) const;
  const GgufValue& get(std::string_view key) const;

 private:
  GgufFile() = default;
  void parse_all();
  [[noreturn]] void fail(const std::string& what) const;

  std::string path_;
  const std::uint8_t* base_ = nullptr;
  std::size_t size_ = 0;
  void* mapping_ = nullptr;          // non-null when this object owns an mmap
  std::vector<std::uint8_t> image_;  // the bytes, when parsed from memory
  std::uint32_t version_ = 0;
  std::uint64_t alignment_ = 32;
  std::uint64_t data_offset_ = 0;
  std::map<std::string, GgufValue, std::less<>> kv_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, std::size_t, std::less<>> tensor_index_;
};

}  // namespace specactor::model
