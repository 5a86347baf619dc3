// drafters/drafter.hpp — the draft algorithm interface (plain C++, no CAF) and the registry that maps
// the algorithm named in the draft snapshot to an implementation. A host application can register
// its own algorithm before it builds an engine.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config/snapshot.hpp"
#include "drafters/draft_cache.hpp"
#include "drafters/suffix_store.hpp"
#include "kernels/cpu/sampling.hpp"
#include "model/kv_cache.hpp"
#include "model/llama.hpp"
#include "model/model_info.hpp"
#include "model/tokenizer.hpp"

namespace specactor::drafters {

// What a drafter may know about the target when it is built.
struct DraftContext {
  model::ModelInfo target_info;
  std::shared_ptr<const model::Tokenizer> tokenizer;
  // The target's weights (immutable; heads share its embedding and output head) and a read-only
  // handle on its KV pool (FROZEN_KV_MTP reads committed pages through it; nothing here can write).
  // Null when the target runs elsewhere.
  std::shared_ptr<const model::LlamaWeights> target_weights;
  std::shared_ptr<const model::KvCache> target_kv;
};

// What a drafter needs from the target besides tokens: the outputs of these target layers for every
// committed row (EAGLE: the last layer; EAGLE3: three), and/or a read-only view of its KV pages.
struct DrafterNeeds {
  std::vector<std::int32_t> hidden_layers;
  bool target_kv = false;
};

// The target's output for one request since the last proposal: hidden rows (one per committed token,
// in order, each hidden_layers.size() × hidden floats, the layers concatenated) starting at context
// position `first`, and the request's committed KV pages (target_kv only).
struct TargetFeatures {
  const std::vector<float>& hidden;
  std::int64_t first = 0;
  const std::vector<std::int32_t>& kv_pages;
  std::int64_t kv_length = 0;
};

// A proposal: draft tokens and, for each, its parent (-1 = the root, i.e. the last token of the
// context; else the index of an earlier draft token). A chain is parents = [-1, 0, 1, ...].
struct DraftTree {
  std::vector<std::int32_t> tokens;
  std::vector<std::int32_t> parents;
  // Drafters that sample (chain rejection sampling, --speculative-use-rejection-sampling): the
  // distribution each chain token was drawn from, tokens.size() × vocab. Empty for deterministic drafts.
  std::vector<float> probs;
  // Head drafters: each token's path probability under the head (the product of its probabilities
  // from the root down to the token). Empty when the drafter has none.
  std::vector<float> scores;
  static DraftTree chain(std::vector<std::int32_t> tokens);
};

// One request of a proposal round (Drafter::propose_batch).
struct ProposeArgs {
  std::uint64_t req = 0;
  const std::vector<std::int32_t>* context = nullptr;
  std::int32_t max_nodes = 0, max_depth = 0;
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  // At most max_nodes draft tokens, at most max_depth deep, that might follow `context` (the
  // request's whole sequence so far; its last token is the root). This is the one channel through
  // which a drafter learns what the target accepted: stateful drafters compare `context` with what
  // they have seen (and roll back or extend their own state) here.
  virtual DraftTree propose(std::uint64_t req, const std::vector<std::int32_t>& context, std::int32_t max_nodes,
                            std::int32_t max_depth) = 0;
  // Every request of one round (after each one's observe): the same trees as propose one by one —
  // drafters whose model runs per row (the heads) run the requests' rows together, so a round of k
  // requests reads the draft weights once per level, not k times.
  virtual std::vector<DraftTree> propose_batch(const std::vector<ProposeArgs>& round) {
    std::vector<DraftTree> out;
    out.reserve(round.size());
    for (const ProposeArgs& a : round) out.push_back(propose(a.req, *a.context, a.max_nodes, a.max_depth));
    return out;
  }
  // The request's sampling parameters and seed, given before each propose (drafters that sample use them).
  virtual void set_sampling(std::uint64_t req, const kernels::SamplingParams& params, std::uint64_t seed) {
    (void)req, (void)params, (void)seed;
  }
  virtual void release(std::uint64_t req) { (void)req; }
  virtual DrafterNeeds needs() const { return {}; }
  // Called before propose with what the target produced for req since the last call.
  virtual void observe(std::uint64_t req, const TargetFeatures& features) { (void)req, (void)features; }
  // The draft model's config as JSON text (heads: kind, shapes, draft/hot vocabulary); "{}" if none.
  virtual std::string model_config() const { return "{}"; }
  // A new draft snapshot arrived (e.g. another step count); the drafter reads what it needs.
  virtual void reconfigure(const config::Snapshot& snapshot) { (void)snapshot; }
  // The drafter's own prefix cache (drafters/draft_cache.hpp), for drafters with KV of their own.
  virtual DraftCacheStats cache_stats() const { return {}; }
  // Empties it of every page no request runs on (with the target's /flush_cache); returns how many.
  virtual std::int64_t flush_cache() { return 0; }
};

// Prompt lookup (drafters/ngram.cpp): what followed the latest earlier occurrence of the longest
// suffix of `context` between min_window and max_window tokens long, at most max_len tokens; empty
// when no suffix of min_window tokens recurs.
std::vector<std::int32_t> latest_match_continuation(const std::vector<std::int32_t>& context, std::int64_t min_window,
                                                    std::int64_t max_window, std::int64_t max_len);

// Merges a chain below the root into `tree`: it follows the nodes the tree already has and adds the
// rest (with `score` when every node of the tree has a score; -1 = none, so the scheduler's
// acceptance model keeps them apart from the head's own nodes) until max_new nodes are added.
// Returns the number added.
std::int32_t merge_chain(DraftTree& tree, const std::vector<std::int32_t>& chain, std::int32_t max_new,
                         float score = -1.0f);

// SUFFIX (drafters/suffix.cpp): the matches' continuations as a trie of at most max_nodes nodes and
// `breadth` children per node, scored by the share of matches through a node times Π L / (L + 2)
// over the nodes of its path (L: a node's longest match).
DraftTree tree_from_matches(const std::vector<SuffixStore::Match>& matches, std::int32_t max_nodes,
                            std::int32_t breadth);

using DrafterFactory =
    std::function<std::unique_ptr<Drafter>(const config::Snapshot& draft_snapshot, const DraftContext& context)>;

// Registers (or replaces) the factory of an algorithm under its name: a built-in's ("NGRAM", or an
// alias such as "NEXTN") replaces that built-in; any other well-formed name (a letter, then letters,
// digits or '_'; any case, kept in upper case) adds an algorithm that `--speculative-algorithm NAME`
// then selects. Throws std::invalid_argument for a malformed name. The factory is called on the draft
// worker with the draft snapshot, which config::derive_draft made from the target's resolved snapshot;
// the worker keeps that same snapshot (drafters/README in docs/speculative-decoding.md).
void register_drafter(const std::string& algorithm, DrafterFactory factory);
// The factory for the algorithm of `draft_snapshot`, or of a name; throws std::runtime_error naming
// the algorithm and the registered ones when none is registered.
DrafterFactory find_drafter(const config::Snapshot& draft_snapshot);
DrafterFactory find_drafter(const std::string& algorithm);
// Throws config::ConfigError ("--speculative-algorithm NAME: ...") when `args` names an algorithm no
// drafter is registered for (NONE and AUTO pass): the engine asks before it loads a model.
void check_registered(const config::ServerArgs& args);
std::vector<std::string> registered_drafters();

}  // namespace specactor::drafters
