// grammar/mask.cpp — see mask.hpp.
#include "grammar/mask.hpp"

#include <algorithm>
#include <numeric>

namespace specactor::grammar {

Vocabulary::Vocabulary(std::vector<std::string> bytes, std::vector<bool> special, std::vector<std::int32_t> end_ids)
    : bytes_(std::move(bytes)), end_ids_(std::move(end_ids)) {
  for (std::size_t i = 0; i < bytes_.size(); ++i)
    if (!bytes_[i].empty() && !(i < special.size() && special[i])) sorted_.push_back(static_cast<std::int32_t>(i));
  std::sort(sorted_.begin(), sorted_.end(), [&](std::int32_t a, std::int32_t b) {
    return bytes_[static_cast<std::size_t>(a)] < bytes_[static_cast<std::size_t>(b)];
  });
  lcp_.assign(sorted_.size(), 0);
  for (std::size_t i = 0; i < sorted_.size(); ++i) {
    const std::string& cur = bytes_[static_cast<std::size_t>(sorted_[i])];
    longest_ = std::max<std::int64_t>(longest_, static_cast<std::int64_t>(cur.size()));
    if (i == 0) continue;
    const std::string& prev = bytes_[static_cast<std::size_t>(sorted_[i - 1])];
    std::size_t k = 0;
    while (k < cur.size() && k < prev.size() && cur[k] == prev[k]) ++k;
    lcp_[i] = static_cast<std::int32_t>(k);
  }
}

void Vocabulary::compute(const Matcher& m, Mask& out) const {
  out.assign(static_cast<std::size_t>((size() + 31) / 32), 0u);
  auto set = [&](std::int32_t id) { out[static_cast<std::size_t>(id / 32)] |= 1u << (id % 32); };
  // levels[k]: the matcher after the first k bytes of the current token; `valid` of them are.
  std::vector<Matcher> levels(static_cast<std::size_t>(longest_ + 1), m);
  std::size_t valid = 1;
  bool any = false;
  for (std::size_t i = 0; i < sorted_.size();) {
    const std::string& t = bytes_[static_cast<std::size_t>(sorted_[i])];
    std::size_t k = std::min<std::size_t>(valid - 1, static_cast<std::size_t>(lcp_[i]));
    bool ok = true;
    for (; k < t.size(); ++k)
      if (!levels[k].next(static_cast<std::uint8_t>(t[k]), levels[k + 1])) {
        ok = false;
        break;
      }
    if (ok) {
      set(sorted_[i]);
      any = true;
      valid = t.size() + 1;
      ++i;
      continue;
    }
    // Byte k failed: so does every following token that shares the first k + 1 bytes.
    valid = k + 1;
    ++i;
    while (i < sorted_.size() && static_cast<std::size_t>(lcp_[i]) > k) ++i;
  }
  if (m.accepting() || !any)  // the end where the grammar may end (or where it has nothing left to write)
    for (const std::int32_t id : end_ids_)
      if (id >= 0 && id < size()) set(id);
}

MaskCache::MaskCache(std::shared_ptr<const Vocabulary> vocab, std::size_t capacity)
    : vocab_(std::move(vocab)), capacity_(std::max<std::size_t>(capacity, 1)) {}

const Mask& MaskCache::mask(const Matcher& m) {
  m.key(vocab_->longest(), key_);
  if (const auto it = index_.find(key_); it != index_.end()) {
    ++hits_;
    lru_.splice(lru_.begin(), lru_, it->second);
    return it->second->second;
  }
  ++computed_;
  if (lru_.size() >= capacity_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  lru_.emplace_front(key_, Mask{});
  vocab_->compute(m, lru_.front().second);
  index_[key_] = lru_.begin();
  return lru_.front().second;
}

const std::string& MaskCache::forced(const Matcher& m, std::size_t limit) {
  m.key(vocab_->longest(), key_);
  if (const auto it = forced_.find(key_); it != forced_.end()) return it->second;
  if (forced_.size() >= capacity_) forced_.clear();
  std::string out;
  Matcher cur = m, next = m, only = m;
  while (out.size() < limit && !cur.accepting()) {
    int byte = -1;
    for (int b = 0; b < 256; ++b) {
      if (!cur.next(static_cast<std::uint8_t>(b), next)) continue;
      if (byte >= 0) {  // a choice
        byte = -2;
        break;
      }
      byte = b;
      std::swap(only, next);
    }
    if (byte < 0) break;
    out.push_back(static_cast<char>(byte));
    std::swap(cur, only);
  }
  return forced_.emplace(key_, std::move(out)).first->second;
}

}  // namespace specactor::grammar
