// grammar/matcher.cpp — see matcher.hpp. The frames' phases per node kind are listed at each step_*.
#include "grammar/matcher.hpp"

#include <algorithm>
#include <cmath>
#include <tuple>

namespace specactor::grammar {

namespace {

enum Outcome { Consumed, Rejected, PopRefeed, Forwarded };

// Object phases.
enum : std::uint8_t { kObjStart, kObjOpen, kObjKey, kObjColon, kObjValue, kObjAfter, kObjComma };
// Array phases (JSON brackets).
enum : std::uint8_t { kArrStart, kArrOpen, kArrAfter, kArrComma };
// String phases.
enum : std::uint8_t { kStrStart, kStrIn, kStrEsc, kStrHex, kStrUtf8 };
// Number phases: after '-', the integer part ("0" / digits), '.', fraction digits, 'e', its sign, its digits.
enum : std::uint8_t { kNumStart, kNumSign, kNumZero, kNumInt, kNumDot, kNumFrac, kNumE, kNumESign, kNumExp };
// Repeat phases: deciding (another item or the end), or after a separator.
enum : std::uint8_t { kRepNext, kRepItem };

constexpr int kIntDigits = 18, kNumDigits = 15, kFracDigits = 15, kExpDigits = 3;

bool digit(int c) { return c >= '0' && c <= '9'; }
bool hex(int c) { return digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
bool bounded(const Node& n) { return n.has_min || n.has_max; }

// Whether a value in [lo, hi] (reachable from here) can meet the node's bounds.
bool meets(const Node& n, long double lo, long double hi) {
  if (n.has_max && (n.max_exclusive ? lo >= n.max : lo > n.max)) return false;
  if (n.has_min && (n.min_exclusive ? hi <= n.min : hi < n.min)) return false;
  return true;
}

long double pow10(int k) {
  long double p = 1;
  for (int i = 0; i < k; ++i) p *= 10;
  return p;
}

// Whether the number so far can still end inside the node's bounds.
bool number_viable(const Node& n, const Frame& f) {
  if (!bounded(n)) return true;
  const bool integer = n.kind == Kind::Integer;
  const int cap = integer ? kIntDigits : kNumDigits;
  auto check = [&](long double mlo, long double mhi) {
    return (f.flags & 1) ? meets(n, -mhi, -mlo) : meets(n, mlo, mhi);
  };
  const auto mag = static_cast<long double>(f.c);
  const long double tiny = 1 / pow10(kFracDigits);  // the last fraction digit's unit
  switch (f.phase) {
    case kNumStart:
      return meets(n, -pow10(cap), pow10(cap));
    case kNumSign:
      return check(0, pow10(cap));
    case kNumZero:
      return check(0, integer ? 0 : 1 - tiny);
    case kNumInt:
      for (int k = 0; k <= cap - f.a; ++k) {
        const long double p = pow10(k);
        if (check(mag * p, integer ? mag * p + p - 1 : (mag + 1) * p - tiny)) return true;
      }
      return false;
    default: {  // '.' or fraction digits
      const long double scale = pow10(static_cast<int>(f.b));
      const long double lo = mag + static_cast<long double>(f.d) / scale;
      return check(lo, lo + 1 / scale - tiny);  // the largest reachable: the remaining digits all 9
    }
  }
}

// The number's value is inside the bounds (it ends here).
bool number_in_range(const Node& n, const Frame& f) {
  if (!bounded(n)) return true;
  long double v = static_cast<long double>(f.c) + static_cast<long double>(f.d) / pow10(static_cast<int>(f.b));
  if (f.flags & 1) v = -v;
  if (n.has_min && (n.min_exclusive ? v <= n.min : v < n.min)) return false;
  if (n.has_max && (n.max_exclusive ? v >= n.max : v > n.max)) return false;
  return true;
}

// Properties a key may name at property index `from`: those up to and including the next required one.
std::int64_t key_candidates(const Node& n, std::int32_t from) {
  std::int64_t bits = 0;
  for (std::size_t i = static_cast<std::size_t>(from); i < n.props.size(); ++i) {
    bits |= std::int64_t{1} << i;
    if (n.props[i].required) break;
  }
  return bits;
}

bool required_left(const Node& n, std::int32_t from) {
  for (std::size_t i = static_cast<std::size_t>(from); i < n.props.size(); ++i)
    if (n.props[i].required) return true;
  return false;
}

}  // namespace

bool Frame::operator<(const Frame& o) const {
  return std::tie(node, phase, flags, a, b, c, d) < std::tie(o.node, o.phase, o.flags, o.a, o.b, o.c, o.d);
}

Matcher::Matcher(std::shared_ptr<const Grammar> g) : g_(std::move(g)) {
  Frame start;
  start.node = -1;  // the start: enters the root on the first byte, then only the end may follow
  stacks_.push_back({start});
}

void Matcher::enter(Stack& s, std::int32_t node, int c, std::vector<Stack>& out) const {
  if (static_cast<std::int32_t>(s.size()) > g_->limits().max_value_depth) return;
  const Node& n = g_->node(node);
  if (n.kind == Kind::AnyOf) {
    for (const std::int32_t alt : n.children) {
      Stack copy = s;
      enter(copy, alt, c, out);
    }
    return;
  }
  Frame f;
  f.node = node;
  if (n.kind == Kind::Literals) f.c = static_cast<std::int64_t>(n.literals.size());
  s.push_back(f);
  advance(std::move(s), c, out);
}

void Matcher::advance(Stack s, int c, std::vector<Stack>& out) const {
  for (;;) {
    if (s.empty()) return;
    Frame& f = s.back();
    if (f.node < 0) {  // the start frame
      if (f.a == 0) {
        f.a = 1;
        enter(s, g_->root(), c, out);
      } else if (f.a == 1 && c == kEnd) {
        out.push_back(std::move(s));
      }
      return;
    }
    const Node& n = g_->node(f.node);
    Outcome r = Rejected;
    bool pop = false;
    switch (n.kind) {
      case Kind::Object:
        r = step_object(s, c, out) ? Forwarded : Rejected;
        break;
      case Kind::Array:
        r = step_array(s, c, out) ? Forwarded : Rejected;
        break;
      case Kind::Repeat:
        r = step_repeat(s, c, out) ? Forwarded : Rejected;
        break;
      case Kind::String:
        r = step_string(s, c) ? Consumed : Rejected;
        break;
      case Kind::Integer:
      case Kind::Number:
        r = step_number(s, c, pop) ? (pop ? PopRefeed : Consumed) : Rejected;
        break;
      case Kind::Literals:
        r = step_literals(s, c, pop) ? (pop ? PopRefeed : Consumed) : Rejected;
        break;
      case Kind::Free:
        r = step_free(s, c, pop) ? (pop ? PopRefeed : Consumed) : Rejected;
        break;
      case Kind::Sequence:
        if (f.a == static_cast<std::int32_t>(n.children.size())) {
          r = PopRefeed;
        } else {
          const std::int32_t part = n.children[static_cast<std::size_t>(f.a++)];
          enter(s, part, c, out);
          r = Forwarded;
        }
        break;
      case Kind::AnyOf:
        break;  // never on a stack (enter() expands it)
    }
    if (r == Rejected || r == Forwarded) return;
    if (r == Consumed) {
      out.push_back(std::move(s));
      return;
    }
    s.pop_back();  // complete: the byte belongs to what follows
  }
}

// Objects: '{', then keys (declared ones by literal, in order; or any string), ':', an optional
// space, the value, then ',' (and an optional space) or '}'. Forwarded: results are in `out`.
bool Matcher::step_object(Stack& s, int c, std::vector<Stack>& out) const {
  Frame& f = s.back();
  const Node& n = g_->node(f.node);
  switch (f.phase) {
    case kObjStart:
      if (c != '{') return false;
      f.phase = kObjOpen;
      break;
    case kObjOpen:
    case kObjComma:
      if (c == ' ' && f.phase == kObjComma && !(f.flags & 1)) {
        f.flags |= 1;
        break;
      }
      if (c == '}' && f.phase == kObjOpen && !required_left(n, f.a) && (!n.free_keys || n.min_items == 0)) {
        s.pop_back();
        break;
      }
      if (c != '"') return false;
      f.flags = 0;
      if (n.free_keys) {
        if (n.max_items >= 0 && f.a >= n.max_items) return false;
        ++f.a;  // keys so far
        f.phase = kObjColon;
        Frame key;
        key.node = n.key_string;
        key.phase = kStrIn;
        s.push_back(key);
        break;
      }
      f.c = key_candidates(n, f.a);
      if (f.c == 0) return false;
      f.b = 1;
      f.phase = kObjKey;
      break;
    case kObjKey: {
      std::int64_t keep = 0;
      const auto off = static_cast<std::size_t>(f.b);
      for (std::size_t i = 0; i < n.props.size(); ++i)
        if ((f.c >> i & 1) && n.props[i].key.size() > off && static_cast<std::uint8_t>(n.props[i].key[off]) == c)
          keep |= std::int64_t{1} << i;
      if (keep == 0) return false;
      f.c = keep;
      ++f.b;
      for (std::size_t i = 0; i < n.props.size(); ++i)
        if ((keep >> i & 1) && n.props[i].key.size() == off + 1) {
          f.d = static_cast<std::int64_t>(i);
          f.phase = kObjColon;
          f.b = f.c = 0;
        }
      break;
    }
    case kObjColon:
      if (c != ':') return false;
      f.phase = kObjValue;
      f.flags = 0;
      break;
    case kObjValue: {
      if (c == ' ' && !(f.flags & 1)) {
        f.flags |= 1;
        break;
      }
      f.phase = kObjAfter;
      f.flags = 0;
      std::int32_t value = n.free_value;
      if (!n.free_keys) {
        value = n.props[static_cast<std::size_t>(f.d)].value;
        f.a = static_cast<std::int32_t>(f.d) + 1;
        f.d = 0;
      }
      enter(s, value, c, out);
      return true;
    }
    case kObjAfter:
      if (c == ',' &&
          (n.free_keys ? n.max_items < 0 || f.a < n.max_items : f.a < static_cast<std::int32_t>(n.props.size()))) {
        f.phase = kObjComma;
        break;
      }
      if (c == '}' && (n.free_keys ? f.a >= n.min_items : !required_left(n, f.a))) {
        s.pop_back();
        break;
      }
      return false;
    default:
      return false;
  }
  out.push_back(std::move(s));
  return true;
}

// JSON arrays: '[', items separated by ',' (and an optional space), ']'.
bool Matcher::step_array(Stack& s, int c, std::vector<Stack>& out) const {
  Frame& f = s.back();
  const Node& n = g_->node(f.node);
  switch (f.phase) {
    case kArrStart:
      if (c != '[') return false;
      f.phase = kArrOpen;
      break;
    case kArrOpen:
      if (c == ']' && n.min_items == 0) {
        s.pop_back();
        break;
      }
      if (n.max_items == 0) return false;
      f.a = 1;
      f.phase = kArrAfter;
      enter(s, n.items, c, out);
      return true;
    case kArrAfter:
      if (c == ',' && (n.max_items < 0 || f.a < n.max_items)) {
        f.phase = kArrComma;
        f.flags = 0;
        break;
      }
      if (c == ']' && f.a >= n.min_items) {
        s.pop_back();
        break;
      }
      return false;
    case kArrComma:
      if (c == ' ' && !(f.flags & 1)) {
        f.flags |= 1;
        break;
      }
      ++f.a;
      f.phase = kArrAfter;
      enter(s, n.items, c, out);
      return true;
    default:
      return false;
  }
  out.push_back(std::move(s));
  return true;
}

// Bare repetition: items with the separator between them; the end is possible once min_items are there.
bool Matcher::step_repeat(Stack& s, int c, std::vector<Stack>& out) const {
  Frame& f = s.back();
  const Node& n = g_->node(f.node);
  if (f.phase == kRepItem) {  // the separator is done
    f.phase = kRepNext;
    enter(s, n.items, c, out);
    return true;
  }
  const bool more = n.max_items < 0 || f.a < n.max_items;
  if (f.a >= n.min_items) {  // the end: what follows reads the byte
    Stack done = s;
    done.pop_back();
    advance(std::move(done), c, out);
  }
  if (more && c != kEnd) {
    ++f.a;
    if (f.a > 1 && n.separator >= 0) {
      f.phase = kRepItem;
      enter(s, n.separator, c, out);
    } else {
      enter(s, n.items, c, out);
    }
  }
  return true;
}

// Strings: '"', characters (UTF-8 checked; escapes; no control bytes), '"'; lengths in code points.
bool Matcher::step_string(Stack& s, int c) const {
  Frame& f = s.back();
  const Node& n = g_->node(f.node);
  const bool room = n.max_len < 0 || (f.flags & Matcher::kRelaxed) || f.a < n.max_len;
  switch (f.phase) {
    case kStrStart:
      if (c != '"') return false;
      f.phase = kStrIn;
      return true;
    case kStrIn:
      if (c == '"') {
        if (f.a < n.min_len) return false;
        s.pop_back();
        return true;
      }
      if (c == kEnd || c < 0x20 || !room) return false;
      if (c == '\\') {
        f.phase = kStrEsc;
      } else if (c >= 0x80) {  // a lead byte: how many continuation bytes, and the first one's range
        std::int64_t lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) {
          f.b = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
          f.b = 2;
          if (c == 0xE0) lo = 0xA0;  // no overlong forms
          if (c == 0xED) hi = 0x9F;  // no surrogates
        } else if (c >= 0xF0 && c <= 0xF4) {
          f.b = 3;
          if (c == 0xF0) lo = 0x90;
          if (c == 0xF4) hi = 0x8F;  // nothing past U+10FFFF
        } else {
          return false;
        }
        f.c = lo | hi << 8;
        f.phase = kStrUtf8;
      }
      ++f.a;
      return true;
    case kStrUtf8:
      if (c < (f.c & 0xFF) || c > (f.c >> 8)) return false;
      f.c = 0x80 | 0xBF << 8;
      if (--f.b == 0) f.phase = kStrIn, f.c = 0;
      return true;
    case kStrEsc:
      if (c == 'u') {
        f.phase = kStrHex;
        f.b = 0;
        return true;
      }
      if (c == kEnd || std::string_view("\"\\/bfnrt").find(static_cast<char>(c)) == std::string_view::npos)
        return false;
      f.phase = kStrIn;
      return true;
    case kStrHex:
      if (!hex(c)) return false;
      if (++f.b == 4) f.phase = kStrIn, f.b = 0;
      return true;
    default:
      return false;
  }
}

// Numbers: JSON's grammar, digits capped (kIntDigits / kNumDigits, kFracDigits, kExpDigits), no
// fraction for integers, no exponent when bounded, and never a prefix that cannot end in bounds.
// `pop`: the number ended before this byte.
bool Matcher::step_number(Stack& s, int c, bool& pop) const {
  Frame& f = s.back();
  const Node& n = g_->node(f.node);
  const bool integer = n.kind == Kind::Integer;
  const Frame before = f;
  auto end_here = [&] {
    const bool complete = f.phase == kNumZero || f.phase == kNumInt || f.phase == kNumFrac || f.phase == kNumExp;
    if (!complete || !number_in_range(n, f)) return false;
    pop = true;
    return true;
  };
  switch (f.phase) {
    case kNumStart:
      if (c == '-') {
        f.flags |= 1;
        f.phase = kNumSign;
        break;
      }
      [[fallthrough]];
    case kNumSign:
      if (c == '0') {
        f.phase = kNumZero;
      } else if (digit(c)) {
        f.phase = kNumInt;
        f.a = 1;
        f.c = c - '0';
      } else {
        return false;
      }
      break;
    case kNumZero:
    case kNumInt:
      if (f.phase == kNumInt && digit(c) && f.a < (integer ? kIntDigits : kNumDigits)) {
        ++f.a;
        f.c = f.c * 10 + (c - '0');
      } else if (c == '.' && !integer) {
        f.phase = kNumDot;
      } else if ((c == 'e' || c == 'E') && !integer && !bounded(n)) {
        f.phase = kNumE;
      } else {
        return end_here();
      }
      break;
    case kNumDot:
    case kNumFrac:
      if (digit(c) && f.b < kFracDigits) {
        ++f.b;
        f.d = f.d * 10 + (c - '0');
        f.phase = kNumFrac;
      } else if (f.phase == kNumFrac && (c == 'e' || c == 'E') && !bounded(n)) {
        f.phase = kNumE;
        f.b = 0;
      } else {
        return f.phase == kNumFrac && end_here();
      }
      break;
    case kNumE:
      if (c == '+' || c == '-') {
        f.phase = kNumESign;
        break;
      }
      [[fallthrough]];
    case kNumESign:
    case kNumExp:
      if (!digit(c) || (f.phase == kNumExp && f.b >= kExpDigits)) return f.phase == kNumExp && end_here();
      if (f.phase != kNumExp) f.b = 0;
      f.phase = kNumExp;
      ++f.b;
      break;
    default:
      return false;
  }
  if (!number_viable(n, f)) {
    f = before;
    return false;
  }
  return true;
}

// Literals: the bytes of one of the sorted strings; [b, c) are the ones that still match (they share
// the first `a` bytes, so they are contiguous, the one that ends here first). `pop`: one ended here.
bool Matcher::step_literals(Stack& s, int c, bool& pop) const {
  Frame& f = s.back();
  const auto& lits = g_->node(f.node).literals;
  const auto off = static_cast<std::size_t>(f.a);
  auto first = lits.begin() + f.b, last = lits.begin() + f.c;
  const bool ends_here = lits[static_cast<std::size_t>(f.b)].size() == off;
  if (c != kEnd) {
    auto from = ends_here ? first + 1 : first;
    auto lo = std::lower_bound(from, last, c,
                               [&](const std::string& l, int ch) { return static_cast<std::uint8_t>(l[off]) < ch; });
    auto hi = std::upper_bound(lo, last, c,
                               [&](int ch, const std::string& l) { return ch < static_cast<std::uint8_t>(l[off]); });
    if (lo != hi) {
      f.b = lo - lits.begin();
      f.c = hi - lits.begin();
      ++f.a;
      return true;
    }
  }
  if (!ends_here) return false;
  pop = true;
  return true;
}

// Free text up to and including the trigger (KMP over the trigger's bytes); it may end anywhere.
bool Matcher::step_free(Stack& s, int c, bool& pop) const {
  pop = false;
  Frame& f = s.back();
  const std::string& t = g_->node(f.node).trigger;
  if (c == kEnd) {  // the text may end the whole output (the calls after it are for when it writes the trigger)
    s.clear();
    Frame done;
    done.node = -1;
    done.a = 1;
    s.push_back(done);
    return true;
  }
  // The longest prefix of the trigger that ends the text so far.
  std::int32_t k = std::min<std::int32_t>(f.a + 1, static_cast<std::int32_t>(t.size()));
  for (; k > 0; --k) {
    bool match = static_cast<std::uint8_t>(t[static_cast<std::size_t>(k - 1)]) == c;
    for (std::int32_t i = 0; match && i < k - 1; ++i)
      match = t[static_cast<std::size_t>(i)] == t[static_cast<std::size_t>(f.a - (k - 1) + i)];
    if (match) break;
  }
  f.a = k;
  if (k == static_cast<std::int32_t>(t.size())) s.pop_back();
  return true;
}

void Matcher::settle(std::vector<Stack>& stacks) const {
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  const auto cap = static_cast<std::size_t>(g_->limits().max_alternatives);
  if (stacks.size() > cap) stacks.resize(cap);
}

bool Matcher::next(std::uint8_t byte, Matcher& nx) const {
  if (nx.g_ != g_) nx.g_ = g_;
  // Inside a string on the only stack (most of a token walk): the string's step alone, no copies made
  // (the assignment reuses nx's storage).
  if (stacks_.size() == 1 && stacks_[0].back().node >= 0) {
    const Kind kind = g_->node(stacks_[0].back().node).kind;
    if (kind == Kind::String) {
      nx.stacks_ = stacks_;
      return step_string(nx.stacks_[0], byte);
    }
    // Inside a number or a literal: the same, unless the byte ends it (then the general path below).
    if (kind == Kind::Integer || kind == Kind::Number || kind == Kind::Literals) {
      nx.stacks_ = stacks_;
      bool pop = false;
      const bool ok =
          kind == Kind::Literals ? step_literals(nx.stacks_[0], byte, pop) : step_number(nx.stacks_[0], byte, pop);
      if (!ok) return false;
      if (!pop) return true;
    }
  }
  nx.stacks_.clear();
  for (const Stack& s : stacks_) advance(s, byte, nx.stacks_);
  if (nx.stacks_.empty()) return false;
  if (nx.stacks_.size() > 1) settle(nx.stacks_);
  return true;
}

bool Matcher::feed(std::string_view bytes) {
  Matcher a = *this, b(g_);
  for (const char ch : bytes) {
    if (!a.next(static_cast<std::uint8_t>(ch), b)) return false;
    std::swap(a, b);
  }
  *this = std::move(a);
  return true;
}

bool Matcher::accepting() const {
  std::vector<Stack> out;
  for (const Stack& s : stacks_) {
    advance(s, kEnd, out);
    if (!out.empty()) return true;
  }
  return false;
}

bool Matcher::finished() const {
  return std::all_of(stacks_.begin(), stacks_.end(),
                     [](const Stack& s) { return s.size() == 1 && s[0].node < 0 && s[0].a == 1; });
}

bool Matcher::bounded_string_room(std::int64_t horizon, std::int64_t& room) const {
  return inside_string(room) && room >= 0 && room <= horizon;
}

bool Matcher::inside_string(std::int64_t& room) const {
  if (stacks_.size() != 1) return false;
  const Frame& f = stacks_[0].back();
  if (f.node < 0 || f.phase != kStrIn) return false;
  const Node& n = g_->node(f.node);
  if (n.kind != Kind::String) return false;
  room = n.max_len < 0 || (f.flags & kRelaxed) ? -1 : n.max_len - f.a;
  return true;
}

void Matcher::relax_string_bound() { stacks_[0].back().flags |= kRelaxed; }

void Matcher::key(std::int64_t horizon, std::string& out) const {
  out.clear();
  const std::int64_t clip = horizon + 1;
  auto room = [&](std::int64_t left) { return std::clamp<std::int64_t>(left, -1, clip); };
  for (const Stack& s : stacks_) {
    for (Frame f : s) {
      if (f.node >= 0) {
        const Node& n = g_->node(f.node);
        if (n.kind == Kind::String) {  // only the distance to the length bounds matters
          const std::int64_t count = f.a;
          f.a = static_cast<std::int32_t>(room(n.min_len - count));
          f.d = n.max_len < 0 || (f.flags & kRelaxed) ? -1 : room(n.max_len - count);
        } else if (n.kind == Kind::Array || n.kind == Kind::Repeat || (n.kind == Kind::Object && n.free_keys)) {
          const std::int64_t count = f.a;
          f.a = static_cast<std::int32_t>(room(n.min_items - count));
          f.d = n.max_items < 0 ? -1 : room(n.max_items - count);
        } else if ((n.kind == Kind::Number || n.kind == Kind::Integer) && !bounded(n)) {
          f.c = f.d = 0;
        }
      }
      out.append(reinterpret_cast<const char*>(&f.node), sizeof f.node);
      out.push_back(static_cast<char>(f.phase));
      out.push_back(static_cast<char>(f.flags));
      out.append(reinterpret_cast<const char*>(&f.a), sizeof f.a);
      out.append(reinterpret_cast<const char*>(&f.b), sizeof f.b);
      out.append(reinterpret_cast<const char*>(&f.c), sizeof f.c);
      out.append(reinterpret_cast<const char*>(&f.d), sizeof f.d);
    }
    out.push_back('|');
  }
}

}  // namespace specactor::grammar
