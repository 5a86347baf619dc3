// model/draft_files.hpp — what the draft-model readers share (heads in head_model.cpp, block drafters in
// block_drafter.cpp): a checkpoint's config.json, its integer fields, and a weight binder that refuses
// NaN/infinite values and can quantize float matrices as it binds them.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/cpu/matmul.hpp"
#include "model/llama.hpp"

namespace specactor::model {

// Whether `path` names a Hugging Face checkpoint (a directory, or a .safetensors file).
bool is_hf_path(const std::string& path);

// The config.json beside (or inside) `path`, as a JSON object. Throws GgufError naming the file.
nlohmann::json read_config_json(const std::string& path);

// A non-negative integer field of a config; `dflt` >= 0 is used when the key is absent, else the key is
// required. Throws GgufError naming `where` and the key.
std::int64_t cfg_int(const nlohmann::json& j, const std::string& where, const char* key, std::int64_t dflt = -1);

// Binds tensors through a WeightBinder, checking every value is finite (a draft with a NaN would
// silently draft garbage, or poison the probabilities rejection sampling divides by). `quantize_to`
// Q8_0 or Q4_1: float matrices are quantized to it at bind time (kept in `owned`); F32 keeps them.
class CheckedBinder {
 public:
  CheckedBinder(WeightBinder& binder, std::string path, kernels::WeightType quantize_to,
                std::vector<std::vector<std::uint8_t>>& owned)
      : b_(binder), path_(std::move(path)), quantize_to_(quantize_to), owned_(owned) {}
  bool has(const std::string& name) const { return b_.has(name); }
  kernels::WeightMatrix matrix(const std::string& name, std::int64_t out, std::int64_t in);
  const float* vector(const std::string& name, std::int64_t n);

 private:
  void check(const std::string& name, const float* v, std::int64_t n) const;
  WeightBinder& b_;
  std::string path_;
  kernels::WeightType quantize_to_;
  std::vector<std::vector<std::uint8_t>>& owned_;
};

// After a decoder layer's attention (att: n rows of the layer's wo input): x += wo·att;
// x += down(silu(gate(y)) · up(y)) with y = ffn_norm(x). Heads and block drafters share it.
struct LayerTailScratch {
  std::vector<float> tmp, xn, gate, up;
};
void layer_tail(const LlamaLayer& ly, std::int64_t n, std::int64_t hidden, std::int64_t ffn, float eps,
                kernels::Precision precision, const float* att, float* x, LayerTailScratch& s);

}  // namespace specactor::model
