#include "model/loader.hpp"

#include <unistd.h>

#include <cstdio>

namespace specactor::model {

LoadedModel load_model(const config::ServerArgs& s, const LlamaWeights::Progress& progress, std::int64_t num_layers) {
  if (s.load_format == config::LoadFormat::Safetensors)
    throw GgufError(s.model_path + ": --load-format safetensors is not supported yet; use a GGUF file");
  LoadedModel m;
  m.file = GgufFile::open(s.model_path);
  m.info = read_model_info(*m.file);
  m.config = LlamaConfig::from(m.info, s.json_model_override_args);
  m.weights = LlamaWeights::load(m.file, m.config, s.load_format, num_layers, progress);
  if (!s.skip_tokenizer_init) {
    m.tokenizer = Tokenizer::from_gguf(*m.file);
    if (m.tokenizer->vocab_size() != m.config.vocab_size)
      throw GgufError(s.model_path + ": the tokenizer has " + std::to_string(m.tokenizer->vocab_size()) +
                      " tokens but the model's vocabulary is " + std::to_string(m.config.vocab_size));
    m.chat = ChatTemplate::detect(m.tokenizer->chat_template());
  }
  return m;
}

LlamaWeights::Progress terminal_progress(std::string label) {
  if (!::isatty(2)) return {};
  return [label = std::move(label)](std::size_t done, std::size_t total) {
    const int width = 30;
    const int fill = total ? static_cast<int>(width * done / total) : width;
    std::fprintf(stderr, "\r%s [%.*s%*s] %zu/%zu", label.c_str(), fill, "##############################", width - fill,
                 "", done, total);
    if (done >= total) std::fputc('\n', stderr);
    std::fflush(stderr);
  };
}

}  // namespace specactor::model
