// Speculative decoding through Session::SetStrategy on the real default model: greedy output
// identical to a plain session, max_tokens and stop strings honoured exactly (tokens cut inside
// an accepted draft are dropped), metrics reported, the strategy removable between calls.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "lib/model/model.h"
#include "lib/session/session.h"
#include "lib/spec/ngram_strategy.h"
#include "tests/common/test_util.h"

namespace kiln::spec {
namespace {

constexpr const char* kCopyPrompt =
    "<|im_start|>user\nRepeat this sentence exactly: The quick brown fox jumps over the lazy dog "
    "near the river bank.<|im_end|>\n<|im_start|>assistant\n";

class SpecSessionTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ModelLoadOptions load;
    load.path = kiln::testing::DefaultModelPath();
    auto model = Model::Load(load);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = model->release();
    EngineOptions options;
    options.n_threads = 2;
    options.n_ctx = 512;
    auto engine = Engine::Create(*model_, options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = engine->release();
  }
  static void TearDownTestSuite() {
    delete engine_;
    delete model_;
  }
  static std::unique_ptr<Session> NewSession(Strategy* strategy) {
    sample::SamplerParams p;
    p.temperature = 0.0f;
    auto s = Session::Create(*engine_, p, 1);
    EXPECT_TRUE(s.ok());
    EXPECT_TRUE((*s)->AppendText(kCopyPrompt, true, true).ok());
    if (strategy != nullptr) {
      EXPECT_TRUE((*s)->SetStrategy(strategy).ok());
    }
    return std::move(*s);
  }
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
  static Model* model_;
  static Engine* engine_;
};

Model* SpecSessionTest::model_ = nullptr;
Engine* SpecSessionTest::engine_ = nullptr;

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
    }
    // Generation continues identically after removing the strategy.
    ASSERT_TRUE(spec->SetStrategy(nullptr).ok());
    options.max_tokens = 6;
    Run(*plain, options, &rp);
    Run(*spec, options, &rs);
    EXPECT_EQ(spec->tokens(), plain->tokens());
  }
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

}  // namespace
}  // namespace kiln::spec
