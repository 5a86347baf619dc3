// tests/test_families.cpp — the llama, qwen2, qwen3 and gemma3 families (model/family.hpp) against
// transformers' float32 forward: tiny random models in each family's real layout, as safetensors and as
// GGUF, with the reference logits at 64 positions and a greedy continuation (tests/data/families/, made
// by tools/make_families). Plus: chunked prefill, decode steps and tree masks through the sliding
// window, and the checks that refuse what the forward does not do.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>

#include "config/snapshot.hpp"
#include "kernels/comm.hpp"
#include "kernels/cpu/sampling.hpp"
#include "model/chat.hpp"
#include "model/loader.hpp"
#include "model/runner.hpp"
#include "model/safetensors.hpp"

using namespace specactor::model;
using json = nlohmann::json;
namespace fs = std::filesystem;
namespace k = specactor::kernels;

namespace {

const std::string kDir = SPECACTOR_SOURCE_DIR "/tests/data/families/";
const char* const kFamilies[] = {"llama", "qwen2", "qwen3", "gemma3"};

json reference(const std::string& family) {
  std::ifstream in(kDir + family + ".json");
  const std::string what = kDir + family + ".json (tools/make_families writes it)";
  REQUIRE_MESSAGE(in, what);
  return json::parse(in);
}

LoadedModel load(const std::string& path, specactor::config::LoadFormat format = specactor::config::LoadFormat::Auto) {
  specactor::config::ServerArgs a;
  a.model_path = path;
  a.skip_tokenizer_init = true;
  a.load_format = format;
  return load_model(a);
}

KvCache make_kv(const LoadedModel& m) {
  return KvCache(m.config.n_layers, m.config.n_kv_heads, m.config.head_dim, 16, 128);
}

// Logits of every position after feeding `ids` in chunks of `chunk` tokens (0: one call).
std::vector<float> all_logits(const LoadedModel& m, const std::vector<std::int32_t>& ids, std::size_t chunk = 0,
                              k::Precision precision = k::Precision::Exact) {
  LlamaRunner runner(m.weights, 0, precision);
  KvCache kv = make_kv(m);
  KvCache::Seq seq;
  std::vector<float> out;
  if (chunk == 0) chunk = ids.size();
  for (std::size_t at = 0; at < ids.size(); at += chunk) {
    std::vector<ForwardSeq> b(1);
    b[0].kv = &seq;
    b[0].tokens.assign(ids.begin() + static_cast<std::ptrdiff_t>(at),
                       ids.begin() + static_cast<std::ptrdiff_t>(std::min(ids.size(), at + chunk)));
    for (std::size_t i = 0; i < b[0].tokens.size(); ++i) b[0].logit_rows.push_back(static_cast<std::int32_t>(i));
    ForwardResult r;
    runner.forward(b, kv, r);
    out.insert(out.end(), r.logits.begin(), r.logits.end());
  }
  return out;
}

std::vector<std::int32_t> greedy(const LoadedModel& m, const std::vector<std::int32_t>& ids, std::size_t n) {
  LlamaRunner runner(m.weights, 0, k::Precision::Exact);
  KvCache kv = make_kv(m);
  KvCache::Seq seq;
  std::vector<std::int32_t> out, step = ids;
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<ForwardSeq> b(1);
    b[0].kv = &seq;
    b[0].tokens = step;
    b[0].logit_rows = {static_cast<std::int32_t>(step.size() - 1)};
    ForwardResult r;
    runner.forward(b, kv, r);
    out.push_back(k::argmax(r.logits.data(), m.config.vocab_size));
    step = {out.back()};
  }
  return out;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, static_cast<double>(std::abs(a[i] - b[i])));
  return worst;
}

}  // namespace

TEST_CASE("families: exact logits within 1e-3 of transformers at 64 positions and the same greedy continuation") {
  for (const std::string family : kFamilies) {
    const json ref = reference(family);
    const auto ids = ref["ids"].get<std::vector<std::int32_t>>();
    std::vector<float> want, want64;
    for (const auto& row : ref["logits"])
      for (const auto& v : row) want.push_back(v.get<float>());
    for (const auto& row : ref["logits_float64"])
      for (const auto& v : row) want64.push_back(v.get<float>());
    for (const std::string& path : {kDir + family, kDir + family + ".gguf"}) {
      CAPTURE(path);
      const LoadedModel m = load(path);
      CHECK(m.info.architecture == family);
      // llama's GGUF holds Q/K permuted to adjacent RoPE pairs; the other families keep the half split.
      CHECK(m.config.rope_neox == (family != "llama" || !path.ends_with(".gguf")));
      REQUIRE(static_cast<std::int64_t>(ref["logits"][0].size()) == m.config.vocab_size);
      const auto got = all_logits(m, ids);
      const double d = max_diff(got, want), d64 = max_diff(got, want64);
      MESSAGE(family << " (" << (path.ends_with(".gguf") ? "GGUF" : "safetensors")
                     << "): max |logit - transformers| over 64 positions: float32 " << d << ", float64 " << d64
                     << " (transformers float32 vs float64: " << ref["float32_vs_float64"].get<double>() << ")");
      CHECK(d < 1e-3);
      CHECK(d64 < 1e-4);
      CHECK(greedy(m, ids, ref["greedy"].size()) == ref["greedy"].get<std::vector<std::int32_t>>());
    }
  }
}

TEST_CASE("families: chunked prefill and decode steps give the one-call logits (the sliding window across calls)") {
  for (const std::string family : kFamilies) {
    CAPTURE(family);
    const LoadedModel m = load(kDir + family + ".gguf");
    const auto ids = reference(family)["ids"].get<std::vector<std::int32_t>>();
    const auto whole = all_logits(m, ids);
    for (std::size_t chunk : {1u, 5u, 17u}) {
      CAPTURE(chunk);
      CHECK(max_diff(all_logits(m, ids, chunk), whole) < 1e-5);
    }
    // Fast precision (int8 activations) stays close and picks the same tokens almost everywhere.
    const auto fast = all_logits(m, ids, 0, k::Precision::Fast);
    int same = 0;
    const auto V = static_cast<std::size_t>(m.config.vocab_size);
    for (std::size_t p = 0; p < ids.size(); ++p)
      same += k::argmax(fast.data() + p * V, static_cast<std::int64_t>(V)) ==
              k::argmax(whole.data() + p * V, static_cast<std::int64_t>(V));
    MESSAGE(family << ": fast precision picks the exact precision's token at " << same << " of 64 positions");
    CHECK(same >= 56);
  }
}

TEST_CASE("families: a tree mask's rows equal the causal forwards of their paths (sliding layers beyond the window)") {
  const LoadedModel m = load(kDir + std::string("gemma3.gguf"));
  REQUIRE(m.config.sliding_window == 16);
  const auto ids = reference("gemma3")["ids"].get<std::vector<std::int32_t>>();
  const std::vector<std::int32_t> prefix(ids.begin(), ids.begin() + 40);  // past the window of 16
  // A tree of 5 nodes: root r, children a, b of r, c child of a, d child of c. Positions by depth.
  const std::vector<std::int32_t> tree = {7, 11, 13, 17, 19};
  const std::vector<std::int32_t> depth = {0, 1, 1, 2, 3};
  const std::vector<std::uint64_t> mask = {0b00001, 0b00011, 0b00101, 0b01011, 0b11011};
  LlamaRunner runner(m.weights, 0, k::Precision::Exact);
  KvCache kv = make_kv(m);
  KvCache::Seq seq;
  {
    std::vector<ForwardSeq> b(1);
    b[0].kv = &seq;
    b[0].tokens = prefix;
    ForwardResult r;
    runner.forward(b, kv, r);
  }
  std::vector<ForwardSeq> b(1);
  b[0].kv = &seq;
  b[0].tokens = tree;
  b[0].mask = mask;
  for (std::size_t i = 0; i < tree.size(); ++i) {
    b[0].positions.push_back(static_cast<std::int32_t>(prefix.size()) + depth[i]);
    b[0].logit_rows.push_back(static_cast<std::int32_t>(i));
  }
  ForwardResult r;
  runner.forward(b, kv, r);
  const auto V = static_cast<std::size_t>(m.config.vocab_size);
  for (std::size_t node = 0; node < tree.size(); ++node) {
    CAPTURE(node);
    std::vector<std::int32_t> path = prefix;
    for (std::size_t j = 0; j <= node; ++j)
      if ((mask[node] >> j) & 1u) path.push_back(tree[j]);
    const auto want = all_logits(m, path);
    const std::vector<float> got(r.logits.begin() + static_cast<std::ptrdiff_t>(node * V),
                                 r.logits.begin() + static_cast<std::ptrdiff_t>((node + 1) * V));
    const std::vector<float> last(want.end() - static_cast<std::ptrdiff_t>(V), want.end());
    CHECK(max_diff(got, last) < 1e-5);
  }
}

TEST_CASE("families: what the forward does not do is refused, naming the field") {
  const fs::path dir = fs::temp_directory_path() / ("specactor_fam_" + std::to_string(::getpid()));
  auto error_with = [&](const std::string& family, const std::function<void(json&)>& edit) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    fs::copy_file(kDir + family + "/model.safetensors", dir / "model.safetensors");
    json c = json::parse(std::ifstream(kDir + family + "/config.json"));
    edit(c);
    std::ofstream(dir / "config.json") << c.dump();
    try {
      load(dir.string());
    } catch (const GgufError& e) {
      return std::string(e.what());
    }
    return std::string("(loaded)");
  };
  auto refused = [&](const std::string& family, const std::function<void(json&)>& edit, const std::string& want) {
    const std::string got = error_with(family, edit);
    CAPTURE(got);
    CHECK(got.find(want) != std::string::npos);
  };
  refused(
      "qwen2", [](json& c) { c["model_type"] = "phi3"; },
      "model_type 'phi3' is not supported (supported: llama, mistral, qwen2, qwen3, gemma3_text");
  refused(
      "qwen2", [](json& c) { c["use_sliding_window"] = true; }, "'use_sliding_window' = true is not supported");
  refused(
      "qwen3", [](json& c) { c["attention_bias"] = true; }, "'attention_bias' = true is not supported");
  refused(
      "qwen3", [](json& c) { c["hidden_act"] = "gelu"; }, "'hidden_act' = \"gelu\" is not supported");
  refused(
      "qwen3",
      [](json& c) {
        c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4}};
      },
      "'rope_scaling' {\"factor\":4,\"rope_type\":\"yarn\"} is not supported");
  refused(
      "gemma3", [](json& c) { c["final_logit_softcapping"] = 30.0; },
      "'final_logit_softcapping' = 30.0 is not supported (expected null)");
  refused(
      "gemma3", [](json& c) { c["layer_types"].erase(0); }, "'layer_types' must list one type per layer (6)");
  refused(
      "gemma3", [](json& c) { c["layer_types"][0] = "chunked_attention"; },
      "'layer_types' holds \"chunked_attention\"");
  refused(
      "gemma3", [](json& c) { c.erase("sliding_window"); }, "'sliding_window' must be a positive integer");
  refused(
      "gemma3", [](json& c) { c["use_bidirectional_attention"] = true; },
      "'use_bidirectional_attention' = true is not supported");
  refused(
      "gemma3",
      [](json& c) {
        c["model_type"] = "gemma3";
        c["text_config"] = json::object();
      },
      "is a multimodal checkpoint (text_config)");
  // A family's own tensors are required: Qwen2 without a bias, Qwen3 without a q norm.
  refused(
      "qwen3", [](json& c) { c["model_type"] = "qwen2"; }, "missing tensor 'model.layers.0.self_attn.q_proj.bias'");
  refused(
      "qwen2",
      [](json& c) {
        c["model_type"] = "qwen3";
        c["head_dim"] = 16;
      },
      "missing tensor 'model.layers.0.self_attn.q_norm.weight'");
  CHECK(error_with("qwen3", [](json&) {}) == "(loaded)");
  fs::remove_all(dir);

  // Self-speculation reads the target's KV across pools, which sliding-window layers do not: refused at start.
  {
    specactor::config::ServerArgs a;
    a.model_path = kDir + "gemma3.gguf";
    a.speculative_algorithm = specactor::config::SpecAlgorithm::Standalone;
    a.speculative_draft_num_layers = 2;
    CHECK_THROWS_WITH(resolve_target(a), doctest::Contains("--speculative-draft-num-layers: self-speculation reads the "
                                                           "target's KV from a second pool, which gemma3's"));
  }
  // The CUDA forward runs llama only: another family on --device cuda is refused by name, GPU or not.
  const LoadedModel m = load(kDir + std::string("qwen3.gguf"));
  specactor::config::ServerArgs cuda;
  cuda.device = specactor::config::Device::Cuda;
  KvCache kv = make_kv(m);
  CHECK_THROWS_WITH(
      make_runner(m.weights, cuda, 0, 1, kv),
      doctest::Contains("the CUDA forward runs the llama architecture only; 'qwen3' runs with --device cpu"));
}

TEST_CASE("families: the loader mutations of the llama path, on every family's files") {
  auto read = [](const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string tmp = (fs::temp_directory_path() / ("specactor_fam_mut_" + std::to_string(::getpid()))).string();
  auto error_of = [&](const std::string& bytes) {
    std::ofstream(tmp, std::ios::binary) << bytes;
    try {
      load(tmp, specactor::config::LoadFormat::Gguf);
    } catch (const GgufError& e) {
      return std::string(e.what());
    }
    return std::string("(loaded)");
  };
  // A name inside the file, replaced by another of the same length (a GGUF string: u64 length + bytes).
  auto renamed = [](std::string bytes, const std::string& from, const std::string& to) {
    std::string key(8, '\0');
    key[0] = static_cast<char>(from.size());
    const auto at = bytes.find(key + from);
    REQUIRE_MESSAGE(at != std::string::npos, from);
    bytes.replace(at + 8, from.size(), to);
    return bytes;
  };
  struct Own {
    const char* family;
    const char* tensor;  // a tensor only this family has
    const char* shape;
  };
  for (const Own& o :
       {Own{"llama", "blk.1.ffn_up.weight", "[64, 128]"}, Own{"qwen2", "blk.1.attn_k.bias", "[32]"},
        Own{"qwen3", "blk.2.attn_q_norm.weight", "[32]"}, Own{"gemma3", "blk.4.post_ffw_norm.weight", "[64]"}}) {
    CAPTURE(std::string(o.family));
    const std::string bytes = read(kDir + o.family + ".gguf");
    CHECK(error_of(bytes) == "(loaded)");
    // Truncated: the tensor data runs past the end.
    CHECK(error_of(bytes.substr(0, bytes.size() / 2)).find("runs past the end of the file") != std::string::npos);
    // Not a GGUF file.
    std::string bad = bytes;
    bad[0] = 'X';
    CHECK(error_of(bad).find("not a GGUF file") != std::string::npos);
    // A tensor of the family missing.
    std::string name = o.tensor;
    std::string other = name;
    other[other.size() - 8] = 'X';  // "weight" / ".bias" keep their length
    CHECK(error_of(renamed(bytes, name, other)) ==
          tmp + ": missing tensor '" + name + "' (expected shape " + o.shape + ")");
    // A hyper-parameter missing.
    const std::string key = std::string(o.family) + ".attention.head_count";
    CHECK(error_of(renamed(bytes, key, std::string(o.family) + ".attention.head_couXt")) ==
          tmp + ": missing metadata key '" + key + "'");
    // A hostile head count.
    std::string hostile = bytes;
    {
      std::string k(8, '\0');
      k[0] = static_cast<char>(key.size());
      const auto at = hostile.find(k + key);
      REQUIRE(at != std::string::npos);
      const std::size_t value = at + 8 + key.size() + 4;  // after the u32 value type
      hostile[value] = 7;                                 // 4 heads -> 7: 2 KV heads do not divide it
      hostile[value + 1] = hostile[value + 2] = hostile[value + 3] = 0;
    }
    const std::string e = error_of(hostile);
    CAPTURE(e);
    CHECK((e.find("head_count 7 is not divisible by head_count_kv 2") != std::string::npos ||
           e.find("is not divisible by head_count 7") != std::string::npos));
  }
  // Gemma 3's window is required.
  const std::string g = read(kDir + "gemma3.gguf");
  CHECK(error_of(renamed(g, "gemma3.attention.sliding_window", "gemma3.attention.sliding_windoX")) ==
        tmp + ": missing metadata key 'gemma3.attention.sliding_window'");
  fs::remove(tmp);
}

// `tokenizers`' ids of the hostile corpus (tools/make_families writes FAMILY_tokenizer.json).
static std::vector<std::pair<std::string, std::vector<std::int32_t>>> tokenizer_cases(const std::string& family) {
  const json ref = json::parse(std::ifstream(kDir + family + "_tokenizer.json"));
  std::vector<std::pair<std::string, std::vector<std::int32_t>>> out;
  for (const auto& c : ref["cases"]) out.emplace_back(c["text"], c["ids"].get<std::vector<std::int32_t>>());
  return out;
}

TEST_CASE("tokenizer.json: ids identical to the tokenizers package on a hostile corpus, from tokenizer.json and GGUF") {
  const auto from_json = Tokenizer::from_tokenizer_json(kDir + "qwen2/tokenizer.json");
  const auto gguf = GgufFile::open(kDir + "qwen2.gguf");
  const auto from_gguf = Tokenizer::from_gguf(*gguf);  // the same vocabulary, tokenizer.ggml.pre "qwen2"
  CHECK(from_gguf->pre() == "qwen2");
  REQUIRE(from_json->vocab_size() == 384);
  CHECK(from_gguf->vocab_size() == 384);
  int equal = 0, cases = 0;
  for (const auto& tc : tokenizer_cases("qwen2")) {
    const std::string& text = tc.first;  // not a structured binding: Clang cannot capture one (CAPTURE)
    const std::vector<std::int32_t>& want = tc.second;
    CAPTURE(text);
    ++cases;
    // `tokenizers` finds added tokens, special ones included, in the text: parse_special = true.
    const auto a = from_json->encode(text, false, true), b = from_gguf->encode(text, false, true);
    CHECK(a == want);
    // GGUF metadata has no normalizer (llama.cpp applies none): equal wherever the text is in NFC.
    if (nfc(text) == text) CHECK(b == want);
    equal += a == want && (b == want || nfc(text) != text);
    CHECK(from_json->decode(a) == nfc(text));  // the round trip gives the normalized text back
  }
  MESSAGE("tokenizer.json (and GGUF, pre qwen2, where the text is NFC) equal `tokenizers` on " << equal << " of "
                                                                                               << cases << " strings");
  // Added tokens: special ones only through templates (text stays text), the others in text too.
  CHECK(from_json->encode("<|im_end|>", false, true) == std::vector<std::int32_t>{from_json->find("<|im_end|>")});
  CHECK(from_json->encode("<|im_end|>", false, false).size() > 1);
  CHECK(from_json->is_end_of_generation(from_json->find("<|im_end|>")));  // tokenizer_config.json's eos_token
  // Invalid UTF-8 is refused, as for every tokenizer (config::check_utf8), naming the byte.
  CHECK_THROWS_WITH(from_json->encode(std::string("ab\xff", 3), false, false), doctest::Contains("UTF-8"));

  // A checkpoint folder with tokenizer.json: the loader reads it, and its chat template (ChatML).
  specactor::config::ServerArgs a;
  a.model_path = kDir + "qwen2";
  const LoadedModel m = load_model(a);
  REQUIRE(m.tokenizer);
  CHECK(m.tokenizer->encode("hello world") == from_json->encode("hello world"));
  CHECK(m.chat.format == ChatFormat::ChatML);

  // What it does not read is refused, naming the field.
  const fs::path dir = fs::temp_directory_path() / ("specactor_tokjson_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto error_with = [&](const std::function<void(json&)>& edit) {
    json j = json::parse(std::ifstream(kDir + "qwen2/tokenizer.json"));
    edit(j);
    std::ofstream(dir / "tokenizer.json") << j.dump();
    try {
      Tokenizer::from_tokenizer_json((dir / "tokenizer.json").string());
    } catch (const GgufError& e) {
      return std::string(e.what());
    }
    return std::string("(loaded)");
  };
  auto refused = [&](const std::function<void(json&)>& edit, const std::string& want) {
    const std::string got = error_with(edit);
    CAPTURE(got);
    CHECK(got.find(want) != std::string::npos);
  };
  CHECK(error_with([](json&) {}) == "(loaded)");
  refused([](json& j) { j["model"]["byte_fallback"] = true; }, "needs the step Replace");
  refused([](json& j) { j["model"]["dropout"] = 0.1; }, "model.dropout: BPE dropout");
  refused([](json& j) { j["model"]["type"] = "Unigram"; }, "model.type Unigram is not supported");
  refused([](json& j) { j["normalizer"] = {{"type", "NFKC"}}; }, "normalizer NFKC is not supported");
  refused([](json& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}}; }, "pre_tokenizer Metaspace is not supported");
  refused([](json& j) { j["pre_tokenizer"] = nullptr; }, "pre_tokenizer is missing");
  refused([](json& j) { j["model"]["vocab"].erase("a"); }, "has no token (ids must not skip)");
  refused([](json& j) { j["model"]["merges"][0] = 7; }, "model.merges entry 0 is neither");
  refused([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed"; },
          "pre_tokenizer regex:");
  fs::remove_all(dir);
}

TEST_CASE(
    "tokenizer.json, SentencePiece-style (byte fallback): Gemma's and legacy Llama-2's layouts give the ids "
    "of the tokenizers package") {
  for (const std::string family : {"gemma3", "llama"}) {
    CAPTURE(family);
    const auto tok = Tokenizer::from_tokenizer_json(kDir + family + "/tokenizer.json");
    REQUIRE(tok->kind() == Tokenizer::Kind::SentencePiece);
    REQUIRE(tok->vocab_size() == 384);
    int equal = 0, cases = 0;
    for (const auto& tc : tokenizer_cases(family)) {
      const std::string& text = tc.first;
      const std::vector<std::int32_t>& want = tc.second;
      CAPTURE(text);
      ++cases;
      const auto got = tok->encode(text, false, true);
      CHECK(got == want);
      equal += got == want;
      // Decoding gives the text back (U+2581 -> space, <0xXX> -> bytes; the Llama layout's prefix dropped,
      // though not the one its Prepend put after an added token: "\n\n\n" -> "\n\n" "\u2581\n").
      const bool parts = text.find("\n\n") != std::string::npos || text.find('<') != std::string::npos;
      if (family == "gemma3" || !parts) CHECK(tok->decode(got) == text);
    }
    MESSAGE(family << " layout: equal to `tokenizers` on " << equal << " of " << cases << " strings");
    CHECK(cases >= 50);
    // Characters outside the vocabulary took the byte tokens (the corpus has CJK and emoji).
    std::vector<std::int32_t> bytes{tok->find("<0xE6>"), tok->find("<0x97>"), tok->find("<0xA5>")};
    if (family == "llama") bytes.insert(bytes.begin(), tok->find("\xE2\x96\x81"));  // its Prepend
    CHECK(tok->encode("\xE6\x97\xA5", false, false) == bytes);
    // BOS from tokenizer_config.json; <end_of_turn> ends a generation; specials only where asked.
    CHECK(tok->adds_bos());
    CHECK(tok->bos_id() == tok->find("<bos>"));
    CHECK(tok->is_end_of_generation(tok->find("<end_of_turn>")));
    CHECK(tok->encode("<start_of_turn>", false, false).size() > 1);
    CHECK(tok->strips_leading_space() == (family == "llama"));
    // Streaming gives what decode gives.
    const auto ids = tok->encode("hello  world, 日本 😀 <table>x", false, true);
    StreamDecoder sd(*tok, false);
    std::string streamed;
    for (auto id : ids) streamed += sd.push(id);
    streamed += sd.finish();
    CHECK(streamed == tok->decode(ids));
  }
  // The checkpoint folder's tokenizer.json is what the loader uses.
  specactor::config::ServerArgs a;
  a.model_path = kDir + "gemma3";
  const LoadedModel m = load_model(a);
  REQUIRE(m.tokenizer);
  CHECK(m.tokenizer->kind() == Tokenizer::Kind::SentencePiece);
  CHECK(m.tokenizer->encode("hello world") ==
        Tokenizer::from_tokenizer_json(kDir + "gemma3/tokenizer.json")->encode("hello world"));

  // What it does not read is refused, naming the field.
  const fs::path dir = fs::temp_directory_path() / ("specactor_spmjson_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto refused = [&](const std::function<void(json&)>& edit, const std::string& want) {
    json j = json::parse(std::ifstream(kDir + "gemma3/tokenizer.json"));
    edit(j);
    std::ofstream(dir / "tokenizer.json") << j.dump();
    std::string got = "(loaded)";
    try {
      Tokenizer::from_tokenizer_json((dir / "tokenizer.json").string());
    } catch (const GgufError& e) {
      got = e.what();
    }
    CAPTURE(got);
    CHECK(got.find((dir / "tokenizer.json").string() + ": " + want) == 0);
  };
  refused([](json& j) { j["normalizer"] = nullptr; }, "normalizer: a SentencePiece-style tokenizer");
  refused([](json& j) { j["normalizer"] = {{"type", "NFKC"}}; }, "normalizer NFKC is not supported");
  refused([](json& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}}; }, "pre_tokenizer Metaspace is not supported");
  refused([](json& j) { j["model"]["ignore_merges"] = true; }, "model.ignore_merges = true");
  refused([](json& j) { j["model"]["unk_token"] = "<nope>"; }, "model.unk_token <nope> is not a token");
  refused([](json& j) { j["model"]["byte_fallback"] = "yes"; }, "model.byte_fallback must be true or false");
  fs::remove_all(dir);
}

TEST_CASE(
    "families: tensor parallel TP = 2 on the CPU communicator gives TP = 1's logits (biases, head norms sliced)") {
  for (const std::string family : kFamilies) {
    CAPTURE(family);
    auto file = GgufFile::open(kDir + family + ".gguf");
    LlamaConfig cfg = LlamaConfig::from(read_model_info(*file), "");
    cfg.rope_neox = cfg.desc().gguf_neox;
    auto source = std::make_shared<GgufSource>(file);
    const auto ids = reference(family)["ids"].get<std::vector<std::int32_t>>();
    auto logits_with = [&](int tp) {
      auto group = k::make_cpu_group(tp);
      std::vector<std::vector<float>> out(static_cast<std::size_t>(tp));
      std::vector<std::thread> threads;
      for (int r = 0; r < tp; ++r)
        threads.emplace_back([&, r] {
          auto w = LlamaWeights::load(source, LlamaWeights::Naming::Gguf, cfg, specactor::config::LoadFormat::Auto, -1,
                                      {}, TpShard{r, tp});
          LlamaRunner runner(w, 1, k::Precision::Exact);
          KvCache kv(cfg.n_layers, w->local_kv_heads(), cfg.head_dim, 16, 128);
          KvCache::Seq seq;
          std::vector<ForwardSeq> b(1);
          b[0].kv = &seq;
          b[0].tokens = ids;
          for (std::size_t i = 0; i < ids.size(); ++i) b[0].logit_rows.push_back(static_cast<std::int32_t>(i));
          ForwardResult res;
          runner.forward(b, kv, res, {}, group[static_cast<std::size_t>(r)].get());
          out[static_cast<std::size_t>(r)] = res.logits;
        });
      for (auto& t : threads) t.join();
      for (int r = 1; r < tp; ++r) CHECK(out[static_cast<std::size_t>(r)] == out[0]);  // every rank the same
      return out[0];
    };
    const auto one = logits_with(1), two = logits_with(2);
    const double d = max_diff(one, two);
    MESSAGE(family << ": TP = 2 vs TP = 1, max |logit difference| over 64 positions = " << d);
    CHECK(d < 1e-4);
  }
}
