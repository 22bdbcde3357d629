#include "lib/tokenizer/unicode.h"

#include <algorithm>
#include <array>
#include <cstring>

namespace kiln::unicode {
namespace {

#include "lib/tokenizer/unicode_tables.inc"

// Flags of the first 256 code points, for the hot ASCII / Latin-1 path.
constexpr std::array<uint8_t, 256> MakeLatin1Table() {
  std::array<uint8_t, 256> t{};
  for (int r = 0; r < kUnicodeRangeCount && kUnicodeRanges[r].first < 256; ++r) {
    for (uint32_t c = kUnicodeRanges[r].first; c <= kUnicodeRanges[r].last && c < 256; ++c) {
      t[c] = kUnicodeRanges[r].flags;
    }
  }
  return t;
}
constexpr std::array<uint8_t, 256> kLatin1Flags = MakeLatin1Table();

// bytes_to_unicode of GPT-2: printable bytes map to themselves, the other 68 bytes (in order)
// to U+0100, U+0101, ...
constexpr std::array<uint32_t, 256> MakeByteToUnicode() {
  std::array<uint32_t, 256> t{};
  uint32_t next = 0x100;
  for (int b = 0; b < 256; ++b) {
    const bool printable =
        (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    t[b] = printable ? static_cast<uint32_t>(b) : next++;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kByteToUnicode = MakeByteToUnicode();

// Inverse of the shifted part: kShiftedBytes[cp - 0x100] is the byte mapped to cp.
constexpr int kShiftedByteCount = 68;
constexpr std::array<uint8_t, kShiftedByteCount> MakeShiftedBytes() {
  std::array<uint8_t, kShiftedByteCount> t{};
  for (int b = 0; b < 256; ++b) {
    if (kByteToUnicode[b] >= 0x100) t[kByteToUnicode[b] - 0x100] = static_cast<uint8_t>(b);
  }
  return t;
}
constexpr std::array<uint8_t, kShiftedByteCount> kShiftedBytes = MakeShiftedBytes();

}  // namespace

uint8_t FlagsOf(uint32_t cp) {
  if (cp < 256) return kLatin1Flags[cp];
  if (cp > 0x10FFFF) return 0;
  // Last range whose first <= cp.
  const CodepointRange* end = kUnicodeRanges + kUnicodeRangeCount;
  const CodepointRange* it = std::upper_bound(
      kUnicodeRanges, end, cp, [](uint32_t v, const CodepointRange& r) { return v < r.first; });
  if (it == kUnicodeRanges) return 0;
  --it;
  return cp <= it->last ? it->flags : 0;
}

namespace {

size_t EncodedLength(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

}  // namespace

bool ReplaceInvalidUtf8(std::string_view text, std::string* out) {
  // Find the first sequence whose replacement differs from it (an invalid byte, or an overlong
  // form that re-encodes shorter); the common all-valid text is only scanned.
  size_t pos = 0;
  while (pos < text.size()) {
    // ASCII eight bytes at a time: no byte has its high bit set.
    uint64_t word;
    if (text.size() - pos >= sizeof(word)) {
      std::memcpy(&word, text.data() + pos, sizeof(word));
      if ((word & 0x8080808080808080ull) == 0) {
        pos += sizeof(word);
        continue;
      }
    }
    if (static_cast<unsigned char>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const size_t start = pos;
    const uint32_t cp = DecodeUtf8Lenient(text, &pos);
    if (cp >= kInvalidBase || EncodedLength(cp) != pos - start) {
      pos = start;
      break;
    }
  }
  if (pos == text.size()) return false;
  out->assign(text.substr(0, pos));
  while (pos < text.size()) {
    const uint32_t cp = DecodeUtf8Lenient(text, &pos);
    AppendUtf8(cp >= kInvalidBase ? kReplacementCharacter : cp, out);
  }
  return true;
}

size_t ValidPrefixLength(std::string_view s, size_t pos, size_t* full_length) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const uint32_t b0 = p[pos];
  size_t need;
  uint32_t lo = 0x80, hi = 0xBF;
  if (b0 < 0x80) {
    need = 1;
  } else if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    *full_length = 0;
    return 0;
  }
  *full_length = need;
  size_t k = 1;
  for (; k < need && pos + k < s.size(); ++k) {
    const uint32_t c = p[pos + k];
    const uint32_t l = k == 1 ? lo : 0x80;
    const uint32_t h = k == 1 ? hi : 0xBF;
    if (c < l || c > h) break;
  }
  return k;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

uint32_t ByteToUnicode(uint8_t byte) { return kByteToUnicode[byte]; }

int ByteFromUnicode(uint32_t cp) {
  if (cp < 256) return kByteToUnicode[cp] == cp ? static_cast<int>(cp) : -1;
  if (cp >= 0x100 + kShiftedByteCount) return -1;
  return kShiftedBytes[cp - 0x100];
}

}  // namespace kiln::unicode
