// tests/test_gguf.cpp — the GGUF reader on good files, on the real default model (when fetched),
// and on a corpus of malformed files: each must give its own message and none may crash (CI also
// runs this suite under AddressSanitizer + UBSan).
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "config/error.hpp"
#include "model/gguf.hpp"
#include "model/head_model.hpp"
#include "model/head_writer.hpp"
#include "model/loader.hpp"
#include "model/model_info.hpp"
#include "tests/support/gguf_writer.hpp"
#include "tests/support/skip.hpp"

using namespace specactor::model;
using specactor::testing::GgufWriter;
using specactor::testing::tiny_llama;

namespace {

std::shared_ptr<const GgufFile> parse(const std::vector<std::uint8_t>& b, const char* name = "test.gguf") {
  return GgufFile::parse(b, name);
}

// The message parsing `b` fails with ("" when it parses).
std::string error_of(const std::vector<std::uint8_t>& b) {
  try {
    parse(b);
  } catch (const GgufError& e) {
    return e.what();
  }
  return "";
}

template <class T>
void poke(std::vector<std::uint8_t>& b, std::size_t at, T v) {
  std::memcpy(b.data() + at, &v, sizeof v);
}

std::string default_model_path() {
  for (auto* p :
       {"models/SmolLM2-135M-Instruct.Q4_1.gguf", SPECACTOR_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf"})
    if (std::filesystem::exists(p)) return p;
  return "";
}

}  // namespace

TEST_CASE("a valid tiny Llama GGUF parses and yields its ModelInfo") {
  auto f = parse(tiny_llama().bytes());
  const std::uint8_t* base = f->tensors().front().data - f->tensors().front().offset - f->data_offset();
  CHECK(f->version() == 3);
  CHECK(f->alignment() == 32);
  CHECK(f->data_offset() % 32 == 0);
  CHECK(f->get_string("general.architecture") == "llama");
  CHECK(f->get_uint("llama.block_count") == 2);
  CHECK(f->get_string_array("tokenizer.ggml.tokens").size() == 64);
  const GgufTensorInfo* t = f->find_tensor("blk.1.attn_k.weight");
  REQUIRE(t != nullptr);
  CHECK(t->dims == std::vector<std::uint64_t>{32, 16});
  CHECK(t->n_bytes == 32 * 16 * 4);
  CHECK(t->data >= base + f->data_offset());
  CHECK(t->data + t->n_bytes <= base + f->file_size());

  const ModelInfo m = read_model_info(*f);
  CHECK(m.architecture == "llama");
  CHECK(m.num_layers == 2);
  CHECK(m.hidden_size == 32);
  CHECK(m.num_heads == 4);
  CHECK(m.num_kv_heads == 2);
  CHECK(m.head_dim == 8);
  CHECK(m.vocab_size == 64);
  CHECK(m.context_length == 128);
  CHECK(m.tokenizer == TokenizerKind::Gpt2ByteBpe);
  CHECK(m.tied_embeddings);
  CHECK(m.facts().llama_family);
}

TEST_CASE("typed getters, arrays and version 2") {
  GgufWriter w;
  w.version = 2;
  w.kv_i32_array("a.ints", {1, -2, 3});
  w.kv_f32_array("a.floats", {0.5f, 1.5f});
  w.kv_bool("a.flag", true);
  w.kv_u8("a.small", 7);
  w.kv_str("a.text", "hello");
  auto f = parse(w.bytes());
  CHECK(f->version() == 2);
  CHECK(f->get_int_array("a.ints") == std::vector<std::int64_t>{1, -2, 3});
  CHECK(f->get_float_array("a.floats") == std::vector<double>{0.5, 1.5});
  CHECK(f->get_bool("a.flag"));
  CHECK(f->get_int("a.small") == 7);
  CHECK_THROWS_WITH_AS(f->get_string("a.ints"), doctest::Contains("'a.ints' is array, expected string"), GgufError);
  CHECK_THROWS_WITH_AS(f->get_int("a.missing"), doctest::Contains("missing metadata key 'a.missing'"), GgufError);
}

TEST_CASE("malformed files: each gets its own message naming the file") {
  struct Case {
    const char* name;
    std::vector<std::uint8_t> bytes;
    const char* expect;
  };
  std::vector<Case> cases;

  {
    auto b = tiny_llama(/*shape*/ {}, false).bytes();
    poke<std::uint32_t>(b, 0, 0x464c457f);  // "\x7fELF"
    cases.push_back({"bad magic", b, "not a GGUF file (magic 0x464c457f"});
  }
  {
    GgufWriter w;
    w.version = 1;
    cases.push_back({"version 1", w.bytes(), "unsupported GGUF version 1 (supported: 2, 3); GGUF v1"});
  }
  {
    GgufWriter w;
    w.version = 4;
    cases.push_back({"version 4", w.bytes(), "unsupported GGUF version 4 (supported: 2, 3)"});
  }
  {
    GgufWriter w;
    w.version = 0x03000000;
    cases.push_back({"big endian", w.bytes(), "big-endian"});
  }
  cases.push_back({"three bytes", {0x47, 0x47, 0x55}, "truncated file: 3 bytes cannot hold the GGUF magic"});
  {
    GgufWriter w;
    w.kv_str("general.architecture", "llama");
    auto b = w.bytes();
    b.resize(24 + 8 + 20 + 4 + 8 + 3);  // header, key, type, length, 3 of the 5 bytes of "llama"
    cases.push_back(
        {"truncated string", b, "string length 5 at offset 56 runs past the end of the file (3 bytes left)"});
  }
  {
    GgufWriter w;
    std::vector<std::uint8_t> v(8);
    std::uint64_t huge = 1ULL << 60;
    std::memcpy(v.data(), &huge, 8);
    w.kv_raw("general.name", 8, v);
    cases.push_back({"string length past the end", w.bytes(), "string length 1152921504606846976"});
  }
  {
    GgufWriter w;
    std::vector<std::uint8_t> v(12);
    std::uint32_t et = 5;
    std::uint64_t n = 1ULL << 40;
    std::memcpy(v.data(), &et, 4);
    std::memcpy(v.data() + 4, &n, 8);
    w.kv_raw("a.ints", 9, v);
    cases.push_back({"numeric array past the end", w.bytes(), "array of 1099511627776 int32 runs past the end"});
  }
  {
    GgufWriter w;
    std::vector<std::uint8_t> v(12);
    std::uint32_t et = 8;
    std::uint64_t n = 1ULL << 40;
    std::memcpy(v.data(), &et, 4);
    std::memcpy(v.data() + 4, &n, 8);
    w.kv_raw("tokenizer.ggml.tokens", 9, v);
    cases.push_back({"string array past the end", w.bytes(), "array of 1099511627776 strings cannot fit"});
  }
  {
    GgufWriter w;
    w.kv_raw("x.weird", 13, {0, 0, 0, 0});
    cases.push_back({"unknown value type", w.bytes(), "metadata 'x.weird' has unknown value type 13"});
  }
  {
    GgufWriter w;
    w.kv_raw("x.arr", 9, {99, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
    cases.push_back({"unknown array element type", w.bytes(), "unknown array element type 99"});
  }
  {
    GgufWriter w;
    w.kv_raw("x.flag", 7, {2});
    cases.push_back({"bool byte 2", w.bytes(), "boolean byte is 2"});
  }
  {
    GgufWriter w;
    w.kv_u32("a.b", 1);
    w.kv_u32("a.b", 2);
    cases.push_back({"duplicate key", w.bytes(), "duplicate metadata key 'a.b'"});
  }
  {
    GgufWriter w;
    w.kv_str("", "x");
    cases.push_back({"empty key", w.bytes(), "metadata entry 0 has an empty key"});
  }
  {
    GgufWriter w;
    w.kv_u32("general.alignment", 24);
    cases.push_back({"alignment not a power of two", w.bytes(), "general.alignment is 24, expected a power of two"});
  }
  {
    GgufWriter w;
    w.kv_str("general.alignment", "32");
    cases.push_back({"alignment of the wrong type", w.bytes(), "general.alignment must be uint32, got string"});
  }
  {
    auto b = GgufWriter{}.bytes();
    poke<std::uint64_t>(b, 16, 1ULL << 50);  // kv count
    cases.push_back({"kv count too large", b, "metadata count 1125899906842624 cannot fit"});
  }
  {
    auto b = GgufWriter{}.bytes();
    poke<std::uint64_t>(b, 8, 1ULL << 50);  // tensor count
    cases.push_back({"tensor count too large", b, "tensor count 1125899906842624 cannot fit"});
  }
  {
    GgufWriter w;
    w.tensor("t", 0, {4, 4}, {}, 1 << 20);
    cases.push_back({"tensor offset past the end", w.bytes(),
                     "tensor 't': data [1048672, 1048736) runs past the end of the file (160 bytes)"});
  }
  {
    GgufWriter w;
    w.tensor("t", 0, {4, 4}, {}, 4);
    cases.push_back(
        {"misaligned tensor offset", w.bytes(), "tensor 't': data offset 4 is not a multiple of the alignment 32"});
  }
  {
    GgufWriter w;
    w.tensor("t", 0, {1ULL << 40, 1ULL << 40}, std::vector<std::uint8_t>(4));
    cases.push_back(
        {"dimension overflow", w.bytes(), "tensor 't': dimension 1 (1099511627776) makes the element count overflow"});
  }
  {
    GgufWriter w;
    w.tensor("t", 0, {1, 1, 1, 1, 1}, std::vector<std::uint8_t>(4));
    cases.push_back({"five dimensions", w.bytes(), "tensor 't' has 5 dimensions (expected 1..4)"});
  }
  {
    GgufWriter w;
    w.tensor("t", 99, {32}, std::vector<std::uint8_t>(32));
    cases.push_back({"unknown tensor type", w.bytes(), "tensor 't' has unsupported tensor type 99"});
  }
  {
    GgufWriter w;
    w.tensor("t", 3, {48}, std::vector<std::uint8_t>(40));
    cases.push_back(
        {"row not a multiple of the block", w.bytes(), "row length 48 is not a multiple of the Q4_1 block size 32"});
  }
  {
    GgufWriter w;
    w.tensor("t", 0, {4});
    w.tensor("t", 0, {4});
    cases.push_back({"duplicate tensor", w.bytes(), "duplicate tensor name 't'"});
  }

  for (const auto& c : cases) {
    const std::string case_name = c.name;
    CAPTURE(case_name);
    const std::string msg = error_of(c.bytes);
    CHECK_MESSAGE(msg.rfind("test.gguf: ", 0) == 0, msg);
    CHECK_MESSAGE(msg.find(c.expect) != std::string::npos, msg);
  }
  // Their own messages: no two cases share one.
  for (std::size_t i = 0; i < cases.size(); ++i)
    for (std::size_t j = i + 1; j < cases.size(); ++j) CHECK(error_of(cases[i].bytes) != error_of(cases[j].bytes));
}

TEST_CASE("ModelInfo rejects what a Llama forward cannot run") {
  auto info_error = [](GgufWriter w) {
    try {
      read_model_info(*parse(w.bytes()));
    } catch (const GgufError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  {
    GgufWriter w;
    w.kv_str("general.architecture", "gpt2");
    CHECK(info_error(w) == "test.gguf: architecture 'gpt2' is not supported (supported: llama, qwen2, qwen3, gemma3)");
  }
  {
    GgufWriter broken;  // llama metadata without block_count
    broken.kv_str("general.architecture", "llama");
    broken.kv_u32("llama.context_length", 128);
    CHECK(info_error(broken) == "test.gguf: missing metadata key 'llama.block_count'");
  }
  {
    specactor::testing::TinyLlamaShape s;
    s.heads = 5;  // 32 % 5 != 0
    CHECK(info_error(tiny_llama(s, false)).find("embedding_length 32 is not divisible by head_count 5") !=
          std::string::npos);
  }
  {
    specactor::testing::TinyLlamaShape s;
    s.kv_heads = 3;
    CHECK(info_error(tiny_llama(s, false)).find("head_count 4 is not divisible by head_count_kv 3") !=
          std::string::npos);
  }
  {
    GgufWriter w = tiny_llama({}, false);
    w.kv_u32("llama.vocab_size", 100);
    CHECK(info_error(w).find("tokenizer.ggml.tokens has 64 entries but the vocabulary size is 100") !=
          std::string::npos);
  }
}

TEST_CASE("every truncation of a valid file is an error, never a crash") {
  const auto full = tiny_llama().bytes();
  REQUIRE(error_of(full).empty());
  int errors = 0;
  for (std::size_t len = 0; len < full.size(); len += (len < 4096 ? 1 : 97)) {
    std::vector<std::uint8_t> cut(full.begin(), full.begin() + static_cast<long>(len));
    const std::string msg = error_of(cut);
    CHECK_MESSAGE(!msg.empty(), "prefix of " << len << " bytes parsed");
    errors += !msg.empty();
  }
  CHECK(errors > 100);
}

TEST_CASE("random byte corruption never crashes the reader") {
  const auto full = tiny_llama({}, true, 7).bytes();
  std::mt19937 rng(1234);
  int rejected = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    auto b = full;
    const int flips = 1 + trial % 4;
    for (int i = 0; i < flips; ++i) {
      // Most corruption is aimed at the header, metadata and directory where it matters.
      const std::size_t limit = trial % 3 == 0 ? b.size() : std::min<std::size_t>(b.size(), 2048);
      b[rng() % limit] = static_cast<std::uint8_t>(rng());
    }
    try {
      auto f = parse(b);
      for (const auto& t : f->tensors()) CHECK(f->data_offset() + t.offset + t.n_bytes <= f->file_size());
      try {
        read_model_info(*f);
      } catch (const GgufError&) {
      }
    } catch (const GgufError&) {
      ++rejected;
    }
  }
  CHECK(rejected > 0);
}

TEST_CASE("files on disk: mmap, missing, empty, directory") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("specactor_gguf_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string good = (dir / "tiny.gguf").string();
  tiny_llama().write(good);
  auto f = GgufFile::open(good);
  CHECK(f->path() == good);
  CHECK(read_model_info(*f).num_layers == 2);

  CHECK_THROWS_WITH_AS(GgufFile::open((dir / "nope.gguf").string()),
                       doctest::Contains("nope.gguf: cannot open: No such file or directory"), GgufError);
  const std::string empty = (dir / "empty.gguf").string();
  { std::ofstream(empty).flush(); }
  CHECK_THROWS_WITH_AS(GgufFile::open(empty), doctest::Contains("empty.gguf: empty file"), GgufError);
  CHECK_THROWS_WITH_AS(GgufFile::open(dir.string()), doctest::Contains("not a regular file"), GgufError);
  fs::remove_all(dir);
}

TEST_CASE("the default model (SmolLM2-135M-Instruct Q4_1), when fetched") {
  const std::string path = default_model_path();
  if (path.empty()) {
    SKIP_CASE("no default model", "models/SmolLM2-135M-Instruct.Q4_1.gguf is not fetched (run tools/setup)");
  }
  auto f = GgufFile::open(path);
  const ModelInfo m = read_model_info(*f);
  CHECK(f->version() == 3);
  CHECK(m.architecture == "llama");
  CHECK(m.num_layers == 30);
  CHECK(m.hidden_size == 576);
  CHECK(m.ffn_hidden_size == 1536);
  CHECK(m.num_heads == 9);
  CHECK(m.num_kv_heads == 3);
  CHECK(m.head_dim == 64);
  CHECK(m.vocab_size == 49152);
  CHECK(m.context_length == 8192);
  CHECK(m.rope_base == doctest::Approx(100000.0));
  CHECK(m.norm_eps == doctest::Approx(1e-5));
  CHECK(m.tokenizer == TokenizerKind::Gpt2ByteBpe);
  CHECK(m.tied_embeddings);
  CHECK(m.n_tensors == 272);
  CHECK(f->find_tensor("token_embd.weight")->type == GgmlType::Q8_0);
  CHECK(f->find_tensor("blk.0.attn_q.weight")->type == GgmlType::Q4_1);
  CHECK(f->get_string("tokenizer.chat_template").find("<|im_start|>") != std::string_view::npos);
}

// ---- draft heads (EAGLE / EAGLE3 / MTP): formats, start-up checks, token maps ----

namespace {

namespace fs = std::filesystem;

struct HeadFixture {
  std::string dir = (fs::temp_directory_path() / ("specactor_heads." + std::to_string(::getpid()))).string();
  ModelInfo info;
  LlamaConfig cfg;
  HeadFixture() {
    fs::create_directories(dir);
    specactor::testing::TinyLlamaShape s;
    s.vocab = 96;
    specactor::testing::tiny_llama(s, true, 5).write(dir + "/tiny.gguf");
    info = read_model_info(*GgufFile::open(dir + "/tiny.gguf"));
    cfg = LlamaConfig::from(info, "");
  }
  ~HeadFixture() { fs::remove_all(dir); }
  std::string write(HeadSpec spec, const std::string& name, const ModelInfo* for_info = nullptr) {
    const std::string p = dir + "/" + name;
    write_random_head(for_info ? *for_info : info, spec, p);
    return p;
  }
  std::string load_error(const std::string& path, HeadKind kind, const std::vector<std::int32_t>& hot = {},
                         bool frozen = false) {
    try {
      HeadWeights::load(path, kind, cfg, hot, frozen, specactor::config::LoadFormat::Auto);
    } catch (const GgufError& e) {
      return e.what();
    }
    return "";
  }
};

}  // namespace

TEST_CASE("heads: every kind loads from GGUF and from safetensors + config.json, and inspect reads it back") {
  HeadFixture f;
  for (HeadKind kind : {HeadKind::Eagle, HeadKind::Eagle3, HeadKind::Mtp})
    for (bool st : {false, true}) {
      HeadSpec spec;
      spec.kind = kind;
      spec.safetensors = st;
      spec.layers = kind == HeadKind::Mtp ? 2 : 1;
      const std::string p = f.write(spec, std::string(to_string(kind)) + (st ? "_hf" : ".gguf"));
      CAPTURE(p);
      const auto w = HeadWeights::load(p, kind, f.cfg, {}, false, specactor::config::LoadFormat::Auto);
      const HeadConfig& c = w->config();
      CHECK(c.kind == kind);
      CHECK(c.format == (st ? "safetensors" : "gguf"));
      CHECK(c.hidden == f.cfg.hidden);
      CHECK(c.n_layers == spec.layers);
      CHECK(static_cast<std::int64_t>(w->layers().size()) == spec.layers);
      if (kind == HeadKind::Eagle3) {
        CHECK(c.aux_layers.size() == 3);
        CHECK(c.own_vocab == 96);  // min(vocab, 4096)
        REQUIRE(c.d2t.size() == 96);
        CHECK(std::is_sorted(c.d2t.begin(), c.d2t.end()));  // the HF offsets were turned back into ids
        REQUIRE(w->output());
      } else {
        CHECK(c.aux_layers == std::vector<std::int32_t>{static_cast<std::int32_t>(f.cfg.n_layers - 1)});
        CHECK(w->output() == nullptr);  // the target's output head
      }
      CHECK(read_head_config(p).kind == kind);
      CHECK(f.load_error(p, kind == HeadKind::Eagle ? HeadKind::Mtp : HeadKind::Eagle)
                .find("head, but --speculative-algorithm is") != std::string::npos);
    }
}

TEST_CASE("heads: a wrong hidden size, a missing tensor, a mismatched vocabulary each get their own error") {
  HeadFixture f;
  HeadSpec wide;
  wide.hidden_override = 64;
  CHECK(f.load_error(f.write(wide, "wide.gguf"), HeadKind::Eagle) ==
        f.dir + "/wide.gguf: head hidden size 64 does not match the target's 32");
  HeadSpec missing;
  missing.kind = HeadKind::Mtp;
  missing.drop_tensor = "blk.0.eh_proj.weight";
  CHECK(f.load_error(f.write(missing, "missing.gguf"), HeadKind::Mtp).find("missing tensor 'blk.0.eh_proj.weight'") !=
        std::string::npos);
  HeadSpec missing_hf = missing;
  missing_hf.safetensors = true;
  missing_hf.drop_tensor = "model.layers.2.eh_proj.weight";
  CHECK(f.load_error(f.write(missing_hf, "missing_hf"), HeadKind::Mtp)
            .find("missing tensor 'model.layers.2.eh_proj.weight'") != std::string::npos);
  // A head with its own output head for a 64-token vocabulary, loaded against the 96-token target.
  ModelInfo small = f.info;
  small.vocab_size = 64;
  HeadSpec own;
  own.own_output = true;
  CHECK(f.load_error(f.write(own, "own64.gguf", &small), HeadKind::Eagle)
            .find("head vocabulary 64 does not match the target's 96") != std::string::npos);
  // EAGLE3 whose draft-to-target map points past the target's vocabulary.
  ModelInfo big = f.info;
  big.vocab_size = 4000;
  HeadSpec e3;
  e3.kind = HeadKind::Eagle3;
  e3.draft_vocab = 200;
  CHECK(f.load_error(f.write(e3, "e3big.gguf", &big), HeadKind::Eagle3).find("outside the target's vocabulary of 96") !=
        std::string::npos);
  // Layer count: a head made for a 5-layer target.
  ModelInfo deep = f.info;
  deep.num_layers = 5;
  HeadSpec mtp;
  mtp.kind = HeadKind::Mtp;
  CHECK(f.load_error(f.write(mtp, "deep.gguf", &deep), HeadKind::Mtp) ==
        f.dir + "/deep.gguf: head target layer count 5 does not match the target's 2");
  // FROZEN_KV_MTP must share the target's attention shapes.
  ModelInfo heads8 = f.info;
  heads8.num_kv_heads = 4;
  CHECK(f.load_error(f.write(mtp, "kv4.gguf", &heads8), HeadKind::Mtp, {}, true)
            .find("head KV heads 4 does not match the target's 2") != std::string::npos);
}

TEST_CASE("heads: --speculative-token-map files are read strictly, the restriction is the draft's only") {
  HeadFixture f;
  auto map_file = [&](const std::string& text) {
    const std::string p = f.dir + "/map.txt";
    std::ofstream(p) << text;
    return p;
  };
  CHECK(read_token_map(map_file("5 7, 9\n11"), 96) == std::vector<std::int32_t>{5, 7, 9, 11});
  CHECK(read_token_map(map_file("[3, 4, 95]"), 96) == std::vector<std::int32_t>{3, 4, 95});
  auto err = [&](const std::string& text) {
    try {
      read_token_map(map_file(text), 96);
    } catch (const GgufError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(err("1 2 x3").find("entry 'x3' is not a token id") != std::string::npos);
  CHECK(err("1 96").find("token id 96 is outside the target's vocabulary of 96") != std::string::npos);
  CHECK(err("4 4").find("token id 4 is listed twice") != std::string::npos);
  CHECK(err("").find("the token map is empty") != std::string::npos);
  CHECK(err("[1, \"a\"]").find("must be integers") != std::string::npos);
  HeadSpec spec;
  const std::string p = f.write(spec, "eagle.gguf");
  const auto w = HeadWeights::load(p, HeadKind::Eagle, f.cfg, {5, 7, 9}, false, specactor::config::LoadFormat::Auto);
  CHECK(w->config().hot_vocab == std::vector<std::int32_t>{5, 7, 9});
  CHECK(w->config().draft_vocab() == 3);
  CHECK(f.cfg.vocab_size == 96);  // the target's config is another object, untouched
  HeadSpec e3;
  e3.kind = HeadKind::Eagle3;
  CHECK(f.load_error(f.write(e3, "e3.gguf"), HeadKind::Eagle3, {1, 2}).find("has its own draft vocabulary") !=
        std::string::npos);
}

TEST_CASE("the shipped head's tuned settings travel in its config.json") {
  // The values measured for heads/SmolLM2-135M-Instruct-eagle3 (docs/eagle3-training.md).
  const auto d = shipped_head_defaults(SPECACTOR_SOURCE_DIR "/heads/SmolLM2-135M-Instruct-eagle3");
  REQUIRE(d.has_value());
  CHECK(d->shape.num_steps == 3);
  CHECK(d->shape.eagle_topk == 2);
  CHECK(d->shape.num_draft_tokens == 5);
  CHECK(d->p_min == 0.15);
  CHECK(d->ngram_tokens == 3);
  CHECK(d->quantization == "q4_1");
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("specactor_head_defaults." + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"specactor": {"target": "x"}})";
  CHECK_FALSE(shipped_head_defaults(dir.string()).has_value());  // a head without tuned settings
  std::ofstream(dir / "config.json") << R"({"specactor": {"defaults": {"speculative_num_steps": "three"}}})";
  CHECK_THROWS_WITH_AS(shipped_head_defaults(dir.string()),
                       doctest::Contains("config.json: specactor.defaults.speculative_num_steps: expected a number"),
                       specactor::config::ConfigError);
  std::ofstream(dir / "config.json") << R"({"specactor": {"defaults": {"speculative_num_steps": 3}}})";
  CHECK_THROWS_WITH_AS(shipped_head_defaults(dir.string()),
                       doctest::Contains("specactor.defaults.speculative_eagle_topk is missing"),
                       specactor::config::ConfigError);
  std::filesystem::remove_all(dir);
}
