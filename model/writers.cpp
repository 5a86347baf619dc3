// model/writers.cpp — see writers.hpp.
#include "model/writers.hpp"

#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "config/error.hpp"
#include "config/input.hpp"
#include "model/gguf.hpp"

namespace specactor::model {

namespace {

// A file that could not be written is the user's output path (a missing folder, no permission, a full
// disk), reported as one error naming it.
[[noreturn]] void cannot_write(const std::string& path) {
  const int err = errno;
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  const std::string why = !dir.empty() && !std::filesystem::is_directory(dir, ec)
                              ? "the folder " + dir.string() + " does not exist"
                          : err ? std::string(std::strerror(err))
                                : std::string("the write failed (disk full?)");
  throw config::ConfigError("cannot write " + path + ": " + why);
}

}  // namespace

namespace {

template <class T>
void put(std::vector<std::uint8_t>& out, T v) {
  const std::size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}
void put_str(std::vector<std::uint8_t>& out, std::string_view s) {
  put<std::uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

// A metadata value's bytes as GGUF stores them (after the type tag).
void put_value(std::vector<std::uint8_t>& b, GgufType type, const GgufValue& v);

void put_value(std::vector<std::uint8_t>& b, GgufType type, const GgufValue& v) {
  auto u = [&] { return std::get<std::uint64_t>(v.scalar); };
  auto i = [&] { return std::get<std::int64_t>(v.scalar); };
  switch (type) {
    case GgufType::U8:
      put<std::uint8_t>(b, static_cast<std::uint8_t>(u()));
      break;
    case GgufType::I8:
      put<std::int8_t>(b, static_cast<std::int8_t>(i()));
      break;
    case GgufType::U16:
      put<std::uint16_t>(b, static_cast<std::uint16_t>(u()));
      break;
    case GgufType::I16:
      put<std::int16_t>(b, static_cast<std::int16_t>(i()));
      break;
    case GgufType::U32:
      put<std::uint32_t>(b, static_cast<std::uint32_t>(u()));
      break;
    case GgufType::I32:
      put<std::int32_t>(b, static_cast<std::int32_t>(i()));
      break;
    case GgufType::U64:
      put<std::uint64_t>(b, u());
      break;
    case GgufType::I64:
      put<std::int64_t>(b, i());
      break;
    case GgufType::F32:
      put<float>(b, static_cast<float>(std::get<double>(v.scalar)));
      break;
    case GgufType::F64:
      put<double>(b, std::get<double>(v.scalar));
      break;
    case GgufType::Bool:
      put<std::uint8_t>(b, std::get<bool>(v.scalar) ? 1 : 0);
      break;
    case GgufType::String:
      put_str(b, std::get<std::string_view>(v.scalar));
      break;
    case GgufType::Array:
      put<std::uint32_t>(b, static_cast<std::uint32_t>(v.elem_type));
      put<std::uint64_t>(b, v.count);
      if (v.elem_type == GgufType::String) {
        for (auto s : v.strings) put_str(b, s);
      } else if (v.elem_type == GgufType::Array) {
        for (const auto& n : v.nested) put_value(b, GgufType::Array, n);
      } else {
        b.insert(b.end(), v.raw, v.raw + v.count * gguf_scalar_size(v.elem_type));
      }
      break;
  }
}

}  // namespace

void write_first_layers(const GgufFile& in, std::int64_t layers, const std::string& out) {
  const std::string arch(in.get_string("general.architecture"));
  const std::string count_key = arch + ".block_count";
  const std::int64_t have = in.get_int(count_key);
  if (layers < 1 || layers > have)
    throw GgufError(in.path() + ": cannot keep " + std::to_string(layers) + " of its " + std::to_string(have) +
                    " blocks");
  GgufWriter w;
  w.version = in.version();
  w.alignment = in.alignment();
  for (const auto& [key, v] : in.metadata()) {
    if (key == count_key) {
      w.kv_u32(key, static_cast<std::uint32_t>(layers));
      continue;
    }
    std::vector<std::uint8_t> b;
    put_value(b, v.type, v);
    w.kv_raw(key, static_cast<std::uint32_t>(v.type), b);
  }
  for (const auto& t : in.tensors()) {
    if (t.name.rfind("blk.", 0) == 0) {
      // "blk.<index>.<rest>": anything else under blk. is not a layer tensor this tool understands.
      std::int64_t index = -1;
      const char* b = t.name.data() + 4;
      const char* e = t.name.data() + t.name.size();
      const auto [end, ec] = std::from_chars(b, e, index);
      if (ec != std::errc{} || end == b || end == e || *end != '.' || index < 0)
        throw GgufError(in.path() + ": tensor '" + config::printable(t.name) +
                        "' is under blk. but has no block index (expected blk.<N>.<name>)");
      if (index >= have)
        throw GgufError(in.path() + ": tensor '" + config::printable(t.name) + "' names block " +
                        std::to_string(index) + " of a model with " + std::to_string(have) + " blocks");
      if (index >= layers) continue;
    }
    w.tensor(t.name, static_cast<std::uint32_t>(t.type), t.dims, std::vector<std::uint8_t>(t.data, t.data + t.n_bytes));
  }
  w.write(out);
}

std::uint64_t ggml_nbytes(std::uint32_t type, const std::vector<std::uint64_t>& dims) {
  std::uint64_t n = 1;
  for (auto d : dims) n *= d;
  switch (type) {
    case 0:
      return n * 4;  // F32
    case 1:
    case 30:
      return n * 2;  // F16, BF16
    case 2:
      return n / 32 * 18;  // Q4_0
    case 3:
      return n / 32 * 20;  // Q4_1
    case 8:
      return n / 32 * 34;  // Q8_0
    case 12:
      return n / 256 * 144;  // Q4_K
    case 14:
      return n / 256 * 210;  // Q6_K
    default:
      return 0;
  }
}

void GgufWriter::kv_raw(std::string_view key, std::uint32_t type, const std::vector<std::uint8_t>& value_bytes) {
  put_str(kv_, key);
  put<std::uint32_t>(kv_, type);
  kv_.insert(kv_.end(), value_bytes.begin(), value_bytes.end());
  ++kv_count_;
}

#define SPECACTOR_KV_SCALAR(fn, T, tag)            \
  void GgufWriter::fn(std::string_view key, T v) { \
    std::vector<std::uint8_t> b;                   \
    put<T>(b, v);                                  \
    kv_raw(key, tag, b);                           \
  }
SPECACTOR_KV_SCALAR(kv_u8, std::uint8_t, 0)
SPECACTOR_KV_SCALAR(kv_u32, std::uint32_t, 4)
SPECACTOR_KV_SCALAR(kv_i32, std::int32_t, 5)
SPECACTOR_KV_SCALAR(kv_f32, float, 6)
SPECACTOR_KV_SCALAR(kv_u64, std::uint64_t, 10)
#undef SPECACTOR_KV_SCALAR

void GgufWriter::kv_bool(std::string_view key, bool v) { kv_raw(key, 7, {static_cast<std::uint8_t>(v ? 1 : 0)}); }

void GgufWriter::kv_str(std::string_view key, std::string_view v) {
  std::vector<std::uint8_t> b;
  put_str(b, v);
  kv_raw(key, 8, b);
}

void GgufWriter::kv_str_array(std::string_view key, const std::vector<std::string>& v) {
  std::vector<std::uint8_t> b;
  put<std::uint32_t>(b, 8);
  put<std::uint64_t>(b, v.size());
  for (const auto& s : v) put_str(b, s);
  kv_raw(key, 9, b);
}

void GgufWriter::kv_i32_array(std::string_view key, const std::vector<std::int32_t>& v) {
  std::vector<std::uint8_t> b;
  put<std::uint32_t>(b, 5);
  put<std::uint64_t>(b, v.size());
  for (auto x : v) put<std::int32_t>(b, x);
  kv_raw(key, 9, b);
}

void GgufWriter::kv_f32_array(std::string_view key, const std::vector<float>& v) {
  std::vector<std::uint8_t> b;
  put<std::uint32_t>(b, 6);
  put<std::uint64_t>(b, v.size());
  for (auto x : v) put<float>(b, x);
  kv_raw(key, 9, b);
}

void GgufWriter::tensor(std::string_view name, std::uint32_t ggml_type, std::vector<std::uint64_t> dims,
                        std::vector<std::uint8_t> data, std::int64_t offset_override) {
  if (data.empty()) data.assign(ggml_nbytes(ggml_type, dims), 0);
  tensors_.push_back({std::string(name), ggml_type, std::move(dims), std::move(data), offset_override});
}

bool GgufWriter::remove_tensor(std::string_view name) {
  for (auto it = tensors_.begin(); it != tensors_.end(); ++it)
    if (it->name == name) {
      tensors_.erase(it);
      return true;
    }
  return false;
}

bool GgufWriter::reshape_tensor(std::string_view name, std::vector<std::uint64_t> dims) {
  for (auto& t : tensors_)
    if (t.name == name) {
      t.data.assign(ggml_nbytes(t.type, dims), 0);
      t.dims = std::move(dims);
      return true;
    }
  return false;
}

std::vector<std::uint8_t> GgufWriter::bytes() const {
  std::vector<std::uint8_t> out;
  put<std::uint32_t>(out, magic);
  put<std::uint32_t>(out, version);
  put<std::uint64_t>(out, tensors_.size());
  put<std::uint64_t>(out, kv_count_);
  out.insert(out.end(), kv_.begin(), kv_.end());
  std::vector<std::uint64_t> offsets;
  std::uint64_t next = 0;
  for (const auto& t : tensors_) {
    offsets.push_back(next);
    next += (t.data.size() + alignment - 1) / alignment * alignment;
  }
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    const auto& t = tensors_[i];
    put_str(out, t.name);
    put<std::uint32_t>(out, static_cast<std::uint32_t>(t.dims.size()));
    for (auto d : t.dims) put<std::uint64_t>(out, d);
    put<std::uint32_t>(out, t.type);
    put<std::uint64_t>(out, t.offset_override >= 0 ? static_cast<std::uint64_t>(t.offset_override) : offsets[i]);
  }
  while (out.size() % alignment != 0) out.push_back(0);
  const std::size_t data_start = out.size();
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    out.resize(data_start + offsets[i]);
    out.insert(out.end(), tensors_[i].data.begin(), tensors_[i].data.end());
  }
  return out;
}

void GgufWriter::write(const std::string& path) const {
  const auto b = bytes();
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  if (!f) cannot_write(path);
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, HfTensor>>& tensors,
                       const std::vector<std::int64_t>& d2t) {
  nlohmann::json header = nlohmann::json::object();
  std::uint64_t off = 0;
  for (const auto& [name, t] : tensors) {
    const std::uint64_t bytes = t.values.size() * 4;
    header[name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {off, off + bytes}}};
    off += bytes;
  }
  if (!d2t.empty())
    header["d2t"] = {{"dtype", "I64"}, {"shape", {d2t.size()}}, {"data_offsets", {off, off + d2t.size() * 8}}};
  header["__metadata__"] = {{"format", "pt"}};
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';
  std::ofstream f(path, std::ios::binary);
  const std::uint64_t n = h.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const auto& [name, t] : tensors)
    f.write(reinterpret_cast<const char*>(t.values.data()), static_cast<std::streamsize>(t.values.size() * 4));
  if (!d2t.empty()) f.write(reinterpret_cast<const char*>(d2t.data()), static_cast<std::streamsize>(d2t.size() * 8));
  if (!f) cannot_write(path);
}

void write_safetensors_raw(const std::string& path, const std::vector<RawTensor>& tensors,
                           const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  std::uint64_t off = 0;
  for (const RawTensor& t : tensors) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
    off += t.bytes.size();
  }
  nlohmann::json meta = nlohmann::json::object();
  for (const auto& [k, v] : metadata) meta[k] = v;
  header["__metadata__"] = meta;
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    const std::uint64_t n = h.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f.write(h.data(), static_cast<std::streamsize>(h.size()));
    for (const RawTensor& t : tensors)
      f.write(reinterpret_cast<const char*>(t.bytes.data()), static_cast<std::streamsize>(t.bytes.size()));
    f.flush();
    if (!f) cannot_write(tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw config::ConfigError("cannot rename " + tmp + " to " + path + ": " + ec.message());
}

}  // namespace specactor::model
