// Legacy block quants (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1): block layouts, quantize/dequantize
// error bounds, SIMD-vs-scalar identity, and dot products at every CPU level this machine has,
// all through GetQuantKernels(type, level).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "lib/common/half.h"
#include "lib/quant/legacy_kernels.h"
#include "lib/quant/quant.h"

namespace kiln {
namespace {

using quant::kQK;

constexpr double kU = 1.0 / (1 << 24);  // float unit roundoff
constexpr double kH = 1.0 / (1 << 11);  // f16 unit roundoff (normal range)

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
    ADD_FAILURE() << "no kernels for type " << static_cast<int>(t) << " at " << CpuLevelName(level);
    static const QuantKernels empty{};
    return empty;
  }
  return *k;
}

size_t BlockBytes(GgmlType t) { return GgmlTypeInfoOf(static_cast<uint32_t>(t))->type_size; }
size_t RowBytes(GgmlType t, int64_t n) { return static_cast<size_t>(n / kQK) * BlockBytes(t); }

uint16_t H(float f) { return Fp32ToFp16(f); }
void PutHalf(uint8_t* p, uint16_t h) { std::memcpy(p, &h, 2); }

std::vector<float> Dequantize(GgmlType t, const std::vector<uint8_t>& row, int64_t n,
                              CpuLevel level = CpuLevel::kScalar) {
  std::vector<float> out(static_cast<size_t>(n));
  Kernels(t, level).dequantize(row.data(), out.data(), n);
  return out;
}

std::vector<uint8_t> Quantize(GgmlType t, const std::vector<float>& x,
                              CpuLevel level = CpuLevel::kScalar) {
  std::vector<uint8_t> row(RowBytes(t, static_cast<int64_t>(x.size())));
  Kernels(t, level).quantize(x.data(), row.data(), static_cast<int64_t>(x.size()));
  return row;
}

// Random floats: block-wise scales in [0.05, 4] so f16 d stays in the normal range; an optional
// offset makes the _1 types' min meaningful.
std::vector<float> RandomRow(int64_t n, uint32_t seed, float offset = 0.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_real_distribution<float> scale(0.05f, 4.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float s = scale(rng);
    for (int j = 0; j < kQK; ++j) x[b * kQK + j] = offset + s * unit(rng);
  }
  return x;
}

TEST(QuantLegacy, ReportsLevels) {
  std::string names;
  for (CpuLevel l : Levels()) names += std::string(" ") + CpuLevelName(l);
  std::cout << "[quant_legacy] levels tested:" << names << "\n";
  EXPECT_FALSE(names.empty());
}

TEST(QuantLegacy, RegistryPairsAndSizes) {
  const struct {
    GgmlType w, a;
  } pairs[] = {{GgmlType::kQ4_0, GgmlType::kQ8_0}, {GgmlType::kQ4_1, GgmlType::kQ8_1},
               {GgmlType::kQ5_0, GgmlType::kQ8_0}, {GgmlType::kQ5_1, GgmlType::kQ8_1},
               {GgmlType::kQ8_0, GgmlType::kQ8_0}, {GgmlType::kQ8_1, GgmlType::kQ8_1}};
  for (CpuLevel level : Levels()) {
    for (const auto& p : pairs) {
      const QuantKernels* k = GetQuantKernels(p.w, level);
      ASSERT_NE(k, nullptr) << CpuLevelName(level);
      EXPECT_EQ(k->vec_dot_type, p.a);
      EXPECT_TRUE(k->IsSupported());
    }
  }
  EXPECT_EQ(BlockBytes(GgmlType::kQ4_0), sizeof(quant::BlockQ4_0));
  EXPECT_EQ(BlockBytes(GgmlType::kQ4_1), sizeof(quant::BlockQ4_1));
  EXPECT_EQ(BlockBytes(GgmlType::kQ5_0), sizeof(quant::BlockQ5_0));
  EXPECT_EQ(BlockBytes(GgmlType::kQ5_1), sizeof(quant::BlockQ5_1));
  EXPECT_EQ(BlockBytes(GgmlType::kQ8_0), sizeof(quant::BlockQ8_0));
  EXPECT_EQ(BlockBytes(GgmlType::kQ8_1), sizeof(quant::BlockQ8_1));
}

// --- Hand-built blocks, checked value by value at every level. -------------------------------

TEST(QuantLegacy, Q4_0LayoutByHand) {
  // d = 0.5; qs[j] = j (low nibble) | (15 - j) << 4 (high nibble).
  std::vector<uint8_t> blk(18);
  PutHalf(blk.data(), 0x3800);  // 0.5
  for (int j = 0; j < 16; ++j) blk[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  for (CpuLevel level : Levels()) {
    const std::vector<float> y = Dequantize(GgmlType::kQ4_0, blk, 32, level);
    EXPECT_EQ(y[0], -4.0f);   // (0 - 8) * 0.5
    EXPECT_EQ(y[15], 3.5f);   // (15 - 8) * 0.5
    EXPECT_EQ(y[16], 3.5f);   // high nibble of qs[0] = 15
    EXPECT_EQ(y[31], -4.0f);  // high nibble of qs[15] = 0
    EXPECT_EQ(y[9], 0.5f);    // (9 - 8) * 0.5
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(y[j], (j - 8) * 0.5f) << j;
      EXPECT_EQ(y[16 + j], (7 - j) * 0.5f) << j;
    }
  }
}

TEST(QuantLegacy, Q4_1LayoutByHand) {
  // d = 0.25, m = -1; qs[j] = (j & 15) | 3 << 4.
  std::vector<uint8_t> blk(20);
  PutHalf(blk.data(), 0x3400);      // 0.25
  PutHalf(blk.data() + 2, 0xBC00);  // -1.0
  for (int j = 0; j < 16; ++j) blk[4 + j] = static_cast<uint8_t>(j | (3 << 4));
  for (CpuLevel level : Levels()) {
    const std::vector<float> y = Dequantize(GgmlType::kQ4_1, blk, 32, level);
    EXPECT_EQ(y[0], -1.0f);   // 0 * 0.25 - 1
    EXPECT_EQ(y[15], 2.75f);  // 15 * 0.25 - 1
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(y[j], j * 0.25f - 1.0f) << j;
      EXPECT_EQ(y[16 + j], -0.25f) << j;  // 3 * 0.25 - 1
    }
  }
}

TEST(QuantLegacy, Q5_0LayoutByHand) {
  // d = 1; qs[0] = 0x3A: element 0 low nibble 10, element 16 high nibble 3.
  // qh = 0x0000'0001 | 0x8000'0000: bit 0 (element 0) and bit 31 (element 31) set.
  std::vector<uint8_t> blk(22, 0);
  PutHalf(blk.data(), 0x3C00);
  const uint32_t qh = 0x80000001u;
  std::memcpy(blk.data() + 2, &qh, 4);
  blk[6 + 0] = 0x3A;
  blk[6 + 15] = 0xF7;  // element 15: low 7, bit clear -> -9; element 31: high 15 | 16 -> 15
  for (CpuLevel level : Levels()) {
    const std::vector<float> y = Dequantize(GgmlType::kQ5_0, blk, 32, level);
    EXPECT_EQ(y[0], 10.0f);    // (10 | 16) - 16
    EXPECT_EQ(y[16], -13.0f);  // 3 - 16
    EXPECT_EQ(y[15], -9.0f);   // 7 - 16
    EXPECT_EQ(y[31], 15.0f);   // (15 | 16) - 16
    EXPECT_EQ(y[1], -16.0f);   // all-zero byte, bit clear
  }
}

TEST(QuantLegacy, Q5_1LayoutByHand) {
  // d = 0.5, m = 2; qh bits 1 and 17 set; qs[1] = 0x21 -> element 1: 1 | 16 = 17, element 17:
  // 2 | 16 = 18.
  std::vector<uint8_t> blk(24, 0);
  PutHalf(blk.data(), 0x3800);
  PutHalf(blk.data() + 2, 0x4000);
  const uint32_t qh = (1u << 1) | (1u << 17);
  std::memcpy(blk.data() + 4, &qh, 4);
  blk[8 + 1] = 0x21;
  for (CpuLevel level : Levels()) {
    const std::vector<float> y = Dequantize(GgmlType::kQ5_1, blk, 32, level);
    EXPECT_EQ(y[1], 10.5f);   // 17 * 0.5 + 2
    EXPECT_EQ(y[17], 11.0f);  // 18 * 0.5 + 2
    EXPECT_EQ(y[0], 2.0f);    // 0 * 0.5 + 2
    EXPECT_EQ(y[31], 2.0f);
  }
}

TEST(QuantLegacy, Q8LayoutsByHand) {
  std::vector<uint8_t> b0(34), b1(36);
  PutHalf(b0.data(), 0x4200);      // 3.0
  PutHalf(b1.data(), 0x3000);      // 0.125
  PutHalf(b1.data() + 2, 0x5640);  // s = 100 (ignored by dequantize)
  for (int j = 0; j < 32; ++j) {
    b0[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(j - 16));
    b1[4 + j] = static_cast<uint8_t>(static_cast<int8_t>(j == 0 ? -128 : 127 - j));
  }
  for (CpuLevel level : Levels()) {
    const std::vector<float> y0 = Dequantize(GgmlType::kQ8_0, b0, 32, level);
    const std::vector<float> y1 = Dequantize(GgmlType::kQ8_1, b1, 32, level);
    EXPECT_EQ(y0[0], -48.0f);
    EXPECT_EQ(y0[31], 45.0f);
    EXPECT_EQ(y1[0], -16.0f);  // -128 * 0.125
    EXPECT_EQ(y1[1], 15.75f);  // 126 * 0.125
  }
}

// --- Reference quantizers: hand examples and error bounds. ------------------------------------

TEST(QuantLegacy, Q8_0QuantizeByHand) {
  // amax = 127 -> d = 1, id = 1; 2.5 rounds half away from zero to 3, -2.5 to -3.
  std::vector<float> x(32, 0.0f);
  x[0] = 127.0f;
  x[1] = 2.5f;
  x[2] = -2.5f;
  x[3] = 0.49999997f;
  for (CpuLevel level : Levels()) {
    const std::vector<uint8_t> q = Quantize(GgmlType::kQ8_0, x, level);
    uint16_t d;
    std::memcpy(&d, q.data(), 2);
    EXPECT_EQ(d, 0x3C00);
    EXPECT_EQ(static_cast<int8_t>(q[2]), 127);
    EXPECT_EQ(static_cast<int8_t>(q[3]), 3);
    EXPECT_EQ(static_cast<int8_t>(q[4]), -3);
    EXPECT_EQ(static_cast<int8_t>(q[5]), 0);
    const std::vector<uint8_t> q1 = Quantize(GgmlType::kQ8_1, x, level);
    uint16_t s;
    std::memcpy(&s, q1.data() + 2, 2);
    EXPECT_EQ(s, H(127.0f));  // d * Σq = 1 * (127 + 3 - 3)
  }
}

TEST(QuantLegacy, Q4_0QuantizeByHand) {
  // max (signed, largest |x|) = -8 -> d = 1; q = min(15, trunc(x + 8.5)).
  std::vector<float> x(32, 0.0f);
  x[0] = -8.0f;
  x[1] = 7.6f;   // trunc(16.1) = 16 -> clamped to 15 -> value 7
  x[2] = -0.5f;  // trunc(8.0) = 8 -> value 0 (ties round up)
  x[3] = 1.49f;  // trunc(9.99) = 9 -> value 1
  const std::vector<uint8_t> q = Quantize(GgmlType::kQ4_0, x);
  uint16_t d;
  std::memcpy(&d, q.data(), 2);
  EXPECT_EQ(d, 0x3C00);
  EXPECT_EQ(q[2] & 0x0F, 0);
  EXPECT_EQ(q[3] & 0x0F, 15);
  EXPECT_EQ(q[4] & 0x0F, 8);
  EXPECT_EQ(q[5] & 0x0F, 9);
  EXPECT_EQ(q[2] >> 4, 8);  // element 16 = 0
}

// Dequantize(Quantize(x)) error per element, per type. Derivations (d = unrounded scale, d' its
// f16 value, |d - d'| <= 2^-11 |d| in the normal range, likewise for m):
//   Q8_0/Q8_1: q = round(x/d), |q| <= 127  => |x - q d'| <= d/2 + 127 |d - d'| <= d (1/2 + 2^-4).
//   Q4_0: q - 8 = round-half-up(x/d) in [-8, 7]; x/d in [-8, 8] so clamping can cost a whole
//         step: <= |d| + 8 |d - d'|.   Q5_0: same with 16: <= |d| + 16 |d - d'|.
//   Q4_1: q = round-half-up((x - min)/d) in [0, 15]: <= d/2 + 15 |d - d'| + |min - min'|.
//   Q5_1: same with 31.
// Plus a few float ulps of the block's magnitude for x*id and the dequant product.
TEST(QuantLegacy, QuantizeDequantizeErrorBounds) {
  const struct {
    GgmlType t;
    double step;  // the round/clamp term in units of |d|
    int qmax;     // largest |q| multiplying d - d'
    bool has_min;
  } cases[] = {{GgmlType::kQ4_0, 1.0, 8, false},   {GgmlType::kQ4_1, 0.5, 15, true},
               {GgmlType::kQ5_0, 1.0, 16, false},  {GgmlType::kQ5_1, 0.5, 31, true},
               {GgmlType::kQ8_0, 0.5, 127, false}, {GgmlType::kQ8_1, 0.5, 127, false}};
  const int64_t n = 64 * kQK;
  for (const auto& c : cases) {
    for (float offset : {0.0f, 1.5f}) {
      const std::vector<float> x = RandomRow(n, 1234, offset);
      const std::vector<float> y = Dequantize(c.t, Quantize(c.t, x), n);
      for (int64_t b = 0; b < n / kQK; ++b) {
        double lo = x[b * kQK], hi = lo, amax = 0.0;
        for (int j = 0; j < kQK; ++j) {
          const double v = x[b * kQK + j];
          lo = std::min(lo, v);
          hi = std::max(hi, v);
          amax = std::max(amax, std::fabs(v));
        }
        double d;
        if (c.has_min) {
          d = (hi - lo) / (c.qmax);
        } else if (c.qmax == 127) {
          d = amax / 127;
        } else {
          d = amax / c.qmax;  // |max / -8| or |max / -16|
        }
        const double bound =
            c.step * d + c.qmax * d * kH + (c.has_min ? std::fabs(lo) * kH : 0.0) + 8 * kU * amax;
        for (int j = 0; j < kQK; ++j) {
          const double err = std::fabs(static_cast<double>(x[b * kQK + j]) - y[b * kQK + j]);
          ASSERT_LE(err, bound) << "type " << static_cast<int>(c.t) << " block " << b << " j " << j;
        }
      }
    }
  }
}

// --- SIMD identity with the scalar reference. --------------------------------------------------

TEST(QuantLegacy, ActivationQuantizeSimdMatchesScalar) {
  for (int64_t nb : {1, 2, 3, 7, 128, 129}) {
    const int64_t n = nb * kQK;
    std::vector<float> x = RandomRow(n, static_cast<uint32_t>(nb));
    // Tie cases: block 0 with amax = 127 (d = id = 1) and values on .5.
    x[0] = 127.0f;
    for (int j = 1; j < kQK && j < n; ++j) x[j] = (j % 2 ? 1.0f : -1.0f) * (j * 2.0f + 0.5f);
    if (nb > 1) {  // an all-zero block
      for (int j = 0; j < kQK; ++j) x[kQK + j] = 0.0f;
    }
    for (GgmlType t : {GgmlType::kQ8_0, GgmlType::kQ8_1}) {
      const std::vector<uint8_t> ref = Quantize(t, x);
      for (CpuLevel level : Levels()) {
        EXPECT_EQ(Quantize(t, x, level), ref)
            << "type " << static_cast<int>(t) << " at " << CpuLevelName(level) << " nb " << nb;
      }
    }
  }
}

// Random block bytes (any qs/qh, finite f16 d and m) decode identically at every level.
TEST(QuantLegacy, DequantizeSimdMatchesScalar) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(-3.0f, 3.0f);
  const int64_t n = 37 * kQK;
  for (GgmlType t : {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                     GgmlType::kQ8_0, GgmlType::kQ8_1}) {
    std::vector<uint8_t> row(RowBytes(t, n));
    for (auto& v : row) v = static_cast<uint8_t>(byte(rng));
    const size_t bs = BlockBytes(t);
    const bool has_second_half =
        t == GgmlType::kQ4_1 || t == GgmlType::kQ5_1 || t == GgmlType::kQ8_1;
    for (size_t b = 0; b < row.size() / bs; ++b) {
      PutHalf(&row[b * bs], H(scale(rng)));
      if (has_second_half) PutHalf(&row[b * bs + 2], H(scale(rng)));
    }
    const std::vector<float> ref = Dequantize(t, row, n);
    for (CpuLevel level : Levels()) {
      const std::vector<float> got = Dequantize(t, row, n, level);
      EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)), 0)
          << "type " << static_cast<int>(t) << " at " << CpuLevelName(level);
    }
  }
}

// --- Dot products. ------------------------------------------------------------------------------

struct DotCase {
  GgmlType w;
  GgmlType a;
  bool has_min;
};
const DotCase kDotCases[] = {
    {GgmlType::kQ4_0, GgmlType::kQ8_0, false}, {GgmlType::kQ4_1, GgmlType::kQ8_1, true},
    {GgmlType::kQ5_0, GgmlType::kQ8_0, false}, {GgmlType::kQ5_1, GgmlType::kQ8_1, true},
    {GgmlType::kQ8_0, GgmlType::kQ8_0, false}, {GgmlType::kQ8_1, GgmlType::kQ8_1, false}};

struct DotReference {
  double exact;      // Σ dequant(w)[i] * dequant(a)[i] in float64
  double sum_abs;    // Σ |w_i a_i| + Σ_b |mw_b sa_b|
  double min_slack;  // Σ_b |mw_b| |Σ_j qa_j d_a,b - sa_b|: the f16 rounding of s (_1 types)
};

DotReference Reference(const DotCase& c, const std::vector<uint8_t>& w,
                       const std::vector<uint8_t>& a, int64_t n) {
  const std::vector<float> wf = Dequantize(c.w, w, n);
  const std::vector<float> af = Dequantize(c.a, a, n);
  DotReference r{0.0, 0.0, 0.0};
  for (int64_t i = 0; i < n; ++i) {
    r.exact += static_cast<double>(wf[i]) * af[i];
    r.sum_abs += std::fabs(static_cast<double>(wf[i]) * af[i]);
  }
  if (c.has_min) {
    const size_t wbs = BlockBytes(c.w), abs_ = BlockBytes(c.a);
    for (int64_t b = 0; b < n / kQK; ++b) {
      const double mw = quant::LoadHalf(&w[b * wbs + 2]);
      const double da = quant::LoadHalf(&a[b * abs_]);
      const double sa = quant::LoadHalf(&a[b * abs_ + 2]);
      double qsum = 0.0;
      for (int j = 0; j < kQK; ++j) qsum += static_cast<int8_t>(a[b * abs_ + 4 + j]);
      r.min_slack += std::fabs(mw) * std::fabs(qsum * da - sa);
      r.sum_abs += std::fabs(mw * sa);
    }
  }
  return r;
}

// Float error of the documented orders: each block term has <= 3 roundings (d product, the
// conversion-free isum product / FMA, the add) and a sum over nb blocks: first-order bound
// (nb + 8) * u * Σ|terms|, doubled for margin. The test bound against float64 adds min_slack,
// which is a property of the Q8_1 format (ggml has the same), not of the kernel.
double FloatBound(const DotReference& r, int64_t n) {
  return 2.0 * static_cast<double>(n / kQK + 8) * kU * r.sum_abs;
}

void CheckDots(const DotCase& c, const std::vector<float>& wx, const std::vector<float>& ax,
               const std::string& what) {
  const int64_t n = static_cast<int64_t>(wx.size());
  const std::vector<uint8_t> w = Quantize(c.w, wx);
  const std::vector<uint8_t> a = Quantize(c.a, ax);
  const DotReference ref = Reference(c, w, a, n);
  const double bound = FloatBound(ref, n);
  const float scalar = Kernels(c.w, CpuLevel::kScalar).vec_dot(n, w.data(), a.data());
  float avx2 = 0.0f;
  bool have_avx2 = false;
  for (CpuLevel level : Levels()) {
    const QuantKernels& k = Kernels(c.w, level);
    ASSERT_EQ(k.vec_dot_type, c.a);
    const float got = k.vec_dot(n, w.data(), a.data());
    SCOPED_TRACE(what + " type " + std::to_string(static_cast<int>(c.w)) + " at " +
                 CpuLevelName(level) + " n " + std::to_string(n));
    EXPECT_LE(std::fabs(got - ref.exact), bound + ref.min_slack) << got << " vs " << ref.exact;
    EXPECT_LE(std::fabs(static_cast<double>(got) - scalar), bound) << got << " vs " << scalar;
    // Pure function: same bits on a second call and from a misaligned copy of both rows.
    EXPECT_EQ(Fp32ToBits(k.vec_dot(n, w.data(), a.data())), Fp32ToBits(got));
    std::vector<uint8_t> wm(w.size() + 1), am(a.size() + 3);
    std::memcpy(wm.data() + 1, w.data(), w.size());
    std::memcpy(am.data() + 3, a.data(), a.size());
    EXPECT_EQ(Fp32ToBits(k.vec_dot(n, wm.data() + 1, am.data() + 3)), Fp32ToBits(got));
    // Every level follows the same documented order: the scalar reference's bits.
    EXPECT_EQ(Fp32ToBits(got), Fp32ToBits(scalar)) << got << " vs " << scalar;
    if (level == CpuLevel::kAvx2) {
      avx2 = got;
      have_avx2 = true;
    }
    if (level == CpuLevel::kAvx512 && have_avx2) {
      EXPECT_EQ(Fp32ToBits(got), Fp32ToBits(avx2));
    }
  }
}

TEST(QuantLegacy, DotProductsRandom) {
  for (const DotCase& c : kDotCases) {
    // One block, two, three (odd), many, and counts that are not a multiple of 2 or 4 blocks.
    for (int64_t nb : {1, 2, 3, 5, 33, 128, 129}) {
      const int64_t n = nb * kQK;
      const float offset = c.has_min ? 0.7f : 0.0f;
      CheckDots(c, RandomRow(n, static_cast<uint32_t>(100 + nb), offset),
                RandomRow(n, static_cast<uint32_t>(900 + nb)), "random nb " + std::to_string(nb));
    }
  }
}

TEST(QuantLegacy, DotProductsExtremes) {
  const int64_t n = 9 * kQK;
  for (const DotCase& c : kDotCases) {
    // All zeros: exactly zero at every level.
    const std::vector<float> zeros(n, 0.0f);
    for (CpuLevel level : Levels()) {
      const std::vector<uint8_t> w = Quantize(c.w, zeros);
      const std::vector<uint8_t> a = Quantize(c.a, zeros);
      EXPECT_EQ(Kernels(c.w, level).vec_dot(n, w.data(), a.data()), 0.0f);
    }
    // Large magnitudes (f16 d and m near the top of the range, products ~1e9 per element).
    std::vector<float> big = RandomRow(n, 5);
    for (float& v : big) v = v * 7000.0f;
    CheckDots(c, big, RandomRow(n, 6), "large");
    // Tiny weights: d falls into the f16 subnormal range (|x| ~ 1e-5 -> d ~ 1e-7).
    std::vector<float> tiny = RandomRow(n, 8);
    for (float& v : tiny) v = v * 3e-6f;
    CheckDots(c, tiny, RandomRow(n, 9), "tiny");
    // Saturating activations: every activation at +-amax (q = +-127).
    std::vector<float> sat(n);
    for (int64_t i = 0; i < n; ++i) sat[i] = (i % 3 == 0) ? -2.0f : 2.0f;
    CheckDots(c, RandomRow(n, 10), sat, "saturated");
  }
}

// Hand-built weight and activation blocks with subnormal f16 scales: checks the exact value.
TEST(QuantLegacy, DotSubnormalScalesExact) {
  std::vector<uint8_t> w(18), a(34);
  PutHalf(w.data(), 0x0001);                            // d = 2^-24
  PutHalf(a.data(), 0x0002);                            // d = 2^-23
  for (int j = 0; j < 16; ++j) w[2 + j] = 0xF0 | 0x09;  // low nibble 9 -> +1, high 15 -> +7
  for (int j = 0; j < 32; ++j) a[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(j - 10));
  // Σ_{j<16} 1*(j-10) + Σ_{j>=16} 7*(j-10) = (120 - 160) + 7 * (376 - 160) = -40 + 1512 = 1472.
  const double expect = 1472.0 * std::ldexp(1.0, -47);
  for (CpuLevel level : Levels()) {
    EXPECT_EQ(static_cast<double>(Kernels(GgmlType::kQ4_0, level).vec_dot(32, w.data(), a.data())),
              expect)
        << CpuLevelName(level);
  }
}

}  // namespace
}  // namespace kiln
