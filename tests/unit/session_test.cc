// Sessions over the engine: generation (greedy against the engine's own argmax, seeded sampling),
// fork/rewind, stop strings, cancel, cache exhaustion, prefix caching, bad input, busy detection.
// Tiny random models for the mechanics (fork/rewind and prefix caching also on a deepseek2 MLA
// model), the real default model for text and long prefills.
#include "lib/session/session.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <random>
#include <thread>

#include "lib/gguf/file_type.h"
#include "lib/gguf/gguf_writer.h"
#include "lib/model/random_model.h"
#include "lib/tokenizer/tokenizer.h"
#include "tests/common/session_util.h"
#include "tests/common/test_util.h"

namespace kiln {
namespace {

std::unique_ptr<Model> LoadTinyModel(const std::string& shape_name = "tiny-llama-gqa") {
  return testing::LoadRandomModel(shape_name, "q8_0", 11, "session-" + shape_name + ".gguf");
}

using testing::MakeEngine;
using testing::NewSession;
using testing::RandomTokens;

using testing::Greedy;

std::vector<int32_t> Generated(const Session& s, size_t prompt_len) {
  return std::vector<int32_t>(s.tokens().begin() + prompt_len, s.tokens().end());
}

int32_t Argmax(std::span<const float> v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// Fork, generation on both, rewinds into and past the computed part (shared by the model shapes).
void CheckForkAndRewind(const Model& model, const EngineOptions& engine_options = {}) {
  auto engine = MakeEngine(model, engine_options);
  auto a = NewSession(*engine, Greedy());
  const std::vector<int32_t> prompt = RandomTokens(37, 3, model.hparams().n_vocab, 7);
  ASSERT_TRUE(a->AppendTokens(prompt).ok());
  auto b = a->Fork();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->tokens(), a->tokens());
  GenerateOptions options;
  options.max_tokens = 8;
  ASSERT_TRUE(a->Generate(options).ok());
  ASSERT_TRUE((*b)->Generate(options).ok());
  const std::vector<int32_t> gen = Generated(*a, prompt.size());
  EXPECT_EQ(Generated(**b, prompt.size()), gen);
  // The fork diverges independently.
  const int32_t other = gen[0] == 5 ? 6 : 5;
  ASSERT_TRUE((*b)->Rewind(8).ok());
  ASSERT_TRUE((*b)->AppendTokens(std::span(&other, 1)).ok());
  EXPECT_EQ(a->n_tokens(), static_cast<int32_t>(prompt.size() + 8));

  // Rewind into the computed part: the logits are recomputed and generation repeats itself.
  ASSERT_TRUE(a->Rewind(8).ok());
  EXPECT_EQ(a->tokens(), prompt);
  ASSERT_TRUE(a->Generate(options).ok());
  EXPECT_EQ(Generated(*a, prompt.size()), gen);
  // Rewind past the prompt start too.
  ASSERT_TRUE(a->Rewind(prompt.size() + 8 - 10).ok());
  EXPECT_EQ(a->n_tokens(), 10);
  ASSERT_TRUE(a->AppendTokens(std::span(prompt).subspan(10)).ok());
  ASSERT_TRUE(a->Generate(options).ok());
  EXPECT_EQ(Generated(*a, prompt.size()), gen);
  EXPECT_EQ(a->Rewind(a->n_tokens() + 1).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(a->Rewind(-1).code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(engine->Locked([](KvCache& c, ForwardPass&) { return c.CheckInvariants(); }).ok());
}

// A second session attaches the first one's cached system prompt and gets the cold prefill's
// logits bit for bit (shared by the model shapes).
void CheckPrefixCacheSkipsSharedSystemPrompt(const Model& model) {
  auto engine = MakeEngine(model);
  EngineOptions cold_options;
  cold_options.prefix_caching = false;
  auto cold_engine = MakeEngine(model, cold_options);
  const std::vector<int32_t> system = RandomTokens(100, 3, 300, 12);
  std::vector<int32_t> first = system, second = system;
  for (int32_t t : RandomTokens(9, 3, 300, 13)) first.push_back(t);
  for (int32_t t : RandomTokens(7, 3, 300, 14)) second.push_back(t);

  auto a = NewSession(*engine, Greedy());
  ASSERT_TRUE(a->AppendTokens(first).ok());
  EXPECT_EQ(a->stats().attached_tokens, 0);
  a.reset();  // its blocks stay cached
  auto b = NewSession(*engine, Greedy());
  ASSERT_TRUE(b->AppendTokens(second).ok());
  EXPECT_EQ(b->stats().attached_tokens, 96);  // whole 16-token blocks of the system prompt
  EXPECT_EQ(b->stats().computed_tokens, static_cast<int64_t>(second.size()) - 96);
  EXPECT_EQ(engine->Counters().prefix_hit_tokens, 96);

  auto c = NewSession(*cold_engine, Greedy());
  ASSERT_TRUE(c->AppendTokens(second).ok());
  EXPECT_EQ(c->stats().computed_tokens, static_cast<int64_t>(second.size()));
  ASSERT_EQ(b->Logits().size(), c->Logits().size());
  EXPECT_TRUE(std::equal(b->Logits().begin(), b->Logits().end(), c->Logits().begin()))
      << "a prefix-cache hit must give the cold prefill's logits bit for bit";
}

class TinySession : public testing::SuiteModelTest<TinySession> {
 protected:
  static void SetUpTestSuite() { model_ = LoadTinyModel().release(); }
};

TEST_F(TinySession, GreedyFollowsTheEngineArgmax) {
  auto engine = MakeEngine(*model_);
  auto session = NewSession(*engine, Greedy());
  const std::vector<int32_t> prompt = RandomTokens(20, 3, model_->hparams().n_vocab, 5);
  ASSERT_TRUE(session->AppendTokens(prompt).ok());
  ASSERT_EQ(session->Logits().size(), static_cast<size_t>(model_->hparams().n_vocab));
  GenerateOptions options;
  options.max_tokens = 12;
  int calls = 0;
  options.on_token = [&](int32_t token, std::string_view) {
    if (token >= 0) ++calls;
    return true;
  };
  auto result = session->Generate(options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->n_tokens, 12);
  EXPECT_EQ(result->reason, StopReason::kMaxTokens);
  EXPECT_EQ(calls, 12);
  const std::vector<int32_t> gen = Generated(*session, prompt.size());
  ASSERT_EQ(gen.size(), 12u);

  // Replay: a second session fed prompt + gen[0, i) must have argmax == gen[i] (control tokens
  // banned, as in the sampler).
  auto replay = NewSession(*engine, Greedy());
  ASSERT_TRUE(replay->AppendTokens(prompt).ok());
  for (size_t i = 0; i < gen.size(); ++i) {
    std::vector<float> logits(replay->Logits().begin(), replay->Logits().end());
    for (int t = 0; t < 3; ++t) logits[t] = -INFINITY;
    EXPECT_EQ(Argmax(logits), gen[i]) << "step " << i;
    ASSERT_TRUE(replay->AppendTokens(std::span(&gen[i], 1)).ok());
  }
  // Greedy is deterministic.
  auto again = NewSession(*engine, Greedy(), /*seed=*/999);
  ASSERT_TRUE(again->AppendTokens(prompt).ok());
  ASSERT_TRUE(again->Generate(options).ok());
  EXPECT_EQ(Generated(*again, prompt.size()), gen);
}

TEST_F(TinySession, SameSeedSameTokens) {
  auto engine = MakeEngine(*model_);
  sample::SamplerParams p;  // llama.cpp defaults: temp 0.8, top-k 40, top-p 0.95, min-p 0.05
  p.top_k = 0;
  p.min_p = 0.0f;
  p.top_p = 1.0f;
  p.temperature = 1.5f;
  const std::vector<int32_t> prompt = RandomTokens(10, 3, model_->hparams().n_vocab, 6);
  auto run = [&](uint64_t seed) {
    auto s = NewSession(*engine, p, seed);
    EXPECT_TRUE(s->AppendTokens(prompt).ok());
    GenerateOptions options;
    options.max_tokens = 24;
    EXPECT_TRUE(s->Generate(options).ok());
    return Generated(*s, prompt.size());
  };
  const std::vector<int32_t> a = run(42), b = run(42), c = run(43);
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST_F(TinySession, TokenIdsOutOfRangeChangeNothing) {
  auto engine = MakeEngine(*model_);
  auto s = NewSession(*engine, Greedy());
  const int32_t n_vocab = static_cast<int32_t>(model_->hparams().n_vocab);
  ASSERT_TRUE(s->AppendTokens(std::vector<int32_t>{5, 6, 7}).ok());
  absl::Status st = s->AppendTokens(std::vector<int32_t>{8, n_vocab});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("index 1"), std::string::npos) << st;
  EXPECT_EQ(s->AppendTokens(std::vector<int32_t>{-1}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->n_tokens(), 3);
  EXPECT_FALSE(s->Logits().empty());
}

TEST_F(TinySession, PositionsPastTheContext) {
  EngineOptions eo;
  eo.n_ctx = 32;
  auto engine = MakeEngine(*model_, eo);
  auto s = NewSession(*engine, Greedy());
  ASSERT_TRUE(s->AppendTokens(RandomTokens(30, 3, model_->hparams().n_vocab, 8)).ok());
  EXPECT_EQ(s->AppendTokens(RandomTokens(3, 3, 100, 9)).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(s->n_tokens(), 30);
  GenerateOptions options;
  options.max_tokens = 10;
  auto r = s->Generate(options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->reason, StopReason::kContextFull);
  EXPECT_EQ(r->n_tokens, 2);
  EXPECT_EQ(s->Generate(options).status().code(), absl::StatusCode::kOutOfRange);
  // Default n_ctx is the model's training context.
  auto def = MakeEngine(*model_);
  EXPECT_EQ(def->n_ctx(), model_->hparams().n_ctx_train);
}

TEST_F(TinySession, CacheFullLeavesSessionUsable) {
  EngineOptions eo;
  eo.prefix_caching = false;
  eo.block_size = 16;
  auto layout = model_->architecture().CacheLayout(model_->hparams(), GgmlType::kF16, 16);
  ASSERT_TRUE(layout.ok());
  eo.pool_bytes = 5 * layout->block_bytes();  // the null block + 4 usable blocks
  auto engine = MakeEngine(*model_, eo);
  auto a = NewSession(*engine, Greedy());
  auto b = NewSession(*engine, Greedy());
  ASSERT_TRUE(a->AppendTokens(RandomTokens(40, 3, 300, 10)).ok());  // 3 blocks
  const std::vector<int32_t> prompt_b = RandomTokens(30, 3, 300, 11);
  absl::Status st = b->AppendTokens(prompt_b);  // needs 2 blocks, 1 left
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_EQ(b->n_tokens(), 0);
  // Generation in `a` fills its last block then hits the wall; what it generated stays.
  GenerateOptions options;
  options.max_tokens = 40;
  auto r = a->Generate(options);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(a->n_tokens(), 64 + 1);  // 4 blocks full, plus the sampled token that did not fit
  EXPECT_TRUE(engine->Locked([](KvCache& c, ForwardPass&) { return c.CheckInvariants(); }).ok());
  a.reset();  // frees 4 blocks
  ASSERT_TRUE(b->AppendTokens(prompt_b).ok());
  options.max_tokens = 4;
  auto rb = b->Generate(options);
  ASSERT_TRUE(rb.ok()) << rb.status();
  EXPECT_EQ(rb->n_tokens, 4);
}

TEST_F(TinySession, ForkAndRewind) { CheckForkAndRewind(*model_); }

TEST_F(TinySession, PrefixCacheSkipsSharedSystemPrompt) {
  CheckPrefixCacheSkipsSharedSystemPrompt(*model_);
}

// The same on a deepseek2 model: its cache holds MLA latent rows (forks share and copy them on
// write, rewinds and prefix hits reuse them).
class TinyDeepseek2Session : public testing::SuiteModelTest<TinyDeepseek2Session> {
 protected:
  static void SetUpTestSuite() { model_ = LoadTinyModel("tiny-deepseek2").release(); }
};

TEST_F(TinyDeepseek2Session, ForkAndRewind) { CheckForkAndRewind(*model_); }

// The q8_0 latent cache (EngineOptions::kv_type, KILN_KV_Q8_0, --cache-type q8_0) through the same.
TEST_F(TinyDeepseek2Session, ForkAndRewindWithAQ8_0LatentCache) {
  EngineOptions options;
  options.kv_type = GgmlType::kQ8_0;
  CheckForkAndRewind(*model_, options);
}

TEST_F(TinyDeepseek2Session, PrefixCacheSkipsSharedSystemPrompt) {
  CheckPrefixCacheSkipsSharedSystemPrompt(*model_);
}

TEST_F(TinySession, ScoredAppendMatchesLogSoftmax) {
  auto engine = MakeEngine(*model_);
  const std::vector<int32_t> text = RandomTokens(40, 3, 300, 15);
  auto s = NewSession(*engine, Greedy());
  std::vector<float> scores(text.size() - 1);
  ASSERT_TRUE(s->AppendTokensScored(text, scores).ok());
  auto ref = NewSession(*engine, Greedy());
  for (size_t i = 0; i + 1 < text.size(); ++i) {
    ASSERT_TRUE(ref->AppendTokens(std::span(&text[i], 1)).ok());
    std::span<const float> l = ref->Logits();
    double mx = *std::max_element(l.begin(), l.end()), sum = 0;
    for (float x : l) sum += std::exp(x - mx);
    EXPECT_NEAR(scores[i], l[text[i + 1]] - mx - std::log(sum), 1e-4) << i;
  }
  EXPECT_EQ(s->AppendTokensScored(text, std::span(scores).first(3)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(TinySession, SessionsOnSeveralThreadsShareOneEngine) {
  auto engine = MakeEngine(*model_);
  std::vector<std::vector<int32_t>> prompts, sequential(4), parallel(4);
  for (int i = 0; i < 4; ++i) prompts.push_back(RandomTokens(30 + i, 3, 300, 20 + i));
  GenerateOptions options;
  options.max_tokens = 10;
  for (int i = 0; i < 4; ++i) {
    auto s = NewSession(*engine, Greedy());
    ASSERT_TRUE(s->AppendTokens(prompts[i]).ok());
    ASSERT_TRUE(s->Generate(options).ok());
    sequential[i] = s->tokens();
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      auto s = NewSession(*engine, Greedy());
      EXPECT_TRUE(s->AppendTokens(prompts[i]).ok());
      EXPECT_TRUE(s->Generate(options).ok());
      parallel[i] = s->tokens();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(parallel, sequential);
}

// A cancel applies only to the call in flight: one sent while no call runs is dropped by the
// next call, and one sent from the generate callback stops that generate.
TEST_F(TinySession, CancelWhileIdleHasNoEffect) {
  auto engine = MakeEngine(*model_);
  auto s = NewSession(*engine, Greedy());
  s->Cancel();
  ASSERT_TRUE(s->AppendTokens(RandomTokens(20, 3, 300, 30)).ok());
  EXPECT_EQ(s->n_tokens(), 20);
  EXPECT_EQ(s->published_n_tokens(), 20);
  s->Cancel();
  GenerateOptions options;
  options.max_tokens = 5;
  auto r = s->Generate(options);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->reason, StopReason::kMaxTokens);  // Greedy() bans the control tokens
  EXPECT_EQ(r->n_tokens, 5);
  EXPECT_EQ(s->published_n_tokens(), 25);

  int seen = 0;
  options.on_token = [&](int32_t token, std::string_view) {
    if (token >= 0 && ++seen == 2) s->Cancel();
    return true;
  };
  r = s->Generate(options);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->reason, StopReason::kCancelled);
  EXPECT_EQ(r->n_tokens, 2);
  s->Cancel();  // after the call that honoured the previous one ended: dropped
  options.on_token = nullptr;
  r = s->Generate(options);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->reason, StopReason::kMaxTokens);
  EXPECT_EQ(r->n_tokens, 5);
}

TEST_F(TinySession, MutatingFromOwnCallbackIsBusyReadingIsFine) {
  auto engine = MakeEngine(*model_);
  auto s = NewSession(*engine, Greedy());
  ASSERT_TRUE(s->AppendTokens(RandomTokens(10, 3, 300, 31)).ok());
  absl::Status inner;
  bool read_ok = false;
  GenerateOptions options;
  options.max_tokens = 3;
  options.on_token = [&](int32_t, std::string_view) {
    inner = s->Rewind(1);
    Session::Use use(*s, "read", false);
    read_ok = use.status().ok();
    return true;
  };
  ASSERT_TRUE(s->Generate(options).ok());
  EXPECT_EQ(inner.code(), absl::StatusCode::kAborted) << inner;
  EXPECT_TRUE(read_ok);
  EXPECT_EQ(s->n_tokens(), 13);
}

// ---------------------------------------------------------------- the real model

class RealSession : public testing::SuiteModelTest<RealSession> {
 protected:
  static void SetUpTestSuite() { LoadDefaultModel(); }
};

TEST_F(RealSession, GreedyTextAndStopStringSplitAcrossTokens) {
  ASSERT_NE(model_, nullptr);
  auto engine = MakeEngine(*model_);
  const std::string prompt =
      "<|im_start|>user\nName three colors of the rainbow.<|im_end|>\n<|im_start|>assistant\n";
  auto run = [&](const std::vector<std::string>& stops, std::vector<std::string>* pieces) {
    auto s = NewSession(*engine, Greedy(false));
    EXPECT_TRUE(s->AppendText(prompt, false, true).ok());
    GenerateOptions options;
    options.max_tokens = 24;
    options.stop_strings = stops;
    std::string text;
    options.on_token = [&](int32_t token, std::string_view piece) {
      if (token >= 0 && pieces) pieces->emplace_back(piece);
      text += piece;
      return true;
    };
    auto r = s->Generate(options);
    EXPECT_TRUE(r.ok()) << r.status();
    return std::make_pair(text, r.ok() ? r->reason : StopReason::kCallback);
  };
  std::vector<std::string> pieces;
  const auto [text, reason] = run({}, &pieces);
  EXPECT_FALSE(text.empty());
  EXPECT_EQ(run({}, nullptr).first, text);  // deterministic
  // A stop string made of the end of one piece and the start of the next.
  std::string stop;
  size_t before = 0;  // text length before the piece where the stop starts
  // Up to 2 bytes from each side, at least 3 in all (the answer may be made of short pieces
  // such as "1", ".", " Red").
  for (size_t i = 2; i + 1 < pieces.size(); ++i) {
    const size_t tail = std::min<size_t>(2, pieces[i].size());
    const size_t head = std::min<size_t>(2, pieces[i + 1].size());
    if (tail >= 1 && head >= 1 && tail + head >= 3) {
      stop = pieces[i].substr(pieces[i].size() - tail) + pieces[i + 1].substr(0, head);
      for (size_t j = 0; j < i; ++j) before += pieces[j].size();
      before += pieces[i].size() - tail;
      break;
    }
  }
  ASSERT_FALSE(stop.empty()) << text;
  const size_t first = text.find(stop);
  ASSERT_LE(first, before);
  const auto [stopped, stop_reason] = run({"never-appears-xyz", stop}, nullptr);
  EXPECT_EQ(stop_reason, StopReason::kStopString);
  EXPECT_EQ(stopped, text.substr(0, first));
}

TEST_F(RealSession, BusyAndCancelDuringLongPrefill) {
  ASSERT_NE(model_, nullptr);
  auto engine = MakeEngine(*model_);
  auto s = NewSession(*engine, Greedy(false));
  const std::vector<int32_t> long_prompt = RandomTokens(3000, 300, 40000, 40);
  absl::Status prefill;
  std::thread worker([&] { prefill = s->AppendTokens(long_prompt); });
  while (!s->busy()) std::this_thread::yield();
  // A second thread on the same session is detected, and changes nothing.
  EXPECT_EQ(s->AppendTokens(std::vector<int32_t>{1, 2}).code(), absl::StatusCode::kAborted);
  GenerateOptions options;
  EXPECT_EQ(s->Generate(options).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(s->Rewind(0).code(), absl::StatusCode::kAborted);
  s->Cancel();
  worker.join();
  EXPECT_EQ(prefill.code(), absl::StatusCode::kCancelled) << prefill;
  EXPECT_EQ(s->n_tokens(), 0);
  EXPECT_LT(s->stats().computed_tokens, 3000);
  // Usable afterwards.
  ASSERT_TRUE(s->AppendText("The capital of France is", false, false).ok());
  options.max_tokens = 4;
  auto r = s->Generate(options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->n_tokens, 4);
}

}  // namespace
}  // namespace kiln
