// Multi-row dot kernels (QuantKernels::vec_dot_rows) against vec_dot: bitwise equal for every
// type and CPU level that has one, every row count (full groups of 4 and the 1-3 left), and
// row lengths whose block count leaves every remainder of the 4-block groups. Plus MatMul on
// such types: each output equals vec_dot bitwise (the batch-invariance contract).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "lib/backend/cpu/ops.h"
#include "lib/common/ggml_type.h"
#include "lib/quant/activation.h"
#include "lib/quant/quant.h"

namespace kiln {
namespace {

constexpr GgmlType kAllTypes[] = {
    GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ4_0, GgmlType::kQ4_1,
    GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0, GgmlType::kQ8_1, GgmlType::kQ2_K,
    GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K};

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

size_t RowBytes(GgmlType t, int64_t n) {
  return GgmlRowBytes(*GgmlTypeInfoOf(static_cast<uint32_t>(t)), n);
}

// Quantized random rows of `type` (scalar quantizer, so every level sees the same bytes).
std::vector<uint8_t> RandomRows(GgmlType type, int64_t n, int rows, std::mt19937& rng) {
  const QuantKernels* ref = GetQuantKernels(type, CpuLevel::kScalar);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n);
  std::vector<uint8_t> out(RowBytes(type, n) * rows);
  for (int r = 0; r < rows; ++r) {
    for (float& v : x) v = dist(rng);
    ref->quantize(x.data(), out.data() + r * RowBytes(type, n), n);
  }
  return out;
}

TEST(VecDotRows, BitwiseEqualToVecDot) {
  std::mt19937 rng(11);
  int covered = 0;
  for (CpuLevel level : {CpuLevel::kScalar, CpuLevel::kAvx2, CpuLevel::kAvx512}) {
    if (static_cast<int>(level) > static_cast<int>(BestCpuLevel())) continue;
    for (GgmlType type : kAllTypes) {
      const QuantKernels* k = GetQuantKernels(type, level);
      if (k == nullptr || k->vec_dot_rows == nullptr) continue;
      ++covered;
      const int block = GgmlTypeInfoOf(static_cast<uint32_t>(type))->block_size;
      for (int64_t n : {1, 2, 3, 4, 5, 6, 7, 18, 48}) {
        n *= block;
        constexpr int kMaxRows = 11;
        const std::vector<uint8_t> w = RandomRows(type, n, kMaxRows, rng);
        const std::vector<uint8_t> a = RandomRows(k->vec_dot_type, n, 1, rng);
        const size_t stride = RowBytes(type, n);
        for (int rows = 0; rows <= kMaxRows; ++rows) {
          std::vector<float> got(kMaxRows + 1, 123.0f);
          k->vec_dot_rows(n, w.data(), stride, rows, a.data(), got.data());
          for (int r = 0; r < rows; ++r) {
            const float want = k->vec_dot(n, w.data() + r * stride, a.data());
            ASSERT_EQ(Bits(got[r]), Bits(want))
                << GgmlTypeName(static_cast<uint32_t>(type)) << " level " << CpuLevelName(level)
                << " n " << n << " rows " << rows << " row " << r << ": " << got[r] << " vs "
                << want;
          }
          // Nothing written past n_rows.
          for (int r = rows; r <= kMaxRows; ++r) ASSERT_EQ(got[r], 123.0f);
        }
      }
    }
  }
  if (BestCpuLevel() == CpuLevel::kAvx512) {
    // Q4_0, Q4_1, Q5_0, Q5_1 have AVX-512 multi-row kernels.
    EXPECT_GE(covered, 4);
  }
}

// MatMul on types with multi-row kernels: every output is exactly vec_dot of its weight row and
// its token's quantized activations, for several token counts and thread counts.
TEST(VecDotRows, MatMulOutputsEqualVecDot) {
  std::mt19937 rng(5);
  for (GgmlType type :
       {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0}) {
    const QuantKernels* k = GetQuantKernels(type);
    ASSERT_NE(k, nullptr);
    const QuantizeRowFn quantize_act = ActivationQuantizer(k->vec_dot_type, BestCpuLevel());
    const int64_t n_in = 160, n_out = 37;  // 5 blocks; 37 rows = 2 chunks + 5
    const std::vector<uint8_t> w = RandomRows(type, n_in, n_out, rng);
    cpu::WeightView view{type, w.data(), n_in, n_out};
    for (int threads : {1, 2, 3}) {
      cpu::ThreadPool pool(threads);
      cpu::Scratch scratch;
      for (int64_t n_tokens : {1, 3, 40}) {
        std::normal_distribution<float> dist(0.0f, 1.0f);
        std::vector<float> x(n_tokens * n_in);
        for (float& v : x) v = dist(rng);
        std::vector<float> y(n_tokens * n_out);
        ASSERT_TRUE(cpu::MatMul(pool, view, x.data(), n_tokens, y.data(), scratch).ok());
        std::vector<uint8_t> qa(RowBytes(k->vec_dot_type, n_in));
        for (int64_t t = 0; t < n_tokens; ++t) {
          quantize_act(x.data() + t * n_in, qa.data(), n_in);
          for (int64_t o = 0; o < n_out; ++o) {
            const float want = k->vec_dot(n_in, w.data() + o * RowBytes(type, n_in), qa.data());
            ASSERT_EQ(Bits(y[t * n_out + o]), Bits(want))
                << GgmlTypeName(static_cast<uint32_t>(type)) << " threads " << threads << " tokens "
                << n_tokens << " t " << t << " o " << o;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kiln
