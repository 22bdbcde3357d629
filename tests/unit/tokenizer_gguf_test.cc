// Vocab::FromGguf / Tokenizer::FromGguf on small GGUF files written with GgufWriter: defaults,
// key overrides, and errors that name the bad key / index.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "lib/gguf/gguf.h"
#include "lib/gguf/gguf_writer.h"
#include "lib/tokenizer/tokenizer.h"

namespace kiln {
namespace {

struct Parsed {
  std::vector<uint8_t> bytes;  // must outlive file
  std::unique_ptr<gguf::GgufFile> file;
};

Parsed Write(const gguf::GgufWriter& w) {
  Parsed p;
  auto buf = w.WriteToBuffer();
  EXPECT_TRUE(buf.ok()) << buf.status();
  p.bytes = std::move(*buf);
  auto f = gguf::GgufFile::Parse(p.bytes.data(), p.bytes.size());
  EXPECT_TRUE(f.ok()) << f.status();
  p.file = std::move(*f);
  return p;
}

void AddSpm(gguf::GgufWriter& w) {
  const std::vector<std::string> tokens = {"<unk>",
                                           "<s>",
                                           "</s>",
                                           "\xE2\x96\x81",
                                           "a",
                                           "\xE2\x96\x81"
                                           "a",
                                           "<0x0A>"};
  const std::vector<float> scores = {0, 0, 0, -1, -2, -0.5f, 0};
  const std::vector<int32_t> types = {2, 3, 3, 1, 1, 1, 6};
  w.SetString("tokenizer.ggml.model", "llama");
  w.SetArrayString("tokenizer.ggml.tokens", tokens);
  w.SetArrayFloat32("tokenizer.ggml.scores", scores);
  w.SetArrayInt32("tokenizer.ggml.token_type", types);
}

void AddBpe(gguf::GgufWriter& w) {
  const std::vector<std::string> tokens = {"<|end|>", "a", "b", "ab", "Ġ", "Ġab", "1", "2"};
  const std::vector<int32_t> types = {3, 1, 1, 1, 1, 1, 1, 1};
  const std::vector<std::string> merges = {"a b", "Ġ ab"};
  w.SetString("tokenizer.ggml.model", "gpt2");
  w.SetString("tokenizer.ggml.pre", "llama-bpe");
  w.SetArrayString("tokenizer.ggml.tokens", tokens);
  w.SetArrayInt32("tokenizer.ggml.token_type", types);
  w.SetArrayString("tokenizer.ggml.merges", merges);
  w.SetUint32("tokenizer.ggml.bos_token_id", 0);
  w.SetUint32("tokenizer.ggml.eos_token_id", 0);
}

TEST(TokenizerGgufTest, SpmDefaults) {
  gguf::GgufWriter w;
  AddSpm(w);
  Parsed p = Write(w);
  auto v = Vocab::FromGguf(*p.file);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->model, VocabModel::kSpm);
  EXPECT_EQ(v->bos, 1);  // llama.cpp SPM defaults
  EXPECT_EQ(v->eos, 2);
  EXPECT_EQ(v->unk, 0);
  EXPECT_TRUE(v->add_bos);
  EXPECT_TRUE(v->add_space_prefix);
  EXPECT_EQ(v->types[6], TokenType::kByte);
  auto t = Tokenizer::FromGguf(*p.file);
  ASSERT_TRUE(t.ok()) << t.status();
  auto ids = (*t)->Encode("a a\n", true, false);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{1, 5, 5, 6}));  // <s> ▁a ▁a <0x0A>
  auto text = (*t)->Decode(*ids, false);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "a a\n");
}

TEST(TokenizerGgufTest, KeysOverrideDefaults) {
  gguf::GgufWriter w;
  AddSpm(w);
  w.SetBool("tokenizer.ggml.add_bos_token", false);
  w.SetBool("tokenizer.ggml.add_eos_token", true);
  w.SetBool("tokenizer.ggml.add_space_prefix", false);
  w.SetUint32("tokenizer.ggml.eot_token_id", 2);
  w.SetInt32("tokenizer.ggml.padding_token_id", 0);
  Parsed p = Write(w);
  auto t = Tokenizer::FromGguf(*p.file);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->eot(), 2);
  EXPECT_EQ((*t)->vocab().pad, 0);
  auto ids = (*t)->Encode("a", true, false);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{4, 2}));  // no prefix, no bos, eos appended
}

TEST(TokenizerGgufTest, BpeWithLlama3PreTokenizer) {
  gguf::GgufWriter w;
  AddBpe(w);
  Parsed p = Write(w);
  auto t = Tokenizer::FromGguf(*p.file);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->vocab().pre, PreTokenizer::kLlama3);
  EXPECT_TRUE((*t)->vocab().add_bos);  // llama3 pre-tokenizer default
  auto ids = (*t)->Encode("ab ab12", true, false);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int32_t>{0, 3, 5, 6, 7}));
}

TEST(TokenizerGgufTest, ErrorsNameTheKey) {
  {
    gguf::GgufWriter w;
    Parsed p = Write(w);
    auto r = Tokenizer::FromGguf(*p.file);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("tokenizer.ggml.model"), std::string::npos) << r.status();
  }
  {
    gguf::GgufWriter w;
    w.SetString("tokenizer.ggml.model", "bert");
    Parsed p = Write(w);
    auto r = Tokenizer::FromGguf(*p.file);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("bert"), std::string::npos) << r.status();
  }
  {
    gguf::GgufWriter w;
    AddBpe(w);
    w.SetString("tokenizer.ggml.pre", "klingon");
    Parsed p = Write(w);
    auto r = Tokenizer::FromGguf(*p.file);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("klingon"), std::string::npos) << r.status();
  }
  {
    gguf::GgufWriter w;
    AddBpe(w);
    const std::vector<std::string> merges = {"a b", "nospace"};
    w.SetArrayString("tokenizer.ggml.merges", merges);
    Parsed p = Write(w);
    auto r = Tokenizer::FromGguf(*p.file);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("tokenizer.ggml.merges[1]"), std::string::npos)
        << r.status();
  }
  {
    gguf::GgufWriter w;
    AddSpm(w);
    const std::vector<int32_t> types = {2, 3, 3, 1, 1, 17, 6};
    w.SetArrayInt32("tokenizer.ggml.token_type", types);
    Parsed p = Write(w);
    auto r = Tokenizer::FromGguf(*p.file);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("token_type[5]"), std::string::npos) << r.status();
  }
  {
    gguf::GgufWriter w;
    AddSpm(w);
    w.SetUint32("tokenizer.ggml.eos_token_id", 99);
    Parsed p = Write(w);
    auto r = Tokenizer::FromGguf(*p.file);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("eos token id 99"), std::string::npos) << r.status();
  }
  {
    gguf::GgufWriter w;
    AddSpm(w);
    w.SetString("tokenizer.ggml.tokens", "not an array");
    Parsed p = Write(w);
    auto r = Tokenizer::FromGguf(*p.file);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("tokenizer.ggml.tokens"), std::string::npos) << r.status();
  }
  {
    gguf::GgufWriter w;
    AddSpm(w);
    const std::vector<float> scores = {0, 0};
    w.SetArrayFloat32("tokenizer.ggml.scores", scores);
    Parsed p = Write(w);
    auto r = Tokenizer::FromGguf(*p.file);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("scores"), std::string::npos) << r.status();
  }
}

}  // namespace
}  // namespace kiln
