#include "tests/common/spec_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "lib/engine/speculative_decoder.h"
#include "lib/gguf/gguf_writer.h"
#include "lib/model/random_model.h"
#include "lib/sample/rejection_sampler.h"
#include "lib/sample/sampler.h"
#include "lib/spec/spec_generate.h"
#include "lib/tokenizer/tokenizer.h"
#include "tests/common/test_util.h"

namespace kiln::testing {

Model* SpecModelTest::model_ = nullptr;
Engine* SpecModelTest::engine_ = nullptr;

std::string ChatPrompt(std::string_view user) {
  return "<|im_start|>user\n" + std::string(user) + "<|im_end|>\n<|im_start|>assistant\n";
}

sample::SamplerParams GreedyParams() {
  sample::SamplerParams p;
  p.temperature = 0.0f;
  return p;
}

namespace {

void LoadModelAndEngine(const std::string& path, int32_t n_ctx, Model** model_out,
                        Engine** engine_out) {
  ModelLoadOptions load;
  load.path = path;
  auto model = Model::Load(load);
  ASSERT_TRUE(model.ok()) << model.status();
  *model_out = model->release();
  EngineOptions options;
  options.n_threads = 2;
  options.n_ctx = n_ctx;
  auto engine = Engine::Create(**model_out, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  *engine_out = engine->release();
}

}  // namespace

std::string* SpecHeadTest::tiny_path_ = nullptr;
Model* SpecHeadTest::tiny_ = nullptr;
Engine* SpecHeadTest::tiny_engine_ = nullptr;

namespace {

// The sampled-distribution checks' chain: temperature 1, top-k and top-p as given, min-p off.
sample::SamplerParams SampledParams(int32_t top_k, float top_p) {
  sample::SamplerParams params;
  params.temperature = 1.0f;
  params.top_k = top_k;
  params.top_p = top_p;
  params.min_p = 0.0f;
  return params;
}

// Total variation between the first tokens counted in `counts` (of `samples`) and `target`.
double FirstTokenTotalVariation(const std::map<int32_t, int>& counts, int samples,
                                const sample::Distribution& target) {
  sample::Distribution empirical;
  empirical.vocab_size = target.vocab_size;
  for (const auto& [token, count] : counts) {
    empirical.candidates.push_back({token, static_cast<float>(count) / samples});
  }
  return sample::TotalVariation(empirical, target);
}

}  // namespace

void SpecHeadTest::ExpectMergedNgramChainGetsCopiesAccepted(spec::Strategy* merged,
                                                            spec::Strategy* heads_only,
                                                            const char* what) {
  const std::vector<int32_t> prompt = Encode(
      ChatPrompt("Repeat this sentence exactly: The quick brown fox jumps over the lazy dog near "
                 "the river bank."));
  const std::vector<int32_t> plain = PlainGreedy(prompt, kHeadTestMaxTokens);
  spec::SpecMetrics metrics[2];
  spec::Strategy* strategies[2] = {merged, heads_only};
  for (int i = 0; i < 2; ++i) {
    spec::PassCostModel cost;
    cost.Pin(0.05);
    auto run = spec::GenerateSpeculative(*engine_, prompt, GreedyParams(), 0, strategies[i],
                                         kHeadTestMaxTokens, &cost);
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_EQ(run->tokens, plain) << what << (i == 0 ? " merged" : " heads only");
    metrics[i] = run->metrics;
  }
  EXPECT_GE(metrics[0].accepted * 3, metrics[0].generated) << what << ": a third from drafts";
  EXPECT_GT(metrics[0].accepted, metrics[1].accepted) << what;
  std::printf(
      "copy prompt, %s: merged n-gram %lld of %lld tokens accepted in %lld steps, "
      "heads only %lld in %lld steps\n",
      what, static_cast<long long>(metrics[0].accepted),
      static_cast<long long>(metrics[0].generated), static_cast<long long>(metrics[0].steps),
      static_cast<long long>(metrics[1].accepted), static_cast<long long>(metrics[1].steps));
}

void SpecHeadTest::ExpectTypicalAcceptanceAcceptsMoreAndIsReportedLossy(spec::Strategy* exact,
                                                                        spec::Strategy* typical,
                                                                        const char* what) {
  sample::SamplerParams sampled = GreedyParams();
  sampled.temperature = 0.8f;
  spec::SpecMetrics totals[2];  // exact, typical
  spec::Strategy* strategies[2] = {exact, typical};
  uint64_t seed = 0;
  for (const char* p : HeldOutChatPrompts()) {
    const std::vector<int32_t> prompt = Encode(ChatPrompt(p));
    const std::vector<int32_t> plain = PlainGreedy(prompt, kHeadTestMaxTokens);
    auto greedy =
        spec::GenerateSpeculative(*engine_, prompt, GreedyParams(), 0, typical, kHeadTestMaxTokens);
    ASSERT_TRUE(greedy.ok()) << greedy.status();
    EXPECT_EQ(greedy->tokens, plain) << what << ": " << p;
    EXPECT_EQ(greedy->metrics.accepted_lossy, 0) << what << ": greedy verification is exact";
    ++seed;
    for (int i = 0; i < 2; ++i) {
      spec::PassCostModel cost;
      cost.Pin(0.2);
      auto run = spec::GenerateSpeculative(*engine_, prompt, sampled, seed, strategies[i],
                                           kHeadTestMaxTokens, &cost);
      ASSERT_TRUE(run.ok()) << run.status();
      totals[i].steps += run->metrics.steps;
      totals[i].accepted += run->metrics.accepted;
      totals[i].accepted_lossy += run->metrics.accepted_lossy;
    }
  }
  EXPECT_EQ(totals[0].accepted_lossy, 0) << what;
  EXPECT_EQ(totals[1].accepted_lossy, totals[1].accepted) << what;
  EXPECT_GT(totals[1].accepted, 0) << what;
  if (!QuickMode()) {
    EXPECT_GE(totals[1].MeanAcceptedPerStep(), totals[0].MeanAcceptedPerStep() + 0.1) << what;
  }
  std::printf(
      "%s at temperature 0.8: exact %.2f accepted per step (%lld steps), typical %.2f "
      "(%lld steps, %lld accepted, all lossy)\n",
      what, totals[0].MeanAcceptedPerStep(), static_cast<long long>(totals[0].steps),
      totals[1].MeanAcceptedPerStep(), static_cast<long long>(totals[1].steps),
      static_cast<long long>(totals[1].accepted));
}

void SpecHeadTest::ExpectTreeVerificationKeepsTheTargetDistribution(spec::Strategy* strategy,
                                                                    const char* what) {
  constexpr int kTreeVerifications = 200000;
  const int64_t d = model_->hparams().n_embd, n_vocab = model_->hparams().n_vocab;
  // A few tokens into the answer (the heads draft the answer, not its first token, best).
  std::vector<int32_t> prompt = Encode(ChatPrompt("Write a haiku about the sea."));
  const std::vector<int32_t> answer_start = PlainGreedy(prompt, 4);
  prompt.insert(prompt.end(), answer_start.begin(), answer_start.end());
  const int32_t n = static_cast<int32_t>(prompt.size());
  const sample::SamplerParams params = SampledParams(40, 0.9f);
  sample::Sampler sampler(params);

  const SeqId seq = engine_->Locked([](KvCache& c, ForwardPass&) { return c.CreateSequence(); });
  // [n - 1, width]: every prompt row the strategy may read (the final hidden state, or the
  // outputs of the layers the strategy fuses).
  std::vector<float> features;
  const std::span<const int32_t> layers = strategy->target_feature_layers();
  const int64_t width = d * std::max<int64_t>(1, static_cast<int64_t>(layers.size()));
  PrefillRequest prefill;
  prefill.seq = seq;
  prefill.tokens = std::span(prompt).first(n - 1);
  prefill.logits_from = 0;
  prefill.hidden_layers.assign(layers.begin(), layers.end());
  prefill.on_logits = [](int32_t, const float*) {};
  prefill.on_hidden = [&](int32_t, const float* row) {
    features.insert(features.end(), row, row + width);
  };
  ASSERT_TRUE(engine_->Prefill(prefill).ok());
  ASSERT_EQ(static_cast<int64_t>(features.size()), (n - 1) * width);
  strategy->Reset();
  strategy->ObserveTargetFeatures(0, n, features, width);
  spec::DraftTree draft;
  sample::Rng rng(2024);
  spec::ProposeContext ctx{&params, &rng, nullptr};
  ASSERT_TRUE(strategy->Propose(prompt, 8, ctx, &draft).ok());
  ASSERT_GE(draft.size(), 2) << what;
  ASSERT_TRUE(draft.deterministic) << what;

  // The decoder's pass: the root at position n - 1, each node at the root's position plus its
  // depth, in cache order root, nodes.
  std::vector<int32_t> path = {prompt.back()};
  path.insert(path.end(), draft.tokens.begin(), draft.tokens.end());
  std::vector<int32_t> depth(draft.size());
  ForwardBatch batch;
  batch.Add(prompt.back(), seq, n - 1, /*want_logits=*/true);
  for (int32_t i = 0; i < draft.size(); ++i) {
    const int32_t parent = draft.parents[i];
    depth[i] = parent < 0 ? 1 : depth[parent] + 1;
    batch.Add(draft.tokens[i], seq, n - 1 + depth[i], /*want_logits=*/true,
              /*parent=*/parent < 0 ? 0 : parent + 1, /*cache_index=*/n + i);
  }
  ForwardOutput out;
  ASSERT_TRUE(engine_
                  ->Locked([&](KvCache& c, ForwardPass& pass) {
                    KILN_RETURN_IF_ERROR(c.AppendSlots(seq, path));
                    return pass.Forward(batch, c, &out);
                  })
                  .ok());
  engine_->Locked([&](KvCache& c, ForwardPass&) { return c.Free(seq); }).IgnoreError();

  // Target distributions with the node's ancestors as history, as SpeculativeDecoder::Verify.
  std::vector<sample::Distribution> p(draft.size() + 1);
  ASSERT_TRUE(sampler.Apply(std::span(out.LogitsRow(0), n_vocab), prompt, &p[0]).ok());
  std::vector<sample::DraftNode> nodes(draft.size());
  for (int32_t i = 0; i < draft.size(); ++i) {
    std::vector<int32_t> history;
    for (int32_t a = i; a >= 0; a = draft.parents[a]) history.push_back(draft.tokens[a]);
    history.insert(history.end(), prompt.rbegin(), prompt.rend());
    std::reverse(history.begin(), history.end());
    ASSERT_TRUE(sampler.Apply(std::span(out.LogitsRow(i + 1), n_vocab), history, &p[i + 1]).ok());
    nodes[i] = {draft.parents[i], draft.tokens[i], nullptr, &p[i + 1]};
  }
  const sample::DraftTree tree{&p[0], nodes};

  // The first token's total variation from p[0] over kTreeVerifications runs of `verify`.
  int accepted_at_root = 0;
  auto first_token_tv = [&](auto verify) {
    std::map<int32_t, int> counts;
    accepted_at_root = 0;
    sample::Rng verify_rng(7);
    sample::RngUniformSource uniforms(verify_rng);
    sample::VerifyResult result;
    for (int i = 0; i < kTreeVerifications; ++i) {
      EXPECT_TRUE(verify(uniforms, &result).ok());
      ++counts[result.tokens[0]];
      accepted_at_root += result.num_accepted() > 0;
    }
    return FirstTokenTotalVariation(counts, kTreeVerifications, p[0]);
  };
  // Negative control: the lossy typical rule on the same tree is far off.
  const double typical_tv = first_token_tv([&](sample::UniformSource& u, sample::VerifyResult* r) {
    return sample::VerifyTreeTypical(tree, {}, u, r);
  });
  EXPECT_GT(typical_tv, 0.05) << what;
  const double tv = first_token_tv([&](sample::UniformSource& u, sample::VerifyResult* r) {
    return sample::VerifyTree(tree, u, r);
  });
  EXPECT_LT(tv, 0.01) << what;
  EXPECT_GT(accepted_at_root, 0) << what;
  EXPECT_LT(accepted_at_root, kTreeVerifications) << what;
  std::printf(
      "%s: tree of %d nodes, %zu root candidates, root draft accepted %.3f of %d "
      "verifications, first-token total variation %.4f (typical acceptance: %.4f)\n",
      what, draft.size(), p[0].candidates.size(),
      static_cast<double>(accepted_at_root) / kTreeVerifications, kTreeVerifications, tv,
      typical_tv);
}

void SpecHeadTest::SetUpTestSuite() {
  LoadDefaultModel(1024);
  tiny_path_ = new std::string(WriteEditedModel("tiny-llama-gqa"));
  ModelLoadOptions load;
  load.path = *tiny_path_;
  auto tiny = Model::Load(load);
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  tiny_ = tiny->release();
  EngineOptions options;
  options.n_threads = 1;
  options.n_ctx = 256;
  auto engine = Engine::Create(*tiny_, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  tiny_engine_ = engine->release();
}

void SpecHeadTest::TearDownTestSuite() {
  delete tiny_engine_;
  delete tiny_;
  delete tiny_path_;
  tiny_engine_ = nullptr;
  tiny_ = nullptr;
  tiny_path_ = nullptr;
  FreeDefaultModel();
}

void SpecModelTest::LoadTinyModel(const std::string& shape, int32_t n_ctx) {
  auto model_shape = RandomModelShapeByName(shape);
  ASSERT_TRUE(model_shape.ok()) << model_shape.status();
  RandomModelOptions options;
  options.shape = *model_shape;
  options.type = static_cast<uint32_t>(GgmlType::kF16);
  options.seed = 11;
  gguf::GgufWriter writer;
  ASSERT_TRUE(BuildRandomModel(options, &writer).ok());
  const std::string path = TempDir() + "/spec-" + shape + ".gguf";
  ASSERT_TRUE(writer.WriteToFile(path).ok());
  LoadModelAndEngine(path, n_ctx, &model_, &engine_);
}

void SpecModelTest::LoadDefaultModel(int32_t n_ctx) {
  LoadModelAndEngine(DefaultModelPath(), n_ctx, &model_, &engine_);
}

void SpecModelTest::FreeDefaultModel() {
  delete engine_;
  delete model_;
  engine_ = nullptr;
  model_ = nullptr;
}

std::vector<int32_t> SpecModelTest::Encode(const std::string& text) {
  auto ids = model_->tokenizer().Encode(text, /*add_special=*/true, /*parse_special=*/true);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

std::vector<int32_t> SpecModelTest::PlainGreedy(std::span<const int32_t> prompt, int32_t max_tokens,
                                                const sample::SamplerParams& params) {
  auto session = Session::Create(*engine_, params, 1);
  EXPECT_TRUE(session.ok()) << session.status();
  if (!session.ok()) return {};
  EXPECT_TRUE((*session)->AppendTokens(prompt).ok());
  GenerateOptions options;
  options.max_tokens = max_tokens;
  auto result = (*session)->Generate(options);
  EXPECT_TRUE(result.ok()) << result.status();
  const auto& all = (*session)->tokens();
  return std::vector<int32_t>(all.begin() + static_cast<std::ptrdiff_t>(prompt.size()), all.end());
}

const char* const kHeldOutChatPrompts[20] = {
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a hash table is in two sentences.",
    "Give three tips for learning a new language.",
    "Translate to French: Good morning.",
    "What is 12 times 7?",
    "Name the planets of the solar system.",
    "Why is the sky blue?",
    "Write a limerick about a cat.",
    "How do I boil an egg?",
    "What does a compiler do?",
    "Suggest a name for a bakery.",
    "Describe a rainy day in one sentence.",
    "List three primary colors.",
    "What is photosynthesis?",
    "Tell me a fun fact about octopuses.",
    "How many days are in a leap year?",
    "What is the opposite of hot?",
    "Write a short thank-you note.",
    "Summarize the story of Cinderella.",
};

void ExpectFirstTokenHasTargetDistribution(Engine& engine, const Model& model,
                                           spec::Strategy* strategy, int32_t drafted, int samples) {
  const int64_t d = model.hparams().n_embd, n_vocab = model.hparams().n_vocab;
  const std::vector<int32_t> prompt = {1, 72, 101, 108, 108, 111, 44, 32, 119};
  const int32_t n = static_cast<int32_t>(prompt.size());
  const sample::SamplerParams params = SampledParams(8, 1.0f);

  const SeqId seq = engine.Locked([](KvCache& c, ForwardPass&) { return c.CreateSequence(); });
  std::vector<float> root_logits, feature;
  PrefillRequest request;
  request.seq = seq;
  request.tokens = prompt;
  request.logits_from = n - 2;
  request.on_logits = [&](int32_t i, const float* row) {
    if (i == n - 1) root_logits.assign(row, row + n_vocab);
  };
  request.on_hidden = [&](int32_t i, const float* row) {
    if (i == n - 1) feature.assign(row, row + d);
  };
  ASSERT_TRUE(engine.Prefill(request).ok());
  sample::Sampler sampler(params);
  sample::Distribution target;
  ASSERT_TRUE(sampler.Apply(root_logits, prompt, &target).ok());
  ASSERT_TRUE(engine.Locked([&](KvCache& c, ForwardPass&) { return c.Truncate(seq, n - 1); }).ok());

  sample::Rng rng(12345);
  spec::SpeculativeDecoder decoder(engine, seq, sampler, rng, strategy);
  std::map<int32_t, int> counts;
  int64_t accepted = 0, rejected_at_root = 0;
  for (int i = 0; i < samples; ++i) {
    std::vector<int32_t> tokens = prompt;
    strategy->ObserveTargetFeatures(n - 2, n, feature, d);
    spec::SpecStepResult step;
    ASSERT_TRUE(decoder.Step(&tokens, 8, &step).ok());
    ASSERT_FALSE(step.emitted.empty());
    ASSERT_EQ(step.drafted, drafted);
    ++counts[step.emitted[0]];
    accepted += step.accepted;
    rejected_at_root += step.accepted == 0;
    ASSERT_TRUE(
        engine.Locked([&](KvCache& c, ForwardPass&) { return c.Truncate(seq, n - 1); }).ok());
  }
  engine.Locked([&](KvCache& c, ForwardPass&) { return c.Free(seq); }).IgnoreError();
  const double tv = FirstTokenTotalVariation(counts, samples, target);
  std::printf(
      "first token: total variation %.4f over %d samples; %lld drafts accepted, %lld "
      "steps rejected at the root\n",
      tv, samples, static_cast<long long>(accepted), static_cast<long long>(rejected_at_root));
  const double bound = 4 * 0.5 * std::sqrt(2.0 / (M_PI * samples)) * std::sqrt(8.0);
  EXPECT_LT(tv, bound);
  EXPECT_GT(accepted, 0);
  EXPECT_GT(rejected_at_root, 0);
}

}  // namespace kiln::testing
