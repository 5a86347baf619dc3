// config/resolve.hpp — from argv / a JSON config file to resolved target and draft snapshots.
//
//   user  = parse_server_args(argv)            defaults < config file < argv, logged per source
//   snap  = freeze(user)                       validated, immutable
//   tgt   = resolve_target(snap, facts)        load-time decisions, each under a named source
//   draft = derive_draft(tgt, facts)           per-runner draft fields applied last (they win)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/snapshot.hpp"

namespace specactor::config {

// The settings measured fastest for a shipped head (docs/eagle3-training.md, "The shipped head"),
// carried in the head's config.json and taken when resolution picks that head (auto.shipped_head):
// the shape and, measured with it, its path-probability floor and prompt-lookup branch when no shape
// flag is given (and not the flag itself), the load-time quantization unless
// --speculative-draft-quantization is. Other head drafters get sglang's shapes, no floor, no branch
// and Q8_0. A shipped block drafter (DFLASH, DSPARK) carries the same block, taken when resolution picks
// it (auto.shipped_drafter): its chain, its branch and its quantization; its floor must be 0.
struct ShippedHeadDefaults {
  SpecShape shape;
  double p_min = 0;
  std::int64_t ngram_tokens = 0;
  std::string quantization;
};

// What resolution needs to know about the loaded target model (config/ depends on nothing of ours;
// model::ModelInfo converts itself into this).
struct ModelFacts {
  std::string architecture;         // e.g. "llama"
  std::int64_t context_length = 0;  // the model's trained context length, tokens
  std::int64_t vocab_size = 0;
  std::int64_t hidden_size = 0;
  std::int64_t num_layers = 0;
  bool llama_family = false;
  // Tensor parallelism splits these (0 = unknown: not checked here, the weight loader still is).
  std::int64_t num_heads = 0, num_kv_heads = 0, ffn_hidden_size = 0;
  // An EAGLE-3 head shipped with specactor for this model (a folder), empty when none: the draft path
  // of --speculative-algorithm EAGLE3 when the user gives none (override source "auto.shipped_head").
  std::string shipped_eagle3_head;
  // That head's tuned settings, from its own config.json ("specactor": {"defaults": ...}; absent: none);
  // for DFLASH and DSPARK, the shipped block drafter's.
  std::optional<ShippedHeadDefaults> shipped_head_defaults;
  // The block drafter of the asked algorithm shipped for this model (a folder: <stem>-dflash for DFLASH,
  // <stem>-dspark for DSPARK), empty when none: the draft path of --speculative-algorithm DFLASH or
  // DSPARK when the user gives none (override source "auto.shipped_drafter").
  std::string shipped_block_drafter;
};

// What resolution needs to know about this machine.
struct RuntimeFacts {
  bool cuda_usable = false;       // a CUDA device answered the probe
  std::string cuda_reason;        // why not, for the error message of --device cuda
  bool cuda_forward = false;      // the build has the CUDA forward pass (kernels/cuda)
  std::int64_t cuda_devices = 0;  // devices that answered (--device cuda runs one rank per device)
};

// Parses `--flag value`, `--flag=value`, bare `--bool-flag`, and `--config FILE.json` (keys are the
// field names, applied before the command line). The returned args carry override-log entries
// "user.config_file" and "user.argv" listing what each set. Throws ConfigError naming the flag.
// `-m` and `--model` are taken for `--model-path`. `command_flags`: the flags of the command whose
// leftover arguments these are, so that a mistyped one of them is suggested too ("--promt").
ServerArgs parse_server_args(const std::vector<std::string>& argv);
ServerArgs parse_server_args(const std::vector<std::string>& argv, const std::vector<std::string>& command_flags);

// Reads a JSON config file into `args` (used by --config); errors name the file and key.
void apply_config_file(ServerArgs& args, const std::string& path);

// Load-time resolution of the target's snapshot: context length from the model (a larger user value
// is an error unless allowed), KV budget, device, automatic speculative shape. Each decision is a
// derive() under its own source: "load.model_config", "auto.memory", "auto.device", "auto.speculative".
Snapshot resolve_target(const Snapshot& user, const ModelFacts& model, const RuntimeFacts& runtime);

// The draft's snapshot, derived from the target's *resolved* snapshot with the per-runner draft
// fields applied on top (source "draft.per_runner"). Requires a speculative algorithm.
Snapshot derive_draft(const Snapshot& target_resolved, const ModelFacts& target_model);

// The draft shape as a drafter and the scheduler read it from a snapshot: the resolved values, and for
// what resolution leaves unset (every field without an algorithm; the head drafters' own fields for
// other drafters) the one default written here, beside the resolution that sets the rest. Every reader of these fields
// goes through this.
struct DraftShapeArgs {
  std::int64_t num_steps = 0, eagle_topk = 1, num_draft_tokens = 1;  // unset: nothing drafted
  double p_min = 0;                                                  // head drafters: no floor
  std::int64_t ngram_tokens = 0, ngram_min_match = 2, suffix_tokens = 0;
};
DraftShapeArgs draft_shape_args(const ServerArgs& args);

}  // namespace specactor::config
