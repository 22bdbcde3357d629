// Byte-level BPE on a hand-built vocabulary: merge order by rank, tie-breaking, merge results
// that are not tokens, bytes without tokens, ignore_merges (llama3), special-token partition,
// add_special, Decode and validation errors. Expected ids are worked out in the comments.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "lib/tokenizer/tokenizer.h"
#include "lib/tokenizer/unicode.h"

namespace kiln {
namespace {

using Ids = std::vector<int32_t>;

// Token texts are GPT-2 byte-level encoded: "Ġ" = ' ', "Ċ" = '\n', "ÿ" = byte 0xFF.
Vocab MakeVocab(PreTokenizer pre = PreTokenizer::kGpt2) {
  Vocab v;
  v.model = VocabModel::kBpe;
  v.pre = pre;
  v.tokens = {"<|endoftext|>",  // 0 control
              "a",
              "b",
              "c",
              "Ġ",
              "ab",
              "abc",  // 6: reachable only through ignore_merges
              "Ġa",
              "bc",
              "<|im_start|>",  // 9 control
              "Ċ",
              "ÿ",
              "aa",
              "aaaa",
              "<",
              "|",
              "<tool>",  // 16 user-defined
              "ĠĠ",
              "Ġab",
              "<s>",      // 19 control
              "<s><s>"};  // 20 control
  v.types.assign(v.tokens.size(), TokenType::kNormal);
  for (int id : {0, 9, 19, 20}) v.types[id] = TokenType::kControl;
  v.types[16] = TokenType::kUserDefined;
  v.merges = {{"b", "c"},    // rank 0
              {"a", "b"},    // rank 1
              {"Ġ", "a"},    // rank 2
              {"c", "c"},    // rank 3: "cc" is not a token
              {"a", "a"},    // rank 4
              {"aa", "aa"},  // rank 5
              {"Ġa", "b"}};  // rank 6
  v.eos = 0;
  v.unk = 0;
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

TEST(BpeTokenizerTest, MergesLowestRankFirst) {
  auto t = Make(MakeVocab());
  // (b,c) rank 0 beats (a,b) rank 1: a|bc, and there is no (a, bc) merge.
  EXPECT_EQ(Enc(*t, "abc"), (Ids{1, 8}));
  EXPECT_EQ(Enc(*t, "ab"), (Ids{5}));
  // " ab": (a,b) rank 1 beats (Ġ,a) rank 2, leaving Ġ|ab; (Ġa,b) never gets a chance.
  EXPECT_EQ(Enc(*t, " ab"), (Ids{4, 5}));
  EXPECT_EQ(Enc(*t, " a"), (Ids{7}));
  EXPECT_EQ(Enc(*t, "abab"), (Ids{5, 5}));
  EXPECT_EQ(Enc(*t, "\n"), (Ids{10}));
  EXPECT_EQ(Enc(*t, ""), (Ids{}));
}

TEST(BpeTokenizerTest, NonTokenMergeResultsFallBackToBytes) {
  auto t = Make(MakeVocab());
  EXPECT_EQ(Enc(*t, "cc"), (Ids{3, 3}));  // "cc" formed but is not a token
  // Ties go to the leftmost pair: cc|c, and (cc, c) does not merge.
  EXPECT_EQ(Enc(*t, "ccc"), (Ids{3, 3, 3}));
  EXPECT_EQ(Enc(*t, "d"), (Ids{}));     // no token for 'd': dropped (llama.cpp)
  EXPECT_EQ(Enc(*t, "dab"), (Ids{5}));  // and it does not disturb its neighbours
}

TEST(BpeTokenizerTest, LongWordIsNotQuadratic) {
  auto t = Make(MakeVocab());
  const std::string word(100000, 'a');  // (a,a) then (aa,aa): 25000 x "aaaa"
  const Ids ids = Enc(*t, word);
  ASSERT_EQ(ids.size(), 25000u);
  for (int32_t id : ids) ASSERT_EQ(id, 13);
  const Ids odd = Enc(*t, "aaaaaaa");  // 7 a's: aa aa aa a -> aaaa aa a
  EXPECT_EQ(odd, (Ids{13, 12, 1}));
}

// MakeVocab plus the bytes of U+FFFD (EF BF BD, byte-level "ï¿½") merged into one token, and
// d, e, f.
Vocab MakeVocabWithReplacementChar() {
  Vocab v = MakeVocab();
  for (const char* t : {"\xC3\xAF",                  // 21 "ï" = byte EF
                        "\xC2\xBF",                  // 22 "¿" = byte BF
                        "\xC2\xBD",                  // 23 "½" = byte BD
                        "\xC3\xAF\xC2\xBF",          // 24 "ï¿"
                        "\xC3\xAF\xC2\xBF\xC2\xBD",  // 25 "ï¿½" = U+FFFD
                        "d", "e", "f"}) {            // 26, 27, 28
    v.tokens.push_back(t);
    v.types.push_back(TokenType::kNormal);
  }
  v.merges.push_back({"\xC3\xAF", "\xC2\xBF"});          // rank 7
  v.merges.push_back({"\xC3\xAF\xC2\xBF", "\xC2\xBD"});  // rank 8
  return v;
}

TEST(BpeTokenizerTest, InvalidUtf8BytesBecomeReplacementCharacters) {
  auto t = Make(MakeVocabWithReplacementChar());
  constexpr int32_t kFffd = 25;
  const std::string fffd = "\xEF\xBF\xBD";
  struct Case {
    std::string text;
    Ids ids;
    std::string decoded;
  };
  const Case cases[] = {
      // Each invalid byte is one U+FFFD (a word of symbols between "abc" and "def").
      {"abc\xff\xfe"
       "def",
       {1, 8, kFffd, kFffd, 26, 27, 28},
       "abc" + fffd + fffd + "def"},
      // The vocab has a token for the raw byte 0xFF ("ÿ", 11): still U+FFFD, as in llama.cpp.
      {"a\xff", {1, kFffd}, "a" + fffd},
      {"a\x80"
       "b",
       {1, kFffd, 2},
       "a" + fffd + "b"},                                     // a lone continuation byte
      {"ab\xe2\x82", {5, kFffd, kFffd}, "ab" + fffd + fffd},  // truncated 3-byte sequence
      {"\xe2\x82"
       "ab",
       {kFffd, kFffd, 5},
       fffd + fffd + "ab"},  // the same, cut short by 'a'
      // Overlong forms decode as llama.cpp's decoder does: C1 A1 and E0 81 A1 are 'a'.
      {"b\xc1\xa1", {2, 1}, "ba"},
      {"\xe0\x81\xa1"
       "b",
       {5},
       "ab"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    const Ids ids = Enc(*t, c.text);
    EXPECT_EQ(ids, c.ids);
    auto back = t->Decode(ids, false);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, c.decoded);
  }
  // Without tokens for U+FFFD's bytes it goes the way of any character the vocab cannot spell
  // (llama.cpp drops those bytes); the raw byte's own token is not used either.
  auto plain = Make(MakeVocab());
  EXPECT_EQ(Enc(*plain, "a\xff"), (Ids{1}));
}

TEST(BpeTokenizerTest, IgnoreMergesForLlama3) {
  auto t = Make(MakeVocab(PreTokenizer::kLlama3));
  EXPECT_EQ(Enc(*t, "abc"), (Ids{6}));  // the whole word is a token
  // Not a token: plain BPE, (b,c) first: a|bc|c.
  EXPECT_EQ(Enc(*t, "abcc"), (Ids{1, 8, 3}));
}

TEST(BpeTokenizerTest, SpecialTokensPartition) {
  auto t = Make(MakeVocab());
  EXPECT_EQ(Enc(*t, "a<|im_start|>b", false, true), (Ids{1, 9, 2}));
  const Ids plain = Enc(*t, "a<|im_start|>b", false, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 9), 0);
  EXPECT_EQ(plain.front(), 1);
  EXPECT_EQ(plain.back(), 2);
  // User-defined tokens are recognized even without parse_special.
  EXPECT_EQ(Enc(*t, "a<tool>b", false, false), (Ids{1, 16, 2}));
  EXPECT_EQ(Enc(*t, "a<tool>b", false, true), (Ids{1, 16, 2}));
  // Longest text first over the whole text: <s><s> claims bytes 0..5, then <s> what is left.
  EXPECT_EQ(Enc(*t, "<s><s><s>", false, true), (Ids{20, 19}));
  EXPECT_EQ(Enc(*t, "<s>a<s><s>", false, true), (Ids{19, 1, 20}));
  EXPECT_EQ(Enc(*t, "<|im_start|><|im_start|>", false, true), (Ids{9, 9}));
}

TEST(BpeTokenizerTest, AddSpecialUsesVocabFlags) {
  Vocab v = MakeVocab();
  v.bos = 9;
  v.add_bos = true;
  v.add_eos = true;  // eos = 0
  auto t = Make(std::move(v));
  EXPECT_EQ(Enc(*t, "ab", true), (Ids{9, 5, 0}));
  EXPECT_EQ(Enc(*t, "ab", false), (Ids{5}));
  EXPECT_EQ(Enc(*t, "", true), (Ids{9, 0}));
}

TEST(BpeTokenizerTest, DecodeAndPieces) {
  auto t = Make(MakeVocab());
  auto d = t->Decode(Ids{9, 7, 8, 4, 10, 16, 0}, false);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, " abc \n<tool>");
  d = t->Decode(Ids{9, 7, 8, 0}, true);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, "<|im_start|> abc<|endoftext|>");
  std::string piece;
  ASSERT_TRUE(t->TokenPiece(17, false, &piece).ok());
  EXPECT_EQ(piece, "  ");
  EXPECT_EQ(t->TokenText(17), "ĠĠ");
  auto bad = t->Decode(Ids{1, 2, 21}, false);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("token id 21 at index 2"), std::string::npos)
      << bad.status();
  EXPECT_TRUE(t->IsEndOfGeneration(0));  // eos, and named <|endoftext|>
  EXPECT_FALSE(t->IsEndOfGeneration(9));
  EXPECT_TRUE(t->IsControl(19));
  EXPECT_FALSE(t->IsControl(16));
}

TEST(BpeTokenizerTest, ValidationErrorsNameTheField) {
  Vocab v = MakeVocab();
  v.scores = {1.0f};
  auto r = Tokenizer::Create(v);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("scores"), std::string::npos) << r.status();

  v = MakeVocab();
  v.bos = 1000;
  r = Tokenizer::Create(v);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("bos token id 1000"), std::string::npos) << r.status();

  v = MakeVocab();
  v.types[3] = static_cast<TokenType>(9);
  r = Tokenizer::Create(v);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("token_type[3]"), std::string::npos) << r.status();

  v = MakeVocab();
  v.merges[2].second.clear();
  r = Tokenizer::Create(v);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("merges[2]"), std::string::npos) << r.status();

  EXPECT_FALSE(Tokenizer::Create(Vocab{}).ok());
  auto pre = ParsePreTokenizer("no-such-pre");
  ASSERT_FALSE(pre.ok());
  EXPECT_NE(pre.status().message().find("no-such-pre"), std::string::npos);
  EXPECT_EQ(*ParsePreTokenizer("llama-bpe"), PreTokenizer::kLlama3);
  EXPECT_EQ(*ParsePreTokenizer("smollm"), PreTokenizer::kSmollm);
}

// A vocabulary with a token for every byte plus merges of common pairs: any byte string must
// encode (never crash, never read out of bounds) and decode back to itself with each invalid
// UTF-8 byte replaced by U+FFFD (exactly itself when it is valid UTF-8), for every
// pre-tokenizer, with and without special parsing.
TEST(BpeTokenizerTest, RandomBytesDecodeToTheReplacedTextForEveryPreTokenizer) {
  Vocab base;
  base.model = VocabModel::kBpe;
  auto enc = [](std::string_view bytes) {
    std::string s;
    for (unsigned char c : bytes) unicode::AppendUtf8(unicode::ByteToUnicode(c), &s);
    return s;
  };
  for (int b = 0; b < 256; ++b) base.tokens.push_back(enc(std::string(1, static_cast<char>(b))));
  const char* kPairs[][2] = {{"a", "b"}, {" ", "a"},  {"\xe4", "\xbd"},     {"\n", "\n"},
                             {"1", "2"}, {" a", "b"}, {"\xe4\xbd", "\xa0"}, {"<", "|"}};
  for (const auto& pr : kPairs) {
    base.merges.emplace_back(enc(pr[0]), enc(pr[1]));
    base.tokens.push_back(enc(std::string(pr[0]) + pr[1]));
  }
  base.tokens.push_back("<|x|>");
  base.types.assign(base.tokens.size(), TokenType::kNormal);
  base.types.back() = TokenType::kControl;
  std::mt19937 rng(1234);
  int valid_texts = 0;  // decoded back to exactly the input
  const std::string alphabet = "ab 12\n\t\r<|x>'s\xe4\xbd\xa0\xf0\x9f\x98\x80\xff\x80\xc3";
  for (PreTokenizer pre : {PreTokenizer::kDefault, PreTokenizer::kGpt2, PreTokenizer::kSmollm,
                           PreTokenizer::kLlama3, PreTokenizer::kQwen2}) {
    Vocab v = base;
    v.pre = pre;
    auto t = Make(std::move(v));
    ASSERT_NE(t, nullptr);
    for (int iter = 0; iter < 300; ++iter) {
      std::string text;
      const int len = static_cast<int>(rng() % 64);
      for (int i = 0; i < len; ++i) {
        text.push_back(rng() % 4 == 0 ? static_cast<char>(rng() % 256)
                                      : alphabet[rng() % alphabet.size()]);
      }
      for (bool parse_special : {false, true}) {
        auto ids = t->Encode(text, false, parse_special);
        ASSERT_TRUE(ids.ok());
        auto back = t->Decode(*ids, /*render_special=*/true);
        ASSERT_TRUE(back.ok());
        std::string want = text;
        unicode::ReplaceInvalidUtf8(text, &want);  // leaves `want` alone for valid UTF-8
        ASSERT_EQ(*back, want) << "pre " << static_cast<int>(pre);
        valid_texts += want == text;
      }
    }
  }
  // Both kinds were seen: 5 pre-tokenizers x 300 texts x 2 parse modes in all.
  EXPECT_GT(valid_texts, 100);
  EXPECT_LT(valid_texts, 5 * 300 * 2 - 100);
}

}  // namespace
}  // namespace kiln
