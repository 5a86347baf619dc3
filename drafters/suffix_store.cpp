// drafters/suffix_store.cpp — see suffix_store.hpp.
#include "drafters/suffix_store.hpp"

#include <algorithm>
#include <utility>

namespace specactor::drafters {

namespace {
constexpr std::size_t kMaxPerKey = 64;    // most recent positions kept per window
constexpr std::size_t kMaxChecked = 256;  // candidates measured per lookup
}  // namespace

SuffixStore::SuffixStore(std::int64_t capacity, std::int64_t anchor)
    : capacity_(std::max<std::int64_t>(capacity, 0)), anchor_(std::max<std::int64_t>(anchor, 1)) {}

const SuffixStore::Doc* SuffixStore::find(Handle id) const {
  // ids increase along the deque: binary search
  auto it = std::lower_bound(docs_.begin(), docs_.end(), id, [](const Doc& d, Handle h) { return d.id < h; });
  return it != docs_.end() && it->id == id ? &*it : nullptr;
}

SuffixStore::Doc* SuffixStore::find(Handle id) { return const_cast<Doc*>(std::as_const(*this).find(id)); }

std::uint64_t SuffixStore::key(const std::int32_t* w) const {
  std::uint64_t h = 1469598103934665603ull;
  for (std::int64_t i = 0; i < anchor_; ++i) {
    h ^= static_cast<std::uint32_t>(w[i]);
    h *= 1099511628211ull;
  }
  return h;
}

SuffixStore::Handle SuffixStore::open() {
  docs_.push_back({next_, {}, true});
  return next_++;
}

void SuffixStore::index(Doc& d, std::size_t from) {
  const auto a = static_cast<std::size_t>(anchor_);
  for (std::size_t end = std::max(from + 1, a); end <= d.tokens.size(); ++end) {
    auto& v = index_[key(d.tokens.data() + (end - a))];
    v.push_back({d.id, static_cast<std::uint32_t>(end)});
    if (v.size() > 2 * kMaxPerKey) {
      stale_ += static_cast<std::int64_t>(v.size() - kMaxPerKey);
      v.erase(v.begin(), v.end() - static_cast<long>(kMaxPerKey));
    }
    ++indexed_;
  }
}

void SuffixStore::extend(Handle doc, const std::int32_t* tokens, std::size_t n) {
  Doc* d = find(doc);
  if (!d || !d->open || n == 0) return;
  const std::size_t from = d->tokens.size();
  d->tokens.insert(d->tokens.end(), tokens, tokens + n);
  total_ += static_cast<std::int64_t>(n);
  index(*d, from);
  evict();
}

void SuffixStore::close(Handle doc) {
  if (Doc* d = find(doc)) d->open = false;
  evict();
}

void SuffixStore::add_document(const std::vector<std::int32_t>& tokens) {
  const Handle h = open();
  extend(h, tokens.data(), tokens.size());
  close(h);
}

std::size_t SuffixStore::length(Handle doc) const {
  const Doc* d = find(doc);
  return d ? d->tokens.size() : 0;
}

// The oldest closed documents go first (an open one is a running request: it stays, and counts).
void SuffixStore::evict() {
  bool dropped = false;
  while (total_ > capacity_) {
    auto it = std::find_if(docs_.begin(), docs_.end(), [](const Doc& d) { return !d.open; });
    if (it == docs_.end()) break;
    total_ -= static_cast<std::int64_t>(it->tokens.size());
    stale_ += static_cast<std::int64_t>(it->tokens.size());
    docs_.erase(it);
    dropped = true;
  }
  // Index entries of dropped documents are skipped by lookups; rebuilt once they are half the index.
  if (dropped && stale_ > indexed_ / 2 + 1024) rebuild();
}

void SuffixStore::rebuild() {
  index_.clear();
  indexed_ = stale_ = 0;
  for (Doc& d : docs_) index(d, 0);
}

std::vector<SuffixStore::Match> SuffixStore::lookup(const std::vector<std::int32_t>& ctx, std::int64_t max_match,
                                                    std::int64_t max_len, std::size_t max_results, Handle self) const {
  std::vector<Match> out;
  const auto n = static_cast<std::int64_t>(ctx.size());
  if (n < anchor_ || max_len <= 0 || max_results == 0) return out;
  auto it = index_.find(key(ctx.data() + (n - anchor_)));
  if (it == index_.end()) return out;
  const auto& cands = it->second;
  std::size_t checked = 0;
  for (auto c = cands.rbegin(); c != cands.rend() && checked < kMaxChecked; ++c) {  // most recent first
    const Doc* d = find(c->doc);
    if (!d) continue;
    const auto end = static_cast<std::int64_t>(c->end);
    if (end >= static_cast<std::int64_t>(d->tokens.size())) continue;  // nothing follows (e.g. our own end)
    if (d->id == self && end >= n) continue;  // a window not strictly before our own current end
    ++checked;
    std::int64_t len = 0;
    while (len < max_match && len < end && len < n &&
           d->tokens[static_cast<std::size_t>(end - 1 - len)] == ctx[static_cast<std::size_t>(n - 1 - len)])
      ++len;
    if (len < anchor_) continue;  // a hash collision
    const std::int64_t take = std::min<std::int64_t>(max_len, static_cast<std::int64_t>(d->tokens.size()) - end);
    Match m;
    m.continuation.assign(d->tokens.begin() + end, d->tokens.begin() + end + take);
    m.match_length = static_cast<std::int32_t>(len);
    m.doc = d->id;
    out.push_back(std::move(m));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Match& a, const Match& b) { return a.match_length > b.match_length; });
  if (out.size() > max_results) out.resize(max_results);
  return out;
}

}  // namespace specactor::drafters
