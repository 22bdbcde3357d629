// MatMulLlamaCpp (lib/backend/cpu/matmul_llama_cpp.h), the llama.cpp order's matmul for F32, F16
// and Q8_0 weights: the summation orders its header documents (checked against lane sums written
// out here), ggml's batch rule for the float types (tinyBLAS for two or more tokens when
// n_out % 4 == 0), Q8_0's batch invariance, f16 rounding of the activations, the CPU backend's
// routing in the llama.cpp order, and the errors. The bit-for-bit agreement with llama.cpp itself
// is arch_golden_test's (qwen2).
#include "lib/backend/cpu/matmul_llama_cpp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/kquants.h"
#include "lib/backend/cpu/cpu_backend.h"
#include "lib/backend/cpu/dispatch.h"
#include "lib/common/half.h"
#include "lib/quant/activation.h"
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

// Q4_0, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K weights (reference-quantized): every output close to the
// float64 product (two 8-bit-ish roundings), and ggml's batch rules: Q4_0 (repacked or not),
// Q5_0 and Q5_1 give a token the same bits alone and in any batch; a repacked Q4_K
// (n_out % 8 == 0) runs the 4-row gemm for the batch's whole groups of four rows (other bits) and
// the gemv (a token's bits alone) for the rest; Q5_K, Q6_K and an unrepacked Q4_K take the
// vec_dot lanes below 8 rows (the bits alone) and the tiled kernel from 8 rows (other bits). The
// bit-for-bit agreement with ggml is e2e_gemma3_test's (Gemma 3 270M's Q5_0, Q4_K and Q6_K tensors,
// greedy logits equal to llama.cpp's).
TEST(MatMulLlamaCpp, Q5_0Q4KQ6KFollowGgmlsBatchRules) {
  constexpr int64_t kIn = 512;
  ThreadPool pool(2);
  Scratch scratch;
  enum Rule { kInvariant, kGemmGroupsOfFour, kTiledFromEight };
  struct Case {
    GgmlType type;
    int64_t n_out;
    Rule rule;
  };
  for (const Case& c :
       {Case{GgmlType::kQ5_0, 12, kInvariant}, Case{GgmlType::kQ4_0, 12, kInvariant},
        Case{GgmlType::kQ4_0, 16, kInvariant}, Case{GgmlType::kQ5_1, 12, kInvariant},
        Case{GgmlType::kQ4_K, 16, kGemmGroupsOfFour}, Case{GgmlType::kQ4_K, 12, kTiledFromEight},
        Case{GgmlType::kQ5_K, 16, kTiledFromEight}, Case{GgmlType::kQ6_K, 16, kTiledFromEight}}) {
    SCOPED_TRACE(::testing::Message()
                 << GgmlTypeName(static_cast<uint32_t>(c.type)) << " x " << c.n_out);
    ASSERT_TRUE(HasLlamaCppMatMul(c.type));
    const QuantKernels* k = GetQuantKernels(c.type, CpuLevel::kScalar);
    ASSERT_NE(k, nullptr);
    const std::vector<float> w32 = Normal(c.n_out * kIn, 9, 0.05f);
    const size_t row_bytes = GgmlRowBytes(*GgmlTypeInfoOf(static_cast<uint32_t>(c.type)), kIn);
    std::vector<uint8_t> wq(c.n_out * row_bytes);
    std::vector<float> deq(w32.size());
    for (int64_t o = 0; o < c.n_out; ++o) {
      k->quantize(w32.data() + o * kIn, wq.data() + o * row_bytes, kIn);
      k->dequantize(wq.data() + o * row_bytes, deq.data() + o * kIn, kIn);
    }
    const WeightView wv = View(c.type, wq.data(), kIn, c.n_out);
    constexpr int64_t kTokens = 9;
    const std::vector<float> x = Normal(kTokens * kIn, 10);
    std::vector<float> alone(kTokens * c.n_out);
    for (int32_t t = 0; t < kTokens; ++t) {
      ASSERT_TRUE(
          MatMulLlamaCpp(pool, wv, x.data(), &t, 1, alone.data() + t * c.n_out, scratch).ok());
      for (int64_t o = 0; o < c.n_out; ++o) {
        double exact = 0;
        for (int64_t i = 0; i < kIn; ++i) exact += double{deq[o * kIn + i]} * x[t * kIn + i];
        EXPECT_NEAR(alone[t * c.n_out + o], exact, 0.05) << t << ", " << o;
      }
    }
    for (int64_t n_rows : {int64_t{7}, kTokens}) {
      std::vector<float> batch(n_rows * c.n_out);
      ASSERT_TRUE(MatMulLlamaCpp(pool, wv, x.data(), nullptr, n_rows, batch.data(), scratch).ok());
      int differs_where_other_order = 0;
      for (int64_t t = 0; t < n_rows; ++t) {
        const bool own_order = c.rule == kInvariant ||
                               (c.rule == kGemmGroupsOfFour && t >= n_rows - n_rows % 4) ||
                               (c.rule == kTiledFromEight && n_rows < 8);
        for (int64_t o = 0; o < c.n_out; ++o) {
          const int64_t i = t * c.n_out + o;
          EXPECT_NEAR(batch[i], alone[i], 1e-4 * std::fabs(alone[i]) + 1e-6) << i;
          if (own_order) {
            EXPECT_EQ(batch[i], alone[i]) << n_rows << " rows, token " << t << ", output " << o;
          } else {
            differs_where_other_order += batch[i] != alone[i];
          }
        }
      }
      if (c.rule == kGemmGroupsOfFour || (c.rule == kTiledFromEight && n_rows >= 8)) {
        EXPECT_GT(differs_where_other_order, 0) << n_rows << " rows: the other order shows";
      }
    }
  }
  std::vector<float> y(4);
  EXPECT_EQ(MatMulLlamaCpp(pool, View(GgmlType::kQ6_K, y.data(), 128, 1), y.data(), nullptr, 1,
                           y.data(), scratch)
                .code(),
            absl::StatusCode::kInvalidArgument);  // n_in not a multiple of 256
}

// Q4_0, Q5_1 and Q5_K one token at a time against ggml's steps written out here from the blocks
// (the header's formulas): Q4_0 repacked (n_out % 8 == 0: one fma chain of whole-block integer
// sums) and not (n_out % 8 != 0: Q8_0's 8 lanes over q - 8), Q5_1's 8 lanes plus its min chain
// on Q8_1 activations, Q5_K's vec_dot lanes plus one min chain below 8 rows and the tiled
// per-super-block form from 8 rows. Bit for bit.
TEST(MatMulLlamaCpp, Q4_0Q5_1Q5KFollowGgmlsStepsWrittenOut) {
  constexpr int64_t kIn = 512;
  ThreadPool pool(1);
  Scratch scratch;
  const std::vector<float> x = Normal(8 * kIn, 21);
  auto quantized = [&](GgmlType type, int64_t n_out) {
    const QuantKernels* k = GetQuantKernels(type, CpuLevel::kScalar);
    const size_t row_bytes = GgmlRowBytes(*GgmlTypeInfoOf(static_cast<uint32_t>(type)), kIn);
    const std::vector<float> w32 = Normal(n_out * kIn, 22, 0.05f);
    std::vector<uint8_t> wq(n_out * row_bytes);
    for (int64_t o = 0; o < n_out; ++o) {
      k->quantize(w32.data() + o * kIn, wq.data() + o * row_bytes, kIn);
    }
    return wq;
  };
  auto f16 = [](const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return Fp16ToFp32(h);
  };
  auto hsum8 = [](const float* a) {
    return ((a[4] + a[0]) + (a[6] + a[2])) + ((a[5] + a[1]) + (a[7] + a[3]));
  };

  // Q4_0 (18-byte blocks: f16 d, 16 bytes of nibbles) against Q8_0 activations.
  std::vector<uint8_t> act(kIn / 32 * 34);
  ActivationQuantizer(GgmlType::kQ8_0, CpuLevel::kScalar)(x.data(), act.data(), kIn);
  for (int64_t n_out : {16, 12}) {
    const std::vector<uint8_t> wq = quantized(GgmlType::kQ4_0, n_out);
    std::vector<float> y(n_out);
    ASSERT_TRUE(MatMulLlamaCpp(pool, View(GgmlType::kQ4_0, wq.data(), kIn, n_out), x.data(),
                               nullptr, 1, y.data(), scratch)
                    .ok());
    for (int64_t o = 0; o < n_out; ++o) {
      float chain = 0, lanes[8] = {};
      for (int64_t b = 0; b < kIn / 32; ++b) {
        const uint8_t* wb = wq.data() + (o * kIn / 32 + b) * 18;
        const uint8_t* ab = act.data() + b * 34;
        const float s = f16(wb) * f16(ab);
        int32_t p[8] = {}, isum = 0;
        for (int e = 0; e < 32; ++e) {
          const int q = (e < 16 ? wb[2 + e] & 15 : wb[2 + e - 16] >> 4) - 8;
          p[e / 4] += q * static_cast<int8_t>(ab[2 + e]);
          isum += q * static_cast<int8_t>(ab[2 + e]);
        }
        chain = std::fma(static_cast<float>(isum), s, chain);
        for (int l = 0; l < 8; ++l) lanes[l] = std::fma(s, static_cast<float>(p[l]), lanes[l]);
      }
      EXPECT_EQ(y[o], n_out % 8 == 0 ? chain : hsum8(lanes)) << "Q4_0 x " << n_out << ", " << o;
    }
  }

  // Q5_1 (24-byte blocks: f16 d, f16 m, 4 bytes of fifth bits, 16 bytes of nibbles) against
  // Q8_1 activations (f16 d, f16 s, 32 int8).
  {
    constexpr int64_t kOut = 8;
    const std::vector<uint8_t> wq = quantized(GgmlType::kQ5_1, kOut);
    std::vector<uint8_t> act1(kIn / 32 * 36);
    ActivationQuantizer(GgmlType::kQ8_1, CpuLevel::kScalar)(x.data(), act1.data(), kIn);
    std::vector<float> y(kOut);
    ASSERT_TRUE(MatMulLlamaCpp(pool, View(GgmlType::kQ5_1, wq.data(), kIn, kOut), x.data(), nullptr,
                               1, y.data(), scratch)
                    .ok());
    for (int64_t o = 0; o < kOut; ++o) {
      float lanes[8] = {}, summs = 0;
      for (int64_t b = 0; b < kIn / 32; ++b) {
        const uint8_t* wb = wq.data() + (o * kIn / 32 + b) * 24;
        const uint8_t* ab = act1.data() + b * 36;
        uint32_t qh;
        std::memcpy(&qh, wb + 4, 4);
        summs = std::fma(f16(wb + 2), f16(ab + 2), summs);
        int32_t p[8] = {};
        for (int e = 0; e < 32; ++e) {
          const int nibble = e < 16 ? wb[8 + e] & 15 : wb[8 + e - 16] >> 4;
          p[e / 4] += (nibble | ((qh >> e) & 1) << 4) * static_cast<int8_t>(ab[4 + e]);
        }
        for (int l = 0; l < 8; ++l) {
          lanes[l] = std::fma(static_cast<float>(p[l]), f16(wb) * f16(ab), lanes[l]);
        }
      }
      EXPECT_EQ(y[o], hsum8(lanes) + summs) << "Q5_1, " << o;
    }
  }

  // Q5_K (176-byte super-blocks: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 32 bytes
  // of fifth bits, 128 bytes of nibbles) against Q8_K activations (the type's quantizer, ggml's
  // quantize_row_q8_K_ref rule).
  {
    constexpr int64_t kOut = 8;
    const std::vector<uint8_t> wq = quantized(GgmlType::kQ5_K, kOut);
    const QuantKernels* q8k = GetQuantKernels(GgmlType::kQ8_K, CpuLevel::kScalar);
    ASSERT_NE(q8k, nullptr);
    std::vector<uint8_t> act_k(kIn / 256 * sizeof(kquants::BlockQ8K));
    std::vector<float> y1(kOut), y8(8 * kOut);
    ASSERT_TRUE(MatMulLlamaCpp(pool, View(GgmlType::kQ5_K, wq.data(), kIn, kOut), x.data(), nullptr,
                               1, y1.data(), scratch)
                    .ok());
    ASSERT_TRUE(MatMulLlamaCpp(pool, View(GgmlType::kQ5_K, wq.data(), kIn, kOut), x.data(), nullptr,
                               8, y8.data(), scratch)
                    .ok());
    for (int64_t t : {0, 5}) {
      q8k->quantize(x.data() + t * kIn, act_k.data(), kIn);
      const auto* a = reinterpret_cast<const kquants::BlockQ8K*>(act_k.data());
      for (int64_t o = 0; o < kOut; ++o) {
        const auto* w = reinterpret_cast<const kquants::BlockQ5K*>(wq.data()) + o * kIn / 256;
        float lanes[8] = {}, summs = 0, tiled = 0;
        for (int64_t i = 0; i < kIn / 256; ++i) {
          uint8_t sc[8], m[8];
          kquants::UnpackQ4KScales(w[i].scales, sc, m);
          int32_t p[8] = {}, isum = 0, msum = 0;
          for (int e = 0; e < 256; ++e) {
            const int j = e / 32, nibble_byte = 32 * (e / 64) + e % 32;
            const int nibble = e % 64 < 32 ? w[i].qs[nibble_byte] & 15 : w[i].qs[nibble_byte] >> 4;
            const int u = nibble | ((w[i].qh[e % 32] >> j) & 1) << 4;
            p[(e % 32) / 4] += sc[j] * u * a[i].qs[e];
            isum += sc[j] * u * a[i].qs[e];
          }
          for (int j = 0; j < 8; ++j) msum += m[j] * (a[i].bsums[2 * j] + a[i].bsums[2 * j + 1]);
          const float d = a[i].d * Fp16ToFp32(w[i].d), dmin = -a[i].d * Fp16ToFp32(w[i].dmin);
          summs = std::fma(dmin, static_cast<float>(msum), summs);
          for (int l = 0; l < 8; ++l) lanes[l] = std::fma(d, static_cast<float>(p[l]), lanes[l]);
          tiled = std::fma(std::fma(-static_cast<float>(msum), Fp16ToFp32(w[i].dmin),
                                    static_cast<float>(isum) * Fp16ToFp32(w[i].d)),
                           a[i].d, tiled);
        }
        if (t == 0) {
          EXPECT_EQ(y1[o], hsum8(lanes) + summs) << "Q5_K vec_dot, " << o;
        }
        EXPECT_EQ(y8[t * kOut + o], tiled) << "Q5_K tiled, token " << t << ", " << o;
      }
    }
  }
}

// op_kernels.h's q8_0_dot_ggml, which the Q8_0 and Q5_0 matmuls run: every level gives the
// scalar definition's bits, which follow the lane order written out here (including the
// extreme values -128 and 127 in both rows).
TEST(MatMulLlamaCpp, Q8_0DotKernelEqualsItsDefinitionAtEveryLevel) {
  constexpr int64_t kBlocks = 7;
  std::mt19937 rng(12);
  std::uniform_int_distribution<int> q(-128, 127);
  std::vector<uint8_t> w(kBlocks * 34), a(kBlocks * 34);
  float acc[8] = {};
  for (int64_t b = 0; b < kBlocks; ++b) {
    const uint16_t dw = Fp32ToFp16(0.01f * (b + 1)), da = Fp32ToFp16(-0.37f / (b + 1));
    std::memcpy(&w[b * 34], &dw, 2);
    std::memcpy(&a[b * 34], &da, 2);
    int8_t qw[32], qa[32];
    for (int e = 0; e < 32; ++e) {
      qw[e] = static_cast<int8_t>(b == 0 ? -128 : q(rng));
      qa[e] = static_cast<int8_t>(b == 0 ? (e % 2 ? 127 : -128) : q(rng));
    }
    std::memcpy(&w[b * 34 + 2], qw, 32);
    std::memcpy(&a[b * 34 + 2], qa, 32);
    const float s = Fp16ToFp32(dw) * Fp16ToFp32(da);
    for (int l = 0; l < 8; ++l) {
      int32_t p = 0;
      for (int e = 4 * l; e < 4 * l + 4; ++e) p += qw[e] * qa[e];
      acc[l] = std::fma(s, static_cast<float>(p), acc[l]);
    }
  }
  const float want =
      ((acc[4] + acc[0]) + (acc[6] + acc[2])) + ((acc[5] + acc[1]) + (acc[7] + acc[3]));
  for (CpuLevel level : {CpuLevel::kScalar, CpuLevel::kAvx2, CpuLevel::kAvx512}) {
    if (level > BestCpuLevel()) continue;
    EXPECT_EQ(GetOpKernels(level).q8_0_dot_ggml(w.data(), a.data(), kBlocks * 32), want)
        << CpuLevelName(level);
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
  EXPECT_FALSE(HasLlamaCppMatMul(GgmlType::kQ4_1));  // its own kernels sum in ggml's order
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
