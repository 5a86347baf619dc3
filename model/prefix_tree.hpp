// model/prefix_tree.hpp — the prefix cache's index: a radix tree over token ids at page
// granularity (no CAF, no KV storage here). The scheduling policy owns the one over the target's
// pages; the STANDALONE and head drafters keep one over their own KV pages (the same token ids).
//
// Every edge holds a whole number of KV pages: its tokens (a multiple of the page size) and, for each
// page, the id of the KV page that holds those tokens' keys and values. A lookup finds the longest
// prefix of a prompt held in whole pages; an insert adds what a request computed (splitting an edge
// where two sequences part at a page boundary) and says which of the request's pages the tree keeps;
// a request that runs on a cached prefix locks its path so it cannot be evicted under it; eviction
// takes least-recently-used unlocked leaves. Pages are ids only: the caller (the scheduler) tells the
// KV owner (the target worker) which pages the cache holds and which it lets go.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

namespace specactor::model {

class PrefixTree {
 public:
  struct Node;

  // What a lookup found: `tokens` (a multiple of the page size) are held in `pages`; `node` is the
  // deepest node the match reaches (lock it while a request uses those pages).
  struct Match {
    std::int64_t tokens = 0;
    std::vector<std::int32_t> pages;
    Node* node = nullptr;
  };

  explicit PrefixTree(std::int64_t page_size);
  ~PrefixTree();
  PrefixTree(const PrefixTree&) = delete;
  PrefixTree& operator=(const PrefixTree&) = delete;

  std::int64_t page_size() const { return page_size_; }

  // The longest prefix of tokens[0, limit) held in whole pages (limit is clamped to tokens.size()).
  // Marks what it walked as used now (for the LRU order).
  Match match(const std::vector<std::int32_t>& tokens, std::int64_t limit);

  // Adds tokens[0, pages.size() × page size), whose KV sits in `pages` (one id per page). Returns,
  // per page, whether the tree took it; a page it did not take holds tokens the tree already had
  // under another page, and stays the caller's. The path is marked used now.
  std::vector<bool> insert(const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& pages);

  // Past a whole-page match `m` of tokens[0, limit): the longest run of the next tokens that a cached
  // page starts with — the first page of one of m.node's children (the sequences part inside that
  // page), or m.node's tail (the partly filled last page a finished request left) — for a request to
  // copy into a page of its own (it cannot write into a shared page). `node` holds `page`: lock it
  // until the copy is made. tokens == 0: none.
  struct Partial {
    std::int32_t page = -1;
    std::int64_t tokens = 0;
    Node* node = nullptr;
  };
  Partial partial(const Match& m, const std::vector<std::int32_t>& tokens, std::int64_t limit) const;

  // A finished request's partly filled last page: `tokens` (fewer than a page) follow the whole pages
  // of the path root → node and sit at the start of `page`. The node keeps one tail: a new one
  // replaces a shorter or different one unless the node is locked (a request may be copying it) or is
  // the root. `gone`: the page of the tail replaced.
  struct Tail {
    bool taken = false;
    std::vector<std::int32_t> gone;
  };
  Tail set_tail(Node* node, std::vector<std::int32_t> tokens, std::int32_t page);

  // A request runs on the pages of the path root → node: none of them may be evicted until unlock.
  void lock(Node* node);
  void unlock(Node* node);

  // Frees at least `need` pages if it can, least-recently-used first among unlocked leaves (a leaf
  // goes whole, with its tail) and unlocked nodes' tails; returns the page ids given up.
  std::vector<std::int32_t> evict(std::int64_t need);
  // Gives up every page not under a lock (sglang's /flush_cache); returns them.
  std::vector<std::int32_t> flush();

  std::int64_t cached_pages() const { return cached_pages_; }
  // Pages evict() could give up now.
  std::int64_t evictable_pages() const;
  std::int64_t nodes() const { return nodes_; }

 private:
  std::int64_t page_size_;
  std::unique_ptr<Node> root_;
  std::int64_t cached_pages_ = 0, nodes_ = 0;
  std::uint64_t clock_ = 0;
};

// A node: the edge from its parent (tokens, one page id per page), children keyed by their edge's
// first page, how many requests lock it, when it was last used.
struct PrefixTree::Node {
  Node* parent = nullptr;
  std::vector<std::int32_t> tokens;
  std::vector<std::int32_t> pages;
  std::map<std::vector<std::int32_t>, std::unique_ptr<Node>> children;
  std::vector<std::int32_t> tail_tokens;  // the tail (see set_tail): fewer than a page of tokens
  std::int32_t tail_page = -1;
  std::int64_t locks = 0;
  std::uint64_t used = 0;
};

}  // namespace specactor::model
