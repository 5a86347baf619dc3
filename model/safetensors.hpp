// model/safetensors.hpp — Hugging Face checkpoints: `config.json` + one or more `*.safetensors`
// files (8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets}},
// then the data), memory-mapped and validated like GGUF files.
#pragma once

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "model/gguf.hpp"
#include "model/model_info.hpp"
#include "model/tensor_source.hpp"

namespace specactor::model {

class SafetensorsFile {
 public:
  // Maps and validates one file. Throws GgufError (the model-file error type) naming the file.
  static std::shared_ptr<const SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorView, std::less<>>& tensors() const { return tensors_; }
  const nlohmann::json& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  const std::uint8_t* base_ = nullptr;
  std::size_t size_ = 0;
  void* mapping_ = nullptr;
  std::map<std::string, TensorView, std::less<>> tensors_;
  nlohmann::json metadata_;
};

// All shards of a checkpoint directory (or a single .safetensors file) as one tensor source.
class SafetensorsSource : public TensorSource {
 public:
  static std::shared_ptr<const SafetensorsSource> open(const std::string& path);
  const TensorView* find(std::string_view name) const override;
  const std::string& path() const override { return path_; }
  const std::vector<std::shared_ptr<const SafetensorsFile>>& files() const { return files_; }

 private:
  std::string path_;
  std::vector<std::shared_ptr<const SafetensorsFile>> files_;
};

// ModelInfo of a Llama-family Hugging Face checkpoint from its config.json (directory or file).
ModelInfo read_hf_model_info(const std::string& dir);

// GGUF files as a tensor source.
class GgufSource : public TensorSource {
 public:
  explicit GgufSource(std::shared_ptr<const GgufFile> file);
  const TensorView* find(std::string_view name) const override;
  const std::string& path() const override { return file_->path(); }

 private:
  std::shared_ptr<const GgufFile> file_;
  std::map<std::string, TensorView, std::less<>> views_;
};

}  // namespace specactor::model
