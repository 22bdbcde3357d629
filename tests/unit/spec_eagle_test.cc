// EAGLE heads (lib/spec/eagle_strategy.h), with heads written by WriteDerivedEagleHead:
//   - a head file made for another model is refused naming what differs; malformed files
//     (missing tensor, wrong shape or type, non-finite values, wrong layer keys) are refused
//     naming the tensor or key;
//   - greedy output with the EAGLE strategy is identical to plain greedy decoding (20 prompts on
//     the default model, a head whose layer is the target's last layer, and the committed trained
//     head, whose drafts are accepted; and a tiny model);
//   - the head's cache holds exactly the accepted text after every step (its entries equal a
//     head that saw that text in one go);
//   - at temperature 1 the first emitted token is distributed as the target's;
//   - a head with a reduced draft vocabulary drafts only its tokens, keeps greedy output and the
//     sampled distribution; a malformed vocabulary is refused naming the fault;
//   - the automatic tree (top_k, depth) follows the pass and draft-step costs;
//   - the n-gram chain merged into the tree gets a copy accepted that the head alone misses;
//   - EAGLE-3 heads (fused target layers, own LM head): malformed files refused naming the key or
//     tensor; the decoder hands them exactly the layers they fuse (an identity head over the last
//     layer drafts the target's own logits); the committed trained head keeps greedy output and
//     the sampled distribution and is accepted.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lib/backend/cpu/cpu_backend.h"
#include "lib/common/strings.h"
#include "lib/engine/scheduler.h"
#include "lib/engine/speculative_decoder.h"
#include "lib/gguf/gguf_writer.h"
#include "lib/model/model.h"
#include "lib/sample/sampler.h"
#include "lib/session/session.h"
#include "lib/spec/eagle_strategy.h"
#include "lib/spec/spec_generate.h"
#include "tests/common/spec_test_util.h"
#include "tests/common/test_util.h"

namespace kiln::spec {
namespace {

using kiln::testing::ChatPrompt;

using kiln::testing::kHeldOutChatPrompts;

using kiln::testing::kDistributionSamples;
using kiln::testing::kHeadTestMaxTokens;

// The committed head for the default model, with a fixed tree (8 nodes, top_k 4, depth 3: no
// timing involved) and the head's drafts only (no n-gram chain merged in); `typical` as given.
constexpr const char* kTrainedEagle1 = "models/SmolLM2-135M-Instruct.eagle.gguf";
constexpr const char* kTrainedEagle3 = "models/SmolLM2-135M-Instruct.eagle3.gguf";
absl::StatusOr<std::unique_ptr<EagleStrategy>> LoadTrainedHead(
    const Model& model, std::optional<sample::TypicalAcceptance> typical = std::nullopt,
    const char* file = kTrainedEagle1) {
  EagleParams params;
  params.tree_tokens = 8;
  params.top_k = 4;
  params.max_depth = 3;
  params.merge_ngram = false;
  params.typical = typical;
  return EagleStrategy::Load(kiln::testing::SourcePath(file), model, params);
}

// Forwards to an EagleStrategy and records every feature row the decoder hands it and every
// token it drafts.
class Recording final : public Strategy {
 public:
  explicit Recording(EagleStrategy* inner) : inner_(inner) {}
  std::string_view name() const override { return "recording"; }
  absl::Status Propose(std::span<const int32_t> context, int32_t max_draft,
                       const ProposeContext& ctx, DraftTree* out) override {
    absl::Status s = inner_->Propose(context, max_draft, ctx, out);
    drafted_.insert(drafted_.end(), out->tokens.begin(), out->tokens.end());
    return s;
  }
  void Accepted(int32_t drafted, std::span<const int32_t> accepted) override {
    inner_->Accepted(drafted, accepted);
  }
  void Reset() override { inner_->Reset(); }
  bool wants_target_features() const override { return true; }
  void ObserveTargetFeatures(int32_t first_position, int32_t context_len,
                             std::span<const float> features, int64_t n_embd) override {
    if (first_position_ < 0) first_position_ = first_position;
    features_.insert(features_.end(), features.begin(), features.end());
    inner_->ObserveTargetFeatures(first_position, context_len, features, n_embd);
  }
  int32_t first_position_ = -1;
  std::vector<float> features_;
  std::vector<int32_t> drafted_;

 private:
  EagleStrategy* inner_;
};

class SpecEagleTest : public kiln::testing::SpecHeadTest {
 protected:
  // Writes a head for `model` into the temp dir and loads it as a strategy.
  static std::unique_ptr<EagleStrategy> MakeStrategy(const Model& model, EagleHeadInit init,
                                                     const std::string& file,
                                                     const EagleParams& params = {},
                                                     std::span<const int32_t> draft_vocab = {}) {
    const std::string path = kiln::testing::TempDir() + "/" + file;
    absl::Status written = WriteDerivedEagleHead(model, init, 5, path, draft_vocab);
    EXPECT_TRUE(written.ok()) << written;
    auto s = EagleStrategy::Load(path, model, params);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }
  // Prefills `prompt` on `engine` in a sequence freed afterwards and hands `strategy` the last
  // position's feature, as the decoder does before the first proposal.
  static void ObservePromptFeature(Engine& engine, const std::vector<int32_t>& prompt,
                                   EagleStrategy& strategy) {
    const int64_t d = engine.model().hparams().n_embd;
    const int32_t n = static_cast<int32_t>(prompt.size());
    const SeqId seq = engine.Locked([](KvCache& c, ForwardPass&) { return c.CreateSequence(); });
    std::vector<float> feature;
    PrefillRequest request;
    request.seq = seq;
    request.tokens = prompt;
    request.logits_from = n - 1;
    request.on_logits = [](int32_t, const float*) {};
    request.on_hidden = [&](int32_t, const float* row) { feature.assign(row, row + d); };
    ASSERT_TRUE(engine.Prefill(request).ok());
    engine.Locked([&](KvCache& c, ForwardPass&) { return c.Free(seq); }).IgnoreError();
    strategy.ObserveTargetFeatures(n - 2, n, feature, d);
  }
};

// Rewrites the head file at `from` into `to`, letting `edit` change each tensor (name, type, ne,
// bytes; returning false drops it) and each key.
absl::Status Rewrite(const std::string& from, const std::string& to,
                     const std::function<bool(std::string&, uint32_t&, std::vector<uint64_t>&,
                                              std::vector<uint8_t>&)>& edit,
                     const std::function<void(gguf::GgufWriter&)>& keys = {}) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<gguf::GgufFile> f, gguf::GgufFile::Open(from));
  gguf::GgufWriter w;
  for (const gguf::KeyValue& kv : f->metadata()) w.CopyKeyValue(kv);
  if (keys) keys(w);
  for (const gguf::TensorInfo& t : f->tensors()) {
    std::string name = t.name;
    uint32_t type = t.type;
    std::vector<uint64_t> ne = t.ne;
    std::vector<uint8_t> bytes(t.data, t.data + t.nbytes);
    if (!edit(name, type, ne, bytes)) continue;
    KILN_RETURN_IF_ERROR(w.AddTensor(name, type, ne, std::move(bytes)));
  }
  return w.WriteToFile(to);
}

TEST_F(SpecEagleTest, RefusesHeadsForAnotherModelAndMalformedFiles) {
  const std::string dir = kiln::testing::TempDir();
  const std::string for_tiny = dir + "/eagle-for-tiny.gguf";
  ASSERT_TRUE(WriteDerivedEagleHead(*tiny_, EagleHeadInit::kRandom, 1, for_tiny).ok());
  auto refused = EagleStrategy::Load(for_tiny, *model_, {});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(refused.status().message());
  EXPECT_NE(message.find("this eagle head was trained for another model"), std::string::npos)
      << message;
  EXPECT_NE(message.find("vocabulary hash"), std::string::npos) << message;
  EXPECT_NE(message.find("hidden size 256 != the model's 576"), std::string::npos) << message;
  EXPECT_NE(message.find("layer count 2 != the model's 30"), std::string::npos) << message;
  auto full_vocabulary = EagleStrategy::Load(for_tiny, *tiny_, {});
  ASSERT_TRUE(full_vocabulary.ok()) << full_vocabulary.status();
  EXPECT_EQ((*full_vocabulary)->head().draft_vocab, nullptr);  // a head without one still loads

  auto not_head = EagleStrategy::Load(*tiny_path_, *tiny_, {});
  ASSERT_FALSE(not_head.ok());
  EXPECT_NE(not_head.status().message().find("not an eagle head"), absl::string_view::npos)
      << not_head.status();

  struct Case {
    const char* what;
    std::function<bool(std::string&, uint32_t&, std::vector<uint64_t>&, std::vector<uint8_t>&)>
        edit;
    std::function<void(gguf::GgufWriter&)> keys;
    const char* expected;
  };
  auto keep = [](std::string&, uint32_t&, std::vector<uint64_t>&, std::vector<uint8_t>&) {
    return true;
  };
  const Case cases[] = {
      {"missing tensor",
       [](std::string& n, uint32_t&, std::vector<uint64_t>&, std::vector<uint8_t>&) {
         return n != "eagle.attn_k.weight";
       },
       {},
       "tensor eagle.attn_k.weight missing"},
      {"wrong shape",
       [](std::string& n, uint32_t&, std::vector<uint64_t>& ne, std::vector<uint8_t>& b) {
         if (n == "eagle.fc.weight") {  // [2d, d] -> [d, d]: half the rows' bytes
           ne[0] /= 2;
           b.resize(b.size() / 2);
         }
         return true;
       },
       {},
       "tensor eagle.fc.weight has shape [256, 256], expected [512, 256]"},
      {"f16 vector",
       [](std::string& n, uint32_t& type, std::vector<uint64_t>&, std::vector<uint8_t>& b) {
         if (n == "eagle.ffn_norm.weight") {
           type = static_cast<uint32_t>(GgmlType::kF16);
           b.resize(b.size() / 2);
         }
         return true;
       },
       {},
       "tensor eagle.ffn_norm.weight has type 1 (vectors are f32)"},
      {"not finite",
       [](std::string& n, uint32_t&, std::vector<uint64_t>&, std::vector<uint8_t>& b) {
         if (n == "eagle.fc.bias") {
           const float nan = std::nanf("");
           std::memcpy(b.data() + 8, &nan, 4);
         }
         return true;
       },
       {},
       "tensor eagle.fc.bias is not finite at 2"},
      {"wrong layer key", keep,
       [](gguf::GgufWriter& w) { w.SetUint32("eagle.feed_forward_length", 7); },
       "eagle.feed_forward_length is 7, the target's is"},
      {"missing fingerprint key", keep,
       [](gguf::GgufWriter& w) { w.SetString("eagle.target.block_count", "two"); },
       "key eagle.target.block_count"},
  };
  for (const Case& c : cases) {
    const std::string bad = dir + "/eagle-bad.gguf";
    ASSERT_TRUE(Rewrite(for_tiny, bad, c.edit, c.keys).ok()) << c.what;
    auto loaded = EagleStrategy::Load(bad, *tiny_, {});
    ASSERT_FALSE(loaded.ok()) << c.what;
    EXPECT_NE(loaded.status().message().find(c.expected), absl::string_view::npos)
        << c.what << ": " << loaded.status();
  }
  EagleParams bad_params;
  bad_params.top_k = 65;
  auto bad = EagleStrategy::Load(for_tiny, *tiny_, bad_params);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("top_k 65"), absl::string_view::npos) << bad.status();
}

// Two thirds of the tiny model's vocabulary: the ids v with v % 3 != 1.
std::vector<int32_t> TwoThirdsOf(const Model& model) {
  std::vector<int32_t> ids;
  for (int32_t v = 0; v < model.hparams().n_vocab; ++v) {
    if (v % 3 != 1) ids.push_back(v);
  }
  return ids;
}

TEST_F(SpecEagleTest, RefusesMalformedDraftVocabularies) {
  const std::string dir = kiln::testing::TempDir();
  const std::string good = dir + "/eagle-vocab-good.gguf";
  const std::vector<int32_t> four = {3, 7, 9, 20};
  ASSERT_TRUE(WriteDerivedEagleHead(*tiny_, EagleHeadInit::kRandom, 1, good, four).ok());
  auto loaded = EagleStrategy::Load(good, *tiny_, {});
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_NE((*loaded)->head().draft_vocab, nullptr);
  EXPECT_EQ((*loaded)->head().draft_vocab->ids, four);
  const int64_t n_vocab = tiny_->hparams().n_vocab;
  auto keep = [](std::string&, uint32_t&, std::vector<uint64_t>&, std::vector<uint8_t>&) {
    return true;
  };
  auto drop = [](const char* tensor) {
    return [tensor](std::string& n, uint32_t&, std::vector<uint64_t>&, std::vector<uint8_t>&) {
      return n != tensor;
    };
  };
  auto ids = [](std::vector<int32_t> v) {
    return [v](gguf::GgufWriter& w) { w.SetArrayInt32("eagle.vocab.ids", v); };
  };
  struct Case {
    const char* what;
    std::function<bool(std::string&, uint32_t&, std::vector<uint64_t>&, std::vector<uint8_t>&)>
        edit;
    std::function<void(gguf::GgufWriter&)> keys;
    absl::StatusCode code;
    std::string expected;
  };
  const Case cases[] = {
      {"id past the vocabulary", keep, ids({3, 7, 9, static_cast<int32_t>(n_vocab)}),
       absl::StatusCode::kInvalidArgument,
       kiln::StrCat("eagle.vocab.ids[3] = ", n_vocab, " is outside the target's vocabulary [0, ",
                    n_vocab, ")")},
      {"negative id", keep, ids({-1, 7, 9, 20}), absl::StatusCode::kInvalidArgument,
       "eagle.vocab.ids[0] = -1 is outside"},
      {"repeated id", keep, ids({3, 7, 7, 20}), absl::StatusCode::kDataLoss,
       "eagle.vocab.ids is not strictly ascending at 2 (7, then 7: a repeated id)"},
      {"unordered ids", keep, ids({3, 9, 7, 20}), absl::StatusCode::kDataLoss,
       "eagle.vocab.ids is not strictly ascending at 2 (9, then 7)"},
      {"more ids than rows", keep, ids({3, 7, 9, 20, 21}), absl::StatusCode::kDataLoss,
       "tensor eagle.lm_head.weight has shape"},
      {"empty ids", keep, ids({}), absl::StatusCode::kDataLoss, "eagle.vocab.ids"},
      {"ids without rows",
       drop("eagle.lm_head.weight"),
       {},
       absl::StatusCode::kDataLoss,
       "the file has only eagle.vocab.ids"},
  };
  for (const Case& c : cases) {
    const std::string bad = dir + "/eagle-vocab-bad.gguf";
    ASSERT_TRUE(Rewrite(good, bad, c.edit, c.keys).ok()) << c.what;
    auto refused = EagleStrategy::Load(bad, *tiny_, {});
    ASSERT_FALSE(refused.ok()) << c.what;
    EXPECT_EQ(refused.status().code(), c.code) << c.what << ": " << refused.status();
    EXPECT_NE(refused.status().message().find(c.expected), absl::string_view::npos)
        << c.what << ": " << refused.status();
  }
  // Rows without ids (the key dropped by rewriting from a head that has none).
  const std::string plain = dir + "/eagle-vocab-plain.gguf";
  ASSERT_TRUE(WriteDerivedEagleHead(*tiny_, EagleHeadInit::kRandom, 1, plain).ok());
  const std::string bad = dir + "/eagle-vocab-bad.gguf";
  auto good_file = gguf::GgufFile::Open(good);
  ASSERT_TRUE(good_file.ok());
  const gguf::TensorInfo* rows = (*good_file)->FindTensor("eagle.lm_head.weight");
  ASSERT_NE(rows, nullptr);
  ASSERT_TRUE(Rewrite(plain, bad, keep, [&](gguf::GgufWriter& w) {
                ASSERT_TRUE(w.AddTensor(rows->name, rows->type, rows->ne,
                                        std::vector<uint8_t>(rows->data, rows->data + rows->nbytes))
                                .ok());
              }).ok());
  auto half = EagleStrategy::Load(bad, *tiny_, {});
  ASSERT_FALSE(half.ok());
  EXPECT_NE(half.status().message().find("the file has only eagle.lm_head.weight"),
            absl::string_view::npos)
      << half.status();
}

// A reduced draft vocabulary changes only what is proposed: every drafted token is in it, greedy
// output is plain decoding's bit for bit, and the sampled first token keeps the target's
// distribution.
TEST_F(SpecEagleTest, ReducedVocabularyHeadDraftsOnlyItsTokensAndStaysExact) {
  const std::vector<int32_t> ids = TwoThirdsOf(*tiny_);
  EagleParams params;
  params.tree_tokens = 10;
  params.merge_ngram = false;  // the head's own drafts (an n-gram chain may copy any token)
  auto strategy =
      MakeStrategy(*tiny_, EagleHeadInit::kLastLayer, "eagle-tiny-vocab.gguf", params, ids);
  ASSERT_NE(strategy, nullptr);
  ASSERT_NE(strategy->head().draft_vocab, nullptr);
  Recording recording(strategy.get());
  SpecMetrics total;
  for (int p = 0; p < 20; ++p) {
    const std::vector<int32_t> prompt = {1, 72 + p, 101, 108 + p % 3, 108, 111, 44, 32, 119 - p};
    auto plain = GenerateSpeculative(*tiny_engine_, prompt, kiln::testing::GreedyParams(), 0,
                                     nullptr, kHeadTestMaxTokens);
    auto spec = GenerateSpeculative(*tiny_engine_, prompt, kiln::testing::GreedyParams(), 0,
                                    &recording, kHeadTestMaxTokens);
    ASSERT_TRUE(plain.ok() && spec.ok()) << plain.status() << spec.status();
    EXPECT_EQ(spec->tokens, plain->tokens) << p;
    total.drafted += spec->metrics.drafted;
    total.accepted += spec->metrics.accepted;
  }
  ASSERT_FALSE(recording.drafted_.empty());
  for (int32_t t : recording.drafted_) ASSERT_NE(t % 3, 1) << "drafted token " << t;
  EXPECT_GT(total.accepted, 0);
  // The root's draft logits are the head's over its own rows.
  EXPECT_EQ(strategy->last_root_logits().size(), ids.size());
  std::printf("eagle on tiny, two-thirds vocabulary: %lld drafted, %lld accepted\n",
              static_cast<long long>(total.drafted), static_cast<long long>(total.accepted));

  EagleParams sampled;
  sampled.tree_tokens = 7;  // the root's 4 best children and 3 grandchildren
  sampled.top_k = 4;
  sampled.max_depth = 2;
  auto identity =
      MakeStrategy(*tiny_, EagleHeadInit::kIdentity, "eagle-identity-vocab.gguf", sampled, ids);
  ASSERT_NE(identity, nullptr);
  kiln::testing::ExpectFirstTokenHasTargetDistribution(*tiny_engine_, *tiny_, identity.get(), 7,
                                                       kDistributionSamples);
}

TEST_F(SpecEagleTest, GreedyOutputIsPlainDecodingOn20Prompts) {
  EagleParams params;
  params.tree_tokens = 8;  // a fixed tree: exactness must not depend on the measured cost
  params.top_k = 4;        // a small tree keeps the head's LM-head products (its cost) few
  params.max_depth = 3;
  auto strategy = MakeStrategy(*model_, EagleHeadInit::kLastLayer, "eagle-default.gguf", params);
  ASSERT_NE(strategy, nullptr);
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
  std::printf("eagle (last-layer head): %lld steps, %lld drafted, %lld accepted, %.2f per step\n",
              static_cast<long long>(total.steps), static_cast<long long>(total.drafted),
              static_cast<long long>(total.accepted), total.MeanAcceptedPerStep());
}

// The committed heads for the default model (EAGLE-1, tools/train/train_eagle.py, and EAGLE-3,
// train_eagle3.py; models/README.md): greedy output is plain decoding's on the held-out chat
// prompts (none in their training data), and their drafts are accepted: with a fixed tree (8
// nodes, top_k 4, depth 3; no timing involved) at least 0.3 tokens per step (measured on the 20
// prompts, 16 tokens each: 0.48 for either head; a head that has learned nothing accepts about
// none; in quick mode, some).
TEST_F(SpecEagleTest, TrainedHeadsKeepGreedyOutputAndAreAccepted) {
  for (const char* file : {kTrainedEagle3, kTrainedEagle1}) {
    SCOPED_TRACE(file);
    auto strategy = LoadTrainedHead(*model_, std::nullopt, file);
    ASSERT_TRUE(strategy.ok()) << strategy.status();
    SpecMetrics total;
    for (const char* p : kiln::testing::HeldOutChatPrompts()) {
      const std::vector<int32_t> prompt = Encode(ChatPrompt(p));
      const std::vector<int32_t> plain = PlainGreedy(prompt, kHeadTestMaxTokens);
      auto spec = GenerateSpeculative(*engine_, prompt, kiln::testing::GreedyParams(), 0,
                                      strategy->get(), kHeadTestMaxTokens);
      ASSERT_TRUE(spec.ok()) << spec.status();
      EXPECT_EQ(spec->tokens, plain) << p;
      total.steps += spec->metrics.steps;
      total.drafted += spec->metrics.drafted;
      total.accepted += spec->metrics.accepted;
    }
    if (kiln::testing::QuickMode()) {
      EXPECT_GT(total.accepted, 0);  // 2 prompts: too few steps for the rate's bound
    } else {
      EXPECT_GE(total.MeanAcceptedPerStep(), 0.3);
    }
    std::printf("%s: %lld steps, %lld drafted, %lld accepted, %.2f per step\n", file,
                static_cast<long long>(total.steps), static_cast<long long>(total.drafted),
                static_cast<long long>(total.accepted), total.MeanAcceptedPerStep());
  }
}

// (SpecHeadTest::ExpectTypicalAcceptanceAcceptsMoreAndIsReportedLossy says what is checked).
TEST_F(SpecEagleTest, TrainedHeadsTypicalAcceptanceAcceptsMoreAndIsReportedLossy) {
  for (const char* file : {kTrainedEagle1, kTrainedEagle3}) {
    SCOPED_TRACE(file);
    auto exact = LoadTrainedHead(*model_, std::nullopt, file);
    auto typical = LoadTrainedHead(*model_, sample::TypicalAcceptance{}, file);
    ASSERT_TRUE(exact.ok() && typical.ok()) << exact.status() << typical.status();
    ExpectTypicalAcceptanceAcceptsMoreAndIsReportedLossy(exact->get(), typical->get(), file);
  }
  auto bad = LoadTrainedHead(*model_, sample::TypicalAcceptance{0.0f, 0.3f});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("epsilon"), absl::string_view::npos) << bad.status();
}

// (SpecHeadTest::ExpectTreeVerificationKeepsTheTargetDistribution says what is checked).
TEST_F(SpecEagleTest, TrainedHeadsTreesKeepTheSampledDistribution) {
  for (const char* file : {kTrainedEagle1, kTrainedEagle3}) {
    SCOPED_TRACE(file);
    auto strategy = LoadTrainedHead(*model_, std::nullopt, file);
    ASSERT_TRUE(strategy.ok()) << strategy.status();
    ExpectTreeVerificationKeepsTheTargetDistribution(strategy->get(), file);
  }
}

TEST_F(SpecEagleTest, GreedyOutputIsPlainDecodingOnTheTinyModel) {
  EagleParams params;
  params.tree_tokens = 10;
  auto strategy = MakeStrategy(*tiny_, EagleHeadInit::kLastLayer, "eagle-tiny.gguf", params);
  ASSERT_NE(strategy, nullptr);
  SpecMetrics total;
  for (int p = 0; p < 20; ++p) {
    const std::vector<int32_t> prompt = {1, 72 + p, 101, 108 + p % 3, 108, 111, 44, 32, 119 - p};
    auto plain = GenerateSpeculative(*tiny_engine_, prompt, kiln::testing::GreedyParams(), 0,
                                     nullptr, kHeadTestMaxTokens);
    auto spec = GenerateSpeculative(*tiny_engine_, prompt, kiln::testing::GreedyParams(), 0,
                                    strategy.get(), kHeadTestMaxTokens);
    ASSERT_TRUE(plain.ok() && spec.ok()) << plain.status() << spec.status();
    EXPECT_EQ(spec->tokens, plain->tokens) << p;
    total.steps += spec->metrics.steps;
    total.drafted += spec->metrics.drafted;
    total.accepted += spec->metrics.accepted;
  }
  EXPECT_GT(total.drafted, 0);
  std::printf("eagle on tiny (last-layer head): %lld steps, %lld drafted, %lld accepted\n",
              static_cast<long long>(total.steps), static_cast<long long>(total.drafted),
              static_cast<long long>(total.accepted));
}

// After every step the head's cache holds the accepted text only: its committed entries cover
// positions [base, len - 1) and their K/V give the same draft logits as a head that read the
// same features in one pass (drafted entries of rejected branches left nothing behind).
TEST_F(SpecEagleTest, HeadCacheRollsBackToTheAcceptedPath) {
  const int64_t d = tiny_->hparams().n_embd;
  EagleParams params;
  params.tree_tokens = 10;
  params.top_k = 8;  // a fixed shape: the fresh head has no history to choose one from
  params.max_depth = 5;
  params.merge_ngram = false;  // the head's drafts only, so that steps accept its entries
  auto eagle = MakeStrategy(*tiny_, EagleHeadInit::kLastLayer, "eagle-rollback.gguf", params);
  auto fresh = MakeStrategy(*tiny_, EagleHeadInit::kLastLayer, "eagle-rollback.gguf", params);
  ASSERT_TRUE(eagle != nullptr && fresh != nullptr);
  int64_t steps_with_accepts = 0, rejected = 0;
  for (int p = 0; p < 6; ++p) {
    const std::vector<int32_t> prompt = {1, 80 + p, 101, 108, 108, 111, 44, 32, 119};
    const int32_t n = static_cast<int32_t>(prompt.size());
    Recording recording(eagle.get());
    sample::Sampler sampler(kiln::testing::GreedyParams());
    sample::Rng rng(1);
    const SeqId seq =
        tiny_engine_->Locked([](KvCache& c, ForwardPass&) { return c.CreateSequence(); });
    std::vector<float> feature;
    PrefillRequest prefill;
    prefill.seq = seq;
    prefill.tokens = std::span<const int32_t>(prompt).first(n - 1);
    prefill.on_logits = [](int32_t, const float*) {};
    prefill.on_hidden = [&](int32_t, const float* row) { feature.assign(row, row + d); };
    ASSERT_TRUE(tiny_engine_->Prefill(prefill).ok());
    recording.Reset();
    recording.ObserveTargetFeatures(n - 2, n, feature, d);
    SpeculativeDecoder decoder(*tiny_engine_, seq, sampler, rng, &recording);
    std::vector<int32_t> tokens = prompt;
    for (int step_index = 0; step_index < 6; ++step_index) {
      SpecStepResult step;
      ASSERT_TRUE(decoder.Step(&tokens, 8, &step).ok());
      // The proposal's drafted entries are gone; the step's features wait for the next one.
      EXPECT_EQ(eagle->head_cache_length(), eagle->committed_entries());
      rejected += step.drafted > step.accepted;
      if (step.accepted == 0) continue;
      ++steps_with_accepts;
      // Commit the accepted path into the head (as the next step would) and compare with a
      // head that reads the whole text at once.
      DraftTree tree, fresh_tree;
      ASSERT_TRUE(eagle->Propose(tokens, 10, {}, &tree).ok());
      const int32_t len = static_cast<int32_t>(tokens.size());
      ASSERT_EQ(eagle->base_position(), n - 2);
      ASSERT_EQ(eagle->committed_entries(), len - 1 - (n - 2));
      ASSERT_EQ(eagle->head_cache_length(), eagle->committed_entries());
      ASSERT_EQ(recording.features_.size(), static_cast<size_t>((len - 1 - (n - 2)) * d));
      fresh->Reset();
      fresh->ObserveTargetFeatures(n - 2, len, recording.features_, d);
      ASSERT_TRUE(fresh->Propose(tokens, 10, {}, &fresh_tree).ok());
      ASSERT_EQ(fresh->committed_entries(), eagle->committed_entries());
      const std::vector<float>& a = eagle->last_root_logits();
      const std::vector<float>& b = fresh->last_root_logits();
      ASSERT_EQ(a.size(), b.size());
      double max_diff = 0.0;
      for (size_t i = 0; i < a.size(); ++i)
        max_diff = std::max<double>(max_diff, std::abs(a[i] - b[i]));
      EXPECT_LT(max_diff, 1e-4) << "prompt " << p << " step " << step_index;
      EXPECT_EQ(tree.tokens, fresh_tree.tokens);
      EXPECT_EQ(tree.parents, fresh_tree.parents);
    }
    tiny_engine_->Locked([&](KvCache& c, ForwardPass&) { return c.Free(seq); }).IgnoreError();
  }
  std::printf("rollback: %lld steps accepted drafts, %lld rejected some\n",
              static_cast<long long>(steps_with_accepts), static_cast<long long>(rejected));
  EXPECT_GT(steps_with_accepts, 0);
  EXPECT_GT(rejected, 0);
}

// The first emitted token is distributed as plain sampling's (ExpectFirstTokenHasTargetDistribution
// says how and with what bound). The identity head is given the root's own feature, so its
// candidates are the target's top-k at the root: drafts are accepted sometimes and rejected
// sometimes, and both branches of the rejection sampler run. Exactness must not depend on what the
// feature is.
TEST_F(SpecEagleTest, SampledFirstTokenHasTheTargetDistribution) {
  const Model& model = *tiny_;
  Engine& engine = *tiny_engine_;
  EagleParams eagle_params;
  eagle_params.tree_tokens = 7;  // the root's 4 best children and 3 grandchildren
  eagle_params.top_k = 4;
  eagle_params.max_depth = 2;
  auto strategy =
      MakeStrategy(model, EagleHeadInit::kIdentity, "eagle-identity.gguf", eagle_params);
  ASSERT_NE(strategy, nullptr);
  kiln::testing::ExpectFirstTokenHasTargetDistribution(engine, model, strategy.get(), 7,
                                                       kDistributionSamples);
}

// With tree_tokens 0 the tree's size follows the pass cost: free passes take every node worth
// 2% more expected tokens, a pass that costs 100 one-token passes per extra token takes none. A
// second proposal for the same context reuses the root's output and gives the same tree.
TEST_F(SpecEagleTest, TreeSizeFollowsThePassCost) {
  const Model& model = *tiny_;
  EagleParams params;
  params.top_k = 4;
  params.max_depth = 3;
  params.merge_ngram = false;  // the head's tree alone
  auto strategy = MakeStrategy(model, EagleHeadInit::kIdentity, "eagle-budget.gguf", params);
  ASSERT_NE(strategy, nullptr);
  const std::vector<int32_t> prompt = {1, 72, 101, 108, 108, 111, 44, 32, 119};
  ObservePromptFeature(*tiny_engine_, prompt, *strategy);

  PassCostModel free_passes, dear_passes;
  free_passes.Pin(0.0);
  dear_passes.Pin(100.0);
  DraftTree cheap, again, dear;
  ASSERT_TRUE(strategy->Propose(prompt, 30, {nullptr, nullptr, &free_passes}, &cheap).ok());
  EXPECT_EQ(strategy->last_candidates(), 4 + 16 + 16);
  ASSERT_TRUE(strategy->Propose(prompt, 30, {nullptr, nullptr, &free_passes}, &again).ok());
  ASSERT_TRUE(strategy->Propose(prompt, 30, {nullptr, nullptr, &dear_passes}, &dear).ok());
  EXPECT_GT(cheap.size(), 1);
  EXPECT_EQ(again.tokens, cheap.tokens);
  EXPECT_EQ(again.parents, cheap.parents);
  EXPECT_EQ(dear.size(), 0);
  // Nodes come parents first, and siblings are distinct tokens.
  for (int32_t i = 0; i < cheap.size(); ++i) {
    EXPECT_LT(cheap.parents[i], i);
    for (int32_t j = 0; j < i; ++j) {
      EXPECT_FALSE(cheap.parents[j] == cheap.parents[i] && cheap.tokens[j] == cheap.tokens[i]);
    }
  }
  std::printf("tree with free passes: %d nodes\n", cheap.size());
}

// The budget follows what verification accepts (EagleStrategy::Calibration): a head whose drafts
// are never accepted verifies fewer nodes at the same pass cost (here none), and steps without
// drafts bring it back, to more nodes than at first once every draft is accepted; no step
// reported: calibration 1.
TEST_F(SpecEagleTest, TreeSizeFollowsTheAcceptance) {
  const Model& model = *model_;
  EagleParams params;
  params.top_k = 4;
  params.max_depth = 3;
  params.merge_ngram = false;  // the head's tree alone
  auto strategy = MakeStrategy(model, EagleHeadInit::kIdentity, "eagle-calibrated.gguf", params);
  ASSERT_NE(strategy, nullptr);
  const std::vector<int32_t> prompt = Encode(ChatPrompt(kHeldOutChatPrompts[0]));
  ObservePromptFeature(*engine_, prompt, *strategy);

  PassCostModel cost;
  cost.Pin(0.05);
  const ProposeContext ctx{nullptr, nullptr, &cost};
  DraftTree tree;
  ASSERT_TRUE(strategy->Propose(prompt, 30, ctx, &tree).ok());
  EXPECT_EQ(strategy->Calibration(), 1.0);
  const int32_t uncalibrated = tree.size();
  ASSERT_GT(uncalibrated, 1);
  ASSERT_LT(uncalibrated, 30);             // room to grow
  for (int step = 0; step < 40; ++step) {  // nothing accepted
    ASSERT_TRUE(strategy->Propose(prompt, 30, ctx, &tree).ok());
    strategy->Accepted(tree.size(), {});
  }
  EXPECT_LT(strategy->Calibration(), 0.5);
  ASSERT_TRUE(strategy->Propose(prompt, 30, ctx, &tree).ok());
  const int32_t never_accepted = tree.size();
  EXPECT_LT(never_accepted, uncalibrated);
  for (int step = 0; step < 80; ++step) {  // every drafted node's token accepted
    ASSERT_TRUE(strategy->Propose(prompt, 30, ctx, &tree).ok());
    strategy->Accepted(tree.size(), tree.tokens);
  }
  EXPECT_GT(strategy->Calibration(), 1.0);
  ASSERT_TRUE(strategy->Propose(prompt, 30, ctx, &tree).ok());
  EXPECT_GT(tree.size(), uncalibrated);
  std::printf("nodes verified: %d uncalibrated, %d never accepted, %d always accepted\n",
              uncalibrated, never_accepted, tree.size());
}

// The automatic tree (top_k and max_depth 0) follows the costs: when verifying any draft costs 100
// one-token passes per extra token, the head makes the root's children only (no expansion can
// pay) and the next step's top_k drops to the minimum; when passes are free, the identity head on
// the default model (its root children are the target's own top tokens, most of the
// probability) expands, and the next top_k is the budget that step kept.
TEST_F(SpecEagleTest, TreeShapeFollowsTheCosts) {
  const Model& model = *model_;
  EagleParams params;
  params.merge_ngram = false;  // the head's tree alone
  auto strategy = MakeStrategy(model, EagleHeadInit::kIdentity, "eagle-auto.gguf", params);
  ASSERT_NE(strategy, nullptr);
  const std::vector<int32_t> prompt = Encode(ChatPrompt(kHeldOutChatPrompts[0]));
  ObservePromptFeature(*engine_, prompt, *strategy);

  PassCostModel free_passes, dear_passes;
  free_passes.Pin(0.0);
  dear_passes.Pin(100.0);
  DraftTree dear, cheap;
  EXPECT_EQ(strategy->next_top_k(), kEagleAutoMaxTopK);  // no step yet: the widest
  ASSERT_TRUE(strategy->Propose(prompt, 64, {nullptr, nullptr, &dear_passes}, &dear).ok());
  EXPECT_EQ(dear.size(), 0);
  EXPECT_EQ(strategy->last_depth(), 1);
  EXPECT_EQ(strategy->last_candidates(), kEagleAutoMaxTopK);
  EXPECT_EQ(strategy->next_top_k(), kEagleAutoMinTopK);
  // The same context again (the root's output reused), now with free passes.
  ASSERT_TRUE(strategy->Propose(prompt, 64, {nullptr, nullptr, &free_passes}, &cheap).ok());
  EXPECT_GE(strategy->last_depth(), 2);
  EXPECT_LE(strategy->last_depth(), kEagleAutoMaxDepth);
  EXPECT_GT(cheap.size(), 1);
  EXPECT_EQ(strategy->next_top_k(), std::clamp(cheap.size(), kEagleAutoMinTopK, kEagleAutoMaxTopK));
  std::printf("automatic tree with free passes: depth %d, %d nodes, next top_k %d\n",
              strategy->last_depth(), cheap.size(), strategy->next_top_k());
}

// The n-gram chain merged into the trees of a random-weight head gets a copy accepted
// (SpecHeadTest::ExpectMergedNgramChainGetsCopiesAccepted says what is checked).
TEST_F(SpecEagleTest, MergedNgramChainGetsCopiesAccepted) {
  EagleParams merged;
  merged.tree_tokens = 2;
  merged.top_k = 2;
  merged.max_depth = 1;
  EagleParams alone = merged;
  alone.merge_ngram = false;
  auto with_chain = MakeStrategy(*model_, EagleHeadInit::kRandom, "eagle-random.gguf", merged);
  auto head_only = MakeStrategy(*model_, EagleHeadInit::kRandom, "eagle-random.gguf", alone);
  ASSERT_TRUE(with_chain != nullptr && head_only != nullptr);
  ExpectMergedNgramChainGetsCopiesAccepted(with_chain.get(), head_only.get(), "eagle, random head");
}

// Every token id of `model`.
std::vector<int32_t> AllIdsOf(const Model& model) {
  std::vector<int32_t> ids(model.hparams().n_vocab);
  for (int32_t v = 0; v < model.hparams().n_vocab; ++v) ids[v] = v;
  return ids;
}

// The layer outputs a pass returns (ForwardBatch::hidden_layers) are its residual stream: the
// last layer's, through the output norm, is bit for bit the final hidden state the LM head reads;
// a middle layer's rows are the same whichever rows want logits (the rows are picked by batch
// index before the last layer compacts them). Layers outside the model or out of order are
// refused naming the entry.
TEST_F(SpecEagleTest, LayerOutputsAreTheResidualStream) {
  const std::vector<int32_t> prompt = Encode(ChatPrompt("Name three rivers."));
  const int32_t n = static_cast<int32_t>(prompt.size());
  const int64_t d = model_->hparams().n_embd;
  const int32_t last = static_cast<int32_t>(model_->hparams().n_layer) - 1;
  // One pass over the prompt in a fresh sequence; rows from `logits_from` want logits; `layers`
  // through WantHiddenLayers, or with `as_given` as they are.
  auto run = [&](int32_t logits_from, std::vector<int32_t> layers, ForwardOutput* out,
                 bool as_given = false) {
    return engine_->Locked([&](KvCache& cache, ForwardPass& pass) -> absl::Status {
      const SeqId seq = cache.CreateSequence();
      ForwardBatch batch;
      for (int32_t i = 0; i < n; ++i) batch.Add(prompt[i], seq, i, i >= logits_from);
      batch.want_hidden = true;
      if (as_given) {
        batch.hidden_layers = layers;
      } else {
        batch.WantHiddenLayers(layers);
      }
      absl::Status st = cache.AppendSlots(seq, prompt);
      if (st.ok()) st = pass.Forward(batch, cache, out);
      cache.Free(seq).IgnoreError();
      return st;
    });
  };
  ForwardOutput five, all;
  ASSERT_TRUE(run(n - 5, {last, 5, 0}, &five).ok());  // given unordered: the batch sorts
  ASSERT_EQ(five.hidden_layers, (std::vector<int32_t>{0, 5, last}));
  ASSERT_EQ(five.layer_hidden.size(), static_cast<size_t>(5 * 3 * d));
  EXPECT_EQ(five.LayerHiddenRow(0, 7), nullptr);  // not captured
  cpu::CpuBackend backend(1);
  std::vector<float> normed(d);
  for (int32_t r = 0; r < 5; ++r) {
    backend.RmsNorm(five.LayerHiddenRow(r, last), model_->output_norm().AsF32(), 1, d,
                    model_->hparams().rms_eps, normed.data());
    EXPECT_EQ(std::memcmp(normed.data(), five.HiddenRow(r), d * sizeof(float)), 0) << "row " << r;
  }
  ASSERT_TRUE(run(0, {5}, &all).ok());
  for (int32_t r = 0; r < 5; ++r) {
    EXPECT_EQ(
        std::memcmp(five.LayerHiddenRow(r, 5), all.LayerHiddenRow(n - 5 + r, 5), d * sizeof(float)),
        0)
        << "row " << r;
  }
  const std::pair<std::vector<int32_t>, const char*> refused[] = {
      {{last + 1}, "hidden_layers[0] = 30 is not a layer in [0, 30)"},
      {{-1}, "hidden_layers[0] = -1"},
      {{5, 3}, "hidden_layers[1] = 3 is not a layer in [0, 30) above the one before it"},
      {{5, 5}, "hidden_layers[1] = 5"}};
  for (const auto& [layers, expected] : refused) {
    ForwardOutput out;
    absl::Status st = run(n - 1, layers, &out, /*as_given=*/true);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find(expected), absl::string_view::npos) << st;
  }
}

TEST_F(SpecEagleTest, Eagle3RefusesMalformedFiles) {
  const std::string dir = kiln::testing::TempDir();
  const std::string good = dir + "/eagle3-tiny.gguf";
  const std::vector<int32_t> ids = TwoThirdsOf(*tiny_), layers = {0, 1};
  EXPECT_EQ(WriteDerivedEagleHead(*tiny_, EagleHeadInit::kRandom, 1, good, {}, layers).code(),
            absl::StatusCode::kInvalidArgument);  // no vocabulary: no LM head of its own
  ASSERT_TRUE(WriteDerivedEagleHead(*tiny_, EagleHeadInit::kRandom, 1, good, ids, layers).ok());
  auto loaded = EagleStrategy::Load(good, *tiny_, {});
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE((*loaded)->head().eagle3());
  EXPECT_EQ((*loaded)->head().feature_width(), 2 * tiny_->hparams().n_embd);
  const std::span<const int32_t> wanted = (*loaded)->target_feature_layers();
  EXPECT_EQ(std::vector<int32_t>(wanted.begin(), wanted.end()), layers);

  auto keep = [](std::string&, uint32_t&, std::vector<uint64_t>&, std::vector<uint8_t>&) {
    return true;
  };
  auto drop = [](const char* tensor) {
    return [tensor](std::string& n, uint32_t&, std::vector<uint64_t>&, std::vector<uint8_t>&) {
      return n != tensor;
    };
  };
  struct Case {
    const char* what;
    std::function<bool(std::string&, uint32_t&, std::vector<uint64_t>&, std::vector<uint8_t>&)>
        edit;
    std::function<void(gguf::GgufWriter&)> keys;
    const char* expected;
  };
  const Case cases[] = {
      {"layer beyond the target", keep,
       [](gguf::GgufWriter& w) {
         w.SetArrayInt32("eagle3.target.layers", std::vector<int32_t>{0, 2});
       },
       "eagle3.target.layers[1] = 2 is not a layer of the target in [0, 2)"},
      {"layers not ascending", keep,
       [](gguf::GgufWriter& w) {
         w.SetArrayInt32("eagle3.target.layers", std::vector<int32_t>{1, 0});
       },
       "eagle3.target.layers[1] = 0"},
      {"layers absent", keep,
       [](gguf::GgufWriter& w) { w.SetString("eagle3.target.layers", "low"); },
       "eagle3.target.layers must list 1 to 8 target layers"},
      {"fuse for three layers", keep,
       [](gguf::GgufWriter& w) {
         w.SetArrayInt32("eagle3.target.layers", std::vector<int32_t>{0});
       },
       "tensor eagle3.fuse.weight has shape [512, 256], expected [256, 256]"},
      {"no fuse", drop("eagle3.fuse.weight"), {}, "tensor eagle3.fuse.weight missing"},
      {"no output norm",
       drop("eagle3.output_norm.weight"),
       {},
       "tensor eagle3.output_norm.weight missing"},
      {"no LM head", drop("eagle3.lm_head.weight"), {}, "the file has only eagle3.vocab.ids"},
  };
  for (const Case& c : cases) {
    const std::string bad = dir + "/eagle3-bad.gguf";
    ASSERT_TRUE(Rewrite(good, bad, c.edit, c.keys).ok()) << c.what;
    auto refused = EagleStrategy::Load(bad, *tiny_, {});
    ASSERT_FALSE(refused.ok()) << c.what;
    EXPECT_NE(refused.status().message().find(c.expected), absl::string_view::npos)
        << c.what << ": " << refused.status();
  }
}

// The decoder's layer outputs reach the head as it fuses them: an identity EAGLE-3 head over
// the target's last layer (fuse passes it through, the layer adds nothing, the output norm and
// LM head are the target's) drafts from the root's feature exactly what the target's own LM head
// made of it: the root's draft logits equal the target's logits at that position (two RMS norms
// instead of one: within 1e-3 of the logits' scale). A head over an earlier layer does not.
TEST_F(SpecEagleTest, Eagle3IdentityHeadOverTheLastLayerDraftsTheTargetsLogits) {
  const Model& model = *model_;
  const int32_t last = static_cast<int32_t>(model.hparams().n_layer) - 1;
  const std::vector<int32_t> prompt = Encode(ChatPrompt("What is the capital of France?"));
  const int32_t n = static_cast<int32_t>(prompt.size());
  for (const std::vector<int32_t>& layers :
       {std::vector<int32_t>{3, last}, std::vector<int32_t>{3, last - 8}}) {
    const std::string path = kiln::testing::TempDir() + "/eagle3-identity.gguf";
    ASSERT_TRUE(
        WriteDerivedEagleHead(model, EagleHeadInit::kIdentity, 1, path, AllIdsOf(model), layers)
            .ok());
    auto strategy = EagleStrategy::Load(path, model, {});
    ASSERT_TRUE(strategy.ok()) << strategy.status();
    // The target's logits and layer outputs at position n - 2 (the feature that predicted the
    // prompt's last token, the root).
    const SeqId seq = engine_->Locked([](KvCache& c, ForwardPass&) { return c.CreateSequence(); });
    std::vector<float> logits, feature;
    PrefillRequest request;
    request.seq = seq;
    request.tokens = prompt;
    request.logits_from = n - 2;
    request.last_logits = false;
    request.hidden_layers = layers;
    request.on_logits = [&](int32_t i, const float* row) {
      if (i == n - 2) logits.assign(row, row + model.hparams().n_vocab);
    };
    request.on_hidden = [&](int32_t i, const float* row) {
      if (i == n - 2) feature.assign(row, row + (*strategy)->head().feature_width());
    };
    ASSERT_TRUE(engine_->Prefill(request).ok());
    engine_->Locked([&](KvCache& c, ForwardPass&) { return c.Free(seq); }).IgnoreError();
    ASSERT_FALSE(feature.empty());
    (*strategy)->ObserveTargetFeatures(n - 2, n, feature, (*strategy)->head().feature_width());
    DraftTree tree;
    PassCostModel free_passes;
    free_passes.Pin(0.0);
    ASSERT_TRUE((*strategy)->Propose(prompt, 8, {nullptr, nullptr, &free_passes}, &tree).ok());
    const std::vector<float>& drafted = (*strategy)->last_root_logits();
    ASSERT_EQ(drafted.size(), logits.size());
    float scale = 0.0f, diff = 0.0f;
    for (size_t v = 0; v < logits.size(); ++v) {
      scale = std::max(scale, std::fabs(logits[v]));
      diff = std::max(diff, std::fabs(drafted[v] - logits[v]));
    }
    if (layers.back() == last) {
      EXPECT_LE(diff, 1e-3f * scale) << "scale " << scale;
      EXPECT_EQ(std::max_element(drafted.begin(), drafted.end()) - drafted.begin(),
                std::max_element(logits.begin(), logits.end()) - logits.begin());
    } else {
      EXPECT_GT(diff, 0.05f * scale) << "layer " << layers.back() << " read as the last";
    }
  }
}

// Sessions of one cache step in one batch: an EAGLE-1 session wants the final hidden state, an
// EAGLE-3 session its fused layers, and the pass returns both (ForwardBatch::hidden_layers is the
// union). Each of four sessions (the two committed heads, two prompts each, greedy) gives plain
// decoding's tokens, and the same speculative steps as the same session alone (the trees are
// fixed, so a session's steps do not depend on its neighbours), with drafts accepted.
TEST_F(SpecEagleTest, Eagle1AndEagle3SessionsInOneBatchDecodeAsAlone) {
  const char* const files[] = {kTrainedEagle1, kTrainedEagle3};
  struct Run {
    std::vector<int32_t> prompt, plain, alone_tokens;
    SpecMetrics alone;
    std::unique_ptr<EagleStrategy> strategy;
    std::unique_ptr<Session> session;
  };
  auto start = [&](Run& r, const char* file) {
    auto strategy = LoadTrainedHead(*model_, std::nullopt, file);
    ASSERT_TRUE(strategy.ok()) << strategy.status();
    r.strategy = std::move(*strategy);
    auto session = Session::Create(*engine_, kiln::testing::GreedyParams(), 0);
    ASSERT_TRUE(session.ok()) << session.status();
    r.session = std::move(*session);
    ASSERT_TRUE(r.session->SetStrategy(r.strategy.get()).ok());
  };
  std::vector<Run> runs(4);
  for (int i = 0; i < 4; ++i) {
    Run& r = runs[i];
    r.prompt = Encode(ChatPrompt(kiln::testing::HeldOutChatPrompts()[i]));
    r.plain = PlainGreedy(r.prompt, kHeadTestMaxTokens);
    start(r, files[i % 2]);  // alone, blocking
    ASSERT_TRUE(r.session->AppendTokens(r.prompt).ok());
    GenerateOptions options;
    options.max_tokens = kHeadTestMaxTokens;
    ASSERT_TRUE(r.session->Generate(options).ok());
    r.alone_tokens.assign(r.session->tokens().begin() + r.prompt.size(), r.session->tokens().end());
    r.alone = r.session->spec_metrics();
    r.session.reset();
    start(r, files[i % 2]);
    SubmitOptions submit;
    submit.prompt = r.prompt;
    submit.generate.max_tokens = kHeadTestMaxTokens;
    ASSERT_TRUE(r.session->Submit(submit).ok());
  }
  for (int step = 0, done = 0; done < 4 && step < 1000; ++step) {
    engine_->scheduler().Step(0, 0.0);
    done = 0;
    for (Run& r : runs) {
      PollResult poll;
      ASSERT_TRUE(r.session->Poll(SIZE_MAX, SIZE_MAX, &poll).ok());
      done += poll.done ? 1 : 0;
    }
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    const Run& r = runs[i];
    SCOPED_TRACE(files[i % 2]);
    const std::vector<int32_t> tokens(r.session->tokens().begin() + r.prompt.size(),
                                      r.session->tokens().end());
    EXPECT_EQ(r.alone_tokens, r.plain);
    EXPECT_EQ(tokens, r.plain);
    const SpecMetrics batched = r.session->spec_metrics();
    EXPECT_EQ(batched.steps, r.alone.steps);
    EXPECT_EQ(batched.drafted, r.alone.drafted);
    EXPECT_EQ(batched.accepted, r.alone.accepted);
    EXPECT_GT(batched.accepted, 0);
  }
}

}  // namespace
}  // namespace kiln::spec
