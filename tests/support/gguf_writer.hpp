// tests/support/gguf_writer.hpp — writes GGUF images for tests, including deliberately broken ones
// (it validates nothing: a test can write a wrong version, a bogus type or an offset past the end).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/writers.hpp"

namespace specactor::testing {

using model::ggml_nbytes;
using model::GgufWriter;
using model::HfTensor;
using model::write_safetensors;

// Shapes of a small Llama model for tests.
struct TinyLlamaShape {
  std::uint32_t vocab = 64, hidden = 32, ffn = 64, layers = 2, heads = 4, kv_heads = 2, context = 128;
  float rope_base = 10000.0f, norm_eps = 1e-5f;
  // The vocabulary: "t0", "t1", … (no text encodes to them), or with `text_vocab` <unk> <s> </s>, the
  // byte-level space "Ġ", a–z, A–Z and digits (so a CLI prompt of those characters encodes; vocab ≥ 64).
  bool text_vocab = false;
};

// A tiny shape whose head counts and MLP width divide by 2 and by 3, with column shards on 32-element
// block boundaries (hidden 192 = 6 heads × 32, 6 KV heads, MLP 384): the tensor-parallel tests.
inline TinyLlamaShape tp_divisible_shape() {
  TinyLlamaShape s;
  s.vocab = 96;
  s.hidden = 192;
  s.ffn = 384;
  s.heads = 6;
  s.kv_heads = 6;
  return s;
}

// Metadata (and, unless `with_tensors` is false, F32 tensors with seeded random values) of a valid
// tiny Llama model with a byte-level vocabulary.
GgufWriter tiny_llama(const TinyLlamaShape& shape = {}, bool with_tensors = true, std::uint32_t seed = 1);

}  // namespace specactor::testing

namespace specactor::testing {

// A random tiny Llama in Hugging Face naming (+ its config.json text), and the same model as a GGUF
// writer with llama.cpp's names and its Q/K row permutation (so both must give the same logits).
struct TinyPair {
  std::vector<std::pair<std::string, HfTensor>> hf;
  std::string config_json;
  GgufWriter gguf;
};
TinyPair tiny_llama_pair(const TinyLlamaShape& shape = {}, std::uint32_t seed = 3);

}  // namespace specactor::testing
