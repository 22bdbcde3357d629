// CUDA ops against the CPU reference. Skips (with the reason) only when no device is usable.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "lib/backend/cuda_loader.h"
#include "lib/common/half.h"

namespace kiln {
namespace {

TEST(CudaLoader, FallsBackCleanlyWithoutDevice) {
  std::string why;
  const CudaModule* m = GetCudaModule(&why);
  if (m == nullptr) {
    EXPECT_FALSE(why.empty());
  } else {
    EXPECT_GT(m->n_devices, 0);
  }
}

TEST(CudaOps, DequantizeQ8_0MatchesCpu) {
  std::string why;
  const CudaModule* m = GetCudaModule(&why);
  if (m == nullptr) GTEST_SKIP() << "no CUDA device: " << why;
  const int64_t rows = 3, cols = 64;
  std::vector<uint8_t> blocks(rows * cols / 32 * 34);
  std::mt19937 rng(1);
  for (auto& b : blocks) b = static_cast<uint8_t>(rng());
  std::vector<float> expected(rows * cols), got(rows * cols);
  for (int64_t blk = 0; blk < rows * cols / 32; ++blk) {
    const uint8_t* p = blocks.data() + blk * 34;
    const uint16_t d_bits = static_cast<uint16_t>(p[0] | (p[1] << 8)) & 0x3BFF;  // finite, < 1
    blocks[blk * 34] = d_bits & 0xFF;
    blocks[blk * 34 + 1] = d_bits >> 8;
    for (int j = 0; j < 32; ++j) {
      expected[blk * 32 + j] = Fp16ToFp32(d_bits) * static_cast<int8_t>(p[2 + j]);
    }
  }
  ASSERT_EQ(m->dequantize(8, blocks.data(), blocks.size(), rows, cols, got.data()), 0);
  EXPECT_EQ(got, expected);
}

}  // namespace
}  // namespace kiln
