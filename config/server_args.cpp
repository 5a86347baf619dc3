// config/server_args.cpp — reflection over the field table: JSON, text parsing, validation.
#include "config/server_args.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>

#include "config/error.hpp"
#include "config/input.hpp"

namespace specactor::config {
namespace {

using json = nlohmann::json;

std::string in_quotes(std::string_view s) { return "'" + std::string(s) + "'"; }

template <class E>
std::string enum_choices() {
  std::string out;
  for (const auto& [v, name] : EnumNames<E>::table) {
    if (!out.empty()) out += "|";
    out += name;
  }
  return out;
}

template <class E>
std::optional<E> enum_from_string(std::string_view text) {
  for (const auto& [v, name] : EnumNames<E>::table) {
    if (name.size() != text.size()) continue;
    bool eq = std::equal(name.begin(), name.end(), text.begin(), [](char a, char b) {
      return std::tolower(static_cast<unsigned char>(a)) == std::tolower(static_cast<unsigned char>(b));
    });
    if (eq) return v;
  }
  return std::nullopt;
}

// Per-type conversions. `where` names the flag/file/source for error messages.
template <class T>
struct Traits;

template <>
struct Traits<bool> {
  static constexpr std::string_view kind = "a boolean (true|false)";
  static json to_json(bool v) { return v; }
  static bool from_json(const json& j, const std::string& where) {
    if (!j.is_boolean()) throw ConfigError(where + ": expected " + std::string(kind) + ", got " + printable(j.dump()));
    return j.get<bool>();
  }
  static json parse(std::string_view t, const std::string& where) {
    if (t == "true" || t == "1" || t == "yes" || t == "on") return true;
    if (t == "false" || t == "0" || t == "no" || t == "off") return false;
    throw ConfigError(where + ": expected " + std::string(kind) + ", got " + in_quotes(t));
  }
};

template <>
struct Traits<std::int64_t> {
  static constexpr std::string_view kind = "an integer";
  static json to_json(std::int64_t v) { return v; }
  static std::int64_t from_json(const json& j, const std::string& where) {
    if (!j.is_number_integer())
      throw ConfigError(where + ": expected " + std::string(kind) + ", got " + printable(j.dump()));
    if (j.is_number_unsigned() && j.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))
      throw ConfigError(where + ": " + j.dump() + " is out of range (at most " + std::to_string(INT64_MAX) + ")");
    return j.get<std::int64_t>();
  }
  static json parse(std::string_view t, const std::string& where) {
    std::int64_t v = 0;
    auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    if (t.empty() || ec != std::errc{} || end != t.data() + t.size())
      throw ConfigError(where + ": expected " + std::string(kind) + ", got " + in_quotes(t));
    return v;
  }
};

template <>
struct Traits<double> {
  static constexpr std::string_view kind = "a number";
  static json to_json(double v) { return v; }
  static double from_json(const json& j, const std::string& where) {
    if (!j.is_number()) throw ConfigError(where + ": expected " + std::string(kind) + ", got " + printable(j.dump()));
    return j.get<double>();
  }
  static json parse(std::string_view t, const std::string& where) {
    std::string s(t);
    char* end = nullptr;
    double v = s.empty() ? 0.0 : std::strtod(s.c_str(), &end);
    if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(v))
      throw ConfigError(where + ": expected " + std::string(kind) + ", got " + in_quotes(t));
    return v;
  }
};

template <>
struct Traits<std::string> {
  static constexpr std::string_view kind = "a string";
  static json to_json(const std::string& v) { return v; }
  static std::string from_json(const json& j, const std::string& where) {
    if (!j.is_string()) throw ConfigError(where + ": expected " + std::string(kind) + ", got " + printable(j.dump()));
    return j.get<std::string>();
  }
  static json parse(std::string_view t, const std::string&) { return std::string(t); }
};

template <class E>
requires std::is_enum_v<E>
struct Traits<E> {
  static inline const std::string kind_str = "one of " + enum_choices<E>();
  static json to_json(E v) { return std::string(to_string(v)); }
  static E from_json(const json& j, const std::string& where) {
    if (!j.is_string()) throw ConfigError(where + ": expected " + kind_str + ", got " + printable(j.dump()));
    auto v = enum_from_string<E>(j.get<std::string>());
    if (!v) throw ConfigError(where + ": expected " + kind_str + ", got " + printable(j.dump()));
    return *v;
  }
  static json parse(std::string_view t, const std::string& where) {
    auto v = enum_from_string<E>(t);
    if (!v) throw ConfigError(where + ": expected " + kind_str + ", got " + in_quotes(t));
    return std::string(to_string(*v));
  }
};

template <>
struct Traits<Algorithm> {
  static inline const std::string kind_str =
      "one of " + enum_choices<SpecAlgorithm>() +
      ", or the name of a registered drafter (a letter, then letters, digits or _)";
  static json to_json(const Algorithm& v) { return v.name(); }
  static Algorithm from_json(const json& j, const std::string& where) {
    if (!j.is_string()) throw ConfigError(where + ": expected " + kind_str + ", got " + printable(j.dump()));
    auto v = Algorithm::parse(j.get<std::string>());
    if (!v) throw ConfigError(where + ": expected " + kind_str + ", got " + printable(j.dump()));
    return *v;
  }
  static json parse(std::string_view t, const std::string& where) {
    auto v = Algorithm::parse(t);
    if (!v) throw ConfigError(where + ": expected " + kind_str + ", got " + in_quotes(printable(t)));
    return v->name();
  }
};

template <class T>
struct Traits<std::optional<T>> {
  static json to_json(const std::optional<T>& v) { return v ? Traits<T>::to_json(*v) : json(nullptr); }
  static std::optional<T> from_json(const json& j, const std::string& where) {
    if (j.is_null()) return std::nullopt;
    return Traits<T>::from_json(j, where);
  }
  static json parse(std::string_view t, const std::string& where) { return Traits<T>::parse(t, where); }
};

// Allowed values of the free-text choice fields.
const std::vector<std::pair<std::string_view, std::vector<std::string_view>>>& choice_fields() {
  static const std::vector<std::pair<std::string_view, std::vector<std::string_view>>> table = {
      {"dtype", {"auto", "float32", "float16", "bfloat16"}},
      {"kv_cache_dtype", {"auto", "float32", "float16", "bfloat16"}},
      {"speculative_draft_kv_cache_dtype", {"auto", "float32", "float16", "bfloat16"}},
      {"speculative_draft_quantization", {"auto", "q8_0", "q4_1", "none"}},
      {"attention_backend", {"auto", "cpu", "cuda"}},
      {"prefill_attention_backend", {"auto", "cpu", "cuda"}},
      {"decode_attention_backend", {"auto", "cpu", "cuda"}},
      {"speculative_draft_attention_backend", {"auto", "cpu", "cuda"}},
      {"log_level", {"trace", "debug", "info", "warn", "error", "off"}},
      {"chat_template", {"auto", "chatml", "llama3", "gemma", "plain"}},
  };
  return table;
}

void check_choice(std::string_view field, const std::string& value) {
  for (const auto& [name, allowed] : choice_fields()) {
    if (name != field) continue;
    if (std::find(allowed.begin(), allowed.end(), value) != allowed.end()) return;
    std::string list;
    for (auto a : allowed) {
      if (!list.empty()) list.push_back('|');
      list.append(a);
    }
    throw ConfigError(flag_name(field) + ": expected one of " + list + ", got " + in_quotes(value));
  }
}

std::string fail_prefix(std::string_view field) { return flag_name(field); }

}  // namespace

std::string flag_name(std::string_view field) {
  std::string out = "--";
  for (char c : field) out += (c == '_') ? '-' : c;
  return out;
}

const std::vector<std::string>& field_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    ServerArgs a;
    for_each_field(a, [&](std::string_view name, std::string_view, auto&) { v.emplace_back(name); });
    return v;
  }();
  return names;
}

json settings_to_json(const ServerArgs& args) {
  json out = json::object();
  for_each_field(args, [&](std::string_view name, std::string_view, const auto& member) {
    using T = std::decay_t<decltype(member)>;
    out[std::string(name)] = Traits<T>::to_json(member);
  });
  return out;
}

void set_field(ServerArgs& args, std::string_view field, const json& value, std::string_view where) {
  bool found = false;
  for_each_field(args, [&](std::string_view name, std::string_view, auto& member) {
    if (name != field) return;
    found = true;
    using T = std::decay_t<decltype(member)>;
    member = Traits<T>::from_json(value, std::string(where));
    // Text settings end up in JSON (snapshots, logs, /server_info), which holds UTF-8 only.
    auto text = [&](const std::string& v) {
      try {
        check_utf8(v);
      } catch (const ConfigError& e) {
        throw ConfigError(std::string(where) + ": " + e.what());
      }
      check_choice(field, v);
    };
    if constexpr (std::is_same_v<T, std::string>) text(member);
    if constexpr (std::is_same_v<T, OptString>)
      if (member) text(*member);
  });
  if (!found) throw ConfigError(std::string(where) + ": unknown setting '" + std::string(field) + "'");
}

json parse_field_text(std::string_view field, std::string_view text) {
  json out;
  bool found = false;
  ServerArgs probe;
  for_each_field(probe, [&](std::string_view name, std::string_view, auto& member) {
    if (name != field) return;
    found = true;
    using T = std::decay_t<decltype(member)>;
    out = Traits<T>::parse(text, flag_name(field));
  });
  if (!found) throw ConfigError("unknown setting '" + std::string(field) + "'");
  return out;
}

bool is_bool_field(std::string_view field) {
  bool result = false;
  ServerArgs probe;
  for_each_field(probe, [&](std::string_view name, std::string_view, auto& member) {
    if (name == field) result = std::is_same_v<std::decay_t<decltype(member)>, bool>;
  });
  return result;
}

bool same_settings(const ServerArgs& a, const ServerArgs& b) { return settings_to_json(a) == settings_to_json(b); }

std::optional<Algorithm> Algorithm::parse(std::string_view text) {
  if (auto k = enum_from_string<SpecAlgorithm>(text); k && *k != SpecAlgorithm::Custom) return Algorithm(*k);
  if (text.empty() || text.size() > 48 || !std::isalpha(static_cast<unsigned char>(text[0]))) return std::nullopt;
  Algorithm a(SpecAlgorithm::Custom);
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (!(std::isalnum(u) || c == '_')) return std::nullopt;
    a.custom.push_back(static_cast<char>(std::toupper(u)));
  }
  return a;
}

std::string Algorithm::name() const { return kind == SpecAlgorithm::Custom ? custom : std::string(to_string(kind)); }

SpecShape auto_spec_shape(const Algorithm& algo, bool llama_family_target) {
  const bool eagle_family = algo == SpecAlgorithm::Eagle || algo == SpecAlgorithm::Eagle3;
  if (eagle_family && llama_family_target) return {5, 4, 8};
  // Earlier requests repeat in long runs (the same question again, an edited file): deep, two branches;
  // the budget verifies only what is likely.
  if (algo == SpecAlgorithm::Suffix) return {16, 2, 24};
  // A block drafter drafts its whole block in one pass (it caps the chain at block_size - 1): the
  // public checkpoints' 16-token block.
  if (algo == SpecAlgorithm::Dflash || algo == SpecAlgorithm::Dspark) return {15, 1, 16};
  return {3, 1, 4};
}

bool is_head_drafter(const Algorithm& a) {
  return a == SpecAlgorithm::Eagle || a == SpecAlgorithm::Eagle3 || a == SpecAlgorithm::Mtp ||
         a == SpecAlgorithm::FrozenKvMtp;
}

bool is_block_drafter(const Algorithm& a) { return a == SpecAlgorithm::Dflash || a == SpecAlgorithm::Dspark; }

bool needs_draft_model(const ServerArgs& a) {
  switch (a.speculative_algorithm.kind) {
    case SpecAlgorithm::Eagle:
    case SpecAlgorithm::Eagle3:
    case SpecAlgorithm::Mtp:
    case SpecAlgorithm::FrozenKvMtp:
    case SpecAlgorithm::Dflash:
    case SpecAlgorithm::Dspark:
      return true;
    case SpecAlgorithm::Standalone:
      return !a.speculative_draft_num_layers.has_value();
    case SpecAlgorithm::None:
    case SpecAlgorithm::Ngram:
    case SpecAlgorithm::Suffix:
    case SpecAlgorithm::Auto:
      return false;
    case SpecAlgorithm::Custom:  // a host's drafter may read one; it is never required
      return false;
  }
  return false;
}

void validate(const ServerArgs& a) {
  auto fail = [](std::string_view field, const std::string& msg) {
    throw ConfigError(fail_prefix(field) + ": " + msg);
  };
  auto at_least = [&](std::string_view field, std::int64_t v, std::int64_t lo) {
    if (v < lo) fail(field, "must be >= " + std::to_string(lo) + " (got " + std::to_string(v) + ")");
  };
  auto in_range = [&](std::string_view field, std::int64_t v, std::int64_t lo, std::int64_t hi) {
    if (v < lo || v > hi)
      fail(field,
           "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "] (got " + std::to_string(v) + ")");
  };

  // Choice strings (also checked on set; a directly built ServerArgs is checked here).
  for_each_field(a, [&](std::string_view name, std::string_view, const auto& member) {
    using T = std::decay_t<decltype(member)>;
    if constexpr (std::is_same_v<T, std::string>) check_choice(name, member);
    if constexpr (std::is_same_v<T, OptString>)
      if (member) check_choice(name, *member);
  });

  // Model.
  if (a.context_length) in_range("context_length", *a.context_length, 1, kMaxContextLength);
  {
    const json overrides = parse_json(a.json_model_override_args, "--json-model-override-args");
    if (!overrides.is_object())
      fail("json_model_override_args", "expected a JSON object, got " + printable(overrides.dump()));
  }

  // Runtime.
  in_range("tp_size", a.tp_size, 1, 64);
  in_range("threads", a.threads, 0, 4096);
  in_range("page_size", a.page_size, 1, 4096);
  if (a.max_total_tokens) in_range("max_total_tokens", *a.max_total_tokens, a.page_size, kMaxContextLength * 64);
  at_least("max_running_requests", a.max_running_requests, 1);
  at_least("chunked_prefill_size", a.chunked_prefill_size, 1);
  in_range("port", a.port, 1, 65535);
  at_least("random_seed", a.random_seed, 0);

  // Speculative decoding.
  const bool spec = a.speculative_algorithm != SpecAlgorithm::None;
  // AUTO is decided at resolution (EAGLE3 or NONE); the settings checked against an algorithm are
  // checked again then. A draft model has no meaning before an algorithm is named.
  const bool undecided = a.speculative_algorithm == SpecAlgorithm::Auto;
  const std::string algo(to_string(a.speculative_algorithm));
  if (undecided) {
    for (auto [field, set] : {std::pair{"speculative_draft_model_path", a.speculative_draft_model_path.has_value()},
                              std::pair{"speculative_draft_num_layers", a.speculative_draft_num_layers.has_value()}})
      if (set) fail(field, "needs --speculative-algorithm (which algorithm is the draft for?)");
  }
  if (!spec) {
    for (auto [field, set] :
         {std::pair{"speculative_num_steps", a.speculative_num_steps.has_value()},
          std::pair{"speculative_eagle_topk", a.speculative_eagle_topk.has_value()},
          std::pair{"speculative_num_draft_tokens", a.speculative_num_draft_tokens.has_value()},
          std::pair{"speculative_draft_p_min", a.speculative_draft_p_min.has_value()},
          std::pair{"speculative_draft_quantization", a.speculative_draft_quantization != "auto"},
          std::pair{"speculative_draft_ngram_tokens", a.speculative_draft_ngram_tokens.has_value()},
          std::pair{"speculative_draft_suffix_tokens", a.speculative_draft_suffix_tokens.has_value()},
          std::pair{"speculative_draft_ngram_min_match", a.speculative_draft_ngram_min_match.has_value()},
          std::pair{"speculative_draft_model_path", a.speculative_draft_model_path.has_value()},
          std::pair{"speculative_draft_num_layers", a.speculative_draft_num_layers.has_value()},
          std::pair{"speculative_draft_worker", !a.speculative_draft_worker.empty()}}) {
      if (set) fail(field, "is set but --speculative-algorithm is NONE; choose an algorithm or drop the flag");
    }
  }
  {
    const std::pair<const char*, bool> tls[] = {
        {"speculative_draft_worker_tls_certificate", a.speculative_draft_worker_tls_certificate.has_value()},
        {"speculative_draft_worker_tls_key", a.speculative_draft_worker_tls_key.has_value()},
        {"speculative_draft_worker_tls_ca", a.speculative_draft_worker_tls_ca.has_value()}};
    const int given = tls[0].second + tls[1].second + tls[2].second;
    for (auto [field, set] : tls)
      if (set && a.speculative_draft_worker.empty()) fail(field, "applies only with --speculative-draft-worker");
    for (auto [field, set] : tls)
      if (!set && given > 0)
        fail(field, "is required with the other --speculative-draft-worker-tls-* flags (all three or none)");
    if (!a.speculative_draft_worker.empty()) {  // the same rule `generate` applies, so `config` refuses it too
      const auto addr = parse_addresses(a.speculative_draft_worker, "--speculative-draft-worker");
      if (addr.size() != 1) fail("speculative_draft_worker", "one HOST:PORT (got " + std::to_string(addr.size()) + ")");
    }
    if (a.speculative_draft_worker_secret_file) {
      if (a.speculative_draft_worker.empty())
        fail("speculative_draft_worker_secret_file", "applies only with --speculative-draft-worker");
      if (given > 0)
        fail("speculative_draft_worker_secret_file",
             "not with --speculative-draft-worker-tls-* (TLS with certificates is the authentication)");
    }
  }
  if (a.speculative_num_steps) in_range("speculative_num_steps", *a.speculative_num_steps, 1, 64);
  if (a.speculative_eagle_topk) in_range("speculative_eagle_topk", *a.speculative_eagle_topk, 1, 64);
  if (a.speculative_num_draft_tokens)
    in_range("speculative_num_draft_tokens", *a.speculative_num_draft_tokens, 2, kMaxTreeTokens);
  if (a.speculative_num_steps && a.speculative_eagle_topk && a.speculative_num_draft_tokens) {
    const std::int64_t most = 1 + *a.speculative_num_steps * *a.speculative_eagle_topk;
    if (*a.speculative_num_draft_tokens > most)
      fail("speculative_num_draft_tokens",
           "must be <= 1 + steps * topk = " + std::to_string(most) + " (got " +
               std::to_string(*a.speculative_num_draft_tokens) + " with --speculative-num-steps " +
               std::to_string(*a.speculative_num_steps) + " and --speculative-eagle-topk " +
               std::to_string(*a.speculative_eagle_topk) + ")");
  }
  // Settings only the head drafters read: refused with another algorithm.
  auto head_only = [&](std::string_view field, bool set) {
    if (set && spec && !undecided && !is_head_drafter(a.speculative_algorithm))
      fail(field, "only applies to the head drafters EAGLE, EAGLE3, MTP and FROZEN_KV_MTP (got " + algo + ")");
  };
  if (a.speculative_draft_quantization != "auto" && spec && !undecided && !is_head_drafter(a.speculative_algorithm) &&
      !is_block_drafter(a.speculative_algorithm))
    fail("speculative_draft_quantization",
         "only applies to the drafters with weights of their own: EAGLE, EAGLE3, MTP, FROZEN_KV_MTP, DFLASH and DSPARK "
         "(got " +
             algo + ")");
  head_only("speculative_draft_p_min", a.speculative_draft_p_min.has_value());
  // The branches merged into a model drafter's proposal: the heads' and the block drafters'.
  auto model_drafter_only = [&](std::string_view field, bool set) {
    if (set && spec && !undecided && !is_head_drafter(a.speculative_algorithm) &&
        !is_block_drafter(a.speculative_algorithm))
      fail(field, "only applies to the model drafters EAGLE, EAGLE3, MTP, FROZEN_KV_MTP, DFLASH and DSPARK (got " +
                      algo + ")");
  };
  model_drafter_only("speculative_draft_ngram_tokens", a.speculative_draft_ngram_tokens.has_value());
  model_drafter_only("speculative_draft_ngram_min_match", a.speculative_draft_ngram_min_match.has_value());
  model_drafter_only("speculative_draft_suffix_tokens", a.speculative_draft_suffix_tokens.has_value());
  // Rejection sampling verifies a chain with the draft's probabilities; a branch makes it a tree.
  if (a.speculative_use_rejection_sampling)
    for (auto [field, v] : {std::pair{"speculative_draft_ngram_tokens", a.speculative_draft_ngram_tokens},
                            std::pair{"speculative_draft_suffix_tokens", a.speculative_draft_suffix_tokens}})
      if (v.value_or(0) > 0)
        fail(field,
             "makes the proposal a tree, and --speculative-use-rejection-sampling verifies a chain with the "
             "draft's probabilities: set it to 0 or leave rejection sampling off (got " +
                 std::to_string(*v) + ")");
  if (a.speculative_draft_suffix_tokens)
    in_range("speculative_draft_suffix_tokens", *a.speculative_draft_suffix_tokens, 0, kMaxNgramBranch);
  if (!a.speculative_budget_cache.empty() && a.speculative_budget_cache != "none") {
    if (!a.speculative_adaptive)
      fail("speculative_budget_cache", "keeps what the adaptive budget learned; --speculative-adaptive is false");
    if (a.speculative_algorithm == SpecAlgorithm::None)
      fail("speculative_budget_cache", "keeps what the adaptive budget learned; --speculative-algorithm is NONE");
  }
  in_range("speculative_suffix_cache_tokens", a.speculative_suffix_cache_tokens, 0, std::int64_t{1} << 30);
  in_range("speculative_suffix_min_match", a.speculative_suffix_min_match, 1, kMaxNgramWindow);
  in_range("speculative_suffix_max_match", a.speculative_suffix_max_match, 1, kMaxNgramWindow);
  if (a.speculative_suffix_max_match < a.speculative_suffix_min_match)
    fail("speculative_suffix_max_match", "must be >= --speculative-suffix-min-match (" +
                                             std::to_string(a.speculative_suffix_min_match) + "), got " +
                                             std::to_string(a.speculative_suffix_max_match));
  if (a.speculative_draft_ngram_tokens)
    in_range("speculative_draft_ngram_tokens", *a.speculative_draft_ngram_tokens, 0, kMaxNgramBranch);
  if (a.speculative_draft_ngram_min_match)
    in_range("speculative_draft_ngram_min_match", *a.speculative_draft_ngram_min_match, 1, kMaxNgramWindow);
  if (a.speculative_draft_p_min) {
    const double p = *a.speculative_draft_p_min;
    if (!(p >= 0.0 && p < 1.0)) fail("speculative_draft_p_min", "must be in [0, 1) (got " + std::to_string(p) + ")");
  }
  for (auto [field, v] : {std::pair{"speculative_accept_threshold_single", a.speculative_accept_threshold_single},
                          std::pair{"speculative_accept_threshold_acc", a.speculative_accept_threshold_acc}}) {
    if (!(v > 0.0 && v <= 1.0)) fail(field, "must be in (0, 1] (got " + std::to_string(v) + ")");
    // sglang's relaxed acceptance below 1 changes the output distribution; verification here is
    // lossless only, so the flag is refused rather than accepted and ignored.
    if (v != 1.0)
      fail(field,
           "values below 1 (sglang's lossy relaxed acceptance) are not implemented: specactor verifies "
           "losslessly only; leave it at 1 (got " +
               std::to_string(v) + ")");
  }
  // EAGLE3, DFLASH and DSPARK may leave it out: resolution then takes the one shipped for the model
  // (or says none ships).
  if (spec && needs_draft_model(a) && a.speculative_algorithm != SpecAlgorithm::Eagle3 &&
      !is_block_drafter(a.speculative_algorithm) &&
      (!a.speculative_draft_model_path || a.speculative_draft_model_path->empty())) {
    std::string what = a.speculative_algorithm == SpecAlgorithm::Standalone
                           ? "a draft model (or --speculative-draft-num-layers K for self-speculation)"
                           : "the " + algo + " head to load";
    fail("speculative_draft_model_path", "is required by --speculative-algorithm " + algo + ": give " + what);
  }
  if (a.speculative_draft_num_layers) {
    if (a.speculative_algorithm != SpecAlgorithm::Standalone)
      fail("speculative_draft_num_layers", "only applies to --speculative-algorithm STANDALONE (got " + algo + ")");
    at_least("speculative_draft_num_layers", *a.speculative_draft_num_layers, 1);
  }
  if (a.speculative_use_rejection_sampling && a.speculative_eagle_topk && *a.speculative_eagle_topk != 1)
    fail("speculative_use_rejection_sampling",
         "needs a chain draft (--speculative-eagle-topk 1, got " + std::to_string(*a.speculative_eagle_topk) + ")");
  if (a.speculative_token_map && !undecided &&
      !(a.speculative_algorithm == SpecAlgorithm::Eagle || a.speculative_algorithm == SpecAlgorithm::Eagle3))
    fail("speculative_token_map", "only applies to EAGLE and EAGLE3 drafters (got " + algo + ")");
  // Matches are found by sorting the corpus's suffixes on their first max-window tokens: the window
  // bounds that cost (a longer pattern would hardly ever repeat anyway).
  in_range("speculative_ngram_min_match_window_size", a.speculative_ngram_min_match_window_size, 1, kMaxNgramWindow);
  in_range("speculative_ngram_max_match_window_size", a.speculative_ngram_max_match_window_size, 1, kMaxNgramWindow);
  if (a.speculative_ngram_max_match_window_size < a.speculative_ngram_min_match_window_size)
    fail("speculative_ngram_max_match_window_size", "must be >= --speculative-ngram-min-match-window-size (" +
                                                        std::to_string(a.speculative_ngram_min_match_window_size) +
                                                        "), got " +
                                                        std::to_string(a.speculative_ngram_max_match_window_size));
  in_range("speculative_ngram_max_bfs_breadth", a.speculative_ngram_max_bfs_breadth, 1, 64);
}

}  // namespace specactor::config
