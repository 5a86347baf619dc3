#include "drafters/draft_cache.hpp"

#include <algorithm>

namespace specactor::drafters {

DraftCache::DraftCache(model::KvCache& kv, bool enabled)
    : kv_(kv), tree_(enabled ? std::make_unique<model::PrefixTree>(kv.page_size()) : nullptr) {}

DraftCache::~DraftCache() = default;

std::int64_t DraftCache::start(Entry& e, const std::vector<std::int32_t>& key, std::int64_t limit,
                               model::KvCache::Seq& seq) {
  if (!tree_ || limit <= 0 || !seq.pages.empty()) return 0;
  stats_.query_tokens += limit;
  model::PrefixTree::Match m = tree_->match(key, limit);
  if (m.tokens == 0) return 0;
  kv_.adopt(seq, m.pages, m.tokens);
  tree_->lock(m.node);
  if (e.lock) tree_->unlock(e.lock);
  e.lock = m.node;
  stats_.hit_tokens += m.tokens;
  return m.tokens;
}

void DraftCache::insert(Entry& e, const std::vector<std::int32_t>& key, std::int64_t slots,
                        const model::KvCache::Seq& seq) {
  const std::int64_t P = kv_.page_size();
  slots = std::min({slots, seq.length, static_cast<std::int64_t>(key.size())});
  if (!tree_ || slots < P) return;
  const auto n = static_cast<std::size_t>(slots / P);
  if (seq.pages.size() < n) return;
  const std::vector<std::int32_t> pages(seq.pages.begin(), seq.pages.begin() + static_cast<std::ptrdiff_t>(n));
  const std::vector<bool> taken = tree_->insert(key, pages);
  for (std::size_t i = 0; i < n; ++i)
    if (taken[i]) kv_.retain(pages[i]);  // the tree's reference
  const model::PrefixTree::Match m = tree_->match(key, static_cast<std::int64_t>(n) * P);
  tree_->lock(m.node);
  if (e.lock) tree_->unlock(e.lock);
  e.lock = m.node;
  stats_.pages = tree_->cached_pages();
}

void DraftCache::finish(Entry& e) {
  if (tree_ && e.lock) tree_->unlock(e.lock);
  e.lock = nullptr;
}

void DraftCache::give_up(const std::vector<std::int32_t>& pages) {
  for (const std::int32_t p : pages) kv_.drop(p);
  stats_.evicted_pages += static_cast<std::int64_t>(pages.size());
  stats_.pages = tree_->cached_pages();
}

void DraftCache::make_room(std::int64_t pages) {
  if (!tree_ || pages <= kv_.free_pages()) return;
  // A page another request still holds frees nothing when the tree lets go: ask until enough are
  // free or the tree has nothing left to give.
  while (kv_.free_pages() < pages) {
    const std::vector<std::int32_t> gone = tree_->evict(pages - kv_.free_pages());
    if (gone.empty()) break;
    give_up(gone);
  }
}

std::int64_t DraftCache::flush() {
  if (!tree_) return 0;
  const std::vector<std::int32_t> gone = tree_->flush();
  give_up(gone);
  return static_cast<std::int64_t>(gone.size());
}

}  // namespace specactor::drafters
