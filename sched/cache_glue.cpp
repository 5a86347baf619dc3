// sched/cache_glue.cpp — the policy's prefix-cache seam: what an admitted request starts on, the
// prompt cached once prefilled, what a retired request leaves to the cache, and eviction when pages
// are short. The tree itself (model/prefix_tree.hpp) knows nothing of requests.
#include <spdlog/spdlog.h>

#include "sched/policy.hpp"
#include "sched/policy_detail.hpp"

namespace specactor::sched {

// Every request may use the cache. A head drafter catches up on the target's hidden rows of every
// position, and the target computes none for cached positions: so with such a drafter every cacheable
// request keeps its captured rows with its pages (keep_hidden), and a hit hands them out again.
bool Scheduler::cacheable(const Sequence&) const { return tree_ != nullptr; }

void Scheduler::make_room(std::int64_t need) {
  if (!tree_ || need <= free_pages_) return;
  std::vector<std::int32_t> gone = tree_->evict(need - free_pages_);
  if (gone.empty()) return;
  free_pages_ += static_cast<std::int64_t>(gone.size());
  metrics_.cache_evicted_pages += static_cast<std::int64_t>(gone.size());
  if (cache_sink_) cache_sink_({0, {}, std::move(gone)});
}

// A prompt just prefilled goes into the tree at once (its whole pages), so requests admitted with the
// same prefix meanwhile can start on it (rematch). The pages the tree takes are the cache's from now
// on: out of the request's reservation, locked while it runs.
void Scheduler::cache_prompt(Sequence& r) {
  if (!tree_ || !r.cache.on || r.kv.length < limits_.page_size ||
      r.kv.pages.size() * static_cast<std::size_t>(limits_.page_size) < static_cast<std::size_t>(r.kv.length))
    return;
  const auto n = static_cast<std::size_t>(r.kv.length / limits_.page_size);
  const std::vector<std::int32_t> pages(r.kv.pages.begin(), r.kv.pages.begin() + static_cast<std::ptrdiff_t>(n));
  const std::vector<bool> taken = tree_->insert(r.seq, pages);
  std::vector<std::int32_t> keep;
  for (std::size_t i = 0; i < n; ++i)
    if (taken[i]) keep.push_back(pages[i]);
  const PrefixTree::Match m = tree_->match(r.seq, static_cast<std::int64_t>(n) * limits_.page_size);
  tree_->lock(m.node);
  if (r.cache.node) tree_->unlock(r.cache.node);
  r.cache.node = m.node;
  r.kv.reserved -= static_cast<std::int64_t>(keep.size());
  if (!keep.empty() && cache_sink_) cache_sink_({r.id(), std::move(keep), {}});
}

// Before a request's first prompt chunk: a longer prefix may have been cached since its admission
// (a request with the same prompt prefilled meanwhile); it starts there instead.
void Scheduler::rematch(Sequence& r) {
  if (!tree_ || !r.cache.on || r.prefilled != static_cast<std::size_t>(r.cache.tokens) || r.prompt_len < 2) return;
  const auto limit = static_cast<std::int64_t>(r.prompt_len) - 1;
  PrefixTree::Match m = tree_->match(r.seq, limit);
  const PrefixTree::Partial part = tree_->partial(m, r.seq, limit);
  if (m.tokens + part.tokens <= r.cache.tokens) return;
  PrefixTree::Node* lock = part.tokens > 0 ? part.node : m.node;
  tree_->lock(lock);
  if (r.cache.node) tree_->unlock(r.cache.node);
  const auto gained = static_cast<std::int64_t>(m.pages.size() - r.cache.pages.size());
  r.kv.reserved -= gained;  // those pages are the cache's: the reservation gives them back
  free_pages_ += gained;
  metrics_.cache_hit_tokens += m.tokens + part.tokens - r.cache.tokens;
  take_hit(r, lock, std::move(m), part);
}

// The request starts on a cache hit: whole pages, then a partly matched page to copy (if any).
void Scheduler::take_hit(Sequence& r, PrefixTree::Node* lock, PrefixTree::Match m, const PrefixTree::Partial& part) {
  r.cache.node = lock;
  r.cache.pages = std::move(m.pages);
  r.cache.copy_page = part.tokens > 0 ? part.page : -1;
  r.cache.copy_len = part.tokens;
  r.cache.tokens = m.tokens + part.tokens;
  r.prefilled = static_cast<std::size_t>(r.cache.tokens);
  r.m.cached_tokens = r.cache.tokens;
}

std::int64_t Scheduler::flush_cache() {
  if (!tree_) return 0;
  std::vector<std::int32_t> gone = tree_->flush();
  const auto n = static_cast<std::int64_t>(gone.size());
  free_pages_ += n;
  metrics_.cache_evicted_pages += n;
  if (cache_sink_ && n > 0) cache_sink_({0, {}, std::move(gone)});
  return n;
}

// A request retires: the prefix cache takes what it computed (whole pages of its committed KV, and
// its partly filled last page as a tail), unless it failed. Returns how many of its pages the cache
// kept (they stay in use; the rest return with the request's reservation); tells the KV owner.
std::int64_t Scheduler::leave_to_cache(Sequence& r, bool failed) {
  std::vector<std::int32_t> keep;
  bool insert =
      tree_ && r.cache.on && !failed && r.kv.length >= limits_.page_size &&
      r.kv.pages.size() * static_cast<std::size_t>(limits_.page_size) >= static_cast<std::size_t>(r.kv.length);
  if (insert) {
    const auto n = static_cast<std::size_t>(r.kv.length / limits_.page_size);
    const std::vector<std::int32_t> pages(r.kv.pages.begin(), r.kv.pages.begin() + static_cast<std::ptrdiff_t>(n));
    try {  // the tree checks its arguments before it changes: a refusal leaves it as it was
      const std::vector<bool> taken = tree_->insert(r.seq, pages);
      for (std::size_t i = 0; i < n; ++i)
        if (taken[i]) keep.push_back(pages[i]);
    } catch (const std::exception& e) {
      spdlog::error("internal error: the prefix cache refused request {}'s pages ({}); they are freed", r.id(),
                    e.what());
      insert = false;
    }
  }
  if (r.cache.node) tree_->unlock(r.cache.node);
  r.cache.node = nullptr;
  std::vector<std::int32_t> drop;
  if (insert && r.kv.length % limits_.page_size != 0) {
    // The partly filled last page becomes the tail of the node its whole pages end at: the next turn
    // of a conversation copies it instead of prefilling those tokens again.
    const auto whole = static_cast<std::size_t>(r.kv.length / limits_.page_size);
    const PrefixTree::Match m = tree_->match(r.seq, static_cast<std::int64_t>(whole) * limits_.page_size);
    if (m.tokens == static_cast<std::int64_t>(whole) * limits_.page_size && r.kv.pages.size() > whole) {
      PrefixTree::Tail t =
          tree_->set_tail(m.node,
                          std::vector<std::int32_t>(r.seq.begin() + static_cast<std::ptrdiff_t>(m.tokens),
                                                    r.seq.begin() + static_cast<std::ptrdiff_t>(r.kv.length)),
                          r.kv.pages[whole]);
      if (t.taken) keep.push_back(r.kv.pages[whole]);
      drop = std::move(t.gone);
      free_pages_ += static_cast<std::int64_t>(drop.size());
      metrics_.cache_evicted_pages += static_cast<std::int64_t>(drop.size());
    }
  }
  if ((!keep.empty() || !drop.empty()) && cache_sink_) cache_sink_({r.id(), keep, drop});
  return static_cast<std::int64_t>(keep.size());
}
}  // namespace specactor::sched
