// model/tensor_source.hpp — a read-only view of named tensors, whatever file format holds them
// (GGUF, or Hugging Face safetensors shards), so weight binding is written once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace specactor::model {

struct TensorView {
  std::string name;
  std::uint32_t ggml_type = 0;      // element format in ggml numbering (F32 = 0, F16 = 1, BF16 = 30, ...)
  std::vector<std::uint64_t> dims;  // ggml order: dims[0] is the contiguous dimension
  const std::uint8_t* data = nullptr;
  std::uint64_t n_bytes = 0;
};

class TensorSource {
 public:
  virtual ~TensorSource() = default;
  virtual const TensorView* find(std::string_view name) const = 0;
  virtual const std::string& path() const = 0;  // for messages
};

}  // namespace specactor::model
