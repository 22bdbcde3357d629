// Rows x tokens tile kernels (QuantKernels::vec_dot_tile) against vec_dot: every output bitwise
// equal (memcmp of the floats) at every CPU level that has a tile kernel, for row lengths whose
// block count leaves every remainder of the 4-block groups, row and token counts with tails
// below the 4 x 4 register tile, and padded strides. Plus MatMul's batch invariance on tile
// types: MatMul over n tokens equals MatMul per token, bitwise, with 1 and 2 threads. And the
// integer order on interleaved weights: every level's kernel equals the plain reference bitwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/interleaved.h"
#include "lib/backend/cpu/ops.h"
#include "lib/common/ggml_type.h"
#include "lib/quant/activation.h"
#include "lib/quant/interleave.h"
#include "lib/quant/legacy_kernels.h"
#include "lib/quant/quant.h"

namespace kiln {
namespace {

constexpr GgmlType kTileTypes[] = {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0,
                                   GgmlType::kQ5_1, GgmlType::kQ8_0};

size_t RowBytes(GgmlType t, int64_t n) {
  return GgmlRowBytes(*GgmlTypeInfoOf(static_cast<uint32_t>(t)), n);
}

// A tile's outputs got [tokens][out_stride], filled with `untouched` before the call: each of row
// r < rows and token t bitwise ref(n, w + r * w_stride, a + t * a_stride), the slots past n_rows
// untouched. Counts the outputs compared in *checked.
void ExpectTileMatches(const std::vector<float>& got, int rows, int tokens, size_t out_stride,
                       float untouched, VecDotFn ref, int64_t n, const uint8_t* w, size_t w_stride,
                       const uint8_t* a, size_t a_stride, const std::string& what,
                       int* checked = nullptr) {
  for (int t = 0; t < tokens; ++t) {
    for (int r = 0; r < static_cast<int>(out_stride); ++r) {
      const float g = got[t * out_stride + r];
      if (r >= rows) {
        ASSERT_EQ(g, untouched) << what << ": wrote past n_rows at token " << t << " slot " << r;
        continue;
      }
      const float want = ref(n, w + r * w_stride, a + t * a_stride);
      ASSERT_EQ(std::memcmp(&g, &want, sizeof(float)), 0)
          << what << " n " << n << " tile " << rows << "x" << tokens << " row " << r << " token "
          << t << ": " << g << " vs " << want;
      if (checked != nullptr) ++*checked;
    }
  }
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
          ASSERT_NO_FATAL_FAILURE(ExpectTileMatches(
              got, rows, tokens, out_stride, 123.0f, k->vec_dot, n, w.data(), w_stride, a.data(),
              a_stride,
              GgmlTypeName(static_cast<uint32_t>(type)) + " level " + CpuLevelName(level)));
        }
      }
    }
  }
  if (BestCpuLevel() == CpuLevel::kAvx512) {
    // Q8_0, Q4_0, Q4_1 and Q5_0 have AVX-512 tile kernels, Q5_0 an AVX2 one too.
    EXPECT_GE(TileLevelsCovered(), 5);
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

// MatMulRows on the tokens t = n_tokens - 1, n_tokens - 1 - step, ... of x equals MatMul token by
// token (`single`), bitwise.
void ExpectMatMulRowsEqualSingle(const cpu::WeightView& wv, const std::vector<float>& x,
                                 int64_t n_tokens, int64_t step, const std::vector<float>& single,
                                 CpuLevel level) {
  cpu::ThreadPool pool2(2);
  cpu::Scratch scratch;
  std::vector<int32_t> pick;
  for (int64_t t = n_tokens - 1; t >= 0; t -= step) pick.push_back(static_cast<int32_t>(t));
  std::vector<float> sub(wv.n_out * pick.size());
  ASSERT_TRUE(
      cpu::MatMulRows(pool2, wv, x.data(), n_tokens, pick, sub.data(), scratch, level).ok());
  for (size_t i = 0; i < pick.size(); ++i) {
    ASSERT_EQ(std::memcmp(sub.data() + i * wv.n_out, single.data() + pick[i] * wv.n_out,
                          wv.n_out * sizeof(float)),
              0)
        << "MatMulRows row " << i;
  }
}

// MatMul over n tokens (tile path) equals MatMul token by token (the single-token path: the
// tile for Q4_1, vec_dot_rows for the others), bitwise, at every level, with 1 and 2 threads (and
// MatMulRows on a row subset).
TEST(VecDotTile, MatMulBatchInvariant) {
  std::mt19937 rng(5);
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
          ASSERT_NO_FATAL_FAILURE(ExpectMatMulRowsEqualSingle(wv, x, n_tokens, 2, single, level));
        }
      }
    }
  }
}

// ---- Q4_1 x Q8_1 (ggml's x86 order; kernels/cpu/tile_q4_1_avx512.cc) ----

// `rows` Q4_1 (or Q5_1: `type`) rows quantized with the level's weight quantizer from floats with
// a per-row mean offset (so the mins term matters), stride bytes apart (padding random).
std::vector<uint8_t> RandomQ4_1Rows(int64_t n, int rows, size_t stride, std::mt19937& rng,
                                    GgmlType type = GgmlType::kQ4_1) {
  const QuantKernels* k = GetQuantKernels(type);
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
        ASSERT_NO_FATAL_FAILURE(ExpectTileMatches(
            got, rows, tokens, out_stride, -7.0f, k->vec_dot, n, w.data(), w_stride, a.data(),
            a_stride, std::string("level ") + CpuLevelName(level), &checked));
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

// ---- The integer order on interleaved rows (lib/quant/interleave.h) ----

struct IntegerOrderType {
  GgmlType type;
  VecDotFn ref;  // the integer order's plain reference
};
constexpr IntegerOrderType kIntegerOrderTypes[] = {
    {GgmlType::kQ4_0, quant::VecDotQ4_0Q8_0IntegerRef},
    {GgmlType::kQ4_1, quant::VecDotQ4_1Q8_1IntegerRef},
    {GgmlType::kQ5_0, quant::VecDotQ5_0Q8_0IntegerRef},
    {GgmlType::kQ5_1, quant::VecDotQ5_1Q8_1IntegerRef},
    {GgmlType::kQ8_0, quant::VecDotQ8_0Q8_0IntegerRef}};

// Weight rows of `type` with offsets, outliers and zero blocks (stride bytes apart).
std::vector<uint8_t> IntegerOrderRows(GgmlType type, int64_t n, int rows, size_t stride,
                                      std::mt19937& rng) {
  return type == GgmlType::kQ4_1 || type == GgmlType::kQ5_1
             ? RandomQ4_1Rows(n, rows, stride, rng, type)
             : RandomRows(type, n, rows, stride, rng);
}

// `tokens` activation rows of `type` from MatMul's activation quantizer at the best level.
std::vector<uint8_t> Activations(GgmlType type, int64_t n, int tokens, size_t stride,
                                 std::mt19937& rng) {
  if (type == GgmlType::kQ8_1) return Q8_1Activations(n, tokens, stride, BestCpuLevel(), rng);
  const QuantizeRowFn quantize = ActivationQuantizer(type, BestCpuLevel());
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n);
  std::vector<uint8_t> out(stride * tokens + 1);
  for (uint8_t& b : out) b = static_cast<uint8_t>(rng());
  for (int t = 0; t < tokens; ++t) {
    for (float& v : x) v = dist(rng) * (t % 3 == 1 ? 40.0f : 1.0f);
    quantize(x.data(), out.data() + t * stride, n);
  }
  return out;
}

// Interleaved weights of `rows` rows (w_stride bytes apart), via the registry's packer; 64-byte
// aligned, as the model's copies are.
struct alignas(64) Line {
  uint8_t bytes[64];
};
std::vector<Line> Interleave(const QuantKernels& k, const std::vector<uint8_t>& w, size_t w_stride,
                             int64_t n, int rows) {
  const int groups = (rows + quant::kInterleaveRows - 1) / quant::kInterleaveRows;
  std::vector<Line> out((groups * k.interleaved_group_bytes(n) + 63) / 64);
  k.interleave(w.data(), w_stride, n, rows, out.data());
  return out;
}

// Kernels of `type` with an interleaved form at `level`, or null.
const QuantKernels* InterleavedKernels(GgmlType type, CpuLevel level = BestCpuLevel()) {
  const QuantKernels* k = GetQuantKernels(type, level);
  return k != nullptr && k->interleaved_tile != nullptr ? k : nullptr;
}

// The CPU levels this machine runs, lowest first.
std::vector<CpuLevel> Levels() {
  std::vector<CpuLevel> levels;
  for (CpuLevel level : {CpuLevel::kScalar, CpuLevel::kAvx2, CpuLevel::kAvx512}) {
    if (static_cast<int>(level) <= static_cast<int>(BestCpuLevel())) levels.push_back(level);
  }
  return levels;
}

// The integer order is the default mode's matmul at every level: Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0
// have an interleaved kernel (and the packer) at each one this CPU runs, a kernel of the level's
// own.
TEST(IntegerOrder, RegisteredAtEveryLevel) {
  for (const IntegerOrderType& it : kIntegerOrderTypes) {
    const GgmlType type = it.type;
    InterleavedTileFn lower_level_kernel = nullptr;
    for (CpuLevel level : Levels()) {
      const QuantKernels* k = InterleavedKernels(type, level);
      ASSERT_NE(k, nullptr) << GgmlTypeName(static_cast<uint32_t>(type)) << " level "
                            << CpuLevelName(level);
      EXPECT_NE(k->interleave, nullptr);
      EXPECT_NE(k->interleaved_group_bytes, nullptr);
      EXPECT_NE(k->interleaved_tile, lower_level_kernel) << CpuLevelName(level);
      lower_level_kernel = k->interleaved_tile;
    }
  }
}

// A nibble format's packer (Q4_0, Q4_1, Q5_0, Q5_1) on `rows` random rows of n elements: byte
// 4i + j of row r's block qs at qs[i][4r + j], its qh, d and m (where the format has them) at [r];
// rows past the last one of a group are zero; the row extractor gives the source blocks back.
template <typename Src, typename Dst>
void ExpectNibblePackerLayout(GgmlType type, int64_t n, int rows, std::mt19937& rng) {
  const QuantKernels* k = InterleavedKernels(type);
  ASSERT_NE(k, nullptr);
  const size_t stride = RowBytes(type, n) + 5;
  const std::vector<uint8_t> w = IntegerOrderRows(type, n, rows, stride, rng);
  const std::vector<Line> lines = Interleave(*k, w, stride, n, rows);
  const auto* p = reinterpret_cast<const Dst*>(lines.data());
  const int64_t nb = n / 32;
  constexpr uint8_t kZero[4] = {0, 0, 0, 0};
  for (int row = 0; row < 2 * quant::kInterleaveRows; ++row) {
    for (int64_t b = 0; b < nb; ++b) {
      const Dst& blk = p[row / 16 * nb + b];
      const int r = row % 16;
      const auto* src = reinterpret_cast<const Src*>(w.data() + row * stride) + b;
      for (int e = 0; e < 16; ++e) {
        ASSERT_EQ(blk.qs[e / 4][4 * r + e % 4], row < rows ? src->qs[e] : 0) << "row " << row;
      }
      if constexpr (requires { src->qh; }) {
        ASSERT_EQ(std::memcmp(blk.qh[r], row < rows ? src->qh : kZero, 4), 0) << "row " << row;
      }
      ASSERT_EQ(std::memcmp(blk.d[r], row < rows ? src->d : kZero, 2), 0) << "row " << row;
      if constexpr (requires { src->m; }) {
        ASSERT_EQ(std::memcmp(blk.m[r], row < rows ? src->m : kZero, 2), 0) << "row " << row;
      }
    }
  }
  std::vector<uint8_t> back(RowBytes(type, n));
  for (int row = 0; row < rows; ++row) {
    k->interleaved_row(lines.data(), n, row, back.data());
    ASSERT_EQ(std::memcmp(back.data(), w.data() + row * stride, back.size()), 0) << row;
  }
}

// The packers: the nibble formats' (above); Q8_0 element 4i + j of row r plus 128 at
// qs[i][4r + j], d at [r], rows past the last one of a group zero, and its row extractor gives
// the source blocks back.
TEST(IntegerOrder, PackerLayouts) {
  std::mt19937 rng(3);
  const int64_t n = 96;
  const int rows = 19;
  ExpectNibblePackerLayout<quant::BlockQ4_0, quant::BlockQ4_0x16>(GgmlType::kQ4_0, n, rows, rng);
  ExpectNibblePackerLayout<quant::BlockQ4_1, quant::BlockQ4_1x16>(GgmlType::kQ4_1, n, rows, rng);
  ExpectNibblePackerLayout<quant::BlockQ5_0, quant::BlockQ5_0x16>(GgmlType::kQ5_0, n, rows, rng);
  ExpectNibblePackerLayout<quant::BlockQ5_1, quant::BlockQ5_1x16>(GgmlType::kQ5_1, n, rows, rng);
  const QuantKernels* q8_0 = InterleavedKernels(GgmlType::kQ8_0);
  ASSERT_NE(q8_0, nullptr);
  constexpr uint8_t kZero[2] = {0, 0};
  const size_t stride = RowBytes(GgmlType::kQ8_0, n) + 3;
  const std::vector<uint8_t> w = RandomRows(GgmlType::kQ8_0, n, rows, stride, rng);
  const std::vector<Line> lines = Interleave(*q8_0, w, stride, n, rows);
  const auto* p = reinterpret_cast<const quant::BlockQ8_0x16*>(lines.data());
  for (int row = 0; row < 2 * quant::kInterleaveRows; ++row) {
    for (int b = 0; b < 3; ++b) {
      const quant::BlockQ8_0x16& blk = p[row / 16 * 3 + b];
      const int r = row % 16;
      const auto* src = reinterpret_cast<const quant::BlockQ8_0*>(w.data() + row * stride) + b;
      for (int e = 0; e < 32; ++e) {
        ASSERT_EQ(blk.qs[e / 4][4 * r + e % 4], row < rows ? uint8_t(src->qs[e] + 128) : 0)
            << "row " << row;
      }
      ASSERT_EQ(std::memcmp(blk.d[r], row < rows ? src->d : kZero, 2), 0) << "row " << row;
    }
  }
  std::vector<uint8_t> back(RowBytes(GgmlType::kQ8_0, n));
  for (int row = 0; row < rows; ++row) {
    q8_0->interleaved_row(lines.data(), n, row, back.data());
    ASSERT_EQ(std::memcmp(back.data(), w.data() + row * stride, back.size()), 0) << row;
  }
}

// Q8_0's group packers (what the in-place kernels build as they go) write the registry packer's
// bytes at every level this CPU runs, for a full group and a partial one; and the in-place kernel
// equals the reference on rows holding -128 (outside what kiln's quantizer writes, inside what
// a file may hold).
TEST(IntegerOrder, Q8_0InPlaceKernelsMatchThePackedCopy) {
  const QuantKernels* k = InterleavedKernels(GgmlType::kQ8_0);
  ASSERT_NE(k, nullptr);
  std::mt19937 rng(17);
  const int64_t n = 96, nb = n / 32;
  const size_t stride = RowBytes(GgmlType::kQ8_0, n) + 3;
  std::vector<uint8_t> w = RandomRows(GgmlType::kQ8_0, n, 16, stride, rng);
  for (int r = 0; r < 16; r += 3) {  // element (5 r) % 32 of each row's block r % 3 to -128
    w[r * stride + (r % 3) * 34 + 2 + (5 * r) % 32] = 0x80;
  }
  using PackFn = void (*)(const void*, size_t, int, int64_t, quant::BlockQ8_0x16*);
  std::vector<std::pair<CpuLevel, PackFn>> packers = {{CpuLevel::kScalar, quant::PackQ8_0x16}};
  if (BestCpuLevel() >= CpuLevel::kAvx2)
    packers.emplace_back(CpuLevel::kAvx2, quant::PackQ8_0x16Avx2);
  if (BestCpuLevel() >= CpuLevel::kAvx512) {
    packers.emplace_back(CpuLevel::kAvx512, quant::PackQ8_0x16Avx512);
  }
  for (const int rows : {16, 5}) {
    const std::vector<Line> want = Interleave(*k, w, stride, n, rows);
    for (auto [level, pack] : packers) {
      std::vector<quant::BlockQ8_0x16> got(nb);
      pack(w.data(), stride, rows, nb, got.data());
      ASSERT_EQ(std::memcmp(got.data(), want.data(), nb * sizeof(quant::BlockQ8_0x16)), 0)
          << CpuLevelName(level) << " rows " << rows;
    }
  }
  for (CpuLevel level : Levels()) {
    const QuantKernels* lk = GetQuantKernels(GgmlType::kQ8_0, level);
    ASSERT_NE(lk->in_place_tile, nullptr) << CpuLevelName(level);
    for (const int tokens : {1, 9}) {
      const size_t a_stride = RowBytes(GgmlType::kQ8_0, n);
      const std::vector<uint8_t> a = Activations(GgmlType::kQ8_0, n, tokens, a_stride, rng);
      std::vector<float> got(16 * tokens);
      lk->in_place_tile(n, w.data(), stride, 16, a.data(), a_stride, tokens, got.data(), 16);
      for (int t = 0; t < tokens; ++t) {
        for (int r = 0; r < 16; ++r) {
          const float ref =
              quant::VecDotQ8_0Q8_0IntegerRef(n, w.data() + r * stride, a.data() + t * a_stride);
          ASSERT_EQ(std::memcmp(&got[t * 16 + r], &ref, sizeof(float)), 0)
              << CpuLevelName(level) << " row " << r << " token " << t;
        }
      }
    }
  }
}

// Every output of an interleaved kernel (and of Q8_0's in-place one) equals its integer-order
// reference bitwise: SmolLM2 row lengths, row counts with every kind of partial group, every token
// tail of the 8-token register tile, prefill-sized calls, padded strides; nothing past n_rows is
// written.
TEST(IntegerOrder, KernelsBitwiseEqualToReferences) {
  std::mt19937 rng(43);
  int checked = 0;
  for (const IntegerOrderType& it : kIntegerOrderTypes) {
    for (CpuLevel level : Levels()) {
      const QuantKernels* k = InterleavedKernels(it.type, level);
      ASSERT_NE(k, nullptr) << CpuLevelName(level);
      for (int64_t n : {32, 64, 576, 1536}) {
        for (auto [rows, tokens] : {std::pair{1, 1},
                                    {16, 1},
                                    {17, 2},
                                    {5, 3},
                                    {32, 4},
                                    {15, 5},
                                    {33, 6},
                                    {48, 7},
                                    {16, 8},
                                    {20, 9},
                                    {31, 16},
                                    {16, 17},
                                    {7, 67}}) {
          const size_t w_stride = RowBytes(it.type, n) + (rows % 2) * 7;
          const size_t a_stride = RowBytes(k->vec_dot_type, n) + (tokens % 2) * 3;
          const std::vector<uint8_t> w = IntegerOrderRows(it.type, n, rows, w_stride, rng);
          const std::vector<uint8_t> a = Activations(k->vec_dot_type, n, tokens, a_stride, rng);
          const std::vector<Line> p = Interleave(*k, w, w_stride, n, rows);
          const size_t out_stride = rows + 3;
          // The interleaved kernel on the packed copy, and (Q8_0) the in-place one on the rows.
          for (const bool in_place : {false, true}) {
            if (in_place && k->in_place_tile == nullptr) continue;
            std::vector<float> got(out_stride * tokens, -7.0f);
            if (in_place) {
              k->in_place_tile(n, w.data(), w_stride, rows, a.data(), a_stride, tokens, got.data(),
                               out_stride);
            } else {
              k->interleaved_tile(n, p.data(), rows, a.data(), a_stride, tokens, got.data(),
                                  out_stride);
            }
            ASSERT_NO_FATAL_FAILURE(ExpectTileMatches(got, rows, tokens, out_stride, -7.0f, it.ref,
                                                      n, w.data(), w_stride, a.data(), a_stride,
                                                      GgmlTypeName(static_cast<uint32_t>(it.type)) +
                                                          " level " + CpuLevelName(level) +
                                                          (in_place ? " in place" : " interleaved"),
                                                      &checked));
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
}

// Every level gives the same bits on the operands at the edges of each kernel's integer steps:
// Q4_1 / Q5_1 weights whose codes are all 15 / 31 (the AVX2 kernel's int16 sums at their largest)
// or all 0 with a min only; Q8_0 weights of -128 and 127 (the AVX2 kernel's |qw| and sign steps);
// activations of +-127 in runs and alternating, and zero blocks.
TEST(IntegerOrder, EveryLevelGivesTheSameBitsOnExtremeOperands) {
  std::mt19937 rng(17);
  const int64_t n = 256;
  const int rows = 21, tokens = 6;
  for (const IntegerOrderType& it : kIntegerOrderTypes) {
    const QuantKernels* k0 = InterleavedKernels(it.type, CpuLevel::kScalar);
    ASSERT_NE(k0, nullptr);
    const size_t w_stride = RowBytes(it.type, n), a_stride = RowBytes(k0->vec_dot_type, n);
    const size_t w_block = w_stride / (n / 32), a_block = a_stride / (n / 32);
    std::vector<uint8_t> w = IntegerOrderRows(it.type, n, rows, w_stride, rng);
    std::vector<uint8_t> a = Activations(k0->vec_dot_type, n, tokens, a_stride, rng);
    for (int r = 0; r < rows; ++r) {
      for (int64_t b = 0; b < n / 32; ++b) {
        uint8_t* blk = w.data() + r * w_stride + b * w_block;
        const int kind = (r + static_cast<int>(b)) % 4;
        if (it.type == GgmlType::kQ4_1) {
          if (kind == 0) std::memset(blk + 4, 0xFF, 16);  // every nibble 15
          if (kind == 1) std::memset(blk + 4, 0x00, 16);  // the min alone
        } else if (it.type == GgmlType::kQ4_0) {
          if (kind == 0) std::memset(blk + 2, 0xFF, 16);  // every weight 7 (the int16 sums' edge)
          if (kind == 1) std::memset(blk + 2, 0x00, 16);  // every weight -8
        } else if (it.type == GgmlType::kQ5_0) {
          if (kind == 0) std::memset(blk + 2, 0xFF, 20);  // every q 31 (the int16 sums' edge)
          if (kind == 1) std::memset(blk + 2, 0x00, 20);  // every weight -16
          if (kind == 2) std::memset(blk + 2, 0xAA, 4);   // every other element's bit 4
        } else if (it.type == GgmlType::kQ5_1) {
          if (kind == 0) std::memset(blk + 4, 0xFF, 20);  // every q 31 (the int16 sums' edge)
          if (kind == 1) std::memset(blk + 4, 0x00, 20);  // the min alone
          if (kind == 2) std::memset(blk + 4, 0x55, 4);   // every other element's bit 4
        } else {
          auto* qs = reinterpret_cast<int8_t*>(blk + 2);
          for (int j = 0; j < 32; ++j) {
            if (kind == 0) qs[j] = -128;
            if (kind == 1) qs[j] = 127;
            if (kind == 2) qs[j] = j % 2 ? -128 : 127;
          }
        }
      }
    }
    for (int t = 0; t < tokens; ++t) {
      for (int64_t b = 0; b < n / 32; ++b) {
        uint8_t* blk = a.data() + t * a_stride + b * a_block;
        auto* qa = reinterpret_cast<int8_t*>(blk + a_block - 32);
        const int kind = (t + static_cast<int>(b)) % 5;
        int32_t sum = 0;
        for (int j = 0; j < 32; ++j) {
          if (kind == 0) qa[j] = 127;
          if (kind == 1) qa[j] = -127;
          if (kind == 2) qa[j] = j % 2 ? -127 : 127;
          if (kind == 3) qa[j] = 0;
          sum += qa[j];
        }
        if (k0->vec_dot_type == GgmlType::kQ8_1) {  // s = d * Σ qa, as the quantizer stores it
          quant::StoreHalf(blk + 2, quant::LoadHalf(blk) * static_cast<float>(sum));
        }
      }
    }
    const std::vector<Line> p = Interleave(*k0, w, w_stride, n, rows);
    for (CpuLevel level : Levels()) {
      const QuantKernels* k = InterleavedKernels(it.type, level);
      ASSERT_NE(k, nullptr);
      // The kernel on the copy, and the in-place one (where the level has it) on the rows.
      for (const bool in_place : {false, true}) {
        if (in_place && k->in_place_tile == nullptr) continue;
        std::vector<float> got(rows * tokens);
        if (in_place) {
          k->in_place_tile(n, w.data(), w_stride, rows, a.data(), a_stride, tokens, got.data(),
                           rows);
        } else {
          k->interleaved_tile(n, p.data(), rows, a.data(), a_stride, tokens, got.data(), rows);
        }
        for (int t = 0; t < tokens; ++t) {
          for (int r = 0; r < rows; ++r) {
            const float want = it.ref(n, w.data() + r * w_stride, a.data() + t * a_stride);
            ASSERT_EQ(std::memcmp(&got[t * rows + r], &want, sizeof(float)), 0)
                << GgmlTypeName(static_cast<uint32_t>(it.type)) << " level " << CpuLevelName(level)
                << (in_place ? " in place" : "") << " row " << r << " token " << t << ": "
                << got[t * rows + r] << " vs " << want;
          }
        }
      }
    }
  }
}

// The integer order computes the same dot product as vec_dot (ggml's order) up to rounding: both
// within 1e-6 of the sum of |terms| of the exact (double) value of the quantized operands' dot,
// on rows with offsets (mins) and outlier activations. Extreme operands (Q4_1: every nibble 15;
// Q8_0: every weight -128; activations +-127) keep the int32 block sums exact.
TEST(IntegerOrder, ReferencesAgreeWithVecDotAndExactValue) {
  std::mt19937 rng(11);
  const int64_t n = 1536;
  for (const IntegerOrderType& it : kIntegerOrderTypes) {
    const QuantKernels* k = GetQuantKernels(it.type, CpuLevel::kScalar);
    const QuantKernels* ak = GetQuantKernels(k->vec_dot_type, CpuLevel::kScalar);
    const size_t w_stride = RowBytes(it.type, n), a_stride = RowBytes(k->vec_dot_type, n);
    const size_t w_block = w_stride / (n / 32), a_block = a_stride / (n / 32);
    const size_t a_qs = a_block - 32;  // offset of qs in the activation block
    std::vector<uint8_t> w = IntegerOrderRows(it.type, n, 8, w_stride, rng);
    std::vector<uint8_t> a = Activations(k->vec_dot_type, n, 8, a_stride, rng);
    for (int64_t b = 0; b < n / 32; ++b) {  // row 7 and token 7: the extreme operands
      if (it.type == GgmlType::kQ4_1) {
        std::memset(w.data() + 7 * w_stride + b * w_block + 4, 0xFF, 16);
      } else if (it.type == GgmlType::kQ4_0) {
        std::memset(w.data() + 7 * w_stride + b * w_block + 2, 0x00, 16);  // every weight -8
      } else if (it.type == GgmlType::kQ5_0) {
        std::memset(w.data() + 7 * w_stride + b * w_block + 2, 0x00, 20);  // every weight -16
      } else if (it.type == GgmlType::kQ5_1) {
        std::memset(w.data() + 7 * w_stride + b * w_block + 4, 0xFF, 20);  // every q 31
      } else {
        std::memset(w.data() + 7 * w_stride + b * w_block + 2, 0x80, 32);
      }
      uint8_t* ab = a.data() + 7 * a_stride + b * a_block;
      auto* qa = reinterpret_cast<int8_t*>(ab + a_qs);
      for (int j = 0; j < 32; ++j) qa[j] = (b % 2) ? 127 : -127;
      if (k->vec_dot_type == GgmlType::kQ8_1) {  // s = d * Σ qa, as the quantizer stores it
        quant::StoreHalf(ab + 2, quant::LoadHalf(ab) * ((b % 2) ? 127 * 32 : -127 * 32));
      }
    }
    std::vector<float> wf(n), af(n);
    for (int r = 0; r < 8; ++r) {
      k->dequantize(w.data() + r * w_stride, wf.data(), n);
      for (int t = 0; t < 8; ++t) {
        ak->dequantize(a.data() + t * a_stride, af.data(), n);
        double exact = 0, magnitude = 0;
        for (int64_t i = 0; i < n; ++i) {
          const double term = double(wf[i]) * af[i];
          exact += term;
          magnitude += std::abs(term);
        }
        const float integer = it.ref(n, w.data() + r * w_stride, a.data() + t * a_stride);
        const float ggml = k->vec_dot(n, w.data() + r * w_stride, a.data() + t * a_stride);
        // Q4_1 / Q5_1 x Q8_1 use the activation's stored f16 sum s for the mins term, not Σ of
        // its dequantized values: allow that f16 rounding (relative 2^-11 of each mins term).
        const bool mins = k->vec_dot_type == GgmlType::kQ8_1;
        const double tol = (mins ? 1e-3 : 1e-6) * magnitude;
        EXPECT_NEAR(integer, exact, tol) << "row " << r << " token " << t;
        EXPECT_NEAR(ggml, exact, tol) << "row " << r << " token " << t;
        EXPECT_NEAR(integer, ggml, 1e-5 * magnitude) << "row " << r << " token " << t;
      }
    }
  }
}

// MatMul on the interleaved copy, in place and partly copied (as while the copy is written in the
// background) computes the integer order (every output equals the reference on MatMul's own
// quantized activations) and stays batch invariant over the verification widths and a
// prefill-sized batch, with 1 and 2 threads, and in MatMulRows.
TEST(IntegerOrder, MatMulUsesItAndIsBatchInvariant) {
  std::mt19937 rng(13);
  int checked = 0;
  for (const IntegerOrderType& it : kIntegerOrderTypes) {
    for (CpuLevel level : Levels()) {
      const QuantKernels* k = InterleavedKernels(it.type, level);
      ASSERT_NE(k, nullptr) << CpuLevelName(level);
      for (auto [n_in, n_out] : {std::pair<int64_t, int64_t>{576, 67}, {1536, 48}, {32, 9}}) {
        const size_t w_stride = RowBytes(it.type, n_in);
        const std::vector<uint8_t> w =
            IntegerOrderRows(it.type, n_in, static_cast<int>(n_out), w_stride, rng);
        const std::vector<Line> p = Interleave(*k, w, w_stride, n_in, static_cast<int>(n_out));
        // As the CPU backend prepares it: from the copy, and read in place until the copy is
        // written (in the background): before any row of it is and with its first 32 written.
        cpu::WeightView rows{it.type, w.data(), n_in, n_out};
        rows.in_place = k->in_place_tile != nullptr;
        cpu::WeightView copy = rows;
        copy.interleaved = p.data();
        const std::atomic<int64_t> first_rows{std::min<int64_t>(32, n_out)};
        std::vector<Line> unwritten = p;  // rows past the first 32 not written yet: garbage
        const size_t written = 2 * k->interleaved_group_bytes(n_in);
        if (written < unwritten.size() * sizeof(Line)) {
          std::memset(reinterpret_cast<uint8_t*>(unwritten.data()) + written, 0x5A,
                      unwritten.size() * sizeof(Line) - written);
        }
        cpu::WeightView part = copy;
        part.interleaved = unwritten.data();
        part.copied_rows = &first_rows;
        ASSERT_NE(k->in_place_tile, nullptr);
        const cpu::WeightView views[] = {copy, rows, part};
        for (const cpu::WeightView& wv : views) {
          SCOPED_TRACE(wv.interleaved == nullptr   ? "in place"
                       : wv.copied_rows != nullptr ? "partly copied"
                                                   : "copy");
          for (int64_t n_tokens : {2, 3, 5, 8, 9, 16, 17, 70}) {
            std::vector<float> x, single;
            ASSERT_NO_FATAL_FAILURE(
                ExpectMatMulBatchInvariant(wv, n_tokens, level, rng, &x, &single));
            std::vector<uint8_t> qa(RowBytes(k->vec_dot_type, n_in));
            for (int64_t t : {int64_t{0}, n_tokens - 1}) {
              ActivationQuantizer(k->vec_dot_type, level)(x.data() + t * n_in, qa.data(), n_in);
              for (int64_t o = 0; o < n_out; ++o) {
                const float want = it.ref(n_in, w.data() + o * w_stride, qa.data());
                ASSERT_EQ(std::memcmp(&single[t * n_out + o], &want, sizeof(float)), 0)
                    << n_in << "x" << n_out << " token " << t << " output " << o;
                ++checked;
              }
            }
            ASSERT_NO_FATAL_FAILURE(ExpectMatMulRowsEqualSingle(wv, x, n_tokens, 3, single, level));
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
}

// ---- K-quants (Q4_K, Q5_K, Q6_K x Q8_K; kernels/cpu/kquants_avx*.cc) ----

constexpr GgmlType kKQuantTileTypes[] = {GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K};

// `tokens` Q8_K rows from MatMul's activation quantizer at `level`: normal floats, every third
// token with 40x outliers, every fourth with an all-zero super-block (d = 0, bsums 0).
std::vector<uint8_t> Q8KActivations(int64_t n, int tokens, size_t stride, CpuLevel level,
                                    std::mt19937& rng) {
  const QuantizeRowFn quantize = ActivationQuantizer(GgmlType::kQ8_K, level);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n);
  std::vector<uint8_t> out(stride * tokens + 1);
  for (uint8_t& b : out) b = static_cast<uint8_t>(rng());
  for (int t = 0; t < tokens; ++t) {
    for (float& v : x) v = dist(rng) * (t % 3 == 1 ? 40.0f : 1.0f);
    if (t % 4 == 3) std::fill(x.end() - 256, x.end(), 0.0f);
    quantize(x.data(), out.data() + t * stride, n);
  }
  return out;
}

TEST(VecDotTileKQuants, RegisteredForEveryLevelAboveScalar) {
  for (GgmlType type : kKQuantTileTypes) {
    for (CpuLevel level : {CpuLevel::kAvx2, CpuLevel::kAvx512}) {
      if (static_cast<int>(level) > static_cast<int>(BestCpuLevel())) continue;
      const QuantKernels* k = GetQuantKernels(type, level);
      ASSERT_NE(k, nullptr);
      EXPECT_NE(k->vec_dot_tile, nullptr) << GgmlTypeName(static_cast<uint32_t>(type));
      EXPECT_TRUE(k->tile_for_one_token);
      EXPECT_EQ(k->vec_dot_type, GgmlType::kQ8_K);
    }
  }
}

// Every output of the tile equals the scalar reference vec_dot bitwise (and so the level's own
// vec_dot): row lengths of 1..8 super-blocks (every tail of the 4-super-block float groups),
// token counts covering the 8/4-token passes and their 4 + 2 + 1 tails, one token over several
// rows (the AVX-512 four-row blocks and the rows after them), the AVX-512 packed path's 16-token
// groups (full, partial, and more than one pass of 64 tokens) with row counts around its 4-row
// blocks and 16-row stores, padded strides, out_stride past n_rows left untouched. Where the
// level has the interleaved copy (AVX-512), its kernel on the copy too.
TEST(VecDotTileKQuants, BitwiseEqualToScalarVecDot) {
  constexpr std::pair<int, int> kShapes[] = {
      {1, 1}, {6, 1},  {9, 1},  {3, 2},  {5, 7},   {16, 9}, {2, 15}, {4, 8}, {1, 17},
      {7, 3}, {9, 33}, {5, 64}, {6, 70}, {37, 20}, {19, 1}, {22, 9}, {35, 4}};  // rows x tokens
  std::mt19937 rng(77);
  int checked = 0;
  for (CpuLevel level : Levels()) {
    for (GgmlType type : kKQuantTileTypes) {
      const QuantKernels* k = GetQuantKernels(type, level);
      const QuantKernels* ref = GetQuantKernels(type, CpuLevel::kScalar);
      ASSERT_NE(k, nullptr);
      if (k->vec_dot_tile == nullptr) continue;
      for (int64_t n : {256, 512, 768, 1024, 1280, 2048}) {
        for (auto [rows, tokens] : kShapes) {
          const size_t w_stride = RowBytes(type, n) + (rows % 2) * 5;
          const size_t a_stride = RowBytes(GgmlType::kQ8_K, n) + (tokens % 2) * 3;
          const std::vector<uint8_t> w = RandomRows(type, n, rows, w_stride, rng);
          const std::vector<uint8_t> a = Q8KActivations(n, tokens, a_stride, level, rng);
          const size_t out_stride = rows + 2;
          for (const bool on_copy : {false, true}) {
            if (on_copy && k->interleaved_tile == nullptr) continue;
            std::vector<float> got(out_stride * tokens, -5.0f);
            if (on_copy) {
              const std::vector<Line> copy = Interleave(*k, w, w_stride, n, rows);
              k->interleaved_tile(n, copy.data(), rows, a.data(), a_stride, tokens, got.data(),
                                  out_stride);
            } else {
              k->vec_dot_tile(n, w.data(), w_stride, rows, a.data(), a_stride, tokens, got.data(),
                              out_stride);
            }
            ASSERT_NO_FATAL_FAILURE(
                ExpectTileMatches(got, rows, tokens, out_stride, -5.0f, ref->vec_dot, n, w.data(),
                                  w_stride, a.data(), a_stride,
                                  GgmlTypeName(static_cast<uint32_t>(type)) + " level " +
                                      CpuLevelName(level) + (on_copy ? " copy" : " rows"),
                                  &checked));
          }
        }
      }
    }
  }
  if (BestCpuLevel() != CpuLevel::kScalar) {
    EXPECT_GT(checked, 0);
  }
}

// The copy of the AVX-512 K-quant kernels (kernels/cpu/kquants.h): row r's super-block i at
// quad r / 4, slot 4i + r % 4, byte for byte; rows past the last one zero; the row extractor
// gives the file's rows back.
TEST(VecDotTileKQuants, CopyLayout) {
  std::mt19937 rng(5);
  for (GgmlType type : kKQuantTileTypes) {
    const QuantKernels* k = InterleavedKernels(type);
    if (k == nullptr) GTEST_SKIP() << "no K-quant copy at " << CpuLevelName(BestCpuLevel());
    EXPECT_NE(k->in_place_tile, nullptr);
    const int64_t n = 768, nb = n / 256;
    const size_t block = RowBytes(type, 256), stride = RowBytes(type, n) + 3;
    const int rows = 21;  // a whole group, a partial one
    const std::vector<uint8_t> w = RandomRows(type, n, rows, stride, rng);
    const std::vector<Line> lines = Interleave(*k, w, stride, n, rows);
    ASSERT_EQ(k->interleaved_group_bytes(n), 16 * nb * block);
    const auto* copy = reinterpret_cast<const uint8_t*>(lines.data());
    const std::vector<uint8_t> zero(block, 0);
    for (int r = 0; r < 32; ++r) {
      for (int64_t i = 0; i < nb; ++i) {
        const uint8_t* got = copy + ((r / 4) * nb * 4 + i * 4 + r % 4) * block;
        const uint8_t* want = r < rows ? w.data() + r * stride + i * block : zero.data();
        ASSERT_EQ(std::memcmp(got, want, block), 0) << "row " << r << " super-block " << i;
      }
    }
    std::vector<uint8_t> back(RowBytes(type, n));
    for (int r = 0; r < rows; ++r) {
      k->interleaved_row(lines.data(), n, r, back.data());
      ASSERT_EQ(std::memcmp(back.data(), w.data() + r * stride, back.size()), 0) << r;
    }
  }
}

// MatMul on K-quant weights (the tile path, one token included) is batch invariant with 1 and 2
// threads, and every output equals the scalar reference vec_dot of the token's Q8_K row, on the
// Gemma 3 270M / SmolLM2 feed-forward and attention-output row lengths; where the level has the
// copy, on the rows in place, on the copy and on a copy written up to its first 32 rows.
TEST(VecDotTileKQuants, MatMulBatchInvariantAndEqualToReference) {
  std::mt19937 rng(13);
  for (CpuLevel level : Levels()) {
    for (GgmlType type : kKQuantTileTypes) {
      const QuantKernels* ref = GetQuantKernels(type, CpuLevel::kScalar);
      const QuantKernels* k = GetQuantKernels(type, level);
      for (auto [n_in, n_out] : {std::pair<int64_t, int64_t>{1536, 45}, {1024, 33}, {256, 20}}) {
        const size_t row_bytes = RowBytes(type, n_in);
        const std::vector<uint8_t> w =
            RandomRows(type, n_in, static_cast<int>(n_out), row_bytes, rng);
        cpu::WeightView rows{type, w.data(), n_in, n_out};
        std::vector<cpu::WeightView> views = {rows};
        std::vector<Line> copy, unwritten;
        const std::atomic<int64_t> first_rows{std::min<int64_t>(32, n_out)};
        if (k->interleaved_tile != nullptr) {
          rows.in_place = true;
          copy = Interleave(*k, w, row_bytes, n_in, static_cast<int>(n_out));
          unwritten = copy;  // rows past the first 32 not written yet: garbage
          const size_t written = 2 * k->interleaved_group_bytes(n_in);
          if (written < unwritten.size() * sizeof(Line)) {
            std::memset(reinterpret_cast<uint8_t*>(unwritten.data()) + written, 0x5A,
                        unwritten.size() * sizeof(Line) - written);
          }
          cpu::WeightView on_copy = rows, part = rows;
          on_copy.interleaved = copy.data();
          part.interleaved = unwritten.data();
          part.copied_rows = &first_rows;
          views = {rows, on_copy, part};
        }
        for (const cpu::WeightView& wv : views) {
          for (int64_t n_tokens : {2, 5, 9, 19, 67}) {
            SCOPED_TRACE(wv.interleaved == nullptr   ? "in place"
                         : wv.copied_rows != nullptr ? "partly copied"
                                                     : "copy");
            std::vector<float> x, single;
            ASSERT_NO_FATAL_FAILURE(
                ExpectMatMulBatchInvariant(wv, n_tokens, level, rng, &x, &single));
            std::vector<uint8_t> qa(RowBytes(GgmlType::kQ8_K, n_in));
            for (int64_t t : {int64_t{0}, n_tokens - 1}) {
              ActivationQuantizer(GgmlType::kQ8_K, level)(x.data() + t * n_in, qa.data(), n_in);
              for (int64_t o = 0; o < n_out; ++o) {
                const float want = ref->vec_dot(n_in, w.data() + o * row_bytes, qa.data());
                const float got = single[t * n_out + o];
                ASSERT_EQ(std::memcmp(&got, &want, sizeof(float)), 0)
                    << GgmlTypeName(static_cast<uint32_t>(type)) << " level " << CpuLevelName(level)
                    << " token " << t << " output " << o;
              }
            }
            ASSERT_NO_FATAL_FAILURE(ExpectMatMulRowsEqualSingle(wv, x, n_tokens, 3, single, level));
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kiln
