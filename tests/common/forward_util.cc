#include "tests/common/forward_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <span>
#include <utility>

namespace kiln {

CpuForward::CpuForward(const Model& model, int n_threads)
    : backend_(n_threads), pass_(model.architecture().NewForward(model, backend_)) {}

absl::StatusOr<KvLayout> CpuForward::CacheLayout(const ModelHparams& hp, GgmlType kv_type,
                                                 int32_t block_size) {
  const Architecture* arch = FindArchitecture(hp.arch);
  if (arch == nullptr) return absl::NotFoundError(StrCat("no architecture ", hp.arch));
  return arch->CacheLayout(hp, kv_type, block_size);
}

absl::Status CpuForward::Forward(const ForwardBatch& batch, KvCache& cache, ForwardOutput* out) {
  if (!pass_.ok()) return pass_.status();
  return (*pass_)->Forward(batch, cache, out);
}

namespace testing {

std::unique_ptr<KvCache> MakeCache(const Model& model, GgmlType kv_type, int32_t blocks) {
  auto layout = CpuForward::CacheLayout(model.hparams(), kv_type, 16);
  EXPECT_TRUE(layout.ok());
  if (!layout.ok()) return nullptr;
  KvCacheOptions options;
  options.num_blocks = blocks;
  auto cache = KvCache::Create(*layout, options);
  EXPECT_TRUE(cache.ok()) << cache.status();
  return cache.ok() ? std::move(*cache) : nullptr;
}

std::vector<float> Prefill(CpuForward& fwd, KvCache& cache, SeqId seq,
                           const std::vector<int32_t>& tokens, int chunk, int start) {
  std::vector<float> logits;
  for (int begin = start; begin < static_cast<int>(tokens.size()); begin += chunk) {
    const int end = std::min<int>(begin + chunk, static_cast<int>(tokens.size()));
    EXPECT_TRUE(cache.AppendSlots(seq, std::span(tokens).subspan(begin, end - begin)).ok());
    ForwardBatch batch;
    for (int i = begin; i < end; ++i) batch.Add(tokens[i], seq, i, true);
    ForwardOutput out;
    const absl::Status s = fwd.Forward(batch, cache, &out);
    EXPECT_TRUE(s.ok()) << s;
    logits.insert(logits.end(), out.logits.begin(), out.logits.end());
  }
  return logits;
}

}  // namespace testing
}  // namespace kiln
