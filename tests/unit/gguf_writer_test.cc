// Writer -> reader round trips of every value type and of tensors; byte-exact checks of the
// writer's layout at hand-computed offsets (GGUF_FACTS.md §1); the real default model.
#include "lib/gguf/gguf_writer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "lib/common/ggml_type.h"
#include "lib/gguf/gguf.h"
#include "tests/common/test_util.h"

namespace kiln::gguf {
namespace {

template <typename T>
T At(const std::vector<uint8_t>& b, size_t off) {
  T v;
  std::memcpy(&v, b.data() + off, sizeof(T));
  return v;
}

std::unique_ptr<GgufFile> ParseOrDie(const std::vector<uint8_t>& bytes) {
  auto f = GgufFile::Parse(bytes.data(), bytes.size());
  EXPECT_TRUE(f.ok()) << f.status();
  return f.ok() ? std::move(f).value() : nullptr;
}

TEST(GgufWriterTest, HeaderAndFirstRecordAreByteExact) {
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.SetUint32("llama.block_count", 30);
  std::vector<float> row(32, 1.0f);
  ASSERT_TRUE(
      w.AddTensor("t", 0, {32},
                  std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(row.data()), 128))
          .ok());
  auto bytes = w.WriteToBuffer();
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  const std::vector<uint8_t>& b = *bytes;
  // Header: magic "GGUF", version 3, tensor_count 1, kv_count 2.
  EXPECT_EQ(b[0], 0x47);
  EXPECT_EQ(b[1], 0x47);
  EXPECT_EQ(b[2], 0x55);
  EXPECT_EQ(b[3], 0x46);
  EXPECT_EQ(At<uint32_t>(b, 4), 3u);
  EXPECT_EQ(At<uint64_t>(b, 8), 1u);
  EXPECT_EQ(At<uint64_t>(b, 16), 2u);
  // First KV at 24: u64 key length 20, "general.architecture", u32 type 8, u64 5, "llama".
  EXPECT_EQ(At<uint64_t>(b, 24), 20u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(&b[32]), 20), "general.architecture");
  EXPECT_EQ(At<uint32_t>(b, 52), 8u);
  EXPECT_EQ(At<uint64_t>(b, 56), 5u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(&b[64]), 5), "llama");
  // Second KV at 69: key length 17 "llama.block_count", type 4 (uint32), value 30.
  EXPECT_EQ(At<uint64_t>(b, 69), 17u);
  EXPECT_EQ(At<uint32_t>(b, 94), 4u);
  EXPECT_EQ(At<uint32_t>(b, 98), 30u);
  // Tensor info at 102: name len 1 "t", n_dims 1, ne[0] 32, type 0, offset 0 -> ends at 136.
  EXPECT_EQ(At<uint64_t>(b, 102), 1u);
  EXPECT_EQ(b[110], 't');
  EXPECT_EQ(At<uint32_t>(b, 111), 1u);
  EXPECT_EQ(At<uint64_t>(b, 115), 32u);
  EXPECT_EQ(At<uint32_t>(b, 123), 0u);
  EXPECT_EQ(At<uint64_t>(b, 127), 0u);
  // Data section at align_up(135, 32) = 160; padding is zero; file = 160 + 128.
  for (size_t i = 135; i < 160; ++i) EXPECT_EQ(b[i], 0) << i;
  EXPECT_EQ(b.size(), 160u + 128u);
  EXPECT_EQ(At<float>(b, 160), 1.0f);

  auto f = ParseOrDie(b);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->data_offset(), 160u);
  EXPECT_EQ(f->tensors()[0].data, b.data() + 160);
}

TEST(GgufWriterTest, RoundTripEveryScalarType) {
  GgufWriter w(GgufWriter::Options{.version = 2, .alignment = 64});
  w.SetUint8("a.u8", 200);
  w.SetInt8("a.i8", -100);
  w.SetUint16("a.u16", 60000);
  w.SetInt16("a.i16", -30000);
  w.SetUint32("a.u32", 4000000000u);
  w.SetInt32("a.i32", -2000000000);
  w.SetFloat32("a.f32", 1e-5f);
  w.SetBool("a.bool", true);
  w.SetString("a.str", std::string("with\0nul", 8));
  w.SetUint64("a.u64", ~uint64_t{0});
  w.SetInt64("a.i64", -(int64_t{1} << 62));
  w.SetFloat64("a.f64", 3.141592653589793);
  w.SetString("a.empty", "");
  auto bytes = w.WriteToBuffer();
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  auto f = ParseOrDie(*bytes);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->version(), 2u);
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(*f->GetUint("general.alignment"), 64u);
  EXPECT_EQ(*f->GetUint("a.u8"), 200u);
  EXPECT_EQ(*f->GetInt("a.i8"), -100);
  EXPECT_EQ(*f->GetUint("a.u16"), 60000u);
  EXPECT_EQ(*f->GetInt("a.i16"), -30000);
  EXPECT_EQ(*f->GetUint("a.u32"), 4000000000u);
  EXPECT_EQ(*f->GetInt("a.i32"), -2000000000);
  EXPECT_FLOAT_EQ(static_cast<float>(*f->GetFloat("a.f32")), 1e-5f);
  EXPECT_EQ(*f->GetBool("a.bool"), true);
  EXPECT_EQ(*f->GetString("a.str"), std::string_view("with\0nul", 8));
  EXPECT_EQ(*f->GetUint("a.u64"), ~uint64_t{0});
  EXPECT_EQ(*f->GetInt("a.i64"), -(int64_t{1} << 62));
  EXPECT_DOUBLE_EQ(*f->GetFloat("a.f64"), 3.141592653589793);
  EXPECT_EQ(*f->GetString("a.empty"), "");
  EXPECT_EQ(*f->GetFloat("a.u32"), 4000000000.0);  // integers are accepted as floats

  // Types and conversions that must fail, naming key and type.
  auto u64_as_int = f->GetInt("a.u64");
  EXPECT_EQ(u64_as_int.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(u64_as_int.status().message().find("a.u64"), std::string_view::npos);
  auto neg_as_uint = f->GetUint("a.i8");
  EXPECT_EQ(neg_as_uint.status().code(), absl::StatusCode::kInvalidArgument);
  auto bool_as_uint = f->GetUint("a.bool");
  EXPECT_EQ(bool_as_uint.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bool_as_uint.status().message().find("bool"), std::string_view::npos);
  auto str_as_float = f->GetFloat("a.str");
  EXPECT_EQ(str_as_float.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(str_as_float.status().message().find("a.str"), std::string_view::npos);
  EXPECT_NE(str_as_float.status().message().find("string"), std::string_view::npos);
  auto missing = f->GetString("no.such.key");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("no.such.key"), std::string_view::npos);
  EXPECT_EQ(f->FindKey("no.such.key"), nullptr);

  EXPECT_EQ(f->ValueToString(*f->FindKey("a.str")), "\"with\\x00nul\"");
  EXPECT_EQ(f->ValueToString(*f->FindKey("a.i8")), "-100");
  EXPECT_EQ(f->ValueToString(*f->FindKey("a.bool")), "true");
}

TEST(GgufWriterTest, RoundTripEveryArrayType) {
  GgufWriter w;
  const std::vector<uint8_t> u8 = {0, 1, 255};
  const std::vector<int8_t> i8 = {-128, 0, 127};
  const std::vector<uint16_t> u16 = {1, 65535};
  const std::vector<int16_t> i16 = {-32768, 32767};
  const std::vector<uint32_t> u32 = {7, 4294967295u};
  const std::vector<int32_t> i32 = {-5, 3, 1, 6};
  const std::vector<float> f32 = {0.5f, -2.25f, 1e30f};
  const bool bools[] = {true, false, true};
  const std::vector<uint64_t> u64 = {1, uint64_t{1} << 63};
  const std::vector<int64_t> i64 = {-1, int64_t{1} << 40};
  const std::vector<double> f64 = {1.0 / 3.0, -0.0};
  const std::vector<std::string> strs = {"a", "", "Ġthe", std::string(300, 'x')};
  w.SetArrayUint8("x.u8", u8);
  w.SetArrayInt8("x.i8", i8);
  w.SetArrayUint16("x.u16", u16);
  w.SetArrayInt16("x.i16", i16);
  w.SetArrayUint32("x.u32", u32);
  w.SetArrayInt32("x.i32", i32);
  w.SetArrayFloat32("x.f32", f32);
  w.SetArrayBool("x.bool", bools);
  w.SetArrayUint64("x.u64", u64);
  w.SetArrayInt64("x.i64", i64);
  w.SetArrayFloat64("x.f64", f64);
  w.SetArrayString("x.str", strs);
  w.SetArrayInt32("x.empty", std::span<const int32_t>());
  auto bytes = w.WriteToBuffer();
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  auto f = ParseOrDie(*bytes);
  ASSERT_NE(f, nullptr);

  EXPECT_EQ(*f->GetIntArray("x.u8"), (std::vector<int64_t>{0, 1, 255}));
  EXPECT_EQ(*f->GetIntArray("x.i8"), (std::vector<int64_t>{-128, 0, 127}));
  EXPECT_EQ(*f->GetIntArray("x.u16"), (std::vector<int64_t>{1, 65535}));
  EXPECT_EQ(*f->GetIntArray("x.i16"), (std::vector<int64_t>{-32768, 32767}));
  EXPECT_EQ(*f->GetIntArray("x.u32"), (std::vector<int64_t>{7, 4294967295}));
  EXPECT_EQ(*f->GetIntArray("x.i32"), (std::vector<int64_t>{-5, 3, 1, 6}));
  EXPECT_EQ(*f->GetFloatArray("x.f32"), f32);
  EXPECT_EQ(*f->GetFloatArray("x.i32"), (std::vector<float>{-5, 3, 1, 6}));
  EXPECT_EQ(*f->GetIntArray("x.i64"), i64);
  EXPECT_EQ(*f->GetFloatArray("x.f64"), (std::vector<float>{1.0f / 3.0f, -0.0f}));
  EXPECT_EQ(f->GetIntArray("x.u64").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f->GetIntArray("x.bool").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f->GetIntArray("x.empty")->size(), 0u);
  const KeyValue* kb = f->FindKey("x.bool");
  ASSERT_NE(kb, nullptr);
  EXPECT_EQ(kb->type, ValueType::kArray);
  EXPECT_EQ(kb->array_type, ValueType::kBool);
  EXPECT_EQ(kb->array_count, 3u);
  EXPECT_EQ(f->ValueToString(*kb), "[true, false, true]");

  auto s = f->GetStringArray("x.str");
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(s->size(), 4u);
  for (size_t i = 0; i < strs.size(); ++i) EXPECT_EQ((*s)[i], strs[i]);
  EXPECT_EQ(f->GetStringArray("x.i32").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(f->GetStringArray("x.i32").status().message().find("array of int32"),
            std::string_view::npos);
  EXPECT_EQ(f->ValueToString(*f->FindKey("x.i32"), 2), "[-5, 3, ... (4 items)]");

  // Copying records verbatim reproduces them.
  GgufWriter w2;
  for (const KeyValue& kv : f->metadata()) w2.CopyKeyValue(kv);
  auto bytes2 = w2.WriteToBuffer();
  ASSERT_TRUE(bytes2.ok());
  EXPECT_EQ(*bytes2, *bytes);
}

TEST(GgufWriterTest, RoundTripTensorsWithAlignment) {
  GgufWriter w(GgufWriter::Options{.alignment = 128});
  // q8_0 [64, 3]: 2 blocks x 34 bytes x 3 rows = 204 bytes.
  std::vector<uint8_t> q8(204);
  for (size_t i = 0; i < q8.size(); ++i) q8[i] = static_cast<uint8_t>(i * 7);
  std::vector<uint8_t> f16(2 * 5 * 2 * 3 * 4);
  for (size_t i = 0; i < f16.size(); ++i) f16[i] = static_cast<uint8_t>(i);
  ASSERT_TRUE(w.AddTensor("w.q8", static_cast<uint32_t>(GgmlType::kQ8_0), {64, 3}, q8).ok());
  ASSERT_TRUE(w.AddTensor("w.f16", static_cast<uint32_t>(GgmlType::kF16), {5, 2, 3, 4}, f16).ok());
  // Wrong byte size / bad shape / duplicate / unknown type are refused with the name.
  auto bad = w.AddTensor("w.bad", static_cast<uint32_t>(GgmlType::kQ8_0), {64, 3},
                         std::vector<uint8_t>(203));
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("w.bad"), std::string_view::npos);
  EXPECT_FALSE(w.AddTensor("w.q8", 0, {1}, std::vector<uint8_t>(4)).ok());
  EXPECT_FALSE(w.AddTensor("w.odd", static_cast<uint32_t>(GgmlType::kQ4_0), {48}, q8).ok());
  EXPECT_FALSE(w.AddTensor("w.unk", 4, {1}, std::vector<uint8_t>(4)).ok());
  EXPECT_FALSE(w.AddTensor(std::string(64, 'n'), 0, {1}, std::vector<uint8_t>(4)).ok());
  EXPECT_EQ(w.tensor_count(), 2u);

  auto bytes = w.WriteToBuffer();
  ASSERT_TRUE(bytes.ok());
  auto f = ParseOrDie(*bytes);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->alignment(), 128u);
  EXPECT_EQ(f->data_offset() % 128, 0u);
  ASSERT_EQ(f->tensors().size(), 2u);
  const TensorInfo* a = f->FindTensor("w.q8");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->ne, (std::vector<uint64_t>{64, 3}));
  EXPECT_EQ(a->type, static_cast<uint32_t>(GgmlType::kQ8_0));
  EXPECT_EQ(a->offset, 0u);
  EXPECT_EQ(a->nbytes, 204u);
  EXPECT_EQ(a->n_elements, 192u);
  EXPECT_EQ(std::memcmp(a->data, q8.data(), q8.size()), 0);
  const TensorInfo* b = f->FindTensor("w.f16");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->offset, 256u);  // align_up(204, 128)
  EXPECT_EQ(b->n_elements, 120u);
  EXPECT_EQ(b->nbytes, 240u);
  EXPECT_EQ(std::memcmp(b->data, f16.data(), f16.size()), 0);
  EXPECT_EQ(f->FindTensor("w.nope"), nullptr);
}

TEST(GgufWriterTest, WriteToFileIsAtomicAndReadable) {
  const std::string dir = kiln::testing::TempDir();
  const std::string path = dir + "/m.gguf";
  GgufWriter w;
  w.SetString("general.name", "file test");
  ASSERT_TRUE(w.AddTensor("x", 0, {4}, std::vector<uint8_t>(16, 0x3f)).ok());
  ASSERT_TRUE(w.WriteToFile(path).ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  for (bool use_mmap : {true, false}) {
    auto f = GgufFile::Open(path, {.use_mmap = use_mmap});
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ(*(*f)->GetString("general.name"), "file test");
    EXPECT_EQ((*f)->tensors()[0].data[0], 0x3f);
    EXPECT_EQ((*f)->file_size(), std::filesystem::file_size(path));
  }
  EXPECT_FALSE(w.WriteToFile(dir + "/no/such/dir/m.gguf").ok());
  std::filesystem::remove_all(dir);
}

TEST(GgufWriterTest, StreamedFileEqualsBuffer) {
  GgufWriter w(GgufWriter::Options{.alignment = 64});
  w.SetString("general.name", "stream");
  ASSERT_TRUE(w.AddTensor("a", 0, {3}, std::vector<uint8_t>(12, 1)).ok());
  ASSERT_TRUE(w.AddTensor("b", 1, {5, 7}, std::vector<uint8_t>(70, 2)).ok());
  ASSERT_TRUE(w.AddTensor("c", 0, {1}, std::vector<uint8_t>(4, 3)).ok());
  auto buffer = w.WriteToBuffer();
  ASSERT_TRUE(buffer.ok());
  const std::string dir = kiln::testing::TempDir();
  ASSERT_TRUE(w.WriteToFile(dir + "/s.gguf").ok());
  std::ifstream in(dir + "/s.gguf", std::ios::binary);
  const std::vector<uint8_t> file((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(file, *buffer);
  std::filesystem::remove_all(dir);
}

TEST(GgufWriterTest, InvalidKeyIsReportedAtWrite) {
  GgufWriter w;
  w.SetUint32("", 1);
  EXPECT_FALSE(w.status().ok());
  EXPECT_EQ(w.WriteToBuffer().status().code(), absl::StatusCode::kInvalidArgument);
  GgufWriter bad_align(GgufWriter::Options{.alignment = 48});
  EXPECT_FALSE(bad_align.WriteToBuffer().ok());
}

TEST(GgufRealModelTest, DefaultModelMetadataAndTensors) {
  const std::string path = kiln::testing::DefaultModelPath();
  ASSERT_FALSE(path.empty());
  const auto t0 = std::chrono::steady_clock::now();
  auto opened = GgufFile::Open(path);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(opened.ok()) << opened.status();
  const GgufFile& f = **opened;
  std::printf("Open(%s): %.2f ms\n", path.c_str(), ms);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.metadata().size(), 33u);
  EXPECT_EQ(*f.GetString("general.architecture"), "llama");
  EXPECT_EQ(*f.GetUint("llama.block_count"), 30u);
  EXPECT_EQ(*f.GetUint("llama.embedding_length"), 576u);
  EXPECT_EQ(*f.GetUint("llama.feed_forward_length"), 1536u);
  EXPECT_EQ(*f.GetUint("llama.attention.head_count"), 9u);
  EXPECT_EQ(*f.GetUint("llama.attention.head_count_kv"), 3u);
  EXPECT_EQ(*f.GetUint("llama.context_length"), 8192u);
  EXPECT_EQ(*f.GetUint("llama.vocab_size"), 49152u);
  EXPECT_EQ(*f.GetUint("general.file_type"), 3u);
  EXPECT_DOUBLE_EQ(*f.GetFloat("llama.rope.freq_base"), 100000.0);
  EXPECT_NEAR(*f.GetFloat("llama.attention.layer_norm_rms_epsilon"), 1e-5, 1e-12);
  EXPECT_EQ(*f.GetBool("tokenizer.ggml.add_bos_token"), false);
  EXPECT_EQ(*f.GetString("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(*f.GetString("tokenizer.ggml.pre"), "smollm");
  EXPECT_EQ(*f.GetUint("tokenizer.ggml.bos_token_id"), 1u);
  auto tokens = f.GetStringArray("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok());
  ASSERT_EQ(tokens->size(), 49152u);
  EXPECT_EQ((*tokens)[0], "<|endoftext|>");
  EXPECT_EQ((*tokens)[1], "<|im_start|>");
  EXPECT_EQ((*tokens)[2], "<|im_end|>");
  EXPECT_EQ(f.GetStringArray("tokenizer.ggml.merges")->size(), 48900u);
  auto types = f.GetIntArray("tokenizer.ggml.token_type");
  ASSERT_TRUE(types.ok());
  EXPECT_EQ((*types)[0], 3);
  EXPECT_EQ(f.FindKey("tokenizer.ggml.token_type")->array_type, ValueType::kInt32);

  ASSERT_EQ(f.tensors().size(), 272u);
  const TensorInfo* embd = f.FindTensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->type, static_cast<uint32_t>(GgmlType::kQ8_0));
  EXPECT_EQ(embd->ne, (std::vector<uint64_t>{576, 49152}));
  EXPECT_EQ(embd->nbytes, 49152u * 612u);
  const TensorInfo* q = f.FindTensor("blk.0.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->type, static_cast<uint32_t>(GgmlType::kQ4_1));
  EXPECT_EQ(q->ne, (std::vector<uint64_t>{576, 576}));
  const TensorInfo* k = f.FindTensor("blk.29.attn_k.weight");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->ne, (std::vector<uint64_t>{576, 192}));
  const TensorInfo* norm = f.FindTensor("output_norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->type, 0u);
  EXPECT_EQ(f.FindTensor("output.weight"), nullptr);  // tied
  uint64_t total = 0;
  for (const TensorInfo& t : f.tensors()) {
    total += t.nbytes;
    EXPECT_EQ((t.data - f.bytes()) % 32, 0) << t.name;
  }
  EXPECT_EQ(total, 96576768u);  // GGUF_FACTS.md §6.1
  EXPECT_EQ(f.data_offset() + total, f.file_size());
  // The norms hold plausible weights (not garbage): finite, positive-ish.
  float w0;
  std::memcpy(&w0, norm->data, 4);
  EXPECT_TRUE(std::isfinite(w0));
  EXPECT_NE(f.ValueToString(*f.FindKey("tokenizer.ggml.tokens"), 3).find("(49152 items)"),
            std::string::npos);
}

}  // namespace
}  // namespace kiln::gguf
