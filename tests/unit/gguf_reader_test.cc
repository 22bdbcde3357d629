// Hostile-input tests of the GGUF reader: every malformed file must give a DataLoss status whose
// message names the field (and usually the byte offset), never a crash or an out-of-bounds read.
// Run under ASan (-DKILN_SANITIZE=ON) to make "never reads outside the buffer" a checked claim:
// every parse below reads from a heap buffer of exactly the tested size.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "lib/common/ggml_type.h"
#include "lib/gguf/gguf.h"
#include "lib/gguf/gguf_writer.h"
#include "tests/common/test_util.h"

namespace kiln::gguf {
namespace {

using ::testing::HasSubstr;

// Builds raw GGUF bytes field by field, so tests can write what the writer refuses to.
class Raw {
 public:
  Raw& U8(uint8_t v) { return Put(v); }
  Raw& U32(uint32_t v) { return Put(v); }
  Raw& U64(uint64_t v) { return Put(v); }
  Raw& F32(float v) { return Put(v); }
  Raw& Str(std::string_view s) {
    U64(s.size());
    bytes.insert(bytes.end(), s.begin(), s.end());
    return *this;
  }
  Raw& Header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    return U32(kMagic).U32(version).U64(n_tensors).U64(n_kv);
  }
  Raw& KvU32(std::string_view key, uint32_t v) { return Str(key).U32(4).U32(v); }
  // Tensor info record.
  Raw& Tensor(std::string_view name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
    Str(name).U32(static_cast<uint32_t>(ne.size()));
    for (uint64_t n : ne) U64(n);
    return U32(type).U64(offset);
  }
  // Zero padding up to the alignment, then `n` data bytes.
  Raw& PadAndData(uint64_t n, uint64_t align = 32) {
    while (bytes.size() % align != 0) bytes.push_back(0);
    bytes.resize(bytes.size() + n, 0x11);
    return *this;
  }
  std::vector<uint8_t> bytes;

 private:
  template <typename T>
  Raw& Put(T v) {
    const size_t at = bytes.size();
    bytes.resize(at + sizeof(T));
    std::memcpy(bytes.data() + at, &v, sizeof(T));
    return *this;
  }
};

absl::Status ParseStatus(const std::vector<uint8_t>& b) {
  // Exact-size heap copy: ASan flags any read past the end.
  std::unique_ptr<uint8_t[]> exact(new uint8_t[b.size() ? b.size() : 1]);
  if (!b.empty()) std::memcpy(exact.get(), b.data(), b.size());
  auto f = GgufFile::Parse(exact.get(), b.size());
  return f.status();
}

void ExpectDataLoss(const std::vector<uint8_t>& b, std::initializer_list<std::string_view> parts) {
  const absl::Status s = ParseStatus(b);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  for (std::string_view p : parts) EXPECT_THAT(std::string(s.message()), HasSubstr(p)) << s;
}

// A small valid model: scalars, a string, a string array, an int array, three tensors of
// different types; the last tensor ends exactly at the end of the file (no trailing padding).
std::vector<uint8_t> SmallValidFile() {
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.SetUint32("llama.block_count", 2);
  w.SetFloat32("llama.rope.freq_base", 10000.0f);
  w.SetBool("tokenizer.ggml.add_bos_token", false);
  const std::vector<std::string> toks = {"<s>", "a", "Ġb"};
  w.SetArrayString("tokenizer.ggml.tokens", toks);
  const std::vector<int32_t> types = {3, 1, 1};
  w.SetArrayInt32("tokenizer.ggml.token_type", types);
  EXPECT_TRUE(
      w.AddTensor("a", static_cast<uint32_t>(GgmlType::kQ8_0), {32, 2}, std::vector<uint8_t>(68, 1))
          .ok());
  EXPECT_TRUE(
      w.AddTensor("b", static_cast<uint32_t>(GgmlType::kF16), {3}, std::vector<uint8_t>(6)).ok());
  EXPECT_TRUE(w.AddTensor("c", 0, {8}, std::vector<uint8_t>(32, 2)).ok());
  auto b = w.WriteToBuffer();
  EXPECT_TRUE(b.ok());
  return *b;
}

TEST(GgufReaderTest, SmallValidFileParses) {
  const std::vector<uint8_t> b = SmallValidFile();
  auto f = GgufFile::Parse(b.data(), b.size());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->tensors().size(), 3u);
  EXPECT_EQ((*f)->metadata().size(), 6u);
  EXPECT_EQ((*f)->tensors()[2].data + 32, b.data() + b.size());
  // copy=true survives the caller's buffer going away.
  std::vector<uint8_t> tmp = b;
  auto copied = GgufFile::Parse(tmp.data(), tmp.size(), /*copy=*/true);
  ASSERT_TRUE(copied.ok());
  std::fill(tmp.begin(), tmp.end(), 0);
  EXPECT_EQ(*(*copied)->GetString("general.architecture"), "llama");
}

TEST(GgufReaderTest, TruncatedAtEveryByteFails) {
  const std::vector<uint8_t> b = SmallValidFile();
  for (size_t n = 0; n < b.size(); ++n) {
    std::vector<uint8_t> prefix(b.begin(), b.begin() + n);
    const absl::Status s = ParseStatus(prefix);
    ASSERT_EQ(s.code(), absl::StatusCode::kDataLoss) << "prefix of " << n << " bytes: " << s;
    ASSERT_THAT(std::string(s.message()), HasSubstr("gguf: "));
  }
}

TEST(GgufReaderTest, EmptyInput) {
  auto f = GgufFile::Parse(nullptr, 0);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("empty"));
  EXPECT_EQ(GgufFile::Parse(nullptr, 10).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GgufReaderTest, BadMagic) {
  Raw r;
  r.U32(0x46554746).U32(3).U64(0).U64(0);
  ExpectDataLoss(r.bytes, {"magic", "byte 0"});
}

TEST(GgufReaderTest, UnsupportedVersions) {
  for (uint32_t v : {0u, 1u, 4u}) {
    Raw r;
    r.Header(0, 0, v);
    ExpectDataLoss(r.bytes, {"version", "byte 4", std::to_string(v)});
  }
  Raw swapped;
  swapped.Header(0, 0, 0x03000000);
  ExpectDataLoss(swapped.bytes, {"byte-swapped"});
  Raw v2;
  v2.Header(0, 0, 2);
  EXPECT_TRUE(ParseStatus(v2.bytes).ok());
}

TEST(GgufReaderTest, HugeCounts) {
  Raw kv;
  kv.Header(0, uint64_t{1} << 40);
  ExpectDataLoss(kv.bytes, {"metadata_kv_count", "byte 16"});
  Raw t;
  t.Header(~uint64_t{0}, 0);
  ExpectDataLoss(t.bytes, {"tensor_count", "byte 8"});
}

TEST(GgufReaderTest, StringLengthOverflowAndLimits) {
  Raw key_len;
  key_len.Header(0, 1).U64(~uint64_t{0}).U32(4).U32(1);
  ExpectDataLoss(key_len.bytes, {"metadata record 0 key", "byte 24", "2^30"});
  Raw value_len;
  value_len.Header(0, 1).Str("k").U32(8).U64((uint64_t{1} << 30) + 1);
  ExpectDataLoss(value_len.bytes, {"string value of key 'k'", "2^30"});
  Raw past_end;
  past_end.Header(0, 1).Str("k").U32(8).U64(100).Str("short");
  ExpectDataLoss(past_end.bytes, {"string value of key 'k' bytes", "needs 100 bytes"});
  Raw elem_len;
  elem_len.Header(0, 1).Str("k").U32(9).U32(8).U64(2).Str("ok").U64(~uint64_t{0} - 3);
  ExpectDataLoss(elem_len.bytes, {"key 'k'", "string 1"});
}

TEST(GgufReaderTest, BadArrays) {
  Raw nested;
  nested.Header(0, 1).Str("n").U32(9).U32(9).U64(1).U32(4).U64(1).U32(7);
  ExpectDataLoss(nested.bytes, {"key 'n'", "nested array"});
  Raw count;
  count.Header(0, 1).Str("c").U32(9).U32(4).U64((uint64_t{1} << 30) + 1);
  ExpectDataLoss(count.bytes, {"key 'c'", "array count", "2^30"});
  Raw bytes_overflow;  // count * 8 would overflow without the cap; here just past the end.
  bytes_overflow.Header(0, 1).Str("o").U32(9).U32(10).U64(uint64_t{1} << 29);
  ExpectDataLoss(bytes_overflow.bytes, {"array of 536870912 uint64 for key 'o'"});
  Raw strings;
  strings.Header(0, 1).Str("s").U32(9).U32(8).U64(uint64_t{1} << 29);
  ExpectDataLoss(strings.bytes, {"strings for key 's'"});
  Raw elem_type;
  elem_type.Header(0, 1).Str("e").U32(9).U32(13).U64(0);
  ExpectDataLoss(elem_type.bytes, {"key 'e'", "unknown array element type 13", "byte 37"});
  Raw bools;
  bools.Header(0, 1).Str("b").U32(9).U32(7).U64(2).U8(1).U8(2);
  ExpectDataLoss(bools.bytes, {"key 'b'", "bool element 1"});
}

TEST(GgufReaderTest, BadKeysAndValueTypes) {
  Raw dup;
  dup.Header(0, 2).KvU32("a.b", 1).KvU32("a.b", 2);
  ExpectDataLoss(dup.bytes, {"metadata record 1", "duplicate key 'a.b'"});
  Raw empty;
  empty.Header(0, 1).KvU32("", 1);
  ExpectDataLoss(empty.bytes, {"metadata record 0", "empty key"});
  Raw type;
  type.Header(0, 1).Str("t").U32(13).U32(0);
  ExpectDataLoss(type.bytes, {"key 't'", "unknown value type 13", "byte 33"});
  Raw boolean;
  boolean.Header(0, 1).Str("b").U32(7).U8(2);
  ExpectDataLoss(boolean.bytes, {"key 'b'", "bool value", "must be 0 or 1"});
  Raw scalar;
  scalar.Header(0, 1).Str("u").U32(10).U32(0);  // uint64 with only 4 bytes left
  ExpectDataLoss(scalar.bytes, {"uint64 value of key 'u'", "byte 37"});
}

TEST(GgufReaderTest, BadAlignment) {
  for (uint32_t a : {0u, 48u, 3u}) {
    Raw r;
    r.Header(0, 1).KvU32("general.alignment", a);
    ExpectDataLoss(r.bytes, {"general.alignment", "power of two"});
  }
  Raw wrong_type;
  wrong_type.Header(0, 1).Str("general.alignment").U32(10).U64(32);
  ExpectDataLoss(wrong_type.bytes, {"general.alignment", "uint64", "uint32"});
  Raw ok;
  ok.Header(1, 1).KvU32("general.alignment", 64).Tensor("t", {16}, 0, 0).PadAndData(64, 64);
  auto f = GgufFile::Parse(ok.bytes.data(), ok.bytes.size());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->alignment(), 64u);
  EXPECT_EQ((*f)->data_offset() % 64, 0u);
}

TEST(GgufReaderTest, BadTensorInfos) {
  auto one = [](std::string_view name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset,
                uint64_t data_bytes) {
    Raw r;
    r.Header(1, 0).Tensor(name, std::move(ne), type, offset).PadAndData(data_bytes);
    return r.bytes;
  };
  // Valid baseline.
  EXPECT_TRUE(ParseStatus(one("t", {32, 2}, 8, 0, 68)).ok());
  ExpectDataLoss(one("t", {32}, 4, 0, 64), {"tensor 't'", "unknown ggml type id 4", "byte"});
  ExpectDataLoss(one("t", {32}, 1000, 0, 64), {"unknown ggml type id 1000"});
  ExpectDataLoss(one("t", {48, 2}, 8, 0, 200), {"tensor 't'", "ne[0] = 48", "q8_0", "32"});
  ExpectDataLoss(
      one("t", {256}, 0, 0, 100),
      {"tensor 't' (info at byte 24)", "data [64, 1088) extends past end of file", "size 164"});
  ExpectDataLoss(one("t", {8}, 0, 16, 100),
                 {"tensor 't'", "offset 16", "not a multiple of the alignment 32"});
  ExpectDataLoss(one("t", {uint64_t{1} << 32, uint64_t{1} << 32}, 0, 0, 0),
                 {"tensor 't'", "overflow"});
  ExpectDataLoss(one("t", {uint64_t{1} << 40, uint64_t{1} << 30}, 0, 0, 0),
                 {"tensor 't'", "element count overflows", "ne[1]"});
  ExpectDataLoss(one("t", {4, 0}, 0, 0, 16), {"tensor 't'", "ne[1]", "is 0"});
  ExpectDataLoss(one("t", {1, 1, 1, 1, 1}, 0, 0, 4), {"tensor 't'", "n_dims", "is 5"});
  ExpectDataLoss(one("t", {}, 0, 0, 4), {"tensor 't'", "n_dims", "is 0"});
  ExpectDataLoss(one(std::string(64, 'x'), {1}, 0, 0, 4), {"tensor info 0", "name length 64"});
  ExpectDataLoss(one("", {1}, 0, 0, 4), {"tensor info 0", "name length 0"});
  ExpectDataLoss(one("t", {8}, 0, ~uint64_t{0} - 31, 32), {"tensor 't'", "extends past end"});

  Raw dup;
  dup.Header(2, 0).Tensor("w", {8}, 0, 0).Tensor("w", {8}, 0, 32).PadAndData(64);
  ExpectDataLoss(dup.bytes, {"tensor info 1", "duplicate tensor name 'w'"});
  Raw overlap;
  overlap.Header(2, 0).Tensor("a", {16}, 0, 0).Tensor("b", {8}, 0, 32).PadAndData(64);
  ExpectDataLoss(overlap.bytes, {"tensors 'a'", "and 'b'", "overlap"});
  // Out-of-order but disjoint tensors are fine.
  Raw reversed;
  reversed.Header(2, 0).Tensor("a", {8}, 0, 32).Tensor("b", {8}, 0, 0).PadAndData(64);
  EXPECT_TRUE(ParseStatus(reversed.bytes).ok());
}

TEST(GgufReaderTest, OpenErrors) {
  const std::string dir = kiln::testing::TempDir();
  auto missing = GgufFile::Open(dir + "/does-not-exist.gguf");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("does-not-exist.gguf"));

  auto is_dir = GgufFile::Open(dir);
  EXPECT_EQ(is_dir.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(is_dir.status().message()), HasSubstr("directory"));

  const std::string empty = dir + "/empty.gguf";
  std::ofstream(empty).close();
  for (bool use_mmap : {true, false}) {
    auto e = GgufFile::Open(empty, {.use_mmap = use_mmap});
    EXPECT_EQ(e.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(std::string(e.status().message()), HasSubstr("empty"));
  }

  const std::string junk = dir + "/junk.gguf";
  std::ofstream(junk) << "this is not a gguf file at all";
  auto j = GgufFile::Open(junk);
  EXPECT_EQ(j.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(j.status().message()), HasSubstr("magic"));
  EXPECT_THAT(std::string(j.status().message()), HasSubstr("junk.gguf"));
  std::filesystem::remove_all(dir);
}

TEST(GgufReaderTest, CorruptingEveryByteNeverCrashes) {
  // Flip each byte of the valid file to a few hostile values; parse must return (ok or error).
  const std::vector<uint8_t> b = SmallValidFile();
  size_t rejected = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    for (uint8_t v : {uint8_t{0x00}, uint8_t{0xFF}, uint8_t{0x7F}, uint8_t{0x40}}) {
      std::vector<uint8_t> c = b;
      if (c[i] == v) continue;
      c[i] = v;
      if (!ParseStatus(c).ok()) ++rejected;
    }
  }
  EXPECT_GT(rejected, 0u);
}

}  // namespace
}  // namespace kiln::gguf
