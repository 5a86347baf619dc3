// model/prefix_tree.cpp — see prefix_tree.hpp.
#include "model/prefix_tree.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace specactor::model {

namespace {

using Tokens = std::vector<std::int32_t>;

Tokens page_key(const Tokens& tokens, std::size_t at, std::int64_t page) {
  return Tokens(tokens.begin() + static_cast<std::ptrdiff_t>(at),
                tokens.begin() + static_cast<std::ptrdiff_t>(at + static_cast<std::size_t>(page)));
}

}  // namespace

PrefixTree::PrefixTree(std::int64_t page_size) : page_size_(page_size), root_(std::make_unique<Node>()) {
  if (page_size < 1) throw std::invalid_argument("PrefixTree: page size " + std::to_string(page_size));
}

PrefixTree::~PrefixTree() = default;

PrefixTree::Match PrefixTree::match(const std::vector<std::int32_t>& tokens, std::int64_t limit) {
  Match m;
  m.node = root_.get();
  const auto P = static_cast<std::size_t>(page_size_);
  const std::size_t end = static_cast<std::size_t>(std::clamp<std::int64_t>(limit, 0, std::int64_t(tokens.size())));
  const std::uint64_t now = ++clock_;
  root_->used = now;
  Node* n = root_.get();
  std::size_t at = 0;
  while (at + P <= end) {
    const auto it = n->children.find(page_key(tokens, at, page_size_));
    if (it == n->children.end()) break;
    Node* c = it->second.get();
    // Whole pages of this edge that match (the first one does, by its key).
    std::size_t pages = 0;
    while (pages < c->pages.size() && at + (pages + 1) * P <= end &&
           std::equal(c->tokens.begin() + static_cast<std::ptrdiff_t>(pages * P),
                      c->tokens.begin() + static_cast<std::ptrdiff_t>((pages + 1) * P),
                      tokens.begin() + static_cast<std::ptrdiff_t>(at + pages * P)))
      ++pages;
    c->used = now;
    m.pages.insert(m.pages.end(), c->pages.begin(), c->pages.begin() + static_cast<std::ptrdiff_t>(pages));
    at += pages * P;
    if (pages < c->pages.size()) {
      // The match ends inside this edge: split it there. The matched part becomes a new node above
      // c, and c keeps the rest with its identity, so a request holding c still locks all of it.
      auto upper = std::make_unique<Node>();
      upper->parent = n;
      upper->tokens.assign(c->tokens.begin(), c->tokens.begin() + static_cast<std::ptrdiff_t>(pages * P));
      upper->pages.assign(c->pages.begin(), c->pages.begin() + static_cast<std::ptrdiff_t>(pages));
      upper->locks = c->locks;  // every lock through c passes through its new parent
      upper->used = now;
      std::unique_ptr<Node> own = std::move(it->second);
      c->tokens.erase(c->tokens.begin(), c->tokens.begin() + static_cast<std::ptrdiff_t>(pages * P));
      c->pages.erase(c->pages.begin(), c->pages.begin() + static_cast<std::ptrdiff_t>(pages));
      c->parent = upper.get();
      Tokens key = page_key(c->tokens, 0, page_size_);
      upper->children.emplace(std::move(key), std::move(own));
      Node* up = upper.get();
      it->second = std::move(upper);
      ++nodes_;
      m.node = up;
      break;
    }
    m.node = c;
    n = c;
  }
  m.tokens = static_cast<std::int64_t>(at);
  return m;
}

std::vector<bool> PrefixTree::insert(const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& pages) {
  const auto P = static_cast<std::size_t>(page_size_);
  if (tokens.size() < pages.size() * P)
    throw std::invalid_argument("PrefixTree::insert: " + std::to_string(pages.size()) + " pages but " +
                                std::to_string(tokens.size()) + " tokens");
  std::vector<bool> taken(pages.size(), false);
  const Match m = match(tokens, static_cast<std::int64_t>(pages.size() * P));
  const auto have = static_cast<std::size_t>(m.tokens) / P;
  if (have == pages.size()) return taken;
  Node* at = m.node;
  auto leaf = std::make_unique<Node>();
  leaf->parent = at;
  leaf->tokens.assign(tokens.begin() + static_cast<std::ptrdiff_t>(have * P),
                      tokens.begin() + static_cast<std::ptrdiff_t>(pages.size() * P));
  leaf->pages.assign(pages.begin() + static_cast<std::ptrdiff_t>(have), pages.end());
  leaf->used = clock_;
  for (std::size_t i = have; i < pages.size(); ++i) taken[i] = true;
  cached_pages_ += static_cast<std::int64_t>(leaf->pages.size());
  Tokens key = page_key(leaf->tokens, 0, page_size_);
  at->children.emplace(std::move(key), std::move(leaf));
  ++nodes_;
  return taken;
}

void PrefixTree::lock(Node* node) {
  for (Node* n = node; n && n != root_.get(); n = n->parent) ++n->locks;
}

void PrefixTree::unlock(Node* node) {
  for (Node* n = node; n && n != root_.get(); n = n->parent)
    if (n->locks > 0) --n->locks;
}

std::int64_t PrefixTree::evictable_pages() const {
  // A node is evictable once nothing under it is locked: its own lock count covers its subtree
  // (lock() counts every node on the path), so unlocked nodes are exactly the evictable ones.
  std::int64_t n = 0;
  std::vector<const Node*> stack{root_.get()};
  while (!stack.empty()) {
    const Node* x = stack.back();
    stack.pop_back();
    if (x != root_.get() && x->locks == 0)
      n += static_cast<std::int64_t>(x->pages.size()) + (x->tail_page >= 0 ? 1 : 0);
    for (const auto& [k, c] : x->children) stack.push_back(c.get());
  }
  return n;
}

PrefixTree::Partial PrefixTree::partial(const Match& m, const std::vector<std::int32_t>& tokens,
                                        std::int64_t limit) const {
  Partial best;
  const Node* n = m.node ? m.node : root_.get();
  const auto at = static_cast<std::size_t>(m.tokens);
  const std::size_t end = static_cast<std::size_t>(std::clamp<std::int64_t>(limit, 0, std::int64_t(tokens.size())));
  if (at >= end) return best;
  auto common = [&](const std::vector<std::int32_t>& run, std::size_t len) {
    std::size_t j = 0;
    while (j < len && at + j < end && run[j] == tokens[at + j]) ++j;
    return static_cast<std::int64_t>(std::min<std::size_t>(j, static_cast<std::size_t>(page_size_ - 1)));
  };
  // Children are keyed by their first page: those that can share a first token sit together.
  for (auto it = n->children.lower_bound(Tokens{tokens[at]}); it != n->children.end() && it->first[0] == tokens[at];
       ++it) {
    const std::int64_t j = common(it->second->tokens, static_cast<std::size_t>(page_size_));
    if (j > best.tokens) best = {it->second->pages[0], j, it->second.get()};
  }
  if (n != root_.get() && n->tail_page >= 0) {
    const std::int64_t j = common(n->tail_tokens, n->tail_tokens.size());
    if (j > best.tokens) best = {n->tail_page, j, const_cast<Node*>(n)};
  }
  return best;
}

PrefixTree::Tail PrefixTree::set_tail(Node* node, std::vector<std::int32_t> tokens, std::int32_t page) {
  Tail t;
  if (!node || node == root_.get() || tokens.empty() || static_cast<std::int64_t>(tokens.size()) >= page_size_)
    return t;
  if (node->tail_page >= 0) {
    const bool covered = tokens.size() <= node->tail_tokens.size() &&
                         std::equal(tokens.begin(), tokens.end(), node->tail_tokens.begin());
    if (covered || node->locks > 0) return t;  // nothing new, or a request may be copying the old one
    t.gone.push_back(node->tail_page);
    --cached_pages_;
  }
  node->tail_tokens = std::move(tokens);
  node->tail_page = page;
  node->used = ++clock_;
  ++cached_pages_;
  t.taken = true;
  return t;
}

std::vector<std::int32_t> PrefixTree::evict(std::int64_t need) {
  std::vector<std::int32_t> freed;
  while (static_cast<std::int64_t>(freed.size()) < need) {
    // The least recently used unlocked leaf or unlocked node's tail.
    Node* best = nullptr;
    std::vector<Node*> stack{root_.get()};
    while (!stack.empty()) {
      Node* x = stack.back();
      stack.pop_back();
      if (x != root_.get() && x->locks == 0 && (x->children.empty() || x->tail_page >= 0) &&
          (!best || x->used < best->used))
        best = x;
      for (auto& [k, c] : x->children) stack.push_back(c.get());
    }
    if (!best) break;
    if (best->tail_page >= 0) {
      freed.push_back(best->tail_page);
      best->tail_page = -1;
      best->tail_tokens.clear();
      --cached_pages_;
    }
    if (!best->children.empty()) continue;  // only its tail went
    freed.insert(freed.end(), best->pages.begin(), best->pages.end());
    cached_pages_ -= static_cast<std::int64_t>(best->pages.size());
    Node* parent = best->parent;
    parent->children.erase(page_key(best->tokens, 0, page_size_));
    --nodes_;
  }
  return freed;
}

std::vector<std::int32_t> PrefixTree::flush() { return evict(cached_pages_); }

}  // namespace specactor::model
