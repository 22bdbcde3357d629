// Helpers shared by the speculative-decoding tests (spec_decode, spec_draft, spec_session,
// spec_medusa, spec_eagle): the default model and an Engine on it, loaded once per test binary,
// the ChatML prompt wrapper, plain greedy decoding through a Session (the reference every
// speculative run is compared to), held-out chat prompts and the sampled-distribution check.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lib/engine/strategy.h"
#include "lib/model/model.h"
#include "lib/sample/sampler.h"
#include "lib/session/session.h"
#include "tests/common/test_util.h"

namespace kiln::testing {

// SmolLM2's chat template around one user message, ready for the assistant's answer.
std::string ChatPrompt(std::string_view user);

// Sampler parameters for greedy decoding (temperature 0, the other defaults unchanged).
sample::SamplerParams GreedyParams();

// The draft-head tests' sizes: tokens generated per prompt, samples of the distribution check
// (fewer under sanitizers, detected in each test's own translation unit).
#if KILN_TEST_SANITIZED
inline constexpr int32_t kHeadTestMaxTokens = 8;
inline constexpr int kDistributionSamples = 1000;
#else
inline constexpr int32_t kHeadTestMaxTokens = 16;
inline constexpr int kDistributionSamples = 8000;
#endif

// Twenty chat prompts none of the trained heads saw in training (tools/train/).
extern const char* const kHeldOutChatPrompts[20];
// The held-out prompts a test runs: all twenty, the first two in quick mode (QuickMode).
inline std::span<const char* const> HeldOutChatPrompts() {
  return std::span<const char* const>(kHeldOutChatPrompts).first(QuickMode() ? 2 : 20);
}

// Sampled-distribution check of a feature-reading strategy (Medusa, EAGLE) on `engine`: one
// speculative step from a fixed state on a fixed prompt, `samples` times, the first emitted
// token's frequencies against the target's distribution at the root (temperature 1, top-k 8, so
// the support is small and the bound tight). The strategy is given the root's own feature before
// each step, and every step must draft `drafted` tokens. Expected total variation of the
// empirical distribution of 8 outcomes is about 0.5 * sum_i sqrt(2 p_i / (pi N)) <= 0.013 at
// N = 8000; the test fails above four times that (0.05), or when no draft was ever accepted or
// none rejected at the root (both branches of the rejection sampler must run).
void ExpectFirstTokenHasTargetDistribution(Engine& engine, const Model& model,
                                           spec::Strategy* strategy, int32_t drafted, int samples);

// A fixture base holding the default model and an Engine on it (2 threads) for the whole test
// suite. Call LoadDefaultModel from SetUpTestSuite and FreeDefaultModel from TearDownTestSuite.
class SpecModelTest : public ::testing::Test {
 protected:
  // Fails the suite (fatal ASSERT in the caller's SetUpTestSuite) when the model cannot load.
  static void LoadDefaultModel(int32_t n_ctx);
  // Or a tiny random model of `shape` (lib/model/random_model.h; f16 weights, seed 11).
  static void LoadTinyModel(const std::string& shape, int32_t n_ctx);
  static void FreeDefaultModel();

  // Tokenizes with special tokens added and parsed (ChatPrompt output).
  static std::vector<int32_t> Encode(const std::string& text);
  // Plain greedy decoding of up to max_tokens tokens after `prompt` through Session::Generate;
  // returns the generated tokens only.
  static std::vector<int32_t> PlainGreedy(std::span<const int32_t> prompt, int32_t max_tokens,
                                          const sample::SamplerParams& params = GreedyParams());

  static Model* model_;
  static Engine* engine_;
};

// The draft-head tests' fixture (spec_medusa, spec_eagle): the default model (n_ctx 1024) and,
// beside it, kiln-mkmodel's tiny-llama-gqa with a 1-thread Engine (n_ctx 256) for tests that need
// many cheap steps.
class SpecHeadTest : public SpecModelTest {
 protected:
  static void SetUpTestSuite();
  static void TearDownTestSuite();

  // The n-gram chain merged into a head's trees (merge_ngram): on a prompt whose answer copies
  // it, `merged` (a head that drafts nothing useful, with the merge) has at least a third of the
  // answer accepted and more than `heads_only` (the same head without it); greedy output is
  // plain decoding's for both. The pass cost is pinned (slope 0.05): the chain's length does not
  // depend on timing. `what` names the strategy in the printed line.
  static void ExpectMergedNgramChainGetsCopiesAccepted(spec::Strategy* merged,
                                                       spec::Strategy* heads_only,
                                                       const char* what);

  // Typical acceptance (lossy) against exact verification with the same trained head, on the
  // held-out chat prompts: at temperature 0 `typical` still gives plain greedy output and
  // reports nothing lossy; at temperature 0.8 (seeds 1..n, pass cost pinned at slope 0.2) every
  // token it accepts is counted in accepted_lossy, exact verification reports none, and typical
  // accepts more per step (with all 20 prompts: at least 0.1 more; in quick mode, some).
  static void ExpectTypicalAcceptanceAcceptsMoreAndIsReportedLossy(spec::Strategy* exact,
                                                                   spec::Strategy* typical,
                                                                   const char* what);

  // Sampled exactness with a trained head's own tree on the default model: after the prefill of
  // a chat prompt and the first 4 tokens of its greedy answer (the features of all those rows
  // given to `strategy`), the head proposes up to 8 nodes; one target pass computes every node's
  // distribution (temperature 1, top-k 40, top-p 0.9: the decoder's chain and histories); the
  // tree is then verified kTreeVerifications times with fresh uniforms. The first emitted
  // token's empirical distribution must be within total variation 0.01 of the target's at the
  // root. Expected about 0.5 * sum_i sqrt(2 p_i / (pi N)) <= 0.5 * sqrt(2 K / (pi N)) = 0.0056
  // for K = 40 candidates and N = 200,000 (its standard deviation about 0.0007). The tree must
  // have at least 2 nodes, and both a root acceptance and a root rejection must occur. Negative
  // control: the lossy typical rule on the same tree must be off by more than 0.05.
  static void ExpectTreeVerificationKeepsTheTargetDistribution(spec::Strategy* strategy,
                                                               const char* what);

  static std::string* tiny_path_;
  static Model* tiny_;
  static Engine* tiny_engine_;
};

}  // namespace kiln::testing
