#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "lib/common/cpu_features.h"
#include "lib/common/ggml_type.h"
#include "lib/common/half.h"

namespace kiln {
namespace {

TEST(Half, Fp16RoundTripsEveryFiniteValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    const float f = Fp16ToFp32(bits);
    if (std::isnan(f)) continue;
    EXPECT_EQ(Fp32ToFp16(f), bits) << std::hex << h;
  }
}

TEST(Half, Fp16KnownValues) {
  EXPECT_EQ(Fp16ToFp32(0x3C00), 1.0f);
  EXPECT_EQ(Fp16ToFp32(0xC000), -2.0f);
  EXPECT_EQ(Fp16ToFp32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(Fp16ToFp32(0x7BFF), 65504.0f);
  EXPECT_TRUE(std::isinf(Fp16ToFp32(0x7C00)));
  EXPECT_EQ(Fp32ToFp16(65520.0f), 0x7C00);    // rounds up to inf
  EXPECT_EQ(Fp32ToFp16(65519.0f), 0x7BFF);
  EXPECT_EQ(Fp32ToFp16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);  // tie -> even
  EXPECT_EQ(Fp32ToFp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);
  EXPECT_EQ(Fp32ToFp16(std::ldexp(1.0f, -25)), 0x0000);  // tie at the bottom -> even (0)
  EXPECT_EQ(Fp32ToFp16(std::ldexp(1.5f, -25)), 0x0001);
}

TEST(Half, Bf16) {
  EXPECT_EQ(Bf16ToFp32(0x3F80), 1.0f);
  EXPECT_EQ(Fp32ToBf16(1.0f), 0x3F80);
  EXPECT_EQ(Fp32ToBf16(Fp32FromBits(0x3F808000)), 0x3F80);  // tie -> even
  EXPECT_EQ(Fp32ToBf16(Fp32FromBits(0x3F818000)), 0x3F82);
  EXPECT_TRUE(std::isnan(Bf16ToFp32(Fp32ToBf16(NAN))));
}

TEST(GgmlType, Geometry) {
  auto q41 = GgmlTypeInfoOf(3);
  ASSERT_TRUE(q41.has_value());
  EXPECT_EQ(q41->block_size, 32u);
  EXPECT_EQ(q41->type_size, 20u);
  EXPECT_EQ(GgmlRowBytes(*q41, 576), 18u * 20u);
  EXPECT_FALSE(GgmlTypeInfoOf(4).has_value());  // removed Q4_2
  EXPECT_FALSE(GgmlTypeInfoOf(1000).has_value());
  EXPECT_EQ(GgmlTypeName(14), "q6_K");
  EXPECT_EQ(GgmlTypeName(5), "type#5");
}

TEST(CpuFeatures, ConsistentSets) {
  const CpuFeatures& f = GetCpuFeatures();
  if (f.HasAvx512Set()) {
    EXPECT_TRUE(f.HasAvx2Set());
  }
  EXPECT_FALSE(f.ToString().empty());
}

}  // namespace
}  // namespace kiln
