// model/tokenizer_json.cpp — a Hugging Face `tokenizer.json` (byte-level BPE: GPT-2, Qwen2, Llama-3,
// SmolLM layouts; SentencePiece-style BPE with byte fallback: Gemma, legacy Llama-2 layouts) read into
// the same Tokenizer the GGUF metadata builds, and Unicode NFC through ICU.
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "config/error.hpp"
#include "config/input.hpp"
#include "model/tokenizer.hpp"

namespace specactor::model {

using json = nlohmann::json;

std::string nfc(std::string_view text) {
  bool ascii = true;
  for (unsigned char c : text) ascii = ascii && c < 0x80;
  if (ascii) return std::string(text);  // ASCII is its own NFC
  UErrorCode err = U_ZERO_ERROR;
  const UNormalizer2* n = unorm2_getNFCInstance(&err);
  if (U_FAILURE(err)) throw std::runtime_error(std::string("ICU NFC: ") + u_errorName(err));
  std::u16string in(text.size() + 1, u'\0'), out;
  int32_t in_len = 0;
  u_strFromUTF8(reinterpret_cast<UChar*>(in.data()), static_cast<int32_t>(in.size()), &in_len, text.data(),
                static_cast<int32_t>(text.size()), &err);
  if (U_FAILURE(err)) throw std::runtime_error(std::string("ICU NFC: ") + u_errorName(err));
  out.resize(static_cast<std::size_t>(in_len) * 3 + 8);
  const int32_t out_len =
      unorm2_normalize(n, reinterpret_cast<const UChar*>(in.data()), in_len, reinterpret_cast<UChar*>(out.data()),
                       static_cast<int32_t>(out.size()), &err);
  if (U_FAILURE(err)) throw std::runtime_error(std::string("ICU NFC: ") + u_errorName(err));
  std::string utf8(static_cast<std::size_t>(out_len) * 3 + 4, '\0');
  int32_t utf8_len = 0;
  u_strToUTF8(utf8.data(), static_cast<int32_t>(utf8.size()), &utf8_len, reinterpret_cast<const UChar*>(out.data()),
              out_len, &err);
  if (U_FAILURE(err)) throw std::runtime_error(std::string("ICU NFC: ") + u_errorName(err));
  utf8.resize(static_cast<std::size_t>(utf8_len));
  return utf8;
}

namespace {

// GPT-2's split: what a ByteLevel pre-tokenizer with use_regex applies.
const char* kByteLevelSplit = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string token_text(const json& t) {  // tokenizer_config.json writes a token as a string or {"content": ...}
  if (t.is_string()) return t.get<std::string>();
  if (t.is_object() && t.contains("content") && t["content"].is_string()) return t["content"].get<std::string>();
  return "";
}

}  // namespace

std::shared_ptr<const Tokenizer> Tokenizer::from_tokenizer_json(const std::string& path) {
  try {
    return read_tokenizer_json(path);
  } catch (const json::exception& e) {  // a field of an unexpected JSON type somewhere the checks did not look
    throw GgufError(path + ": malformed tokenizer.json (" + e.what() + ")");
  }
}

std::shared_ptr<const Tokenizer> Tokenizer::read_tokenizer_json(const std::string& path) {
  auto fail = [&](const std::string& what) -> void { throw GgufError(path + ": " + what); };
  const json j = config::parse_json(config::read_text_file(path, path), path);
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object()) fail("expected an object with \"model\"");
  const json& m = j["model"];
  if (m.value("type", "") != "BPE")
    fail("model.type " + config::printable(m.value("type", std::string("(none)"))) +
         " is not supported (supported: BPE, byte-level or with byte_fallback)");
  if (m.contains("byte_fallback") && !m["byte_fallback"].is_boolean())
    fail("model.byte_fallback must be true or false");
  if (m.contains("dropout") && !m["dropout"].is_null() &&
      !(m["dropout"].is_number() && m["dropout"].get<double>() == 0))
    fail("model.dropout: BPE dropout (random segmentation) is not supported; expected null");
  // SentencePiece-style BPE (Gemma, Llama-2): spaces are U+2581 in the vocabulary, characters it lacks
  // become <0xXX> byte tokens.
  const bool spm = m.value("byte_fallback", false);
  if (!m.contains("vocab") || !m["vocab"].is_object() || m["vocab"].empty())
    fail("model.vocab must be a non-empty object");
  std::shared_ptr<Tokenizer> t(new Tokenizer());
  t->kind_ = spm ? Kind::SentencePiece : Kind::ByteBpe;
  t->ignore_merges_ = m.value("ignore_merges", false);
  if (spm && t->ignore_merges_) fail("model.ignore_merges = true with byte_fallback is not supported");

  // Ids: the vocabulary's and the added tokens', one string per id with no gaps.
  std::vector<std::pair<std::string, std::int64_t>> all;
  for (const auto& [text, id] : m["vocab"].items()) {
    if (!id.is_number_integer()) fail("model.vocab[" + config::printable(text) + "] must be an integer id");
    all.emplace_back(text, id.get<std::int64_t>());
  }
  std::vector<std::pair<std::int64_t, int>> added;  // id, type
  if (j.contains("added_tokens") && j["added_tokens"].is_array())
    for (const auto& a : j["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
          !a["content"].is_string())
        fail("added_tokens: each entry needs an integer \"id\" and a string \"content\"");
      all.emplace_back(a["content"].get<std::string>(), a["id"].get<std::int64_t>());
      added.emplace_back(a["id"].get<std::int64_t>(), a.value("special", false) ? kTypeControl : kTypeUserDefined);
    }
  std::int64_t n = 0;
  for (const auto& [text, id] : all) {
    if (id < 0 || id >= (1 << 24)) fail("token id " + std::to_string(id) + " is outside [0, 16777216)");
    n = std::max(n, id + 1);
  }
  t->tokens_.assign(static_cast<std::size_t>(n), std::string());
  std::vector<bool> seen(static_cast<std::size_t>(n), false);
  for (const auto& [text, id] : all) {
    if (seen[static_cast<std::size_t>(id)] && t->tokens_[static_cast<std::size_t>(id)] != text)
      fail("token id " + std::to_string(id) + " is given to both " +
           config::printable(t->tokens_[static_cast<std::size_t>(id)]) + " and " + config::printable(text));
    seen[static_cast<std::size_t>(id)] = true;
    t->tokens_[static_cast<std::size_t>(id)] = text;
  }
  for (std::int64_t i = 0; i < n; ++i)
    if (!seen[static_cast<std::size_t>(i)]) fail("token id " + std::to_string(i) + " has no token (ids must not skip)");
  t->types_.assign(static_cast<std::size_t>(n), 1);
  for (const auto& [id, type] : added) t->types_[static_cast<std::size_t>(id)] = type;
  for (std::int64_t i = 0; i < n; ++i)
    t->index_.emplace(t->tokens_[static_cast<std::size_t>(i)], static_cast<std::int32_t>(i));
  if (spm) {  // the byte tokens of the vocabulary (not the added tokens), and the unknown token
    t->index_byte_tokens();
    for (const std::int32_t id : t->byte_tokens_)  // a vocabulary entry (not an added token): a byte token
      if (id >= 0 && t->types_[static_cast<std::size_t>(id)] == 1) t->types_[static_cast<std::size_t>(id)] = kTypeByte;
    if (m.contains("unk_token") && m["unk_token"].is_string()) {
      t->unk_ = t->find(m["unk_token"].get<std::string>());
      if (t->unk_ < 0)
        fail("model.unk_token " + config::printable(m["unk_token"].get<std::string>()) + " is not a token");
    }
    t->spm_ranked_ = true;
    t->add_space_prefix_ = false;  // a Prepend normalizer says otherwise (below)
  }

  if (!m.contains("merges") || !m["merges"].is_array()) fail("model.merges must be an array");
  std::int32_t rank = 0;
  for (const auto& e : m["merges"]) {
    std::string key;
    if (e.is_string() && e.get<std::string>().find(' ') != std::string::npos)
      key = e.get<std::string>();
    else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string())
      key = e[0].get<std::string>() + " " + e[1].get<std::string>();
    else
      fail("model.merges entry " + std::to_string(rank) + " is neither \"a b\" nor [\"a\", \"b\"]");
    t->merge_rank_.emplace(std::move(key), rank++);
  }

  // Normalizer: none or NFC; SentencePiece-style also Replace " " -> U+2581 (required) and Prepend U+2581.
  bool spaces_replaced = false;
  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    const json& nz = j["normalizer"];
    std::vector<json> steps = nz.is_object() && nz.value("type", "") == "Sequence" && nz.contains("normalizers")
                                  ? nz["normalizers"].get<std::vector<json>>()
                                  : std::vector<json>{nz};
    const char* supported =
        spm ? "none, NFC, Replace \" \" with \"\u2581\", Prepend \"\u2581\", a Sequence of them" : "none, NFC";
    for (const auto& st : steps) {
      const std::string type = st.is_object() ? st.value("type", std::string("(none)")) : st.dump();
      const bool is_replace = spm && type == "Replace" && st.contains("pattern") && st["pattern"].is_object() &&
                              st["pattern"].value("String", std::string()) == " " &&
                              st.value("content", std::string()) == "\xE2\x96\x81";
      const bool is_prepend = spm && type == "Prepend" && st.value("prepend", std::string()) == "\xE2\x96\x81";
      if (type == "NFC")
        t->nfc_ = true;
      else if (is_replace)
        spaces_replaced = true;
      else if (is_prepend)
        t->prepend_each_ = true;
      else
        fail("normalizer " + config::printable(type) + " is not supported (supported: " + supported + ")");
    }
  }
  if (spm && !spaces_replaced)
    fail(
        "normalizer: a SentencePiece-style tokenizer (model.byte_fallback) needs the step Replace \" \" with "
        "\"\u2581\" (Gemma's and Llama-2's layout); a Metaspace pre-tokenizer is not supported");
  // Pre-tokenizer: splits (regexes, digits) then the byte-level mapping.
  bool byte_level = false;
  std::vector<std::string> regexes;
  std::function<void(const json&)> pre = [&](const json& p) {
    if (!p.is_object()) fail("pre_tokenizer: each step must be an object");
    const std::string type = p.value("type", "");
    if (type == "Sequence" && p.contains("pretokenizers") && p["pretokenizers"].is_array()) {
      for (const auto& q : p["pretokenizers"]) pre(q);
    } else if (type == "ByteLevel") {
      if (p.value("add_prefix_space", false)) fail("pre_tokenizer ByteLevel.add_prefix_space = true is not supported");
      if (p.value("use_regex", true)) regexes.emplace_back(kByteLevelSplit);
      byte_level = true;
    } else if (type == "Split") {
      if (p.value("behavior", "") != "Isolated" || p.value("invert", false))
        fail("pre_tokenizer Split: only behavior \"Isolated\" without invert is supported");
      const json& pat = p.value("pattern", json::object());
      if (pat.contains("Regex") && pat["Regex"].is_string())
        regexes.push_back(pat["Regex"].get<std::string>());
      else
        fail("pre_tokenizer Split: only a {\"Regex\": ...} pattern is supported");
    } else if (type == "Digits") {
      regexes.emplace_back(p.value("individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)");
    } else {
      fail("pre_tokenizer " + config::printable(type.empty() ? std::string("(none)") : type) +
           " is not supported (supported: ByteLevel, Split, Digits, Sequence of them)");
    }
  };
  if (spm) {  // the whole normalized text is one piece: no pre-tokenizer, or Gemma's Split on " " (no spaces remain)
    const json& p = j.value("pre_tokenizer", json());
    const bool gemma_split = p.is_object() && p.value("type", "") == "Split" && p.contains("pattern") &&
                             p["pattern"].is_object() && p["pattern"].value("String", std::string("-")) == " " &&
                             !p.value("invert", false);
    if (!p.is_null() && !gemma_split)
      fail("pre_tokenizer " + config::printable(p.is_object() ? p.value("type", std::string("(none)")) : p.dump()) +
           " is not supported with model.byte_fallback (supported: none, Split on \" \")");
  } else {
    if (!j.contains("pre_tokenizer") || j["pre_tokenizer"].is_null())
      fail("pre_tokenizer is missing (byte-level BPE needs one)");
    pre(j["pre_tokenizer"]);
    if (!byte_level) fail("pre_tokenizer has no ByteLevel step (only byte-level BPE is read from tokenizer.json)");
    for (const auto& r : regexes) {
      try {
        t->add_split(r);
      } catch (const std::runtime_error& e) {
        fail(std::string("pre_tokenizer regex: ") + e.what());
      }
    }
  }
  t->pre_ = "tokenizer.json";

  // BOS: what the post-processor puts first; EOS, BOS and the chat template from tokenizer_config.json.
  if (j.contains("post_processor") && j["post_processor"].is_object() &&
      j["post_processor"].value("type", "") == "TemplateProcessing" && j["post_processor"].contains("single")) {
    const json& single = j["post_processor"]["single"];
    if (single.is_array() && !single.empty() && single[0].contains("SpecialToken")) {
      t->bos_ = t->find(single[0]["SpecialToken"].value("id", ""));
      t->add_bos_ = t->bos_ >= 0;
    }
  }
  const std::string cfg = (std::filesystem::path(path).parent_path() / "tokenizer_config.json").string();
  if (std::filesystem::exists(cfg)) {
    const json c = config::parse_json(config::read_text_file(cfg, cfg), cfg);
    if (c.contains("eos_token")) t->eos_ = t->find(token_text(c["eos_token"]));
    if (c.contains("bos_token") && !token_text(c["bos_token"]).empty()) t->bos_ = t->find(token_text(c["bos_token"]));
    if (c.contains("add_bos_token") && c["add_bos_token"].is_boolean()) t->add_bos_ = c["add_bos_token"].get<bool>();
    if (c.contains("chat_template") && c["chat_template"].is_string())
      t->chat_template_ = c["chat_template"].get<std::string>();
    else if (c.contains("chat_template") && c["chat_template"].is_array())  // [{"name", "template"}]
      for (const auto& e : c["chat_template"])
        if (e.is_object() && e.value("name", "") == "default") t->chat_template_ = e.value("template", "");
  }
  t->add_bos_ = t->add_bos_ && t->bos_ >= 0;
  t->index_specials();
  return t;
}

}  // namespace specactor::model
