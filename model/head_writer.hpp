// model/head_writer.hpp — writes randomly initialised draft heads (EAGLE, EAGLE3, MTP) shaped for a
// target model, as GGUF or as a Hugging Face directory (config.json + model.safetensors), so the
// whole head path runs without a trained checkpoint (`specactor make-head`, the tests).
#pragma once

#include <cstdint>
#include <string>

#include "model/head_model.hpp"
#include "model/model_info.hpp"

namespace specactor::model {

struct HeadSpec {
  HeadKind kind = HeadKind::Eagle;
  std::int64_t layers = 1;       // MTP: next-token-prediction layers
  std::int64_t draft_vocab = 0;  // EAGLE3: reduced vocabulary size (0: min(target vocab, 4096))
  bool own_output = false;       // EAGLE/MTP: write an own output head (else the target's is used)
  bool safetensors = false;      // false: one GGUF file; true: a directory with config.json
  std::uint32_t seed = 1;
  float scale = 0.02f;  // weights ~ N(0, scale²); norms are 1
  // Test-only shape breakers (for the error tests): another hidden size, a tensor left out.
  std::int64_t hidden_override = 0;
  std::string drop_tensor;
  // Test-only: an EAGLE head that passes the target's feature through (fc = [0 | I], attention and
  // MLP outputs zero, a unit output norm), so its first draft is the target's own greedy prediction
  // at the feature's position: a check that the right hidden row reaches the right pair.
  bool identity = false;
};

// Writes the head to `out` (a file for GGUF, a directory for safetensors) and returns what it wrote.
HeadConfig write_random_head(const ModelInfo& target, const HeadSpec& spec, const std::string& out);

}  // namespace specactor::model
