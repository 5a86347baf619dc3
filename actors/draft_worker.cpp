#include "actors/draft_worker.hpp"

#include <caf/all.hpp>
#include <chrono>

namespace specactor::actors {

draft_worker_actor::behavior_type draft_worker(draft_worker_actor::stateful_pointer<DraftWorkerState> self,
                                               config::Snapshot snapshot, DrafterFactory factory,
                                               DraftContext context) {
  self->set_exception_handler(exit_with_message);
  self->state.snapshot = std::move(snapshot);
  // A factory that throws (a bad head file, ...) ends this actor; the scheduler sees it go down and
  // continues without drafts.
  self->state.drafter = factory(self->state.snapshot, context);
  return {
      [self](propose_atom, ProposeBatch& batch) -> Proposals {
        const auto t0 = std::chrono::steady_clock::now();
        Proposals out;
        std::vector<drafters::ProposeArgs> round;
        for (const auto& it : batch.items) {
          self->state.drafter->set_sampling(it.req, it.params, it.seed);
          if (!it.hidden.empty() || it.kv_length > 0)
            self->state.drafter->observe(it.req, TargetFeatures{it.hidden, it.hidden_first, it.kv_pages, it.kv_length});
          round.push_back({it.req, it.context.get(), it.max_nodes, it.max_depth});
        }
        for (DraftTree& t : self->state.drafter->propose_batch(round)) {
          out.tokens.push_back(std::move(t.tokens));
          out.parents.push_back(std::move(t.parents));
          out.probs.push_back(std::move(t.probs));
          out.scores.push_back(std::move(t.scores));
        }
        out.cache = self->state.drafter->cache_stats();
        out.compute_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        return out;
      },
      [self](release_atom, std::uint64_t req) { self->state.drafter->release(req); },
      [self](flush_atom) { self->state.drafter->flush_cache(); },
      [self](reconf_atom, config::Snapshot& s) {
        self->state.snapshot = std::move(s);
        self->state.drafter->reconfigure(self->state.snapshot);
      },
      [self](snapshot_atom) -> config::Snapshot { return self->state.snapshot; },
      [self](needs_atom) -> DrafterNeeds { return self->state.drafter->needs(); },
      [self](info_atom) -> std::string { return self->state.drafter->model_config(); },
  };
}

}  // namespace specactor::actors
