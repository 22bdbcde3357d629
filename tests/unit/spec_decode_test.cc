// Speculative decoding on the real default model: greedy output identical to plain greedy
// decoding (n-gram strategy, a tree oracle that forces K/V compaction), the cache after a
// speculative run equal to a plain run's, sampling reproducibility, and the n-gram matcher. The
// greedy and cache guarantees again on a tiny deepseek2 (MLA latent cache) model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "lib/common/half.h"
#include "lib/engine/draft_policy.h"
#include "lib/engine/speculative_decoder.h"
#include "lib/model/model.h"
#include "lib/session/session.h"
#include "lib/spec/ngram_strategy.h"
#include "lib/spec/spec_generate.h"
#include "lib/tokenizer/tokenizer.h"
#include "tests/common/spec_test_util.h"

namespace kiln::spec {
namespace {

// Shorter generations under the sanitizers (scripts/test.sh runs the whole suite under ASan).
#if KILN_TEST_SANITIZED
constexpr int32_t kMaxTokens = 16;
#else
constexpr int32_t kMaxTokens = 48;
#endif

const char* const kPrompts[] = {
    "Repeat this sentence exactly: The quick brown fox jumps over the lazy dog near the river "
    "bank.",
    "Repeat this sentence exactly: Speculative decoding drafts several tokens and verifies them "
    "in one pass.",
    "Rename the variable x to count in this code:\nint x = 0;\nfor (int i = 0; i < 10; ++i) x += "
    "i;\nreturn x;",
    "Fix the typo in this sentence and write it again: The capitol of France is Paris, a citty "
    "on the Seine.",
    "Copy this list: apples, bananas, cherries, dates, elderberries, figs, grapes.",
    "What is the capital of France? Answer in one sentence.",
    "Write a haiku about the sea.",
    "Explain what a hash table is in two sentences.",
    "Give three tips for learning a new language.",
    "Translate to French: Good morning, how are you today?",
    "def add(a, b):\n    return a + b\n\nRewrite this Python function with type hints.",
};

using kiln::testing::ChatPrompt;
using kiln::testing::QuickMode;

class SpecDecodeTest : public kiln::testing::SpecModelTest {
 protected:
  static void SetUpTestSuite() { LoadDefaultModel(1024); }
  static void TearDownTestSuite() { FreeDefaultModel(); }
  static sample::SamplerParams Greedy() { return kiln::testing::GreedyParams(); }
};

TEST_F(SpecDecodeTest, NoStrategyEqualsPlainGreedy) {
  const auto prompt = Encode(ChatPrompt(kPrompts[5]));
  const auto plain = PlainGreedy(prompt, kMaxTokens);
  auto spec = GenerateSpeculative(*engine_, prompt, Greedy(), 1, nullptr, kMaxTokens);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->tokens, plain);
  EXPECT_EQ(spec->metrics.drafted, 0);
  EXPECT_EQ(spec->metrics.steps, static_cast<int64_t>(plain.size()));
}

TEST_F(SpecDecodeTest, NgramGreedyEqualsPlainGreedyOnElevenPrompts) {
  auto strategy = NgramStrategy::Create(NgramParams{});
  ASSERT_TRUE(strategy.ok()) << strategy.status();
  int64_t total_accepted = 0, total_steps = 0, total_generated = 0;
  // Quick mode (QuickMode): the first three, all copy-heavy.
  for (const char* text : std::span(kPrompts).first(QuickMode() ? 3 : std::size(kPrompts))) {
    SCOPED_TRACE(text);
    const auto prompt = Encode(ChatPrompt(text));
    const auto plain = PlainGreedy(prompt, kMaxTokens);
    ASSERT_FALSE(plain.empty());
    auto spec = GenerateSpeculative(*engine_, prompt, Greedy(), 1, strategy->get(), kMaxTokens);
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(spec->tokens, plain);
    EXPECT_EQ(spec->metrics.generated, static_cast<int64_t>(plain.size()));
    total_accepted += spec->metrics.accepted;
    total_steps += spec->metrics.steps;
    total_generated += spec->metrics.generated;
  }
  // The copy-heavy prompts must actually have been sped up: fewer passes than tokens.
  EXPECT_GT(total_accepted, 0);
  EXPECT_LT(total_steps, total_generated);
  std::printf("ngram: %lld tokens in %lld target passes (%lld accepted)\n",
              static_cast<long long>(total_generated), static_cast<long long>(total_steps),
              static_cast<long long>(total_accepted));
}

// Proposes a tree around a known continuation, depth levels deep.
//   kWrongFirst: at every level a wrong token first (with a wrong child of its own) and the right
//     one second, so the accepted path sits at non-consecutive node indices and the decoder must
//     compact its K/V;
//   kRightChainPlusLeaf: the right chain at nodes 0..depth-1 plus one wrong leaf under the root,
//     so the accepted path is already consecutive (no copies) but the tree-mask path still runs;
//   kChainEndingWrong: a chain of depth - 1 right tokens and a wrong last one (partial
//     acceptance of a chain, the causal path).
class OracleTreeStrategy final : public Strategy {
 public:
  enum class Shape { kWrongFirst, kRightChainPlusLeaf, kChainEndingWrong };
  OracleTreeStrategy(std::vector<int32_t> full, int32_t depth, int32_t n_vocab, Shape shape)
      : full_(std::move(full)), depth_(depth), n_vocab_(n_vocab), shape_(shape) {}
  std::string_view name() const override { return "oracle-tree"; }
  absl::Status Propose(std::span<const int32_t> context, int32_t max_draft, const ProposeContext&,
                       DraftTree* out) override {
    out->Clear();
    int32_t parent = -1;
    int32_t levels = 0;
    for (int32_t d = 0; d < depth_; ++d) {
      const size_t at = context.size() + static_cast<size_t>(d);
      if (at >= full_.size() || out->size() + 3 > max_draft) break;
      const int32_t right = full_[at];
      const int32_t wrong = (right + 1 + d) % n_vocab_;
      if (shape_ == Shape::kChainEndingWrong && d == depth_ - 1) {
        out->Add(wrong, parent);
        break;
      }
      if (shape_ == Shape::kWrongFirst) {
        const int32_t w = out->Add(wrong, parent);
        out->Add((wrong + 7) % n_vocab_, w);
      }
      parent = out->Add(right, parent);
      ++levels;
    }
    if (shape_ == Shape::kRightChainPlusLeaf && levels > 0) {
      out->Add((full_[context.size()] + 1) % n_vocab_, -1);
    }
    return absl::OkStatus();
  }
  void Accepted(int32_t, std::span<const int32_t> accepted) override {
    accepted_ += static_cast<int64_t>(accepted.size());
  }
  void Reset() override {}
  int64_t accepted() const { return accepted_; }

 private:
  std::vector<int32_t> full_;
  int32_t depth_;
  int32_t n_vocab_;
  Shape shape_;
  int64_t accepted_ = 0;
};

// K/V rows of `seq` vs `ref` at positions [0, len) (an MLA cache: its latent rows): how many rows
// differ bitwise, and the largest absolute difference of an element (the cache holds f16).
struct KvDiff {
  int64_t differing_rows = 0;
  float max_abs = 0.0f;
};
KvDiff CompareKv(KvCache& cache, SeqId seq, SeqId ref, int32_t len) {
  KvDiff d;
  const KvLayout& layout = cache.layout();
  const bool mla = layout.kind() == KvAttentionKind::kMla;
  // Per layer: each kv head's K then V row (GQA), or the one latent row (MLA).
  const int32_t rows_per_layer = mla ? 1 : 2 * layout.n_kv_heads();
  for (int32_t pos = 0; pos < len; ++pos) {
    const KvSlot a = *cache.SlotOf(seq, pos);
    const KvSlot b = *cache.SlotOf(ref, pos);
    for (int32_t l = 0; l < layout.n_layers(); ++l) {
      for (int32_t r = 0; r < rows_per_layer; ++r) {
        auto row = [&](KvSlot s) -> const std::byte* {
          if (mla) return cache.LatentRow(s, l);
          return r % 2 == 0 ? cache.KeyRow(s, l, r / 2) : cache.ValueRow(s, l, r / 2);
        };
        const std::byte* ra = row(a);
        const std::byte* rb = row(b);
        if (std::memcmp(ra, rb, layout.row_bytes()) == 0) continue;
        ++d.differing_rows;
        for (int32_t e = 0; e < layout.row_elems(); ++e) {
          uint16_t ha, hb;
          std::memcpy(&ha, ra + 2 * e, 2);
          std::memcpy(&hb, rb + 2 * e, 2);
          d.max_abs = std::max(d.max_abs, std::fabs(Fp16ToFp32(ha) - Fp16ToFp32(hb)));
        }
      }
    }
  }
  return d;
}

// Runs `strategy` through the decoder over a known greedy continuation and checks the cache
// against the same tokens computed causally in one prefill, then the logits of one more plain
// step on both. Returns the K/V difference.
// The speculative sequence is left in the cache and returned in *kept (the caller frees it).
// `params`: greedy (temperature 0), the sampler the continuation was made with.
void RunAndCompare(Engine& engine, const std::vector<int32_t>& prompt,
                   const std::vector<int32_t>& full, Strategy* strategy, SpecMetrics* metrics,
                   KvDiff* kv_diff, float* max_logit_diff, SeqId* kept,
                   const sample::SamplerParams& params = kiln::testing::GreedyParams()) {
  sample::Sampler sampler(params);
  sample::Rng rng(1);
  const SeqId seq = engine.Locked([](KvCache& c, ForwardPass&) { return c.CreateSequence(); });
  const SeqId ref = engine.Locked([](KvCache& c, ForwardPass&) { return c.CreateSequence(); });
  auto prefill = [&](SeqId s, std::span<const int32_t> toks) {
    ForwardBatch batch;
    ForwardOutput out;
    for (size_t i = 0; i < toks.size(); ++i) batch.Add(toks[i], s, static_cast<int32_t>(i), false);
    return engine.Locked([&](KvCache& c, ForwardPass& f) -> absl::Status {
      KILN_RETURN_IF_ERROR(c.AppendSlots(s, toks));
      return f.Forward(batch, c, &out);
    });
  };
  ASSERT_TRUE(prefill(seq, std::span(prompt).first(prompt.size() - 1)).ok());
  std::vector<int32_t> tokens = prompt;
  SpeculativeDecoder decoder(engine, seq, sampler, rng, strategy);
  SpecStepResult step;
  while (tokens.size() < full.size()) {
    const int32_t left = static_cast<int32_t>(full.size() - tokens.size());
    ASSERT_TRUE(decoder.Step(&tokens, std::min(left, 16), &step).ok());
  }
  EXPECT_EQ(tokens, full);
  *metrics = decoder.metrics();
  ASSERT_TRUE(prefill(ref, std::span(full).first(full.size() - 1)).ok());
  engine.Locked([&](KvCache& cache, ForwardPass&) {
    const int32_t len = static_cast<int32_t>(full.size()) - 1;
    ASSERT_EQ(*cache.Length(seq), len);
    ASSERT_EQ(*cache.NumComputed(seq), len);
    EXPECT_TRUE(std::equal(cache.Tokens(seq)->begin(), cache.Tokens(seq)->end(), full.begin()));
    *kv_diff = CompareKv(cache, seq, ref, len);
    EXPECT_TRUE(cache.CheckInvariants().ok());
  });
  std::vector<float> logits[2];
  const SeqId seqs[2] = {seq, ref};
  for (int k = 0; k < 2; ++k) {
    ForwardBatch batch;
    ForwardOutput out;
    batch.Add(full.back(), seqs[k], static_cast<int32_t>(full.size()) - 1, true);
    ASSERT_TRUE(engine
                    .Locked([&](KvCache& c, ForwardPass& f) -> absl::Status {
                      const int32_t last[1] = {full.back()};
                      KILN_RETURN_IF_ERROR(c.AppendSlots(seqs[k], last));
                      return f.Forward(batch, c, &out);
                    })
                    .ok());
    logits[k].assign(out.LogitsRow(0), out.LogitsRow(0) + out.n_vocab);
  }
  *max_logit_diff = 0.0f;
  for (size_t i = 0; i < logits[0].size(); ++i) {
    *max_logit_diff = std::max(*max_logit_diff, std::fabs(logits[0][i] - logits[1][i]));
  }
  *kept = seq;
  engine.Locked([&](KvCache& c, ForwardPass&) { return c.Free(ref); }).IgnoreError();
}

void FreeSeq(Engine& engine, SeqId seq) {
  engine.Locked([&](KvCache& c, ForwardPass&) { return c.Free(seq); }).IgnoreError();
}

TEST_F(SpecDecodeTest, ChainCommitGivesBitwisePlainCacheAndLogits) {
  // Chains of 3 right tokens and a wrong 4th: every step accepts 3, rejects 1 and truncates.
  const auto prompt = Encode(ChatPrompt(kPrompts[7]));
  const auto plain = PlainGreedy(prompt, 32);
  ASSERT_GE(plain.size(), 16u);
  std::vector<int32_t> full = prompt;
  full.insert(full.end(), plain.begin(), plain.end());
  OracleTreeStrategy oracle(full, 4, static_cast<int32_t>(model_->hparams().n_vocab),
                            OracleTreeStrategy::Shape::kChainEndingWrong);
  SpecMetrics metrics;
  KvDiff diff;
  float logit_diff = -1.0f;
  SeqId seq = 0;
  RunAndCompare(*engine_, prompt, full, &oracle, &metrics, &diff, &logit_diff, &seq);
  FreeSeq(*engine_, seq);
  EXPECT_GT(metrics.accepted, static_cast<int64_t>(plain.size()) / 2);
  EXPECT_EQ(diff.differing_rows, 0);
  EXPECT_EQ(logit_diff, 0.0f);
}

TEST_F(SpecDecodeTest, TreeCompactionGivesPlainGreedyTokens) {
  const auto prompt = Encode(ChatPrompt(kPrompts[7]));
  const auto plain = PlainGreedy(prompt, 32);
  ASSERT_GE(plain.size(), 16u);
  std::vector<int32_t> full = prompt;
  full.insert(full.end(), plain.begin(), plain.end());
  const int32_t n_vocab = static_cast<int32_t>(model_->hparams().n_vocab);
  const int64_t n_new = static_cast<int64_t>(plain.size());
  SeqId seqs[2];
  for (int k = 0; k < 2; ++k) {
    OracleTreeStrategy oracle(full, 4, n_vocab,
                              k == 0 ? OracleTreeStrategy::Shape::kWrongFirst
                                     : OracleTreeStrategy::Shape::kRightChainPlusLeaf);
    SpecMetrics metrics;
    KvDiff diff;
    float logit_diff = -1.0f;
    RunAndCompare(*engine_, prompt, full, &oracle, &metrics, &diff, &logit_diff, &seqs[k]);
    EXPECT_GT(oracle.accepted(), n_new / 2);  // the oracle's right tokens were accepted
    EXPECT_LT(metrics.steps, n_new / 2);
    // Tree-mask attention is exact math but not bitwise equal to the causal path in the CPU
    // kernel, so against the plain run only closeness is asserted (the greedy tokens above are
    // equal); a misplaced row would differ by O(1) and change the continuation.
    std::printf("tree shape %d vs plain: %lld K/V rows differ, max |diff| %g, logit diff %g\n", k,
                static_cast<long long>(diff.differing_rows), diff.max_abs, logit_diff);
    EXPECT_LT(logit_diff, 2.0f);
  }
  // The two tree runs differ from each other by the same kernel rounding (the attention reads
  // scattered vs consecutive extra rows), not bitwise; both give the plain greedy tokens.
  engine_->Locked([&](KvCache& cache, ForwardPass&) {
    const KvDiff d = CompareKv(cache, seqs[0], seqs[1], static_cast<int32_t>(full.size()) - 1);
    std::printf("tree shape 0 vs 1: %lld K/V rows differ, max |diff| %g\n",
                static_cast<long long>(d.differing_rows), d.max_abs);
    EXPECT_LT(d.max_abs, 1.0f);
    return 0;
  });
  FreeSeq(*engine_, seqs[0]);
  FreeSeq(*engine_, seqs[1]);
}

TEST_F(SpecDecodeTest, SamplingIsReproducibleAndValid) {
  // Pinned pass cost: a measured (timing-driven) one could choose other draft lengths in the
  // second run and so consume the random stream differently.
  NgramParams np;
  np.fixed_pass_cost_beta = 0.3;
  auto strategy = NgramStrategy::Create(np);
  ASSERT_TRUE(strategy.ok());
  sample::SamplerParams params;  // llama.cpp defaults, temperature 0.8
  const auto prompt = Encode(ChatPrompt(kPrompts[0]));
  auto a = GenerateSpeculative(*engine_, prompt, params, 42, strategy->get(), kMaxTokens);
  auto b = GenerateSpeculative(*engine_, prompt, params, 42, strategy->get(), kMaxTokens);
  auto c = GenerateSpeculative(*engine_, prompt, params, 7, strategy->get(), kMaxTokens);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_FALSE(a->tokens.empty());
  for (int32_t t : a->tokens) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, model_->hparams().n_vocab);
  }
  EXPECT_GT(a->metrics.drafted, 0);
  // The copy prompt at temperature 0.8 still accepts drafts.
  EXPECT_GT(a->metrics.accepted, 0);
  EXPECT_NE(a->tokens, c->tokens);
}

// The same guarantees on a deepseek2 (MLA) model, whose verification passes run MLA's
// tree-masked attention over the latent cache: the tiny random tiny-deepseek2 (f16 weights, f16
// latent cache). Its random logits would end generations early on the control tokens (ids 0-2),
// so greedy bans them.
class SpecDecodeDeepseek2Test : public kiln::testing::SpecModelTest {
 protected:
  static void SetUpTestSuite() { LoadTinyModel("tiny-deepseek2", 256); }
  static void TearDownTestSuite() { FreeDefaultModel(); }
  static sample::SamplerParams Greedy() {
    sample::SamplerParams p = kiln::testing::GreedyParams();
    for (int32_t t = 0; t < 3; ++t) p.logit_bias.push_back({t, -INFINITY});
    return p;
  }
  static std::vector<int32_t> Prompt() {
    // A phrase repeated, so the n-gram strategy finds matches to propose from.
    std::vector<int32_t> p;
    for (int rep = 0; rep < 4; ++rep) {
      for (int32_t t : {40, 41, 97, 120, 77, 66, 100, 54}) p.push_back(t);
    }
    return p;
  }
};

TEST_F(SpecDecodeDeepseek2Test, NgramGreedyEqualsPlainGreedy) {
  const std::vector<int32_t> prompt = Prompt();
  const auto plain = PlainGreedy(prompt, 32, Greedy());
  ASSERT_EQ(plain.size(), 32u);
  auto strategy = NgramStrategy::Create(NgramParams{});
  ASSERT_TRUE(strategy.ok()) << strategy.status();
  auto spec = GenerateSpeculative(*engine_, prompt, Greedy(), 1, strategy->get(), 32);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->tokens, plain);
  EXPECT_GT(spec->metrics.drafted, 0);  // verification passes of several tokens did run
}

TEST_F(SpecDecodeDeepseek2Test, ChainAndTreeCommitsGiveBitwisePlainCacheAndLogits) {
  const std::vector<int32_t> prompt = Prompt();
  const auto plain = PlainGreedy(prompt, 24, Greedy());
  ASSERT_EQ(plain.size(), 24u);
  std::vector<int32_t> full = prompt;
  full.insert(full.end(), plain.begin(), plain.end());
  const int32_t n_vocab = static_cast<int32_t>(model_->hparams().n_vocab);
  for (auto shape :
       {OracleTreeStrategy::Shape::kChainEndingWrong, OracleTreeStrategy::Shape::kWrongFirst,
        OracleTreeStrategy::Shape::kRightChainPlusLeaf}) {
    SCOPED_TRACE(static_cast<int>(shape));
    OracleTreeStrategy oracle(full, 4, n_vocab, shape);
    SpecMetrics metrics;
    KvDiff diff;
    float logit_diff = -1.0f;
    SeqId seq = 0;
    RunAndCompare(*engine_, prompt, full, &oracle, &metrics, &diff, &logit_diff, &seq, Greedy());
    FreeSeq(*engine_, seq);
    EXPECT_GT(oracle.accepted(), static_cast<int64_t>(plain.size()) / 2);
    // MLA attention computes each (token, head) in one fixed order over the rows it sees, so a
    // tree node equals its causal path bit for bit and the compacted cache equals a plain run's.
    EXPECT_EQ(diff.differing_rows, 0) << "max |diff| " << diff.max_abs;
    EXPECT_EQ(logit_diff, 0.0f);
  }
}

TEST(NgramStrategyTest, FindsMostRecentMatchAndProposesWhatFollowed) {
  const std::vector<int32_t> ctx = {1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3};
  EXPECT_EQ(NgramStrategy::FindMostRecent(ctx, 3), 4);
  EXPECT_EQ(NgramStrategy::FindMostRecent(ctx, 1), 4 + 2);
  EXPECT_EQ(NgramStrategy::FindMostRecent(std::vector<int32_t>{4, 5, 6}, 2), -1);
  NgramParams params;
  params.max_draft = 3;
  params.start_draft = 3;
  params.fixed_pass_cost_beta = 0.0;  // wide passes cost nothing: draft all max_draft
  auto s = NgramStrategy::Create(params);
  ASSERT_TRUE(s.ok());
  DraftTree tree;
  ASSERT_TRUE((*s)->Propose(ctx, 8, {}, &tree).ok());
  EXPECT_EQ(tree.tokens, (std::vector<int32_t>{7, 8, 5}));
  EXPECT_EQ(tree.parents, (std::vector<int32_t>{-1, 0, 1}));
  EXPECT_TRUE(tree.deterministic);
  // No match at all: nothing proposed.
  ASSERT_TRUE((*s)->Propose(std::vector<int32_t>{4, 5, 6}, 8, {}, &tree).ok());
  EXPECT_EQ(tree.size(), 0);
  // max_draft of the call caps the proposal.
  ASSERT_TRUE((*s)->Propose(ctx, 2, {}, &tree).ok());
  EXPECT_LE(tree.size(), 2);
  EXPECT_FALSE(NgramStrategy::Create(NgramParams{.max_ngram = 1, .min_ngram = 2}).ok());
  EXPECT_FALSE(NgramStrategy::Create(NgramParams{.max_draft = 0}).ok());
}

TEST(DraftPolicyTest, PassCostModelMeasuresTheSlope) {
  PassCostModel cost;
  EXPECT_EQ(cost.Beta(), PassCostModel::kPriorBeta);  // nothing measured
  cost.Observe(3, 3.0);                               // no one-token reference yet: ignored
  EXPECT_EQ(cost.wide_observations(), 0);
  cost.Observe(1, 1.0);
  EXPECT_EQ(cost.Beta(), PassCostModel::kPriorBeta);  // no wide pass yet
  cost.Observe(5, 3.0);                               // 0.5 per extra token
  EXPECT_DOUBLE_EQ(cost.Beta(), 0.5);
  EXPECT_DOUBLE_EQ(cost.RelativeCost(5), 3.0);
  for (int i = 0; i < 200; ++i) cost.Observe(3, 1.2);  // now 0.1 per extra token
  EXPECT_NEAR(cost.Beta(), 0.1, 1e-6);
  cost.Pin(0.7);
  cost.Observe(2, 100.0);
  EXPECT_EQ(cost.Beta(), 0.7);
  EXPECT_TRUE(cost.pinned());
}

// Each width keeps its own measured time (a pass is bound by the weight stream until its
// compute catches up, so the cost is not linear in the width); unmeasured or stale widths use
// the slope.
TEST(DraftPolicyTest, PassCostModelKeepsEachWidthsTime) {
  PassCostModel cost;
  cost.Observe(1, 1.0);
  for (int i = 0; i < 20; ++i) {
    cost.Observe(2, 1.02);
    cost.Observe(8, 2.4);
  }
  EXPECT_NEAR(cost.RelativeCost(2), 1.02, 1e-9);
  EXPECT_NEAR(cost.RelativeCost(8), 2.4, 1e-9);
  const double beta = cost.Beta();  // between the two widths' slopes, 0.02 and 0.2
  EXPECT_GT(beta, 0.02);
  EXPECT_LT(beta, 0.2);
  EXPECT_DOUBLE_EQ(cost.RelativeCost(4), 1.0 + 3 * beta);  // never measured
  EXPECT_DOUBLE_EQ(cost.RelativeCost(1), 1.0);
  cost.Observe(3, 0.5);  // faster than one token: noise, clamped
  EXPECT_DOUBLE_EQ(cost.RelativeCost(3), 1.0);
  for (int i = 0; i <= PassCostModel::kStaleAfter; ++i) cost.Observe(2, 1.02);
  EXPECT_DOUBLE_EQ(cost.RelativeCost(8), 1.0 + 7 * cost.Beta());  // stale: the slope again
  EXPECT_NEAR(cost.RelativeCost(2), 1.02, 1e-9);
  cost.Pin(0.3);
  EXPECT_DOUBLE_EQ(cost.RelativeCost(2), 1.3);  // pinned: the line
}

TEST(DraftPolicyTest, AcceptanceEstimateAndBestLength) {
  AcceptanceEstimate a;
  EXPECT_DOUBLE_EQ(a.first(), 0.5);
  EXPECT_DOUBLE_EQ(a.ExpectedAccepted(2), 0.5 + 0.25);
  for (int i = 0; i < 200; ++i) a.Observe(4, 4);  // always right (censored at 4)
  EXPECT_GT(a.first(), 0.95);
  EXPECT_GT(a.next(), 0.95);
  // Cheap wide passes: draft everything; expensive ones (a row costs a whole pass): never.
  auto linear = [](double beta) { return [beta](int32_t k) { return 1.0 + beta * k; }; };
  EXPECT_EQ(BestDraftLength(a, 8, linear(0.05)), 8);
  EXPECT_EQ(BestDraftLength(a, 8, linear(1.0)), 0);
  AcceptanceEstimate b;
  for (int i = 0; i < 200; ++i) b.Observe(4, 0);  // always wrong
  EXPECT_LT(b.first(), 0.05);
  EXPECT_EQ(BestDraftLength(b, 8, linear(0.05)), 0);
  // Half right: one token pays at beta 0.3 ((1 + 0.5) / 1.3 > 1), long drafts do not.
  AcceptanceEstimate c;
  for (int i = 0; i < 200; ++i) c.Observe(2, i % 2);  // a1 = 0.5, a never observed
  EXPECT_NEAR(c.first(), 0.5, 0.05);
  EXPECT_EQ(BestDraftLength(c, 1, linear(0.3)), 1);
  EXPECT_EQ(BestDraftLength(c, 1, linear(0.6)), 0);
}

// The n-gram strategy learns acceptance from what followed its candidates, also while it
// proposes nothing, and picks its length from the cost.
TEST(NgramStrategyTest, CostAwareLengthFollowsAcceptanceAndCost) {
  // A context that repeats a 6-token phrase: candidates are always right.
  const std::vector<int32_t> phrase = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19};
  auto run = [&](double beta, bool repeat_right) {
    NgramParams p;
    p.max_draft = 8;
    p.fixed_pass_cost_beta = beta;
    auto s = NgramStrategy::Create(p);
    EXPECT_TRUE(s.ok());
    std::vector<int32_t> ctx = phrase;
    ctx.insert(ctx.end(), phrase.begin(), phrase.begin() + 3);
    DraftTree tree;
    int32_t last_size = -1;
    for (int step = 0; step < 60; ++step) {
      EXPECT_TRUE((*s)->Propose(ctx, 8, {}, &tree).ok());
      last_size = tree.size();
      if (repeat_right) {
        // The target continues the phrase: the proposal is accepted, plus a bonus token.
        for (int32_t i = 0; i <= tree.size(); ++i) ctx.push_back(phrase[ctx.size() % 10]);
      } else {
        // The target says something new after every 3-token match.
        ctx.push_back(100 + step);
        ctx.insert(ctx.end(), phrase.begin(), phrase.begin() + 3);
      }
    }
    return std::make_pair(last_size, (*s)->acceptance(3).first());
  };
  const auto [cheap_size, cheap_a1] = run(0.05, true);
  EXPECT_EQ(cheap_size, 8);
  EXPECT_GT(cheap_a1, 0.9);
  const auto [costly_size, costly_a1] = run(1.0, true);
  EXPECT_EQ(costly_size, 0);  // a row costs a whole pass: never pays
  EXPECT_GT(costly_a1, 0.9);  // ... but it kept learning
  const auto [wrong_size, wrong_a1] = run(0.05, false);
  EXPECT_EQ(wrong_size, 0);  // always wrong: plain decoding
  EXPECT_LT(wrong_a1, 0.1);
}

TEST(NgramStrategyTest, ProbesAWidePassWhenTheCostIsMeasured) {
  PassCostModel measured;  // a measured, expensive wide pass: beta = 1, nothing ever pays
  measured.Observe(1, 1.0);
  measured.Observe(2, 2.0);
  ProposeContext ctx;
  ctx.cost = &measured;
  // right: the candidate (3, 4, 1, 2, ...) is what follows; otherwise never.
  for (bool right : {true, false}) {
    SCOPED_TRACE(right);
    NgramParams p;
    p.max_skip = 4;
    p.max_ngram = 2;
    auto s = NgramStrategy::Create(p);
    ASSERT_TRUE(s.ok());
    std::vector<int32_t> tokens = {1, 2, 3, 4, 1, 2};
    DraftTree tree;
    int proposals = 0;
    for (int step = 0; step < 13; ++step) {
      ASSERT_TRUE((*s)->Propose(tokens, 8, ctx, &tree).ok());
      proposals += tree.size() > 0;
      EXPECT_LE(tree.size(), 1);
      if (right) {
        tokens.push_back(tokens[tokens.size() - 4]);
      } else {
        tokens.push_back(100 + step);  // never what followed before ...
        tokens.push_back(1);           // ... and a fresh match of (1, 2)
        tokens.push_back(2);
      }
    }
    // Right candidates: one probe every max_skip plain steps (steps 3, 7, 11), since one token
    // would pay at half the measured slope. Wrong ones: probing could not pay, so none.
    EXPECT_EQ(proposals, right ? 3 : 0);
  }
}

}  // namespace
}  // namespace kiln::spec
