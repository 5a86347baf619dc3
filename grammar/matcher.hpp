// grammar/matcher.hpp — reads output bytes against a grammar (grammar.hpp): a set of parse stacks
// (one per live anyOf alternative), each a stack of frames. Every step is bounded: at most
// Limits::max_value_depth frames per stack and max_alternatives stacks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/grammar.hpp"

namespace specactor::grammar {

struct Frame {
  std::int32_t node = 0;
  std::uint8_t phase = 0;
  std::uint8_t flags = 0;  // object/array: a space was written in this gap; number: negative; string: kRelaxed
  std::int32_t a = 0;      // object: next property; array/repeat: items; string: code points; number: integer
                           // digits; literals: offset; sequence: next part; free: trigger bytes matched
  std::int64_t b = 0;      // object: key offset; string: pending bytes; number: fraction/exponent digits; literals: lo
  std::int64_t c = 0;      // object: key candidates (bits); number: integer magnitude; literals: hi
  std::int64_t d = 0;      // object: the matched property; number: fraction value
  bool operator==(const Frame& o) const {
    return node == o.node && phase == o.phase && flags == o.flags && a == o.a && b == o.b && c == o.c && d == o.d;
  }
  bool operator<(const Frame& o) const;
};

class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const Grammar> g);

  // Reads bytes; false (and the state unchanged) when the grammar does not allow them here.
  bool feed(std::string_view bytes);
  // next = this after one more byte; false when the byte is not allowed (next is then unusable).
  bool next(std::uint8_t byte, Matcher& next) const;
  // The output so far is complete: it may end here (an end-of-generation token is allowed).
  bool accepting() const;
  // Complete, and no byte may follow.
  bool finished() const;
  // The state as bytes, for the mask cache: counters that cannot matter within `horizon` more bytes
  // (the longest token) are clipped, so states that allow the same tokens share a key.
  void key(std::int64_t horizon, std::string& out) const;
  const Grammar& grammar() const { return *g_; }

  // The masks' shortcut for strings with a maxLength: when the output is inside such a string (one
  // parse stack, between characters) with `room` <= horizon code points left, the mask is the one of
  // the same string without the bound, less the tokens that write more than `room` characters in it.
  bool bounded_string_room(std::int64_t horizon, std::int64_t& room) const;
  void relax_string_bound();  // the top string frame ignores its maxLength (kRelaxed)
  // Between characters of a string on the only stack; `room`: code points it may still take (-1: any).
  bool inside_string(std::int64_t& room) const;
  static constexpr std::uint8_t kRelaxed = 2;

  using Stack = std::vector<Frame>;
  static constexpr int kEnd = 256;  // the end of the output, fed like a byte

 private:
  void advance(Stack s, int c, std::vector<Stack>& out) const;
  void enter(Stack& s, std::int32_t node, int c, std::vector<Stack>& out) const;
  bool step_object(Stack& s, int c, std::vector<Stack>& out) const;
  bool step_array(Stack& s, int c, std::vector<Stack>& out) const;
  bool step_string(Stack& s, int c) const;
  bool step_number(Stack& s, int c, bool& pop) const;
  bool step_literals(Stack& s, int c, bool& pop) const;
  bool step_repeat(Stack& s, int c, std::vector<Stack>& out) const;
  bool step_free(Stack& s, int c, bool& pop) const;
  void settle(std::vector<Stack>& stacks) const;

  std::shared_ptr<const Grammar> g_;
  std::vector<Stack> stacks_;
};

}  // namespace specactor::grammar
