#include "tests/common/e2e_fixture.h"

#include <utility>

#include "lib/common/status.h"

namespace kiln::testing {

Model* E2eModelTest::model_ = nullptr;
std::string E2eModelTest::model_name_;

void E2eModelTest::LoadModel(const std::string& path, const std::string& name) {
  model_name_ = name;
  if (path.empty()) return;
  ModelLoadOptions options;
  options.path = path;
  auto model = Model::Load(options);
  ASSERT_TRUE(model.ok()) << model.status();
  model_ = model->release();
}

void E2eModelTest::TearDownTestSuite() {
  delete model_;
  model_ = nullptr;
}

void E2eModelTest::SetUp() {
  ASSERT_NE(model_, nullptr) << model_name_ << " did not load";
  forward_ = std::make_unique<CpuForward>(*model_, kThreads);
}

void E2eModelTest::MakeCache(GgmlType kv_type, int32_t num_blocks) {
  auto layout = CpuForward::CacheLayout(model_->hparams(), kv_type, 16);
  ASSERT_TRUE(layout.ok()) << layout.status();
  KvCacheOptions options;
  options.num_blocks = num_blocks;
  auto cache = KvCache::Create(*layout, options);
  ASSERT_TRUE(cache.ok()) << cache.status();
  cache_ = std::move(*cache);
}

absl::Status E2eModelTest::Run(SeqId seq, std::span<const int32_t> tokens, int32_t start,
                               int32_t logits_from, ForwardOutput* out) {
  KILN_RETURN_IF_ERROR(cache_->AppendSlots(seq, tokens));
  ForwardBatch batch;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t pos = start + static_cast<int32_t>(i);
    batch.Add(tokens[i], seq, pos, pos >= logits_from);
  }
  return forward_->Forward(batch, *cache_, out);
}

}  // namespace kiln::testing
