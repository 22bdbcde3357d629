// Rows x tokens tile kernels (QuantKernels::vec_dot_tile) against vec_dot: every output bitwise
// equal (memcmp of the floats) at every CPU level that has a tile kernel, for row lengths whose
// block count leaves every remainder of the 4-block groups, row and token counts with tails
// below the 4 x 4 register tile, and padded strides. Plus MatMul's batch invariance on tile
// types: MatMul over n tokens equals MatMul per token, bitwise, with 1 and 2 threads.
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

constexpr GgmlType kTileTypes[] = {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0,
                                   GgmlType::kQ5_1, GgmlType::kQ8_0};

size_t RowBytes(GgmlType t, int64_t n) {
  return GgmlRowBytes(*GgmlTypeInfoOf(static_cast<uint32_t>(t)), n);
}

// `rows` rows of `type`, each `stride` bytes apart (padding bytes random), quantized from normal
// floats with the scalar quantizer (so every level sees the same bytes).
std::vector<uint8_t> RandomRows(GgmlType type, int64_t n, int rows, size_t stride,
                                std::mt19937& rng) {
  const QuantKernels* ref = GetQuantKernels(type, CpuLevel::kScalar);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n);
  std::vector<uint8_t> out(stride * rows + 1);
  for (uint8_t& b : out) b = static_cast<uint8_t>(rng());
  for (int r = 0; r < rows; ++r) {
    for (float& v : x) v = dist(rng) * (r % 3 == 2 ? 1e-3f : 1.0f);
    if (r % 5 == 4) std::fill(x.begin(), x.begin() + 32, 0.0f);  // an all-zero block (d = 0)
    ref->quantize(x.data(), out.data() + r * stride, n);
  }
  return out;
}

int TileLevelsCovered() {
  int covered = 0;
  for (CpuLevel level : {CpuLevel::kScalar, CpuLevel::kAvx2, CpuLevel::kAvx512}) {
    if (static_cast<int>(level) > static_cast<int>(BestCpuLevel())) continue;
    for (GgmlType type : kTileTypes) {
      const QuantKernels* k = GetQuantKernels(type, level);
      if (k != nullptr && k->vec_dot_tile != nullptr) ++covered;
    }
  }
  return covered;
}

TEST(VecDotTile, BitwiseEqualToVecDot) {
  std::mt19937 rng(21);
  for (CpuLevel level : {CpuLevel::kScalar, CpuLevel::kAvx2, CpuLevel::kAvx512}) {
    if (static_cast<int>(level) > static_cast<int>(BestCpuLevel())) continue;
    for (GgmlType type : kTileTypes) {
      const QuantKernels* k = GetQuantKernels(type, level);
      if (k == nullptr || k->vec_dot_tile == nullptr) continue;
      for (int64_t n : {32, 64, 96, 128, 160, 224, 576, 1536}) {
        for (auto [rows, tokens] :
             {std::pair{1, 1}, {4, 4}, {5, 7}, {11, 3}, {3, 9}, {16, 13}, {2, 1}, {1, 6}, {8, 8}}) {
          const size_t w_stride = RowBytes(type, n) + (rows % 2) * 3;  // odd padding too
          const size_t a_stride = RowBytes(k->vec_dot_type, n) + (tokens % 2) * 5;
          const std::vector<uint8_t> w = RandomRows(type, n, rows, w_stride, rng);
          const std::vector<uint8_t> a = RandomRows(k->vec_dot_type, n, tokens, a_stride, rng);
          const size_t out_stride = rows + 2;
          std::vector<float> got(out_stride * tokens, 123.0f);
          k->vec_dot_tile(n, w.data(), w_stride, rows, a.data(), a_stride, tokens, got.data(),
                          out_stride);
          for (int t = 0; t < tokens; ++t) {
            for (int r = 0; r < static_cast<int>(out_stride); ++r) {
              const float g = got[t * out_stride + r];
              if (r >= rows) {
                ASSERT_EQ(g, 123.0f) << "wrote past n_rows at token " << t << " slot " << r;
                continue;
              }
              const float want = k->vec_dot(n, w.data() + r * w_stride, a.data() + t * a_stride);
              ASSERT_EQ(std::memcmp(&g, &want, sizeof(float)), 0)
                  << GgmlTypeName(static_cast<uint32_t>(type)) << " level " << CpuLevelName(level)
                  << " n " << n << " tile " << rows << "x" << tokens << " row " << r << " token "
                  << t << ": " << g << " vs " << want;
            }
          }
        }
      }
    }
  }
  if (BestCpuLevel() == CpuLevel::kAvx512) {
    EXPECT_GE(TileLevelsCovered(), 2);  // Q8_0 and Q4_0 have AVX-512 tile kernels
  }
}

TEST(VecDotTile, EmptyTileWritesNothing) {
  for (GgmlType type : kTileTypes) {
    const QuantKernels* k = GetQuantKernels(type);
    if (k == nullptr || k->vec_dot_tile == nullptr) continue;
    std::mt19937 rng(3);
    const std::vector<uint8_t> w = RandomRows(type, 64, 2, RowBytes(type, 64), rng);
    const std::vector<uint8_t> a =
        RandomRows(k->vec_dot_type, 64, 2, RowBytes(k->vec_dot_type, 64), rng);
    float out[4] = {7.0f, 7.0f, 7.0f, 7.0f};
    k->vec_dot_tile(64, w.data(), RowBytes(type, 64), 0, a.data(), RowBytes(k->vec_dot_type, 64), 2,
                    out, 2);
    k->vec_dot_tile(64, w.data(), RowBytes(type, 64), 2, a.data(), RowBytes(k->vec_dot_type, 64), 0,
                    out, 2);
    for (float v : out) EXPECT_EQ(v, 7.0f);
  }
}

// x: [n_tokens, n_in] random activations; *single gets MatMul token by token. Asserts MatMul
// over all n_tokens equals it bitwise with 1 and 2 threads.
void ExpectMatMulBatchInvariant(const cpu::WeightView& wv, int64_t n_tokens, CpuLevel level,
                                std::mt19937& rng, std::vector<float>* x,
                                std::vector<float>* single) {
  cpu::ThreadPool pool1(1), pool2(2);
  cpu::Scratch scratch;
  std::normal_distribution<float> dist(0.0f, 1.0f);
  x->resize(wv.n_in * n_tokens);
  for (float& v : *x) v = dist(rng);
  single->assign(wv.n_out * n_tokens, 0.0f);
  for (int64_t t = 0; t < n_tokens; ++t) {
    ASSERT_TRUE(cpu::MatMul(pool1, wv, x->data() + t * wv.n_in, 1, single->data() + t * wv.n_out,
                            scratch, level)
                    .ok());
  }
  for (cpu::ThreadPool* pool : {&pool1, &pool2}) {
    std::vector<float> batch(wv.n_out * n_tokens, -1.0f);
    ASSERT_TRUE(cpu::MatMul(*pool, wv, x->data(), n_tokens, batch.data(), scratch, level).ok());
    ASSERT_EQ(std::memcmp(batch.data(), single->data(), batch.size() * sizeof(float)), 0)
        << GgmlTypeName(static_cast<uint32_t>(wv.type)) << " level " << CpuLevelName(level) << " "
        << wv.n_in << "x" << wv.n_out << " tokens " << n_tokens << " threads " << pool->n_threads();
  }
}

// MatMul over n tokens (tile path) equals MatMul token by token (the single-token path: the
// tile for Q4_1, vec_dot_rows for the others), bitwise, at every level, with 1 and 2 threads (and
// MatMulRows on a row subset).
TEST(VecDotTile, MatMulBatchInvariant) {
  std::mt19937 rng(5);
  cpu::ThreadPool pool2(2);
  cpu::Scratch scratch;
  for (CpuLevel level : {CpuLevel::kScalar, CpuLevel::kAvx2, CpuLevel::kAvx512}) {
    if (static_cast<int>(level) > static_cast<int>(BestCpuLevel())) continue;
    for (GgmlType type : kTileTypes) {
      const QuantKernels* k = GetQuantKernels(type, level);
      if (k == nullptr || k->vec_dot_tile == nullptr) continue;
      for (auto [n_in, n_out] : {std::pair<int64_t, int64_t>{576, 192}, {1536, 37}, {64, 70}}) {
        const std::vector<uint8_t> w =
            RandomRows(type, n_in, static_cast<int>(n_out), RowBytes(type, n_in), rng);
        const cpu::WeightView wv{type, w.data(), n_in, n_out};
        for (int64_t n_tokens : {2, 3, 5, 8, 67}) {
          std::vector<float> x, single;
          ASSERT_NO_FATAL_FAILURE(
              ExpectMatMulBatchInvariant(wv, n_tokens, level, rng, &x, &single));
          // Every output also equals vec_dot of the token's quantized row (MatMul's quantizer).
          std::vector<uint8_t> qa(RowBytes(k->vec_dot_type, n_in));
          const int64_t last = n_tokens - 1;
          ActivationQuantizer(k->vec_dot_type, level)(x.data() + last * n_in, qa.data(), n_in);
          for (int64_t o = 0; o < n_out; ++o) {
            const float want = k->vec_dot(n_in, w.data() + o * RowBytes(type, n_in), qa.data());
            const float got = single[last * n_out + o];
            ASSERT_EQ(std::memcmp(&got, &want, sizeof(float)), 0) << "output " << o;
          }
          // MatMulRows on a reversed subset equals the per-token results.
          std::vector<int32_t> pick;
          for (int64_t t = n_tokens - 1; t >= 0; t -= 2) pick.push_back(static_cast<int32_t>(t));
          std::vector<float> sub(n_out * pick.size());
          ASSERT_TRUE(
              cpu::MatMulRows(pool2, wv, x.data(), n_tokens, pick, sub.data(), scratch, level)
                  .ok());
          for (size_t i = 0; i < pick.size(); ++i) {
            ASSERT_EQ(std::memcmp(sub.data() + i * n_out, single.data() + pick[i] * n_out,
                                  n_out * sizeof(float)),
                      0)
                << "MatMulRows row " << i;
          }
        }
      }
    }
  }
}

// ---- Q4_1 x Q8_1 (ggml's x86 order; kernels/cpu/tile_q4_1_avx512.cc) ----

// `rows` Q4_1 rows quantized with the level's weight quantizer from floats with a per-row mean
// offset (so the mins term matters), stride bytes apart (padding random).
std::vector<uint8_t> RandomQ4_1Rows(int64_t n, int rows, size_t stride, std::mt19937& rng) {
  const QuantKernels* k = GetQuantKernels(GgmlType::kQ4_1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n);
  std::vector<uint8_t> out(stride * rows + 1);
  for (uint8_t& b : out) b = static_cast<uint8_t>(rng());
  for (int r = 0; r < rows; ++r) {
    const float mean = (r % 4 == 1) ? 3.0f : 0.0f;
    for (float& v : x) v = mean + dist(rng) * (r % 3 == 2 ? 1e-3f : 1.0f);
    if (r % 5 == 4) std::fill(x.begin(), x.begin() + 32, 0.0f);  // an all-zero block
    k->quantize(x.data(), out.data() + r * stride, n);
  }
  return out;
}

// `tokens` activation rows quantized to Q8_1 by MatMul's activation quantizer at `level`.
std::vector<uint8_t> Q8_1Activations(int64_t n, int tokens, size_t stride, CpuLevel level,
                                     std::mt19937& rng) {
  const QuantizeRowFn quantize = ActivationQuantizer(GgmlType::kQ8_1, level);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n);
  std::vector<uint8_t> out(stride * tokens + 1);
  for (uint8_t& b : out) b = static_cast<uint8_t>(rng());
  for (int t = 0; t < tokens; ++t) {
    const float scale = t % 3 == 1 ? 40.0f : 1.0f;  // large activations (outlier channels)
    for (float& v : x) v = dist(rng) * scale;
    if (t % 4 == 3 && n >= 64) std::fill(x.begin() + 32, x.begin() + 64, 0.0f);  // d = s = 0
    quantize(x.data(), out.data() + t * stride, n);
  }
  return out;
}

TEST(VecDotTileQ4_1, RegisteredAtAvx512) {
  if (BestCpuLevel() != CpuLevel::kAvx512) {
    GTEST_SKIP() << "no AVX-512 on this CPU";
  }
  const QuantKernels* k = GetQuantKernels(GgmlType::kQ4_1, CpuLevel::kAvx512);
  ASSERT_NE(k, nullptr);
  EXPECT_NE(k->vec_dot_tile, nullptr);
  EXPECT_EQ(k->vec_dot_type, GgmlType::kQ8_1);
}

// Every output of the Q4_1 tile equals vec_dot bitwise, with activations from MatMul's Q8_1
// activation quantizer, on the SmolLM2 row lengths and odd row / token counts (every tail of the
// AVX-512 kernel's 4-row x 8-token register tile, calls of <= 8 tokens that unpack weights in
// registers and longer ones that unpack them per call), padded strides and out_stride; nothing
// past n_rows is written.
TEST(VecDotTileQ4_1, BitwiseEqualToVecDotWithActivationQuantizer) {
  std::mt19937 rng(41);
  int checked = 0;
  for (CpuLevel level : {CpuLevel::kScalar, CpuLevel::kAvx2, CpuLevel::kAvx512}) {
    if (static_cast<int>(level) > static_cast<int>(BestCpuLevel())) continue;
    const QuantKernels* k = GetQuantKernels(GgmlType::kQ4_1, level);
    ASSERT_NE(k, nullptr);
    if (k->vec_dot_tile == nullptr) continue;
    for (int64_t n : {32, 64, 576, 1536}) {
      for (auto [rows, tokens] : {std::pair{1, 1},
                                  {1, 2},
                                  {3, 5},
                                  {4, 4},
                                  {5, 9},
                                  {7, 3},
                                  {9, 7},
                                  {13, 8},
                                  {2, 2},
                                  {6, 1},
                                  {4, 6},
                                  {17, 11},
                                  {5, 14},
                                  {8, 16},
                                  {3, 67}}) {
        const size_t w_stride = RowBytes(GgmlType::kQ4_1, n) + (rows % 2) * 7;
        const size_t a_stride = RowBytes(GgmlType::kQ8_1, n) + (tokens % 2) * 3;
        const std::vector<uint8_t> w = RandomQ4_1Rows(n, rows, w_stride, rng);
        const std::vector<uint8_t> a = Q8_1Activations(n, tokens, a_stride, level, rng);
        const size_t out_stride = rows + 3;
        std::vector<float> got(out_stride * tokens, -7.0f);
        k->vec_dot_tile(n, w.data(), w_stride, rows, a.data(), a_stride, tokens, got.data(),
                        out_stride);
        for (int t = 0; t < tokens; ++t) {
          for (int r = 0; r < static_cast<int>(out_stride); ++r) {
            const float g = got[t * out_stride + r];
            if (r >= rows) {
              ASSERT_EQ(g, -7.0f) << "wrote past n_rows at token " << t << " slot " << r;
              continue;
            }
            const float want = k->vec_dot(n, w.data() + r * w_stride, a.data() + t * a_stride);
            ASSERT_EQ(std::memcmp(&g, &want, sizeof(float)), 0)
                << "level " << CpuLevelName(level) << " n " << n << " tile " << rows << "x"
                << tokens << " row " << r << " token " << t << ": " << g << " vs " << want;
            ++checked;
          }
        }
      }
    }
  }
  if (BestCpuLevel() == CpuLevel::kAvx512) {
    EXPECT_GT(checked, 0);
  }
}

// The tile equals the vec_dot also where the vec_dot has no slack: the 4 rows of a register
// tile share activation loads but not chains, so rows with extreme scale ratios (1e-3 vs 1)
// and zero blocks interleaved within one tile must not leak into each other; an all-zero
// weight row gives exactly vec_dot's value (the mins term alone).
TEST(VecDotTileQ4_1, RowsOfOneTileAreIndependent) {
  const QuantKernels* k = GetQuantKernels(GgmlType::kQ4_1);
  if (k->vec_dot_tile == nullptr) {
    GTEST_SKIP() << "no Q4_1 tile kernel at this level";
  }
  std::mt19937 rng(7);
  const int64_t n = 576;
  const size_t w_stride = RowBytes(GgmlType::kQ4_1, n), a_stride = RowBytes(GgmlType::kQ8_1, n);
  std::vector<float> x(n * 4);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int64_t i = 0; i < n * 4; ++i) x[i] = dist(rng) * ((i / n) % 2 ? 1e-3f : 1e3f);
  std::fill(x.begin() + 2 * n, x.begin() + 3 * n, 0.5f);  // row 2: constant (qs 0, m = 0.5)
  std::vector<uint8_t> w(w_stride * 4);
  for (int r = 0; r < 4; ++r) k->quantize(x.data() + r * n, w.data() + r * w_stride, n);
  const std::vector<uint8_t> a = Q8_1Activations(n, 5, a_stride, BestCpuLevel(), rng);
  std::vector<float> got(4 * 5);
  k->vec_dot_tile(n, w.data(), w_stride, 4, a.data(), a_stride, 5, got.data(), 4);
  for (int t = 0; t < 5; ++t) {
    for (int r = 0; r < 4; ++r) {
      const float want = k->vec_dot(n, w.data() + r * w_stride, a.data() + t * a_stride);
      ASSERT_EQ(std::memcmp(&got[t * 4 + r], &want, sizeof(float)), 0)
          << "row " << r << " token " << t << ": " << got[t * 4 + r] << " vs " << want;
    }
  }
}

// MatMul on Q4_1 weights over the verification widths of speculative decoding (2..9 tokens) and
// a prefill-sized batch equals MatMul token by token, bitwise, with 1 and 2 threads, on the
// SmolLM2 shapes (n_in 576 and 1536) and an odd output count.
TEST(VecDotTileQ4_1, MatMulBatchInvariantOnSpecWidths) {
  std::mt19937 rng(9);
  for (CpuLevel level : {CpuLevel::kScalar, CpuLevel::kAvx2, CpuLevel::kAvx512}) {
    if (static_cast<int>(level) > static_cast<int>(BestCpuLevel())) continue;
    for (auto [n_in, n_out] : {std::pair<int64_t, int64_t>{576, 67}, {1536, 41}, {32, 9}}) {
      const std::vector<uint8_t> w =
          RandomQ4_1Rows(n_in, static_cast<int>(n_out), RowBytes(GgmlType::kQ4_1, n_in), rng);
      const cpu::WeightView wv{GgmlType::kQ4_1, w.data(), n_in, n_out};
      for (int64_t n_tokens : {2, 3, 4, 5, 7, 9, 16, 17, 70}) {
        std::vector<float> x, single;
        ASSERT_NO_FATAL_FAILURE(ExpectMatMulBatchInvariant(wv, n_tokens, level, rng, &x, &single));
      }
    }
  }
}

}  // namespace
}  // namespace kiln
