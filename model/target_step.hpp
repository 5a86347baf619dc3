// model/target_step.hpp — one step of the target model without an actor: the forward rows of a
// StepBatch (prefill chunks, and [root, drafts...] with their tree mask), the layers a head drafter
// asked to capture, the forward itself (tensor parallel when a communicator is given), sampling or
// verification of each item (model::verify_step), the captured rows of what was committed, and the
// KV compaction to the accepted paths.
//
// Tensor parallel: every rank owns one TargetStep over its shard and KV heads. Rank 0 (run) decides:
// it samples and verifies, then broadcasts one decision slot per item over the communicator; the
// other ranks (follow) run the same forward and apply the broadcast decisions, so no rank can
// disagree about which KV rows stay. The actor around it only loads, supervises and fans out.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/comm.hpp"
#include "kernels/cpu/sampling.hpp"
#include "model/kv_cache.hpp"
#include "model/llama.hpp"
#include "model/page_rows.hpp"
#include "model/step.hpp"

namespace specactor::model {

// A step that cannot run and leaves the worker usable: a batch the scheduler should not have built
// (too many tree tokens, a layer the model does not have), a full KV pool, or an aborted
// tensor-parallel group. The requests in the step end with this message.
struct StepFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class TargetStep {
 public:
  // `kv` and `runner` belong to this rank; `comm` is null without tensor parallelism.
  TargetStep(std::shared_ptr<KvCache> kv, std::unique_ptr<ForwardRunner> runner,
             std::shared_ptr<kernels::Communicator> comm = nullptr);

  // Rank 0: the whole step. `before_forward` runs once the batch is accepted, right before the
  // forward (the actor hands the batch to the other ranks there). Throws StepFailed for the cases
  // above; any other exception aborts the communicator first (so no rank waits for this one) and
  // propagates.
  StepResult run(const StepBatch& batch, const std::function<void()>& before_forward = {});

  // Ranks > 0: the same forward on this rank's shard, then rank 0's decisions. Returns without
  // effect when rank 0 must have refused or failed the same step (it reports that).
  void follow(const StepBatch& batch);

  // The cost probe: times steps of 1, 2, 4, ... 32 rows at a short context on a scratch request (the
  // id kProbeRequest, released afterwards), the sizes in turns over three rounds, and returns (rows,
  // median ms) for the sizes measured, from 1 up to the first one that was not. Bounded by
  // `budget_ms` and by the KV pool (a small pool probes fewer sizes). Rank 0 only; `to_ranks` gets each batch right
  // before its forward (as run()'s before_forward: the other ranks follow it).
  static constexpr std::uint64_t kProbeRequest = ~std::uint64_t{0};
  std::vector<std::pair<std::int64_t, double>> probe(std::int32_t vocab, double budget_ms,
                                                     const std::function<void(const StepBatch&)>& to_ranks = {});

  // Why the last probe stopped early ("" when it did not).
  const std::string& probe_error() const { return probe_error_; }

  // Frees a request's KV pages (unknown ids are ignored: the request never reached this rank).
  void release(std::uint64_t req);
  // The prefix cache: takes a reference on `keep` (pages request `req` holds, which the cache now
  // holds too; sent before its release) and lets go of `drop` (pages the cache gave up).
  void cache_ops(std::uint64_t req, const std::vector<std::int32_t>& keep, const std::vector<std::int32_t>& drop);

  ForwardRunner& runner() { return *runner_; }
  const std::shared_ptr<KvCache>& kv() const { return kv_; }
  std::size_t sequences() const { return seqs_.size(); }
  // A request's committed KV length on this rank (-1 when it holds none).
  std::int64_t length(std::uint64_t req) const {
    const auto it = seqs_.find(req);
    return it == seqs_.end() ? -1 : it->second.kv.length;
  }

 private:
  struct Seq {
    KvCache::Seq kv;
    kernels::Rng rng;
    kernels::RuleHistory history;  // what the request's logit rules count (kept only when it has rules)
    std::uint64_t seed = 0;        // the request's: position-keyed sampling coins
  };
  struct Plan;

  Plan plan(const StepBatch& batch, bool logits);
  void start_on_cache(const StepItem& it, Seq& seq, const std::vector<int>& capture, std::int64_t& rows);
  static const float* apply_rules(const StepItem& it, Seq& seq, const float* logits, std::int64_t vocab,
                                  std::vector<float>& ruled);
  static const float* apply_allowed(const StepItem& it, const float* logits, std::int64_t vocab,
                                    std::vector<float>& ruled);
  std::vector<int> capture_layers(const StepBatch& batch) const;
  void forward(Plan& p, const std::vector<int>& capture, ForwardResult& out);
  void verify(const StepBatch& batch, Plan& p, const std::vector<int>& capture, const ForwardResult& out,
              StepResult& res);
  void rows(const StepItem& it, const Plan& p, std::size_t i, const std::vector<int>& capture, const ForwardResult& out,
            std::int64_t first_row, const std::vector<std::int32_t>& committed, ItemResult& r);
  void share_decisions(Plan& p);
  void compact(const Plan& p);

  std::shared_ptr<KvCache> kv_;
  std::unique_ptr<ForwardRunner> runner_;
  std::shared_ptr<kernels::Communicator> comm_;
  std::map<std::uint64_t, Seq> seqs_;
  PageRows page_rows_;  // captured rows of cached pages (keep_hidden), for requests that start on them
  std::string probe_error_;
};

}  // namespace specactor::model
