// Rows x tokens tiles of F32, F16 and BF16 weights x F32 activations (QuantKernels::vec_dot_tile,
// kernels/cpu/float_avx2.cc and float_avx512.cc; MLA's decompression matmuls K = C W_UKᵀ and
// V = C W_UV run on them): every level's tile bitwise equal to the plain reference tile
// (VecDotTileF32F32Ref / F16F32Ref / Bf16F32Ref: the scalar vec_dot per pair) and to its own
// level's vec_dot, for row lengths with and without a partial 64-element chunk, row and token
// counts with tails below the register tiles, and padded strides; MatMul on float weights (the tile
// path for two or more tokens) batch invariant with 1 and 2 threads.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "lib/backend/cpu/ops.h"
#include "lib/common/half.h"
#include "lib/quant/legacy_kernels.h"
#include "lib/quant/quant.h"

namespace kiln {
namespace {

constexpr GgmlType kFloatTileTypes[] = {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16};

size_t ElemBytes(GgmlType t) { return t == GgmlType::kF32 ? 4 : 2; }

// `rows` rows of n normal values of `type`, `stride` bytes apart (padding bytes random).
std::vector<uint8_t> RandomRows(GgmlType type, int64_t n, int rows, size_t stride,
                                std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<uint8_t> out(stride * rows + 1);
  for (uint8_t& b : out) b = static_cast<uint8_t>(rng());
  for (int r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < n; ++i) {
      const float v = dist(rng) * (r % 3 == 2 ? 1e-3f : 1.0f);
      uint8_t* dst = out.data() + r * stride + i * ElemBytes(type);
      if (type == GgmlType::kF32) {
        std::memcpy(dst, &v, 4);
      } else {
        const uint16_t h = type == GgmlType::kF16 ? Fp32ToFp16(v) : Fp32ToBf16(v);
        std::memcpy(dst, &h, 2);
      }
    }
  }
  return out;
}

VecDotTileFn ReferenceTile(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
      return quant::VecDotTileF32F32Ref;
    case GgmlType::kF16:
      return quant::VecDotTileF16F32Ref;
    default:
      return quant::VecDotTileBf16F32Ref;
  }
}

TEST(FloatTile, RegisteredAtEveryLevel) {
  for (CpuLevel level : {CpuLevel::kScalar, CpuLevel::kAvx2, CpuLevel::kAvx512}) {
    if (static_cast<int>(level) > static_cast<int>(BestCpuLevel())) continue;
    for (GgmlType type : kFloatTileTypes) {
      const QuantKernels* k = GetQuantKernels(type, level);
      ASSERT_NE(k, nullptr);
      EXPECT_NE(k->vec_dot_tile, nullptr)
          << GgmlTypeName(static_cast<uint32_t>(type)) << " at " << CpuLevelName(level);
    }
  }
}

TEST(FloatTile, EveryLevelBitwiseEqualToTheReferenceAndItsVecDot) {
  std::mt19937 rng(41);
  for (CpuLevel level : {CpuLevel::kScalar, CpuLevel::kAvx2, CpuLevel::kAvx512}) {
    if (static_cast<int>(level) > static_cast<int>(BestCpuLevel())) continue;
    for (GgmlType type : kFloatTileTypes) {
      const QuantKernels* k = GetQuantKernels(type, level);
      ASSERT_TRUE(k != nullptr && k->vec_dot_tile != nullptr);
      for (int64_t n : {64, 128, 512, 100, 7}) {
        for (auto [rows, tokens] : {std::pair{1, 1},
                                    {4, 4},
                                    {2, 4},
                                    {5, 7},
                                    {19, 3},
                                    {3, 9},
                                    {16, 13},
                                    {33, 6},
                                    {1, 6}}) {
          const size_t w_stride = n * ElemBytes(type) + (rows % 2) * 6;  // padded rows too
          const size_t a_stride = n * sizeof(float) + (tokens % 2) * 8;
          const std::vector<uint8_t> w = RandomRows(type, n, rows, w_stride, rng);
          const std::vector<uint8_t> a = RandomRows(GgmlType::kF32, n, tokens, a_stride, rng);
          const size_t out_stride = rows + 2;
          std::vector<float> got(out_stride * tokens, 123.0f), want(out_stride * tokens, 123.0f);
          k->vec_dot_tile(n, w.data(), w_stride, rows, a.data(), a_stride, tokens, got.data(),
                          out_stride);
          ReferenceTile(type)(n, w.data(), w_stride, rows, a.data(), a_stride, tokens, want.data(),
                              out_stride);
          ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
              << GgmlTypeName(static_cast<uint32_t>(type)) << " level " << CpuLevelName(level)
              << " n " << n << " tile " << rows << "x" << tokens;
          for (int t = 0; t < tokens; ++t) {
            for (int r = 0; r < rows; ++r) {
              const float g = got[t * out_stride + r];
              const float d = k->vec_dot(n, w.data() + r * w_stride, a.data() + t * a_stride);
              ASSERT_EQ(std::memcmp(&g, &d, sizeof(float)), 0)
                  << "level " << CpuLevelName(level) << " n " << n << " row " << r << " token "
                  << t;
            }
            for (int r = rows; r < static_cast<int>(out_stride); ++r) {
              ASSERT_EQ(got[t * out_stride + r], 123.0f) << "wrote past n_rows";
            }
          }
        }
      }
    }
  }
}

// MatMul of float weights over n tokens (the tile path) equals MatMul token by token (vec_dot
// per row), bitwise, with 1 and 2 threads, at every level.
TEST(FloatTile, MatMulBatchInvariant) {
  std::mt19937 rng(43);
  cpu::ThreadPool pool1(1), pool2(2);
  cpu::Scratch scratch;
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (CpuLevel level : {CpuLevel::kScalar, CpuLevel::kAvx2, CpuLevel::kAvx512}) {
    if (static_cast<int>(level) > static_cast<int>(BestCpuLevel())) continue;
    for (GgmlType type : kFloatTileTypes) {
      for (auto [n_in, n_out] : {std::pair<int64_t, int64_t>{512, 96}, {96, 37}}) {
        const std::vector<uint8_t> w =
            RandomRows(type, n_in, static_cast<int>(n_out), n_in * ElemBytes(type), rng);
        const cpu::WeightView wv{type, w.data(), n_in, n_out};
        for (int64_t n_tokens : {2, 5, 67}) {
          std::vector<float> x(n_in * n_tokens), single(n_out * n_tokens);
          for (float& v : x) v = dist(rng);
          for (int64_t t = 0; t < n_tokens; ++t) {
            ASSERT_TRUE(cpu::MatMul(pool1, wv, x.data() + t * n_in, 1, single.data() + t * n_out,
                                    scratch, level)
                            .ok());
          }
          for (cpu::ThreadPool* pool : {&pool1, &pool2}) {
            std::vector<float> batch(n_out * n_tokens, -1.0f);
            ASSERT_TRUE(
                cpu::MatMul(*pool, wv, x.data(), n_tokens, batch.data(), scratch, level).ok());
            ASSERT_EQ(std::memcmp(batch.data(), single.data(), batch.size() * sizeof(float)), 0)
                << GgmlTypeName(static_cast<uint32_t>(type)) << " level " << CpuLevelName(level)
                << " " << n_in << "x" << n_out << " tokens " << n_tokens << " threads "
                << pool->n_threads();
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kiln
