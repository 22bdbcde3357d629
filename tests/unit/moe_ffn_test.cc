// Mixture-of-experts pieces on their own: Backend::ExpertMatMul (one expert of a stacked 3-D
// tensor) against the whole stack's MatMul and a float64 product, and RouteExperts (gating,
// selection bias, expert groups, weight normalization and scaling) on hand-made scores. The
// whole MoE layer is checked against a float64 reference in deepseek2_forward_test.
#include "lib/model/moe_ffn.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "lib/backend/cpu/cpu_backend.h"
#include "lib/backend/cpu/dispatch.h"
#include "lib/common/ggml_type.h"
#include "lib/quant/quant.h"

namespace kiln {
namespace {

// A stack of n_expert random q8_0 matrices of `rows` rows of n_in, with its dequantized values.
struct Stack {
  std::vector<uint8_t> bytes;
  std::vector<float> values;  // [n_expert · rows, n_in], dequantized
  WeightView view;
};

Stack RandomStack(int64_t n_in, int64_t rows, int64_t n_expert, uint32_t seed) {
  Stack s;
  const QuantKernels* k = GetQuantKernels(GgmlType::kQ8_0, CpuLevel::kScalar);
  const size_t row_bytes = GgmlRowBytes(*GgmlTypeInfoOf(static_cast<uint32_t>(GgmlType::kQ8_0)),
                                        static_cast<uint64_t>(n_in));
  const int64_t n_rows = rows * n_expert;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> row(static_cast<size_t>(n_in));
  s.bytes.resize(row_bytes * n_rows);
  s.values.resize(static_cast<size_t>(n_rows * n_in));
  for (int64_t r = 0; r < n_rows; ++r) {
    for (float& v : row) v = normal(rng);
    k->quantize(row.data(), s.bytes.data() + r * row_bytes, n_in);
    k->dequantize(s.bytes.data() + r * row_bytes, s.values.data() + r * n_in, n_in);
  }
  s.view.type = GgmlType::kQ8_0;
  s.view.data = s.bytes.data();
  s.view.n_in = n_in;
  s.view.n_out = n_rows;
  s.view.name = "test_exps";
  return s;
}

// Each expert's product equals the whole stack's columns of that expert (the same kernels on the
// same rows: bitwise when the experts start on interleave-group boundaries, in both numeric
// orders) and the float64 product within q8_0's activation rounding.
TEST(ExpertMatMul, MatchesTheStackAndAFloat64Product) {
  constexpr int64_t kIn = 64, kExperts = 4, kTokens = 5;
  for (int64_t rows : {int64_t{32}, int64_t{24}}) {  // 24: experts straddle the 16-row groups
    SCOPED_TRACE(rows);
    Stack s = RandomStack(kIn, rows, kExperts, static_cast<uint32_t>(rows));
    cpu::CpuBackend backend(2);
    WeightView* matrices[] = {&s.view};
    auto store = backend.PrepareWeights(matrices, false);
    ASSERT_TRUE(store.ok()) << store.status();
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(kTokens * kIn);
    for (float& v : x) v = normal(rng);
    for (bool llama_cpp_order : {false, true}) {
      backend.set_llama_cpp_order(llama_cpp_order);
      std::vector<float> all(kTokens * rows * kExperts), one(kTokens * rows);
      ASSERT_TRUE(backend.MatMul(s.view, x.data(), kTokens, all.data()).ok());
      for (int64_t e = 0; e < kExperts; ++e) {
        ASSERT_TRUE(backend.ExpertMatMul(s.view, kExperts, e, x.data(), kTokens, one.data()).ok());
        double max_diff = 0;
        for (int64_t t = 0; t < kTokens; ++t) {
          for (int64_t o = 0; o < rows; ++o) {
            const float got = one[t * rows + o];
            if (rows % 16 == 0 || llama_cpp_order) {
              EXPECT_EQ(got, all[t * rows * kExperts + e * rows + o]) << "expert " << e;
            }
            double want = 0;
            const float* w = s.values.data() + (e * rows + o) * kIn;
            for (int64_t i = 0; i < kIn; ++i) want += double{w[i]} * x[t * kIn + i];
            max_diff = std::max(max_diff, std::abs(got - want));
          }
        }
        // |y| ~ 8; the kiln order rounds the activations to q8_0 (~0.05 per output).
        EXPECT_LT(max_diff, 0.5) << "expert " << e;
      }
    }
  }
}

TEST(ExpertMatMul, RefusesAnExpertOutsideTheStack) {
  Stack s = RandomStack(32, 16, 2, 1);
  cpu::CpuBackend backend(1);
  std::vector<float> x(32), y(16);
  for (int64_t e : {int64_t{-1}, int64_t{2}}) {
    const absl::Status st = backend.ExpertMatMul(s.view, 2, e, x.data(), 1, y.data());
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("test_exps"), std::string::npos) << st;
  }
  EXPECT_EQ(backend.ExpertMatMul(s.view, 3, 0, x.data(), 1, y.data()).code(),
            absl::StatusCode::kInvalidArgument);  // 32 rows are not 3 experts
}

// Sigmoid gating with a selection bias and 4 groups of 2, the best 2 groups selectable: the
// expert with the best score sits in a group whose runner-up is poor, so it is masked out.
TEST(RouteExperts, GroupsMaskExpertsBeforeTheTopK) {
  MoeHparams m;
  m.n_expert = 8;
  m.n_expert_used = 2;
  m.gating = MoeGating::kSigmoid;
  m.n_group = 4;
  m.n_group_used = 2;
  m.weights_norm = true;
  m.weights_scale = 2.5f;
  // Logits 0 (sigmoid 0.5); selection scores 0.5 + bias:
  //   groups {0.9, 0.0} = 0.9, {0.6, 0.6} = 1.2, {0.5, 0.55} = 1.05, {0.1, 0.1} = 0.2.
  const std::vector<float> logits(8, 0.0f);
  const std::vector<float> bias = {0.4f, -0.5f, 0.1f, 0.1f, 0.0f, 0.05f, -0.4f, -0.4f};
  int32_t experts[2];
  float weights[2];
  RouteExperts(m, logits.data(), bias.data(), 1, experts, weights);
  EXPECT_EQ(experts[0], 2);  // tie at 0.6: the lower id first
  EXPECT_EQ(experts[1], 3);
  // The weights are the unbiased gates (0.5 each), normalized to 0.5 and scaled by 2.5.
  EXPECT_FLOAT_EQ(weights[0], 1.25f);
  EXPECT_FLOAT_EQ(weights[1], 1.25f);
  // Without groups expert 0 wins.
  m.n_group = 0;
  RouteExperts(m, logits.data(), bias.data(), 1, experts, weights);
  EXPECT_EQ(experts[0], 0);
  EXPECT_EQ(experts[1], 2);
}

// Softmax gating is ggml_soft_max's arithmetic, as llama.cpp routes: every weight bitwise the
// scalar definition of the op kernels' softmax (ggml_v_expf's polynomial, a double sum in chunks
// of 16), which is not libm's exp (some of the 64 probabilities differ from it in the last bits).
TEST(RouteExperts, SoftmaxIsGgmlSoftMax) {
  // ggml_vec_soft_max_f32 (AVX-512 build): whole chunks of 16 by ggml_v_expf (the op kernels'
  // scalar definition), the rest by libm's expf added one at a time. 8 experts: libm only;
  // 64: chunks only; 72: both.
  for (int n : {8, 64, 72}) {
    SCOPED_TRACE(n);
    MoeHparams m;
    m.n_expert = n;
    m.n_expert_used = n;
    m.gating = MoeGating::kSoftmax;
    std::vector<float> logits(n);
    for (int e = 0; e < n; ++e) logits[e] = std::sin(0.37f * static_cast<float>(e)) * 3.0f;
    std::vector<int32_t> experts(n);
    std::vector<float> weights(n);
    RouteExperts(m, logits.data(), nullptr, 1, experts.data(), weights.data());
    const cpu::OpKernels& scalar = cpu::GetOpKernels(CpuLevel::kScalar);
    const int chunked = n / 16 * 16;
    const float mx = *std::max_element(logits.begin(), logits.end());
    std::vector<float> ggml(n);
    double sum = scalar.softmax_exp(logits.data(), mx, chunked, ggml.data());
    for (int e = chunked; e < n; ++e) {
      ggml[e] = std::exp(logits[e] - mx);
      sum += ggml[e];
    }
    double libm_sum = 0;
    for (float z : logits) libm_sum += std::exp(z - mx);
    int differ_from_libm = 0;
    for (int j = 0; j < n; ++j) {
      const int e = experts[j];
      EXPECT_EQ(weights[j], ggml[e] * static_cast<float>(1.0 / sum)) << "expert " << e;
      const float libm = std::exp(logits[e] - mx) * static_cast<float>(1.0 / libm_sum);
      differ_from_libm += libm != weights[j] ? 1 : 0;
    }
    // ggml_v_expf is not libm's expf: where chunks are used, some probabilities differ.
    if (chunked > 0) {
      EXPECT_GT(differ_from_libm, 0);
    } else {
      EXPECT_EQ(differ_from_libm, 0);
    }
    std::printf("softmax gating, %d experts: %d probabilities differ from libm's exp\n", n,
                differ_from_libm);
  }
}

// Softmax gating over all experts, weights the probabilities themselves (no normalization, scale
// 1), rows independent.
TEST(RouteExperts, SoftmaxTopKPerRow) {
  MoeHparams m;
  m.n_expert = 4;
  m.n_expert_used = 2;
  m.gating = MoeGating::kSoftmax;
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, 3.0f,   // row 0
                                     3.0f, 0.0f, 0.0f, 2.5f};  // row 1
  int32_t experts[4];
  float weights[4];
  RouteExperts(m, logits.data(), nullptr, 2, experts, weights);
  const double z0 = 1 + std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  EXPECT_EQ(experts[0], 3);
  EXPECT_EQ(experts[1], 2);
  EXPECT_NEAR(weights[0], std::exp(3.0) / z0, 1e-6);
  EXPECT_NEAR(weights[1], std::exp(2.0) / z0, 1e-6);
  const double z1 = std::exp(3.0) + 2 + std::exp(2.5);
  EXPECT_EQ(experts[2], 0);
  EXPECT_EQ(experts[3], 3);
  EXPECT_NEAR(weights[2], std::exp(3.0) / z1, 1e-6);
  EXPECT_NEAR(weights[3], std::exp(2.5) / z1, 1e-6);
}

}  // namespace
}  // namespace kiln
