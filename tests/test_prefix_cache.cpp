// tests/test_prefix_cache.cpp — the prefix cache's parts without an engine: the radix tree over token
// ids at page granularity (match, insert, split, lock, LRU eviction, flush) against a brute-force
// model of what it holds, and the KV pool's page references (adopt, retain, drop: a page is free
// only when its last holder lets go).
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "model/kv_cache.hpp"
#include "model/prefix_tree.hpp"

using specactor::model::KvCache;
using specactor::model::PrefixTree;

namespace {

std::vector<std::int32_t> seq(std::initializer_list<std::int32_t> v) { return v; }

}  // namespace

TEST_CASE("prefix tree: whole pages match, a shorter match splits an edge, duplicates stay the caller's") {
  PrefixTree t(2);
  CHECK(t.match(seq({1, 2, 3, 4}), 4).tokens == 0);
  // A 6-token sequence in pages 10, 11, 12.
  const auto taken = t.insert(seq({1, 2, 3, 4, 5, 6, 7}), {10, 11, 12});
  CHECK(taken == std::vector<bool>{true, true, true});
  CHECK(t.cached_pages() == 3);
  CHECK(t.nodes() == 1);

  // Only whole pages: 5 matching tokens give 4; the limit is honoured.
  auto m = t.match(seq({1, 2, 3, 4, 5, 9}), 6);
  CHECK(m.tokens == 4);
  CHECK(m.pages == std::vector<std::int32_t>{10, 11});
  CHECK(t.nodes() == 2);  // the edge was split after page 11
  CHECK(t.match(seq({1, 2, 3, 4, 5, 6}), 5).tokens == 4);
  CHECK(t.match(seq({1, 2, 3, 4, 5, 6}), 6).pages == std::vector<std::int32_t>{10, 11, 12});
  CHECK(t.match(seq({1, 3}), 2).tokens == 0);  // differs inside the first page

  // Another sequence sharing two pages: its own copies of them stay the caller's.
  const auto taken2 = t.insert(seq({1, 2, 3, 4, 8, 8}), {20, 21, 22});
  CHECK(taken2 == std::vector<bool>{false, false, true});
  CHECK(t.cached_pages() == 4);
  CHECK(t.match(seq({1, 2, 3, 4, 8, 8}), 6).pages == std::vector<std::int32_t>{10, 11, 22});
  CHECK(t.match(seq({1, 2, 3, 4, 5, 6}), 6).pages == std::vector<std::int32_t>{10, 11, 12});
  // Inserting what is there already takes nothing.
  CHECK(t.insert(seq({1, 2, 3, 4}), {30, 31}) == std::vector<bool>{false, false});
}

TEST_CASE("prefix tree: locks keep a path from eviction, LRU leaves go first, flush frees the rest") {
  PrefixTree t(1);
  t.insert(seq({1, 2, 3}), {1, 2, 3});
  t.insert(seq({1, 2, 4}), {1, 2, 4});  // pages 1, 2 duplicated: only 4 taken
  t.insert(seq({5, 6}), {5, 6});
  CHECK(t.cached_pages() == 6);
  // Use [5, 6] last, lock [1, 2, 3].
  auto locked = t.match(seq({1, 2, 3}), 3);
  t.lock(locked.node);
  t.match(seq({5, 6}), 2);
  CHECK(t.evictable_pages() == 3);  // 4 and 5, 6
  // The oldest unlocked leaf is [4]: it goes first.
  CHECK(t.evict(1) == std::vector<std::int32_t>{4});
  CHECK(t.evictable_pages() == 2);
  // Then [5, 6] as a whole (a leaf goes whole); the locked path stays.
  CHECK(t.evict(1) == std::vector<std::int32_t>{5, 6});
  CHECK(t.evict(10).empty());
  CHECK(t.match(seq({1, 2, 3}), 3).tokens == 3);
  // A split under a lock: the lock still covers both halves.
  CHECK(t.match(seq({1, 9}), 2).tokens == 1);
  CHECK(t.evictable_pages() == 0);
  t.unlock(locked.node);
  CHECK(t.evictable_pages() == 3);
  auto all = t.flush();
  std::sort(all.begin(), all.end());
  CHECK(all == std::vector<std::int32_t>{1, 2, 3});
  CHECK(t.cached_pages() == 0);
  CHECK(t.nodes() == 0);
}

TEST_CASE("prefix tree: a partly matched page is found in a child's first page or a node's tail, tails evict") {
  PrefixTree t(4);
  t.insert(seq({1, 2, 3, 4, 5, 6, 7, 8}), {10, 11});
  // [1 2 3 4] matched whole, then 5 6 of page 11 (the sequences part inside it).
  auto m = t.match(seq({1, 2, 3, 4, 5, 6, 9, 9, 9}), 8);
  CHECK(m.tokens == 4);
  auto p = t.partial(m, seq({1, 2, 3, 4, 5, 6, 9, 9, 9}), 8);
  CHECK(p.page == 11);
  CHECK(p.tokens == 2);
  REQUIRE(p.node != nullptr);
  CHECK(p.node->pages == std::vector<std::int32_t>{11});
  // The limit bounds it, and never a whole page: 5 6 7 8 then more is a whole-page match instead.
  CHECK(t.partial(m, seq({1, 2, 3, 4, 5, 6, 9}), 5).tokens == 1);
  CHECK(t.partial(t.match(seq({1, 2, 3}), 3), seq({1, 2, 3}), 3).tokens == 3);  // inside the first page
  CHECK(t.partial(m, seq({1, 2, 3, 4, 8}), 5).tokens == 0);

  // A tail: 3 tokens after [1..8], in page 12.
  m = t.match(seq({1, 2, 3, 4, 5, 6, 7, 8}), 8);
  REQUIRE(m.tokens == 8);
  auto tail = t.set_tail(m.node, seq({20, 21, 22}), 12);
  CHECK(tail.taken);
  CHECK(tail.gone.empty());
  CHECK(t.cached_pages() == 3);
  const auto q = seq({1, 2, 3, 4, 5, 6, 7, 8, 20, 21, 30});
  auto mq = t.match(q, 10);
  p = t.partial(mq, q, 10);
  CHECK(p.page == 12);
  CHECK(p.tokens == 2);
  CHECK(p.node == mq.node);
  // A tail that adds nothing is not taken; a longer one replaces it, unless the node is locked.
  CHECK_FALSE(t.set_tail(m.node, seq({20, 21}), 13).taken);
  t.lock(p.node);
  CHECK_FALSE(t.set_tail(m.node, seq({20, 21, 22, 23}), 13).taken);
  CHECK(t.evictable_pages() == 0);
  t.unlock(p.node);
  tail = t.set_tail(m.node, seq({40, 41}), 13);  // a different one
  CHECK(tail.taken);
  CHECK(tail.gone == std::vector<std::int32_t>{12});
  CHECK(t.cached_pages() == 3);
  // No tail on the root, none of a whole page.
  CHECK_FALSE(t.set_tail(t.match(seq({7}), 1).node, seq({7}), 14).taken);
  CHECK_FALSE(t.set_tail(m.node, seq({1, 2, 3, 4}), 14).taken);

  // An interior node's tail can go alone; a leaf goes with its tail.
  t.insert(seq({1, 2, 3, 4, 9, 9, 9, 9}), {10, 15});  // [1 2 3 4] becomes an interior node
  const auto up = t.match(seq({1, 2, 3, 4}), 4);
  REQUIRE(up.tokens == 4);
  CHECK(t.set_tail(up.node, seq({50}), 16).taken);
  CHECK(t.cached_pages() == 5);               // 10, 11, 13 (tail), 15, 16 (tail)
  t.match(seq({1, 2, 3, 4, 9, 9, 9, 9}), 8);  // the [9 9 9 9] leaf and [1 2 3 4] used last
  t.match(seq({1, 2, 3, 4, 50}), 4);
  CHECK(t.evict(1) == std::vector<std::int32_t>{13, 11});  // the least recently used: the [5..8] leaf and its tail
  auto rest = t.flush();
  std::sort(rest.begin(), rest.end());
  CHECK(rest == std::vector<std::int32_t>{10, 15, 16});
  CHECK(t.cached_pages() == 0);
}

TEST_CASE("prefix tree: random inserts and lookups agree with a brute-force model, every page accounted for") {
  std::mt19937 rng(7);
  const std::int64_t P = 4;
  PrefixTree t(P);
  // The model: every cached page's tokens from the start (the key) → page id.
  std::map<std::vector<std::int32_t>, std::int32_t> model;
  std::int32_t next_page = 0;
  std::set<std::int32_t> owned_by_tree;
  for (int round = 0; round < 400; ++round) {
    // Sequences over a tiny alphabet share prefixes often.
    std::vector<std::int32_t> s(static_cast<std::size_t>(1 + rng() % 24));
    for (auto& x : s) x = static_cast<std::int32_t>(rng() % 2);
    const std::size_t whole = s.size() / P;
    // Brute force: the longest run of whole pages from the start that the model holds.
    std::vector<std::int32_t> expect;
    for (std::size_t k = 1; k <= whole; ++k) {
      const auto it = model.find(std::vector<std::int32_t>(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(k * P)));
      if (it == model.end()) break;
      expect.push_back(it->second);
    }
    if (rng() % 3 == 0) {
      const auto m = t.match(s, static_cast<std::int64_t>(s.size()));
      REQUIRE(m.pages == expect);
      REQUIRE(m.tokens == static_cast<std::int64_t>(expect.size()) * P);
    } else if (rng() % 5 == 0) {
      for (std::int32_t p : t.evict(1 + rng() % 3)) {
        REQUIRE(owned_by_tree.erase(p) == 1);
        // Eviction takes leaves: every key that maps to p goes, and nothing below it stays.
        for (auto it = model.begin(); it != model.end();) it = it->second == p ? model.erase(it) : std::next(it);
      }
      // What is left is still prefix-closed (no page whose shorter prefix is gone).
      for (const auto& [k, p] : model)
        if (k.size() > static_cast<std::size_t>(P))
          REQUIRE(model.count(std::vector<std::int32_t>(k.begin(), k.end() - P)) == 1);
    } else {
      std::vector<std::int32_t> pages;
      for (std::size_t k = 0; k < whole; ++k) pages.push_back(next_page++);
      const auto taken = t.insert(s, pages);
      for (std::size_t k = 0; k < whole; ++k) {
        const std::vector<std::int32_t> key(s.begin(), s.begin() + static_cast<std::ptrdiff_t>((k + 1) * P));
        REQUIRE(taken[k] == (k >= expect.size()));
        if (taken[k]) {
          model[key] = pages[k];
          owned_by_tree.insert(pages[k]);
        }
      }
    }
    REQUIRE(t.cached_pages() == static_cast<std::int64_t>(owned_by_tree.size()));
  }
  auto rest = t.flush();
  REQUIRE(std::set<std::int32_t>(rest.begin(), rest.end()) == owned_by_tree);
  CHECK(t.cached_pages() == 0);
}

TEST_CASE("KV pool: shared pages are freed by their last holder only") {
  KvCache kv(1, 1, 4, 2, 16);  // 8 pages of 2 slots
  KvCache::Seq a, b;
  kv.reserve(a, 4);
  a.length = 4;
  CHECK(kv.free_pages() == 6);
  const auto shared = a.pages;
  for (const auto p : shared) kv.retain(p);  // the cache takes a reference
  kv.adopt(b, shared, 4);
  CHECK(kv.refs(shared[0]) == 3);
  kv.reserve(b, 6);  // b grows past the shared pages into a page of its own
  b.length = 6;
  CHECK(kv.free_pages() == 5);
  kv.release(a);
  CHECK(kv.free_pages() == 5);  // still held by b and the cache
  kv.release(b);
  CHECK(kv.free_pages() == 6);  // b's own page is back; the shared ones are the cache's
  for (const auto p : shared) kv.drop(p);
  CHECK(kv.free_pages() == 8);
  CHECK_THROWS_AS(kv.drop(shared[0]), std::logic_error);
  KvCache::Seq c;
  kv.reserve(c, 2);
  CHECK_THROWS_AS(kv.adopt(c, shared, 2), std::logic_error);  // c already holds pages
}
