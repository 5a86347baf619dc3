// sched/constrain.cpp — constrained output in the policy: each constrained request holds a matcher
// over what it emitted (grammar/matcher.hpp); every row the target samples gets the mask of the
// grammar state it continues (the root's, and each verified draft's path), drafts the grammar forbids
// are cut before they are verified, and the request ends once the grammar is complete. The target
// applies the masks after the request's rules, on plain and speculative rows alike, so greedy
// speculative output equals plain constrained output and sampling keeps the constrained distribution.
#include <spdlog/spdlog.h>

#include <chrono>

#include "config/server_args.hpp"
#include "sched/policy.hpp"
#include "sched/policy_detail.hpp"

namespace specactor::sched {

// The vocabulary's bytes for masks, built once from the tokenizer.
const std::shared_ptr<const grammar::Vocabulary>& Scheduler::vocabulary() {
  if (!vocab_ && tokenizer_) {
    const auto n = static_cast<std::size_t>(tokenizer_->vocab_size());
    std::vector<std::string> bytes(n);
    std::vector<bool> special(n, false);
    for (std::size_t id = 0; id < n; ++id) {
      const auto t = static_cast<std::int32_t>(id);
      special[id] = tokenizer_->is_special(t);
      bytes[id] = tokenizer_->token_bytes(t);
    }
    vocab_ = std::make_shared<const grammar::Vocabulary>(std::move(bytes), std::move(special),
                                                         tokenizer_->end_of_generation_ids());
  }
  return vocab_;
}

// Compiles the request's constraint (or takes the masks of an earlier request with the same one).
// Returns why it cannot run ("" when it can).
std::string Scheduler::start_constraint(Sequence& r) {
  const OutputConstraint& c = r.sub->request.constraint;
  if (!c.active()) return "";
  if (!vocabulary()) return std::string(c.field()) + ": constrained output needs the model's tokenizer";
  std::string key = std::to_string(static_cast<int>(c.kind)) + "\n" + c.schema;
  for (std::size_t i = 0; i < c.tool_names.size(); ++i)
    key.append("\n").append(c.tool_names[i]).append("\n").append(c.tool_parameters[i]);
  key.append(c.tools_required ? "\nrequired" : "\nauto").append(c.parallel_tool_calls ? "\nparallel" : "\nsingle");
  auto it = std::find_if(grammars_.begin(), grammars_.end(), [&](const auto& e) { return e.first == key; });
  if (it == grammars_.end()) {
    std::shared_ptr<const grammar::Grammar> g;
    try {
      g = compile_constraint(c);
    } catch (const grammar::GrammarError& e) {
      return std::string(c.field()) + ": " + e.what();
    }
    if (grammars_.size() >= kGrammarsKept) grammars_.pop_back();
    grammars_.emplace_front(key, Compiled{g, std::make_shared<grammar::MaskCache>(vocab_)});
    it = grammars_.begin();
  } else {
    grammars_.splice(grammars_.begin(), grammars_, it);  // most recently used first
    it = grammars_.begin();
  }
  r.constraint.matcher = std::make_unique<grammar::Matcher>(it->second.grammar);
  r.constraint.masks = it->second.masks;
  return "";
}

// The mask of a row continuing `m`, appended to `out`.
void Scheduler::append_mask(const Sequence& r, const grammar::Matcher& m, std::vector<std::uint32_t>& out) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::int64_t before = r.constraint.masks->computed();
  const grammar::Mask& mask = r.constraint.masks->mask(m);
  out.insert(out.end(), mask.begin(), mask.end());
  ++metrics_.grammar_masks;
  metrics_.grammar_masks_computed += r.constraint.masks->computed() - before;
  metrics_.grammar_mask_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Whether the grammar allows `token` after `m`; `next` becomes the state after it.
bool Scheduler::grammar_allows(const Sequence& r, const grammar::Matcher& m, std::int32_t token,
                               grammar::Matcher& next) const {
  if (!grammar::allowed(r.constraint.masks->mask(m), token)) return false;
  next = m;
  if (tokenizer_->is_end_of_generation(token)) return true;  // nothing follows it (the output ends)
  return next.feed(vocab_->bytes(token));
}

// The emitted tokens move the matcher on; true when the grammar is complete (nothing may follow).
bool Scheduler::advance_constraint(Sequence& r, std::int32_t token) {
  grammar::Matcher& m = *r.constraint.matcher;
  if (!m.feed(vocab_->bytes(token)))  // the target's rows were masked: this is a bug, not the request's
    spdlog::error("request {}: token {} does not fit its constraint", r.id(), token);
  return m.finished();
}

// Jump-forward drafts: where the grammar forces the next bytes (a key, a closing bracket, a literal),
// their tokens as the tokenizer writes them — all but the last, which may merge with what follows —,
// each allowed in turn, appended after `parent` (-1: the root) with `from` the state there; their
// rows' masks go to the item. At most kForcedDrafts. The target verifies them like any draft.
std::int32_t Scheduler::force_drafts(Sequence& r, StepItem& item, const grammar::Matcher& from, std::int32_t parent) {
  if (!tokenizer_ || static_cast<std::int64_t>(item.tokens.size()) + 1 >= config::kMaxTreeTokens) return 0;
  const std::string& text = r.constraint.masks->forced(from);
  if (text.empty()) return 0;
  std::vector<std::int32_t> toks = tokenizer_->encode(text);
  if (toks.size() < 2) return 0;
  toks.pop_back();
  grammar::Matcher at = from, next = from;
  std::int32_t added = 0;
  for (const std::int32_t t : toks) {
    if (added >= kForcedDrafts || static_cast<std::int64_t>(item.tokens.size()) + 1 >= config::kMaxTreeTokens) break;
    if (!grammar_allows(r, at, t, next)) break;
    std::swap(at, next);
    while (item.parents.size() + 1 < item.tokens.size())  // an empty list was a chain: spell it out
      item.parents.push_back(static_cast<std::int32_t>(item.parents.size()) - 1);
    item.tokens.push_back(t);
    item.parents.push_back(parent);
    parent = static_cast<std::int32_t>(item.tokens.size()) - 2;
    append_mask(r, at, item.allowed);
    ++added;
  }
  metrics_.grammar_drafts += added;
  return added;
}

}  // namespace specactor::sched
