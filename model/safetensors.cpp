#include "model/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "config/error.hpp"
#include "config/input.hpp"

namespace specactor::model {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// safetensors dtype -> (ggml type, bytes per element)
bool dtype_info(const std::string& dt, std::uint32_t& ggml, std::uint32_t& size) {
  if (dt == "F32") return ggml = 0, size = 4, true;
  if (dt == "F16") return ggml = 1, size = 2, true;
  if (dt == "BF16") return ggml = 30, size = 2, true;
  if (dt == "I32") return ggml = 26, size = 4, true;
  if (dt == "I64") return ggml = 27, size = 8, true;
  if (dt == "F64") return ggml = 28, size = 8, true;
  if (dt == "U8" || dt == "BOOL" || dt == "I8") return ggml = 24, size = 1, true;  // e.g. EAGLE3's t2d mask
  return false;
}

}  // namespace

std::shared_ptr<const SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  auto fail = [&](const std::string& what) { throw GgufError(path + ": " + what); };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO must not block the open
  if (fd < 0) fail(std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("not a regular file");
  }
  const auto size = static_cast<std::size_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    fail("truncated file: " + std::to_string(size) + " bytes cannot hold the safetensors header length");
  }
  void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (m == MAP_FAILED) fail(std::string("cannot mmap: ") + std::strerror(err));
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->mapping_ = m;
  f->base_ = static_cast<const std::uint8_t*>(m);
  f->size_ = size;

  std::uint64_t header_len;
  std::memcpy(&header_len, f->base_, 8);
  if (header_len > size - 8)
    fail("header length " + std::to_string(header_len) + " runs past the end of the file (" + std::to_string(size) +
         " bytes)");
  json header;
  try {
    header = config::parse_json(std::string_view(reinterpret_cast<const char*>(f->base_ + 8), header_len), "header");
  } catch (const config::ConfigError& e) {
    fail(e.what());
  }
  if (!header.is_object()) fail("header is not a JSON object");
  const std::uint64_t data_start = 8 + header_len;
  const std::uint64_t data_size = size - data_start;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      f->metadata_ = info;
      continue;
    }
    const std::string where = "tensor '" + name + "'";
    if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") || !info.contains("data_offsets"))
      fail(where + ": expected {dtype, shape, data_offsets}");
    TensorView t;
    t.name = name;
    std::uint32_t esize = 0;
    if (!info["dtype"].is_string() || !dtype_info(info["dtype"].get<std::string>(), t.ggml_type, esize))
      fail(where + ": unsupported dtype " + info["dtype"].dump() +
           " (supported: F32, F16, BF16, I32, I64, F64, U8, I8, BOOL)");
    const json& shape = info["shape"];
    if (!shape.is_array() || shape.size() > 4) fail(where + ": shape must be an array of at most 4 dimensions");
    std::uint64_t n = 1;
    for (const auto& d : shape) {
      if (!d.is_number_unsigned()) fail(where + ": shape entries must be non-negative integers");
      if (__builtin_mul_overflow(n, d.get<std::uint64_t>(), &n)) fail(where + ": element count overflows");
    }
    for (auto it = shape.rbegin(); it != shape.rend(); ++it) t.dims.push_back(it->get<std::uint64_t>());  // ggml order
    if (t.dims.empty()) t.dims.push_back(1);
    const json& off = info["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      fail(where + ": data_offsets must be [begin, end]");
    const auto b = off[0].get<std::uint64_t>(), e = off[1].get<std::uint64_t>();
    if (b > e || e > data_size)
      fail(where + ": data [" + std::to_string(b) + ", " + std::to_string(e) + ") runs past the end of the data (" +
           std::to_string(data_size) + " bytes)");
    std::uint64_t want;
    if (__builtin_mul_overflow(n, std::uint64_t{esize}, &want) || want != e - b)
      fail(where + ": " + std::to_string(e - b) + " bytes of data for " + std::to_string(n) + " elements of " +
           info["dtype"].get<std::string>());
    t.data = f->base_ + data_start + b;
    t.n_bytes = e - b;
    f->tensors_.emplace(name, std::move(t));
  }
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_) ::munmap(mapping_, size_);
}

std::shared_ptr<const SafetensorsSource> SafetensorsSource::open(const std::string& path) {
  auto src = std::make_shared<SafetensorsSource>();
  src->path_ = path;
  std::vector<std::string> shards;
  if (fs::is_directory(path)) {
    for (const auto& e : fs::directory_iterator(path))
      if (e.path().extension() == ".safetensors") shards.push_back(e.path().string());
    std::sort(shards.begin(), shards.end());
    if (shards.empty()) throw GgufError(path + ": no *.safetensors files in the directory");
  } else {
    shards.push_back(path);
  }
  for (const auto& s : shards) src->files_.push_back(SafetensorsFile::open(s));
  // A tensor may appear in one shard only.
  std::map<std::string_view, std::string_view> owner;
  for (const auto& f : src->files_)
    for (const auto& [name, t] : f->tensors())
      if (auto [it, fresh] = owner.emplace(name, f->path()); !fresh)
        throw GgufError(path + ": tensor '" + name + "' appears in both " + std::string(it->second) + " and " +
                        f->path());
  return src;
}

const TensorView* SafetensorsSource::find(std::string_view name) const {
  for (const auto& f : files_)
    if (auto it = f->tensors().find(name); it != f->tensors().end()) return &it->second;
  return nullptr;
}

ModelInfo read_hf_model_info(const std::string& path) {
  const fs::path dir = fs::is_directory(path) ? fs::path(path) : fs::path(path).parent_path();
  const std::string cfg_path = (dir / "config.json").string();
  auto fail = [&](const std::string& what) { throw GgufError(cfg_path + ": " + what); };
  if (!fs::exists(cfg_path)) fail("cannot open (a safetensors model needs its config.json beside it)");
  const json c = config::parse_json(config::read_text_file(cfg_path, cfg_path), cfg_path);
  if (!c.is_object()) fail("expected a JSON object");
  ModelInfo m;
  m.path = path;
  auto number = [&](const char* key, double dflt) {
    if (!c.contains(key)) return dflt;
    if (!c[key].is_number())
      fail(std::string("'") + key + "' must be a number, got " + config::printable(c[key].dump()));
    return c[key].get<double>();
  };
  if (c.contains("model_type") && !c["model_type"].is_string()) fail("'model_type' must be a string");
  if (c.contains("tie_word_embeddings") && !c["tie_word_embeddings"].is_boolean())
    fail("'tie_word_embeddings' must be true or false, got " + config::printable(c["tie_word_embeddings"].dump()));
  const std::string model_type = c.value("model_type", "");
  const FamilyDesc* fam = family_from_hf(model_type);
  if (!fam) {
    if (c.contains("text_config"))
      fail("model_type '" + config::printable(model_type) +
           "' is a multimodal checkpoint (text_config); only its text model in a checkpoint of its own is supported");
    fail("model_type '" + config::printable(model_type) +
         "' is not supported (supported: llama, mistral, qwen2, "
         "qwen3, gemma3_text — the architectures " +
         supported_architectures() + ")");
  }
  m.architecture = std::string(fam->name);
  m.family = fam->family;
  // Settings that change the computation and that this forward does not do are refused by name.
  auto refuse_true = [&](const char* key) {
    if (c.contains(key) && !c[key].is_null() && c[key] != false)
      fail(std::string("'") + key + "' = " + config::printable(c[key].dump()) + " is not supported (expected false)");
  };
  refuse_true("attention_bias");
  refuse_true("mlp_bias");
  refuse_true("use_sliding_window");
  refuse_true("use_bidirectional_attention");
  for (const char* key : {"final_logit_softcapping", "attn_logit_softcapping"})
    if (c.contains(key) && !c[key].is_null())
      fail(std::string("'") + key + "' = " + config::printable(c[key].dump()) + " is not supported (expected null)");
  for (const char* key : {"hidden_act", "hidden_activation"})
    if (c.contains(key) && !c[key].is_null()) {
      const std::string want = fam->gelu_tanh ? "gelu_pytorch_tanh" : "silu";
      if (c[key] != want)
        fail(std::string("'") + key + "' = " + config::printable(c[key].dump()) + " is not supported (expected \"" +
             want + "\" for " + std::string(fam->name) + ")");
    }
  auto positive = [&](const char* key) -> std::int64_t {
    if (!c.contains(key) || !c[key].is_number_integer() || c[key].get<std::int64_t>() <= 0)
      fail(std::string("'") + key + "' must be a positive integer");
    return c[key].get<std::int64_t>();
  };
  m.hidden_size = positive("hidden_size");
  m.ffn_hidden_size = positive("intermediate_size");
  m.num_layers = positive("num_hidden_layers");
  m.num_heads = positive("num_attention_heads");
  m.num_kv_heads = c.contains("num_key_value_heads") ? positive("num_key_value_heads") : m.num_heads;
  m.vocab_size = positive("vocab_size");
  m.context_length = c.contains("max_position_embeddings") ? positive("max_position_embeddings") : 2048;
  m.head_dim = c.contains("head_dim") && !c["head_dim"].is_null() ? positive("head_dim") : m.hidden_size / m.num_heads;
  if (fam->family == Family::Llama && m.head_dim * m.num_heads != m.hidden_size)
    fail("hidden_size is not num_attention_heads × head_dim");
  if (m.head_dim % 2 != 0 || m.head_dim > 512) fail("'head_dim' must be even and at most 512");
  if (m.num_heads % m.num_kv_heads != 0) fail("num_attention_heads is not a multiple of num_key_value_heads");
  m.rope_dim = m.head_dim;
  m.rope_base = number("rope_theta", 10000.0);
  if (const auto why = bad_rope_base(m.rope_base); !why.empty()) fail("'rope_theta' " + why);
  m.norm_eps = number("rms_norm_eps", 1e-6);
  if (const auto why = bad_norm_eps(m.norm_eps); !why.empty()) fail("'rms_norm_eps' " + why);
  m.bos_token_id =
      c.contains("bos_token_id") && c["bos_token_id"].is_number_integer() ? c["bos_token_id"].get<std::int64_t>() : -1;
  m.eos_token_id =
      c.contains("eos_token_id") && c["eos_token_id"].is_number_integer() ? c["eos_token_id"].get<std::int64_t>() : -1;
  m.tied_embeddings = c.value("tie_word_embeddings", fam->hf_tied_default);
  if (c.contains("rope_scaling") && !c["rope_scaling"].is_null()) {
    const json& r = c["rope_scaling"];
    const std::string type = r.is_object() ? r.value("rope_type", r.value("type", "")) : "";
    if (type == "linear" && r.contains("factor") && r["factor"].is_number() && r["factor"].get<double>() >= 1.0 &&
        r["factor"].get<double>() <= 1024.0)
      m.rope_linear_factor = r["factor"].get<double>();
    else if (type != "default")
      fail("'rope_scaling' " + config::printable(r.dump()) +
           " is not supported (supported: null, or {\"rope_type\": \"linear\", \"factor\": 1 .. 1024})");
  }
  if (fam->sliding_layers) {
    m.sliding_window = positive("sliding_window");
    if (c.contains("layer_types")) {
      const json& t = c["layer_types"];
      if (!t.is_array() || static_cast<std::int64_t>(t.size()) != m.num_layers)
        fail("'layer_types' must list one type per layer (" + std::to_string(m.num_layers) + ")");
      for (const auto& e : t) {
        if (e != "sliding_attention" && e != "full_attention")
          fail("'layer_types' holds " + config::printable(e.dump()) +
               " (expected \"sliding_attention\" or \"full_attention\")");
        m.sliding_layers.push_back(e == "sliding_attention" ? 1 : 0);
      }
    } else {
      const std::int64_t pattern = c.contains("sliding_window_pattern") ? positive("sliding_window_pattern") : 6;
      for (std::int64_t l = 0; l < m.num_layers; ++l) m.sliding_layers.push_back((l + 1) % pattern != 0 ? 1 : 0);
    }
    m.rope_base_local = number("rope_local_base_freq", 10000.0);
    if (const auto why = bad_rope_base(m.rope_base_local); !why.empty()) fail("'rope_local_base_freq' " + why);
    const double scalar = number("query_pre_attn_scalar", static_cast<double>(m.head_dim));
    if (!(scalar > 0.0 && scalar < 1e9)) fail("'query_pre_attn_scalar' must be a positive number");
    m.attn_scale = 1.0 / std::sqrt(scalar);
  }
  m.name = dir.filename().string();
  return m;
}

GgufSource::GgufSource(std::shared_ptr<const GgufFile> file) : file_(std::move(file)) {
  for (const auto& t : file_->tensors())
    views_.emplace(t.name, TensorView{t.name, static_cast<std::uint32_t>(t.type), t.dims, t.data, t.n_bytes});
}

const TensorView* GgufSource::find(std::string_view name) const {
  auto it = views_.find(name);
  return it == views_.end() ? nullptr : &it->second;
}

}  // namespace specactor::model
