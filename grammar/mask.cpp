// grammar/mask.cpp — see mask.hpp.
#include "grammar/mask.hpp"

#include <algorithm>
#include <numeric>

#include "config/input.hpp"

namespace specactor::grammar {

namespace {

// Plain JSON string content: no quote, backslash or control byte, and whole valid UTF-8 characters
// (the matcher's rules: no overlong forms, no surrogates, nothing past U+10FFFF).
bool plain_string_content(const std::string& t) {
  for (const char ch : t) {
    const auto c = static_cast<std::uint8_t>(ch);
    if (c == '"' || c == '\\' || c < 0x20) return false;
  }
  return config::first_invalid_utf8(t) == std::string_view::npos;
}

}  // namespace

Vocabulary::Sorted Vocabulary::sort(const std::vector<std::string>& bytes, std::vector<std::int32_t> ids) {
  std::sort(ids.begin(), ids.end(), [&](std::int32_t a, std::int32_t b) {
    return bytes[static_cast<std::size_t>(a)] < bytes[static_cast<std::size_t>(b)];
  });
  Sorted s;
  s.lcp.assign(ids.size(), 0);
  for (std::size_t i = 1; i < ids.size(); ++i) {
    const std::string &cur = bytes[static_cast<std::size_t>(ids[i])],
                      &prev = bytes[static_cast<std::size_t>(ids[i - 1])];
    std::size_t k = 0;
    while (k < cur.size() && k < prev.size() && cur[k] == prev[k]) ++k;
    s.lcp[i] = static_cast<std::int32_t>(k);
  }
  s.ids = std::move(ids);
  return s;
}

Vocabulary::Vocabulary(std::vector<std::string> bytes, std::vector<bool> special, std::vector<std::int32_t> end_ids)
    : bytes_(std::move(bytes)), end_ids_(std::move(end_ids)) {
  std::vector<std::int32_t> text, not_plain;
  string_chars_.assign(bytes_.size(), 0);
  for (std::size_t id = 0; id < bytes_.size(); ++id) {
    const std::string& t = bytes_[id];
    std::int32_t n = 0;
    int escape = 0;  // bytes left of an escape (\x: 1, \uXXXX: 5)
    for (const char ch : t) {
      const auto c = static_cast<std::uint8_t>(ch);
      if (escape > 0) {
        escape = escape == 1 && c == 'u' ? 4 : escape - 1;
        continue;
      }
      if (c == '"') break;
      if (c == '\\') escape = 1;
      if (c < 0x80 || c >= 0xC0) ++n;  // not a continuation byte: a code point starts
    }
    string_chars_[id] = n;
    longest_ = std::max<std::int64_t>(longest_, static_cast<std::int64_t>(t.size()));
    if (t.empty() || (id < special.size() && special[id])) continue;
    const auto i = static_cast<std::int32_t>(id);
    text.push_back(i);
    (plain_string_content(t) ? plain_ : not_plain).push_back(i);
  }
  all_ = sort(bytes_, std::move(text));
  not_plain_ = sort(bytes_, std::move(not_plain));
}

// Sets the tokens of `s` the matcher accepts whole (tokens sharing a rejected prefix are skipped).
bool Vocabulary::walk(const Sorted& s, const Matcher& m, Mask& out) const {
  // levels[k]: the matcher after the first k bytes of the current token; `valid` of them are.
  std::vector<Matcher> levels(static_cast<std::size_t>(longest_ + 1), m);
  std::size_t valid = 1;
  bool any = false;
  for (std::size_t i = 0; i < s.ids.size();) {
    const std::string& t = bytes_[static_cast<std::size_t>(s.ids[i])];
    std::size_t k = std::min<std::size_t>(valid - 1, static_cast<std::size_t>(s.lcp[i]));
    bool ok = true;
    for (; k < t.size(); ++k)
      if (!levels[k].next(static_cast<std::uint8_t>(t[k]), levels[k + 1])) {
        ok = false;
        break;
      }
    if (ok) {
      out[static_cast<std::size_t>(s.ids[i] / 32)] |= 1u << (s.ids[i] % 32);
      any = true;
      valid = t.size() + 1;
      ++i;
      continue;
    }
    // Byte k failed: so does every following token that shares the first k + 1 bytes.
    valid = k + 1;
    ++i;
    while (i < s.ids.size() && static_cast<std::size_t>(s.lcp[i]) > k) ++i;
  }
  return any;
}

void Vocabulary::compute(const Matcher& m, Mask& out) const {
  out.assign(static_cast<std::size_t>((size() + 31) / 32), 0u);
  bool any = false;
  std::int64_t room = -1;
  if (m.inside_string(room)) {  // plain content: allowed by its length alone; walk only the rest
    for (const std::int32_t id : plain_)
      if (room < 0 || string_chars_[static_cast<std::size_t>(id)] <= room) {
        out[static_cast<std::size_t>(id / 32)] |= 1u << (id % 32);
        any = true;
      }
    any = walk(not_plain_, m, out) || any;
  } else {
    any = walk(all_, m, out);
  }
  if (m.accepting() || !any)  // the end where the grammar may end (or where it has nothing left to write)
    for (const std::int32_t id : end_ids_)
      if (id >= 0 && id < size()) out[static_cast<std::size_t>(id / 32)] |= 1u << (id % 32);
}

MaskCache::MaskCache(std::shared_ptr<const Vocabulary> vocab, std::size_t capacity)
    : vocab_(std::move(vocab)), capacity_(std::max<std::size_t>(capacity, 1)) {}

const Mask& MaskCache::mask(const Matcher& m) {
  std::int64_t room = 0;
  if (!m.bounded_string_room(vocab_->longest(), room)) return cached(m);
  Matcher relaxed = m;
  relaxed.relax_string_bound();
  bounded_ = cached(relaxed);
  bool any = false;
  for (std::size_t w = 0; w < bounded_.size(); ++w)
    for (std::uint32_t bits = bounded_[w]; bits != 0; bits &= bits - 1) {
      const auto id = static_cast<std::int32_t>(w * 32 + static_cast<std::size_t>(__builtin_ctz(bits)));
      if (vocab_->string_chars(id) > room)
        bounded_[w] &= ~(1u << (id % 32));
      else
        any = true;
    }
  if (!any)
    for (const std::int32_t id : vocab_->end_ids())
      if (id >= 0 && id < vocab_->size()) bounded_[static_cast<std::size_t>(id / 32)] |= 1u << (id % 32);
  return bounded_;
}

const Mask& MaskCache::cached(const Matcher& m) {
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
