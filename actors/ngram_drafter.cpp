// actors/ngram_drafter.cpp — NGRAM drafting (prompt lookup): find the longest recent suffix of the
// sequence that occurred earlier in it, and propose what followed that earlier occurrence.
#include <algorithm>

#include "actors/drafter.hpp"

namespace specactor::actors {

namespace {

class NgramDrafter final : public Drafter {
 public:
  explicit NgramDrafter(const config::Snapshot& s) { reconfigure(s); }

  std::vector<std::int32_t> propose(std::uint64_t, const std::vector<std::int32_t>& ctx, std::int32_t max_tokens) override {
    const auto n = static_cast<std::int64_t>(ctx.size());
    if (max_tokens <= 0 || n < 2) return {};
    for (std::int64_t w = std::min<std::int64_t>(max_window_, n - 1); w >= min_window_; --w) {
      const auto* suffix = ctx.data() + (n - w);
      // The most recent earlier occurrence of the suffix (ending before the suffix itself ends).
      for (std::int64_t end = n - 1; end >= w; --end) {
        if (!std::equal(suffix, suffix + w, ctx.data() + (end - w))) continue;
        const std::int64_t take = std::min<std::int64_t>(max_tokens, n - end);
        if (take <= 0) continue;
        return {ctx.begin() + end, ctx.begin() + end + take};
      }
    }
    return {};
  }

  void reconfigure(const config::Snapshot& s) override {
    min_window_ = s->speculative_ngram_min_match_window_size;
    max_window_ = s->speculative_ngram_max_match_window_size;
  }

 private:
  std::int64_t min_window_ = 1, max_window_ = 12;
};

}  // namespace

std::unique_ptr<Drafter> make_ngram_drafter(const config::Snapshot& snapshot, const DraftContext&) {
  return std::make_unique<NgramDrafter>(snapshot);
}

}  // namespace specactor::actors
