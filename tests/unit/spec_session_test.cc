// Speculative decoding through Session::SetStrategy on the real default model: greedy output
// identical to a plain session, max_tokens and stop strings honoured exactly (tokens cut inside
// an accepted draft are dropped), metrics reported, the strategy removable between calls; Fork
// continues speculating in both sessions (n-gram and draft model, the draft's cache sequence
// forked, not recomputed); top-N logprobs of speculatively emitted tokens bitwise those of plain
// decoding.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "lib/model/model.h"
#include "lib/session/session.h"
#include "lib/spec/draft_model_strategy.h"
#include "lib/spec/make_draft.h"
#include "lib/spec/ngram_strategy.h"
#include "tests/common/spec_test_util.h"
#include "tests/common/test_util.h"

namespace kiln::spec {
namespace {

const std::string kCopyPrompt = kiln::testing::ChatPrompt(
    "Repeat this sentence exactly: The quick brown fox jumps over the lazy dog near the river "
    "bank.");
// A longer answer to copy (about 45 tokens).
const std::string kLongCopyPrompt = kiln::testing::ChatPrompt(
    "Repeat this paragraph exactly: The committee met on Tuesday to review the budget. After a "
    "long discussion, the members agreed to increase funding for the library, reduce spending on "
    "travel, and postpone the new parking lot until next year.");

// Shorter generations under the sanitizers (scripts/test.sh runs the whole suite under ASan).
#if KILN_TEST_SANITIZED
constexpr int32_t kBeforeFork = 6;
constexpr int32_t kAfterFork = 10;
constexpr int32_t kLogprobTokens = 24;
#else
constexpr int32_t kBeforeFork = 12;
constexpr int32_t kAfterFork = 24;
constexpr int32_t kLogprobTokens = 48;
#endif

class SpecSessionTest : public kiln::testing::SpecModelTest {
 protected:
  static void SetUpTestSuite() { LoadDefaultModel(512); }
  static void TearDownTestSuite() { FreeDefaultModel(); }

  static std::unique_ptr<Session> NewSession(Strategy* strategy,
                                             sample::SamplerParams params = Greedy(),
                                             const std::string& prompt = kCopyPrompt) {
    auto s = Session::Create(*engine_, params, 1);
    EXPECT_TRUE(s.ok());
    EXPECT_TRUE((*s)->AppendText(prompt, true, true).ok());
    if (strategy != nullptr) {
      EXPECT_TRUE((*s)->SetStrategy(strategy).ok());
    }
    return std::move(*s);
  }
  static sample::SamplerParams Greedy() { return kiln::testing::GreedyParams(); }
  static std::string Run(Session& s, GenerateOptions options, GenerateResult* result) {
    std::string text;
    options.on_token = [&](int32_t, std::string_view piece) {
      text.append(piece);
      return true;
    };
    auto r = s.Generate(options);
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) *result = *r;
    return text;
  }
  static void Generate(Session& s, int32_t max_tokens) {
    GenerateOptions options;
    options.max_tokens = max_tokens;
    auto r = s.Generate(options);
    ASSERT_TRUE(r.ok()) << r.status();
  }

  // Generates kBeforeFork tokens with `strategy`, forks, generates kAfterFork more in both
  // sessions, and checks both against plain greedy decoding of the same prompt. Returns the fork.
  static std::unique_ptr<Session> ForkMidGeneration(Strategy* strategy, bool expect_accepted) {
    // The reference: a plain session making the same Generate calls (the answer ends with an
    // end-of-generation token before kBeforeFork + kAfterFork tokens; the next call continues
    // after it).
    auto plain = NewSession(nullptr);
    Generate(*plain, kBeforeFork);
    Generate(*plain, kAfterFork / 2);
    Generate(*plain, kAfterFork - kAfterFork / 2);
    const std::vector<int32_t> expected = plain->tokens();
    auto a = NewSession(strategy);
    Generate(*a, kBeforeFork);
    auto fork = a->Fork();
    EXPECT_TRUE(fork.ok()) << fork.status();
    if (!fork.ok()) return nullptr;
    std::unique_ptr<Session> b = std::move(*fork);
    EXPECT_NE(b->spec_strategy(), nullptr);
    EXPECT_NE(b->spec_strategy(), strategy);  // its own clone
    EXPECT_EQ(b->spec_metrics().steps, 0);
    // Interleave the two sessions' steps (one Generate call each, twice).
    Generate(*b, kAfterFork / 2);
    Generate(*a, kAfterFork / 2);
    Generate(*a, kAfterFork - kAfterFork / 2);
    Generate(*b, kAfterFork - kAfterFork / 2);
    EXPECT_EQ(a->tokens(), expected);
    EXPECT_EQ(b->tokens(), expected);
    EXPECT_GT(a->spec_metrics().drafted, 0);
    EXPECT_GT(b->spec_metrics().drafted, 0);  // the fork kept speculating
    if (expect_accepted) {
      EXPECT_GT(b->spec_metrics().accepted, 0);
    }
    return b;
  }
};

TEST_F(SpecSessionTest, GreedyEqualsPlainAndHonoursLimits) {
  auto ngram = NgramStrategy::Create(NgramParams{});
  ASSERT_TRUE(ngram.ok());
  for (int32_t max_tokens : {5, 13, 40}) {
    SCOPED_TRACE(max_tokens);
    auto plain = NewSession(nullptr);
    auto spec = NewSession(ngram->get());
    GenerateOptions options;
    options.max_tokens = max_tokens;
    GenerateResult rp, rs;
    const std::string tp = Run(*plain, options, &rp);
    const std::string ts = Run(*spec, options, &rs);
    EXPECT_EQ(ts, tp);
    EXPECT_EQ(spec->tokens(), plain->tokens());
    EXPECT_EQ(rs.n_tokens, rp.n_tokens);
    EXPECT_EQ(rs.reason, rp.reason);
    if (max_tokens == 40) {
      EXPECT_GT(spec->spec_metrics().accepted, 0);
      EXPECT_LT(spec->spec_metrics().TargetPassesPerToken(), 1.0);
      ASSERT_NE(spec->spec_cost_model(), nullptr);
      EXPECT_GT(spec->spec_cost_model()->one_token_observations() +
                    spec->spec_cost_model()->wide_observations(),
                0);
    }
    // Generation continues identically after removing the strategy.
    ASSERT_TRUE(spec->SetStrategy(nullptr).ok());
    options.max_tokens = 6;
    Run(*plain, options, &rp);
    Run(*spec, options, &rs);
    EXPECT_EQ(spec->tokens(), plain->tokens());
  }
}

// A strategy handle that served one session starts afresh in the next: with a pinned cost the
// second session drafts exactly as a session with a new handle does (same drafted and accepted
// counts), rather than from the acceptance the first session taught it.
TEST_F(SpecSessionTest, ReusedHandleStartsFreshInANewSession) {
  NgramParams params;
  params.fixed_pass_cost_beta = 0.3;
  auto used = NgramStrategy::Create(params);
  auto fresh = NgramStrategy::Create(params);
  ASSERT_TRUE(used.ok() && fresh.ok());
  GenerateOptions options;
  options.max_tokens = 40;
  GenerateResult r;
  {
    // Teach the handle: a long copy task accepts most drafts.
    auto first = NewSession(used->get(), Greedy(), kLongCopyPrompt);
    Run(*first, options, &r);
    ASSERT_GT(first->spec_metrics().accepted, 0);
  }
  auto second = NewSession(used->get());
  auto reference = NewSession(fresh->get());
  Run(*second, options, &r);
  Run(*reference, options, &r);
  EXPECT_EQ(second->tokens(), reference->tokens());
  EXPECT_EQ(second->spec_metrics().drafted, reference->spec_metrics().drafted);
  EXPECT_EQ(second->spec_metrics().accepted, reference->spec_metrics().accepted);
}

TEST_F(SpecSessionTest, StopStringInsideAcceptedDraft) {
  auto ngram = NgramStrategy::Create(NgramParams{});
  ASSERT_TRUE(ngram.ok());
  auto plain = NewSession(nullptr);
  auto spec = NewSession(ngram->get());
  GenerateOptions options;
  options.max_tokens = 40;
  options.stop_strings = {"lazy"};
  GenerateResult rp, rs;
  const std::string tp = Run(*plain, options, &rp);
  const std::string ts = Run(*spec, options, &rs);
  EXPECT_EQ(rp.reason, StopReason::kStopString);
  EXPECT_EQ(ts, tp);
  EXPECT_EQ(rs.reason, rp.reason);
  EXPECT_EQ(spec->tokens(), plain->tokens());
  // And the next call continues identically.
  options.stop_strings.clear();
  options.max_tokens = 5;
  EXPECT_EQ(Run(*spec, options, &rs), Run(*plain, options, &rp));
  EXPECT_EQ(spec->tokens(), plain->tokens());
}

TEST_F(SpecSessionTest, ForkWithNgramContinuesSpeculating) {
  // Pinned cost so that the policy's choices (and so the drafting the test asserts) do not depend
  // on the machine's load; the tokens would not either way (greedy).
  NgramParams params;
  params.fixed_pass_cost_beta = 0.3;
  auto ngram = NgramStrategy::Create(params);
  ASSERT_TRUE(ngram.ok());
  auto fork = ForkMidGeneration(ngram->get(), /*expect_accepted=*/true);
  ASSERT_NE(fork, nullptr);
  EXPECT_NE(dynamic_cast<NgramStrategy*>(fork->spec_strategy()), nullptr);
}

TEST_F(SpecSessionTest, ForkWithDraftModelForksTheDraftCache) {
  const std::string path = kiln::testing::TempDir() + "/draft4.gguf";
  ASSERT_TRUE(MakeDraftModel(kiln::testing::DefaultModelPath(), path, 4).ok());
  DraftModelParams params;
  params.n_threads = 2;
  params.max_draft = 3;
  params.adaptive = false;  // always drafts (this weak draft would mostly back off)
  auto draft = DraftModelStrategy::Load(path, model_->hparams().n_vocab, params);
  ASSERT_TRUE(draft.ok()) << draft.status();
  EXPECT_FALSE((*draft)->shares_cache());
  auto fork = ForkMidGeneration(draft->get(), /*expect_accepted=*/false);
  ASSERT_NE(fork, nullptr);
  auto* clone = dynamic_cast<DraftModelStrategy*>(fork->spec_strategy());
  ASSERT_NE(clone, nullptr);
  EXPECT_TRUE(clone->shares_cache());
  EXPECT_TRUE((*draft)->shares_cache());
  // The clone continued from the forked draft sequence: it computed the tokens after the fork
  // and its drafts, never the prompt again.
  const int64_t prompt_len = static_cast<int64_t>(Encode(kCopyPrompt).size());
  EXPECT_GT(clone->computed_tokens(), 0);
  EXPECT_LT(clone->computed_tokens(), prompt_len);
  fork.reset();  // destroys the clone, which frees its sequence of the shared cache
  EXPECT_FALSE((*draft)->shares_cache());
}

TEST_F(SpecSessionTest, ForkFailsForAStrategyWithoutClone) {
  struct NoClone final : Strategy {
    std::string_view name() const override { return "noclone"; }
    absl::Status Propose(std::span<const int32_t>, int32_t, const ProposeContext&,
                         DraftTree* out) override {
      out->Clear();
      return absl::OkStatus();
    }
    void Accepted(int32_t, std::span<const int32_t>) override {}
    void Reset() override {}
  } no_clone;
  auto s = NewSession(&no_clone);
  auto fork = s->Fork();
  ASSERT_FALSE(fork.ok());
  EXPECT_EQ(fork.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(fork.status().message().find("noclone"), std::string_view::npos) << fork.status();
  Generate(*s, 2);  // the session is unaffected
}

// Every token a speculative step emits (accepted, recovered, bonus) reports the top-N
// log-probabilities plain decoding reports for it, bit for bit (batch-invariant logits, same
// sampler chain on the same row).
TEST_F(SpecSessionTest, LogprobsOfSpeculativeTokensEqualPlain) {
  sample::SamplerParams params = Greedy();
  params.n_logprobs = 5;
  NgramParams np;
  np.adaptive = false;  // always max_draft: the most tokens from accepted drafts
  auto ngram = NgramStrategy::Create(np);
  ASSERT_TRUE(ngram.ok());
  struct Record {
    std::vector<int32_t> tokens;
    std::vector<std::vector<sample::TokenLogprob>> logprobs;
  };
  auto run = [&](Strategy* strategy, Record* rec) {
    auto s = NewSession(strategy, params, kLongCopyPrompt);
    GenerateOptions options;
    options.max_tokens = kLogprobTokens;
    options.on_token = [&](int32_t token, std::string_view) {
      if (token < 0) return true;  // the final flush of held-back text
      rec->tokens.push_back(token);
      const auto lp = s->LastLogprobs();
      rec->logprobs.emplace_back(lp.begin(), lp.end());
      return true;
    };
    auto r = s->Generate(options);
    ASSERT_TRUE(r.ok()) << r.status();
    if (strategy != nullptr) {
      // Many tokens came from accepted drafts.
      EXPECT_GT(s->spec_metrics().accepted, kLogprobTokens / 4) << s->spec_metrics().accepted;
    }
  };
  Record plain, spec;
  run(nullptr, &plain);
  run(ngram->get(), &spec);
  ASSERT_EQ(spec.tokens, plain.tokens);
  ASSERT_EQ(spec.logprobs.size(), plain.logprobs.size());
  for (size_t i = 0; i < plain.logprobs.size(); ++i) {
    SCOPED_TRACE(i);
    ASSERT_EQ(plain.logprobs[i].size(), 5u);
    ASSERT_EQ(spec.logprobs[i].size(), 5u);
    for (size_t j = 0; j < 5; ++j) {
      EXPECT_EQ(spec.logprobs[i][j].token, plain.logprobs[i][j].token);
      // Bitwise equality (EXPECT_EQ on floats compares exactly).
      EXPECT_EQ(spec.logprobs[i][j].logprob, plain.logprobs[i][j].logprob);
    }
    // The emitted token is the argmax: the first entry (raw logits, no penalties here).
    EXPECT_EQ(plain.logprobs[i][0].token, plain.tokens[i]);
  }
}

}  // namespace
}  // namespace kiln::spec
