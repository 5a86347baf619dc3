// tests/support/draft_tree.hpp — reading a proposal (drafters::DraftTree) in tests.
#pragma once

#include <cstdint>
#include <vector>

#include "drafters/drafter.hpp"

namespace specactor::testing {

// How deep the path `chain` reaches below the root of `t`, following for each token the child that
// carries it: chain.size() when the whole chain is in the tree, less where it leaves it.
inline int path_depth(const drafters::DraftTree& t, const std::vector<std::int32_t>& chain) {
  std::int32_t at = -1;
  int depth = 0;
  for (const std::int32_t tok : chain) {
    std::int32_t next = -1;
    for (std::size_t j = 0; j < t.tokens.size() && next < 0; ++j)
      if (t.parents[j] == at && t.tokens[j] == tok) next = static_cast<std::int32_t>(j);
    if (next < 0) break;
    at = next;
    ++depth;
  }
  return depth;
}

}  // namespace specactor::testing
