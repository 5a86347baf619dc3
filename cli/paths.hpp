// cli/paths.hpp — files the command finds by itself: the default model that tools/setup fetched and
// the data that ships with specactor (the bench prompts), looked up beside the binary (a build folder
// of the checkout, or bin/ of an installation) before the working directory.
#pragma once

#include <string>

namespace specactor::cli {

// `relative` (e.g. "cli/bench_prompts.jsonl") under the checkout that holds this binary, under
// share/specactor of an installation, or under the working directory; "" when none has it.
std::string shipped_file(const std::string& relative, const std::string& installed_name);

// models/SmolLM2-135M-Instruct.Q4_1.gguf of the checkout (or the working directory), "" when absent;
// with $SPECACTOR_MODELS_DIR set, that folder's copy only.
std::string default_model_path();

}  // namespace specactor::cli
