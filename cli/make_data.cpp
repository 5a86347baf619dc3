// cli/make_data.cpp — `specactor make-data` (see make_data.hpp for the folder it writes).
#include "cli/make_data.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "actors/engine.hpp"
#include "config/error.hpp"
#include "config/input.hpp"
#include "kernels/cpu/matmul.hpp"
#include "kernels/cpu/pool.hpp"
#include "kernels/cpu/quant.hpp"
#include "kernels/cpu/sampling.hpp"
#include "model/loader.hpp"
#include "model/runner.hpp"
#include "model/safetensors.hpp"
#include "model/writers.hpp"

namespace sc = specactor::config;
namespace sm = specactor::model;
namespace sk = specactor::kernels;
namespace sa = specactor::actors;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kFormat = "specactor-eagle3-data";
constexpr int kVersion = 1;

struct PromptEntry {
  std::int64_t index = 0;
  std::string id, category;
  sa::GenerationRequest req;
};

// The prompt file: JSON lines, each {"messages": [{"role", "content"}...]} or {"prompt": "..."}
// (chat template applied unless "chat": false), optional "system", "id", "category".
std::vector<PromptEntry> read_prompts(const std::string& path, std::int64_t limit) {
  const std::string text = sc::read_text_file(path, "--prompts " + path, 512u << 20);
  std::vector<PromptEntry> out;
  std::istringstream in(text);
  std::string line;
  std::int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(line_no);
    const json j = sc::parse_json(line, where);
    if (!j.is_object()) throw sc::ConfigError(where + ": expected a JSON object with \"messages\" or \"prompt\"");
    PromptEntry e;
    e.index = static_cast<std::int64_t>(out.size());
    e.id = j.contains("id") && j["id"].is_string() ? j["id"].get<std::string>() : std::to_string(e.index);
    e.category = j.contains("category") && j["category"].is_string() ? j["category"].get<std::string>() : "";
    e.req.chat = !(j.contains("chat") && j["chat"].is_boolean() && !j["chat"].get<bool>());
    if (j.contains("messages")) {
      if (!j["messages"].is_array() || j["messages"].empty())
        throw sc::ConfigError(where + ": \"messages\" must be a non-empty array of {role, content}");
      for (const auto& m : j["messages"]) {
        if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
            !m["content"].is_string())
          throw sc::ConfigError(where + ": each message needs string \"role\" and \"content\"");
        e.req.messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
      }
      e.req.chat = true;
    } else if (j.contains("prompt") && j["prompt"].is_string()) {
      e.req.prompt = j["prompt"].get<std::string>();
      if (j.contains("system") && j["system"].is_string()) e.req.system = j["system"].get<std::string>();
    } else {
      throw sc::ConfigError(where + ": expected a string \"prompt\" or a \"messages\" array");
    }
    out.push_back(std::move(e));
    if (limit > 0 && static_cast<std::int64_t>(out.size()) >= limit) break;
  }
  if (out.empty()) throw sc::ConfigError("--prompts " + path + ": no prompts in the file");
  return out;
}

// FNV-1a over a file's bytes (a directory: over its files' names and sizes): tells one target from another.
std::string fingerprint(const std::string& path) {
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const void* p, std::size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  if (fs::is_directory(path)) {
    std::vector<std::pair<std::string, std::uintmax_t>> files;
    for (const auto& e : fs::directory_iterator(path))
      if (e.is_regular_file()) files.emplace_back(e.path().filename().string(), e.file_size());
    std::sort(files.begin(), files.end());
    for (const auto& [n, s] : files) mix(n.data(), n.size()), mix(&s, sizeof s);
  } else {
    std::ifstream f(path, std::ios::binary);
    std::vector<char> buf(1 << 20);
    while (f.read(buf.data(), static_cast<std::streamsize>(buf.size())) || f.gcount() > 0)
      mix(buf.data(), static_cast<std::size_t>(f.gcount()));
  }
  char s[17];
  std::snprintf(s, sizeof s, "%016llx", static_cast<unsigned long long>(h));
  return s;
}

// A progress line on stderr: redrawn in place on a terminal, one line every 30 s otherwise.
class Progress {
 public:
  Progress(std::string label, std::int64_t total, std::int64_t done)
      : label_(std::move(label)), total_(total), start_done_(done), tty_(::isatty(2) != 0) {}
  void update(std::int64_t done, std::int64_t tokens, bool last = false) {
    const auto now = std::chrono::steady_clock::now();
    const double since_print = std::chrono::duration<double>(now - printed_).count();
    if (!last && since_print < (tty_ ? 0.5 : 30.0)) return;
    printed_ = now;
    const double el = std::chrono::duration<double>(now - t0_).count();
    const double rate = el > 0 ? static_cast<double>(done - start_done_) / el : 0;
    const double eta = rate > 0 ? static_cast<double>(total_ - done) / rate : 0;
    const int width = 24;
    const int fill = total_ ? static_cast<int>(width * done / total_) : width;
    std::fprintf(stderr,
                 "%s%s [%.*s%*s] %lld/%lld samples, %lld tokens, %.0f tok/s, %02d:%02d elapsed, eta %02d:%02d%s",
                 tty_ ? "\r" : "", label_.c_str(), fill, "########################", width - fill, "",
                 static_cast<long long>(done), static_cast<long long>(total_), static_cast<long long>(tokens),
                 el > 0 ? static_cast<double>(tokens) / el : 0.0, static_cast<int>(el) / 60, static_cast<int>(el) % 60,
                 static_cast<int>(eta) / 60, static_cast<int>(eta) % 60, tty_ && !last ? "" : "\n");
    std::fflush(stderr);
  }

 private:
  std::string label_;
  std::int64_t total_, start_done_;
  bool tty_;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now(), printed_{};
};

std::uint64_t splitmix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct Response {
  std::int64_t index = 0;
  std::vector<std::int32_t> prompt_ids, response_ids;
};

// Reads responses.jsonl; a torn last line (a run killed mid-write) is cut off the file.
std::map<std::int64_t, Response> read_responses(const std::string& path) {
  std::map<std::int64_t, Response> out;
  if (!fs::exists(path)) return out;
  std::ifstream f(path, std::ios::binary);
  std::string line;
  std::uintmax_t good_bytes = 0;
  std::int64_t line_no = 0;
  while (std::getline(f, line)) {
    ++line_no;
    const bool complete = !f.eof();
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception&) {
      if (!complete) break;  // the torn tail
      throw sc::ConfigError(path + ":" + std::to_string(line_no) +
                            ": not a JSON line (the file is corrupt; delete it to regenerate the responses)");
    }
    try {
      Response r;
      r.index = j.at("index").get<std::int64_t>();
      r.prompt_ids = j.at("prompt_ids").get<std::vector<std::int32_t>>();
      r.response_ids = j.at("response_ids").get<std::vector<std::int32_t>>();
      out[r.index] = std::move(r);
    } catch (const json::exception& e) {
      throw sc::ConfigError(path + ":" + std::to_string(line_no) + ": " + e.what());
    }
    good_bytes += line.size() + (complete ? 1 : 0);
  }
  if (good_bytes < fs::file_size(path)) fs::resize_file(path, good_bytes);
  return out;
}

// Phase 1: responses through the engine (continuous batching), appended as they finish.
void generate_responses(const MakeDataOptions& o, const std::vector<PromptEntry>& prompts, const sc::ServerArgs& args,
                        const std::string& path, std::map<std::int64_t, Response>& have) {
  std::vector<const PromptEntry*> pending;
  for (const auto& p : prompts)
    if (!have.count(p.index)) pending.push_back(&p);
  if (pending.empty()) return;
  spdlog::info("make-data: generating {} responses ({} already in {})", pending.size(), have.size(), path);
  auto engine = sa::Engine::create(args);
  if (!engine->tokenizer()) throw sc::ConfigError("--skip-tokenizer-init: make-data needs the tokenizer");
  const std::int64_t window = o.concurrency > 0 ? o.concurrency : args.max_running_requests + 8;
  std::ofstream out(path, std::ios::binary | std::ios::app);
  std::mutex mu;
  std::condition_variable cv;
  std::int64_t in_flight = 0, done = static_cast<std::int64_t>(have.size()), tokens = 0, skipped = 0;
  std::string fatal, bad_prompt;
  Progress bar("generate", static_cast<std::int64_t>(prompts.size()), done);
  for (const PromptEntry* p : pending) {
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return in_flight < window || !fatal.empty(); });
      if (!fatal.empty()) break;
      ++in_flight;
    }
    sa::GenerationRequest req = p->req;
    const bool sampled =
        static_cast<double>(splitmix(static_cast<std::uint64_t>(p->index)) % 1000000) < o.sampled_share * 1e6;
    if (sampled) {
      req.sampling.temperature = static_cast<float>(o.temperature);
      req.sampling.top_p = static_cast<float>(o.top_p);
      req.seed = static_cast<std::uint64_t>(p->index);
    }
    req.max_new_tokens = o.max_new_tokens;
    try {
      req.prompt_ids = engine->tokenize(req);
    } catch (const std::exception& e) {  // the file's fault: stop after the requests in flight
      std::lock_guard<std::mutex> lock(mu);
      --in_flight;
      bad_prompt = "--prompts " + o.prompts + ": prompt '" + sc::printable(p->id) + "': " + e.what();
      break;
    }
    auto resp = std::make_shared<Response>();
    resp->index = p->index;
    resp->prompt_ids = req.prompt_ids;
    const float temperature = req.sampling.temperature;
    engine->submit(req, [&, resp, p, temperature](const sa::TokenEvent& ev) {
      resp->response_ids.insert(resp->response_ids.end(), ev.tokens.begin(), ev.tokens.end());
      if (!ev.finished) return;
      std::lock_guard<std::mutex> lock(mu);
      --in_flight;
      if (ev.finish_reason == "error") {
        if (ev.invalid_request) {
          ++skipped;
          spdlog::warn("make-data: prompt '{}' skipped: {}", sc::printable(p->id), ev.error);
        } else if (fatal.empty()) {
          fatal = ev.error;
        }
      } else {
        json j = {{"index", p->index},
                  {"id", p->id},
                  {"category", p->category},
                  {"prompt_ids", resp->prompt_ids},
                  {"response_ids", resp->response_ids},
                  {"finish_reason", ev.finish_reason},
                  {"temperature", temperature}};
        out << j.dump() << '\n';
        out.flush();
        ++done;
        tokens += static_cast<std::int64_t>(resp->response_ids.size());
        have[p->index] = *resp;
        bar.update(done, tokens);
      }
      cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return in_flight == 0; });
    bar.update(done, tokens, true);
  }
  engine->shutdown();
  if (!out) throw std::runtime_error("cannot append to " + path + " (disk full?)");
  if (!bad_prompt.empty()) throw sc::ConfigError(bad_prompt);
  if (!fatal.empty()) throw std::runtime_error("the engine failed while generating: " + fatal);
  if (skipped) spdlog::warn("make-data: {} prompts skipped (see the warnings above)", skipped);
}

std::vector<std::uint8_t> f16_bytes(const float* v, std::size_t n) {
  std::vector<std::uint8_t> b(n * 2);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint16_t h = sk::f32_to_f16(v[i]);
    std::memcpy(b.data() + i * 2, &h, 2);
  }
  return b;
}

template <class T>
std::vector<std::uint8_t> raw_bytes(const std::vector<T>& v) {
  std::vector<std::uint8_t> b(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// What training needs of the target: its embedding, output head and final norm (dequantized).
void write_target(const sm::LoadedModel& m, const std::string& path) {
  const auto& w = *m.weights;
  const std::int64_t V = m.config.vocab_size, H = m.config.hidden;
  auto matrix = [&](const sk::WeightMatrix& mat) {
    std::vector<float> row(static_cast<std::size_t>(H));
    std::vector<std::uint8_t> b(static_cast<std::size_t>(V * H * 2));
    for (std::int64_t r = 0; r < V; ++r) {
      sk::weight_row(mat, r, row.data());
      const auto rb = f16_bytes(row.data(), row.size());
      std::memcpy(b.data() + r * H * 2, rb.data(), rb.size());
    }
    return b;
  };
  std::vector<sm::RawTensor> t;
  t.push_back({"embed", "F16", {static_cast<std::uint64_t>(V), static_cast<std::uint64_t>(H)}, matrix(w.embedding())});
  t.push_back({"lm_head", "F16", {static_cast<std::uint64_t>(V), static_cast<std::uint64_t>(H)}, matrix(w.output())});
  std::vector<float> norm(w.output_norm(), w.output_norm() + H);
  t.push_back({"output_norm", "F32", {static_cast<std::uint64_t>(H)}, raw_bytes(norm)});
  sm::write_safetensors_raw(path, t, {{"format", "specactor-target"}});
}

bool shard_ok(const std::string& path, std::int64_t samples) {
  if (!fs::exists(path)) return false;
  try {
    auto f = sm::SafetensorsFile::open(path);
    const auto it = f->tensors().find("sample_index");
    return it != f->tensors().end() && static_cast<std::int64_t>(it->second.n_bytes / 8) == samples;
  } catch (const std::exception& e) {
    spdlog::warn("make-data: {} is unreadable ({}); writing it again", path, e.what());
    return false;
  }
}

// Phase 2: one teacher-forced forward per sample batch, capturing the hidden states.
void capture_shard(sm::LlamaRunner& runner, const sm::LoadedModel& m, const std::vector<int>& layers,
                   const std::vector<const Response*>& samples, std::int64_t page_size, const std::string& path,
                   const std::map<std::string, std::string>& meta, std::int64_t& tokens_done, Progress& bar,
                   std::int64_t samples_before) {
  const std::int64_t H = m.config.hidden, V = m.config.vocab_size;
  const std::int64_t A = static_cast<std::int64_t>(layers.size()) - 1;  // the last one is the final layer
  std::vector<std::int32_t> tokens, argmax;
  std::vector<std::uint8_t> mask;
  std::vector<std::int64_t> offsets{0}, index;
  std::vector<float> aux, last;
  constexpr std::int64_t kBatchTokens = 512;
  std::size_t at = 0;
  while (at < samples.size()) {
    // A batch of whole samples, up to kBatchTokens tokens (one sample at least).
    std::vector<const Response*> batch;
    std::int64_t n_tok = 0;
    while (at < samples.size()) {
      const std::int64_t len =
          static_cast<std::int64_t>(samples[at]->prompt_ids.size() + samples[at]->response_ids.size());
      if (!batch.empty() && n_tok + len > kBatchTokens) break;
      batch.push_back(samples[at++]);
      n_tok += len;
    }
    sm::KvCache kv(m.config.n_layers, m.config.n_kv_heads, m.config.head_dim, page_size,
                   (n_tok / page_size + static_cast<std::int64_t>(batch.size()) + 1) * page_size);
    std::vector<sm::KvCache::Seq> seqs(batch.size());
    std::vector<sm::ForwardSeq> fb(batch.size());
    for (std::size_t i = 0; i < batch.size(); ++i) {
      fb[i].kv = &seqs[i];
      fb[i].tokens = batch[i]->prompt_ids;
      fb[i].tokens.insert(fb[i].tokens.end(), batch[i]->response_ids.begin(), batch[i]->response_ids.end());
      for (std::size_t r = 0; r < fb[i].tokens.size(); ++r) fb[i].logit_rows.push_back(static_cast<std::int32_t>(r));
    }
    sm::ForwardResult out;
    runner.forward(fb, kv, out, layers);
    std::int64_t row = 0;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      const auto n = static_cast<std::int64_t>(fb[i].tokens.size());
      tokens.insert(tokens.end(), fb[i].tokens.begin(), fb[i].tokens.end());
      for (std::int64_t r = 0; r < n; ++r) {
        mask.push_back(r >= static_cast<std::int64_t>(batch[i]->prompt_ids.size()) ? 1 : 0);
        argmax.push_back(sk::argmax(out.logits.data() + (row + r) * V, V));
        for (std::int64_t a = 0; a < A; ++a) {
          const float* h = out.hidden[static_cast<std::size_t>(a)].data() + (row + r) * H;
          aux.insert(aux.end(), h, h + H);
        }
        const float* h = out.hidden[static_cast<std::size_t>(A)].data() + (row + r) * H;
        last.insert(last.end(), h, h + H);
      }
      row += n;
      offsets.push_back(offsets.back() + n);
      index.push_back(batch[i]->index);
    }
    tokens_done += n_tok;
    bar.update(samples_before + static_cast<std::int64_t>(index.size()), tokens_done);
  }
  const auto N = static_cast<std::uint64_t>(tokens.size());
  std::vector<sm::RawTensor> t;
  t.push_back({"tokens", "I32", {N}, raw_bytes(tokens)});
  t.push_back({"loss_mask", "U8", {N}, mask});
  t.push_back({"target_argmax", "I32", {N}, raw_bytes(argmax)});
  t.push_back({"offsets", "I64", {offsets.size()}, raw_bytes(offsets)});
  t.push_back({"sample_index", "I64", {index.size()}, raw_bytes(index)});
  t.push_back({"aux_hidden", "F16", {N, static_cast<std::uint64_t>(A * H)}, f16_bytes(aux.data(), aux.size())});
  t.push_back({"last_hidden", "F16", {N, static_cast<std::uint64_t>(H)}, f16_bytes(last.data(), last.size())});
  sm::write_safetensors_raw(path, t, meta);
}

std::vector<int> parse_layers(const std::string& s, std::int64_t n_layers) {
  std::vector<int> out;
  if (s.empty()) {
    const int L = static_cast<int>(n_layers);  // sglang's capture points, as model/head_model.cpp defaults them
    return {std::min(1, L - 1), std::max(0, L / 2 - 1), std::max(0, L - 4)};
  }
  std::stringstream in(s);
  std::string part;
  while (std::getline(in, part, ',')) {
    std::size_t used = 0;
    int v = -1;
    try {
      v = std::stoi(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != part.size() || v < 0 || v >= n_layers)
      throw sc::ConfigError("--aux-layers: '" + sc::printable(part) + "' is not a layer id in [0, " +
                            std::to_string(n_layers) + ")");
    out.push_back(v);
  }
  if (out.size() != 3) throw sc::ConfigError("--aux-layers: EAGLE-3 reads 3 target layers, got " + s);
  return out;
}

}  // namespace

namespace {

void check_options(const MakeDataOptions& o) {
  if (!(o.sampled_share >= 0 && o.sampled_share <= 1))
    throw sc::ConfigError("--sampled-share: expected a fraction in [0, 1]");
  if (!(o.temperature > 0)) throw sc::ConfigError("--temperature: expected > 0 (the sampled share's temperature)");
  if (!(o.top_p > 0 && o.top_p <= 1)) throw sc::ConfigError("--top-p: expected a value in (0, 1]");
}

// An existing manifest.json of --out must come from the same target and settings (a resumed run).
void check_manifest(const std::string& manifest_path, const std::string& out, const json& target,
                    const json& settings) {
  if (!fs::exists(manifest_path)) return;
  const json old = sc::parse_json(sc::read_text_file(manifest_path, manifest_path), manifest_path);
  if (!old.is_object() || old.value("format", "") != kFormat)
    throw sc::ConfigError("--out " + out + ": manifest.json is not a make-data manifest");
  auto differs = [&](const json& a, const json& b, const char* key) {
    return !a.contains(key) || !b.contains(key) || a[key] != b[key];
  };
  for (const char* key : {"fingerprint", "aux_layers", "cpu_precision"})
    if (differs(old.value("target", json::object()), target, key))
      throw sc::ConfigError("--out " + out + ": this folder was made from another target or setting (target " + key +
                            " " + old.value("target", json::object()).value(key, json()).dump() + " vs " +
                            target[key].dump() + "); use a new --out");
  for (const char* key :
       {"prompts_fingerprint", "max_new_tokens", "sampled_share", "temperature", "top_p", "shard_samples"})
    if (differs(old.value("settings", json::object()), settings, key))
      throw sc::ConfigError("--out " + out + ": this folder was made with another " + key + " (" +
                            old.value("settings", json::object()).value(key, json()).dump() + " vs " +
                            settings[key].dump() + "); use a new --out or the same flags");
}

json model_json(const sm::LlamaConfig& c) {
  return {{"hidden_size", c.hidden},          {"intermediate_size", c.ffn},
          {"num_attention_heads", c.n_heads}, {"num_key_value_heads", c.n_kv_heads},
          {"head_dim", c.head_dim},           {"num_hidden_layers", c.n_layers},
          {"vocab_size", c.vocab_size},       {"rope_theta", c.rope_base},
          {"rms_norm_eps", c.norm_eps},       {"max_position_embeddings", c.context_length}};
}

}  // namespace

int make_data(const MakeDataOptions& o, const std::vector<std::string>& server_args) {
  check_options(o);
  sc::ServerArgs args = sc::parse_server_args(server_args);
  spdlog::set_level(spdlog::level::from_str(args.log_level));
  if (args.speculative_algorithm != sc::SpecAlgorithm::None && args.speculative_algorithm != sc::SpecAlgorithm::Auto)
    throw sc::ConfigError("--speculative-algorithm: make-data regenerates responses with the target alone; drop it");
  args.speculative_algorithm = sc::SpecAlgorithm::None;  // the target alone, whatever AUTO would pick
  const auto resolved = sm::resolve_target(args);
  const sc::ServerArgs& s = *resolved.target;
  const std::vector<PromptEntry> prompts = read_prompts(o.prompts, o.limit);
  const std::vector<int> aux = parse_layers(o.aux_layers, resolved.info.num_layers);

  std::error_code ec;
  fs::create_directories(o.out, ec);
  if (ec || !fs::is_directory(o.out)) throw sc::ConfigError("--out " + o.out + ": cannot create the folder");
  const std::string manifest_path = (fs::path(o.out) / "manifest.json").string();
  spdlog::info("make-data: fingerprinting {}", s.model_path);
  json target = {{"path", s.model_path},
                 {"name", fs::path(s.model_path).filename().string()},
                 {"fingerprint", fingerprint(s.model_path)},
                 {"cpu_precision", sc::to_string(s.cpu_precision)},
                 {"num_hidden_layers", resolved.info.num_layers},
                 {"aux_layers", aux}};
  json settings = {{"prompts", fs::path(o.prompts).filename().string()},
                   {"prompts_fingerprint", fingerprint(o.prompts)},
                   {"limit", o.limit},
                   {"max_new_tokens", o.max_new_tokens},
                   {"sampled_share", o.sampled_share},
                   {"temperature", o.temperature},
                   {"top_p", o.top_p},
                   {"shard_samples", o.shard_samples}};
  check_manifest(manifest_path, o.out, target, settings);
  json manifest = {{"format", kFormat},    {"version", kVersion}, {"target", target},
                   {"settings", settings}, {"complete", false},   {"shards", json::array()}};
  auto save_manifest = [&] {
    const std::string tmp = manifest_path + ".tmp";
    std::ofstream(tmp) << manifest.dump(2, ' ', false, json::error_handler_t::replace) << "\n";
    fs::rename(tmp, manifest_path);
  };
  save_manifest();

  const std::string responses_path = (fs::path(o.out) / "responses.jsonl").string();
  std::map<std::int64_t, Response> have = read_responses(responses_path);
  for (auto it = have.begin(); it != have.end();)  // lines beyond --limit of an earlier run
    it = it->first >= static_cast<std::int64_t>(prompts.size()) ? have.erase(it) : std::next(it);
  generate_responses(o, prompts, args, responses_path, have);

  // Phase 2: the target's hidden states, shard by shard.
  const sm::LoadedModel m = sm::load_model(s);
  const std::string target_path = (fs::path(o.out) / "target.safetensors").string();
  if (!fs::exists(target_path)) {
    spdlog::info("make-data: writing {}", target_path);
    write_target(m, target_path);
  }
  std::vector<int> layers = aux;
  layers.push_back(static_cast<int>(m.config.n_layers) - 1);
  sm::LlamaRunner runner(m.weights, static_cast<int>(s.threads), sm::cpu_precision(s));
  std::vector<const Response*> all;
  std::int64_t total_tokens = 0;
  for (const auto& [i, r] : have) {
    all.push_back(&r);
    total_tokens += static_cast<std::int64_t>(r.prompt_ids.size() + r.response_ids.size());
  }
  const std::map<std::string, std::string> meta = {{"format", kFormat},
                                                   {"version", std::to_string(kVersion)},
                                                   {"target", target["name"].get<std::string>()},
                                                   {"target_fingerprint", target["fingerprint"].get<std::string>()},
                                                   {"aux_layers", json(aux).dump()},
                                                   {"hidden_size", std::to_string(m.config.hidden)}};
  Progress bar("capture ", static_cast<std::int64_t>(all.size()), 0);
  std::int64_t tokens_done = 0;
  const auto S = static_cast<std::size_t>(o.shard_samples);
  for (std::size_t first = 0, k = 0; first < all.size(); first += S, ++k) {
    const std::vector<const Response*> part(all.begin() + static_cast<long>(first),
                                            all.begin() + static_cast<long>(std::min(all.size(), first + S)));
    char name[32];
    std::snprintf(name, sizeof name, "shard-%05zu.safetensors", k);
    const std::string path = (fs::path(o.out) / name).string();
    std::int64_t part_tokens = 0;
    for (const Response* r : part)
      part_tokens += static_cast<std::int64_t>(r->prompt_ids.size() + r->response_ids.size());
    if (!shard_ok(path, static_cast<std::int64_t>(part.size())))
      capture_shard(runner, m, layers, part, s.page_size, path, meta, tokens_done, bar,
                    static_cast<std::int64_t>(first));
    else
      tokens_done += part_tokens;
    manifest["shards"].push_back({{"file", name}, {"samples", part.size()}, {"tokens", part_tokens}});
    save_manifest();
  }
  bar.update(static_cast<std::int64_t>(all.size()), tokens_done, true);
  manifest["complete"] = true;
  manifest["samples"] = all.size();
  manifest["tokens"] = total_tokens;
  manifest["model"] = model_json(m.config);
  save_manifest();
  std::printf("make-data: %zu samples, %lld tokens in %zu shards under %s\n", all.size(),
              static_cast<long long>(total_tokens), manifest["shards"].size(), o.out.c_str());
  return 0;
}
