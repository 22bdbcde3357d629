#include "tests/common/e2e_fixture.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

#include "lib/common/status.h"
#include "lib/tokenizer/tokenizer.h"
#include "tests/common/test_util.h"

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

void E2eModelTest::ChunkPerplexity(const Json& golden, int32_t n_chunk, double* ppl) {
  ASSERT_NE(cache_, nullptr);
  const std::string text = ReadFile(SourcePath(golden["text"].str));
  ASSERT_FALSE(text.empty()) << golden["text"].str;
  const int32_t n_ctx = static_cast<int32_t>(golden["n_ctx"].number);
  ASSERT_GT(n_ctx, 0);
  auto tokens = model_->tokenizer().Encode(text, /*add_special=*/true, /*parse_special=*/false);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  ASSERT_EQ(static_cast<double>(tokens->size()), golden["n_text_tokens"].number);
  ASSERT_EQ(static_cast<int32_t>(tokens->size()) / n_ctx,
            static_cast<int32_t>(golden["n_chunks"].number));
  ASSERT_LE(n_chunk, static_cast<int32_t>(golden["n_chunks"].number));
  const int32_t first = n_ctx / 2;
  const int64_t n_vocab = model_->hparams().n_vocab;
  double nll = 0;
  int64_t count = 0;
  for (int32_t i = 0; i < n_chunk; ++i) {
    std::vector<int32_t> chunk(tokens->begin() + i * n_ctx, tokens->begin() + (i + 1) * n_ctx);
    const std::vector<int32_t> targets = chunk;
    if (golden["add_bos"].boolean) chunk[0] = model_->tokenizer().bos();
    const SeqId seq = cache_->CreateSequence();
    ForwardOutput out;
    for (int32_t b = 0; b < n_ctx; b += 512) {
      const int32_t len = std::min(512, n_ctx - b);
      ASSERT_TRUE(Run(seq, std::span(chunk).subspan(b, len), b, first, &out).ok());
      for (size_t r = 0; r < out.logit_tokens.size(); ++r) {
        const int32_t j = b + out.logit_tokens[r];
        if (j >= n_ctx - 1) continue;
        const float* row = out.LogitsRow(r);  // [n_vocab]
        double max_logit = row[0];
        for (int64_t v = 1; v < n_vocab; ++v) max_logit = std::max<double>(max_logit, row[v]);
        double sum = 0;
        for (int64_t v = 0; v < n_vocab; ++v) sum += std::exp(row[v] - max_logit);
        nll += max_logit + std::log(sum) - row[targets[j + 1]];
        ++count;
      }
    }
    ASSERT_TRUE(cache_->Free(seq).ok());
  }
  ASSERT_EQ(count, static_cast<int64_t>(n_chunk) * (n_ctx - 1 - first));
  *ppl = std::exp(nll / static_cast<double>(count));
  std::printf("perplexity over %d chunks of %d (%lld tokens scored), %s cache: %.4f\n", n_chunk,
              n_ctx, static_cast<long long>(count),
              GgmlTypeName(static_cast<uint32_t>(cache_->layout().elem_type())).c_str(), *ppl);
}

}  // namespace kiln::testing
