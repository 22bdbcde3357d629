#include "tests/common/forward_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <span>
#include <utility>

namespace kiln {

CpuForward::CpuForward(const Model& model, int n_threads)
    : backend_(n_threads), pass_(model.architecture().NewForward(model, backend_)) {}

absl::StatusOr<KvLayout> CpuForward::CacheLayout(const ModelHparams& hp, GgmlType kv_type,
                                                 int32_t block_size, bool llama_cpp_order) {
  const Architecture* arch = FindArchitecture(hp.arch);
  if (arch == nullptr) return absl::NotFoundError(StrCat("no architecture ", hp.arch));
  return arch->CacheLayoutForOrder(hp, kv_type, block_size, llama_cpp_order);
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

std::unique_ptr<KvCache> MakeSlidingReleaseCache(const Model& model, GgmlType kv_type,
                                                 int32_t block_size, int32_t blocks) {
  const ModelHparams& hp = model.hparams();
  auto plain = CpuForward::CacheLayout(hp, kv_type, block_size);
  EXPECT_TRUE(plain.ok()) << plain.status();
  if (!plain.ok()) return nullptr;
  auto layout = plain->WithSlidingGroups(hp.swa_layers, static_cast<int32_t>(hp.sliding_window));
  EXPECT_TRUE(layout.ok()) << layout.status();
  if (!layout.ok()) return nullptr;
  KvCacheOptions options;
  options.num_blocks = blocks;
  auto cache = KvCache::Create(*layout, options);
  EXPECT_TRUE(cache.ok()) << cache.status();
  if (!cache.ok()) return nullptr;
  for (int32_t l = 0; l < layout->n_layers(); ++l) {
    if (!layout->group_is_sliding(layout->layer_group(l))) continue;
    for (int32_t h = 0; h < layout->n_kv_heads(); ++h) {
      std::memset((*cache)->KeyPtr(kNullBlock, l, h), 0xff, layout->tile_bytes());
      std::memset((*cache)->ValuePtr(kNullBlock, l, h), 0xff, layout->tile_bytes());
    }
  }
  return std::move(*cache);
}

std::vector<float> GreedyDecode(CpuForward& fwd, KvCache& cache, SeqId seq,
                                std::vector<int32_t>& tokens, int n_new) {
  std::vector<float> rows;
  for (int step = 0;; ++step) {
    const int32_t len = static_cast<int32_t>(tokens.size());
    const int32_t start = *cache.Length(seq);
    EXPECT_TRUE(cache.AppendSlots(seq, std::span(tokens).subspan(start)).ok());
    ForwardBatch batch;
    for (int32_t i = start; i < len; ++i) batch.Add(tokens[i], seq, i, i == len - 1);
    ForwardOutput out;
    const absl::Status st = fwd.Forward(batch, cache, &out);
    EXPECT_TRUE(st.ok()) << st;
    if (!st.ok()) return rows;
    EXPECT_TRUE(cache.MarkComputed(seq, len).ok());
    const float* row = out.LogitsRow(0);
    rows.insert(rows.end(), row, row + out.n_vocab);
    if (step == n_new) return rows;
    tokens.push_back(static_cast<int32_t>(std::max_element(row, row + out.n_vocab) - row));
  }
}

}  // namespace testing
}  // namespace kiln
