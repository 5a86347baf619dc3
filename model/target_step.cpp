// model/target_step.cpp — see target_step.hpp.
#include "model/target_step.hpp"

#include <algorithm>
#include <chrono>
#include <limits>

#include "config/server_args.hpp"
#include "kernels/spec.hpp"
#include "model/verify.hpp"

namespace specactor::model {

// The forward batch of a step (the same on every rank; ranks > 0 ask for no logits) and rank 0's
// decisions: one slot of (tokens + 1) ints per item, -1 (every KV row stays) or the number of kept
// rows c followed by the kept rows' node indices in order, root first. Kept node path[j] moves to
// slot j of the draft region, the rest is freed.
struct TargetStep::Plan {
  std::vector<ForwardSeq> fwd;
  std::vector<std::int64_t> old_len;
  std::vector<kernels::Tree> trees;
  std::vector<std::int32_t> decisions;
  std::vector<std::size_t> offset;
  std::vector<std::int64_t> prefix_rows;  // rows of a cache hit's prefix to hand out first (want_hidden)
};

namespace {

std::string with_prefix(const char* what) { return std::string("target worker: ") + what; }

}  // namespace

TargetStep::TargetStep(std::shared_ptr<KvCache> kv, std::unique_ptr<ForwardRunner> runner,
                       std::shared_ptr<kernels::Communicator> comm)
    : kv_(std::move(kv)),
      runner_(std::move(runner)),
      comm_(std::move(comm)),
      page_rows_(kv_->total_pages(), kv_->page_size()) {}

TargetStep::Plan TargetStep::plan(const StepBatch& batch, bool logits) {
  for (const StepItem& it : batch.items)
    if (it.sample && !it.prefill && static_cast<std::int64_t>(it.tokens.size()) > config::kMaxTreeTokens)
      throw StepFailed("target worker: more than " + std::to_string(config::kMaxTreeTokens) + " tree tokens");
  Plan p;
  const std::size_t n_items = batch.items.size();
  p.fwd.assign(n_items, {});
  p.old_len.assign(n_items, 0);
  p.trees.assign(n_items, {});
  p.prefix_rows.assign(n_items, 0);
  const std::vector<int> capture(batch.capture.begin(), batch.capture.end());
  std::size_t total = 0;
  for (std::size_t i = 0; i < n_items; ++i) {
    const StepItem& it = batch.items[i];
    auto [where, fresh] = seqs_.try_emplace(it.req, Seq{{}, kernels::Rng(it.seed), {}, it.seed});
    Seq& seq = where->second;
    if (fresh && (it.prefix_len > 0 || it.copy_len > 0)) {
      try {
        start_on_cache(it, seq, capture, p.prefix_rows[i]);
      } catch (...) {
        kv_->release(seq.kv);
        seqs_.erase(where);
        throw;
      }
    }
    ForwardSeq& f = p.fwd[i];
    f.kv = &seq.kv;
    f.tokens = it.tokens;
    p.old_len[i] = seq.kv.length;
    const auto n = static_cast<std::int32_t>(it.tokens.size());
    if (it.sample && it.prefill && logits) f.logit_rows = {n - 1};
    if (it.sample && !it.prefill) {
      if (logits)
        for (std::int32_t r = 0; r < n; ++r) f.logit_rows.push_back(r);
      if (n > 1) {  // draft tokens: positions by depth, attention by the tree mask
        p.trees[i] = item_tree({it.tokens, it.parents, it.draft_probs, it.params, it.seed, p.old_len[i]}, p.old_len[i]);
        f.positions = p.trees[i].positions;
        f.mask = p.trees[i].mask_bits;
      }
    }
    p.offset.push_back(total);
    total += it.tokens.size() + 1;
  }
  p.decisions.assign(total, -1);
  return p;
}

// A prefix cache hit: the request starts on the cache's pages (full ones, never written again), then
// copies the first copy_len slots of a partly matched cached page into a page of its own. `rows`:
// how many of the prefix's captured rows it can hand out (want_hidden).
void TargetStep::start_on_cache(const StepItem& it, Seq& seq, const std::vector<int>& capture, std::int64_t& rows) {
  const std::int64_t P = kv_->page_size();
  if (it.prefix_len < 0 || it.prefix_len > static_cast<std::int64_t>(it.prefix_pages.size()) * P ||
      it.prefix_len % P != 0)
    throw StepFailed("target worker: a cached prefix of " + std::to_string(it.prefix_len) + " tokens in " +
                     std::to_string(it.prefix_pages.size()) + " pages");
  if (it.copy_len < 0 || it.copy_len >= P ||
      (it.copy_len > 0 && (it.copy_page < 0 || it.copy_page >= kv_->total_pages() || kv_->refs(it.copy_page) == 0)))
    throw StepFailed("target worker: a partly cached page " + std::to_string(it.copy_page) + " of " +
                     std::to_string(it.copy_len) + " tokens");
  kv_->adopt(seq.kv, it.prefix_pages, it.prefix_len);
  const bool whole_rows = it.want_hidden && page_rows_.has(capture, seq.kv.pages, it.prefix_len);
  rows = whole_rows ? it.prefix_len : 0;
  if (it.copy_len == 0) return;
  try {
    kv_->reserve(seq.kv, it.prefix_len + it.copy_len);
  } catch (const KvExhausted& e) {
    throw StepFailed(with_prefix(e.what()));
  }
  // Slot s of the cached page is slot P + s of a two-page table [copy_page, own page].
  const std::int32_t own = seq.kv.pages.back();
  const KvCache::Seq pair{{it.copy_page, own}, 2 * P};
  for (std::int64_t s = 0; s < it.copy_len; ++s) runner_->copy_slot(*kv_, pair, s, P + s);
  seq.kv.length = it.prefix_len + it.copy_len;
  const bool copied_rows = page_rows_.copy(it.req, it.copy_page, own, it.copy_len);
  if (whole_rows && copied_rows) rows = seq.kv.length;
}

std::vector<int> TargetStep::capture_layers(const StepBatch& batch) const {
  std::vector<int> capture;
  const bool any_hidden = std::any_of(batch.items.begin(), batch.items.end(),
                                      [](const StepItem& it) { return it.want_hidden || it.keep_hidden; });
  if (!any_hidden) return capture;
  const std::int32_t layers = runner_->weights().config().n_layers;
  for (const auto l : batch.capture) {
    if (l < 0 || l >= layers)
      throw StepFailed("target worker: cannot capture layer " + std::to_string(l) + " of " + std::to_string(layers));
    capture.push_back(l);
  }
  return capture;
}

void TargetStep::forward(Plan& p, const std::vector<int>& capture, ForwardResult& out) {
  try {
    runner_->forward(p.fwd, *kv_, out, capture, comm_.get());
  } catch (const KvExhausted& e) {
    throw StepFailed(with_prefix(e.what()));
  } catch (const kernels::CommAborted& e) {
    throw StepFailed(with_prefix(e.what()));
  } catch (const std::exception& e) {
    // The other ranks must not wait for this one in a collective.
    if (comm_) comm_->abort("rank " + std::to_string(comm_->rank()) + ": " + e.what());
    throw;
  }
}

void TargetStep::verify(const StepBatch& batch, Plan& p, const std::vector<int>& capture, const ForwardResult& out,
                        StepResult& res) {
  const std::int64_t vocab = runner_->weights().config().vocab_size;
  std::size_t logit_row = 0;
  std::int64_t first_row = 0;  // the item's first row in the forward batch
  for (std::size_t i = 0; i < batch.items.size(); ++i) {
    const StepItem& it = batch.items[i];
    Seq& seq = seqs_.at(it.req);
    const auto n_tok = static_cast<std::int32_t>(it.tokens.size());
    const float* logits = out.logits.data() + logit_row * static_cast<std::size_t>(vocab);
    logit_row += p.fwd[i].logit_rows.size();
    std::vector<float> ruled;  // the rows with the request's penalties and biases applied
    if (it.rules.active()) logits = apply_rules(it, seq, logits, vocab, ruled);
    if (!it.allowed.empty() && it.sample) logits = apply_allowed(it, logits, vocab, ruled);
    std::vector<std::int32_t> committed;  // rows whose KV stays: prefill rows, or root + accepted path
    ItemResult r{it.req, {}, {}, 0, 0, {}, 0, {}, 0};
    std::vector<std::int32_t> token_rows;  // the row whose logits gave each emitted token
    if (!it.sample || it.prefill) {
      if (it.sample) r.tokens = {kernels::sample_at(logits, vocab, it.params, seq.seed, p.old_len[i] + n_tok)};
      if (it.sample) token_rows = {0};
      for (std::int32_t row = 0; row < n_tok; ++row) committed.push_back(row);
    } else {  // decode: one token, or [root, drafts...] verified against the target's rows
      Verdict v = verify_step({it.tokens, it.parents, it.draft_probs, it.params, seq.seed, p.old_len[i]}, p.trees[i],
                              logits, vocab, seq.rng, runner_->backend());
      committed = v.path;
      p.decisions[p.offset[i]] = static_cast<std::int32_t>(v.path.size());
      std::copy(v.path.begin(), v.path.end(), p.decisions.begin() + static_cast<std::ptrdiff_t>(p.offset[i] + 1));
      r.tokens = std::move(v.tokens);
      r.accepted = v.accepted;
      r.drafted = v.drafted;
      token_rows = v.path;  // token j follows node path[j]
    }
    if (it.logprobs >= 0)
      for (std::size_t j = 0; j < r.tokens.size(); ++j)
        r.logprobs.push_back(kernels::token_logprob(logits + token_rows[j] * static_cast<std::size_t>(vocab), vocab,
                                                    it.params.temperature, r.tokens[j], it.logprobs));
    if (it.rules.active()) seq.history.add_output(r.tokens.data(), r.tokens.size());
    if ((it.want_hidden || it.keep_hidden) && !capture.empty()) rows(it, p, i, capture, out, first_row, committed, r);
    res.items.push_back(std::move(r));
    first_row += n_tok;
  }
}

// The item's logits rows with its rules applied, into `ruled`: a prefill chunk's prompt tokens join
// the history first (and a cached prefix's, when the worker first sees the request); each verified
// node's row sees the history plus the drafts on its path from the root (node i's own token included:
// its row predicts what follows it).
const float* TargetStep::apply_rules(const StepItem& it, Seq& seq, const float* logits, std::int64_t vocab,
                                     std::vector<float>& ruled) {
  const bool prompt = it.rules.needs_prompt();
  if (prompt && !it.history.empty()) seq.history.add_prompt(it.history.data(), it.history.size());
  if (it.prefill && prompt) seq.history.add_prompt(it.tokens.data(), it.tokens.size());
  if (!it.sample) return logits;
  const std::size_t rows = it.prefill ? 1 : it.tokens.size();
  ruled.assign(logits, logits + rows * static_cast<std::size_t>(vocab));
  std::vector<std::int32_t> path;
  for (std::size_t node = 0; node < rows; ++node) {
    path.clear();
    if (!it.prefill)
      for (auto n = static_cast<std::int32_t>(node); n > 0;
           n = it.parents.empty() ? n - 1 : it.parents[static_cast<std::size_t>(n - 1)] + 1)
        path.push_back(it.tokens[static_cast<std::size_t>(n)]);
    seq.history.apply(it.rules, path.data(), path.size(), ruled.data() + node * static_cast<std::size_t>(vocab), vocab);
  }
  return ruled.data();
}

// The item's sampling rows with the constraint's impossible tokens at −∞ (into `ruled`).
const float* TargetStep::apply_allowed(const StepItem& it, const float* logits, std::int64_t vocab,
                                       std::vector<float>& ruled) {
  const std::size_t rows = it.prefill ? 1 : it.tokens.size();
  const std::size_t words = it.allowed.size() / rows;
  if (words == 0 || words * rows != it.allowed.size())
    throw StepFailed("target worker: a constraint of " + std::to_string(it.allowed.size()) + " mask words for " +
                     std::to_string(rows) + " rows");
  if (ruled.empty()) ruled.assign(logits, logits + rows * static_cast<std::size_t>(vocab));
  constexpr float kNever = -std::numeric_limits<float>::infinity();
  for (std::size_t row = 0; row < rows; ++row) {
    float* l = ruled.data() + row * static_cast<std::size_t>(vocab);
    const std::uint32_t* bits = it.allowed.data() + row * words;
    for (std::int64_t id = 0; id < vocab; ++id) {
      const auto w = static_cast<std::size_t>(id / 32);
      if (w >= words || !(bits[w] >> (id % 32) & 1u)) l[id] = kNever;
    }
  }
  return ruled.data();
}

// The captured layers of the committed rows, per row: kept with the KV pages (keep_hidden) and/or
// returned (want_hidden; after a cache hit with kept rows, the prefix's rows come first).
void TargetStep::rows(const StepItem& it, const Plan& p, std::size_t i, const std::vector<int>& capture,
                      const ForwardResult& out, std::int64_t first_row, const std::vector<std::int32_t>& committed,
                      ItemResult& r) {
  const std::int64_t H = runner_->weights().config().hidden;
  const auto width = static_cast<std::int64_t>(capture.size()) * H;
  const KvCache::Seq& kv = *p.fwd[i].kv;
  if (it.want_hidden) {
    r.hidden_first = p.old_len[i] - p.prefix_rows[i];
    r.hidden.reserve(
        static_cast<std::size_t>((p.prefix_rows[i] + static_cast<std::int64_t>(committed.size())) * width));
    if (p.prefix_rows[i] > 0) page_rows_.read(kv.pages, p.prefix_rows[i], r.hidden);
  }
  std::vector<float> row(static_cast<std::size_t>(width));
  for (std::size_t j = 0; j < committed.size(); ++j) {
    float* dst = row.data();
    for (const auto& layer : out.hidden) {
      const float* src = layer.data() + (first_row + committed[j]) * H;
      dst = std::copy(src, src + H, dst);
    }
    if (it.keep_hidden)
      page_rows_.write(capture, width, it.req, kv.pages, p.old_len[i] + static_cast<std::int64_t>(j), row.data());
    if (it.want_hidden) r.hidden.insert(r.hidden.end(), row.begin(), row.end());
  }
}

void TargetStep::share_decisions(Plan& p) {
  if (comm_) comm_->broadcast(p.decisions.data(), p.decisions.size(), 0);
}

void TargetStep::compact(const Plan& p) {
  for (std::size_t i = 0; i < p.fwd.size(); ++i) {
    const std::int32_t* d = p.decisions.data() + p.offset[i];
    if (d[0] < 0) continue;
    // path[j] >= j, so no row is overwritten before it is copied.
    for (std::int32_t j = 1; j < d[0]; ++j)
      runner_->copy_slot(*kv_, *p.fwd[i].kv, p.old_len[i] + d[1 + j], p.old_len[i] + j);
    kv_->truncate(*p.fwd[i].kv, p.old_len[i] + d[0]);
  }
}

StepResult TargetStep::run(const StepBatch& batch, const std::function<void()>& before_forward) {
  const auto t0 = std::chrono::steady_clock::now();
  Plan p = plan(batch, true);
  const std::vector<int> capture = capture_layers(batch);
  if (before_forward) before_forward();
  ForwardResult out;
  forward(p, capture, out);
  StepResult res;
  std::string failed;
  try {
    verify(batch, p, capture, out, res);
  } catch (const std::exception& e) {
    failed = e.what();  // the other ranks still wait for the decisions: send what there is
  }
  // Decided once, here; every rank applies the same accepted paths to its KV heads.
  try {
    share_decisions(p);
  } catch (const kernels::CommAborted& e) {
    throw StepFailed(with_prefix(e.what()));
  }
  compact(p);
  if (!failed.empty()) throw StepFailed("target worker: " + failed);
  for (std::size_t i = 0; i < batch.items.size(); ++i)
    if (batch.items[i].want_kv) {
      res.items[i].kv_pages = p.fwd[i].kv->pages;
      res.items[i].kv_length = p.fwd[i].kv->length;
    }
  res.compute_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

void TargetStep::follow(const StepBatch& batch) {
  Plan p;
  ForwardResult out;
  try {
    p = plan(batch, false);
    forward(p, {}, out);
    share_decisions(p);
  } catch (const StepFailed&) {
    return;  // rank 0 refused the same batch, ran out of the same KV pool, or saw the same abort
  } catch (const kernels::CommAborted&) {
    return;  // another rank gave up; rank 0 reports it
  }
  compact(p);
}

std::vector<std::pair<std::int64_t, double>> TargetStep::probe(std::int32_t vocab, double budget_ms,
                                                               const std::function<void(const StepBatch&)>& to_ranks) {
  std::vector<std::pair<std::int64_t, double>> out;
  StepBatch b;
  const std::function<void()> before_forward = [&] {
    if (to_ranks) to_ranks(b);
  };
  if (vocab < 2) return out;
  auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  auto tok = [&](std::int64_t i) { return static_cast<std::int32_t>(1 + (i * 7919) % (vocab - 1)); };
  const std::int64_t room = kv_->capacity_tokens() / 2;  // leave the pool to the requests
  std::int64_t used = 0;
  std::vector<std::int64_t> sizes;
  for (std::int64_t rows = 1; rows <= 32; rows *= 2) sizes.push_back(rows);
  std::vector<std::vector<double>> ms(sizes.size());
  try {
    StepItem prefill;
    prefill.req = kProbeRequest;
    prefill.prefill = prefill.sample = true;
    for (std::int64_t i = 0; i < 64; ++i) prefill.tokens.push_back(tok(i));
    if (room < 64 + 2) return out;
    b.items = {prefill};
    run(b, before_forward);
    used = 64;
    StepItem warm;  // one untimed decode step: caches and the pool's threads are awake after it
    warm.req = kProbeRequest;
    warm.sample = true;
    warm.tokens = {tok(used), tok(used + 1)};
    b.items = {warm};
    run(b, before_forward);
    used += 2;
    // The budget is for the timed steps: the two above may fault in fresh KV pages (a 2 MiB huge page
    // per KV head and layer, zeroed on first write), which on a VM whose memory is itself faulted in
    // on first touch took the whole budget, and the probe measured nothing.
    t0 = std::chrono::steady_clock::now();
    // The sizes in turns (1, 2, 4 … 32, then again; three rounds), each size's median kept: a stall
    // of the machine lands in one round of the sizes it overlaps, where one size at a time put it in
    // all three steps of one size. A size the probe over-prices at batch 1 is one the budget then
    // avoids, so real steps of it never come to correct it.
    for (int rep = 0; rep < 3; ++rep)
      for (std::size_t s = 0; s < sizes.size() && elapsed() < budget_ms; ++s) {
        const std::int64_t rows = sizes[s];
        if (used + rows + 1 > room) break;
        StepItem v;
        v.req = kProbeRequest;
        v.sample = true;
        for (std::int64_t i = 0; i < rows; ++i) v.tokens.push_back(tok(used + i));
        b.items = {v};
        ms[s].push_back(run(b, before_forward).compute_ms);
        used += rows;  // at most this many rows are committed
      }
  } catch (const StepFailed& e) {  // e.g. a pool too small for even this: the online model learns alone
    probe_error_ = e.what();
  }
  for (std::size_t s = 0; s < sizes.size() && !ms[s].empty(); ++s) {  // what was measured, up to the first gap
    std::sort(ms[s].begin(), ms[s].end());
    out.emplace_back(sizes[s], ms[s][(ms[s].size() - 1) / 2]);  // the lower median: a stall only adds
  }
  release(kProbeRequest);
  return out;
}

void TargetStep::cache_ops(std::uint64_t req, const std::vector<std::int32_t>& keep,
                           const std::vector<std::int32_t>& drop) {
  auto it = seqs_.find(req);
  if (it != seqs_.end()) {
    const auto& held = it->second.kv.pages;
    for (const std::int32_t p : keep)  // only pages the request holds: a reference is never made up
      if (std::find(held.begin(), held.end(), p) != held.end()) {
        kv_->retain(p);
        page_rows_.kept(req, p);
      }
  }
  for (const std::int32_t p : drop)
    if (p >= 0 && p < kv_->total_pages() && kv_->refs(p) > 0) kv_->drop(p);
}

void TargetStep::release(std::uint64_t req) {
  auto it = seqs_.find(req);
  if (it == seqs_.end()) return;
  kv_->release(it->second.kv);
  seqs_.erase(it);
}

}  // namespace specactor::model
