// drafters/branches.cpp — prompt-lookup and suffix branches merged into a model drafter's proposal.
#include "drafters/branches.hpp"

#include <algorithm>

#include "config/resolve.hpp"

namespace specactor::drafters {

ProposalBranches::ProposalBranches(const config::ServerArgs& s)
    : suffix_(s.speculative_suffix_cache_tokens, s.speculative_suffix_min_match) {
  configure(s);
}

void ProposalBranches::configure(const config::ServerArgs& s) {
  const config::DraftShapeArgs d = config::draft_shape_args(s);
  ngram_tokens_ = static_cast<std::int32_t>(d.ngram_tokens);
  ngram_min_match_ = d.ngram_min_match;
  ngram_max_match_ = std::max(ngram_min_match_, s.speculative_ngram_max_match_window_size);
  suffix_tokens_ = static_cast<std::int32_t>(d.suffix_tokens);
  suffix_max_match_ = s.speculative_suffix_max_match;
}

void ProposalBranches::add(DraftTree& t, const std::vector<std::int32_t>& ctx, std::int32_t max_nodes,
                           std::int32_t max_depth, SuffixStore::Handle& doc) {
  auto room_for = [&](std::int32_t branch) {
    const std::int32_t len = std::min(branch, max_depth);
    return std::pair{len, std::min(len, max_nodes - static_cast<std::int32_t>(t.tokens.size()))};
  };
  if (ngram_tokens_ > 0)
    if (auto [len, room] = room_for(ngram_tokens_); len > 0 && room > 0)
      merge_chain(t, latest_match_continuation(ctx, ngram_min_match_, ngram_max_match_, len), room);
  if (suffix_tokens_ <= 0) return;
  if (doc == 0) doc = suffix_.open();
  if (const std::size_t have = suffix_.length(doc); ctx.size() > have)
    suffix_.extend(doc, ctx.data() + have, ctx.size() - have);
  if (auto [len, room] = room_for(suffix_tokens_); len > 0 && room > 0) {
    const auto m = suffix_.lookup(ctx, suffix_max_match_, len, 1, doc);
    if (!m.empty()) merge_chain(t, m.front().continuation, room);
  }
}

void ProposalBranches::release(SuffixStore::Handle doc) {
  if (doc != 0) suffix_.close(doc);
}

}  // namespace specactor::drafters
