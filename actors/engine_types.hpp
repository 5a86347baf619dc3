// actors/engine_types.hpp — the embedding API's plain types (defined in sched/types.hpp, no CAF)
// under the engine's namespace.
#pragma once

#include "sched/types.hpp"

namespace specactor::actors {

using sched::EngineMetrics;
using sched::GenerationRequest;
using sched::GenerationResult;
using sched::RequestError;
using sched::RequestMetrics;
using sched::SnapshotReport;
using sched::TokenEvent;

}  // namespace specactor::actors
