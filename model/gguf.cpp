// model/gguf.cpp — GGUF parsing with bounds checks on every read.
#include "model/gguf.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "config/input.hpp"

namespace specactor::model {
namespace {

constexpr std::uint32_t kMagic = 0x46554747;  // "GGUF" read as little-endian u32
constexpr int kMaxArrayDepth = 8;
// Arrays inside arrays, in the whole file: each costs ~120 bytes of memory for 12 bytes of file, so a
// large file of empty nested arrays would cost 10× its size. No model uses more than a handful.
constexpr std::uint64_t kMaxNestedArrays = 65536;
constexpr std::uint32_t kMaxDims = 4;

// Smallest encodings, used to reject counts that cannot fit before allocating anything.
constexpr std::uint64_t kMinKvBytes = 8 + 4 + 1;                  // empty key, type, one byte value
constexpr std::uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // empty name, 1 dim, type, offset

bool known_value_type(std::uint32_t t) { return t <= static_cast<std::uint32_t>(GgufType::F64); }

std::string hex(std::uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// Bounds-checked little-endian cursor over the mapping.
class Cursor {
 public:
  Cursor(const std::uint8_t* base, std::size_t size, const std::string& path) : base_(base), size_(size), path_(path) {}

  std::uint64_t pos() const { return pos_; }
  std::uint64_t remaining() const { return size_ - pos_; }
  void context(std::string what) { what_ = std::move(what); }
  const std::string& what() const { return what_; }
  std::uint64_t nested_arrays = 0;  // nested arrays read so far (kMaxNestedArrays)

  const std::uint8_t* take(std::uint64_t n) {
    if (n > remaining())
      throw GgufError(path_ + ": truncated file: " + what_ + " needs " + std::to_string(n) + " bytes at offset " +
                      std::to_string(pos_) + ", but the file ends at " + std::to_string(size_));
    const std::uint8_t* p = base_ + pos_;
    pos_ += n;
    return p;
  }
  template <class T>
  T read() {
    T v;
    std::memcpy(&v, take(sizeof(T)), sizeof(T));
    return v;
  }
  std::string_view read_string() {
    const std::uint64_t len = read<std::uint64_t>();
    if (len > remaining())
      throw GgufError(path_ + ": " + what_ + ": string length " + std::to_string(len) + " at offset " +
                      std::to_string(pos_ - 8) + " runs past the end of the file (" + std::to_string(remaining()) +
                      " bytes left)");
    const auto* p = take(len);
    return {reinterpret_cast<const char*>(p), static_cast<std::size_t>(len)};
  }

 private:
  const std::uint8_t* base_;
  std::size_t size_;
  std::uint64_t pos_ = 0;
  const std::string& path_;
  std::string what_;
};

GgufValue read_value(Cursor& c, GgufType type, const std::string& path, int depth);

GgufValue read_array(Cursor& c, const std::string& path, int depth) {
  GgufValue v;
  v.type = GgufType::Array;
  const std::uint32_t et = c.read<std::uint32_t>();
  if (!known_value_type(et))
    throw GgufError(path + ": " + c.what() + ": unknown array element type " + std::to_string(et) + " (known: 0..12)");
  v.elem_type = static_cast<GgufType>(et);
  v.count = c.read<std::uint64_t>();
  if (v.elem_type == GgufType::String) {
    if (v.count > c.remaining() / 8)
      throw GgufError(path + ": " + c.what() + ": array of " + std::to_string(v.count) + " strings cannot fit in the " +
                      std::to_string(c.remaining()) + " bytes left");
    v.strings.reserve(v.count);
    for (std::uint64_t i = 0; i < v.count; ++i) v.strings.push_back(c.read_string());
  } else if (v.elem_type == GgufType::Array) {
    if (depth >= kMaxArrayDepth)
      throw GgufError(path + ": " + c.what() + ": arrays nested deeper than " + std::to_string(kMaxArrayDepth));
    if (v.count > c.remaining() / 12)
      throw GgufError(path + ": " + c.what() + ": array of " + std::to_string(v.count) + " arrays cannot fit in the " +
                      std::to_string(c.remaining()) + " bytes left");
    c.nested_arrays += v.count;
    if (c.nested_arrays > kMaxNestedArrays)
      throw GgufError(path + ": " + c.what() + ": more than " + std::to_string(kMaxNestedArrays) +
                      " nested arrays in the file (the limit for metadata arrays of arrays)");
    v.nested.reserve(v.count);
    for (std::uint64_t i = 0; i < v.count; ++i) v.nested.push_back(read_array(c, path, depth + 1));
  } else {
    const std::size_t es = gguf_scalar_size(v.elem_type);
    if (v.count > c.remaining() / es)
      throw GgufError(path + ": " + c.what() + ": array of " + std::to_string(v.count) + " " +
                      std::string(gguf_type_name(v.elem_type)) + " runs past the end of the file (" +
                      std::to_string(c.remaining()) + " bytes left)");
    v.raw = c.take(v.count * es);
  }
  return v;
}

GgufValue read_value(Cursor& c, GgufType type, const std::string& path, int depth) {
  GgufValue v;
  v.type = type;
  switch (type) {
    case GgufType::U8:
      v.scalar = std::uint64_t{c.read<std::uint8_t>()};
      break;
    case GgufType::I8:
      v.scalar = std::int64_t{c.read<std::int8_t>()};
      break;
    case GgufType::U16:
      v.scalar = std::uint64_t{c.read<std::uint16_t>()};
      break;
    case GgufType::I16:
      v.scalar = std::int64_t{c.read<std::int16_t>()};
      break;
    case GgufType::U32:
      v.scalar = std::uint64_t{c.read<std::uint32_t>()};
      break;
    case GgufType::I32:
      v.scalar = std::int64_t{c.read<std::int32_t>()};
      break;
    case GgufType::U64:
      v.scalar = c.read<std::uint64_t>();
      break;
    case GgufType::I64:
      v.scalar = c.read<std::int64_t>();
      break;
    case GgufType::F32:
      v.scalar = double{c.read<float>()};
      break;
    case GgufType::F64:
      v.scalar = c.read<double>();
      break;
    case GgufType::Bool: {
      const std::uint8_t b = c.read<std::uint8_t>();
      if (b > 1)
        throw GgufError(path + ": " + c.what() + ": boolean byte is " + std::to_string(b) + ", expected 0 or 1");
      v.scalar = b == 1;
      break;
    }
    case GgufType::String:
      v.scalar = c.read_string();
      break;
    case GgufType::Array:
      return read_array(c, path, depth);
  }
  return v;
}

}  // namespace

std::size_t gguf_scalar_size(GgufType t) {
  switch (t) {
    case GgufType::U8:
    case GgufType::I8:
    case GgufType::Bool:
      return 1;
    case GgufType::U16:
    case GgufType::I16:
      return 2;
    case GgufType::U32:
    case GgufType::I32:
    case GgufType::F32:
      return 4;
    case GgufType::U64:
    case GgufType::I64:
    case GgufType::F64:
      return 8;
    default:
      return 0;
  }
}

std::string_view gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::U8:
      return "uint8";
    case GgufType::I8:
      return "int8";
    case GgufType::U16:
      return "uint16";
    case GgufType::I16:
      return "int16";
    case GgufType::U32:
      return "uint32";
    case GgufType::I32:
      return "int32";
    case GgufType::F32:
      return "float32";
    case GgufType::Bool:
      return "bool";
    case GgufType::String:
      return "string";
    case GgufType::Array:
      return "array";
    case GgufType::U64:
      return "uint64";
    case GgufType::I64:
      return "int64";
    case GgufType::F64:
      return "float64";
  }
  return "unknown";
}

const GgmlTypeInfo* ggml_type_info(std::uint32_t type) {
  // Block sizes from the ggml block structs (e.g. Q4_1 = f16 d, f16 m, 16 bytes of nibbles = 20).
  static const GgmlTypeInfo table[] = {
      {"F32", 1, 4},      {"F16", 1, 2},      {"Q4_0", 32, 18},   {"Q4_1", 32, 20},   {"", 0, 0},
      {"", 0, 0},         {"Q5_0", 32, 22},   {"Q5_1", 32, 24},   {"Q8_0", 32, 34},   {"Q8_1", 32, 36},
      {"Q2_K", 256, 84},  {"Q3_K", 256, 110}, {"Q4_K", 256, 144}, {"Q5_K", 256, 176}, {"Q6_K", 256, 210},
      {"Q8_K", 256, 292}, {"", 0, 0},         {"", 0, 0},         {"", 0, 0},         {"", 0, 0},
      {"", 0, 0},         {"", 0, 0},         {"", 0, 0},         {"", 0, 0},         {"I8", 1, 1},
      {"I16", 1, 2},      {"I32", 1, 4},      {"I64", 1, 8},      {"F64", 1, 8},      {"", 0, 0},
      {"BF16", 1, 2},
  };
  if (type >= std::size(table) || table[type].block_elems == 0) return nullptr;
  return &table[type];
}

std::shared_ptr<const GgufFile> GgufFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO must not block the open
  if (fd < 0) throw GgufError(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw GgufError(path + ": cannot stat: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw GgufError(path + ": not a regular file");
  }
  if (st.st_size == 0) {
    ::close(fd);
    throw GgufError(path + ": empty file, expected a GGUF model");
  }
  void* m = ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (m == MAP_FAILED) throw GgufError(path + ": cannot mmap: " + std::strerror(err));
  std::shared_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  f->mapping_ = m;
  f->base_ = static_cast<const std::uint8_t*>(m);
  f->size_ = static_cast<std::size_t>(st.st_size);
  f->parse_all();
  return f;
}

std::shared_ptr<const GgufFile> GgufFile::parse(std::vector<std::uint8_t> image, std::string name) {
  std::shared_ptr<GgufFile> f(new GgufFile());
  f->path_ = std::move(name);
  f->image_ = std::move(image);
  f->base_ = f->image_.data();
  f->size_ = f->image_.size();
  f->parse_all();
  return f;
}

GgufFile::~GgufFile() {
  if (mapping_) ::munmap(mapping_, size_);
}

void GgufFile::fail(const std::string& what) const { throw GgufError(path_ + ": " + what); }

void GgufFile::parse_all() {
  Cursor c(base_, size_, path_);
  c.context("the header");
  if (size_ < 4) fail("truncated file: " + std::to_string(size_) + " bytes cannot hold the GGUF magic");
  const std::uint32_t magic = c.read<std::uint32_t>();
  if (magic != kMagic) fail("not a GGUF file (magic " + hex(magic) + ", expected 0x46554747 \"GGUF\")");
  version_ = c.read<std::uint32_t>();
  if (version_ != 2 && version_ != 3) {
    std::string hint;
    if (version_ == 1) hint = "; GGUF v1 (32-bit counts) is obsolete, re-convert the model";
    if (version_ >= 0x01000000) hint = "; this looks like a big-endian GGUF, only little-endian files are supported";
    fail("unsupported GGUF version " + std::to_string(version_) + " (supported: 2, 3)" + hint);
  }
  const std::uint64_t n_tensors = c.read<std::uint64_t>();
  const std::uint64_t n_kv = c.read<std::uint64_t>();
  if (n_kv > c.remaining() / kMinKvBytes)
    fail("metadata count " + std::to_string(n_kv) + " cannot fit in the " + std::to_string(c.remaining()) +
         " bytes after the header");
  if (n_tensors > c.remaining() / kMinTensorInfoBytes)
    fail("tensor count " + std::to_string(n_tensors) + " cannot fit in the " + std::to_string(c.remaining()) +
         " bytes after the header");

  for (std::uint64_t i = 0; i < n_kv; ++i) {
    c.context("the key of metadata entry " + std::to_string(i));
    const std::string_view key = c.read_string();
    if (key.empty()) fail("metadata entry " + std::to_string(i) + " has an empty key");
    c.context("metadata '" + config::printable(key) + "'");
    const std::uint32_t type = c.read<std::uint32_t>();
    if (!known_value_type(type))
      fail("metadata '" + config::printable(key) + "' has unknown value type " + std::to_string(type) +
           " (known: 0..12)");
    GgufValue v = read_value(c, static_cast<GgufType>(type), path_, 0);
    if (!kv_.emplace(std::string(key), std::move(v)).second)
      fail("duplicate metadata key '" + config::printable(key) + "'");
  }

  if (auto it = kv_.find("general.alignment"); it != kv_.end()) {
    const GgufValue& a = it->second;
    if (a.type != GgufType::U32) fail("general.alignment must be uint32, got " + std::string(gguf_type_name(a.type)));
    alignment_ = std::get<std::uint64_t>(a.scalar);
    if (alignment_ == 0 || (alignment_ & (alignment_ - 1)) != 0)
      fail("general.alignment is " + std::to_string(alignment_) + ", expected a power of two");
  }

  tensors_.reserve(n_tensors);
  for (std::uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo t;
    c.context("the name of tensor " + std::to_string(i));
    t.name = std::string(c.read_string());
    const std::string shown = config::printable(t.name);  // names come from the file: escaped in messages
    c.context("tensor '" + shown + "'");
    const std::uint32_t n_dims = c.read<std::uint32_t>();
    if (n_dims == 0 || n_dims > kMaxDims)
      fail("tensor '" + shown + "' has " + std::to_string(n_dims) + " dimensions (expected 1.." +
           std::to_string(kMaxDims) + ")");
    t.n_elements = 1;
    for (std::uint32_t d = 0; d < n_dims; ++d) {
      const std::uint64_t dim = c.read<std::uint64_t>();
      if (dim > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) ||
          __builtin_mul_overflow(t.n_elements, dim, &t.n_elements) ||
          t.n_elements > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        fail("tensor '" + shown + "': dimension " + std::to_string(d) + " (" + std::to_string(dim) +
             ") makes the element count overflow");
      t.dims.push_back(dim);
    }
    const std::uint32_t type = c.read<std::uint32_t>();
    const GgmlTypeInfo* ti = ggml_type_info(type);
    if (!ti) fail("tensor '" + shown + "' has unsupported tensor type " + std::to_string(type));
    t.type = static_cast<GgmlType>(type);
    if (t.dims[0] % ti->block_elems != 0)
      fail("tensor '" + shown + "': row length " + std::to_string(t.dims[0]) + " is not a multiple of the " +
           std::string(ti->name) + " block size " + std::to_string(ti->block_elems));
    if (__builtin_mul_overflow(t.n_elements / ti->block_elems, std::uint64_t{ti->block_bytes}, &t.n_bytes))
      fail("tensor '" + shown + "': byte size of " + std::to_string(t.n_elements) + " elements overflows");
    t.offset = c.read<std::uint64_t>();
    if (t.offset % alignment_ != 0)
      fail("tensor '" + shown + "': data offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
           std::to_string(alignment_));
    if (!tensor_index_.emplace(t.name, tensors_.size()).second) fail("duplicate tensor name '" + shown + "'");
    tensors_.push_back(std::move(t));
  }

  data_offset_ = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  for (auto& t : tensors_) {
    const std::uint64_t begin = data_offset_ + t.offset;
    if (begin < t.offset || begin > size_ || t.n_bytes > size_ - begin)
      fail("tensor '" + config::printable(t.name) + "': data [" + std::to_string(begin) + ", " +
           std::to_string(begin + t.n_bytes) + ") runs past the end of the file (" + std::to_string(size_) + " bytes)");
    t.data = base_ + begin;
  }
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufValue& GgufFile::get(std::string_view key) const {
  auto it = kv_.find(key);
  if (it == kv_.end()) fail("missing metadata key '" + config::printable(key) + "'");
  return it->second;
}

namespace {
std::string wrong_type(std::string_view key, std::string_view want, const GgufValue& v) {
  return "metadata '" + config::printable(key) + "' is " + std::string(gguf_type_name(v.type)) + ", expected " +
         std::string(want);
}
}  // namespace

std::int64_t GgufFile::get_int(std::string_view key) const {
  const GgufValue& v = get(key);
  if (auto* u = std::get_if<std::uint64_t>(&v.scalar); u && v.type != GgufType::Array) {
    if (*u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      fail("metadata '" + config::printable(key) + "' = " + std::to_string(*u) + " is too large");
    return static_cast<std::int64_t>(*u);
  }
  if (auto* s = std::get_if<std::int64_t>(&v.scalar); s && v.type != GgufType::Array) return *s;
  fail(wrong_type(key, "an integer", v));
}

std::uint64_t GgufFile::get_uint(std::string_view key) const {
  const std::int64_t v = get_int(key);
  if (v < 0)
    fail("metadata '" + config::printable(key) + "' = " + std::to_string(v) + ", expected a non-negative value");
  return static_cast<std::uint64_t>(v);
}

double GgufFile::get_float(std::string_view key) const {
  const GgufValue& v = get(key);
  if (v.type == GgufType::Array || v.type == GgufType::String || v.type == GgufType::Bool)
    fail(wrong_type(key, "a number", v));
  if (auto* d = std::get_if<double>(&v.scalar)) return *d;
  return static_cast<double>(get_int(key));
}

bool GgufFile::get_bool(std::string_view key) const {
  const GgufValue& v = get(key);
  if (v.type != GgufType::Bool) fail(wrong_type(key, "bool", v));
  return std::get<bool>(v.scalar);
}

std::string_view GgufFile::get_string(std::string_view key) const {
  const GgufValue& v = get(key);
  if (v.type != GgufType::String) fail(wrong_type(key, "string", v));
  return std::get<std::string_view>(v.scalar);
}

const std::vector<std::string_view>& GgufFile::get_string_array(std::string_view key) const {
  const GgufValue& v = get(key);
  if (v.type != GgufType::Array || v.elem_type != GgufType::String) fail(wrong_type(key, "array of string", v));
  return v.strings;
}

std::vector<std::int64_t> GgufFile::get_int_array(std::string_view key) const {
  const GgufValue& v = get(key);
  if (v.type != GgufType::Array) fail(wrong_type(key, "array of integers", v));
  std::vector<std::int64_t> out(v.count);
  const std::size_t es = gguf_scalar_size(v.elem_type);
  for (std::uint64_t i = 0; i < v.count; ++i) {
    const std::uint8_t* p = v.raw + i * es;
    switch (v.elem_type) {
      case GgufType::U8:
        out[i] = *p;
        break;
      case GgufType::I8:
        out[i] = static_cast<std::int8_t>(*p);
        break;
      case GgufType::U16: {
        std::uint16_t x;
        std::memcpy(&x, p, 2);
        out[i] = x;
        break;
      }
      case GgufType::I16: {
        std::int16_t x;
        std::memcpy(&x, p, 2);
        out[i] = x;
        break;
      }
      case GgufType::U32: {
        std::uint32_t x;
        std::memcpy(&x, p, 4);
        out[i] = x;
        break;
      }
      case GgufType::I32: {
        std::int32_t x;
        std::memcpy(&x, p, 4);
        out[i] = x;
        break;
      }
      case GgufType::U64: {
        std::uint64_t x;
        std::memcpy(&x, p, 8);
        out[i] = static_cast<std::int64_t>(x);
        break;
      }
      case GgufType::I64: {
        std::int64_t x;
        std::memcpy(&x, p, 8);
        out[i] = x;
        break;
      }
      default:
        fail("metadata '" + config::printable(key) + "' is an array of " + std::string(gguf_type_name(v.elem_type)) +
             ", expected integers");
    }
  }
  return out;
}

std::vector<double> GgufFile::get_float_array(std::string_view key) const {
  const GgufValue& v = get(key);
  if (v.type != GgufType::Array || (v.elem_type != GgufType::F32 && v.elem_type != GgufType::F64))
    fail(wrong_type(key, "array of float", v));
  std::vector<double> out(v.count);
  for (std::uint64_t i = 0; i < v.count; ++i) {
    if (v.elem_type == GgufType::F32) {
      float x;
      std::memcpy(&x, v.raw + i * 4, 4);
      out[i] = x;
    } else {
      std::memcpy(&out[i], v.raw + i * 8, 8);
    }
  }
  return out;
}

}  // namespace specactor::model
