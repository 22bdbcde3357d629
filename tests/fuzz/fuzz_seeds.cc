#include "tests/fuzz/fuzz_seeds.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <string_view>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "lib/common/ggml_type.h"
#include "lib/common/status.h"
#include "lib/common/strings.h"
#include "lib/gguf/gguf_writer.h"

namespace kiln::fuzz {
namespace {

using gguf::GgufWriter;

// splitmix64: a tiny generator whose output is fixed by the seed on every platform (std::
// distributions are not), so the seed files are byte-identical everywhere.
class Bytes {
 public:
  explicit Bytes(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  std::vector<uint8_t> Take(size_t n) {
    std::vector<uint8_t> out(n);
    for (uint8_t& b : out) b = static_cast<uint8_t>(Next() >> 56);
    return out;
  }
  // Little-endian f32 values in [-1, 1): finite, unlike random bytes read as floats.
  std::vector<uint8_t> TakeF32(size_t n) {
    std::vector<uint8_t> out(n * sizeof(float));
    for (size_t i = 0; i < n; ++i) {
      const float v = static_cast<float>(static_cast<double>(Next() >> 11) * 0x1p-52 - 1.0);
      std::memcpy(out.data() + i * sizeof(float), &v, sizeof v);
    }
    return out;
  }

 private:
  uint64_t state_;
};

// Adds a tensor of `type` and shape `ne` (ggml order) filled with generator bytes (f32 tensors
// get finite values); the byte size comes from the ggml type table.
absl::Status AddRandomTensor(GgufWriter* w, std::string_view name, GgmlType type,
                             std::vector<uint64_t> ne, Bytes* rng) {
  const auto info = GgmlTypeInfoOf(static_cast<uint32_t>(type));
  if (!info) return absl::InternalError(StrCat("fuzz seeds: unknown type for tensor ", name));
  uint64_t rows = 1;
  for (size_t d = 1; d < ne.size(); ++d) rows *= ne[d];
  const size_t nbytes = GgmlRowBytes(*info, ne[0]) * rows;
  std::vector<uint8_t> bytes =
      type == GgmlType::kF32 ? rng->TakeF32(nbytes / sizeof(float)) : rng->Take(nbytes);
  return w->AddTensor(name, static_cast<uint32_t>(type), std::move(ne), std::move(bytes));
}

GgufWriter NewWriter(uint32_t version = 3, uint32_t alignment = 32) {
  GgufWriter w(gguf::GgufWriterOptions{.version = version, .alignment = alignment});
  w.SetString("general.architecture", "llama");
  return w;
}

void AllValueTypes(GgufWriter* w) {
  w->SetUint8("t.u8", 200);
  w->SetInt8("t.i8", -7);
  w->SetUint16("t.u16", 60000);
  w->SetInt16("t.i16", -300);
  w->SetUint32("t.u32", 4000000000u);
  w->SetInt32("t.i32", -123456);
  w->SetFloat32("t.f32", 1e-5f);
  w->SetBool("t.bool", true);
  w->SetString("t.str", "hello \xC4\xA0world");  // "Ġ" (U+0120), GPT-2's space marker
  w->SetUint64("t.u64", (uint64_t{1} << 63) + 5);
  w->SetInt64("t.i64", -(int64_t{1} << 40));
  w->SetFloat64("t.f64", 3.25);
  const std::vector<std::string> strs = {"<s>", "a",
                                         "\xC4\xA0"
                                         "b",
                                         ""};
  w->SetArrayString("t.arr_str", std::span<const std::string>(strs));
  const std::vector<int32_t> i32s = {3, 1, 1, -2};
  w->SetArrayInt32("t.arr_i32", i32s);
  const std::vector<float> f32s = {0.5f, -1.0f, 2.0f};
  w->SetArrayFloat32("t.arr_f32", f32s);
  const bool bools[] = {true, false};
  w->SetArrayBool("t.arr_bool", bools);
  const std::vector<uint8_t> u8s = {1, 2, 3};
  w->SetArrayUint8("t.arr_u8", u8s);
  const std::vector<int8_t> i8s = {-128, 0, 127};
  w->SetArrayInt8("t.arr_i8", i8s);
  const std::vector<uint16_t> u16s = {0, 65535};
  w->SetArrayUint16("t.arr_u16", u16s);
  const std::vector<int16_t> i16s = {-32768, 5, 32767};
  w->SetArrayInt16("t.arr_i16", i16s);
  const std::vector<uint32_t> u32s = {7, 4000000000u};
  w->SetArrayUint32("t.arr_u32", u32s);
  const std::vector<uint64_t> u64s = {1, uint64_t{1} << 40};
  w->SetArrayUint64("t.arr_u64", u64s);
  const std::vector<int64_t> i64s = {-(int64_t{1} << 62), 9};
  w->SetArrayInt64("t.arr_i64", i64s);
  const std::vector<double> f64s = {0.25, 1e300};
  w->SetArrayFloat64("t.arr_f64", f64s);
  w->SetArrayInt32("t.arr_empty", std::span<const int32_t>());
}

absl::Status TinyModel(GgufWriter* w) {
  Bytes rng(1);
  w->SetUint32("llama.block_count", 1);
  w->SetUint32("llama.context_length", 64);
  w->SetUint32("llama.embedding_length", 32);
  w->SetUint32("llama.feed_forward_length", 64);
  w->SetUint32("llama.attention.head_count", 2);
  w->SetUint32("llama.attention.head_count_kv", 1);
  w->SetFloat32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w->SetFloat32("llama.rope.freq_base", 10000.0f);
  w->SetString("tokenizer.ggml.model", "gpt2");
  const std::vector<std::string> tokens = {"<|endoftext|>", "a", "b", "ab"};
  w->SetArrayString("tokenizer.ggml.tokens", std::span<const std::string>(tokens));
  const std::vector<int32_t> token_types = {3, 1, 1, 1};
  w->SetArrayInt32("tokenizer.ggml.token_type", token_types);
  const std::vector<std::string> merges = {"a b"};
  w->SetArrayString("tokenizer.ggml.merges", std::span<const std::string>(merges));
  w->SetUint32("tokenizer.ggml.bos_token_id", 0);
  // [32, 4] q8_0, [32] f32, [32, 32] q4_0, [32, 16] f16, [32, 2] q4_1, [32] f32
  KILN_RETURN_IF_ERROR(AddRandomTensor(w, "token_embd.weight", GgmlType::kQ8_0, {32, 4}, &rng));
  KILN_RETURN_IF_ERROR(AddRandomTensor(w, "blk.0.attn_norm.weight", GgmlType::kF32, {32}, &rng));
  KILN_RETURN_IF_ERROR(AddRandomTensor(w, "blk.0.attn_q.weight", GgmlType::kQ4_0, {32, 32}, &rng));
  KILN_RETURN_IF_ERROR(AddRandomTensor(w, "blk.0.attn_k.weight", GgmlType::kF16, {32, 16}, &rng));
  KILN_RETURN_IF_ERROR(AddRandomTensor(w, "blk.0.ffn_up.weight", GgmlType::kQ4_1, {32, 2}, &rng));
  return AddRandomTensor(w, "output_norm.weight", GgmlType::kF32, {32}, &rng);
}

absl::Status KquantTensors(GgufWriter* w) {
  Bytes rng(2);
  struct Entry {
    const char* name;
    GgmlType type;
    std::vector<uint64_t> ne;
  };
  const Entry entries[] = {
      {"q2k", GgmlType::kQ2_K, {256}},     {"q3k", GgmlType::kQ3_K, {256}},
      {"q4k", GgmlType::kQ4_K, {256}},     {"q5k", GgmlType::kQ5_K, {256}},
      {"q6k", GgmlType::kQ6_K, {256}},     {"q5_0", GgmlType::kQ5_0, {256}},
      {"q5_1", GgmlType::kQ5_1, {256}},    {"q8_1", GgmlType::kQ8_1, {32, 2}},
      {"iq4_nl", GgmlType::kIQ4_NL, {32}}, {"bf16", GgmlType::kBF16, {2, 2, 2}},
      {"i8", GgmlType::kI8, {8}},          {"i16", GgmlType::kI16, {4, 2}},
      {"i32", GgmlType::kI32, {4, 3}},     {"i64", GgmlType::kI64, {3}},
      {"f64", GgmlType::kF64, {2, 2}},
  };
  for (const Entry& e : entries) {
    KILN_RETURN_IF_ERROR(AddRandomTensor(w, e.name, e.type, e.ne, &rng));
  }
  return absl::OkStatus();
}

absl::Status Aligned64(GgufWriter* w) {
  Bytes rng(3);
  w->SetString("general.name", "alignment 64");
  KILN_RETURN_IF_ERROR(AddRandomTensor(w, "a", GgmlType::kF32, {5}, &rng));
  return AddRandomTensor(w, "b", GgmlType::kF32, {3, 2}, &rng);
}

absl::Status Aligned1(GgufWriter* w) {
  Bytes rng(4);
  w->SetString("general.name", "alignment 1");
  // 3 bytes, then 2·1·3·1 f16 = 12 bytes, then 1 f32: offsets 0, 3, 15 (no padding).
  KILN_RETURN_IF_ERROR(AddRandomTensor(w, "odd_i8", GgmlType::kI8, {3}, &rng));
  KILN_RETURN_IF_ERROR(AddRandomTensor(w, "f16_4d", GgmlType::kF16, {2, 1, 3, 1}, &rng));
  return AddRandomTensor(w, "one_f32", GgmlType::kF32, {1}, &rng);
}

absl::StatusOr<FuzzSeed> Finish(std::string name, const GgufWriter& w) {
  KILN_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, w.WriteToBuffer());
  return FuzzSeed{std::move(name), std::move(bytes)};
}

}  // namespace

absl::StatusOr<std::vector<FuzzSeed>> BuildFuzzSeeds() {
  std::vector<FuzzSeed> seeds;
  {
    GgufWriter w = NewWriter();
    KILN_ASSIGN_OR_RETURN(FuzzSeed s, Finish("empty.gguf", w));
    seeds.push_back(std::move(s));
  }
  {
    GgufWriter w = NewWriter();
    AllValueTypes(&w);
    KILN_ASSIGN_OR_RETURN(FuzzSeed s, Finish("all_value_types.gguf", w));
    seeds.push_back(std::move(s));
  }
  for (const uint32_t version : {3u, 2u}) {
    GgufWriter w = NewWriter(version);
    KILN_RETURN_IF_ERROR(TinyModel(&w));
    KILN_ASSIGN_OR_RETURN(FuzzSeed s,
                          Finish(version == 3 ? "tiny_model.gguf" : "tiny_model_v2.gguf", w));
    seeds.push_back(std::move(s));
  }
  {
    GgufWriter w = NewWriter();
    KILN_RETURN_IF_ERROR(KquantTensors(&w));
    KILN_ASSIGN_OR_RETURN(FuzzSeed s, Finish("kquant_tensors.gguf", w));
    seeds.push_back(std::move(s));
  }
  {
    GgufWriter w = NewWriter(3, 64);
    KILN_RETURN_IF_ERROR(Aligned64(&w));
    KILN_ASSIGN_OR_RETURN(FuzzSeed s, Finish("aligned64.gguf", w));
    seeds.push_back(std::move(s));
  }
  {
    GgufWriter w = NewWriter(2, 1);
    KILN_RETURN_IF_ERROR(Aligned1(&w));
    KILN_ASSIGN_OR_RETURN(FuzzSeed s, Finish("aligned1_v2.gguf", w));
    seeds.push_back(std::move(s));
  }
  return seeds;
}

absl::StatusOr<std::vector<std::string>> WriteFuzzSeeds(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(StrCat("fuzz seeds: cannot create ", dir, ": ", ec.message()));
  KILN_ASSIGN_OR_RETURN(const std::vector<FuzzSeed> seeds, BuildFuzzSeeds());
  std::vector<std::string> paths;
  for (const FuzzSeed& s : seeds) {
    const std::string path = (std::filesystem::path(dir) / s.name).string();
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(s.bytes.data()),
              static_cast<std::streamsize>(s.bytes.size()));
    out.close();
    if (!out) return absl::InternalError(StrCat("fuzz seeds: cannot write ", path));
    paths.push_back(path);
  }
  return paths;
}

}  // namespace kiln::fuzz
