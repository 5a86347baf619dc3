// drafters/branches.hpp — the branches a model drafter (a head or a block drafter) may add to its
// own proposal: prompt lookup (--speculative-draft-ngram-tokens: what followed the latest earlier
// occurrence of the sequence's last tokens) and suffix matches over earlier requests
// (--speculative-draft-suffix-tokens). Each is merged into the proposal as a chain (merge_chain):
// nodes the drafter proposed too cost nothing, new ones are verified on top of its own and may reach
// deeper than its own depth.
#pragma once

#include <cstdint>
#include <vector>

#include "config/server_args.hpp"
#include "drafters/drafter.hpp"
#include "drafters/suffix_store.hpp"

namespace specactor::drafters {

class ProposalBranches {
 public:
  explicit ProposalBranches(const config::ServerArgs& s);
  // The branch lengths and match windows of a (new) draft snapshot.
  void configure(const config::ServerArgs& s);
  bool any() const { return ngram_tokens_ > 0 || suffix_tokens_ > 0; }
  // Merges both branches into t: each adds at most its own length in nodes, within max_nodes in all
  // and max_depth deep. `doc` is the request's document in the suffix store (opened on first use).
  void add(DraftTree& t, const std::vector<std::int32_t>& ctx, std::int32_t max_nodes, std::int32_t max_depth,
           SuffixStore::Handle& doc);
  // The request ended: its document stays searchable for later requests (within the store's capacity).
  void release(SuffixStore::Handle doc);

 private:
  std::int32_t ngram_tokens_ = 0, suffix_tokens_ = 0;
  std::int64_t ngram_min_match_ = 2, ngram_max_match_ = 12, suffix_max_match_ = 32;
  SuffixStore suffix_;
};

}  // namespace specactor::drafters
