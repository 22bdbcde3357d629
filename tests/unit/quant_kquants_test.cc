// K-quants (Q2_K..Q6_K weights, Q8_K activations): layouts against hand-built blocks,
// quantizer error bounds, and every SIMD level against the scalar reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "lib/common/half.h"
#include "lib/quant/kquants.h"
#include "lib/quant/quant.h"

namespace kiln {
namespace {

using kquants::BlockQ2K;
using kquants::BlockQ3K;
using kquants::BlockQ4K;
using kquants::BlockQ5K;
using kquants::BlockQ6K;
using kquants::BlockQ8K;
constexpr int kQK = 256;

constexpr GgmlType kWeightTypes[] = {GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K,
                                     GgmlType::kQ5_K, GgmlType::kQ6_K};

size_t BlockBytes(GgmlType t) { return GgmlTypeInfoOf(static_cast<uint32_t>(t))->type_size; }

std::vector<CpuLevel> Levels() {
  std::vector<CpuLevel> out;
  for (int l = 0; l <= static_cast<int>(BestCpuLevel()); ++l)
    out.push_back(static_cast<CpuLevel>(l));
  return out;
}

const QuantKernels& Kernels(GgmlType t, CpuLevel level) {
  const QuantKernels* k = GetQuantKernels(t, level);
  EXPECT_NE(k, nullptr) << GgmlTypeName(static_cast<uint32_t>(t)) << " " << CpuLevelName(level);
  static const QuantKernels kNone{};
  return k ? *k : kNone;
}

std::vector<float> Dequantize(GgmlType t, const std::vector<uint8_t>& row, int64_t n) {
  std::vector<float> out(n);
  Kernels(t, CpuLevel::kScalar).dequantize(row.data(), out.data(), n);
  return out;
}

std::vector<uint8_t> Quantize(GgmlType t, const std::vector<float>& x) {
  std::vector<uint8_t> row(x.size() / kQK * BlockBytes(t));
  Kernels(t, CpuLevel::kScalar).quantize(x.data(), row.data(), static_cast<int64_t>(x.size()));
  return row;
}

std::vector<float> Gaussian(int64_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

// Random block bytes (every bit pattern of codes and scales), with the f16 scale fields set to
// finite values in [2^-8, 2) so decoded values stay finite.
std::vector<uint8_t> RandomBlocks(GgmlType t, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> row(n / kQK * BlockBytes(t));
  for (uint8_t& b : row) b = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> scale(1.0f / 256, 2.0f);
  for (size_t off = 0; off < row.size(); off += BlockBytes(t)) {
    uint8_t* blk = row.data() + off;
    auto put = [&](size_t at) {
      const uint16_t h = Fp32ToFp16(scale(rng));
      std::memcpy(blk + at, &h, 2);
    };
    switch (t) {
      case GgmlType::kQ2_K:
        put(offsetof(BlockQ2K, d)), put(offsetof(BlockQ2K, dmin));
        break;
      case GgmlType::kQ3_K:
        put(offsetof(BlockQ3K, d));
        break;
      case GgmlType::kQ4_K:
        put(offsetof(BlockQ4K, d)), put(offsetof(BlockQ4K, dmin));
        break;
      case GgmlType::kQ5_K:
        put(offsetof(BlockQ5K, d)), put(offsetof(BlockQ5K, dmin));
        break;
      case GgmlType::kQ6_K:
        put(offsetof(BlockQ6K, d));
        break;
      default:
        ADD_FAILURE();
    }
  }
  return row;
}

uint32_t Bits(float f) { return Fp32ToBits(f); }

// ---------------------------------------------------------------------------------------------
// Layouts: blocks built byte by byte, expected values from the GGUF_FACTS formulas.

TEST(KQuantLayout, Q4KHandBuiltBlock) {
  // sc = {1,2,3,4,17,33,63,40}, m = {5,6,7,8,20,36,50,1}; packed by hand:
  //   bytes 0-3: sc0..3 | (sc4..7 >> 4) << 6    = 0x41 0x82 0xC3 0x84
  //   bytes 4-7: m0..3  | (m4..7 >> 4) << 6     = 0x45 0x86 0xC7 0x08
  //   bytes 8-11: (sc4..7 & 15) | (m4..7 & 15)<<4 = 0x41 0x41 0x2F 0x18
  const int sc[8] = {1, 2, 3, 4, 17, 33, 63, 40};
  const int m[8] = {5, 6, 7, 8, 20, 36, 50, 1};
  const uint8_t scale_bytes[12] = {0x41, 0x82, 0xC3, 0x84, 0x45, 0x86,
                                   0xC7, 0x08, 0x41, 0x41, 0x2F, 0x18};
  std::vector<uint8_t> blk(144);
  blk[0] = 0x00, blk[1] = 0x38;  // d = 0.5
  blk[2] = 0x00, blk[3] = 0x34;  // dmin = 0.25
  std::memcpy(&blk[4], scale_bytes, 12);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l)
      blk[16 + 32 * c + l] = static_cast<uint8_t>((l % 16) | ((15 - (l + c) % 16) << 4));
  }
  uint8_t usc[8], um[8];
  kquants::UnpackQ4KScales(scale_bytes, usc, um);
  for (int j = 0; j < 8; ++j) {
    EXPECT_EQ(usc[j], sc[j]) << j;
    EXPECT_EQ(um[j], m[j]) << j;
  }
  for (CpuLevel level : Levels()) {
    std::vector<float> y(256);
    Kernels(GgmlType::kQ4_K, level).dequantize(blk.data(), y.data(), 256);
    for (int e = 0; e < 256; ++e) {
      const int j = e / 32, l = e % 32, c = j / 2;
      const int q = (j % 2 == 0) ? l % 16 : 15 - (l + c) % 16;
      EXPECT_EQ(y[e], 0.5f * sc[j] * q - 0.25f * m[j]) << "e=" << e << " " << CpuLevelName(level);
    }
  }
}

TEST(KQuantLayout, Q5KHandBuiltBlock) {
  const int sc[8] = {1, 2, 3, 4, 17, 33, 63, 40};
  const int m[8] = {5, 6, 7, 8, 20, 36, 50, 1};
  const uint8_t scale_bytes[12] = {0x41, 0x82, 0xC3, 0x84, 0x45, 0x86,
                                   0xC7, 0x08, 0x41, 0x41, 0x2F, 0x18};
  std::vector<uint8_t> blk(176);
  blk[0] = 0x00, blk[1] = 0x3C;  // d = 1
  blk[2] = 0x00, blk[3] = 0x38;  // dmin = 0.5
  std::memcpy(&blk[4], scale_bytes, 12);
  for (int l = 0; l < 32; ++l) blk[16 + l] = static_cast<uint8_t>(l % 2 ? 0xA5 : 0x3C);  // qh
  for (int i = 0; i < 128; ++i) blk[48 + i] = static_cast<uint8_t>(i * 37 + 11);         // qs
  for (CpuLevel level : Levels()) {
    std::vector<float> y(256);
    Kernels(GgmlType::kQ5_K, level).dequantize(blk.data(), y.data(), 256);
    for (int e = 0; e < 256; ++e) {
      const int j = e / 32, l = e % 32;
      const uint8_t qs = static_cast<uint8_t>((32 * (j / 2) + l) * 37 + 11);
      const int low = (j % 2) ? qs >> 4 : qs & 15;
      const int high = ((l % 2 ? 0xA5 : 0x3C) >> j) & 1;
      EXPECT_EQ(y[e], 1.0f * sc[j] * (low + 16 * high) - 0.5f * m[j]) << e;
    }
  }
}

TEST(KQuantLayout, Q3KHandBuiltBlockAndScalePacking) {
  // Raw 6-bit scales r[g] (effective r - 32), packed by hand:
  //   b[i]   = (r[i] & 15)   | (r[8+i] & 15) << 4   -> 0x80 0x21 0x5F 0xF0
  //   b[4+i] = (r[4+i] & 15) | (r[12+i] & 15) << 4  -> 0x91 0x3F 0xDA 0x74
  //   b[8+i] = r[i]>>4 | (r[4+i]>>4)<<2 | (r[8+i]>>4)<<4 | (r[12+i]>>4)<<6 -> 0x68 0xBC 0x81 0xC6
  const int raw[16] = {0, 1, 31, 32, 33, 63, 10, 20, 40, 50, 5, 15, 25, 35, 45, 55};
  const uint8_t scale_bytes[12] = {0x80, 0x21, 0x5F, 0xF0, 0x91, 0x3F,
                                   0xDA, 0x74, 0x68, 0xBC, 0x81, 0xC6};
  int8_t s[16];
  kquants::UnpackQ3KScales(scale_bytes, s);
  for (int g = 0; g < 16; ++g) EXPECT_EQ(s[g], raw[g] - 32) << g;
  uint8_t repacked[12];
  kquants::PackQ3KScales(s, repacked);
  EXPECT_EQ(0, std::memcmp(repacked, scale_bytes, 12));

  std::vector<uint8_t> blk(110);
  for (int l = 0; l < 32; ++l) blk[l] = static_cast<uint8_t>(l * 29 + 3);       // hmask
  for (int i = 0; i < 64; ++i) blk[32 + i] = static_cast<uint8_t>(i * 53 + 7);  // qs
  std::memcpy(&blk[96], scale_bytes, 12);
  blk[108] = 0x00, blk[109] = 0x3C;  // d = 1
  for (CpuLevel level : Levels()) {
    std::vector<float> y(256);
    Kernels(GgmlType::kQ3_K, level).dequantize(blk.data(), y.data(), 256);
    for (int e = 0; e < 256; ++e) {
      const int half = e / 128, j = (e % 128) / 32, l = e % 32;
      const int q2 = (static_cast<uint8_t>((32 * half + l) * 53 + 7) >> (2 * j)) & 3;
      const int h = (static_cast<uint8_t>(l * 29 + 3) >> (4 * half + j)) & 1;
      EXPECT_EQ(y[e], static_cast<float>((raw[e / 16] - 32) * (q2 - (h ? 0 : 4)))) << e;
    }
  }
}

TEST(KQuantLayout, Q2KHandBuiltBlock) {
  std::vector<uint8_t> blk(84);
  for (int g = 0; g < 16; ++g) blk[g] = static_cast<uint8_t>(g | ((15 - g) << 4));  // sc | m<<4
  for (int i = 0; i < 64; ++i) blk[16 + i] = static_cast<uint8_t>(i * 71 + 5);
  blk[80] = 0x00, blk[81] = 0x40;  // d = 2
  blk[82] = 0x00, blk[83] = 0x38;  // dmin = 0.5
  for (CpuLevel level : Levels()) {
    std::vector<float> y(256);
    Kernels(GgmlType::kQ2_K, level).dequantize(blk.data(), y.data(), 256);
    for (int e = 0; e < 256; ++e) {
      const int half = e / 128, j = (e % 128) / 32, l = e % 32, g = e / 16;
      const int q2 = (static_cast<uint8_t>((32 * half + l) * 71 + 5) >> (2 * j)) & 3;
      EXPECT_EQ(y[e], 2.0f * g * q2 - 0.5f * (15 - g)) << e;
    }
  }
}

TEST(KQuantLayout, Q6KHandBuiltBlock) {
  std::vector<uint8_t> blk(210);
  for (int i = 0; i < 128; ++i) blk[i] = static_cast<uint8_t>(i * 13 + 1);        // ql
  for (int i = 0; i < 64; ++i) blk[128 + i] = static_cast<uint8_t>(i * 89 + 17);  // qh
  const int8_t scales[16] = {-128, 127, -1, 0, 1, 2, -3, 64, -64, 5, 6, 7, -8, 9, 10, -11};
  std::memcpy(&blk[192], scales, 16);
  blk[208] = 0x00, blk[209] = 0x38;  // d = 0.5
  for (CpuLevel level : Levels()) {
    std::vector<float> y(256);
    Kernels(GgmlType::kQ6_K, level).dequantize(blk.data(), y.data(), 256);
    for (int e = 0; e < 256; ++e) {
      const int half = e / 128, r = e % 128, quarter = r / 32, l = r % 32;
      const uint8_t ql = static_cast<uint8_t>((64 * half + l + (quarter & 1 ? 32 : 0)) * 13 + 1);
      const uint8_t qh = static_cast<uint8_t>((32 * half + l) * 89 + 17);
      const int q = ((quarter & 2) ? ql >> 4 : ql & 15) | (((qh >> (2 * quarter)) & 3) << 4);
      EXPECT_EQ(y[e], 0.5f * scales[e / 16] * (q - 32)) << e;
    }
  }
}

TEST(KQuantLayout, Q8KHandBuiltBlockAndQuantizerRule) {
  // Signed max -127 -> iscale = 1, so ties round half to even: 2.5 -> 2, -3.5 -> -4, 0.5 -> 0.
  std::vector<float> x(256, 0.0f);
  x[0] = 2.5f, x[1] = -3.5f, x[2] = 0.5f, x[3] = 1.5f, x[17] = -127.0f, x[18] = 127.0f;
  x[255] = 100.25f;
  for (CpuLevel level : Levels()) {
    BlockQ8K b;
    Kernels(GgmlType::kQ8_K, level).quantize(x.data(), &b, 256);
    // The first |x| = 127 is x[17] = -127 (the signed max): iscale = -127/max = 1, d = 1.
    EXPECT_EQ(b.d, 1.0f) << CpuLevelName(level);
    EXPECT_EQ(b.qs[0], 2);
    EXPECT_EQ(b.qs[1], -4);
    EXPECT_EQ(b.qs[2], 0);
    EXPECT_EQ(b.qs[3], 2);
    EXPECT_EQ(b.qs[17], -127);
    EXPECT_EQ(b.qs[18], 127);
    EXPECT_EQ(b.qs[255], 100);
    EXPECT_EQ(b.bsums[0], 2 - 4 + 0 + 2);
    EXPECT_EQ(b.bsums[1], -127 + 127);
    EXPECT_EQ(b.bsums[15], 100);
    std::vector<float> y(256);
    Kernels(GgmlType::kQ8_K, level).dequantize(&b, y.data(), 256);
    EXPECT_EQ(y[1], -4.0f);
    EXPECT_EQ(y[17], -127.0f);
  }
  // All zeros -> d = 0, qs = 0.
  std::vector<float> zeros(512, 0.0f);
  BlockQ8K z[2];
  std::memset(z, 0x5A, sizeof(z));
  Kernels(GgmlType::kQ8_K, CpuLevel::kScalar).quantize(zeros.data(), z, 512);
  EXPECT_EQ(z[1].d, 0.0f);
  EXPECT_EQ(z[1].qs[100], 0);
  EXPECT_EQ(z[1].bsums[3], 0);
}

TEST(KQuantLayout, Q4KScalePackingRoundTrips) {
  std::mt19937 rng(7);
  for (int it = 0; it < 1000; ++it) {
    uint8_t sc[8], m[8], packed[12], sc2[8], m2[8];
    for (int j = 0; j < 8; ++j) sc[j] = rng() % 64, m[j] = rng() % 64;
    kquants::PackQ4KScales(sc, m, packed);
    kquants::UnpackQ4KScales(packed, sc2, m2);
    ASSERT_EQ(0, std::memcmp(sc, sc2, 8));
    ASSERT_EQ(0, std::memcmp(m, m2, 8));
  }
}

TEST(KQuantRegistry, EveryLevelHasKernels) {
  for (CpuLevel level : Levels()) {
    for (GgmlType t : kWeightTypes) {
      const QuantKernels* k = GetQuantKernels(t, level);
      ASSERT_NE(k, nullptr);
      EXPECT_EQ(k->vec_dot_type, GgmlType::kQ8_K);
      EXPECT_TRUE(k->IsSupported());
    }
    const QuantKernels* q8 = GetQuantKernels(GgmlType::kQ8_K, level);
    ASSERT_NE(q8, nullptr);
    EXPECT_EQ(q8->vec_dot_type, GgmlType::kQ8_K);
  }
}

// ---------------------------------------------------------------------------------------------
// Quantizer error bounds.
//
// Per element, from the block itself (see kquants_quantize.cc):
//   asymmetric types (Q2_K, Q4_K, Q5_K): |x - x^| <= step/2, step = d*sc of its sub-block;
//   symmetric types (Q3_K, Q6_K):        |x - x^| <= |step|,  step = d*s of its group.
// Per element, from the data (amax = largest |x| of the super-block):
//   asymmetric: |x - x^| <= amax/nmax * (1 + 2.5/smax + 1/smax^2)   (nmax = 3, 15, 31; smax = 15,
//   63, 63) symmetric:  |x - x^| <= amax/K    * (1 + 2/smax)                (K = 4, 32; smax = 31,
//   127)
// both with 0.1% slack for f16/float rounding.

struct TypeBounds {
  GgmlType type;
  double data_bound;  // multiple of the super-block amax
  double rel_rmse;    // RMS error / RMS of the data on N(0, 1) rows
};

double AsymBound(int nmax, int smax) { return (1.0 + 2.5 / smax + 1.0 / (smax * smax)) / nmax; }

// rel_rmse: measured 0.349, 0.156, 0.078, 0.037, 0.019 (seed 11); bounds ~15% above.
const TypeBounds kBounds[] = {
    {GgmlType::kQ2_K, AsymBound(3, 15) * 1.001, 0.40},
    {GgmlType::kQ3_K, (1.0 + 2.0 / 31) / 4 * 1.001, 0.18},
    {GgmlType::kQ4_K, AsymBound(15, 63) * 1.001, 0.09},
    {GgmlType::kQ5_K, AsymBound(31, 63) * 1.001, 0.043},
    {GgmlType::kQ6_K, (1.0 + 2.0 / 127) / 32 * 1.001, 0.022},
};

// Step of element e of one block (see the comment above).
double ElementStep(GgmlType t, const uint8_t* blk, int e) {
  switch (t) {
    case GgmlType::kQ2_K: {
      const auto* b = reinterpret_cast<const BlockQ2K*>(blk);
      return Fp16ToFp32(b->d) * (b->scales[e / 16] & 15);
    }
    case GgmlType::kQ3_K: {
      const auto* b = reinterpret_cast<const BlockQ3K*>(blk);
      int8_t s[16];
      kquants::UnpackQ3KScales(b->scales, s);
      return std::fabs(Fp16ToFp32(b->d) * s[e / 16]);
    }
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K: {
      const auto* b = reinterpret_cast<const BlockQ4K*>(blk);  // same header layout
      uint8_t sc[8], m[8];
      kquants::UnpackQ4KScales(b->scales, sc, m);
      return Fp16ToFp32(b->d) * sc[e / 32];
    }
    case GgmlType::kQ6_K: {
      const auto* b = reinterpret_cast<const BlockQ6K*>(blk);
      return std::fabs(Fp16ToFp32(b->d) * b->scales[e / 16]);
    }
    default:
      return 0;
  }
}

void CheckQuantizerBounds(const TypeBounds& tb, const std::vector<float>& x, bool check_rmse) {
  const GgmlType t = tb.type;
  const bool symmetric = t == GgmlType::kQ3_K || t == GgmlType::kQ6_K;
  const std::vector<uint8_t> row = Quantize(t, x);
  const std::vector<float> y = Dequantize(t, row, static_cast<int64_t>(x.size()));
  double se = 0, sx = 0;
  for (size_t sb = 0; sb < x.size() / kQK; ++sb) {
    double amax = 0;
    for (int e = 0; e < kQK; ++e) amax = std::max(amax, std::fabs(double{x[sb * kQK + e]}));
    for (int e = 0; e < kQK; ++e) {
      const size_t i = sb * kQK + e;
      const double err = std::fabs(double{x[i]} - y[i]);
      const double step = ElementStep(t, row.data() + sb * BlockBytes(t), e);
      const double block_bound = (symmetric ? step : 0.5 * step) * 1.00001 + 1e-6 * amax;
      ASSERT_LE(err, block_bound) << GgmlTypeName(static_cast<uint32_t>(t)) << " i=" << i;
      ASSERT_LE(err, tb.data_bound * amax + 1e-30)
          << GgmlTypeName(static_cast<uint32_t>(t)) << " i=" << i;
      se += err * err;
      sx += double{x[i]} * x[i];
    }
  }
  if (check_rmse) {
    EXPECT_LE(std::sqrt(se / sx), tb.rel_rmse) << GgmlTypeName(static_cast<uint32_t>(t));
  }
}

TEST(KQuantQuantize, ErrorBoundsOnGaussianRows) {
  for (const TypeBounds& tb : kBounds) CheckQuantizerBounds(tb, Gaussian(64 * kQK, 11), true);
}

TEST(KQuantQuantize, ErrorBoundsOnSkewedAndExtremeRows) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> x(16 * kQK);
  for (size_t i = 0; i < x.size(); ++i) {
    const size_t sb = i / kQK;
    float v = u(rng);
    if (sb % 4 == 1) v = -v;                        // all negative
    if (sb % 4 == 2) v = v + 3.0f;                  // all positive, offset
    if (sb == 3 && i % 97 == 0) v = 50.0f;          // outliers
    if (sb >= 8) v *= (sb % 2 ? 1e4f : 1e-3f);      // large and small magnitudes
    if (sb == 15) v = (i % 16 == 0) ? 1.0f : 0.0f;  // mostly zeros
    x[i] = v;
  }
  for (const TypeBounds& tb : kBounds) CheckQuantizerBounds(tb, x, false);
  // A zero row decodes to exact zeros.
  for (GgmlType t : kWeightTypes) {
    const std::vector<float> y = Dequantize(t, Quantize(t, std::vector<float>(512, 0.0f)), 512);
    for (float v : y) ASSERT_EQ(v, 0.0f);
  }
}

TEST(KQuantQuantize, Deterministic) {
  const std::vector<float> x = Gaussian(8 * kQK, 3);
  for (GgmlType t : kWeightTypes) EXPECT_EQ(Quantize(t, x), Quantize(t, x));
}

// ---------------------------------------------------------------------------------------------
// SIMD == scalar, bit for bit.

TEST(KQuantSimd, DequantizeMatchesScalarBits) {
  const int64_t n = 16 * kQK;
  for (GgmlType t : kWeightTypes) {
    const std::vector<uint8_t> row = RandomBlocks(t, n, 21);
    std::vector<float> ref(n), got(n);
    Kernels(t, CpuLevel::kScalar).dequantize(row.data(), ref.data(), n);
    for (CpuLevel level : Levels()) {
      Kernels(t, level).dequantize(row.data(), got.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(Bits(got[i]), Bits(ref[i]))
            << GgmlTypeName(static_cast<uint32_t>(t)) << " " << CpuLevelName(level) << " i=" << i;
      }
    }
  }
}

TEST(KQuantSimd, Q8KQuantizeMatchesScalarBytes) {
  const int64_t n = 12 * kQK;
  std::vector<float> x = Gaussian(n, 99, 3.0f);
  // Block 1: ties after scaling (max = -127 -> iscale = 1); block 2: tiny values; block 3:
  // zeros; block 4: equal |max| of both signs (the first one wins); block 5: a NaN element;
  // block 6: huge values; block 7: subnormal max (iscale overflows -> zero block).
  for (int e = 0; e < kQK; ++e) {
    x[kQK + e] = static_cast<float>(e % 64) - 31.5f;
    x[2 * kQK + e] *= 1e-30f;
    x[3 * kQK + e] = 0.0f;
    x[6 * kQK + e] *= 1e30f;
    x[7 * kQK + e] = 1e-40f * static_cast<float>(e % 3);
  }
  x[kQK + 5] = -127.0f;
  x[4 * kQK + 9] = 50.0f, x[4 * kQK + 3] = -50.0f;
  x[5 * kQK + 77] = NAN;
  std::vector<BlockQ8K> ref(n / kQK), got(n / kQK);
  Kernels(GgmlType::kQ8_K, CpuLevel::kScalar).quantize(x.data(), ref.data(), n);
  EXPECT_EQ(ref[4].qs[3], -127);  // -50 comes first: max = -50, iscale = 127/50
  EXPECT_EQ(ref[4].qs[9], 127);
  EXPECT_EQ(ref[1].qs[0], -32);  // -31.5 -> -32 (tie to even)
  EXPECT_EQ(ref[1].qs[1], -30);  // -30.5 -> -30
  EXPECT_EQ(ref[5].qs[77], 0);
  EXPECT_EQ(ref[7].d, 0.0f);
  for (CpuLevel level : Levels()) {
    std::memset(got.data(), 0x77, got.size() * sizeof(BlockQ8K));
    Kernels(GgmlType::kQ8_K, level).quantize(x.data(), got.data(), n);
    for (size_t b = 0; b < ref.size(); ++b) {
      ASSERT_EQ(0, std::memcmp(&ref[b], &got[b], sizeof(BlockQ8K)))
          << CpuLevelName(level) << " block " << b;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Dot products.

std::vector<BlockQ8K> QuantizeActivations(const std::vector<float>& x) {
  std::vector<BlockQ8K> a(x.size() / kQK);
  Kernels(GgmlType::kQ8_K, CpuLevel::kScalar)
      .quantize(x.data(), a.data(), static_cast<int64_t>(x.size()));
  return a;
}

// Largest min offset dmin*m of a block (0 for the symmetric types).
double MaxOffset(GgmlType t, const uint8_t* blk) {
  switch (t) {
    case GgmlType::kQ2_K: {
      const auto* b = reinterpret_cast<const BlockQ2K*>(blk);
      int m = 0;
      for (int g = 0; g < 16; ++g) m = std::max(m, b->scales[g] >> 4);
      return Fp16ToFp32(b->dmin) * m;
    }
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K: {
      const auto* b = reinterpret_cast<const BlockQ4K*>(blk);
      uint8_t sc[8], m[8];
      kquants::UnpackQ4KScales(b->scales, sc, m);
      return Fp16ToFp32(b->dmin) * *std::max_element(m, m + 8);
    }
    default:
      return 0;
  }
}

// float64 dot of the dequantized rows, and the tolerance for the float kernel: per element
// 16 ulps of (3 |w|max + 2 offset) * |a|, per super-block. The integer parts are exact; the float
// part rounds d, (float)isum, two products, a difference and the running sum, where the scale
// term is bounded by |w|max + offset and the min term by the offset.
struct DotRef {
  double value;
  double tol;
};
DotRef ReferenceDot(GgmlType t, const std::vector<uint8_t>& w, const std::vector<BlockQ8K>& a,
                    int64_t n) {
  const std::vector<float> wd = Dequantize(t, w, n);
  std::vector<float> ad(n);
  Kernels(GgmlType::kQ8_K, CpuLevel::kScalar).dequantize(a.data(), ad.data(), n);
  DotRef r{0, 0};
  for (int64_t sb = 0; sb < n / kQK; ++sb) {
    double wmax = 0;
    for (int e = 0; e < kQK; ++e) wmax = std::max(wmax, std::fabs(double{wd[sb * kQK + e]}));
    const double offset = MaxOffset(t, w.data() + sb * BlockBytes(t));
    for (int e = 0; e < kQK; ++e) {
      const int64_t i = sb * kQK + e;
      r.value += double{wd[i]} * ad[i];
      r.tol += 16 * 0x1p-24 * (3 * wmax + 2 * offset) * std::fabs(double{ad[i]});
    }
  }
  r.tol += 1e-30;
  return r;
}

TEST(KQuantDot, AllLevelsMatchFloat64ReferenceAndEachOther) {
  for (int64_t n : {256, 512, 2816, 4096, 8192}) {
    const std::vector<float> xa = Gaussian(n, static_cast<uint32_t>(n) + 1);
    const std::vector<BlockQ8K> a = QuantizeActivations(xa);
    for (GgmlType t : kWeightTypes) {
      const std::vector<uint8_t> w = Quantize(t, Gaussian(n, static_cast<uint32_t>(n) * 7, 0.05f));
      const DotRef ref = ReferenceDot(t, w, a, n);
      const float scalar = Kernels(t, CpuLevel::kScalar).vec_dot(n, w.data(), a.data());
      for (CpuLevel level : Levels()) {
        const float got = Kernels(t, level).vec_dot(n, w.data(), a.data());
        EXPECT_NEAR(got, ref.value, ref.tol)
            << GgmlTypeName(static_cast<uint32_t>(t)) << " n=" << n << " " << CpuLevelName(level);
        // The contract (kquants.h): exact integer sums + the same float steps -> same bits.
        EXPECT_EQ(Bits(got), Bits(scalar))
            << GgmlTypeName(static_cast<uint32_t>(t)) << " n=" << n << " " << CpuLevelName(level);
      }
    }
  }
}

TEST(KQuantDot, RandomBitPatternsSameBitsAtEveryLevel) {
  // Every code and scale bit pattern (random bytes), activations with -128..127 codes and
  // bsums consistent with them.
  const int64_t n = 32 * kQK;
  std::mt19937 rng(1234);
  std::vector<BlockQ8K> a(n / kQK);
  for (BlockQ8K& b : a) {
    b.d = std::uniform_real_distribution<float>(-0.1f, 0.1f)(rng);
    for (int8_t& q : b.qs) q = static_cast<int8_t>(rng());
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int l = 0; l < 16; ++l) s += b.qs[16 * g + l];
      b.bsums[g] = static_cast<int16_t>(s);
    }
  }
  for (GgmlType t : kWeightTypes) {
    const std::vector<uint8_t> w = RandomBlocks(t, n, 77 + static_cast<uint32_t>(t));
    const float scalar = Kernels(t, CpuLevel::kScalar).vec_dot(n, w.data(), a.data());
    ASSERT_TRUE(std::isfinite(scalar));
    const DotRef ref = ReferenceDot(t, w, a, n);
    EXPECT_NEAR(scalar, ref.value, ref.tol) << GgmlTypeName(static_cast<uint32_t>(t));
    for (CpuLevel level : Levels()) {
      const float got = Kernels(t, level).vec_dot(n, w.data(), a.data());
      EXPECT_EQ(Bits(got), Bits(scalar))
          << GgmlTypeName(static_cast<uint32_t>(t)) << " " << CpuLevelName(level);
    }
  }
}

TEST(KQuantDot, ExtremeCodesAndActivations) {
  // Largest codes and scales everywhere (all weight bytes 0xFF, except the f16 fields), against
  // activations of all -128 and all +127: the int16 pair sums and int32 totals of the SIMD paths
  // are at their limits.
  const int64_t n = 4 * kQK;
  for (int8_t fill : {int8_t{-128}, int8_t{127}}) {
    std::vector<BlockQ8K> a(n / kQK);
    for (BlockQ8K& b : a) {
      b.d = 0.5f;
      std::memset(b.qs, static_cast<uint8_t>(fill), sizeof(b.qs));
      for (int16_t& s : b.bsums) s = static_cast<int16_t>(16 * fill);
    }
    for (GgmlType t : kWeightTypes) {
      std::vector<uint8_t> w = RandomBlocks(t, n, 5);
      std::vector<uint8_t> f16_fields = w;  // keep d/dmin finite, saturate everything else
      std::fill(w.begin(), w.end(), 0xFF);
      const size_t bb = BlockBytes(t);
      for (size_t off = 0; off < w.size(); off += bb) {
        const size_t d_at = t == GgmlType::kQ2_K   ? 80
                            : t == GgmlType::kQ3_K ? 108
                            : t == GgmlType::kQ6_K ? 208
                                                   : 0;
        const size_t nf = (t == GgmlType::kQ3_K || t == GgmlType::kQ6_K) ? 2 : 4;
        std::memcpy(&w[off + d_at], &f16_fields[off + d_at], nf);
      }
      if (t == GgmlType::kQ6_K) {  // scales are signed: 0xFF = -1; use +127 and -128 as well
        for (size_t off = 0; off < w.size(); off += bb) {
          for (int g = 0; g < 16; ++g) w[off + 192 + g] = g % 2 ? 0x7F : 0x80;
        }
      }
      const DotRef ref = ReferenceDot(t, w, a, n);
      const float scalar = Kernels(t, CpuLevel::kScalar).vec_dot(n, w.data(), a.data());
      EXPECT_NEAR(scalar, ref.value, ref.tol) << GgmlTypeName(static_cast<uint32_t>(t));
      for (CpuLevel level : Levels()) {
        EXPECT_EQ(Bits(Kernels(t, level).vec_dot(n, w.data(), a.data())), Bits(scalar))
            << GgmlTypeName(static_cast<uint32_t>(t)) << " " << CpuLevelName(level)
            << " fill=" << int{fill};
      }
    }
  }
}

TEST(KQuantDot, ZeroAndLargeMagnitudeRows) {
  const int64_t n = 1024;
  for (GgmlType t : kWeightTypes) {
    // Zero weights -> exactly 0.
    const std::vector<uint8_t> wz = Quantize(t, std::vector<float>(n, 0.0f));
    const std::vector<BlockQ8K> a = QuantizeActivations(Gaussian(n, 8));
    for (CpuLevel level : Levels())
      EXPECT_EQ(Kernels(t, level).vec_dot(n, wz.data(), a.data()), 0.0f);
    // Large weights and activations: still within the float64 bound.
    const std::vector<uint8_t> w = Quantize(t, Gaussian(n, 9, 1000.0f));
    const std::vector<BlockQ8K> big = QuantizeActivations(Gaussian(n, 10, 1e6f));
    const DotRef ref = ReferenceDot(t, w, big, n);
    for (CpuLevel level : Levels()) {
      EXPECT_NEAR(Kernels(t, level).vec_dot(n, w.data(), big.data()), ref.value, ref.tol)
          << GgmlTypeName(static_cast<uint32_t>(t)) << " " << CpuLevelName(level);
    }
  }
}

TEST(KQuantDot, Q8KTimesQ8K) {
  const int64_t n = 2048;
  const std::vector<BlockQ8K> w = QuantizeActivations(Gaussian(n, 1));
  const std::vector<BlockQ8K> a = QuantizeActivations(Gaussian(n, 2));
  std::vector<float> wd(n), ad(n);
  Kernels(GgmlType::kQ8_K, CpuLevel::kScalar).dequantize(w.data(), wd.data(), n);
  Kernels(GgmlType::kQ8_K, CpuLevel::kScalar).dequantize(a.data(), ad.data(), n);
  double ref = 0, mag = 0;
  for (int64_t i = 0; i < n; ++i)
    ref += double{wd[i]} * ad[i], mag += std::fabs(double{wd[i]} * ad[i]);
  const float scalar = Kernels(GgmlType::kQ8_K, CpuLevel::kScalar).vec_dot(n, w.data(), a.data());
  EXPECT_NEAR(scalar, ref, 16 * 0x1p-24 * mag);
  for (CpuLevel level : Levels()) {
    EXPECT_EQ(Bits(Kernels(GgmlType::kQ8_K, level).vec_dot(n, w.data(), a.data())), Bits(scalar));
  }
}

}  // namespace
}  // namespace kiln
