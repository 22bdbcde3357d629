// Replays the fuzz seed corpus and every saved regression input through the reader and the
// getters (the same walk the fuzzer does). Seeds come from tests/fuzz/fuzz_seeds.h (the code
// behind kiln-fuzz-seeds, linked into this test), built in memory: they must parse, and hold
// what the writer put in. Regressions (tests/fuzz/regressions/) are former crashers: they must
// return (ok or error), never crash.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string_view>

#include "lib/gguf/gguf.h"
#include "tests/common/test_util.h"
#include "tests/fuzz/fuzz_seeds.h"

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

// Parses a seed by name out of `seeds` (fails the test when missing or unparsable).
std::unique_ptr<GgufFile> ParseSeed(const std::vector<fuzz::FuzzSeed>& seeds,
                                    std::string_view name) {
  for (const fuzz::FuzzSeed& s : seeds) {
    if (s.name != name) continue;
    auto f = GgufFile::Parse(s.bytes.data(), s.bytes.size());
    EXPECT_TRUE(f.ok()) << name << ": " << f.status();
    return f.ok() ? std::move(*f) : nullptr;
  }
  ADD_FAILURE() << "no seed named " << name;
  return nullptr;
}

TEST(GgufFuzzCorpusTest, SeedsParseAndWalk) {
  auto seeds = fuzz::BuildFuzzSeeds();
  ASSERT_TRUE(seeds.ok()) << seeds.status();
  ASSERT_EQ(seeds->size(), 7u);
  for (const fuzz::FuzzSeed& s : *seeds) {
    EXPECT_LT(s.bytes.size(), 10u * 1024) << s.name;
    auto f = GgufFile::Parse(s.bytes.data(), s.bytes.size());
    ASSERT_TRUE(f.ok()) << s.name << ": " << f.status();
    EXPECT_EQ(*(*f)->GetString("general.architecture"), "llama") << s.name;
    EXPECT_GT(Walk(**f), 0u) << s.name;
  }
}

TEST(GgufFuzzCorpusTest, SeedsAreDeterministic) {
  auto a = fuzz::BuildFuzzSeeds();
  auto b = fuzz::BuildFuzzSeeds();
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->size(), b->size());
  for (size_t i = 0; i < a->size(); ++i) {
    EXPECT_EQ((*a)[i].name, (*b)[i].name);
    EXPECT_EQ((*a)[i].bytes, (*b)[i].bytes) << (*a)[i].name;
  }
}

TEST(GgufFuzzCorpusTest, SeedContents) {
  auto seeds = fuzz::BuildFuzzSeeds();
  ASSERT_TRUE(seeds.ok()) << seeds.status();

  auto empty = ParseSeed(*seeds, "empty.gguf");
  ASSERT_NE(empty, nullptr);
  EXPECT_EQ(empty->metadata().size(), 1u);
  EXPECT_TRUE(empty->tensors().empty());

  auto tiny = ParseSeed(*seeds, "tiny_model.gguf");
  ASSERT_NE(tiny, nullptr);
  EXPECT_EQ(tiny->version(), 3u);
  EXPECT_EQ(*tiny->GetUint("llama.attention.head_count_kv"), 1u);
  EXPECT_EQ(tiny->GetStringArray("tokenizer.ggml.tokens")->size(), 4u);
  const TensorInfo* q = tiny->FindTensor("blk.0.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->type, 2u);  // q4_0
  EXPECT_EQ(q->ne, (std::vector<uint64_t>{32, 32}));
  EXPECT_EQ(q->nbytes, 32u * 18);
  EXPECT_EQ(tiny->FindTensor("blk.0.attn_k.weight")->ne, (std::vector<uint64_t>{32, 16}));
  EXPECT_EQ(tiny->tensors().size(), 6u);

  auto tiny_v2 = ParseSeed(*seeds, "tiny_model_v2.gguf");
  ASSERT_NE(tiny_v2, nullptr);
  EXPECT_EQ(tiny_v2->version(), 2u);
  EXPECT_EQ(tiny_v2->tensors().size(), tiny->tensors().size());

  auto all = ParseSeed(*seeds, "all_value_types.gguf");
  ASSERT_NE(all, nullptr);
  EXPECT_EQ(*all->GetUint("t.u64"), (uint64_t{1} << 63) + 5);
  EXPECT_EQ(*all->GetInt("t.i64"), -(int64_t{1} << 40));
  EXPECT_EQ(*all->GetInt("t.i8"), -7);
  EXPECT_EQ(*all->GetUint("t.u16"), 60000u);
  EXPECT_FLOAT_EQ(*all->GetFloat("t.f64"), 3.25f);
  EXPECT_TRUE(*all->GetBool("t.bool"));
  EXPECT_EQ(*all->GetString("t.str"), "hello \xC4\xA0world");
  EXPECT_EQ(all->GetStringArray("t.arr_str")->at(2),
            "\xC4\xA0"
            "b");
  EXPECT_EQ(*all->GetIntArray("t.arr_i32"), (std::vector<int64_t>{3, 1, 1, -2}));
  EXPECT_EQ(*all->GetIntArray("t.arr_i16"), (std::vector<int64_t>{-32768, 5, 32767}));
  EXPECT_EQ(*all->GetFloatArray("t.arr_f64"), (std::vector<float>{0.25f, INFINITY}));
  EXPECT_TRUE(all->GetIntArray("t.arr_empty")->empty());
  // One record of every scalar type (12) and of every array element type (12), the empty
  // array and general.architecture.
  EXPECT_EQ(all->metadata().size(), 26u);

  auto kq = ParseSeed(*seeds, "kquant_tensors.gguf");
  ASSERT_NE(kq, nullptr);
  EXPECT_EQ(kq->tensors().size(), 15u);
  EXPECT_EQ(kq->FindTensor("q6k")->nbytes, 210u);
  EXPECT_EQ(kq->FindTensor("bf16")->ne, (std::vector<uint64_t>{2, 2, 2}));

  auto a64 = ParseSeed(*seeds, "aligned64.gguf");
  ASSERT_NE(a64, nullptr);
  EXPECT_EQ(a64->alignment(), 64u);
  for (const TensorInfo& t : a64->tensors()) EXPECT_EQ(t.offset % 64, 0u) << t.name;

  auto a1 = ParseSeed(*seeds, "aligned1_v2.gguf");
  ASSERT_NE(a1, nullptr);
  EXPECT_EQ(a1->version(), 2u);
  EXPECT_EQ(a1->alignment(), 1u);
  ASSERT_EQ(a1->tensors().size(), 3u);
  EXPECT_EQ(a1->tensors()[1].offset, 3u);  // packed right after the 3-byte i8 tensor
  EXPECT_EQ(a1->tensors()[2].offset, 15u);
  EXPECT_EQ(a1->tensors()[1].ne, (std::vector<uint64_t>{2, 1, 3, 1}));
}

TEST(GgufFuzzCorpusTest, WriteFuzzSeedsWritesEveryFile) {
  const std::string tmp = kiln::testing::TempDir();
  const std::string dir = tmp + "/seeds";  // created by WriteFuzzSeeds
  auto paths = fuzz::WriteFuzzSeeds(dir);
  ASSERT_TRUE(paths.ok()) << paths.status();
  auto seeds = fuzz::BuildFuzzSeeds();
  ASSERT_TRUE(seeds.ok());
  ASSERT_EQ(paths->size(), seeds->size());
  for (size_t i = 0; i < paths->size(); ++i) {
    EXPECT_EQ(ReadAll((*paths)[i]), (*seeds)[i].bytes) << (*paths)[i];
  }
  std::filesystem::remove_all(tmp);
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
