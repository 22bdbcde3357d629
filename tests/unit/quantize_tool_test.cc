// kiln-quantize's library half (lib/quant/requantize.h) on tiny random models: every tensor is
// present with the right type and shape, decoded values stay within the target type's error
// bound of the source's decoded values, row-length fallbacks follow llama-quantize, metadata is
// preserved (general.file_type updated), and the written file loads as a model.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "lib/gguf/file_type.h"
#include "lib/model/model.h"
#include "lib/model/random_model.h"
#include "lib/quant/quant.h"
#include "lib/quant/requantize.h"
#include "tests/common/test_util.h"

namespace kiln {
namespace {

// Extra tensors whose rows do not fit a 256-element block (K-quant fallback to a 32-element
// type) or any block (fallback to f16).
constexpr int64_t kNarrowRow = 96, kOddRow = 40;

// Writes a random tiny model whose matrices are `source_type`, plus the two extra tensors.
std::string MakeSource(const std::string& source_type, const std::string& name) {
  RandomModelOptions options;
  auto shape = RandomModelShapeByName("tiny-llama-gqa");
  EXPECT_TRUE(shape.ok());
  options.shape = *shape;
  auto type = gguf::WeightTypeByName(source_type);
  EXPECT_TRUE(type.ok());
  options.type = *type;
  options.seed = 11;
  gguf::GgufWriter writer;
  EXPECT_TRUE(BuildRandomModel(options, &writer).ok());
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  for (auto [tensor, n_in] :
       {std::pair{"extra.narrow.weight", kNarrowRow}, std::pair{"extra.odd.weight", kOddRow}}) {
    std::vector<float> values(static_cast<size_t>(n_in) * 3);  // [3, n_in]
    for (float& v : values) v = normal(rng);
    std::vector<uint8_t> bytes(values.size() * sizeof(float));
    std::memcpy(bytes.data(), values.data(), bytes.size());
    EXPECT_TRUE(
        writer.AddTensor(tensor, 0, {static_cast<uint64_t>(n_in), 3}, std::move(bytes)).ok());
  }
  const std::string path = testing::TempDir() + "/" + name + ".gguf";
  EXPECT_TRUE(writer.WriteToFile(path).ok());
  return path;
}

std::vector<float> Decode(const gguf::TensorInfo& t) {
  std::vector<float> out(t.n_elements);
  const QuantKernels* kernels = GetQuantKernels(static_cast<GgmlType>(t.type));
  EXPECT_NE(kernels, nullptr) << t.name;
  const int64_t n_in = static_cast<int64_t>(t.ne[0]);
  const size_t row_bytes = GgmlRowBytes(*GgmlTypeInfoOf(t.type), t.ne[0]);
  for (uint64_t r = 0; r < t.n_elements / t.ne[0]; ++r) {
    kernels->dequantize(t.data + r * row_bytes, out.data() + r * n_in, n_in);
  }
  return out;
}

struct TargetBound {
  const char* type;
  // Max |requantized - source| over a destination block, relative to that block's max |source|.
  // Derived from each format's step (see the comment at INSTANTIATE_TEST_SUITE_P).
  double bound;
};

class Requantize : public ::testing::TestWithParam<std::tuple<std::string, TargetBound>> {};

TEST_P(Requantize, TensorsTypesValuesAndMetadata) {
  const auto& [source_type, tb] = GetParam();
  const std::string in_path = MakeSource(source_type, "src-" + source_type + "-" + tb.type);
  const std::string out_path = testing::TempDir() + "/out-" + source_type + "-" + tb.type + ".gguf";
  auto target = gguf::WeightTypeByName(tb.type);
  ASSERT_TRUE(target.ok());
  RequantizeOptions options;
  options.target = static_cast<GgmlType>(*target);
  RequantizeStats stats;
  ASSERT_TRUE(RequantizeFile(in_path, out_path, options, &stats).ok());

  auto in = gguf::GgufFile::Open(in_path);
  ASSERT_TRUE(in.ok()) << in.status();
  auto out = gguf::GgufFile::Open(out_path);
  ASSERT_TRUE(out.ok()) << out.status();

  // Metadata: the same keys in the same order with the same bytes, except general.file_type.
  ASSERT_EQ((*out)->metadata().size(), (*in)->metadata().size());
  for (size_t i = 0; i < (*in)->metadata().size(); ++i) {
    const gguf::KeyValue& a = (*in)->metadata()[i];
    const gguf::KeyValue& b = (*out)->metadata()[i];
    ASSERT_EQ(a.key, b.key) << "key " << i;
    if (a.key == "general.file_type") {
      auto ft = (*out)->GetUint("general.file_type");
      ASSERT_TRUE(ft.ok());
      EXPECT_EQ(*ft, gguf::FileTypeOf(*target));
      continue;
    }
    EXPECT_EQ(a.type, b.type) << a.key;
    EXPECT_EQ(a.array_count, b.array_count) << a.key;
    ASSERT_EQ(a.value_size, b.value_size) << a.key;
    EXPECT_EQ(std::memcmp(a.value_data, b.value_data, a.value_size), 0) << a.key;
  }

  // Tensors: same names, order and shapes; the expected types; values within the bound.
  ASSERT_EQ((*out)->tensors().size(), (*in)->tensors().size());
  int fallbacks = 0;
  double worst = 0;
  for (size_t i = 0; i < (*in)->tensors().size(); ++i) {
    const gguf::TensorInfo& a = (*in)->tensors()[i];
    const gguf::TensorInfo& b = (*out)->tensors()[i];
    SCOPED_TRACE(a.name);
    ASSERT_EQ(a.name, b.name);
    ASSERT_EQ(a.ne, b.ne);
    if (a.ne.size() < 2) {  // norms: unchanged bytes
      EXPECT_EQ(b.type, a.type);
      ASSERT_EQ(a.nbytes, b.nbytes);
      EXPECT_EQ(std::memcmp(a.data, b.data, a.nbytes), 0);
      continue;
    }
    GgmlType expected = static_cast<GgmlType>(*target);
    if (a.ne[0] == kOddRow) {
      expected = GgmlType::kF16;
    } else if (a.ne[0] == kNarrowRow && *target >= static_cast<uint32_t>(GgmlType::kQ2_K)) {
      expected = *target == static_cast<uint32_t>(GgmlType::kQ4_K)   ? GgmlType::kQ5_0
                 : *target == static_cast<uint32_t>(GgmlType::kQ5_K) ? GgmlType::kQ5_1
                                                                     : GgmlType::kQ8_0;
    }
    EXPECT_EQ(b.type, static_cast<uint32_t>(expected)) << GgmlTypeName(b.type);
    if (expected != static_cast<GgmlType>(*target)) ++fallbacks;

    const std::vector<float> src = Decode(a);
    const std::vector<float> dst = Decode(b);
    const uint32_t block = GgmlTypeInfoOf(b.type)->block_size;
    double type_bound = tb.bound;
    if (b.type == static_cast<uint32_t>(GgmlType::kF16)) type_bound = 1e-3;
    if (b.type == static_cast<uint32_t>(GgmlType::kQ8_0)) type_bound = 1.0 / 127;
    if (b.type == static_cast<uint32_t>(GgmlType::kQ5_0)) type_bound = 1.0 / 16 + 3e-3;
    if (b.type == static_cast<uint32_t>(GgmlType::kQ5_1)) type_bound = 1.0 / 31 + 3e-3;
    // Plain types: groups of 8 (a divisor of every row length here).
    const size_t bsize = block == 1 ? 8 : block;
    for (size_t start = 0; start < src.size(); start += bsize) {
      double amax = 0, err = 0;
      for (size_t k = start; k < start + bsize; ++k) {
        amax = std::max(amax, std::abs(static_cast<double>(src[k])));
        err = std::max(err, std::abs(static_cast<double>(dst[k]) - src[k]));
      }
      if (amax == 0) {
        ASSERT_EQ(err, 0) << "block at element " << start;
        continue;
      }
      if (b.type == static_cast<uint32_t>(options.target)) worst = std::max(worst, err / amax);
      ASSERT_LE(err, type_bound * amax) << "block at element " << start << " of " << a.name;
    }
  }
  std::printf("%s -> %s: worst block error %.4f of the block max (bound %.4f)\n",
              source_type.c_str(), tb.type, worst, tb.bound);
  EXPECT_EQ(stats.tensors_fell_back, fallbacks);
  EXPECT_EQ(stats.tensors_requantized + stats.tensors_copied,
            static_cast<int>((*in)->tensors().size()));
  EXPECT_GT(worst, 0.0) << "the requantized values should not all be exact";

  // The written file loads as a model (without the two extra tensors it would be the same).
  ModelLoadOptions load;
  load.path = out_path;
  auto model = Model::Load(load);
  EXPECT_TRUE(model.ok()) << model.status();
}

// Bounds, relative to the max |x| of each destination block: q8_0 round-to-nearest with
// d = amax/127 gives <= 1/254 (bound 1/127). q4_0: d = max/-8 maps the max to -8 exactly, but
// values of the other sign saturate at 7|d| = 7/8 amax: <= 1/8. q4_1: (max - min)/15/2 <= 1/15.
// q5_0: 1/16; q5_1: 1/31 (each + 3e-3 for the f16 rounding of the block's d and m). f16: 2^-11
// of each value, bounded at 1e-3 of the max of each group of 8. K-quants also quantize their
// sub-block scales (6- or 8-bit) and are measured against the 256-element super-block's max: q6_K
// ~1/64 + scale rounding (bound 0.04), q5_K 0.06, q4_K 0.12, q3_K 0.3, q2_K 0.5 (measured: 0.028,
// 0.032, 0.066, 0.250, 0.332).
INSTANTIATE_TEST_SUITE_P(
    TinyModels, Requantize,
    ::testing::Combine(::testing::Values("f32", "q4_1"),
                       ::testing::Values(TargetBound{"q8_0", 1.0 / 127}, TargetBound{"q4_0", 0.13},
                                         TargetBound{"q4_1", 1.0 / 15 + 3e-3},
                                         TargetBound{"q5_0", 1.0 / 16 + 3e-3},
                                         TargetBound{"q5_1", 1.0 / 31 + 3e-3},
                                         TargetBound{"q6_K", 0.04}, TargetBound{"q5_K", 0.06},
                                         TargetBound{"q4_K", 0.12}, TargetBound{"q3_K", 0.3},
                                         TargetBound{"q2_K", 0.5}, TargetBound{"f16", 1e-3})),
    [](const auto& info) {
      return std::get<0>(info.param) + "_to_" + std::string(std::get<1>(info.param).type);
    });

TEST(RequantizeOptions, KeepOutputTypeCopiesTheTiedHead) {
  RandomModelOptions options;
  auto shape = RandomModelShapeByName("tiny-llama-gqa");
  ASSERT_TRUE(shape.ok());
  options.shape = *shape;
  options.shape.tied_output = true;
  options.type = static_cast<uint32_t>(GgmlType::kQ4_1);
  gguf::GgufWriter writer;
  ASSERT_TRUE(BuildRandomModel(options, &writer).ok());
  auto bytes = writer.WriteToBuffer();
  ASSERT_TRUE(bytes.ok());
  auto in = gguf::GgufFile::Parse(bytes->data(), bytes->size());
  ASSERT_TRUE(in.ok()) << in.status();
  ASSERT_EQ((*in)->FindTensor("output.weight"), nullptr);

  for (bool keep : {false, true}) {
    RequantizeOptions ro;
    ro.target = GgmlType::kQ8_0;
    ro.keep_output_type = keep;
    gguf::GgufWriter out_writer;
    ASSERT_TRUE(RequantizeModel(**in, ro, &out_writer).ok());
    auto out_bytes = out_writer.WriteToBuffer();
    ASSERT_TRUE(out_bytes.ok());
    auto out = gguf::GgufFile::Parse(out_bytes->data(), out_bytes->size());
    ASSERT_TRUE(out.ok()) << out.status();
    const gguf::TensorInfo* embd = (*out)->FindTensor("token_embd.weight");
    ASSERT_NE(embd, nullptr);
    EXPECT_EQ(embd->type, keep ? static_cast<uint32_t>(GgmlType::kQ4_1)
                               : static_cast<uint32_t>(GgmlType::kQ8_0));
    EXPECT_EQ((*out)->FindTensor("blk.0.attn_q.weight")->type,
              static_cast<uint32_t>(GgmlType::kQ8_0));
  }
}

TEST(RequantizeOptions, RejectsATargetKilnCannotWrite) {
  RandomModelOptions options;
  auto shape = RandomModelShapeByName("tiny-llama-gqa");
  ASSERT_TRUE(shape.ok());
  options.shape = *shape;
  options.type = static_cast<uint32_t>(GgmlType::kF32);
  gguf::GgufWriter writer;
  ASSERT_TRUE(BuildRandomModel(options, &writer).ok());
  auto bytes = writer.WriteToBuffer();
  ASSERT_TRUE(bytes.ok());
  auto in = gguf::GgufFile::Parse(bytes->data(), bytes->size());
  ASSERT_TRUE(in.ok());
  RequantizeOptions ro;
  ro.target = GgmlType::kIQ2_XXS;
  gguf::GgufWriter out_writer;
  const absl::Status s = RequantizeModel(**in, ro, &out_writer);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("iq2_xxs"), std::string::npos) << s;
}

}  // namespace
}  // namespace kiln
