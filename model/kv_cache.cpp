#include "model/kv_cache.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "config/error.hpp"

namespace specactor::model {

KvCache::KvCache(std::int64_t n_layers, std::int64_t n_kv_heads, std::int64_t head_dim, std::int64_t page_size,
                 std::int64_t max_total_tokens, bool host_storage)
    : n_layers_(n_layers), row_(n_kv_heads * head_dim), head_dim_(head_dim), page_size_(page_size) {
  if (n_layers <= 0 || row_ <= 0 || page_size <= 0 || max_total_tokens < page_size)
    throw std::invalid_argument("KvCache: bad shape (layers " + std::to_string(n_layers) + ", row " +
                                std::to_string(row_) + ", page " + std::to_string(page_size) + ", tokens " +
                                std::to_string(max_total_tokens) + ")");
  n_pages_ = max_total_tokens / page_size;
  page_stride_ = page_size_ * row_;
  // K and V of every layer, in bytes, computed in floating point first (no integer overflow).
  const double bytes = 2.0 * static_cast<double>(n_layers_) * static_cast<double>(n_pages_) *
                       static_cast<double>(page_stride_) * sizeof(float);
  const double phys = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGESIZE));
  auto refuse = [&](const std::string& why) {
    throw config::ConfigError("KV cache: " + std::to_string(max_total_tokens) + " tokens (--max-total-tokens) need " +
                              std::to_string(static_cast<long long>(bytes / (1 << 20))) + " MiB, " + why +
                              "; lower --max-total-tokens or --context-length");
  };
  if (host_storage && phys > 0 && bytes > phys)
    refuse("more than this machine's " + std::to_string(static_cast<long long>(phys / (1 << 20))) + " MiB of memory");
  if (bytes > 9.0e18) refuse("more than any address space");
  layer_stride_ = n_pages_ * page_stride_;
  const std::size_t n = static_cast<std::size_t>(n_layers_ * layer_stride_);
  if (host_storage) try {
      // Not value-initialised: pages become resident only when written.
      k_ = std::make_unique_for_overwrite<float[]>(n);
      v_ = std::make_unique_for_overwrite<float[]>(n);
    } catch (const std::bad_alloc&) {
      refuse("which could not be allocated");
    }
  refs_.assign(static_cast<std::size_t>(n_pages_), 0);
  free_.resize(static_cast<std::size_t>(n_pages_));
  for (std::int64_t i = 0; i < n_pages_; ++i)
    free_[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(n_pages_ - 1 - i);
}

void KvCache::reserve(Seq& seq, std::int64_t new_len) {
  const std::int64_t need = pages_for(new_len) - static_cast<std::int64_t>(seq.pages.size());
  if (need <= 0) return;
  if (need > free_pages()) throw KvExhausted(need, free_pages());
  for (std::int64_t i = 0; i < need; ++i) {
    seq.pages.push_back(free_.back());
    refs_[static_cast<std::size_t>(free_.back())] = 1;
    free_.pop_back();
  }
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
  if (--refs_[static_cast<std::size_t>(page)] == 0) free_.push_back(page);
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

std::int64_t KvCache::slot_offset(std::int64_t layer, const Seq& seq, std::int64_t slot) const {
  return layer * layer_stride_ + seq.pages[static_cast<std::size_t>(slot / page_size_)] * page_stride_ +
         (slot % page_size_) * head_dim_;
}

template <class Copy>
void KvCache::each_head(Copy&& copy) const {
  const std::int64_t hs = page_size_ * head_dim_;  // between one KV head's block of a page and the next
  for (std::int64_t h = 0; h * head_dim_ < row_; ++h) copy(h * hs, h * head_dim_);
}

void KvCache::write(std::int64_t layer, const Seq& seq, std::int64_t slot, const float* k, const float* v) {
  const std::int64_t at = slot_offset(layer, seq, slot);
  const auto bytes = static_cast<std::size_t>(head_dim_) * sizeof(float);
  each_head([&](std::int64_t pool, std::int64_t row) {
    std::memcpy(k_.get() + at + pool, k + row, bytes);
    std::memcpy(v_.get() + at + pool, v + row, bytes);
  });
}

void KvCache::read(std::int64_t layer, const Seq& seq, std::int64_t slot, float* k, float* v) const {
  const std::int64_t at = slot_offset(layer, seq, slot);
  const auto bytes = static_cast<std::size_t>(head_dim_) * sizeof(float);
  each_head([&](std::int64_t pool, std::int64_t row) {
    std::memcpy(k + row, k_.get() + at + pool, bytes);
    std::memcpy(v + row, v_.get() + at + pool, bytes);
  });
}

kernels::PagedKvView KvCache::view(std::int64_t layer, const Seq& seq) const {
  return {k_.get() + layer * layer_stride_,
          v_.get() + layer * layer_stride_,
          seq.pages.data(),
          page_size_,
          page_stride_,
          head_dim_,
          page_size_ * head_dim_};
}

void KvCache::copy_slot(const Seq& seq, std::int64_t from, std::int64_t to) {
  if (from == to) return;
  const auto bytes = static_cast<std::size_t>(head_dim_) * sizeof(float);
  for (std::int64_t l = 0; l < n_layers_; ++l) {
    const std::int64_t a = slot_offset(l, seq, to), b = slot_offset(l, seq, from);
    each_head([&](std::int64_t pool, std::int64_t) {
      std::memcpy(k_.get() + a + pool, k_.get() + b + pool, bytes);
      std::memcpy(v_.get() + a + pool, v_.get() + b + pool, bytes);
    });
  }
}

}  // namespace specactor::model
