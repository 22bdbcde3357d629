#include "lib/tokenizer/pre_tokenizer.h"

#include <array>

#include "lib/tokenizer/unicode.h"

namespace kiln::pretok {
namespace {

using unicode::kLetter;
using unicode::kNumber;
using unicode::kPunctuation;
using unicode::kWhitespace;

// Flags as seen inside a fragment [begin, end): kInRange marks positions inside it, so "other"
// (no class, e.g. symbols and invalid bytes) is distinguishable from "past the end".
constexpr uint8_t kInRange = 0x80;

using Emit = absl::FunctionRef<void(size_t, size_t)>;

// A fragment [begin, end) of the unit array; positions past `end` read as out of range.
struct Fragment {
  const Unit* u;
  size_t begin;
  size_t end;

  uint8_t Flags(size_t i) const { return i < end ? (u[i].flags | kInRange) : 0; }
  uint32_t Cp(size_t i) const { return i < end ? u[i].cp : 0xFFFFFFFFu; }
};

bool IsOther(uint8_t f) { return (f & kInRange) && !(f & (kLetter | kNumber | kWhitespace)); }
uint32_t AsciiLower(uint32_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

// Emits consecutive words ending at the given positions.
class WordSink {
 public:
  WordSink(size_t begin, Emit emit) : prev_end_(begin), emit_(emit) {}
  void To(size_t end) {
    if (end > prev_end_) emit_(prev_end_, end);
    prev_end_ = end;
  }

 private:
  size_t prev_end_;
  Emit emit_;
};

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
void SplitGpt2(const Fragment& f, Emit emit) {
  WordSink sink(f.begin, emit);
  size_t pos = f.begin;
  while (pos < f.end) {
    const uint32_t cp = f.Cp(pos);
    if (cp == '\'' && pos + 1 < f.end) {  // case-sensitive contractions
      const uint32_t n1 = f.Cp(pos + 1);
      if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') {
        sink.To(pos += 2);
        continue;
      }
      if (pos + 2 < f.end) {
        const uint32_t n2 = f.Cp(pos + 2);
        if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l')) {
          sink.To(pos += 3);
          continue;
        }
      }
    }
    const uint8_t f2 = cp == ' ' ? f.Flags(pos + 1) : f.Flags(pos);
    if (f2 & (kLetter | kNumber)) {  // ' ?\p{L}+' or ' ?\p{N}+'
      const uint8_t cls = f2 & kLetter ? kLetter : kNumber;
      pos += cp == ' ';
      while (f.Flags(pos) & cls) ++pos;
      sink.To(pos);
      continue;
    }
    if (IsOther(f2)) {  // ' ?[^\s\p{L}\p{N}]+'
      pos += cp == ' ';
      while (IsOther(f.Flags(pos))) ++pos;
      sink.To(pos);
      continue;
    }
    size_t n_ws = 0;
    while (f.Flags(pos + n_ws) & kWhitespace) ++n_ws;
    if (n_ws > 1 && pos + n_ws < f.end) {  // '\s+(?!\S)': leave the last one for the next word
      sink.To(pos += n_ws - 1);
      continue;
    }
    if (n_ws > 0) {  // '\s+'
      sink.To(pos += n_ws);
      continue;
    }
    sink.To(++pos);  // unreachable for in-range units; kept as a safe fallback
  }
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}|
//  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
void SplitLlama3(const Fragment& f, size_t max_digits, Emit emit) {
  WordSink sink(f.begin, emit);
  size_t pos = f.begin;
  while (pos < f.end) {
    const uint32_t cp = f.Cp(pos);
    const uint8_t flags = f.Flags(pos);
    if (cp == '\'' && pos + 1 < f.end) {
      const uint32_t n1 = AsciiLower(f.Cp(pos + 1));
      if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') {
        sink.To(pos += 2);
        continue;
      }
      if (pos + 2 < f.end) {
        const uint32_t n2 = AsciiLower(f.Cp(pos + 2));
        if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l')) {
          sink.To(pos += 3);
          continue;
        }
      }
    }
    if (!(cp == '\r' || cp == '\n' || (flags & kNumber))) {  // [^\r\n\p{L}\p{N}]?\p{L}+
      if ((flags & kLetter) || (f.Flags(pos + 1) & kLetter)) {
        ++pos;
        while (f.Flags(pos) & kLetter) ++pos;
        sink.To(pos);
        continue;
      }
    }
    if (flags & kNumber) {  // \p{N}{1,max_digits}
      size_t run_begin = pos;
      while (f.Flags(pos) & kNumber) {
        if (++pos - run_begin >= max_digits) {
          sink.To(pos);
          run_begin = pos;
        }
      }
      sink.To(pos);
      continue;
    }
    uint8_t f2 = cp == ' ' ? f.Flags(pos + 1) : flags;
    if (IsOther(f2)) {  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
      pos += cp == ' ';
      while (IsOther(f2)) f2 = f.Flags(++pos);
      for (uint32_t c = f.Cp(pos); c == '\r' || c == '\n'; c = f.Cp(++pos)) {
      }
      sink.To(pos);
      continue;
    }
    size_t n_ws = 0;
    size_t last_newline_end = 0;
    while (f.Flags(pos + n_ws) & kWhitespace) {
      const uint32_t c = f.Cp(pos + n_ws);
      if (c == '\r' || c == '\n') last_newline_end = pos + n_ws + 1;
      ++n_ws;
    }
    if (last_newline_end > 0) {  // '\s*[\r\n]+'
      sink.To(pos = last_newline_end);
      continue;
    }
    if (n_ws > 1 && pos + n_ws < f.end) {  // '\s+(?!\S)'
      sink.To(pos += n_ws - 1);
      continue;
    }
    if (n_ws > 0) {  // '\s+'
      sink.To(pos += n_ws);
      continue;
    }
    sink.To(++pos);
  }
}

// Isolates every unit accepted by `pred` as its own fragment (one_each) or maximal runs of them.
template <typename Pred>
void SplitIsolate(const Fragment& f, Pred pred, bool one_each, Emit emit) {
  size_t gap = f.begin;
  size_t pos = f.begin;
  while (pos < f.end) {
    if (!pred(f.u[pos])) {
      ++pos;
      continue;
    }
    if (pos > gap) emit(gap, pos);
    size_t run_end = pos + 1;
    if (!one_each) {
      while (run_end < f.end && pred(f.u[run_end])) ++run_end;
    }
    emit(pos, run_end);
    gap = pos = run_end;
  }
  if (f.end > gap) emit(gap, f.end);
}

bool IsAsciiDigit(uint32_t c) { return c >= '0' && c <= '9'; }

// [0-9][0-9][0-9]: leftmost non-overlapping triples of ASCII digits.
void SplitDigitTriples(const Fragment& f, Emit emit) {
  size_t gap = f.begin;
  size_t pos = f.begin;
  while (pos + 3 <= f.end) {
    if (IsAsciiDigit(f.u[pos].cp) && IsAsciiDigit(f.u[pos + 1].cp) &&
        IsAsciiDigit(f.u[pos + 2].cp)) {
      if (pos > gap) emit(gap, pos);
      emit(pos, pos + 3);
      gap = pos = pos + 3;
    } else {
      ++pos;
    }
  }
  if (f.end > gap) emit(gap, f.end);
}

enum class Pass { kGpt2, kLlama3, kQwen2, kEachNumber, kNumberRuns, kPunctRuns, kDigitTriples };

struct PassList {
  std::array<Pass, 4> passes;
  size_t count;
};

PassList PassesFor(PreTokenizer pre) {
  switch (pre) {
    case PreTokenizer::kDefault:
      return {{Pass::kPunctRuns, Pass::kGpt2, Pass::kNumberRuns, Pass::kDigitTriples}, 4};
    case PreTokenizer::kGpt2:
      return {{Pass::kGpt2}, 1};
    case PreTokenizer::kSmollm:
      return {{Pass::kEachNumber, Pass::kGpt2}, 2};
    case PreTokenizer::kLlama3:
      return {{Pass::kLlama3}, 1};
    case PreTokenizer::kQwen2:
      return {{Pass::kQwen2}, 1};
  }
  return {{Pass::kGpt2}, 1};
}

void RunPasses(const PassList& list, size_t index, const Unit* u, size_t begin, size_t end,
               Emit emit_bytes) {
  if (index == list.count) {
    emit_bytes(u[begin].offset, u[end].offset);
    return;
  }
  const Fragment f{u, begin, end};
  auto next = [&](size_t b, size_t e) { RunPasses(list, index + 1, u, b, e, emit_bytes); };
  switch (list.passes[index]) {
    case Pass::kGpt2:
      SplitGpt2(f, next);
      break;
    case Pass::kLlama3:
      SplitLlama3(f, 3, next);
      break;
    case Pass::kQwen2:
      SplitLlama3(f, 1, next);
      break;
    case Pass::kEachNumber:
      SplitIsolate(
          f, [](const Unit& x) { return (x.flags & kNumber) != 0; }, true, next);
      break;
    case Pass::kNumberRuns:
      SplitIsolate(
          f, [](const Unit& x) { return (x.flags & kNumber) != 0; }, false, next);
      break;
    case Pass::kPunctRuns:
      SplitIsolate(
          f,
          [](const Unit& x) {
            return (x.flags & kPunctuation) || x.cp == '$' || x.cp == '+' || x.cp == '<' ||
                   x.cp == '=' || x.cp == '>' || x.cp == '^' || x.cp == '~' || x.cp == '|';
          },
          false, next);
      break;
    case Pass::kDigitTriples:
      SplitDigitTriples(f, next);
      break;
  }
}

}  // namespace

void DecodeUnits(std::string_view text, std::vector<Unit>* units) {
  units->clear();
  size_t pos = 0;
  while (pos < text.size()) {
    const auto offset = static_cast<uint32_t>(pos);
    const uint32_t cp = unicode::DecodeUtf8Lenient(text, &pos);
    const uint8_t flags = cp >= unicode::kInvalidBase ? 0 : unicode::FlagsOf(cp);
    units->push_back(Unit{offset, cp, flags});
  }
  units->push_back(Unit{static_cast<uint32_t>(text.size()), 0, 0});
}

void Split(PreTokenizer pre, const std::vector<Unit>& units, Emit emit) {
  if (units.size() <= 1) return;
  const PassList list = PassesFor(pre);
  RunPasses(list, 0, units.data(), 0, units.size() - 1, emit);
}

std::vector<std::string> SplitToStrings(PreTokenizer pre, std::string_view text) {
  std::vector<Unit> units;
  DecodeUnits(text, &units);
  std::vector<std::string> words;
  Split(pre, units, [&](size_t b, size_t e) { words.emplace_back(text.substr(b, e - b)); });
  return words;
}

}  // namespace kiln::pretok
