// deepseek2 (Multi-head Latent Attention): what kiln reads from the GGUF keys and tensors the
// converter writes (the kiln-mkmodel shapes tiny-deepseek2, -lite and -kvb), the latent cache
// layout it asks for, and the files it refuses.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "lib/gguf/gguf.h"
#include "lib/gguf/gguf_writer.h"
#include "lib/model/model.h"
#include "lib/model/random_model.h"
#include "tests/common/test_util.h"

namespace kiln {
namespace {

absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& path) {
  ModelLoadOptions options;
  options.path = path;
  return Model::Load(options);
}

void ExpectError(const absl::Status& st, absl::StatusCode code, const std::string& names) {
  EXPECT_EQ(st.code(), code) << st;
  EXPECT_NE(st.message().find(names), std::string::npos) << st << " should name " << names;
}

std::vector<float> F32Zeros(size_t n) { return std::vector<float>(n, 0.0f); }

std::span<const uint8_t> Bytes(const std::vector<float>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float)};
}

TEST(Deepseek2, ReadsMlaHparamsAndTensors) {
  struct Case {
    const char* shape;
    int64_t q_lora_rank;
    bool split_kv_b;
  };
  for (const Case& c : {Case{"tiny-deepseek2", 128, true}, Case{"tiny-deepseek2-lite", 0, true},
                        Case{"tiny-deepseek2-kvb", 128, false}}) {
    SCOPED_TRACE(c.shape);
    auto model = Load(testing::WriteEditedModel(c.shape));
    ASSERT_TRUE(model.ok()) << model.status();
    const ModelHparams& hp = (*model)->hparams();
    EXPECT_EQ(hp.arch, "deepseek2");
    EXPECT_EQ(hp.mla.q_lora_rank, c.q_lora_rank);
    EXPECT_EQ(hp.mla.kv_lora_rank, 64);
    EXPECT_EQ(hp.mla.nope_dim, 32);
    EXPECT_EQ(hp.mla.rope_dim, 16);
    EXPECT_EQ(hp.mla.v_head_dim, 32);
    EXPECT_EQ(hp.mla.split_kv_b, c.split_kv_b);
    EXPECT_EQ(hp.mla.n_layer_dense_lead, 2);
    EXPECT_EQ(hp.head_dim, 48);
    EXPECT_EQ(hp.rope.n_rot, 16);
    EXPECT_EQ(hp.rope.mode, RopeMode::kNorm);
    EXPECT_EQ(hp.rope.scaling, RopeScaling::kNone);
    const Model& m = **model;
    EXPECT_EQ(m.Tensor("blk.1.attn_q_a.weight") != nullptr, c.q_lora_rank > 0);
    EXPECT_EQ(m.Tensor("blk.1.attn_q.weight") != nullptr, c.q_lora_rank == 0);
    ASSERT_NE(m.Tensor("blk.1.attn_kv_a_mqa.weight"), nullptr);
    EXPECT_EQ(m.Tensor("blk.1.attn_kv_a_mqa.weight")->n_out, 64 + 16);
    if (c.split_kv_b) {
      // {nope, kv_lora_rank, n_head} binds as n_head stacked matrices of kv_lora_rank rows.
      ASSERT_NE(m.Tensor("blk.0.attn_k_b.weight"), nullptr);
      EXPECT_EQ(m.Tensor("blk.0.attn_k_b.weight")->n_in, 32);
      EXPECT_EQ(m.Tensor("blk.0.attn_k_b.weight")->n_out, 64 * 4);
      EXPECT_EQ(m.Tensor("blk.0.attn_v_b.weight")->n_out, 32 * 4);
    } else {
      ASSERT_NE(m.Tensor("blk.0.attn_kv_b.weight"), nullptr);
      EXPECT_EQ(m.Tensor("blk.0.attn_kv_b.weight")->n_out, 4 * (32 + 32));
    }
    // The latent cache: one row of kv_lora_rank + rope_dim per token per layer.
    auto layout = m.architecture().CacheLayout(hp, GgmlType::kF16, 16);
    ASSERT_TRUE(layout.ok()) << layout.status();
    EXPECT_EQ(layout->kind(), KvAttentionKind::kMla);
    EXPECT_EQ(layout->row_elems(), 64 + 16);
    EXPECT_EQ(layout->bytes_per_token(), 2u * (64 + 16) * 2);  // L·(d_c + d_r)·b
  }
}

TEST(Deepseek2, RefusesBadFilesNamingWhatIsWrong) {
  ExpectError(
      Load(testing::WriteEditedModel("tiny-deepseek2", "blk.1.attn_kv_a_mqa.weight")).status(),
      absl::StatusCode::kInvalidArgument, "blk.1.attn_kv_a_mqa.weight");
  ExpectError(
      Load(testing::WriteEditedModel("tiny-deepseek2", "blk.0.attn_q_a_norm.weight")).status(),
      absl::StatusCode::kInvalidArgument, "blk.0.attn_q_a_norm.weight");
  ExpectError(
      Load(testing::WriteEditedModel("tiny-deepseek2", "", "deepseek2.attention.kv_lora_rank"))
          .status(),
      absl::StatusCode::kNotFound, "deepseek2.attention.kv_lora_rank");
  // attn_k_b flattened to two dimensions: the stacked shape is named.
  ExpectError(
      Load(testing::WriteEditedModel(
               "tiny-deepseek2", "blk.0.attn_k_b.weight", "",
               [](gguf::GgufWriter& w) {
                 const auto zeros = F32Zeros(32 * 64 * 4);
                 ASSERT_TRUE(w.AddTensor("blk.0.attn_k_b.weight", 0, {32, 256}, Bytes(zeros)).ok());
               }))
          .status(),
      absl::StatusCode::kInvalidArgument, "{32, 64, 4}");
  // A rope part as long as the whole key head leaves nothing unrotated.
  ExpectError(Load(testing::WriteEditedModel("tiny-deepseek2", "", "deepseek2.rope.dimension_count",
                                             [](gguf::GgufWriter& w) {
                                               w.SetUint32("deepseek2.rope.dimension_count", 48);
                                             }))
                  .status(),
              absl::StatusCode::kInvalidArgument, "key_length_mla");
  // A dense file that claims mixture-of-experts layers without their keys: refused, not misread
  // as dense.
  ExpectError(
      Load(testing::WriteEditedModel(
               "tiny-deepseek2", "", "deepseek2.leading_dense_block_count",
               [](gguf::GgufWriter& w) { w.SetUint32("deepseek2.leading_dense_block_count", 1); }))
          .status(),
      absl::StatusCode::kNotFound, "deepseek2.expert_count");
  ExpectError(Load(testing::WriteEditedModel("tiny-deepseek2", "", "",
                                             [](gguf::GgufWriter& w) {
                                               w.SetString("deepseek2.rope.scaling.type", "linear");
                                             }))
                  .status(),
              absl::StatusCode::kUnimplemented, "rope.scaling.type");
}

TEST(Deepseek2, ReadsYarnScaling) {
  auto model = Load(testing::WriteEditedModel("tiny-deepseek2", "", "", [](gguf::GgufWriter& w) {
    w.SetString("deepseek2.rope.scaling.type", "yarn");
    w.SetFloat32("deepseek2.rope.scaling.factor", 40.0f);
    w.SetUint32("deepseek2.rope.scaling.original_context_length", 64);
    w.SetFloat32("deepseek2.rope.scaling.yarn_log_multiplier", 0.0707f);
  }));
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelHparams& hp = (*model)->hparams();
  EXPECT_EQ(hp.rope.scaling, RopeScaling::kYarn);
  EXPECT_FLOAT_EQ(hp.rope.freq_scale, 1.0f / 40.0f);
  EXPECT_EQ(hp.rope.orig_ctx, 64);
  EXPECT_FLOAT_EQ(hp.mla.yarn_log_mul, 0.0707f);
}

TEST(Deepseek2, ReadsMixtureOfExpertsHparamsAndTensors) {
  auto model = Load(testing::WriteEditedModel("tiny-deepseek2-moe"));
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelHparams& hp = (*model)->hparams();
  EXPECT_EQ(hp.n_layer, 3);
  EXPECT_EQ(hp.mla.n_layer_dense_lead, 1);
  EXPECT_EQ(hp.moe.n_expert, 8);
  EXPECT_EQ(hp.moe.n_expert_used, 2);
  EXPECT_EQ(hp.moe.n_expert_shared, 1);
  EXPECT_EQ(hp.moe.n_ff_exp, 64);
  EXPECT_EQ(hp.moe.gating, MoeGating::kSigmoid);
  EXPECT_EQ(hp.moe.n_group, 4);
  EXPECT_EQ(hp.moe.n_group_used, 2);
  EXPECT_TRUE(hp.moe.weights_norm);
  EXPECT_FLOAT_EQ(hp.moe.weights_scale, 2.5f);
  EXPECT_TRUE(hp.moe.has_probs_bias);
  const Model& m = **model;
  EXPECT_NE(m.Tensor("blk.0.ffn_gate.weight"), nullptr);  // the leading dense layer
  EXPECT_EQ(m.Tensor("blk.1.ffn_gate.weight"), nullptr);
  ASSERT_NE(m.Tensor("blk.1.ffn_gate_exps.weight"), nullptr);
  // {n_embd, n_ff_exp, n_expert} binds as n_expert stacked matrices of n_ff_exp rows.
  EXPECT_EQ(m.Tensor("blk.1.ffn_gate_exps.weight")->n_in, 256);
  EXPECT_EQ(m.Tensor("blk.1.ffn_gate_exps.weight")->n_out, 64 * 8);
  EXPECT_EQ(m.Tensor("blk.2.ffn_down_exps.weight")->n_in, 64);
  EXPECT_EQ(m.Tensor("blk.2.ffn_down_exps.weight")->n_out, 256 * 8);
  EXPECT_EQ(m.Tensor("blk.2.ffn_up_shexp.weight")->n_out, 64);
  EXPECT_EQ(m.Tensor("blk.2.ffn_gate_inp.weight")->type, GgmlType::kF32);
  EXPECT_EQ(m.Tensor("blk.2.ffn_gate_inp.weight")->n_out, 8);
  ASSERT_NE(m.Tensor("blk.2.exp_probs_b.bias"), nullptr);
}

TEST(Deepseek2, RefusesBadMixtureOfExpertsFiles) {
  const std::string moe = "tiny-deepseek2-moe";
  auto with_key = [&](const std::string& key, uint32_t value) {
    return Load(testing::WriteEditedModel(moe, "", key,
                                          [&](gguf::GgufWriter& w) { w.SetUint32(key, value); }))
        .status();
  };
  ExpectError(Load(testing::WriteEditedModel(moe, "", "deepseek2.expert_count")).status(),
              absl::StatusCode::kNotFound, "deepseek2.expert_count");
  ExpectError(Load(testing::WriteEditedModel(moe, "", "deepseek2.expert_used_count")).status(),
              absl::StatusCode::kNotFound, "deepseek2.expert_used_count");
  ExpectError(with_key("deepseek2.expert_used_count", 9), absl::StatusCode::kInvalidArgument,
              "expert_used_count = 9");
  ExpectError(with_key("deepseek2.expert_shared_count", 0), absl::StatusCode::kInvalidArgument,
              "expert_shared_count");
  ExpectError(with_key("deepseek2.expert_group_count", 3), absl::StatusCode::kInvalidArgument,
              "expert_group_count = 3");
  ExpectError(with_key("deepseek2.expert_group_count", 8), absl::StatusCode::kInvalidArgument,
              "expert_group_count = 8");
  ExpectError(with_key("deepseek2.expert_group_used_count", 4), absl::StatusCode::kInvalidArgument,
              "expert_group_used_count = 4");
  // Three experts per token cannot come from one group of two.
  ExpectError(Load(testing::WriteEditedModel(moe, "", "deepseek2.expert_used_count",
                                             [](gguf::GgufWriter& w) {
                                               w.SetUint32("deepseek2.expert_used_count", 3);
                                               w.SetUint32("deepseek2.expert_group_used_count", 1);
                                             }))
                  .status(),
              absl::StatusCode::kInvalidArgument, "expert_group_used_count = 1");
  ExpectError(with_key("deepseek2.expert_gating_func", 3), absl::StatusCode::kUnimplemented,
              "expert_gating_func = 3");
  ExpectError(with_key("deepseek2.expert_gating_func", 9), absl::StatusCode::kInvalidArgument,
              "expert_gating_func = 9");
  ExpectError(Load(testing::WriteEditedModel(moe, "", "deepseek2.expert_weights_scale",
                                             [](gguf::GgufWriter& w) {
                                               w.SetFloat32("deepseek2.expert_weights_scale", -1);
                                             }))
                  .status(),
              absl::StatusCode::kInvalidArgument, "expert_weights_scale");
  ExpectError(Load(testing::WriteEditedModel(moe, "blk.1.ffn_gate_inp.weight")).status(),
              absl::StatusCode::kInvalidArgument, "blk.1.ffn_gate_inp.weight");
  // exp_probs_b on the first MoE layer makes it required on every MoE layer.
  ExpectError(Load(testing::WriteEditedModel(moe, "blk.2.exp_probs_b.bias")).status(),
              absl::StatusCode::kInvalidArgument, "blk.2.exp_probs_b.bias");
  ExpectError(Load(testing::WriteEditedModel(moe, "blk.2.ffn_down_shexp.weight")).status(),
              absl::StatusCode::kInvalidArgument, "blk.2.ffn_down_shexp.weight");
  // The experts flattened to two dimensions: the stacked shape is named.
  ExpectError(
      Load(
          testing::WriteEditedModel(
              moe, "blk.1.ffn_down_exps.weight", "",
              [](gguf::GgufWriter& w) {
                const auto zeros = F32Zeros(64 * 256 * 8);
                ASSERT_TRUE(
                    w.AddTensor("blk.1.ffn_down_exps.weight", 0, {64, 256 * 8}, Bytes(zeros)).ok());
              }))
          .status(),
      absl::StatusCode::kInvalidArgument, "{64, 256, 8}");
  // A shared expert sized for two while the file says one.
  ExpectError(
      Load(testing::WriteEditedModel(
               moe, "blk.1.ffn_up_shexp.weight", "",
               [](gguf::GgufWriter& w) {
                 const auto zeros = F32Zeros(256 * 128);
                 ASSERT_TRUE(
                     w.AddTensor("blk.1.ffn_up_shexp.weight", 0, {256, 128}, Bytes(zeros)).ok());
               }))
          .status(),
      absl::StatusCode::kInvalidArgument, "{256, 64}");
  ExpectError(
      Load(testing::WriteEditedModel(moe, "", "",
                                     [](gguf::GgufWriter& w) {
                                       const auto zeros = F32Zeros(256 * 128 * 8);
                                       ASSERT_TRUE(w.AddTensor("blk.1.ffn_gate_up_exps.weight", 0,
                                                               {256, 128, 8}, Bytes(zeros))
                                                       .ok());
                                     }))
          .status(),
      absl::StatusCode::kUnimplemented, "ffn_gate_up_exps");
}

// DeepSeek-V2's YaRN (factor 40, mscale_all_dim 0.707): the rotation keeps its magnitude
// (attn_factor · (1 + 0.1 ln 40) = 1) and the attention scale gains (1 + 0.0707 ln 40)².
TEST(Deepseek2, ReadsYarnAttentionScale) {
  auto model = Load(testing::WriteEditedModel("tiny-deepseek2-yarn"));
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelHparams& hp = (*model)->hparams();
  EXPECT_EQ(hp.rope.scaling, RopeScaling::kYarn);
  EXPECT_EQ(hp.rope.orig_ctx, 64);
  EXPECT_NEAR(hp.rope.attn_factor, 1.0 / (1.0 + 0.1 * std::log(40.0)), 1e-6);
  EXPECT_NEAR(hp.mla.attn_mscale, 1.0 + 0.0707 * std::log(40.0), 1e-6);
  // Without a log multiplier the rotation carries 1 + 0.1 ln s and so does the scale.
  auto plain = Load(testing::WriteEditedModel("tiny-deepseek2-yarn", "",
                                              "deepseek2.rope.scaling.yarn_log_multiplier"));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FLOAT_EQ((*plain)->hparams().rope.attn_factor, 1.0f);
  EXPECT_NEAR((*plain)->hparams().mla.attn_mscale, 1.0 + 0.1 * std::log(40.0), 1e-6);
  // rope.scaling.attn_factor: multiplies both; refused without YaRN.
  auto scaled =
      Load(testing::WriteEditedModel("tiny-deepseek2-yarn", "", "", [](gguf::GgufWriter& w) {
        w.SetFloat32("deepseek2.rope.scaling.attn_factor", 0.5f);
      }));
  ASSERT_TRUE(scaled.ok()) << scaled.status();
  EXPECT_NEAR((*scaled)->hparams().mla.attn_mscale, 0.5 * (1.0 + 0.0707 * std::log(40.0)), 1e-6);
  ExpectError(Load(testing::WriteEditedModel("tiny-deepseek2-yarn", "", "",
                                             [](gguf::GgufWriter& w) {
                                               w.SetFloat32("deepseek2.rope.scaling.attn_factor",
                                                            0.0f);
                                             }))
                  .status(),
              absl::StatusCode::kInvalidArgument, "rope.scaling.attn_factor");
  ExpectError(Load(testing::WriteEditedModel("tiny-deepseek2", "", "",
                                             [](gguf::GgufWriter& w) {
                                               w.SetFloat32("deepseek2.rope.scaling.attn_factor",
                                                            2.0f);
                                             }))
                  .status(),
              absl::StatusCode::kUnimplemented, "rope.scaling.attn_factor");
}

}  // namespace
}  // namespace kiln
