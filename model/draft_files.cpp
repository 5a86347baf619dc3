// model/draft_files.cpp — see draft_files.hpp.
#include "model/draft_files.hpp"

#include <cmath>
#include <filesystem>

#include "config/input.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/quant.hpp"
#include "kernels/cpu/rmsnorm.hpp"
#include "model/gguf.hpp"

namespace specactor::model {

namespace k = specactor::kernels;
namespace fs = std::filesystem;
using nlohmann::json;

bool is_hf_path(const std::string& path) {
  return fs::is_directory(path) || (path.size() > 12 && path.compare(path.size() - 12, 12, ".safetensors") == 0);
}

json read_config_json(const std::string& path) {
  const fs::path dir = fs::is_directory(path) ? fs::path(path) : fs::path(path).parent_path();
  const std::string cfg = (dir / "config.json").string();
  if (!fs::exists(cfg)) throw GgufError(cfg + ": cannot open (a safetensors draft needs its config.json beside it)");
  json j = config::parse_json(config::read_text_file(cfg, cfg), cfg);
  if (!j.is_object()) throw GgufError(cfg + ": expected a JSON object");
  return j;
}

std::int64_t cfg_int(const json& j, const std::string& where, const char* key, std::int64_t dflt) {
  if (!j.contains(key)) {
    if (dflt >= 0) return dflt;
    throw GgufError(where + ": missing '" + key + "'");
  }
  if (!j[key].is_number_integer() || j[key].get<std::int64_t>() < 0)
    throw GgufError(where + ": '" + key + "' must be a non-negative integer, got " + config::printable(j[key].dump()));
  return j[key].get<std::int64_t>();
}

k::WeightMatrix CheckedBinder::matrix(const std::string& name, std::int64_t out, std::int64_t in) {
  k::WeightMatrix m = b_.matrix(name, out, in);
  const bool to_q = quantize_to_ != k::WeightType::F32 &&
                    (m.type == k::WeightType::F32 || m.type == k::WeightType::F16 || m.type == k::WeightType::BF16);
  const std::size_t q_row = k::row_bytes(quantize_to_, static_cast<std::size_t>(in));
  std::vector<std::uint8_t> q(to_q ? q_row * static_cast<std::size_t>(out) : 0);
  std::vector<float> row(static_cast<std::size_t>(in));
  const auto quantize_row = quantize_to_ == k::WeightType::Q4_1 ? &k::quantize_row_q4_1 : &k::quantize_row_q8_0;
  for (std::int64_t r = 0; r < out; ++r) {
    k::weight_row(m, r, row.data());
    check(name, row.data(), in);
    if (to_q) quantize_row(row.data(), q.data() + static_cast<std::size_t>(r) * q_row, row.size());
  }
  if (!to_q) return m;
  k::WeightMatrix qm{quantize_to_, out, in, q.data(), q_row, false};
  std::vector<std::uint8_t> packed;
  qm = k::pack_matrix(qm, packed);
  owned_.push_back(std::move(q));
  if (!packed.empty()) owned_.push_back(std::move(packed));
  return qm;
}

const float* CheckedBinder::vector(const std::string& name, std::int64_t n) {
  const float* v = b_.vector(name, n);
  check(name, v, n);
  return v;
}

void CheckedBinder::check(const std::string& name, const float* v, std::int64_t n) const {
  for (std::int64_t i = 0; i < n; ++i)
    if (!std::isfinite(v[i]))
      throw GgufError(path_ + ": tensor '" + config::printable(name) + "' holds a non-finite value (" +
                      std::to_string(v[i]) + ")");
}

void layer_tail(const LlamaLayer& ly, std::int64_t n, std::int64_t H, std::int64_t F, float eps, k::Precision precision,
                const float* att, float* x, LayerTailScratch& s) {
  s.tmp.resize(static_cast<std::size_t>(n * H));
  k::matmul(ly.wo, att, n, s.tmp.data(), precision);
  for (std::int64_t i = 0; i < n * H; ++i) x[i] += s.tmp[static_cast<std::size_t>(i)];
  s.xn.resize(static_cast<std::size_t>(n * H));
  k::rmsnorm_cpu(s.xn.data(), x, ly.ffn_norm, static_cast<int>(n), static_cast<int>(H), eps);
  s.gate.resize(static_cast<std::size_t>(n * F));
  s.up.resize(s.gate.size());
  const k::MatmulJob gu[2] = {{&ly.gate, s.gate.data()}, {&ly.up, s.up.data()}};
  k::matmul_many(gu, 2, s.xn.data(), n, precision);
  k::silu_mul_cpu(s.gate.data(), s.gate.data(), s.up.data(), n * F);
  k::matmul(ly.down, s.gate.data(), n, s.tmp.data(), precision);
  for (std::int64_t i = 0; i < n * H; ++i) x[i] += s.tmp[static_cast<std::size_t>(i)];
}

}  // namespace specactor::model
