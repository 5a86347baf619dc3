#include "model/kv_cache.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <vector>

#include "config/error.hpp"
#include "kernels/cpu/quant.hpp"

namespace specactor::model {

KvCache::KvCache(std::int64_t n_layers, std::int64_t n_kv_heads, std::int64_t head_dim, std::int64_t page_size,
                 std::int64_t max_total_tokens, bool host_storage, kernels::KvType type)
    : n_layers_(n_layers),
      row_(n_kv_heads * head_dim),
      head_dim_(head_dim),
      page_size_(page_size),
      type_(type),
      elem_(kernels::kv_type_bytes(type)) {
  if (n_layers <= 0 || row_ <= 0 || page_size <= 0 || max_total_tokens < page_size)
    throw std::invalid_argument("KvCache: bad shape (layers " + std::to_string(n_layers) + ", row " +
                                std::to_string(row_) + ", page " + std::to_string(page_size) + ", tokens " +
                                std::to_string(max_total_tokens) + ")");
  n_pages_ = max_total_tokens / page_size;
  page_stride_ = page_size_ * head_dim_;  // one KV head's block of a page
  head_region_ = n_pages_ * page_stride_;
  // K and V of every layer, in bytes, computed in floating point first (no integer overflow).
  const double bytes = 2.0 * static_cast<double>(n_layers_) * static_cast<double>(n_pages_) *
                       static_cast<double>(page_size_ * row_) * static_cast<double>(elem_);
  const double phys = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGESIZE));
  auto refuse = [&](const std::string& why) {
    throw config::ConfigError("KV cache: " + std::to_string(max_total_tokens) + " tokens (--max-total-tokens) need " +
                              std::to_string(static_cast<long long>(bytes / (1 << 20))) + " MiB, " + why +
                              "; lower --max-total-tokens or --context-length");
  };
  if (host_storage && phys > 0 && bytes > phys)
    refuse("more than this machine's " + std::to_string(static_cast<long long>(phys / (1 << 20))) + " MiB of memory");
  if (bytes > 9.0e18) refuse("more than any address space");
  layer_stride_ = n_pages_ * page_size_ * row_;
  const std::size_t n = static_cast<std::size_t>(n_layers_ * layer_stride_ * elem_);
  if (host_storage) try {
      // Pages become resident when first written. The huge-page hint makes attention's streams
      // faster (decode attention over 2,048 / 7,936 keys, 30 layers resident: 15–25 % less time than
      // with 4 KiB pages, measured on the Zen 4 VM); its price is that the first write into each KV
      // head's region of a layer zeroes a whole 2 MiB page, once, on the first requests. Pre-faulting
      // the pools instead took seconds at start on a VM whose own memory faults in on first touch.
      auto map = [&]() {
        void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) throw std::bad_alloc();
        ::madvise(p, n, MADV_HUGEPAGE);  // a hint: where the kernel has none to give, 4 KiB pages serve
        return std::unique_ptr<unsigned char[], KvUnmap>(static_cast<unsigned char*>(p), KvUnmap{n});
      };
      k_ = map();
      v_ = map();
    } catch (const std::bad_alloc&) {
      refuse("which could not be allocated");
    }
  refs_.assign(static_cast<std::size_t>(n_pages_), 0);
  free_bits_.assign(static_cast<std::size_t>((n_pages_ + 63) / 64), 0);
  for (std::int64_t i = 0; i < n_pages_; ++i) give(static_cast<std::int32_t>(i));
}

std::int32_t KvCache::take(std::int64_t prefer) {
  auto is_free = [&](std::int64_t p) { return (free_bits_[static_cast<std::size_t>(p / 64)] >> (p % 64)) & 1U; };
  std::int64_t page = prefer;
  if (page < 0 || page >= n_pages_ || !is_free(page)) {
    while (free_bits_[static_cast<std::size_t>(low_word_)] == 0) ++low_word_;  // n_free_ > 0: one is set
    page = low_word_ * 64 + std::countr_zero(free_bits_[static_cast<std::size_t>(low_word_)]);
  }
  free_bits_[static_cast<std::size_t>(page / 64)] &= ~(std::uint64_t{1} << (page % 64));
  --n_free_;
  refs_[static_cast<std::size_t>(page)] = 1;
  return static_cast<std::int32_t>(page);
}

void KvCache::give(std::int32_t page) {
  free_bits_[static_cast<std::size_t>(page / 64)] |= std::uint64_t{1} << (page % 64);
  ++n_free_;
  low_word_ = std::min<std::int64_t>(low_word_, page / 64);
}

void KvCache::prefault() {
  if (k_) std::memset(k_.get(), 0, k_.get_deleter().bytes);
  if (v_) std::memset(v_.get(), 0, v_.get_deleter().bytes);
}

void KvCache::warm(std::size_t bytes) {
  if (!k_) return;
  const auto region = static_cast<std::size_t>(head_region_ * elem_);
  const std::size_t n = std::min(bytes, region);
  for (std::int64_t r = 0; r < n_layers_ * (row_ / head_dim_); ++r)
    for (unsigned char* base : {k_.get(), v_.get()}) std::memset(base + static_cast<std::size_t>(r) * region, 0, n);
}

void KvUnmap::operator()(unsigned char* p) const {
  if (p) ::munmap(p, bytes);
}

void KvCache::reserve(Seq& seq, std::int64_t new_len) {
  const std::int64_t need = pages_for(new_len) - static_cast<std::int64_t>(seq.pages.size());
  if (need <= 0) return;
  if (need > free_pages()) throw KvExhausted(need, free_pages());
  for (std::int64_t i = 0; i < need; ++i)
    seq.pages.push_back(take(seq.pages.empty() ? -1 : std::int64_t{seq.pages.back()} + 1));
}

void KvCache::adopt(Seq& seq, const std::vector<std::int32_t>& pages, std::int64_t length) {
  if (!seq.pages.empty() || seq.length != 0) throw std::logic_error("KvCache::adopt: the sequence already holds pages");
  if (length < 0 || length > static_cast<std::int64_t>(pages.size()) * page_size_)
    throw std::logic_error("KvCache::adopt: " + std::to_string(length) + " slots in " + std::to_string(pages.size()) +
                           " pages");
  for (const std::int32_t p : pages) retain(p);
  seq.pages = pages;
  seq.length = length;
}

void KvCache::retain(std::int32_t page) {
  if (page < 0 || page >= n_pages_ || refs_[static_cast<std::size_t>(page)] == 0)
    throw std::logic_error("KvCache::retain: page " + std::to_string(page) + " is not in use");
  ++refs_[static_cast<std::size_t>(page)];
}

void KvCache::drop(std::int32_t page) {
  if (page < 0 || page >= n_pages_ || refs_[static_cast<std::size_t>(page)] == 0)
    throw std::logic_error("KvCache::drop: page " + std::to_string(page) + " is not in use");
  if (--refs_[static_cast<std::size_t>(page)] == 0) give(page);
}

void KvCache::truncate(Seq& seq, std::int64_t new_len) {
  new_len = std::clamp<std::int64_t>(new_len, 0, seq.length);
  const auto keep = static_cast<std::size_t>(pages_for(new_len));
  while (seq.pages.size() > keep) {
    drop(seq.pages.back());
    seq.pages.pop_back();
  }
  seq.length = new_len;
}

std::int64_t KvCache::page_offset(std::int64_t layer, const Seq& seq, std::int64_t slot) const {
  return layer * layer_stride_ + seq.pages[static_cast<std::size_t>(slot / page_size_)] * page_stride_;
}

namespace {
// One element of a pool of `type` at element index i, as float.
float get(const unsigned char* pool, kernels::KvType type, std::int64_t i) {
  if (type == kernels::KvType::F32) {
    float x;
    std::memcpy(&x, pool + i * 4, 4);
    return x;
  }
  std::uint16_t h;
  std::memcpy(&h, pool + i * 2, 2);
  return type == kernels::KvType::F16 ? kernels::f16_to_f32(h) : kernels::bf16_to_f32(h);
}
}  // namespace

void KvCache::write(std::int64_t layer, const Seq& seq, std::int64_t slot, const float* k, const float* v) {
  const std::int64_t at = page_offset(layer, seq, slot), r = slot % page_size_;
  // The rows converted first (8 values at a time where the CPU can, the bits of the scalar conversions), then
  // placed: V a head's row at once, K one element per dimension.
  thread_local std::vector<std::uint16_t> k16, v16;
  const unsigned char* ks = reinterpret_cast<const unsigned char*>(k);
  const unsigned char* vs = reinterpret_cast<const unsigned char*>(v);
  if (type_ != kernels::KvType::F32) {
    k16.resize(static_cast<std::size_t>(row_));
    v16.resize(static_cast<std::size_t>(row_));
    const auto conv = type_ == kernels::KvType::F16 ? &kernels::f32_to_f16_n : &kernels::f32_to_bf16_n;
    conv(k, k16.data(), static_cast<std::size_t>(row_), true);
    conv(v, v16.data(), static_cast<std::size_t>(row_), true);
    ks = reinterpret_cast<const unsigned char*>(k16.data());
    vs = reinterpret_cast<const unsigned char*>(v16.data());
  }
  const auto e = static_cast<std::size_t>(elem_);
  for (std::int64_t h = 0; h * head_dim_ < row_; ++h) {
    const std::size_t from = static_cast<std::size_t>(h * head_dim_) * e;
    std::memcpy(v_.get() + (at + v_at(h, 0, r)) * elem_, vs + from, e * static_cast<std::size_t>(head_dim_));
    for (std::int64_t d = 0; d < head_dim_; ++d)
      std::memcpy(k_.get() + (at + k_at(h, d, r)) * elem_, ks + from + static_cast<std::size_t>(d) * e, e);
  }
}

void KvCache::read(std::int64_t layer, const Seq& seq, std::int64_t slot, float* k, float* v) const {
  const std::int64_t at = page_offset(layer, seq, slot), r = slot % page_size_;
  for (std::int64_t h = 0; h * head_dim_ < row_; ++h)
    for (std::int64_t d = 0; d < head_dim_; ++d) {
      k[h * head_dim_ + d] = get(k_.get(), type_, at + k_at(h, d, r));
      v[h * head_dim_ + d] = get(v_.get(), type_, at + v_at(h, d, r));
    }
}

kernels::PagedKvView KvCache::view(std::int64_t layer, const Seq& seq) const {
  return {k_.get() + layer * layer_stride_ * elem_,
          v_.get() + layer * layer_stride_ * elem_,
          seq.pages.data(),
          page_size_,
          page_stride_,
          head_dim_,
          head_region_,
          type_,
          true};
}

void KvCache::copy_slot(const Seq& seq, std::int64_t from, std::int64_t to) {
  if (from == to) return;
  const std::int64_t rt = to % page_size_, rf = from % page_size_;
  const auto e = static_cast<std::size_t>(elem_);
  for (std::int64_t l = 0; l < n_layers_; ++l) {
    const std::int64_t a = page_offset(l, seq, to), b = page_offset(l, seq, from);
    for (std::int64_t h = 0; h * head_dim_ < row_; ++h) {
      // V: the slot's row at once; K: one element per dimension.
      std::memcpy(v_.get() + (a + v_at(h, 0, rt)) * elem_, v_.get() + (b + v_at(h, 0, rf)) * elem_,
                  e * static_cast<std::size_t>(head_dim_));
      for (std::int64_t d = 0; d < head_dim_; ++d)
        std::memcpy(k_.get() + (a + k_at(h, d, rt)) * elem_, k_.get() + (b + k_at(h, d, rf)) * elem_, e);
    }
  }
}

}  // namespace specactor::model
