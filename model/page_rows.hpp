// model/page_rows.hpp — the target's captured hidden rows, kept per KV page for the prefix cache.
//
// A head drafter (EAGLE, EAGLE3, MTP, FROZEN_KV_MTP) reads the target's hidden rows of every
// committed position. A prefix cache hit skips the target's forward over the cached positions, so
// their rows are kept beside the KV pages that hold them: slot s of a sequence's page table has its
// row at pages[s / page_size], row s % page_size here. A page's rows are handed out again only when
// they are known to belong to the page's current contents: written in order by one request, with
// the same captured layers, and taken into the cache from that request (kept()). Rank 0 only.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace specactor::model {

class PageRows {
 public:
  PageRows(std::int64_t pages, std::int64_t page_size) : pages_(pages), page_size_(page_size) {}

  // The row of `width` floats (the layers `capture`, concatenated) of request req's slot `slot`,
  // whose page table is `table`. A new capture set or width forgets every page.
  void write(const std::vector<int>& capture, std::int64_t width, std::uint64_t req,
             const std::vector<std::int32_t>& table, std::int64_t slot, const float* row);
  // The cache took `page` from request req: the rows req wrote into it in order are served from now
  // on (a whole page's, or a tail's first ones).
  void kept(std::uint64_t req, std::int32_t page);
  // Request req copied the first n slots of cached page `from` into its page `to`: their rows too,
  // if `from` serves them. Returns whether it did (`to` then continues in order from slot n).
  bool copy(std::uint64_t req, std::int32_t from, std::int32_t to, std::int64_t n);
  // Whether every page of `table` covering slots [0, len) has rows for `capture`.
  bool has(const std::vector<int>& capture, const std::vector<std::int32_t>& table, std::int64_t len) const;
  // Appends the rows of slots [0, len) to `out` (has() must hold).
  void read(const std::vector<std::int32_t>& table, std::int64_t len, std::vector<float>& out) const;

  std::int64_t width() const { return width_; }

 private:
  struct Page {
    std::uint64_t writer = 0;
    std::int64_t filled = 0;  // slots written in order by `writer` (-1: out of order)
    std::int64_t served = 0;  // rows taken into the cache (in order, by `writer`): read() may hand them out
  };
  float* at(std::int32_t page, std::int64_t row) const {
    return rows_.get() + (static_cast<std::int64_t>(page) * page_size_ + row) * width_;
  }
  std::int64_t pages_, page_size_, width_ = 0;
  std::vector<int> capture_;
  std::unique_ptr<float[]> rows_;  // pages × page_size × width, allocated at the first write
  std::vector<Page> state_;
};

}  // namespace specactor::model
