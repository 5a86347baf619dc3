// model/family.cpp — the family table.
#include "model/family.hpp"

#include <array>

namespace specactor::model {

namespace {

constexpr std::array<FamilyDesc, 4> kFamilies = [] {
  std::array<FamilyDesc, 4> t{};
  t[0].family = Family::Llama;
  t[0].name = "llama";
  t[0].hf_types = "llama mistral";

  t[1].family = Family::Qwen2;
  t[1].name = "qwen2";
  t[1].hf_types = "qwen2";
  t[1].qkv_bias = true;
  t[1].gguf_neox = true;

  t[2].family = Family::Qwen3;
  t[2].name = "qwen3";
  t[2].hf_types = "qwen3";
  t[2].qk_norm = true;
  t[2].gguf_neox = true;

  t[3].family = Family::Gemma3;
  t[3].name = "gemma3";
  t[3].hf_types = "gemma3_text";
  t[3].qk_norm = true;
  t[3].sandwich_norms = true;
  t[3].hf_norm_plus_one = true;
  t[3].gelu_tanh = true;
  t[3].embed_scale = true;
  t[3].gguf_neox = true;
  t[3].sliding_layers = true;
  t[3].hf_tied_default = true;
  t[3].hf_ffn_norm = "pre_feedforward_layernorm.weight";
  t[3].hf_post_attn_norm = "post_attention_layernorm.weight";
  t[3].hf_post_ffn_norm = "post_feedforward_layernorm.weight";
  return t;
}();

bool listed(std::string_view list, std::string_view word) {
  while (!list.empty()) {
    const auto sp = list.find(' ');
    if (list.substr(0, sp) == word) return true;
    if (sp == std::string_view::npos) break;
    list.remove_prefix(sp + 1);
  }
  return false;
}

}  // namespace

const FamilyDesc& describe(Family f) { return kFamilies[static_cast<std::size_t>(f)]; }

const FamilyDesc* family_from_gguf(std::string_view architecture) {
  for (const auto& d : kFamilies)
    if (d.name == architecture) return &d;
  return nullptr;
}

const FamilyDesc* family_from_hf(std::string_view model_type) {
  if (model_type.empty()) return nullptr;
  for (const auto& d : kFamilies)
    if (listed(d.hf_types, model_type)) return &d;
  return nullptr;
}

std::string supported_architectures() {
  std::string s;
  for (const auto& d : kFamilies) s += (s.empty() ? "" : ", ") + std::string(d.name);
  return s;
}

}  // namespace specactor::model
