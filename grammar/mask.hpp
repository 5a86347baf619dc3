// grammar/mask.hpp — which tokens a grammar allows next: the vocabulary sorted by bytes (tokens that
// share a prefix are walked once), and a cache of masks by matcher state (Matcher::key), so a state
// seen before — inside a free string, between properties — costs a lookup.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/matcher.hpp"

namespace specactor::grammar {

// One bit per token id: bit (id % 32) of word id / 32.
using Mask = std::vector<std::uint32_t>;
inline bool allowed(const Mask& m, std::int32_t id) {
  return id >= 0 && static_cast<std::size_t>(id / 32) < m.size() &&
         (m[static_cast<std::size_t>(id / 32)] >> (id % 32) & 1u);
}

class Vocabulary {
 public:
  // bytes[id]: what token id writes; special[id]: a control token (never written under a grammar);
  // end_ids: the tokens that end a generation (allowed where the grammar may end).
  Vocabulary(std::vector<std::string> bytes, std::vector<bool> special, std::vector<std::int32_t> end_ids);
  std::int64_t size() const { return static_cast<std::int64_t>(bytes_.size()); }
  std::int64_t longest() const { return longest_; }
  const std::string& bytes(std::int32_t id) const { return bytes_[static_cast<std::size_t>(id)]; }
  const std::vector<std::int32_t>& end_ids() const { return end_ids_; }
  // Code points token `id` writes inside a JSON string it starts in (up to a closing quote; an escape
  // counts one).
  std::int32_t string_chars(std::int32_t id) const { return string_chars_[static_cast<std::size_t>(id)]; }

  // The mask for a state, computed (no cache).
  void compute(const Matcher& m, Mask& out) const;

 private:
  std::vector<std::string> bytes_;
  // Text tokens by their bytes, with lcp[i] the bytes token i shares with token i - 1: all of them, and
  // those that are not plain string content (a quote, a backslash, a control byte, unfinished UTF-8).
  struct Sorted {
    std::vector<std::int32_t> ids, lcp;
  };
  static Sorted sort(const std::vector<std::string>& bytes, std::vector<std::int32_t> ids);
  bool walk(const Sorted& s, const Matcher& m, Mask& out) const;
  Sorted all_, not_plain_;
  std::vector<std::int32_t> plain_;  // plain string content: inside a string, allowed by its length alone
  std::vector<std::int32_t> end_ids_;
  std::vector<std::int32_t> string_chars_;
  std::int64_t longest_ = 0;
};

// Masks of one grammar's states (not thread-safe: the scheduler's thread owns it). At most
// `capacity` masks are kept (the least recently used go first).
class MaskCache {
 public:
  MaskCache(std::shared_ptr<const Vocabulary> vocab, std::size_t capacity = 512);
  const Mask& mask(const Matcher& m);
  // The bytes the grammar forces after `m` (each the only byte allowed, up to where a choice or the
  // end is possible; at most `limit`), cached by state like the masks.
  const std::string& forced(const Matcher& m, std::size_t limit = 48);
  const Vocabulary& vocabulary() const { return *vocab_; }
  std::int64_t computed() const { return computed_; }
  std::int64_t hits() const { return hits_; }

 private:
  std::shared_ptr<const Vocabulary> vocab_;
  std::size_t capacity_;
  std::list<std::pair<std::string, Mask>> lru_;  // most recent first
  std::unordered_map<std::string, std::list<std::pair<std::string, Mask>>::iterator> index_;
  std::unordered_map<std::string, std::string> forced_;  // cleared when it reaches the masks' capacity
  const Mask& cached(const Matcher& m);
  std::string key_;
  Mask bounded_;  // the last mask of a string with a maxLength (its unbounded mask, filtered)
  std::int64_t computed_ = 0, hits_ = 0;
};

}  // namespace specactor::grammar
