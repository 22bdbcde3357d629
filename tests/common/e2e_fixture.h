// The fixture the end-to-end tests of real models (tests/unit/e2e_*_test.cc) share: the model
// loaded once per suite, a CPU forward pass of its own per test, a KV cache, and one batch run;
// in quick mode (QuickMode, test_util.h) they run a documented subset.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "lib/kv/kv_cache.h"
#include "lib/model/model.h"
#include "tests/common/forward_util.h"
#include "tests/common/golden.h"
#include "tests/common/test_util.h"

namespace kiln::testing {

// A suite derives from this and calls LoadModel from its own SetUpTestSuite. Each e2e test is
// its own executable with one such suite, so the one static model is that suite's.
class E2eModelTest : public ::testing::Test {
 protected:
  static constexpr int kThreads = 2;

  // Loads the model at `path` (empty: not fetched; SetUp then fails naming `name`).
  static void LoadModel(const std::string& path, const std::string& name);
  static void TearDownTestSuite();

  // Fails unless the model loaded; gives the test a forward pass of its own.
  void SetUp() override;

  // A cache of `num_blocks` blocks of 16 tokens with KV entries of kv_type.
  void MakeCache(GgmlType kv_type, int32_t num_blocks);

  // Appends `tokens` to `seq` at positions [start, start + n) in one batch; logits of the tokens
  // whose position is >= `logits_from` go to *out.
  absl::Status Run(SeqId seq, std::span<const int32_t> tokens, int32_t start, int32_t logits_from,
                   ForwardOutput* out);

  // Perplexity by llama-perplexity's method over the first n_chunk chunks of a perplexity
  // golden's text (keys text, n_ctx, n_text_tokens, n_chunks, add_bos; checked): each chunk of
  // n_ctx tokens in a fresh sequence of cache_ (made by the caller), evaluated in batches of 512
  // as llama.cpp does, its second half scored. Prints and returns the perplexity.
  void ChunkPerplexity(const Json& golden, int32_t n_chunk, double* ppl);

  static Model* model_;
  static std::string model_name_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<CpuForward> forward_;
};

}  // namespace kiln::testing
