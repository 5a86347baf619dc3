// drafters/draft_cache.hpp — a drafter's own prefix cache: the radix tree of model/prefix_tree.hpp
// over the drafter's KV pool (STANDALONE: the draft model's KV; EAGLE/EAGLE3/MTP with one layer: the
// head's KV), keyed by the token ids its slots depend on. The target's cache lives in the scheduler,
// in another actor; this one follows the same rules on the drafter's side: a request starts on the
// longest cached run of whole pages, its pages go into the tree as soon as its prompt is drafted
// from and again when it ends, least-recently-used unlocked leaves are evicted when the pool needs
// pages. Pages are shared by reference (KvCache::retain/drop): the tree holds one reference on each
// page it keeps. Plain C++, no CAF.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/kv_cache.hpp"
#include "model/prefix_tree.hpp"

namespace specactor::drafters {

struct DraftCacheStats {
  std::int64_t query_tokens = 0;  // slots asked for at requests' starts
  std::int64_t hit_tokens = 0;    // slots found cached (their draft prefill skipped)
  std::int64_t pages = 0;         // pages the tree holds now
  std::int64_t evicted_pages = 0;
};

class DraftCache {
 public:
  // `enabled` false (--disable-radix-cache): every call does nothing.
  DraftCache(model::KvCache& kv, bool enabled);
  ~DraftCache();
  DraftCache(const DraftCache&) = delete;
  DraftCache& operator=(const DraftCache&) = delete;

  // A request's slots and the lock on what it runs on.
  struct Entry {
    model::PrefixTree::Node* lock = nullptr;
  };

  // At a request's start (`seq` empty): the longest cached run of key[0, limit) in whole pages,
  // which `seq` adopts; returns its length in slots (0: nothing cached).
  std::int64_t start(Entry& e, const std::vector<std::int32_t>& key, std::int64_t limit, model::KvCache::Seq& seq);
  // Puts the whole pages of seq's first `slots` slots (keyed by key[0, slots)) into the tree and moves
  // the request's lock to them.
  void insert(Entry& e, const std::vector<std::int32_t>& key, std::int64_t slots, const model::KvCache::Seq& seq);
  // The request is done with its pages (after a last insert).
  void finish(Entry& e);
  // Evicts until the pool has `pages` free pages, if the tree can give them.
  void make_room(std::int64_t pages);
  // Gives up every page no request runs on; returns how many.
  std::int64_t flush();

  const DraftCacheStats& stats() const { return stats_; }

 private:
  void give_up(const std::vector<std::int32_t>& pages);
  model::KvCache& kv_;
  std::unique_ptr<model::PrefixTree> tree_;
  DraftCacheStats stats_;
};

}  // namespace specactor::drafters
