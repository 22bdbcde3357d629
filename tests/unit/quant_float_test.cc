// Float element types (F32, F16, BF16 weights; F32 activations): conversions by hand, SIMD vs
// scalar identity, and dot products at every CPU level this machine has.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "lib/common/half.h"
#include "lib/quant/quant.h"

namespace kiln {
namespace {

constexpr double kU = 1.0 / (1 << 24);

std::vector<CpuLevel> Levels() {
  std::vector<CpuLevel> levels;
  for (int l = 0; l <= static_cast<int>(BestCpuLevel()); ++l) {
    levels.push_back(static_cast<CpuLevel>(l));
  }
  return levels;
}

const QuantKernels& Kernels(GgmlType t, CpuLevel level) {
  const QuantKernels* k = GetQuantKernels(t, level);
  if (k == nullptr) {
    ADD_FAILURE() << "no kernels for type " << static_cast<int>(t);
    static const QuantKernels empty{};
    return empty;
  }
  return *k;
}

size_t ElemBytes(GgmlType t) { return t == GgmlType::kF32 ? 4 : 2; }

std::vector<uint8_t> Quantize(GgmlType t, const std::vector<float>& x, CpuLevel level) {
  std::vector<uint8_t> y(x.size() * ElemBytes(t));
  Kernels(t, level).quantize(x.data(), y.data(), static_cast<int64_t>(x.size()));
  return y;
}
std::vector<float> Dequantize(GgmlType t, const std::vector<uint8_t>& y, CpuLevel level) {
  std::vector<float> x(y.size() / ElemBytes(t));
  Kernels(t, level).dequantize(y.data(), x.data(), static_cast<int64_t>(x.size()));
  return x;
}
uint16_t Elem16(const std::vector<uint8_t>& y, size_t i) {
  uint16_t v;
  std::memcpy(&v, &y[2 * i], 2);
  return v;
}

TEST(QuantFloat, ReportsLevelsAndPairs) {
  std::string names;
  for (CpuLevel l : Levels()) names += std::string(" ") + CpuLevelName(l);
  std::cout << "[quant_float] levels tested:" << names << "\n";
  for (CpuLevel level : Levels()) {
    for (GgmlType t : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16}) {
      EXPECT_EQ(Kernels(t, level).vec_dot_type, GgmlType::kF32);
    }
  }
}

TEST(QuantFloat, F16ConversionsByHand) {
  const std::vector<float> x = {
      1.0f,          -2.0f,         65504.0f,     65520.0f,
      1e-8f,         5.9604645e-8f, 0.333333343f, 1.00048828125f /* tie -> even: 1.0 */,
      1.00146484375f /* tie -> even: 1.001953125 */};
  const uint16_t expect[] = {0x3C00, 0xC000, 0x7BFF, 0x7C00, 0x0000,
                             0x0001, 0x3555, 0x3C00, 0x3C02};
  for (CpuLevel level : Levels()) {
    const std::vector<uint8_t> y = Quantize(GgmlType::kF16, x, level);
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(Elem16(y, i), expect[i]) << i << " at " << CpuLevelName(level);
    }
    const std::vector<float> back = Dequantize(GgmlType::kF16, y, level);
    EXPECT_EQ(back[0], 1.0f);
    EXPECT_EQ(back[2], 65504.0f);
    EXPECT_TRUE(std::isinf(back[3]));
    EXPECT_EQ(back[5], 5.9604645e-8f);
  }
}

TEST(QuantFloat, Bf16ConversionsByHand) {
  const std::vector<float> x = {1.0f,
                                Fp32FromBits(0x3F808000) /* tie -> even 0x3F80 */,
                                Fp32FromBits(0x3F818000) /* tie -> even 0x3F82 */,
                                Fp32FromBits(0x3F808001) /* above tie -> 0x3F81 */,
                                Fp32FromBits(0x00000001) /* denormal -> 0 */,
                                Fp32FromBits(0x7F7FFFFF) /* max float rounds to inf */};
  const uint16_t expect[] = {0x3F80, 0x3F80, 0x3F82, 0x3F81, 0x0000, 0x7F80};
  for (CpuLevel level : Levels()) {
    const std::vector<uint8_t> y = Quantize(GgmlType::kBF16, x, level);
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(Elem16(y, i), expect[i]) << i << " at " << CpuLevelName(level);
    }
    const std::vector<float> back = Dequantize(GgmlType::kBF16, y, level);
    EXPECT_EQ(Fp32ToBits(back[1]), 0x3F800000u);
    EXPECT_EQ(Fp32ToBits(back[3]), 0x3F810000u);
  }
}

// Random finite values over the whole f16 range (normals, subnormals, overflow), every tail
// length: SIMD conversions give the scalar bits; NaN stays NaN.
TEST(QuantFloat, SimdConversionsMatchScalar) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> expo(-30.0f, 17.0f);
  std::uniform_int_distribution<int> bits(0, 0x7FFFFFFF);
  for (int n : {1, 7, 8, 9, 15, 16, 17, 31, 33, 100, 1000}) {
    std::vector<float> x(n);
    for (int i = 0; i < n; ++i) {
      x[i] = (i % 2 ? -1.0f : 1.0f) * std::exp2(expo(rng));
      if (i % 5 == 4) x[i] = Fp32FromBits(static_cast<uint32_t>(bits(rng)) & 0x7F7FFFFF);
    }
    for (GgmlType t : {GgmlType::kF16, GgmlType::kBF16, GgmlType::kF32}) {
      const std::vector<uint8_t> ref = Quantize(t, x, CpuLevel::kScalar);
      const std::vector<float> ref_back = Dequantize(t, ref, CpuLevel::kScalar);
      for (CpuLevel level : Levels()) {
        EXPECT_EQ(Quantize(t, x, level), ref) << "type " << static_cast<int>(t) << " n " << n;
        const std::vector<float> back = Dequantize(t, ref, level);
        EXPECT_EQ(std::memcmp(back.data(), ref_back.data(), back.size() * 4), 0);
      }
    }
  }
  const std::vector<float> nan = {std::numeric_limits<float>::quiet_NaN(),
                                  -1.0f,
                                  2.0f,
                                  3.0f,
                                  4.0f,
                                  5.0f,
                                  6.0f,
                                  7.0f,
                                  8.0f,
                                  9.0f,
                                  10.0f,
                                  11.0f,
                                  12.0f,
                                  13.0f,
                                  14.0f,
                                  std::numeric_limits<float>::quiet_NaN()};
  for (CpuLevel level : Levels()) {
    for (GgmlType t : {GgmlType::kF16, GgmlType::kBF16}) {
      const std::vector<float> back = Dequantize(t, Quantize(t, nan, level), level);
      EXPECT_TRUE(std::isnan(back[0]));
      EXPECT_TRUE(std::isnan(back[15]));
      EXPECT_EQ(back[1], -1.0f);
    }
  }
}

// Dot bound: the order (64 lanes + a log tree, the same at every level) has at most n additions
// on any path plus one product rounding, so |got - exact| <= (n + 2) u Σ|w_i a_i| (first order;
// exact = float64 sum of the stored weight values times the activations). Every level gives the
// scalar reference's bits.
TEST(QuantFloat, DotProducts) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  for (int64_t n : {1, 7, 31, 32, 33, 63, 64, 65, 100, 4096, 4097}) {
    std::vector<float> wx(n), ax(n);
    for (int64_t i = 0; i < n; ++i) {
      wx[i] = 3.0f * unit(rng);
      ax[i] = unit(rng) + 0.25f;
    }
    for (GgmlType t : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16}) {
      const std::vector<uint8_t> w = Quantize(t, wx, CpuLevel::kScalar);
      const std::vector<float> wf = Dequantize(t, w, CpuLevel::kScalar);
      double exact = 0.0, sum_abs = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        exact += static_cast<double>(wf[i]) * ax[i];
        sum_abs += std::fabs(static_cast<double>(wf[i]) * ax[i]);
      }
      const double bound = static_cast<double>(n + 2) * kU * sum_abs;
      const float scalar = Kernels(t, CpuLevel::kScalar).vec_dot(n, w.data(), ax.data());
      for (CpuLevel level : Levels()) {
        SCOPED_TRACE("type " + std::to_string(static_cast<int>(t)) + " at " + CpuLevelName(level) +
                     " n " + std::to_string(n));
        const float got = Kernels(t, level).vec_dot(n, w.data(), ax.data());
        EXPECT_LE(std::fabs(got - exact), bound);
        EXPECT_LE(std::fabs(static_cast<double>(got) - scalar), 2 * bound);
        // One order at every level: the scalar reference's bits.
        EXPECT_EQ(Fp32ToBits(got), Fp32ToBits(scalar)) << got << " vs " << scalar;
        EXPECT_EQ(Fp32ToBits(Kernels(t, level).vec_dot(n, w.data(), ax.data())), Fp32ToBits(got));
        // Misaligned rows give the same bits.
        std::vector<uint8_t> wm(w.size() + 1);
        std::vector<uint8_t> am(ax.size() * 4 + 2);
        std::memcpy(wm.data() + 1, w.data(), w.size());
        std::memcpy(am.data() + 2, ax.data(), ax.size() * 4);
        EXPECT_EQ(Fp32ToBits(Kernels(t, level).vec_dot(
                      n, wm.data() + 1, reinterpret_cast<const float*>(am.data() + 2))),
                  Fp32ToBits(got));
      }
    }
  }
}

TEST(QuantFloat, DotExtremes) {
  const int64_t n = 77;
  for (GgmlType t : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16}) {
    for (CpuLevel level : Levels()) {
      const std::vector<float> zeros(n, 0.0f), ones(n, 1.0f);
      EXPECT_EQ(Kernels(t, level).vec_dot(n, Quantize(t, zeros, level).data(), ones.data()), 0.0f);
      // Exactly representable: 77 * (2 * 0.5) = 77 at every level and order.
      const std::vector<float> twos(n, 2.0f), halves(n, 0.5f);
      EXPECT_EQ(Kernels(t, level).vec_dot(n, Quantize(t, twos, level).data(), halves.data()),
                77.0f);
      // Large weights (f16 max) times small activations stay finite and exact (powers of two).
      const std::vector<float> big(n, 32768.0f), tiny(n, 1.0f / 1024);
      EXPECT_EQ(Kernels(t, level).vec_dot(n, Quantize(t, big, level).data(), tiny.data()),
                77.0f * 32.0f);
    }
  }
}

}  // namespace
}  // namespace kiln
