// MatMul's activation quantizers (lib/quant/activation.h) and the Q4_1 x Q8_1 dot in ggml's x86
// order: every CPU level gives the same bytes / bits, and the rounding rules are ggml's.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "lib/common/half.h"
#include "lib/quant/activation.h"
#include "lib/quant/legacy_kernels.h"
#include "lib/quant/quant.h"

namespace kiln {
namespace {

std::vector<CpuLevel> Levels() {
  std::vector<CpuLevel> levels;
  for (CpuLevel l : {CpuLevel::kScalar, CpuLevel::kAvx2, CpuLevel::kAvx512}) {
    if (l <= BestCpuLevel()) levels.push_back(l);
  }
  return levels;
}

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// Ties round to even and the scale is 127 / amax (ggml's x86 quantize_row_q8_1), where ggml's
// reference quantizer (kiln's QuantKernels::quantize) rounds ties away from zero.
TEST(ActivationQuantizer, RoundsHalfToEvenWithScale127OverAmax) {
  std::vector<float> x(32, 0.0f);
  x[0] = 127.0f;  // amax 127: id = 1, so x * id is x itself
  x[1] = 2.5f;
  x[2] = -3.5f;
  x[3] = 0.5f;
  for (CpuLevel level : Levels()) {
    SCOPED_TRACE(CpuLevelName(level));
    quant::BlockQ8_1 b{};
    ActivationQuantizer(GgmlType::kQ8_1, level)(x.data(), &b, 32);
    EXPECT_EQ(b.qs[0], 127);
    EXPECT_EQ(b.qs[1], 2);
    EXPECT_EQ(b.qs[2], -4);
    EXPECT_EQ(b.qs[3], 0);
    EXPECT_EQ(quant::LoadHalf(b.d), 1.0f);
    EXPECT_EQ(quant::LoadHalf(b.s), 125.0f);  // d * (127 + 2 - 4 + 0)
    quant::BlockQ8_0 b0{};
    ActivationQuantizer(GgmlType::kQ8_0, level)(x.data(), &b0, 32);
    EXPECT_EQ(0, std::memcmp(b0.qs, b.qs, 32));
  }
  quant::BlockQ8_1 ref{};
  GetQuantKernels(GgmlType::kQ8_1)->quantize(x.data(), &ref, 32);
  EXPECT_EQ(ref.qs[1], 3) << "the reference quantizer rounds ties away from zero";
}

TEST(ActivationQuantizer, EveryLevelGivesTheSameBytes) {
  // 43 blocks: whole groups of 8 and 16 blocks (the SIMD forms' vectors of scales) and a tail.
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  const int64_t n = 32 * 43;
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  std::fill(x.begin() + 64, x.begin() + 96, 0.0f);  // an all-zero block: d = 0, q = 0
  x[32 * 17 + 5] = 1e7f;                            // d = 78740 rounds to an infinite f16
  std::fill(x.begin() + 32 * 19, x.begin() + 32 * 20, 1e-6f);     // d is an f16 subnormal
  x[32 * 41 + 3] = -x[32 * 41 + 3] * 1e3f;                        // amax from a negative element
  for (int j = 0; j < 32; ++j) x[32 * 42 + j] = (j - 16) * 0.5f;  // ties at every step
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ8_1}) {
    const size_t bytes = (type == GgmlType::kQ8_0 ? 34 : 36) * (n / 32);
    std::vector<uint8_t> want(bytes), got(bytes);
    ActivationQuantizer(type, CpuLevel::kScalar)(x.data(), want.data(), n);
    for (CpuLevel level : Levels()) {
      ActivationQuantizer(type, level)(x.data(), got.data(), n);
      EXPECT_EQ(want, got) << GgmlTypeName(static_cast<uint32_t>(type)) << " at "
                           << CpuLevelName(level);
    }
  }
}

// The Q4_1 dot follows ggml's x86 order at every level, so all levels agree bit for bit, and
// the multi-row kernel equals the single-row one.
TEST(Q4_1Dot, EveryLevelAndTheRowsKernelGiveTheSameBits) {
  std::mt19937 rng(12);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int64_t n = 32 * 18, rows = 7;
  const size_t row_bytes = 20 * (n / 32);
  std::vector<float> wf(n * rows), x(n);
  for (float& v : wf) v = dist(rng);
  for (float& v : x) v = dist(rng);
  std::vector<uint8_t> w(row_bytes * rows), a(36 * (n / 32));
  for (int64_t r = 0; r < rows; ++r) {
    GetQuantKernels(GgmlType::kQ4_1)->quantize(wf.data() + r * n, w.data() + r * row_bytes, n);
  }
  ActivationQuantizer(GgmlType::kQ8_1, CpuLevel::kScalar)(x.data(), a.data(), n);
  std::vector<float> want(rows);
  for (int64_t r = 0; r < rows; ++r) {
    want[r] = GetQuantKernels(GgmlType::kQ4_1, CpuLevel::kScalar)
                  ->vec_dot(n, w.data() + r * row_bytes, a.data());
  }
  for (CpuLevel level : Levels()) {
    const QuantKernels* k = GetQuantKernels(GgmlType::kQ4_1, level);
    for (int64_t r = 0; r < rows; ++r) {
      EXPECT_EQ(Bits(k->vec_dot(n, w.data() + r * row_bytes, a.data())), Bits(want[r]))
          << CpuLevelName(level) << " row " << r;
    }
    if (k->vec_dot_rows != nullptr) {
      std::vector<float> out(rows);
      k->vec_dot_rows(n, w.data(), row_bytes, static_cast<int>(rows), a.data(), out.data());
      for (int64_t r = 0; r < rows; ++r) {
        EXPECT_EQ(Bits(out[r]), Bits(want[r])) << CpuLevelName(level) << " rows kernel, row " << r;
      }
    }
  }
}

}  // namespace
}  // namespace kiln
