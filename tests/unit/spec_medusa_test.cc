// Medusa heads (lib/spec/medusa_strategy.h) and the target features they read:
//   - the features the engine returns are exactly what the LM head multiplies;
//   - a head file made for another model is refused, naming what differs;
//   - reduced-vocabulary heads (format version 2) draft only their tokens, score them with the
//     target's own rows, keep greedy output, and malformed ones (ids out of range or unordered,
//     a missing or misshapen LM head, a newer format version) are refused naming what is wrong;
//     a version-1 file (no format_version key) still loads;
//   - greedy output with the Medusa strategy is identical to plain greedy decoding (20 prompts,
//     the committed head for the default model when present, else a random head);
//   - at temperature 1 the first emitted token is distributed as the target's (tiny model, a
//     random head whose tree has several children per node);
//   - the n-gram chain merged into the heads' trees gets a copy accepted.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "lib/backend/cpu/cpu_backend.h"
#include "lib/common/strings.h"
#include "lib/engine/speculative_decoder.h"
#include "lib/gguf/gguf.h"
#include "lib/gguf/gguf_writer.h"
#include "lib/model/model.h"
#include "lib/sample/sampler.h"
#include "lib/spec/draft_head.h"
#include "lib/spec/medusa_strategy.h"
#include "lib/spec/spec_generate.h"
#include "tests/common/spec_test_util.h"
#include "tests/common/test_util.h"

namespace kiln::spec {
namespace {

using kiln::testing::ChatPrompt;

using kiln::testing::kHeldOutChatPrompts;

using kiln::testing::kDistributionSamples;
using kiln::testing::kHeadTestMaxTokens;

// The committed head for the default model (tools/train/, models/README.md).
std::string TrainedHeadPath() {
  return kiln::testing::SourcePath("models/SmolLM2-135M-Instruct.medusa.gguf");
}

// A head with random residual blocks (N(0, scale^2 / n_embd) weights, zero biases) for `target`.
MedusaHead RandomHead(const Model& target, int32_t n_heads, float scale, uint64_t seed,
                      std::vector<int32_t> parents, std::vector<int32_t> ranks) {
  MedusaHead head;
  head.n_heads = n_heads;
  head.n_embd = target.hparams().n_embd;
  head.target = *FingerprintOf(target);
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal(0.0f, scale / std::sqrt(static_cast<float>(head.n_embd)));
  for (int32_t k = 0; k < n_heads; ++k) {
    std::vector<float>& w = head.weights.emplace_back(head.n_embd * head.n_embd);
    for (float& x : w) x = normal(gen);
    head.biases.emplace_back(head.n_embd, 0.0f);
  }
  head.tree = *MakeStaticTree(std::move(parents), std::move(ranks), n_heads, kMedusaMaxRank);
  return head;
}

// `head` with the reduced vocabulary `ids`: the target's own LM-head rows for them, bytes as is.
MedusaHead WithReducedVocabulary(const Model& target, MedusaHead head, std::vector<int32_t> ids) {
  const WeightView& out = target.output();
  head.lm_head_type = out.type;
  head.lm_head.clear();
  for (int32_t id : ids) {
    const uint8_t* row = out.Row(id);
    head.lm_head.insert(head.lm_head.end(), row, row + out.row_bytes());
  }
  head.vocab_ids = std::move(ids);
  return head;
}

// Copies the head file `from` to `to` without the keys and tensors named in `drop`, then lets
// `edit` add records: the malformed files of the refusal tests.
void RewriteHead(const std::string& from, const std::string& to,
                 const std::vector<std::string>& drop,
                 const std::function<void(gguf::GgufWriter&)>& edit) {
  auto file = gguf::GgufFile::Open(from);
  ASSERT_TRUE(file.ok()) << file.status();
  auto dropped = [&](const std::string& name) {
    return std::find(drop.begin(), drop.end(), name) != drop.end();
  };
  gguf::GgufWriter w;
  for (const gguf::KeyValue& kv : (*file)->metadata()) {
    if (!dropped(kv.key)) w.CopyKeyValue(kv);
  }
  for (const gguf::TensorInfo& t : (*file)->tensors()) {
    if (dropped(t.name)) continue;
    ASSERT_TRUE(w.AddTensor(t.name, t.type, t.ne, std::span(t.data, t.nbytes)).ok());
  }
  edit(w);
  ASSERT_TRUE(w.WriteToFile(to).ok());
}

using SpecMedusaTest = kiln::testing::SpecHeadTest;

TEST_F(SpecMedusaTest, FeaturesAreWhatTheLmHeadReads) {
  const std::vector<int32_t> prompt = Encode(ChatPrompt("Name three rivers."));
  const int64_t n_vocab = model_->hparams().n_vocab, d = model_->hparams().n_embd;
  const SeqId seq = engine_->Locked([](KvCache& c, ForwardPass&) { return c.CreateSequence(); });
  std::vector<float> logits, hidden;
  int32_t rows = 0;
  PrefillRequest request;
  request.seq = seq;
  request.tokens = prompt;
  request.logits_from = static_cast<int32_t>(prompt.size()) - 5;
  request.on_logits = [&](int32_t, const float* row) {
    logits.insert(logits.end(), row, row + n_vocab);
    ++rows;
  };
  request.on_hidden = [&](int32_t, const float* row) { hidden.insert(hidden.end(), row, row + d); };
  ASSERT_TRUE(engine_->Prefill(request).ok());
  ASSERT_EQ(rows, 5);
  ASSERT_EQ(hidden.size(), static_cast<size_t>(rows * d));
  cpu::CpuBackend backend(1);
  std::vector<float> again(rows * n_vocab);
  ASSERT_TRUE(backend.MatMul(model_->output(), hidden.data(), rows, again.data()).ok());
  EXPECT_EQ(std::memcmp(again.data(), logits.data(), again.size() * sizeof(float)), 0);

  // A pass that does not ask returns no features.
  ForwardOutput out;
  ASSERT_TRUE(engine_
                  ->Locked([&](KvCache& cache, ForwardPass& pass) -> absl::Status {
                    ForwardBatch batch;
                    const int32_t at = static_cast<int32_t>(prompt.size());
                    const int32_t one[1] = {prompt[0]};
                    KILN_RETURN_IF_ERROR(cache.AppendSlots(seq, one));
                    batch.Add(prompt[0], seq, at, /*want_logits=*/true);
                    return pass.Forward(batch, cache, &out);
                  })
                  .ok());
  EXPECT_FALSE(out.has_hidden());
  EXPECT_EQ(out.logits.size(), static_cast<size_t>(n_vocab));
  engine_->Locked([&](KvCache& c, ForwardPass&) { return c.Free(seq); }).IgnoreError();
}

TEST_F(SpecMedusaTest, RefusesAHeadForAnotherModel) {
  const std::string for_tiny = kiln::testing::TempDir() + "/medusa-for-tiny.gguf";
  ASSERT_TRUE(
      WriteMedusaHead(RandomHead(*tiny_, 2, 1.0f, 1, {-1, 0}, {0, 0}), for_tiny, true).ok());
  auto refused = MedusaStrategy::Load(for_tiny, *model_, {});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(refused.status().message());
  EXPECT_NE(message.find("trained for another model"), std::string::npos) << message;
  EXPECT_NE(message.find("vocabulary hash"), std::string::npos) << message;
  EXPECT_NE(message.find("hidden size 256 != the model's 576"), std::string::npos) << message;
  EXPECT_NE(message.find("layer count 2 != the model's 30"), std::string::npos) << message;
  // The same file loads for the model it was made for.
  EXPECT_TRUE(MedusaStrategy::Load(for_tiny, *tiny_, {}).ok());
  // A model file is not a head.
  auto not_head = MedusaStrategy::Load(*tiny_path_, *tiny_, {});
  ASSERT_FALSE(not_head.ok());
  EXPECT_NE(not_head.status().message().find("not a medusa head"), absl::string_view::npos)
      << not_head.status();
  // A tree naming a head the file lacks.
  const std::string bad_tree = kiln::testing::TempDir() + "/medusa-bad-tree.gguf";
  MedusaHead head = RandomHead(*tiny_, 2, 1.0f, 1, {-1, 0}, {0, 0});
  head.tree.parents = {-1, 0, 1};
  head.tree.ranks = {0, 0, 0};
  ASSERT_TRUE(WriteMedusaHead(head, bad_tree, false).ok());
  auto deep = MedusaStrategy::Load(bad_tree, *tiny_, {});
  ASSERT_FALSE(deep.ok());
  EXPECT_NE(deep.status().message().find("depth 3 but the file has 2 heads"),
            absl::string_view::npos)
      << deep.status();
}

TEST_F(SpecMedusaTest, ReducedVocabularyHeadDraftsItsTokensAndKeepsGreedyOutput) {
  const Model& model = *tiny_;
  const int64_t d = model.hparams().n_embd, n_vocab = model.hparams().n_vocab;
  std::vector<int32_t> ids;  // two thirds of the vocabulary
  for (int32_t v = 0; v < n_vocab; ++v) {
    if (v % 3 != 1) ids.push_back(v);
  }
  // Zero residual blocks (z = h): head 1's logits are the target's own at the subset's rows.
  const std::string path = kiln::testing::TempDir() + "/medusa-reduced.gguf";
  ASSERT_TRUE(
      WriteMedusaHead(WithReducedVocabulary(
                          model, RandomHead(model, 2, 0.0f, 5, {-1, -1, 0, 0}, {0, 1, 0, 1}), ids),
                      path, true)
          .ok());
  MedusaParams heads_only;
  heads_only.merge_ngram = false;  // the heads' own drafts (an n-gram chain may copy any token)
  auto strategy = MedusaStrategy::Load(path, model, heads_only);
  ASSERT_TRUE(strategy.ok()) << strategy.status();
  ASSERT_EQ((*strategy)->head().vocab_ids, ids);

  std::vector<float> feature(d);
  std::mt19937 gen(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : feature) x = normal(gen);
  const std::vector<int32_t> context = {1, 72, 101, 108};
  (*strategy)->ObserveTargetFeatures(3, 4, feature, d);
  DraftTree tree;
  ASSERT_TRUE((*strategy)->Propose(context, 8, {}, &tree).ok());
  ASSERT_EQ(tree.size(), 4);
  for (int32_t t : tree.tokens) {
    EXPECT_TRUE(std::binary_search(ids.begin(), ids.end(), t)) << "drafted token " << t;
  }
  const std::vector<float>& logits = (*strategy)->last_logits();
  ASSERT_EQ(logits.size(), 2 * ids.size());  // [depth 2, the subset]
  cpu::CpuBackend backend(1);
  std::vector<float> full(n_vocab);
  ASSERT_TRUE(backend.MatMul(model.output(), feature.data(), 1, full.data()).ok());
  for (size_t j = 0; j < ids.size(); ++j) {
    ASSERT_NEAR(logits[j], full[ids[j]], 1e-3f * (1.0f + std::abs(full[ids[j]]))) << ids[j];
  }
  // Depth 1's best candidate is the best subset token of the target's own logits.
  int32_t best = ids[0];
  for (int32_t id : ids) best = full[id] > full[best] ? id : best;
  EXPECT_EQ(tree.tokens[0], best);

  for (const std::vector<int32_t>& prompt :
       {std::vector<int32_t>{1, 72, 101, 108, 108, 111}, std::vector<int32_t>{1, 84, 104, 101}}) {
    auto plain =
        GenerateSpeculative(*tiny_engine_, prompt, kiln::testing::GreedyParams(), 0, nullptr, 24);
    auto spec = GenerateSpeculative(*tiny_engine_, prompt, kiln::testing::GreedyParams(), 0,
                                    strategy->get(), 24);
    ASSERT_TRUE(plain.ok() && spec.ok());
    EXPECT_EQ(spec->tokens, plain->tokens);
    EXPECT_GT(spec->metrics.drafted, 0);
  }
}

TEST_F(SpecMedusaTest, RefusesMalformedReducedVocabularyHeads) {
  const Model& model = *tiny_;
  const int32_t n_vocab = static_cast<int32_t>(model.hparams().n_vocab);
  const std::string dir = kiln::testing::TempDir();
  const std::string good = dir + "/medusa-reduced-good.gguf";
  const MedusaHead head =
      WithReducedVocabulary(model, RandomHead(model, 2, 1.0f, 2, {-1, 0}, {0, 0}), {3, 7, 9, 20});
  ASSERT_TRUE(WriteMedusaHead(head, good, true).ok());
  ASSERT_TRUE(MedusaStrategy::Load(good, model, {}).ok());

  auto expect_refused = [&](const std::string& file, absl::StatusCode code,
                            const std::string& needle) {
    auto s = MedusaStrategy::Load(file, model, {});
    ASSERT_FALSE(s.ok()) << file;
    EXPECT_EQ(s.status().code(), code) << s.status();
    EXPECT_NE(s.status().message().find(needle), absl::string_view::npos) << s.status();
  };
  const std::string bad = dir + "/medusa-reduced-bad.gguf";
  auto ids = [](std::vector<int32_t> v) {
    return [v](gguf::GgufWriter& w) { w.SetArrayInt32("medusa.vocab.ids", v); };
  };
  // An id past the target's vocabulary, and a negative one.
  RewriteHead(good, bad, {"medusa.vocab.ids"}, ids({3, 7, 9, n_vocab}));
  expect_refused(bad, absl::StatusCode::kInvalidArgument,
                 kiln::StrCat("medusa.vocab.ids[3] = ", n_vocab,
                              " is outside the target's vocabulary [0, ", n_vocab, ")"));
  RewriteHead(good, bad, {"medusa.vocab.ids"}, ids({-1, 7, 9, 20}));
  expect_refused(bad, absl::StatusCode::kInvalidArgument, "medusa.vocab.ids[0] = -1 is outside");
  // Unordered or repeated ids.
  RewriteHead(good, bad, {"medusa.vocab.ids"}, ids({3, 9, 7, 20}));
  expect_refused(bad, absl::StatusCode::kDataLoss, "not strictly ascending at 2");
  RewriteHead(good, bad, {"medusa.vocab.ids"}, ids({3, 7, 7, 20}));
  expect_refused(bad, absl::StatusCode::kDataLoss, "not strictly ascending at 2");
  // More ids than LM-head rows; an empty list; ids of the wrong type.
  RewriteHead(good, bad, {"medusa.vocab.ids"}, ids({3, 7, 9, 20, 21}));
  expect_refused(bad, absl::StatusCode::kDataLoss, "tensor medusa.lm_head.weight has shape");
  RewriteHead(good, bad, {"medusa.vocab.ids"}, ids({}));
  expect_refused(bad, absl::StatusCode::kDataLoss, "medusa.vocab.ids");
  RewriteHead(good, bad, {"medusa.vocab.ids"},
              [](gguf::GgufWriter& w) { w.SetString("medusa.vocab.ids", "3 7 9 20"); });
  expect_refused(bad, absl::StatusCode::kDataLoss, "key medusa.vocab.ids");
  // Half a reduced vocabulary.
  RewriteHead(good, bad, {"medusa.lm_head.weight"}, [](gguf::GgufWriter&) {});
  expect_refused(bad, absl::StatusCode::kDataLoss, "the file has only medusa.vocab.ids");
  RewriteHead(good, bad, {"medusa.vocab.ids"}, [](gguf::GgufWriter&) {});
  expect_refused(bad, absl::StatusCode::kDataLoss, "the file has only medusa.lm_head.weight");
  // A non-finite LM-head row (f32 rows).
  RewriteHead(good, bad, {"medusa.lm_head.weight"}, [&](gguf::GgufWriter& w) {
    std::vector<float> rows(4 * model.hparams().n_embd, 0.5f);
    rows[17] = std::nanf("");
    ASSERT_TRUE(w.AddTensor("medusa.lm_head.weight", static_cast<uint32_t>(GgmlType::kF32),
                            {static_cast<uint64_t>(model.hparams().n_embd), 4},
                            std::span(reinterpret_cast<const uint8_t*>(rows.data()),
                                      rows.size() * sizeof(float)))
                    .ok());
  });
  expect_refused(bad, absl::StatusCode::kDataLoss, "medusa.lm_head.weight is not finite");
  // A newer format version is refused by number; version 1 (no key) loads, ignoring nothing it
  // knows: its heads score the target's full vocabulary.
  RewriteHead(good, bad, {"medusa.format_version"},
              [](gguf::GgufWriter& w) { w.SetUint32("medusa.format_version", 3); });
  expect_refused(bad, absl::StatusCode::kInvalidArgument,
                 "medusa head format version 3; this kiln reads 1 to 2");
  RewriteHead(good, bad, {"medusa.format_version"},
              [](gguf::GgufWriter& w) { w.SetString("medusa.format_version", "2"); });
  expect_refused(bad, absl::StatusCode::kDataLoss, "key medusa.format_version");
  const std::string v1 = dir + "/medusa-v1.gguf";
  RewriteHead(good, v1, {"medusa.format_version", "medusa.vocab.ids", "medusa.lm_head.weight"},
              [](gguf::GgufWriter&) {});
  auto old = MedusaStrategy::Load(v1, model, {});
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_TRUE((*old)->head().vocab_ids.empty());
  // Ids checked again when a head is handed over in memory.
  MedusaHead in_memory = head;
  in_memory.vocab_ids[1] = n_vocab + 5;
  auto created = MedusaStrategy::Create(std::make_shared<const MedusaHead>(in_memory), model, {});
  ASSERT_FALSE(created.ok());
  EXPECT_NE(created.status().message().find("outside the target's vocabulary"),
            absl::string_view::npos)
      << created.status();
}

TEST_F(SpecMedusaTest, GreedyOutputIsPlainDecodingOn20Prompts) {
  const bool trained = std::filesystem::exists(TrainedHeadPath());
  std::unique_ptr<MedusaStrategy> strategy;
  if (trained) {
    auto s = MedusaStrategy::Load(TrainedHeadPath(), *model_, {});
    ASSERT_TRUE(s.ok()) << s.status();
    strategy = std::move(*s);
  } else {
    auto s =
        MedusaStrategy::Create(std::make_shared<const MedusaHead>(RandomHead(
                                   *model_, 3, 0.5f, 7, {-1, -1, 0, 0, 2, 1}, {0, 1, 0, 1, 0, 0})),
                               *model_, {});
    ASSERT_TRUE(s.ok()) << s.status();
    strategy = std::move(*s);
  }
  SpecMetrics total;
  for (const char* p : kiln::testing::HeldOutChatPrompts()) {
    const std::vector<int32_t> prompt = Encode(ChatPrompt(p));
    const std::vector<int32_t> plain = PlainGreedy(prompt, kHeadTestMaxTokens);
    auto spec = GenerateSpeculative(*engine_, prompt, kiln::testing::GreedyParams(), 0,
                                    strategy.get(), kHeadTestMaxTokens);
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(spec->tokens, plain) << p;
    total.steps += spec->metrics.steps;
    total.drafted += spec->metrics.drafted;
    total.accepted += spec->metrics.accepted;
  }
  EXPECT_GT(total.drafted, 0);
  if (trained) {
    EXPECT_GT(total.accepted, 0);
  }
  std::printf("medusa (%s head): %lld steps, %lld drafted, %lld accepted, %.2f per step\n",
              trained ? "trained" : "random", static_cast<long long>(total.steps),
              static_cast<long long>(total.drafted), static_cast<long long>(total.accepted),
              total.MeanAcceptedPerStep());
}

// (SpecHeadTest::ExpectTreeVerificationKeepsTheTargetDistribution says what is checked).
TEST_F(SpecMedusaTest, TrainedHeadTreeKeepsTheSampledDistribution) {
  MedusaParams params;
  params.merge_ngram = false;
  auto strategy = MedusaStrategy::Load(TrainedHeadPath(), *model_, params);
  ASSERT_TRUE(strategy.ok()) << strategy.status();
  ExpectTreeVerificationKeepsTheTargetDistribution(strategy->get(), "medusa (trained head)");
}

// (SpecHeadTest::ExpectTypicalAcceptanceAcceptsMoreAndIsReportedLossy says what is checked).
TEST_F(SpecMedusaTest, TrainedHeadTypicalAcceptanceAcceptsMoreAndIsReportedLossy) {
  MedusaParams params;
  params.merge_ngram = false;
  auto exact = MedusaStrategy::Load(TrainedHeadPath(), *model_, params);
  params.typical = sample::TypicalAcceptance{};
  auto typical = MedusaStrategy::Load(TrainedHeadPath(), *model_, params);
  ASSERT_TRUE(exact.ok() && typical.ok()) << exact.status() << typical.status();
  ExpectTypicalAcceptanceAcceptsMoreAndIsReportedLossy(exact->get(), typical->get(),
                                                       "medusa (trained head)");
  params.typical = sample::TypicalAcceptance{0.09f, -1.0f};
  auto bad = MedusaStrategy::Load(TrainedHeadPath(), *model_, params);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("delta"), absl::string_view::npos) << bad.status();
}

// The n-gram chain merged into the trees of random Medusa heads gets a copy accepted
// (SpecHeadTest::ExpectMergedNgramChainGetsCopiesAccepted says what is checked).
TEST_F(SpecMedusaTest, MergedNgramChainGetsCopiesAccepted) {
  auto head = std::make_shared<const MedusaHead>(RandomHead(*model_, 1, 0.5f, 7, {-1, -1}, {0, 1}));
  MedusaParams alone;
  alone.merge_ngram = false;
  auto merged = MedusaStrategy::Create(head, *model_, {});
  auto heads_only = MedusaStrategy::Create(head, *model_, alone);
  ASSERT_TRUE(merged.ok() && heads_only.ok()) << merged.status() << heads_only.status();
  ExpectMergedNgramChainGetsCopiesAccepted(merged->get(), heads_only->get(),
                                           "medusa, random heads");
}

// The first emitted token is distributed as plain sampling's (ExpectFirstTokenHasTargetDistribution
// says how and with what bound). To make the tree's candidates likely (so that drafts are accepted
// sometimes and rejected sometimes and both branches of the rejection sampler run), the heads
// are zero (z = h) and read the root's own feature: depth-1 candidates are then the target's
// top-4 at the root. Exactness must not depend on what the feature is.
TEST_F(SpecMedusaTest, SampledFirstTokenHasTheTargetDistribution) {
  const Model& model = *tiny_;
  Engine& engine = *tiny_engine_;
  auto strategy = MedusaStrategy::Create(
      std::make_shared<const MedusaHead>(
          RandomHead(model, 2, 0.0f, 3, {-1, -1, -1, -1, 0, 0, 1}, {0, 1, 2, 3, 0, 1, 0})),
      model, {});
  ASSERT_TRUE(strategy.ok()) << strategy.status();
  kiln::testing::ExpectFirstTokenHasTargetDistribution(engine, model, strategy->get(), 7,
                                                       kDistributionSamples);
}

}  // namespace
}  // namespace kiln::spec
