// model/loader.hpp — everything a worker needs to run a model, loaded from a resolved snapshot.
#pragma once

#include <functional>
#include <memory>
#include <optional>

#include "config/resolve.hpp"
#include "config/snapshot.hpp"
#include "model/chat.hpp"
#include "model/llama.hpp"
#include "model/tokenizer.hpp"

namespace specactor::model {

// Which reader a snapshot's model_path needs: load_format gguf/safetensors, or for auto (and dummy)
// a directory or *.safetensors file means Hugging Face safetensors, anything else GGUF.
bool uses_safetensors(const config::ServerArgs& snap);

// The model's hyper-parameters, from GGUF metadata or config.json. Throws GgufError.
ModelInfo read_any_model_info(const config::ServerArgs& snap);

// What this machine can run (device probe, CUDA forward compiled in, device count), as resolution
// needs it.
config::RuntimeFacts runtime_facts();

// The one resolve sequence (engine, CLI, benchmarks): freeze the user's settings, require
// --model-path, read the model's metadata, resolve the target snapshot against it and this machine.
// The EAGLE-3 head shipped for `model_path`, or "" when none: the folder `<stem>-eagle3` (stem = the
// model file's name up to its first '.') holding config.json and model.safetensors, looked up in
// $SPECACTOR_HEADS_DIR, then heads/ beside the build folder of this executable (the checkout), then
// share/specactor/heads of an installation, then heads/ beside the model's folder.
std::string shipped_eagle3_head(const std::string& model_path);
// The block drafter shipped for `model_path` (`<stem>-dflash`, or `<stem>-dspark` for DSPARK, looked up the
// same way), or "".
std::string shipped_block_drafter(const std::string& model_path, bool dspark);

// A shipped head's tuned settings from its config.json ("specactor": {"defaults": {...}}, keys named
// as the settings), std::nullopt when it has none; a malformed block is a ConfigError naming the key.
std::optional<config::ShippedHeadDefaults> shipped_head_defaults(const std::string& head_dir);

struct ResolvedTarget {
  config::Snapshot target;
  ModelInfo info;
};
ResolvedTarget resolve_target(const config::ServerArgs& user_args);

struct LoadedModel {
  std::shared_ptr<const GgufFile> file;  // null for safetensors checkpoints
  ModelInfo info;
  LlamaConfig config;  // json_model_override_args applied
  std::shared_ptr<const LlamaWeights> weights;
  std::shared_ptr<const Tokenizer> tokenizer;  // null with --skip-tokenizer-init
  ChatTemplate chat;
};

// The tokenizer a snapshot names: --tokenizer-path (a GGUF, a tokenizer.json, or a folder holding one),
// else a safetensors checkpoint's tokenizer.json, else the GGUF model's own metadata (`model_file`
// when already open). Throws GgufError naming the file.
std::shared_ptr<const Tokenizer> load_tokenizer(const config::ServerArgs& snap,
                                                std::shared_ptr<const GgufFile> model_file = nullptr);

// Opens snap.model_path (GGUF or safetensors), checks it, binds the weights. The tokenizer: load_tokenizer.
// `num_layers` > 0 keeps only the first K layers (self-speculation). Throws GgufError naming the file/tensor. `shard`
// picks one tensor-parallel rank's share of the weights (see TpShard).
LoadedModel load_model(const config::ServerArgs& snap, const LlamaWeights::Progress& progress = {},
                       std::int64_t num_layers = -1, TpShard shard = {});

// A progress callback that draws a bar on stderr when it is a terminal (and nothing otherwise).
LlamaWeights::Progress terminal_progress(std::string label);

}  // namespace specactor::model
