// deepseek2 (Multi-head Latent Attention): what kiln reads from the GGUF keys and tensors the
// converter writes (the kiln-mkmodel shapes tiny-deepseek2, -lite and -kvb), the latent cache
// layout it asks for, and the files it refuses.
#include <gtest/gtest.h>

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
  // Mixture-of-experts layers are not supported yet: refused, not misread as dense.
  ExpectError(
      Load(testing::WriteEditedModel(
               "tiny-deepseek2", "", "deepseek2.leading_dense_block_count",
               [](gguf::GgufWriter& w) { w.SetUint32("deepseek2.leading_dense_block_count", 1); }))
          .status(),
      absl::StatusCode::kUnimplemented, "leading_dense_block_count");
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

}  // namespace
}  // namespace kiln
