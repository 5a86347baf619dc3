// drafters/suffix_store.hpp — token documents of earlier and running requests, indexed so that the
// continuations of a context's last tokens can be found across all of them (suffix decoding).
//
// A document is a request's prompt followed by what it emitted; it grows as tokens are committed
// (extend) and becomes read-only when the request ends (close). Memory is bounded: past `capacity`
// tokens the oldest documents go first. Every `anchor`-token window is indexed by a hash; a lookup
// takes the context's last `anchor` tokens, then measures each candidate's real match length
// backwards (so a hash collision costs time, never a wrong match).
//
// Feeding it from elsewhere: add_document() takes any token run (a later shared prefix cache can
// hand it the prefixes it holds); nothing here knows about requests beyond the handles.
#pragma once

#include <cstdint>
#include <deque>
#include <unordered_map>
#include <vector>

namespace specactor::drafters {

class SuffixStore {
 public:
  using Handle = std::uint64_t;
  // capacity: most tokens kept over all documents (0: keep none once closed); anchor: indexed window.
  SuffixStore(std::int64_t capacity, std::int64_t anchor);

  Handle open();
  // Appends tokens to an open document (ignored for a document already evicted or closed).
  void extend(Handle doc, const std::int32_t* tokens, std::size_t n);
  void close(Handle doc);
  void add_document(const std::vector<std::int32_t>& tokens);
  // Tokens in an open document (0 when unknown).
  std::size_t length(Handle doc) const;

  struct Match {
    std::vector<std::int32_t> continuation;
    std::int32_t match_length = 0;
    Handle doc = 0;
  };
  // Up to max_results continuations (each at most max_len tokens, never empty) of the longest
  // matches of context's suffix (at least `anchor` and at most max_match tokens), longest match first,
  // then the most recent. `self`: the caller's own open document, whose current end is skipped.
  std::vector<Match> lookup(const std::vector<std::int32_t>& context, std::int64_t max_match, std::int64_t max_len,
                            std::size_t max_results, Handle self = 0) const;

  std::int64_t tokens() const { return total_; }
  std::size_t documents() const { return docs_.size(); }

 private:
  struct Doc {
    Handle id = 0;
    std::vector<std::int32_t> tokens;
    bool open = true;
  };
  struct Pos {
    Handle doc;
    std::uint32_t end;  // the indexed window is tokens[end - anchor, end)
  };
  const Doc* find(Handle id) const;
  Doc* find(Handle id);
  std::uint64_t key(const std::int32_t* window) const;
  void index(Doc& d, std::size_t from);
  void evict();
  void rebuild();

  std::int64_t capacity_, anchor_;
  std::deque<Doc> docs_;  // oldest first; ids increase
  Handle next_ = 1;
  std::int64_t total_ = 0;
  std::unordered_map<std::uint64_t, std::vector<Pos>> index_;
  std::int64_t indexed_ = 0, stale_ = 0;
};

}  // namespace specactor::drafters
