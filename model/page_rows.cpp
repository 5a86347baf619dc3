#include "model/page_rows.hpp"

#include <algorithm>
#include <stdexcept>

namespace specactor::model {

void PageRows::write(const std::vector<int>& capture, std::int64_t width, std::uint64_t req,
                     const std::vector<std::int32_t>& table, std::int64_t slot, const float* row) {
  if (width <= 0 || slot < 0 || slot / page_size_ >= static_cast<std::int64_t>(table.size())) return;
  if (!rows_ || capture != capture_ || width != width_) {
    // Not value-initialised: a page's rows become resident when written.
    rows_ = std::make_unique_for_overwrite<float[]>(static_cast<std::size_t>(pages_ * page_size_ * width));
    capture_ = capture;
    width_ = width;
    state_.assign(static_cast<std::size_t>(pages_), Page{});
  }
  const std::int32_t page = table[static_cast<std::size_t>(slot / page_size_)];
  if (page < 0 || page >= pages_) return;
  const std::int64_t r = slot % page_size_;
  Page& p = state_[static_cast<std::size_t>(page)];
  if (r == 0) {
    p = Page{req, 0, 0};
  } else if (p.writer != req || p.filled != r) {
    p.filled = -1;
  }
  if (p.filled >= 0) ++p.filled;
  std::copy(row, row + width, at(page, r));
}

void PageRows::kept(std::uint64_t req, std::int32_t page) {
  if (!rows_ || page < 0 || page >= pages_) return;
  Page& p = state_[static_cast<std::size_t>(page)];
  p.served = p.writer == req && p.filled > 0 ? p.filled : 0;
}

bool PageRows::copy(std::uint64_t req, std::int32_t from, std::int32_t to, std::int64_t n) {
  if (!rows_ || from < 0 || from >= pages_ || to < 0 || to >= pages_ || n <= 0 || n >= page_size_) return false;
  if (state_[static_cast<std::size_t>(from)].served < n) return false;
  std::copy(at(from, 0), at(from, 0) + n * width_, at(to, 0));
  state_[static_cast<std::size_t>(to)] = Page{req, n, 0};
  return true;
}

bool PageRows::has(const std::vector<int>& capture, const std::vector<std::int32_t>& table, std::int64_t len) const {
  if (!rows_ || capture != capture_ || len < 0) return false;
  const std::int64_t n = (len + page_size_ - 1) / page_size_;
  if (n > static_cast<std::int64_t>(table.size())) return false;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int32_t page = table[static_cast<std::size_t>(i)];
    if (page < 0 || page >= pages_ || state_[static_cast<std::size_t>(page)].served < page_size_) return false;
  }
  return true;
}

void PageRows::read(const std::vector<std::int32_t>& table, std::int64_t len, std::vector<float>& out) const {
  for (std::int64_t s = 0; s < len; ++s) {
    const float* src = at(table[static_cast<std::size_t>(s / page_size_)], s % page_size_);
    out.insert(out.end(), src, src + width_);
  }
}

}  // namespace specactor::model
