// model/tokenizer.cpp — byte-level BPE and SentencePiece BPE from GGUF metadata.
#include "model/tokenizer.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <queue>

#include "config/error.hpp"

namespace specactor::model {

namespace {

// GPT-2's reversible map from bytes to printable code points.
struct ByteMap {
  char32_t to_cp[256];
  int from_cp[512];  // code point -> byte, -1 when the code point is not a byte stand-in
  ByteMap() {
    std::fill(std::begin(from_cp), std::end(from_cp), -1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      to_cp[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      from_cp[to_cp[b]] = b;
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// The byte a SentencePiece byte token "<0xHH>" stands for, or -1 when the text has another form.
int byte_token_value(std::string_view t) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
  const int hi = hex_digit(t[3]), lo = hex_digit(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

// Length of the UTF-8 character starting with byte c (1 for invalid lead bytes).
std::size_t utf8_len(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c >> 5) == 0x6) return 2;
  if ((c >> 4) == 0xE) return 3;
  if ((c >> 3) == 0x1E) return 4;
  return 1;
}

// Decodes one code point at s[i]; advances i. Invalid sequences yield the byte value.
char32_t next_cp(std::string_view s, std::size_t& i) {
  const auto c = static_cast<unsigned char>(s[i]);
  std::size_t n = utf8_len(c);
  if (n == 1 || i + n > s.size()) {
    ++i;
    return c;
  }
  char32_t cp = c & (0xFF >> (n + 1));
  for (std::size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

std::vector<std::string> utf8_chars(std::string_view s) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < s.size();) {
    std::size_t n = std::min(utf8_len(static_cast<unsigned char>(s[i])), s.size() - i);
    out.emplace_back(s.substr(i, n));
    i += n;
  }
  return out;
}

// The offset of the first byte that does not belong to a well-formed UTF-8 sequence (RFC 3629: no
// overlong forms, no surrogates, nothing above U+10FFFF), or npos.
// Merges adjacent symbols by priority until no pair has one: the pair with the best priority goes
// first, the leftmost among equals (what rescanning every pair after each merge would pick), in
// O(n log n) instead of O(n²). `priority(left, right)` returns false when the pair does not merge,
// otherwise fills a value where smaller is better.
template <class Priority>
std::vector<std::string> merge_symbols(std::vector<std::string> sym, Priority&& priority) {
  const std::size_t n = sym.size();
  if (n < 2) return sym;
  std::vector<std::size_t> prev(n), next(n);
  for (std::size_t i = 0; i < n; ++i) prev[i] = i - 1, next[i] = i + 1;  // SIZE_MAX / n mark the ends
  struct Cand {
    double prio;
    std::size_t left, len_left, len_right;
    bool operator>(const Cand& o) const { return prio != o.prio ? prio > o.prio : left > o.left; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](std::size_t l) {
    if (l == SIZE_MAX || next[l] >= n) return;
    double p;
    if (priority(sym[l], sym[next[l]], p)) heap.push({p, l, sym[l].size(), sym[next[l]].size()});
  };
  for (std::size_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    const std::size_t r = next[c.left];
    // Stale: either side merged since (a symbol only grows, so equal lengths mean unchanged).
    if (r >= n || sym[c.left].size() != c.len_left || sym[r].size() != c.len_right || sym[c.left].empty()) continue;
    sym[c.left] += sym[r];
    sym[r].clear();
    next[c.left] = next[r];
    if (next[r] < n) prev[next[r]] = c.left;
    push(prev[c.left]);
    push(c.left);
  }
  std::vector<std::string> out;
  for (std::size_t i = 0; i < n; i = next[i]) out.push_back(std::move(sym[i]));
  return out;
}

// Pre-tokenizer regexes per `tokenizer.ggml.pre` (applied in order; matches and the gaps between
// them both become pieces).
const char* kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen2's: Llama-3's with digits one at a time.
const char* kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::vector<const char*> pre_regexes(const std::string& pre, bool& known) {
  known = true;
  if (pre == "smollm" || pre == "starcoder" || pre == "refact" || pre == "codeshell" || pre == "command-r")
    return {R"(\p{N})", kGpt2};
  if (pre == "llama-bpe" || pre == "llama3" || pre == "smaug-bpe") return {kLlama3};
  if (pre == "qwen2" || pre == "deepseek-r1-qwen") return {kQwen2};
  if (pre == "gpt-2" || pre == "gpt2" || pre == "default" || pre.empty()) return {kGpt2};
  known = false;
  return {kGpt2};
}

}  // namespace

struct Tokenizer::Regex {
  pcre2_code* code = nullptr;
  explicit Regex(const char* pattern) {
    int err = 0;
    PCRE2_SIZE off = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err,
                         &off, nullptr);
    if (!code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw std::runtime_error(std::string("tokenizer regex: ") + reinterpret_cast<char*>(msg));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional speed-up; matching works without it
  }
  ~Regex() { pcre2_code_free(code); }
  // Splits `s` into matches and the gaps between them (both kept, in order).
  void split(std::string_view s, std::vector<std::string_view>& out) const {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
    std::size_t pos = 0, gap = 0;
    while (pos <= s.size()) {
      const int rc =
          pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc < 0) break;
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const std::size_t b = ov[0], e = ov[1];
      if (e == b) {  // empty match: step over one character
        pos = b + std::max<std::size_t>(1, utf8_len(static_cast<unsigned char>(b < s.size() ? s[b] : 0)));
        continue;
      }
      if (b > gap) out.push_back(s.substr(gap, b - gap));
      out.push_back(s.substr(b, e - b));
      gap = pos = e;
    }
    if (gap < s.size()) out.push_back(s.substr(gap));
    pcre2_match_data_free(md);
  }
};

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

void Tokenizer::add_split(const std::string& regex) { split_.push_back(std::make_unique<Regex>(regex.c_str())); }

std::shared_ptr<const Tokenizer> Tokenizer::from_gguf(const GgufFile& f) {
  auto fail = [&](const std::string& what) { throw GgufError(f.path() + ": " + what); };
  std::shared_ptr<Tokenizer> t(new Tokenizer());
  const std::string_view model = f.get_string("tokenizer.ggml.model");
  if (model == "gpt2")
    t->kind_ = Kind::ByteBpe;
  else if (model == "llama")
    t->kind_ = Kind::SentencePiece;
  else
    fail("tokenizer.ggml.model '" + std::string(model) + "' is not supported (supported: gpt2, llama)");

  const auto& toks = f.get_string_array("tokenizer.ggml.tokens");
  if (toks.empty()) fail("tokenizer.ggml.tokens is empty");
  const auto n = static_cast<std::int64_t>(toks.size());
  t->tokens_.assign(toks.begin(), toks.end());
  t->index_.reserve(toks.size());
  for (std::int64_t i = 0; i < n; ++i) t->index_.emplace(t->tokens_[i], static_cast<std::int32_t>(i));
  if (f.has("tokenizer.ggml.token_type")) {
    const auto types = f.get_int_array("tokenizer.ggml.token_type");
    if (static_cast<std::int64_t>(types.size()) != n)
      fail("tokenizer.ggml.token_type has " + std::to_string(types.size()) + " entries, expected " + std::to_string(n));
    t->types_.assign(types.begin(), types.end());
  } else {
    t->types_.assign(static_cast<std::size_t>(n), 1);
  }
  auto id_key = [&](const char* key, std::int32_t dflt) {
    if (!f.has(key)) return dflt;
    const std::int64_t v = f.get_int(key);
    if (v < 0 || v >= n)
      fail(std::string(key) + " = " + std::to_string(v) + " is outside the vocabulary of " + std::to_string(n));
    return static_cast<std::int32_t>(v);
  };
  t->bos_ = id_key("tokenizer.ggml.bos_token_id", -1);
  t->eos_ = id_key("tokenizer.ggml.eos_token_id", -1);
  t->unk_ = id_key("tokenizer.ggml.unknown_token_id", -1);
  t->add_bos_ = f.has("tokenizer.ggml.add_bos_token") ? f.get_bool("tokenizer.ggml.add_bos_token")
                                                      : t->kind_ == Kind::SentencePiece;
  if (f.has("tokenizer.ggml.add_space_prefix")) t->add_space_prefix_ = f.get_bool("tokenizer.ggml.add_space_prefix");
  if (f.has("tokenizer.chat_template")) t->chat_template_ = std::string(f.get_string("tokenizer.chat_template"));
  if (f.has("tokenizer.ggml.pre")) t->pre_ = std::string(f.get_string("tokenizer.ggml.pre"));

  t->index_specials();

  if (t->kind_ == Kind::ByteBpe) {
    const auto& merges = f.get_string_array("tokenizer.ggml.merges");
    t->merge_rank_.reserve(merges.size());
    for (std::size_t r = 0; r < merges.size(); ++r) {
      if (merges[r].find(' ') == std::string_view::npos)
        fail("tokenizer.ggml.merges entry " + std::to_string(r) + " ('" + std::string(merges[r]) + "') has no space");
      t->merge_rank_.emplace(std::string(merges[r]), static_cast<std::int32_t>(r));
    }
    bool known = true;
    for (const char* p : pre_regexes(t->pre_, known)) t->split_.push_back(std::make_unique<Regex>(p));
    if (!known)
      std::fprintf(stderr, "warning: %s: unknown pre-tokenizer '%s', using the GPT-2 split\n", f.path().c_str(),
                   t->pre_.c_str());
  } else {
    const auto scores = f.get_float_array("tokenizer.ggml.scores");
    if (static_cast<std::int64_t>(scores.size()) != n)
      fail("tokenizer.ggml.scores has " + std::to_string(scores.size()) + " entries, expected " + std::to_string(n));
    t->scores_.assign(scores.begin(), scores.end());
    for (std::int64_t i = 0; i < n; ++i)
      if (t->types_[i] == kTypeByte && byte_token_value(t->tokens_[i]) < 0)
        fail("tokenizer.ggml.tokens entry " + std::to_string(i) +
             " is a byte token (token_type 6) but is not written <0xHH>");
    t->index_byte_tokens();
  }
  return t;
}

void Tokenizer::index_byte_tokens() {
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    byte_tokens_[b] = find(name);
  }
}

// Special and user-defined tokens longest first, the user-defined ones' first bytes, the end tokens.
void Tokenizer::index_specials() {
  const auto n = static_cast<std::int64_t>(tokens_.size());
  for (std::int64_t i = 0; i < n; ++i)
    if (types_[i] == kTypeControl || types_[i] == kTypeUserDefined)
      special_ids_.push_back(static_cast<std::int32_t>(i));
  std::sort(special_ids_.begin(), special_ids_.end(), [&](std::int32_t a, std::int32_t b) {
    return tokens_[a].size() > tokens_[b].size() || (tokens_[a].size() == tokens_[b].size() && a < b);
  });
  for (std::int32_t id : special_ids_)  // longest first, as special_ids_
    if (types_[id] == kTypeUserDefined && !tokens_[id].empty()) {
      user_ids_.push_back(id);
      user_first_[static_cast<unsigned char>(tokens_[id][0])] = true;
    }
  if (eos_ >= 0) eog_.push_back(eos_);
  for (const char* name :
       {"<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "<end_of_turn>", "</s>", "<|eom_id|>"}) {
    const std::int32_t id = find(name);
    if (id >= 0 && std::find(eog_.begin(), eog_.end(), id) == eog_.end()) eog_.push_back(id);
  }
}

std::int32_t Tokenizer::find(std::string_view text) const {
  auto it = index_.find(std::string(text));
  return it == index_.end() ? -1 : it->second;
}

bool Tokenizer::is_special(std::int32_t id) const {
  return id >= 0 && id < vocab_size() && (types_[id] == kTypeControl || types_[id] == kTypeUserDefined);
}

bool Tokenizer::is_end_of_generation(std::int32_t id) const {
  return std::find(eog_.begin(), eog_.end(), id) != eog_.end();
}

std::vector<std::int32_t> Tokenizer::encode_piece_bpe(std::string_view piece) const {
  std::vector<std::string> start;
  start.reserve(piece.size());
  for (unsigned char c : piece) {
    std::string s;
    append_utf8(s, byte_map().to_cp[c]);
    start.push_back(std::move(s));
  }
  if (ignore_merges_) {  // Llama-3's tokenizer.json: a whole piece in the vocabulary is taken as it is
    std::string whole;
    for (const auto& s : start) whole += s;
    if (auto it = index_.find(whole); it != index_.end()) return {it->second};
  }
  std::string key;
  const std::vector<std::string> sym =
      merge_symbols(std::move(start), [&](const std::string& a, const std::string& b, double& p) {
        key.assign(a).append(" ").append(b);
        auto it = merge_rank_.find(key);
        if (it == merge_rank_.end()) return false;
        p = it->second;
        return true;
      });
  std::vector<std::int32_t> ids;
  ids.reserve(sym.size());
  for (const auto& s : sym) {
    auto it = index_.find(s);
    if (it != index_.end()) {
      ids.push_back(it->second);
    } else {  // a merge result missing from the vocabulary: fall back to its bytes
      // Byte by byte; a byte without a token is dropped (as Hugging Face's BPE without an unk token does).
      for (const auto& ch : utf8_chars(s))
        if (auto b = index_.find(ch); b != index_.end()) ids.push_back(b->second);
    }
  }
  return ids;
}

void Tokenizer::encode_text_bpe(std::string_view raw, std::vector<std::int32_t>& out) const {
  const std::string normalized = nfc_ ? nfc(raw) : std::string();
  const std::string_view text = nfc_ ? std::string_view(normalized) : raw;
  std::vector<std::string_view> pieces{text}, next;
  for (const auto& re : split_) {
    next.clear();
    for (auto p : pieces) re->split(p, next);
    pieces.swap(next);
  }
  for (auto p : pieces) {
    const auto ids = encode_piece_bpe(p);
    out.insert(out.end(), ids.begin(), ids.end());
  }
}

void Tokenizer::encode_text_spm(std::string_view raw, bool at_start, std::vector<std::int32_t>& out) const {
  const std::string normalized = nfc_ ? nfc(raw) : std::string();
  const std::string_view text = nfc_ ? std::string_view(normalized) : raw;
  std::string s;
  if ((at_start && add_space_prefix_) || prepend_each_) s = " ";
  s.append(text);
  std::string norm;
  for (char c : s) {
    if (c == ' ')
      norm += "\xE2\x96\x81";
    else
      norm += c;
  }
  std::string key;
  const std::vector<std::string> sym =
      merge_symbols(utf8_chars(norm), [&](const std::string& a, const std::string& b, double& p) {
        if (spm_ranked_) {  // tokenizer.json: only the listed merges, the earliest first
          key.assign(a).append(" ").append(b);
          auto it = merge_rank_.find(key);
          if (it == merge_rank_.end()) return false;
          p = it->second;
          return true;
        }
        key.assign(a).append(b);
        auto it = index_.find(key);
        if (it == index_.end()) return false;
        const float score = scores_[it->second];
        if (!(score > -INFINITY)) return false;  // -inf and NaN never merge
        p = -static_cast<double>(score);         // the highest score first
        return true;
      });
  for (const auto& x : sym) {
    auto it = index_.find(x);
    if (it != index_.end()) {
      out.push_back(it->second);
      continue;
    }
    for (unsigned char c : x) {
      const std::int32_t b = byte_tokens_[c];
      if (b >= 0)
        out.push_back(b);
      else if (unk_ >= 0)
        out.push_back(unk_);
    }
  }
}

std::vector<std::int32_t> Tokenizer::encode(std::string_view text, bool add_bos, bool parse_special) const {
  check_utf8(text);
  std::vector<TextPart> parts;
  std::size_t start = 0, i = 0;
  if (parse_special && !special_ids_.empty()) {
    while (i < text.size()) {
      std::int32_t hit = -1;
      if (text[i] == '<' || text[i] == '[') {
        for (std::int32_t id : special_ids_) {
          const std::string& s = tokens_[id];
          if (!s.empty() && text.compare(i, s.size(), s) == 0) {
            hit = id;
            break;
          }
        }
      }
      if (hit < 0) {
        ++i;
        continue;
      }
      if (i > start) parts.push_back({std::string(text.substr(start, i - start)), false});
      parts.push_back({tokens_[hit], true});
      i += tokens_[hit].size();
      start = i;
    }
  }
  if (start < text.size()) parts.push_back({std::string(text.substr(start)), false});
  return encode_parts(parts, add_bos);
}

std::vector<std::int32_t> Tokenizer::encode_parts(const std::vector<TextPart>& parts, bool add_bos) const {
  std::vector<std::int32_t> out;
  bool at_start = true;
  std::string run;  // consecutive text parts are encoded together, as one text
  auto encode_text = [&](std::string_view text) {
    if (text.empty()) return;
    if (kind_ == Kind::ByteBpe)
      encode_text_bpe(text, out);
    else
      encode_text_spm(text, at_start, out);
    at_start = false;
  };
  auto flush = [&] {
    if (run.empty()) return;
    check_utf8(run);
    // User-defined tokens (Gemma's runs of spaces and newlines, "<table>", ...) stand for their text
    // wherever it appears, as llama.cpp and Hugging Face match them: longest first, before the model.
    std::size_t from = 0;
    for (std::size_t i = 0; i < run.size() && !user_ids_.empty();) {
      std::int32_t hit = -1;
      if (user_first_[static_cast<unsigned char>(run[i])])
        for (std::int32_t id : user_ids_)
          if (run.compare(i, tokens_[id].size(), tokens_[id]) == 0) {
            hit = id;
            break;
          }
      if (hit < 0) {
        ++i;
        continue;
      }
      encode_text(std::string_view(run).substr(from, i - from));
      out.push_back(hit);
      at_start = false;
      i += tokens_[hit].size();
      from = i;
    }
    encode_text(std::string_view(run).substr(from));
    run.clear();
  };
  for (const auto& p : parts) {
    const std::int32_t id = p.marker ? find(p.text) : -1;
    if (id < 0 || !is_special(id)) {  // text, or a marker this vocabulary lacks: its text
      run += p.text;
      continue;
    }
    flush();
    out.push_back(id);
    at_start = false;
  }
  flush();
  if (add_bos && add_bos_ && bos_ >= 0 && (out.empty() || out.front() != bos_)) out.insert(out.begin(), bos_);
  return out;
}

std::string Tokenizer::token_bytes(std::int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  const std::string& t = tokens_[id];
  if (is_special(id)) return t;
  if (kind_ == Kind::SentencePiece) {
    if (types_[id] == kTypeByte) return std::string(1, static_cast<char>(byte_token_value(t)));  // checked at load
    std::string out;
    for (std::size_t i = 0; i < t.size();) {
      if (t.compare(i, 3, "\xE2\x96\x81") == 0)
        out += ' ', i += 3;
      else
        out += t[i++];
    }
    return out;
  }
  std::string out;
  for (std::size_t i = 0; i < t.size();) {
    const std::size_t at = i;
    const char32_t cp = next_cp(t, i);
    const int b = cp < 512 ? byte_map().from_cp[cp] : -1;
    if (b >= 0)
      out += static_cast<char>(b);
    else
      out.append(t, at, i - at);
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<std::int32_t>& ids, bool skip_special) const {
  std::string out;
  for (std::int32_t id : ids) {
    if (skip_special && is_special(id)) continue;
    out += token_bytes(id);
  }
  if (strips_leading_space() && !out.empty() && out[0] == ' ') out.erase(0, 1);
  return out;
}

std::size_t complete_utf8_prefix(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const std::size_t n = utf8_len(c);
    if (n == 1) {
      ++i;
      continue;
    }
    if (i + n > s.size()) {
      // Incomplete only if the bytes so far are valid continuations.
      bool cont = true;
      for (std::size_t k = i + 1; k < s.size(); ++k) cont = cont && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80;
      if (cont) return i;
      ++i;
      continue;
    }
    i += n;
  }
  return s.size();
}

std::string StreamDecoder::push(std::int32_t id) {
  if (skip_special_ && tok_.is_special(id)) return {};
  std::string piece = tok_.token_bytes(id);
  if (first_ && tok_.strips_leading_space() && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
  first_ = false;
  pending_ += piece;
  const std::size_t n = complete_utf8_prefix(pending_);
  std::string out = pending_.substr(0, n);
  pending_.erase(0, n);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out;
  if (!pending_.empty()) out = "\xEF\xBF\xBD";  // U+FFFD for a character cut off at the end
  pending_.clear();
  return out;
}

}  // namespace specactor::model
