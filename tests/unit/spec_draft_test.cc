// The draft-model strategy on the real default model with drafts cut from it by MakeDraftModel
// (kiln-mkdraft): the draft file's shape, greedy output identical to plain greedy decoding for
// eleven prompts, sampling reproducibility with a fixed seed.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "lib/gguf/gguf.h"
#include "lib/model/model.h"
#include "lib/session/session.h"
#include "lib/spec/draft_model_strategy.h"
#include "lib/spec/make_draft.h"
#include "lib/spec/spec_generate.h"
#include "lib/tokenizer/tokenizer.h"
#include "tests/common/spec_test_util.h"
#include "tests/common/test_util.h"

namespace kiln::spec {
namespace {

// Shorter generations under the sanitizers (scripts/test.sh runs the whole suite under ASan).
#if KILN_TEST_SANITIZED
constexpr int32_t kMaxTokens = 16;
#else
constexpr int32_t kMaxTokens = 40;
#endif

const char* const kPrompts[] = {
    "Repeat this sentence exactly: The quick brown fox jumps over the lazy dog near the river "
    "bank.",
    "Rename the variable x to count in this code:\nint x = 0;\nfor (int i = 0; i < 10; ++i) x += "
    "i;\nreturn x;",
    "Copy this list: apples, bananas, cherries, dates, elderberries, figs, grapes.",
    "What is the capital of France? Answer in one sentence.",
    "Write a haiku about the sea.",
    "Explain what a hash table is in two sentences.",
    "Give three tips for learning a new language.",
    "Translate to French: Good morning, how are you today?",
    "What is 12 times 7?",
    "Name the planets of the solar system.",
    "def add(a, b):\n    return a + b\n\nRewrite this Python function with type hints.",
};

using kiln::testing::ChatPrompt;
using kiln::testing::QuickMode;

class SpecDraftTest : public kiln::testing::SpecModelTest {
 protected:
  static void SetUpTestSuite() {
    LoadDefaultModel(1024);
    for (int k : {4, 8}) {
      const std::string path = kiln::testing::TempDir() + "/draft" + std::to_string(k) + ".gguf";
      MakeDraftInfo info;
      const absl::Status st = MakeDraftModel(kiln::testing::DefaultModelPath(), path, k, &info);
      ASSERT_TRUE(st.ok()) << st;
      ASSERT_EQ(info.draft_layers, k);
      draft_paths_[k == 4 ? 0 : 1] = new std::string(path);
    }
  }
  static void TearDownTestSuite() {
    FreeDefaultModel();
    delete draft_paths_[0];
    delete draft_paths_[1];
  }
  static sample::SamplerParams Greedy() { return kiln::testing::GreedyParams(); }
  static std::vector<int32_t> PlainGreedy(const std::vector<int32_t>& prompt) {
    return SpecModelTest::PlainGreedy(prompt, kMaxTokens);
  }

  static std::string* draft_paths_[2];
};

std::string* SpecDraftTest::draft_paths_[2] = {nullptr, nullptr};

TEST_F(SpecDraftTest, DraftFileKeepsFirstLayersAndVocabulary) {
  auto file = gguf::GgufFile::Open(*draft_paths_[0]);
  ASSERT_TRUE(file.ok()) << file.status();
  auto arch = (*file)->GetString("general.architecture");
  ASSERT_TRUE(arch.ok());
  EXPECT_EQ(*(*file)->GetUint(std::string(*arch) + ".block_count"), 4u);
  EXPECT_NE((*file)->FindTensor("blk.3.attn_q.weight"), nullptr);
  EXPECT_EQ((*file)->FindTensor("blk.4.attn_q.weight"), nullptr);
  EXPECT_NE((*file)->FindTensor("token_embd.weight"), nullptr);
  EXPECT_NE((*file)->FindTensor("output_norm.weight"), nullptr);
  ModelLoadOptions load;
  load.path = *draft_paths_[0];
  auto draft = Model::Load(load);
  ASSERT_TRUE(draft.ok()) << draft.status();
  EXPECT_EQ((*draft)->hparams().n_layer, 4);
  EXPECT_EQ((*draft)->hparams().n_vocab, model_->hparams().n_vocab);
  // Bad layer counts name the field.
  const absl::Status zero =
      MakeDraftModel(kiln::testing::DefaultModelPath(), kiln::testing::TempDir() + "/bad.gguf", 0);
  EXPECT_EQ(zero.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(zero.message().find("block_count"), std::string_view::npos) << zero;
  EXPECT_FALSE(MakeDraftModel(kiln::testing::DefaultModelPath(),
                              kiln::testing::TempDir() + "/bad.gguf", 1000)
                   .ok());
}

TEST_F(SpecDraftTest, GreedyEqualsPlainGreedyWithDraftsOfFourAndEightLayers) {
  // Quick mode: the 4-layer draft only (the 8-layer one runs the same paths).
  for (int which = 0; which < (QuickMode() ? 1 : 2); ++which) {
    DraftModelParams params;
    params.n_threads = 2;
    params.max_draft = 4;
    // Always 4 drafts: the cost-aware policy would mostly back off from these weak drafts, and
    // this test is about exactness of long chains.
    params.adaptive = false;
    auto strategy =
        DraftModelStrategy::Load(*draft_paths_[which], model_->hparams().n_vocab, params);
    ASSERT_TRUE(strategy.ok()) << strategy.status();
    int64_t accepted = 0, drafted = 0;
    // Every prompt with the 4-layer draft (the first three in quick mode); three with the 8-layer
    // one (time).
    const size_t n_prompts = which == 0 && !QuickMode() ? std::size(kPrompts) : 3;
    for (size_t i = 0; i < n_prompts; ++i) {
      SCOPED_TRACE(kPrompts[i]);
      const auto prompt = Encode(ChatPrompt(kPrompts[i]));
      const auto plain = PlainGreedy(prompt);
      auto spec = GenerateSpeculative(*engine_, prompt, Greedy(), 1, strategy->get(), kMaxTokens);
      ASSERT_TRUE(spec.ok()) << spec.status();
      EXPECT_EQ(spec->tokens, plain);
      accepted += spec->metrics.accepted;
      drafted += spec->metrics.drafted;
    }
    EXPECT_GT(drafted, 0);
    EXPECT_GT(accepted, 0);
    std::printf("draft %s: accepted %lld of %lld drafted\n", which == 0 ? "4L" : "8L",
                static_cast<long long>(accepted), static_cast<long long>(drafted));
  }
}

TEST_F(SpecDraftTest, SamplingIsReproducible) {
  DraftModelParams params;
  params.n_threads = 2;
  // Pinned costs: with measured (timing-driven) costs the draft lengths, and so the use of the
  // random stream, could differ between two runs with the same seed.
  params.fixed_pass_cost_beta = 0.0;
  params.draft_cost_prior = 0.05;
  auto strategy = DraftModelStrategy::Load(*draft_paths_[0], model_->hparams().n_vocab, params);
  ASSERT_TRUE(strategy.ok()) << strategy.status();
  sample::SamplerParams sp;  // temperature 0.8, top-k 40, top-p 0.95, min-p 0.05
  const auto prompt = Encode(ChatPrompt(kPrompts[0]));
  auto a = GenerateSpeculative(*engine_, prompt, sp, 42, strategy->get(), kMaxTokens);
  auto b = GenerateSpeculative(*engine_, prompt, sp, 42, strategy->get(), kMaxTokens);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_GT(a->metrics.drafted, 0);
  for (int32_t t : a->tokens) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, model_->hparams().n_vocab);
  }
}

TEST_F(SpecDraftTest, CostAwareLengthBacksOffFromAWeakDraft) {
  // A 4-layer cut of the target accepts ~1-2% of its drafts; with a wide pass costing 0.8 of a
  // one-token pass per extra token and a draft pass 0.3, no draft length pays: the strategy only
  // probes with one token now and then. Greedy output stays identical.
  DraftModelParams params;
  params.n_threads = 2;
  params.max_draft = 4;
  params.fixed_pass_cost_beta = 0.8;
  params.draft_cost_prior = 0.3;
  auto strategy = DraftModelStrategy::Load(*draft_paths_[0], model_->hparams().n_vocab, params);
  ASSERT_TRUE(strategy.ok()) << strategy.status();
  const auto prompt = Encode(ChatPrompt(kPrompts[5]));
  const auto plain = PlainGreedy(prompt);
  auto spec = GenerateSpeculative(*engine_, prompt, Greedy(), 1, strategy->get(), kMaxTokens);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->tokens, plain);
  EXPECT_GT(spec->metrics.drafted, 0);  // it probes
  EXPECT_LT(spec->metrics.drafted * 2, spec->metrics.steps) << "drafted " << spec->metrics.drafted;
  EXPECT_LT((*strategy)->acceptance().first(), 0.5);
}

TEST_F(SpecDraftTest, RejectsAnotherVocabulary) {
  auto s = DraftModelStrategy::Load(*draft_paths_[0], model_->hparams().n_vocab + 1, {});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kiln::spec
