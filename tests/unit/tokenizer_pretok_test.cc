// Pre-tokenizer scanners and Unicode helpers. The expected splits of MatchesRegexReference are
// tests/data/tokenizer/pretok_splits.json, written by scripts/gen_pretok_goldens.py: Python's
// `regex` module applying each pre-tokenizer's regex list (matches and gaps become fragments),
// i.e. independently of the hand-written scanners.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "lib/tokenizer/pre_tokenizer.h"
#include "lib/tokenizer/unicode.h"
#include "tests/common/golden.h"

namespace kiln {
namespace {

// tokenizer.ggml.pre names, as keys of the golden's "words".
const std::vector<std::pair<std::string, PreTokenizer>>& PreTokenizerNames() {
  static const std::vector<std::pair<std::string, PreTokenizer>> kNames = {
      {"default", PreTokenizer::kDefault}, {"gpt2", PreTokenizer::kGpt2},
      {"smollm", PreTokenizer::kSmollm},   {"llama3", PreTokenizer::kLlama3},
      {"qwen2", PreTokenizer::kQwen2},
  };
  return kNames;
}

TEST(PreTokenizerTest, MatchesRegexReference) {
  const testing::Json golden = testing::LoadGolden("tests/data/tokenizer/pretok_splits.json",
                                                   "scripts/gen_pretok_goldens.py");
  const std::vector<testing::Json>& cases = golden["cases"].items;
  // A truncated or emptied golden must fail, not pass on fewer cases.
  ASSERT_EQ(cases.size(), 12u);
  for (const testing::Json& c : cases) {
    const std::string& text = c["text"].str;
    for (const auto& [name, pre] : PreTokenizerNames()) {
      SCOPED_TRACE(::testing::Message() << "pre=" << name << " text=" << text);
      const testing::Json& words = c["words"][name];
      ASSERT_EQ(words.kind, testing::Json::kArray);
      std::vector<std::string> expected;
      for (const testing::Json& w : words.items) expected.push_back(w.str);
      EXPECT_EQ(pretok::SplitToStrings(pre, text), expected);
    }
  }
}

TEST(PreTokenizerTest, WordsAlwaysCoverTheText) {
  const std::string text =
      "Mixed: 123 ünïcödé\r\n\t  words's 'S 😀👍🏽 \xff\xfe bad \xe2\x82 end   ";
  for (PreTokenizer pre : {PreTokenizer::kDefault, PreTokenizer::kGpt2, PreTokenizer::kSmollm,
                           PreTokenizer::kLlama3, PreTokenizer::kQwen2}) {
    std::string joined;
    for (const std::string& w : pretok::SplitToStrings(pre, text)) {
      EXPECT_FALSE(w.empty());
      joined += w;
    }
    EXPECT_EQ(joined, text);
  }
}

TEST(PreTokenizerTest, InvalidBytesAreOwnUnitsGroupedLikeSymbols) {
  // Each invalid byte is a unit of no class: it joins neighbouring symbols, never letters.
  EXPECT_EQ(pretok::SplitToStrings(PreTokenizer::kGpt2,
                                   "a\xff"
                                   "b"),
            (std::vector<std::string>{"a", "\xff", "b"}));
  EXPECT_EQ(pretok::SplitToStrings(PreTokenizer::kGpt2, "!\xff!"),
            (std::vector<std::string>{"!\xff!"}));
  EXPECT_EQ(pretok::SplitToStrings(PreTokenizer::kGpt2, "x \x80\x80y"),
            (std::vector<std::string>{"x", " \x80\x80", "y"}));
  // A truncated sequence at the very end of the input.
  EXPECT_EQ(pretok::SplitToStrings(PreTokenizer::kSmollm, "9\xf0\x9f"),
            (std::vector<std::string>{"9", "\xf0\x9f"}));
  EXPECT_TRUE(pretok::SplitToStrings(PreTokenizer::kLlama3, "").empty());
}

TEST(UnicodeTest, StrictUtf8Decoding) {
  auto decode_all = [](std::string_view s) {
    std::vector<uint32_t> cps;
    size_t pos = 0;
    while (pos < s.size()) cps.push_back(unicode::DecodeUtf8(s, &pos));
    return cps;
  };
  const uint32_t kInv = unicode::kInvalidBase;
  EXPECT_EQ(decode_all("a\xc3\xa9\xe6\x9d\xb1\xf0\x9f\x98\x80"),
            (std::vector<uint32_t>{'a', 0xE9, 0x6771, 0x1F600}));
  EXPECT_EQ(decode_all("\xc0\xaf"), (std::vector<uint32_t>{kInv + 0xC0, kInv + 0xAF}));  // overlong
  EXPECT_EQ(decode_all("\xed\xa0\x80"),  // surrogate
            (std::vector<uint32_t>{kInv + 0xED, kInv + 0xA0, kInv + 0x80}));
  EXPECT_EQ(decode_all("\xf4\x90\x80\x80"),  // > U+10FFFF
            (std::vector<uint32_t>{kInv + 0xF4, kInv + 0x90, kInv + 0x80, kInv + 0x80}));
  EXPECT_EQ(decode_all("\xe2\x82"), (std::vector<uint32_t>{kInv + 0xE2, kInv + 0x82}));
}

TEST(UnicodeTest, LenientUtf8DecodingIsLlamaCpps) {
  auto decode_all = [](std::string_view s) {
    std::vector<uint32_t> cps;
    size_t pos = 0;
    while (pos < s.size()) cps.push_back(unicode::DecodeUtf8Lenient(s, &pos));
    return cps;
  };
  const uint32_t kInv = unicode::kInvalidBase;
  EXPECT_EQ(decode_all("a\xc3\xa9\xe6\x9d\xb1\xf0\x9f\x98\x80"),
            (std::vector<uint32_t>{'a', 0xE9, 0x6771, 0x1F600}));
  // The lead byte's bits decide: overlong forms and surrogates decode.
  EXPECT_EQ(decode_all("\xc0\xaf"), (std::vector<uint32_t>{'/'}));
  EXPECT_EQ(decode_all("\xe0\x80\xaf"), (std::vector<uint32_t>{'/'}));
  EXPECT_EQ(decode_all("\xf0\x80\x80\x80"), (std::vector<uint32_t>{0}));
  EXPECT_EQ(decode_all("\xed\xa0\x80"), (std::vector<uint32_t>{0xD800}));
  EXPECT_EQ(decode_all("\xf4\x8f\xbf\xbf"), (std::vector<uint32_t>{0x10FFFF}));
  // Rejected, one byte at a time: stray continuation bytes, 0xF8..0xFF, a lead byte whose
  // continuation bytes are missing (truncated, or cut short by another byte), values above
  // U+10FFFF.
  EXPECT_EQ(decode_all("\x80\xbf"), (std::vector<uint32_t>{kInv + 0x80, kInv + 0xBF}));
  EXPECT_EQ(decode_all("\xff\xfe\xf8"),
            (std::vector<uint32_t>{kInv + 0xFF, kInv + 0xFE, kInv + 0xF8}));
  EXPECT_EQ(decode_all("\xe2\x82"), (std::vector<uint32_t>{kInv + 0xE2, kInv + 0x82}));
  EXPECT_EQ(decode_all("\xe2\x82z"), (std::vector<uint32_t>{kInv + 0xE2, kInv + 0x82, 'z'}));
  EXPECT_EQ(decode_all("\xc3"), (std::vector<uint32_t>{kInv + 0xC3}));
  EXPECT_EQ(decode_all("\xf4\x90\x80\x80"),
            (std::vector<uint32_t>{kInv + 0xF4, kInv + 0x90, kInv + 0x80, kInv + 0x80}));
  EXPECT_EQ(decode_all("\xf7\xbf\xbf\xbf")[0], kInv + 0xF7);
}

TEST(UnicodeTest, ReplaceInvalidUtf8LikeLlamaCpp) {
  const std::string kFffd = "\xEF\xBF\xBD";
  auto replaced = [](std::string_view s) {
    std::string out = "sentinel";
    return unicode::ReplaceInvalidUtf8(s, &out) ? out : std::string(s);
  };
  // Valid UTF-8 (and the empty text) is left alone and *out untouched.
  for (std::string_view valid : {std::string_view(""), std::string_view("plain ascii"),
                                 std::string_view("caf\xc3\xa9 \xe6\x9d\xb1 \xf0\x9f\x98\x80")}) {
    std::string out = "sentinel";
    EXPECT_FALSE(unicode::ReplaceInvalidUtf8(valid, &out)) << valid;
    EXPECT_EQ(out, "sentinel");
  }
  // One U+FFFD per rejected byte; nothing dropped, the neighbours unchanged.
  EXPECT_EQ(replaced("abc\xff\xfe"
                     "def"),
            "abc" + kFffd + kFffd + "def");
  EXPECT_EQ(replaced("x\x80y"), "x" + kFffd + "y");               // lone continuation
  EXPECT_EQ(replaced("euro \xe2\x82"), "euro " + kFffd + kFffd);  // truncated, at the end
  EXPECT_EQ(replaced("\xe2\x82 end"), kFffd + kFffd + " end");    // truncated, mid text
  EXPECT_EQ(replaced("\xf0\x9f\x98"), kFffd + kFffd + kFffd);     // truncated emoji
  EXPECT_EQ(replaced("\xf4\x90\x80\x80!"), kFffd + kFffd + kFffd + kFffd + "!");  // > U+10FFFF
  // Overlong forms become their shortest form; a surrogate keeps its bytes.
  EXPECT_EQ(replaced("\xc0\xaf slash"), "/ slash");
  EXPECT_EQ(replaced("a\xe0\x80\xaf"
                     "b\xc1\xbf"),
            "a/b\x7f");
  EXPECT_EQ(replaced("\xed\xa0\x80\xff"), "\xed\xa0\x80" + kFffd);
  std::string out;
  EXPECT_FALSE(unicode::ReplaceInvalidUtf8("\xed\xa0\x80", &out));  // nothing to replace
}

TEST(PreTokenizerTest, SurrogateIsOneUnitOfNoClass) {
  EXPECT_EQ(unicode::FlagsOf(0xD800), 0);
  EXPECT_EQ(unicode::FlagsOf(0xDFFF), 0);
  // One "other" unit joins the letters after it ([^\r\n\p{L}\p{N}]?\p{L}+), all three bytes.
  EXPECT_EQ(pretok::SplitToStrings(PreTokenizer::kLlama3,
                                   "\xed\xa0\x80"
                                   "abc"),
            (std::vector<std::string>{"\xed\xa0\x80"
                                      "abc"}));
  EXPECT_EQ(pretok::SplitToStrings(PreTokenizer::kLlama3,
                                   "\xef\xbf\xbd"
                                   "abc"),
            (std::vector<std::string>{"\xef\xbf\xbd"
                                      "abc"}));
}

TEST(UnicodeTest, CategoryTables) {
  using unicode::FlagsOf;
  EXPECT_EQ(FlagsOf('a'), unicode::kLetter);
  EXPECT_EQ(FlagsOf('7'), unicode::kNumber);
  EXPECT_EQ(FlagsOf(' '), unicode::kWhitespace);
  EXPECT_EQ(FlagsOf('!'), unicode::kPunctuation);
  EXPECT_EQ(FlagsOf('$'), 0);                    // symbol (Sc)
  EXPECT_EQ(FlagsOf(0x6771), unicode::kLetter);  // 東 (Lo)
  EXPECT_EQ(FlagsOf(0x0663), unicode::kNumber);  // ٣ (Nd)
  EXPECT_EQ(FlagsOf(0x00B2), unicode::kNumber);  // ² (No)
  EXPECT_EQ(FlagsOf(0x3000), unicode::kWhitespace);
  EXPECT_EQ(FlagsOf(0x00A0), unicode::kWhitespace);
  EXPECT_EQ(FlagsOf(0x001C), 0);   // not White_Space although Python's isspace() says so
  EXPECT_EQ(FlagsOf(0x0301), 0);   // combining acute (Mn)
  EXPECT_EQ(FlagsOf(0x1F600), 0);  // emoji (So)
  EXPECT_EQ(FlagsOf(0x10FFFF), 0);
  EXPECT_EQ(FlagsOf(0x7FFFFFFF), 0);
  EXPECT_EQ(FlagsOf(0x3002), unicode::kPunctuation);  // 。
}

TEST(UnicodeTest, ByteLevelMappingIsABijection) {
  std::vector<bool> seen(0x200, false);
  for (int b = 0; b < 256; ++b) {
    const uint32_t cp = unicode::ByteToUnicode(static_cast<uint8_t>(b));
    ASSERT_LT(cp, 0x200u);
    EXPECT_FALSE(seen[cp]);
    seen[cp] = true;
    EXPECT_EQ(unicode::ByteFromUnicode(cp), b);
  }
  EXPECT_EQ(unicode::ByteToUnicode(' '), 0x120u);   // Ġ
  EXPECT_EQ(unicode::ByteToUnicode('\n'), 0x10Au);  // Ċ
  EXPECT_EQ(unicode::ByteToUnicode('a'), static_cast<uint32_t>('a'));
  EXPECT_EQ(unicode::ByteFromUnicode(0x144), -1);
  EXPECT_EQ(unicode::ByteFromUnicode(0xAD), -1);  // soft hyphen is shifted to U+0143
}

}  // namespace
}  // namespace kiln
