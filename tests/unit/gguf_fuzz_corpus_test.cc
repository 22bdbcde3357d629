// Replays the fuzz seed corpus and every saved regression input through the reader and the
// getters (the same walk the fuzzer does). Seeds are gguf-py-written files
// (tests/fuzz/make_corpus.py), so they must parse: a cross-check against an independent writer.
// Regressions are former crashers: they must return (ok or error), never crash.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "lib/gguf/gguf.h"
#include "tests/common/test_util.h"

namespace kiln::gguf {
namespace {

std::vector<uint8_t> ReadAll(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// Touches every value and tensor byte range; returns how many items were visited.
size_t Walk(const GgufFile& f) {
  size_t n = 0;
  for (const KeyValue& kv : f.metadata()) {
    EXPECT_EQ(f.FindKey(kv.key), &kv);
    EXPECT_FALSE(f.ValueToString(kv).empty());
    (void)f.GetUint(kv.key);
    (void)f.GetInt(kv.key);
    (void)f.GetFloat(kv.key);
    (void)f.GetBool(kv.key);
    (void)f.GetString(kv.key);
    (void)f.GetStringArray(kv.key);
    (void)f.GetFloatArray(kv.key);
    (void)f.GetIntArray(kv.key);
    ++n;
  }
  for (const TensorInfo& t : f.tensors()) {
    EXPECT_EQ(f.FindTensor(t.name), &t);
    EXPECT_GE(t.data, f.bytes() + f.data_offset());
    EXPECT_LE(t.data + t.nbytes, f.bytes() + f.file_size());
    ++n;
  }
  return n;
}

std::vector<std::filesystem::path> FilesIn(const std::string& dir) {
  std::vector<std::filesystem::path> out;
  if (!std::filesystem::exists(dir)) return out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().filename() != ".gitkeep") out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(GgufFuzzCorpusTest, SeedsWrittenByGgufPyParse) {
  const auto files = FilesIn(kiln::testing::SourcePath("tests/fuzz/corpus"));
  ASSERT_GE(files.size(), 5u);
  for (const auto& p : files) {
    const std::vector<uint8_t> b = ReadAll(p);
    EXPECT_LT(b.size(), 10u * 1024) << p;
    auto f = GgufFile::Parse(b.data(), b.size());
    ASSERT_TRUE(f.ok()) << p << ": " << f.status();
    EXPECT_GT(Walk(**f), 0u) << p;
  }
  // Spot checks of what make_corpus.py wrote.
  const auto tiny = ReadAll(kiln::testing::SourcePath("tests/fuzz/corpus/tiny_model.bin"));
  auto f = GgufFile::Parse(tiny.data(), tiny.size());
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(*(*f)->GetString("general.architecture"), "llama");
  EXPECT_EQ(*(*f)->GetUint("llama.attention.head_count_kv"), 1u);
  const TensorInfo* q = (*f)->FindTensor("blk.0.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->type, 2u);  // q4_0
  EXPECT_EQ(q->ne, (std::vector<uint64_t>{32, 32}));
  EXPECT_EQ((*f)->FindTensor("blk.0.attn_k.weight")->ne, (std::vector<uint64_t>{32, 16}));
  const auto all = ReadAll(kiln::testing::SourcePath("tests/fuzz/corpus/all_value_types.bin"));
  auto g = GgufFile::Parse(all.data(), all.size());
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(*(*g)->GetUint("t.u64"), (uint64_t{1} << 63) + 5);
  EXPECT_EQ(*(*g)->GetInt("t.i64"), -(int64_t{1} << 40));
  EXPECT_EQ(*(*g)->GetString("t.str"), "hello \xC4\xA0world");
  EXPECT_EQ((*g)->GetStringArray("t.arr_str")->at(2),
            "\xC4\xA0"
            "b");
  EXPECT_EQ(*(*g)->GetIntArray("t.arr_i32"), (std::vector<int64_t>{3, 1, 1, -2}));
  EXPECT_EQ(*(*g)->GetFloatArray("t.arr_f64"), (std::vector<float>{0.25f, INFINITY}));
  const auto a64 = ReadAll(kiln::testing::SourcePath("tests/fuzz/corpus/aligned64.bin"));
  auto h = GgufFile::Parse(a64.data(), a64.size());
  ASSERT_TRUE(h.ok());
  EXPECT_EQ((*h)->alignment(), 64u);
}

TEST(GgufFuzzCorpusTest, RegressionsNeverCrash) {
  for (const auto& p : FilesIn(kiln::testing::SourcePath("tests/fuzz/regressions"))) {
    const std::vector<uint8_t> b = ReadAll(p);
    auto f = GgufFile::Parse(b.data(), b.size());
    if (f.ok()) {
      Walk(**f);
    } else {
      EXPECT_FALSE(f.status().message().empty()) << p;
    }
  }
}

}  // namespace
}  // namespace kiln::gguf
