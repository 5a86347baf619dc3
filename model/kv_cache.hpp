// model/kv_cache.hpp — the paged KV cache: one pool of pages per model, a page table per sequence.
//
// Storage: K and V each hold [layer][kv_head][page][page_size · head_dim] elements (float32, or
// float16/bfloat16 rounded to nearest even when written). A sequence's token at storage slot s lives
// in page pages[s / page_size], row s % page_size of each head's block, so one head's keys (and
// values) of a page are contiguous and attention streams them: V row by row (slot r at r · head_dim),
// K dimension by dimension (element d of slot r at d · page_size + r), so one vector load holds a
// dimension of 16 slots. Pages are taken from
// a free list on demand and returned on truncate/release; nothing is allocated per token. A page may
// be held by several sequences and the prefix cache at once (reference counts).
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/ops.hpp"  // PagedKvView, KvType

namespace specactor::model {

// The pool cannot supply the pages asked for. Nothing was changed; the caller may wait and retry.
class KvExhausted : public std::runtime_error {
 public:
  KvExhausted(std::int64_t need_pages, std::int64_t free_pages)
      : std::runtime_error("KV cache exhausted: need " + std::to_string(need_pages) + " more pages, " +
                           std::to_string(free_pages) + " free"),
        need(need_pages),
        free(free_pages) {}
  std::int64_t need, free;
};

// Deleter of the KV cache's anonymous mappings.
struct KvUnmap {
  std::size_t bytes = 0;
  void operator()(unsigned char* p) const;
};

class KvCache {
 public:
  struct Seq {
    std::vector<std::int32_t> pages;  // page table
    std::int64_t length = 0;          // slots in use
  };

  // host_storage false: page tables only (the rows live elsewhere, e.g. in a CUDA runner's device
  // pool); write/read/view/copy_slot must not be used then.
  KvCache(std::int64_t n_layers, std::int64_t n_kv_heads, std::int64_t head_dim, std::int64_t page_size,
          std::int64_t max_total_tokens, bool host_storage = true, kernels::KvType type = kernels::KvType::F32);
  bool has_host_storage() const { return k_ != nullptr; }
  // Makes every page of the pools resident now, for a small pool whose first writes would otherwise
  // fall in a timed step (a self-speculation draft's scratch pool). Not for a full-size pool: that
  // took seconds on a VM whose own memory faults in on first touch.
  void prefault();
  // Makes resident the start of every (layer, KV head) region of K and V, up to `bytes` of each: the
  // pages a first request takes (a new sequence gets the lowest free pages). With huge pages the
  // first write into each region zeroes a whole 2 MiB page — ~5 ms each on a VM whose memory faults
  // in on first touch — so a pool left cold charges its first request for that (a one-layer draft
  // head: 6 regions, ~30 ms in its first draft round). Does nothing without host storage.
  void warm(std::size_t bytes);
  kernels::KvType type() const { return type_; }
  // Bytes of K and V per token over every layer.
  std::int64_t bytes_per_token() const { return 2 * n_layers_ * row_ * kernels::kv_type_bytes(type_); }

  std::int64_t page_size() const { return page_size_; }
  std::int64_t total_pages() const { return n_pages_; }
  std::int64_t free_pages() const { return n_free_; }
  std::int64_t capacity_tokens() const { return n_pages_ * page_size_; }
  std::int64_t pages_for(std::int64_t tokens) const { return (tokens + page_size_ - 1) / page_size_; }
  std::int64_t row_floats() const { return row_; }
  std::int64_t n_layers() const { return n_layers_; }
  std::int64_t head_dim() const { return head_dim_; }

  // Grows seq's page table to hold new_len slots. Throws KvExhausted (and changes nothing) when the
  // pool is short. Each new page is the one after seq's last page when that is free, else the lowest
  // free one, so a sequence's pages mostly follow each other in memory (decode attention over pages
  // scattered through the pool measured 15-20 % slower than over consecutive ones).
  void reserve(Seq& seq, std::int64_t new_len);
  // Rolls seq back to new_len slots (e.g. rejected draft tokens) and lets go of whole unused pages.
  void truncate(Seq& seq, std::int64_t new_len);
  void release(Seq& seq) { truncate(seq, 0); }

  // Pages are shared by reference (the prefix cache): a page returns to the free list when its last
  // holder lets go. reserve() hands out pages with one reference (the sequence's).
  // An empty seq starts with `pages` (another holder's, full ones) as its first `length` slots.
  void adopt(Seq& seq, const std::vector<std::int32_t>& pages, std::int64_t length);
  void retain(std::int32_t page);
  void drop(std::int32_t page);
  std::int32_t refs(std::int32_t page) const { return refs_.at(static_cast<std::size_t>(page)); }

  // Stores the K and V rows (n_kv_heads × head_dim floats each, heads side by side) of one slot,
  // rounded to the cache's element type.
  void write(std::int64_t layer, const Seq& seq, std::int64_t slot, const float* k, const float* v);
  // Reads them back in the same form.
  void read(std::int64_t layer, const Seq& seq, std::int64_t slot, float* k, float* v) const;
  kernels::PagedKvView view(std::int64_t layer, const Seq& seq) const;
  // Copies the K and V rows of slot `from` to slot `to` in every layer (accepted-path compaction).
  void copy_slot(const Seq& seq, std::int64_t from, std::int64_t to);

 private:
  // Element offset of slot's page in a layer (KV head 0); k_at/v_at add the element's place: each KV
  // head has its own region of every page's blocks, so one head's pages follow each other in memory.
  std::int64_t page_offset(std::int64_t layer, const Seq& seq, std::int64_t slot) const;
  std::int64_t k_at(std::int64_t h, std::int64_t d, std::int64_t row) const {
    return h * head_region_ + d * page_size_ + row;
  }
  std::int64_t v_at(std::int64_t h, std::int64_t d, std::int64_t row) const {
    return h * head_region_ + row * head_dim_ + d;
  }
  std::int64_t n_layers_, row_, head_dim_, page_size_, n_pages_, page_stride_, head_region_, layer_stride_;
  kernels::KvType type_;
  std::int64_t elem_;  // bytes per element
  // Anonymous mappings with a huge-page hint, resident only where written (see the constructor).
  std::unique_ptr<unsigned char[], KvUnmap> k_, v_;
  // The free pages as bits (1: free); no free page lies below word low_word_.
  std::vector<std::uint64_t> free_bits_;
  std::int64_t n_free_ = 0, low_word_ = 0;
  std::int32_t take(std::int64_t prefer);
  void give(std::int32_t page);
  std::vector<std::int32_t> refs_;  // holders of each page (0: on the free list)
};

}  // namespace specactor::model
