// SentencePiece-style ("llama") tokenization on a hand-built vocabulary: score-ordered merges,
// space prefix and "▁", byte fallback, unknown token, special tokens, decode's leading-space
// rule. Expected ids are worked out in the comments.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "lib/tokenizer/streaming_detokenizer.h"
#include "lib/tokenizer/tokenizer.h"

namespace kiln {
namespace {

using Ids = std::vector<int32_t>;

Vocab MakeSpmVocab() {
  Vocab v;
  v.model = VocabModel::kSpm;
  struct T {
    const char* text;
    float score;
    TokenType type;
  };
  const T kTokens[] = {
      {"<unk>", 0, TokenType::kUnknown},           // 0
      {"<s>", 0, TokenType::kControl},             // 1
      {"</s>", 0, TokenType::kControl},            // 2
      {"<0xE4>", 0, TokenType::kByte},             // 3
      {"<0xBD>", 0, TokenType::kByte},             // 4
      {"<0xA0>", 0, TokenType::kByte},             // 5
      {"\xE2\x96\x81", -1, TokenType::kNormal},    // 6 "▁"
      {"h", -10, TokenType::kNormal},              // 7
      {"e", -10, TokenType::kNormal},              // 8
      {"l", -10, TokenType::kNormal},              // 9
      {"o", -10, TokenType::kNormal},              // 10
      {"he", -1, TokenType::kNormal},              // 11
      {"ll", -2, TokenType::kNormal},              // 12
      {"hell", -3, TokenType::kNormal},            // 13
      {"\xE2\x96\x81he", -4, TokenType::kNormal},  // 14 "▁he"
      {"hello", -5, TokenType::kNormal},           // 15
      {"<0xF0>", 0, TokenType::kByte},             // 16
      {"<0x9F>", 0, TokenType::kByte},             // 17
      {"<0x98>", 0, TokenType::kByte},             // 18
      {"<0x80>", 0, TokenType::kByte},             // 19
      {"<0x0A>", 0, TokenType::kByte},             // 20
  };
  for (const T& t : kTokens) {
    v.tokens.push_back(t.text);
    v.scores.push_back(t.score);
    v.types.push_back(t.type);
  }
  v.bos = 1;
  v.eos = 2;
  v.unk = 0;
  v.add_bos = true;
  v.add_space_prefix = true;
  return v;
}

std::unique_ptr<Tokenizer> Make(Vocab v) {
  auto t = Tokenizer::Create(std::move(v));
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

Ids Enc(const Tokenizer& t, std::string_view text, bool add_special = false,
        bool parse_special = false) {
  auto r = t.Encode(text, add_special, parse_special);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : Ids{};
}

TEST(SpmTokenizerTest, MergesHighestScoreFirst) {
  auto t = Make(MakeSpmVocab());
  // "▁hello": he(-1) > ll(-2) > hell(-3) > ▁he(-4, stale by then) > hello(-5) -> ▁|hello.
  // (Lowest-score-first would give ▁he|l|l|o.)
  EXPECT_EQ(Enc(*t, "hello"), (Ids{6, 15}));
  EXPECT_EQ(Enc(*t, "hello", /*add_special=*/true), (Ids{1, 6, 15}));
  // Spaces become ▁; only the text start gets the prefix.
  EXPECT_EQ(Enc(*t, "he he"), (Ids{14, 14}));
  EXPECT_EQ(Enc(*t, ""), (Ids{}));
  EXPECT_EQ(Enc(*t, "", true), (Ids{1}));
}

TEST(SpmTokenizerTest, ByteFallbackAndUnknown) {
  auto t = Make(MakeSpmVocab());
  EXPECT_EQ(Enc(*t, "\xE4\xBD\xA0"), (Ids{6, 3, 4, 5}));  // 你 -> <0xE4><0xBD><0xA0>
  EXPECT_EQ(Enc(*t, "\xE5\xA5\xBD"), (Ids{6, 0}));        // 好: no byte tokens -> <unk>
  EXPECT_EQ(Enc(*t, "\n"), (Ids{6, 20}));
  // Invalid UTF-8: each invalid byte is its own character.
  EXPECT_EQ(Enc(*t, "\xBD\xE4"), (Ids{6, 4, 3}));
  Vocab no_unk = MakeSpmVocab();
  no_unk.unk = -1;
  auto t2 = Make(std::move(no_unk));
  auto r = t2->Encode("x", false, false);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("0x78"), std::string::npos) << r.status();
}

// Letters a..f (ids 1..6 after <unk> and "▁") and, when asked, U+FFFD (7) and the 256 byte
// tokens <0x00>..<0xFF> (ids byte_base + byte).
Vocab MakeLetterVocab(bool with_replacement_char, bool with_byte_tokens) {
  Vocab v;
  v.model = VocabModel::kSpm;
  v.tokens = {"<unk>", "\xE2\x96\x81", "a", "b", "c", "d", "e", "f"};
  v.types = {TokenType::kUnknown};
  v.types.resize(v.tokens.size(), TokenType::kNormal);
  if (with_replacement_char) {
    v.tokens.push_back("\xEF\xBF\xBD");
    v.types.push_back(TokenType::kNormal);
  }
  if (with_byte_tokens) {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      v.tokens.push_back(name);
      v.types.push_back(TokenType::kByte);
    }
  }
  v.scores.assign(v.tokens.size(), 0.0f);
  v.unk = 0;
  v.add_space_prefix = true;
  return v;
}

TEST(SpmTokenizerTest, InvalidUtf8KeepsByteTokensElseBecomesReplacementCharacter) {
  struct Case {
    std::string text;
    Ids with_bytes;     // byte fallback: each invalid byte is its byte token
    Ids with_fffd;      // no byte tokens, a U+FFFD token (7): one per invalid byte
    Ids with_unk_only;  // neither: U+FFFD is a character the vocab lacks, so <unk>
  };
  constexpr int32_t kB = 8;  // byte_base with_bytes (no U+FFFD token)
  const Case cases[] = {
      {"abc\xff\xfe"
       "def",
       {1, 2, 3, 4, kB + 0xFF, kB + 0xFE, 5, 6, 7},
       {1, 2, 3, 4, 8, 8, 5, 6, 7},
       {1, 2, 3, 4, 0, 0, 5, 6, 7}},
      // A lone continuation byte.
      {"a\x80"
       "b",
       {1, 2, kB + 0x80, 3},
       {1, 2, 8, 3},
       {1, 2, 0, 3}},
      // A truncated 3-byte sequence at the end: two invalid bytes.
      {"ab\xe2\x82", {1, 2, 3, kB + 0xE2, kB + 0x82}, {1, 2, 3, 8, 8}, {1, 2, 3, 0, 0}},
      // A truncated sequence cut short by a space: the space is still "▁".
      {"a\xe2 b", {1, 2, kB + 0xE2, 1, 3}, {1, 2, 8, 1, 3}, {1, 2, 0, 1, 3}},
      // An overlong '/' is one character to llama.cpp's decoder: two byte tokens, or <unk>.
      {"a\xc0\xaf", {1, 2, kB + 0xC0, kB + 0xAF}, {1, 2, 0}, {1, 2, 0}},
  };
  auto with_bytes = Make(MakeLetterVocab(false, true));
  auto with_fffd = Make(MakeLetterVocab(true, false));
  auto with_unk_only = Make(MakeLetterVocab(false, false));
  const std::string fffd = "\xEF\xBF\xBD";
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    EXPECT_EQ(Enc(*with_bytes, c.text), c.with_bytes);
    EXPECT_EQ(Enc(*with_fffd, c.text), c.with_fffd);
    EXPECT_EQ(Enc(*with_unk_only, c.text), c.with_unk_only);
    // Byte fallback gives the text back exactly.
    auto exact = with_bytes->Decode(c.with_bytes, false);
    ASSERT_TRUE(exact.ok());
    EXPECT_EQ(*exact, c.text);
  }
  auto replaced = with_fffd->Decode(cases[0].with_fffd, false);
  ASSERT_TRUE(replaced.ok());
  EXPECT_EQ(*replaced, "abc" + fffd + fffd + "def");
  // Neither a U+FFFD token nor <unk>: an error that names the replacement.
  Vocab bare = MakeLetterVocab(false, false);
  bare.unk = -1;
  bare.types[0] = TokenType::kNormal;
  auto none = Make(std::move(bare));
  auto r = none->Encode("ab\xff", false, false);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("U+FFFD"), std::string::npos) << r.status();
}

TEST(SpmTokenizerTest, SpacePrefixAfterSpecialTokens) {
  auto t = Make(MakeSpmVocab());
  EXPECT_EQ(Enc(*t, "<s>hello", false, true), (Ids{1, 6, 15}));
  // Without parse_special "<s>" is text: '<', 's', '>' are unknown characters.
  EXPECT_EQ(Enc(*t, "<s>hello", false, false), (Ids{6, 0, 0, 0, 15}));
  Vocab no_prefix = MakeSpmVocab();
  no_prefix.add_space_prefix = false;
  auto t2 = Make(std::move(no_prefix));
  EXPECT_EQ(Enc(*t2, "hello"), (Ids{15}));
  auto d = t2->Decode(Ids{6, 15}, false);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, " hello");  // nothing stripped without add_space_prefix
}

TEST(SpmTokenizerTest, DecodeStripsOneLeadingSpace) {
  auto t = Make(MakeSpmVocab());
  for (const char* text : {"hello", "he he", "  he", "\xE4\xBD\xA0"}) {
    auto d = t->Decode(Enc(*t, text, true), false);
    ASSERT_TRUE(d.ok());
    EXPECT_EQ(*d, text);
  }
  auto d = t->Decode(Ids{1, 6, 15, 2}, true);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, "<s> hello</s>");  // first text piece is the rendered <s>: nothing stripped
}

TEST(SpmTokenizerTest, StreamingSplitsCharactersAcrossByteTokens) {
  auto t = Make(MakeSpmVocab());
  StreamingDetokenizer s(*t);
  // 😀 = F0 9F 98 80 as four byte tokens: nothing until the last one.
  const std::pair<int32_t, std::string> steps[] = {
      {6, ""}, {15, "hello"}, {16, ""},           {17, ""}, {18, ""}, {19, "\xF0\x9F\x98\x80"},
      {3, ""}, {4, ""},       {5, "\xE4\xBD\xA0"}};
  for (const auto& [id, want] : steps) {
    auto out = s.Push(id);
    ASSERT_TRUE(out.ok());
    EXPECT_EQ(*out, want) << "id " << id;
  }
  EXPECT_EQ(s.Flush(), "");
  EXPECT_FALSE(s.Push(99).ok());
}

TEST(SpmTokenizerTest, StreamingReplacesImpossibleSequences) {
  auto t = Make(MakeSpmVocab());
  StreamingDetokenizer s(*t);
  const std::string kFffd = "\xEF\xBF\xBD";
  // A stray continuation byte can never become valid: U+FFFD at once.
  EXPECT_EQ(*s.Push(19), kFffd);
  // E4 then 'h' (via "hello"): the E4 is a maximal invalid subpart -> one U+FFFD.
  EXPECT_EQ(*s.Push(3), "");
  EXPECT_EQ(s.pending_bytes(), 1u);
  EXPECT_EQ(*s.Push(15), kFffd + "hello");
  // F0 9F 98 then E4 BD A0: the truncated emoji becomes one U+FFFD, then 你.
  EXPECT_EQ(*s.Push(16), "");
  EXPECT_EQ(*s.Push(17), "");
  EXPECT_EQ(*s.Push(18), "");
  EXPECT_EQ(*s.Push(3), kFffd);
  EXPECT_EQ(*s.Push(4), "");
  // Flush with E4 BD pending: one U+FFFD, and the stream starts over.
  EXPECT_EQ(s.Flush(), kFffd);
  EXPECT_EQ(s.pending_bytes(), 0u);
  EXPECT_EQ(*s.Push(6), "");  // after Flush the first piece (" ") loses its leading space again
  EXPECT_EQ(*s.Push(15), "hello");
  EXPECT_EQ(*s.Push(6), " ");  // later pieces keep theirs
}

}  // namespace
}  // namespace kiln
