// MatMulLlamaCpp (lib/backend/cpu/matmul_llama_cpp.h), the llama.cpp order's matmul for F32, F16
// and Q8_0 weights: the summation orders its header documents (checked against lane sums written
// out here), ggml's batch rule for the float types (tinyBLAS for two or more tokens when
// n_out % 4 == 0), Q8_0's batch invariance, f16 rounding of the activations, the CPU backend's
// routing in the llama.cpp order, and the errors. The bit-for-bit agreement with llama.cpp itself
// is qwen2_golden_test's.
#include "lib/backend/cpu/matmul_llama_cpp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "lib/backend/cpu/cpu_backend.h"
#include "lib/common/half.h"
#include "lib/quant/quant.h"

namespace kiln::cpu {
namespace {

std::vector<float> Normal(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

WeightView View(GgmlType type, const void* data, int64_t n_in, int64_t n_out) {
  WeightView w;
  w.type = type;
  w.data = data;
  w.n_in = n_in;
  w.n_out = n_out;
  return w;
}

// The two float orders, written out: `lanes` FMA chains over the whole steps of `lanes` elements
// (16: tinyBLAS; 64: ggml_vec_dot_f32's 4 x 16, first reduced as ((L0 + L2) + (L1 + L3))), then
// _mm512_reduce_add_ps's tree, then the remaining products added one at a time.
float LaneDot(const float* w, const float* x, int64_t n, int lanes) {
  const int64_t full = n - n % lanes;
  std::vector<float> acc(lanes, 0.0f);
  for (int64_t i = 0; i < full; ++i) acc[i % lanes] = std::fma(w[i], x[i], acc[i % lanes]);
  float v[16];
  for (int l = 0; l < 16; ++l) {
    v[l] = lanes == 16 ? acc[l] : (acc[l] + acc[32 + l]) + (acc[16 + l] + acc[48 + l]);
  }
  float t8[8], t4[4];
  for (int i = 0; i < 8; ++i) t8[i] = v[8 + i] + v[i];
  for (int i = 0; i < 4; ++i) t4[i] = t8[4 + i] + t8[i];
  float s = (t4[0] + t4[2]) + (t4[1] + t4[3]);
  for (int64_t i = full; i < n; ++i) s += w[i] * x[i];
  return s;
}

// n_in 1040: 16 whole tinyBLAS steps but a 16-element tail after 64-lane steps (and longer than
// the attention kernels' 1024-element rows).
TEST(MatMulLlamaCpp, F32FollowsGgmlsBatchRule) {
  ThreadPool pool(2);
  Scratch scratch;
  for (auto [kIn, n_out] : {std::pair<int64_t, int64_t>{256, 8}, {256, 7}, {1040, 12}}) {
    SCOPED_TRACE(::testing::Message() << kIn << " x " << n_out);  // tinyBLAS: n_out % 4 == 0
    const std::vector<float> x = Normal(3 * kIn, 1);
    const std::vector<float> w = Normal(n_out * kIn, 2, 0.0625f);
    const WeightView wv = View(GgmlType::kF32, w.data(), kIn, n_out);
    std::vector<float> one(n_out), batch(3 * n_out);
    ASSERT_TRUE(MatMulLlamaCpp(pool, wv, x.data(), nullptr, 1, one.data(), scratch).ok());
    ASSERT_TRUE(MatMulLlamaCpp(pool, wv, x.data(), nullptr, 3, batch.data(), scratch).ok());
    int batch_differs = 0;
    for (int64_t o = 0; o < n_out; ++o) {
      const float vec_dot = LaneDot(w.data() + o * kIn, x.data(), kIn, 64);
      EXPECT_EQ(one[o], vec_dot) << o;
      for (int64_t t = 0; t < 3; ++t) {
        const float want =
            LaneDot(w.data() + o * kIn, x.data() + t * kIn, kIn, n_out % 4 == 0 ? 16 : 64);
        EXPECT_EQ(batch[t * n_out + o], want) << t << ", " << o;
        double exact = 0;
        for (int64_t i = 0; i < kIn; ++i) exact += double{w[o * kIn + i]} * x[t * kIn + i];
        EXPECT_NEAR(batch[t * n_out + o], exact, 1e-4);
      }
      batch_differs += batch[o] != one[o];
    }
    // The orders do differ in the last bit for some outputs (why the rule matters).
    if (n_out % 4 == 0) {
      EXPECT_GT(batch_differs, 0);
    } else {
      EXPECT_EQ(batch_differs, 0);
    }
  }
}

// F16 weights take activations rounded to f16 (ggml converts src1 to the weight's type): the same
// bits as F32 weights holding the widened f16 values times the rounded activations.
TEST(MatMulLlamaCpp, F16RoundsActivationsToF16) {
  constexpr int64_t kIn = 128, kOut = 12;
  ThreadPool pool(1);
  Scratch scratch;
  const std::vector<float> x = Normal(2 * kIn, 3);
  const std::vector<float> w32 = Normal(kOut * kIn, 4, 0.1f);
  std::vector<uint16_t> w16(w32.size());
  std::vector<float> widened(w32.size()), x_rounded(x.size());
  for (size_t i = 0; i < w32.size(); ++i) {
    w16[i] = Fp32ToFp16(w32[i]);
    widened[i] = Fp16ToFp32(w16[i]);
  }
  for (size_t i = 0; i < x.size(); ++i) x_rounded[i] = Fp16ToFp32(Fp32ToFp16(x[i]));
  for (int64_t n : {1, 2}) {
    std::vector<float> y16(n * kOut), y32(n * kOut);
    ASSERT_TRUE(MatMulLlamaCpp(pool, View(GgmlType::kF16, w16.data(), kIn, kOut), x.data(), nullptr,
                               n, y16.data(), scratch)
                    .ok());
    ASSERT_TRUE(MatMulLlamaCpp(pool, View(GgmlType::kF32, widened.data(), kIn, kOut),
                               x_rounded.data(), nullptr, n, y32.data(), scratch)
                    .ok());
    EXPECT_EQ(0, std::memcmp(y16.data(), y32.data(), y16.size() * sizeof(float))) << n;
  }
  // Rounding x is visible: with the unrounded activations some output differs.
  std::vector<float> y16(kOut), y32(kOut);
  ASSERT_TRUE(MatMulLlamaCpp(pool, View(GgmlType::kF16, w16.data(), kIn, kOut), x.data(), nullptr,
                             1, y16.data(), scratch)
                  .ok());
  ASSERT_TRUE(MatMulLlamaCpp(pool, View(GgmlType::kF32, widened.data(), kIn, kOut), x.data(),
                             nullptr, 1, y32.data(), scratch)
                  .ok());
  EXPECT_NE(0, std::memcmp(y16.data(), y32.data(), y16.size() * sizeof(float)));
}

// Q8_0: ggml's 8-lane order, the same bits for a token alone, in a batch or picked by `rows`.
TEST(MatMulLlamaCpp, Q8_0IsBatchInvariantAndCloseToExact) {
  constexpr int64_t kIn = 256, kOut = 9;
  const QuantKernels* k = GetQuantKernels(GgmlType::kQ8_0, CpuLevel::kScalar);
  ASSERT_NE(k, nullptr);
  const std::vector<float> w32 = Normal(kOut * kIn, 5, 0.0625f);
  const size_t row_bytes = kIn / 32 * 34;
  std::vector<uint8_t> wq(kOut * row_bytes);
  for (int64_t o = 0; o < kOut; ++o)
    k->quantize(w32.data() + o * kIn, wq.data() + o * row_bytes, kIn);
  const WeightView wv = View(GgmlType::kQ8_0, wq.data(), kIn, kOut);
  const std::vector<float> x = Normal(4 * kIn, 6);
  ThreadPool pool(2);
  Scratch scratch;
  std::vector<float> batch(4 * kOut);
  ASSERT_TRUE(MatMulLlamaCpp(pool, wv, x.data(), nullptr, 4, batch.data(), scratch).ok());
  for (int32_t t = 0; t < 4; ++t) {
    std::vector<float> alone(kOut);
    ASSERT_TRUE(MatMulLlamaCpp(pool, wv, x.data(), &t, 1, alone.data(), scratch).ok());
    EXPECT_EQ(0, std::memcmp(alone.data(), batch.data() + t * kOut, kOut * sizeof(float))) << t;
    for (int64_t o = 0; o < kOut; ++o) {
      double exact = 0;
      for (int64_t i = 0; i < kIn; ++i) exact += double{w32[o * kIn + i]} * x[t * kIn + i];
      EXPECT_NEAR(batch[t * kOut + o], exact, 0.05);  // two 8-bit roundings
    }
  }
}

TEST(MatMulLlamaCpp, CpuBackendUsesItInTheLlamaCppOrder) {
  constexpr int64_t kIn = 64, kOut = 8;
  const std::vector<float> w = Normal(kOut * kIn, 7);
  const std::vector<float> x = Normal(2 * kIn, 8);
  const WeightView wv = View(GgmlType::kF32, w.data(), kIn, kOut);
  CpuBackend backend(1);
  backend.set_llama_cpp_order(true);
  ThreadPool pool(1);
  Scratch scratch;
  std::vector<float> got(2 * kOut), want(2 * kOut);
  ASSERT_TRUE(backend.MatMul(wv, x.data(), 2, got.data()).ok());
  ASSERT_TRUE(MatMulLlamaCpp(pool, wv, x.data(), nullptr, 2, want.data(), scratch).ok());
  EXPECT_EQ(got, want);
}

TEST(MatMulLlamaCpp, Errors) {
  ThreadPool pool(1);
  Scratch scratch;
  std::vector<float> data(64 * 4), y(4);
  EXPECT_FALSE(HasLlamaCppMatMul(GgmlType::kQ4_1));
  EXPECT_EQ(MatMulLlamaCpp(pool, View(GgmlType::kQ4_1, data.data(), 64, 4), data.data(), nullptr, 1,
                           y.data(), scratch)
                .code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(MatMulLlamaCpp(pool, View(GgmlType::kF32, nullptr, 64, 4), data.data(), nullptr, 1,
                           y.data(), scratch)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MatMulLlamaCpp(pool, View(GgmlType::kQ8_0, data.data(), 48, 1), data.data(), nullptr, 1,
                           y.data(), scratch)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MatMulLlamaCpp(pool, View(GgmlType::kF32, data.data(), 0, 4), data.data(), nullptr, 1,
                           y.data(), scratch)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kiln::cpu
