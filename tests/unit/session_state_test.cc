// Saved session states (Session::SaveState / LoadState, lib/session/session_state.h): the
// continuation after a restore is bitwise the continuation without the save (greedy and seeded,
// K/V stored or recomputed, after an append, a generate or a rewind, into another engine with
// another block size, with the n-gram strategy's state); bad states (another model, truncated,
// corrupted, a newer version, another K/V type, more tokens than n_ctx, a full cache) are
// refused with a status naming the problem and change nothing. Tiny random models for the
// mechanics, the default model for real text and speculation.
#include "lib/session/session_state.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "lib/gguf/file_type.h"
#include "lib/gguf/gguf_writer.h"
#include "lib/model/random_model.h"
#include "lib/session/session.h"
#include "lib/spec/draft_model_strategy.h"
#include "lib/spec/ngram_strategy.h"
#include "tests/common/session_util.h"
#include "tests/common/spec_test_util.h"
#include "tests/common/test_util.h"

namespace kiln {
namespace {

std::unique_ptr<Model> LoadTinyModel(uint64_t seed, const std::string& shape_name) {
  return testing::LoadRandomModel(shape_name, "q8_0", seed,
                                  kiln::StrCat("state-", shape_name, "-", seed, ".gguf"));
}

using testing::MakeEngine;
using testing::NewSession;
using testing::RandomTokens;

using testing::Greedy;

// Seeded sampling through the whole chain, with a repetition penalty (reads the history) and
// logprobs.
sample::SamplerParams Sampled() {
  sample::SamplerParams p = Greedy();
  p.temperature = 1.2f;
  p.top_k = 0;
  p.top_p = 0.98f;
  p.min_p = 0.0f;
  p.repeat_penalty = 1.1f;
  p.n_logprobs = 3;
  return p;
}

void Generate(Session& s, int32_t n) {
  GenerateOptions options;
  options.max_tokens = n;
  auto r = s.Generate(options);
  ASSERT_TRUE(r.ok()) << r.status();
}

// The tokens a session holds after generating n more (the session is changed).
std::vector<int32_t> Continue(Session& s, int32_t n) {
  Generate(s, n);
  return s.tokens();
}

// The payload of a saved state.
state::SessionState Payload(const std::string& saved) {
  state::SessionStateFile file;
  EXPECT_TRUE(file.ParseFromString(saved));
  state::SessionState payload;
  EXPECT_TRUE(payload.ParseFromString(file.payload()));
  return payload;
}

// A session's observable state, compared before and after a refused LoadState.
struct Snapshot {
  std::vector<int32_t> tokens;
  int32_t n_cached;
  std::vector<float> logits;
  KvCacheCounters counters;
};
Snapshot Observe(const Session& s, const Engine& engine) {
  return {s.tokens(), s.n_cached(), std::vector<float>(s.Logits().begin(), s.Logits().end()),
          engine.Counters()};
}
void ExpectUnchanged(const Snapshot& before, const Session& s, const Engine& engine) {
  const Snapshot now = Observe(s, engine);
  EXPECT_EQ(now.tokens, before.tokens);
  EXPECT_EQ(now.n_cached, before.n_cached);
  EXPECT_EQ(now.logits, before.logits);
  EXPECT_EQ(now.counters.blocks_used, before.counters.blocks_used);
  EXPECT_EQ(now.counters.num_sequences, before.counters.num_sequences);
  EXPECT_EQ(now.counters.blocks_cached, before.counters.blocks_cached);
}

TEST(Crc32cTest, KnownValueAndChainingAndPortableEqualsFast) {
  const char* check = "123456789";
  EXPECT_EQ(state::Crc32c(check, 9), 0xE3069283u);
  EXPECT_EQ(state::Crc32cPortable(check, 9), 0xE3069283u);
  EXPECT_EQ(state::Crc32c(check + 4, 5, state::Crc32c(check, 4)), 0xE3069283u);
  EXPECT_EQ(state::Crc32c("", 0), 0u);
  std::mt19937 rng(3);
  std::vector<uint8_t> buf(1000);
  for (uint8_t& b : buf) b = static_cast<uint8_t>(rng());
  for (size_t len : {1u, 7u, 8u, 9u, 63u, 1000u}) {
    for (size_t off : {0u, 1u, 3u}) {
      EXPECT_EQ(state::Crc32c(buf.data() + off, len - (len > off ? off : 0)),
                state::Crc32cPortable(buf.data() + off, len - (len > off ? off : 0)))
          << len << " " << off;
    }
  }
}

class TinyState : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = LoadTinyModel(11, "tiny-llama-gqa").release();
    other_seed_ = LoadTinyModel(12, "tiny-llama-gqa").release();
    other_shape_ = LoadTinyModel(11, "tiny-llama-mha").release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete other_seed_;
    delete other_shape_;
  }
  int64_t n_vocab() const { return model_->hparams().n_vocab; }

  // Saves `a`, continues it by `more` tokens, restores the save into a new session on `target`
  // and continues that: both must hold the same tokens. Before continuing, the restored session
  // must hold bit for bit the K/V the saved one held (also when they were recomputed).
  static void ExpectSameContinuation(Session& a, Engine& target, const SaveStateOptions& options,
                                     const sample::SamplerParams& restore_params, int32_t more) {
    auto saved = a.SaveState(options);
    ASSERT_TRUE(saved.ok()) << saved.status();
    auto saved_kv = a.SaveState();
    ASSERT_TRUE(saved_kv.ok()) << saved_kv.status();
    const std::vector<int32_t> at_save = a.tokens();
    const std::vector<sample::TokenLogprob> logprobs(a.LastLogprobs().begin(),
                                                     a.LastLogprobs().end());
    const std::vector<int32_t> expected = Continue(a, more);
    // Another seed and other parameters: LoadState replaces both.
    auto b = NewSession(target, restore_params, /*seed=*/777);
    ASSERT_TRUE(b->LoadState(*saved).ok());
    EXPECT_EQ(b->tokens(), at_save);
    auto restored_kv = b->SaveState();
    ASSERT_TRUE(restored_kv.ok()) << restored_kv.status();
    const state::SessionState want = Payload(*saved_kv), got = Payload(*restored_kv);
    EXPECT_EQ(got.n_computed(), want.n_computed());
    ASSERT_EQ(got.kv().tiles_size(), want.kv().tiles_size());
    for (int t = 0; t < want.kv().tiles_size(); ++t) {
      EXPECT_TRUE(got.kv().tiles(t) == want.kv().tiles(t)) << "K/V tile " << t << " differs";
    }
    EXPECT_EQ(got.rng_state(0), want.rng_state(0));
    if (options.kv) {
      EXPECT_TRUE(*restored_kv == *saved_kv) << "the restored session saves other bytes";
    }
    ASSERT_EQ(b->LastLogprobs().size(), logprobs.size());
    for (size_t i = 0; i < logprobs.size(); ++i) {
      EXPECT_EQ(b->LastLogprobs()[i].token, logprobs[i].token);
      EXPECT_EQ(b->LastLogprobs()[i].logprob, logprobs[i].logprob);
    }
    EXPECT_EQ(Continue(*b, more), expected);
    EXPECT_TRUE(target.Locked([](KvCache& c, ForwardPass&) { return c.CheckInvariants(); }).ok());
  }

  static Model* model_;
  static Model* other_seed_;
  static Model* other_shape_;
};
Model* TinyState::model_ = nullptr;
Model* TinyState::other_seed_ = nullptr;
Model* TinyState::other_shape_ = nullptr;

TEST_F(TinyState, ContinuationIsBitwiseTheSame) {
  auto engine = MakeEngine(*model_);
  EngineOptions small_blocks;
  small_blocks.block_size = 8;
  small_blocks.prefix_caching = false;
  auto other_engine = MakeEngine(*model_, small_blocks);
  const std::vector<int32_t> prompt = RandomTokens(45, 3, n_vocab(), 5);
  for (bool kv : {true, false}) {
    for (bool sampled : {false, true}) {
      for (Engine* target : {engine.get(), other_engine.get()}) {
        SCOPED_TRACE(kiln::StrCat(kv ? "K/V" : "tokens only", sampled ? ", sampled" : ", greedy",
                                  target == engine.get() ? ", same engine" : ", other engine"));
        const sample::SamplerParams params = sampled ? Sampled() : Greedy();
        SaveStateOptions options;
        options.kv = kv;
        // After an append (logits of the last token, nothing pending).
        auto a = NewSession(*engine, params, 42);
        ASSERT_TRUE(a->AppendTokens(prompt).ok());
        ExpectSameContinuation(*a, *target, options, Greedy(), 10);
        // After a generate (the last token pending), then again after more.
        ExpectSameContinuation(*a, *target, options, Greedy(), 7);
        // After a rewind into the computed part (no logits).
        ASSERT_TRUE(a->Rewind(5).ok());
        ExpectSameContinuation(*a, *target, options, Sampled(), 9);
      }
    }
  }
}

TEST_F(TinyState, StateSizes) {
  auto engine = MakeEngine(*model_);
  auto a = NewSession(*engine, Greedy());
  ASSERT_TRUE(a->AppendTokens(RandomTokens(100, 3, n_vocab(), 8)).ok());
  auto with_kv = a->SaveState();
  SaveStateOptions tokens_only;
  tokens_only.kv = false;
  auto small = a->SaveState(tokens_only);
  ASSERT_TRUE(with_kv.ok() && small.ok());
  const size_t kv_bytes = 100 * engine->Counters().bytes_per_token;
  EXPECT_GT(with_kv->size(), kv_bytes);
  EXPECT_LT(with_kv->size(), kv_bytes + 100 * 4 + n_vocab() * 4 + 4096);
  EXPECT_LT(small->size(), 1024u);
}

TEST_F(TinyState, FileRoundTrip) {
  auto engine = MakeEngine(*model_);
  auto a = NewSession(*engine, Sampled(), 9);
  ASSERT_TRUE(a->AppendTokens(RandomTokens(30, 3, n_vocab(), 9)).ok());
  Generate(*a, 5);
  const std::string path = testing::TempDir() + "/tiny.state";
  ASSERT_TRUE(a->SaveStateToFile(path).ok());
  const std::vector<int32_t> expected = Continue(*a, 12);
  auto b = NewSession(*engine, Greedy());
  ASSERT_TRUE(b->LoadStateFromFile(path).ok());
  EXPECT_EQ(Continue(*b, 12), expected);
  absl::Status missing = b->LoadStateFromFile(path + ".missing");
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
  EXPECT_NE(missing.message().find(".missing"), std::string::npos) << missing;
  absl::Status dir = b->SaveStateToFile(testing::TempDir() + "/no/such/dir/x.state");
  EXPECT_FALSE(dir.ok());
}

TEST_F(TinyState, BadStatesAreRefusedAndChangeNothing) {
  auto engine = MakeEngine(*model_);
  auto a = NewSession(*engine, Greedy());
  ASSERT_TRUE(a->AppendTokens(RandomTokens(40, 3, n_vocab(), 10)).ok());
  Generate(*a, 4);
  auto saved = a->SaveState();
  ASSERT_TRUE(saved.ok());

  // The target: a session with contents of its own, which must survive every refusal.
  auto b = NewSession(*engine, Greedy());
  ASSERT_TRUE(b->AppendTokens(RandomTokens(21, 3, n_vocab(), 11)).ok());
  const Snapshot before = Observe(*b, *engine);
  auto refused = [&](std::string_view bytes, absl::StatusCode code, const char* words) {
    absl::Status st = b->LoadState(bytes);
    EXPECT_EQ(st.code(), code) << st;
    EXPECT_NE(st.message().find(words), std::string::npos) << st;
    ExpectUnchanged(before, *b, *engine);
  };

  refused("", absl::StatusCode::kDataLoss, "not a kiln session state");
  refused("GGUF\x03\0\0\0", absl::StatusCode::kDataLoss, "session state");
  // Truncated anywhere.
  for (size_t len : {size_t{1}, size_t{10}, saved->size() / 3, saved->size() / 2,
                     saved->size() - 100, saved->size() - 1}) {
    SCOPED_TRACE(len);
    absl::Status st = b->LoadState(std::string_view(*saved).substr(0, len));
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
    ExpectUnchanged(before, *b, *engine);
  }
  // Corrupted: one flipped bit in the payload (past the envelope's header).
  for (size_t at : {size_t{64}, saved->size() / 2, saved->size() - 5}) {
    std::string bad = *saved;
    bad[at] = static_cast<char>(bad[at] ^ 0x10);
    refused(bad, absl::StatusCode::kDataLoss, "CRC-32C");
  }
  // A newer format version.
  {
    state::SessionStateFile file;
    ASSERT_TRUE(file.ParseFromString(*saved));
    file.set_format_version(state::kFormatVersion + 1);
    refused(file.SerializeAsString(), absl::StatusCode::kUnimplemented, "newer");
    file.set_format_version(state::kFormatVersion);
    file.set_magic("kiln.something_else");
    refused(file.SerializeAsString(), absl::StatusCode::kDataLoss, "magic");
  }
  // A payload that passes the checksum but lies (a token past the vocabulary).
  {
    state::SessionStateFile file;
    ASSERT_TRUE(file.ParseFromString(*saved));
    state::SessionState payload;
    ASSERT_TRUE(payload.ParseFromString(file.payload()));
    payload.set_tokens(3, static_cast<int32_t>(n_vocab()));
    auto lying = state::Encode(payload);
    ASSERT_TRUE(lying.ok());
    refused(*lying, absl::StatusCode::kDataLoss, "index 3");
    payload.set_tokens(3, 5);
    payload.mutable_kv()->mutable_tiles(2)->pop_back();
    lying = state::Encode(payload);
    ASSERT_TRUE(lying.ok());
    refused(*lying, absl::StatusCode::kDataLoss, "tile 2");
    // Rows of sliding-window layers left out, on a model without them.
    ASSERT_TRUE(payload.ParseFromString(file.payload()));
    payload.mutable_kv()->set_sliding_first_row(1);
    lying = state::Encode(payload);
    ASSERT_TRUE(lying.ok());
    refused(*lying, absl::StatusCode::kDataLoss, "without sliding layers");
  }
  // Other models: same shape and another seed (only the tensor data differ), another shape.
  for (Model* other : {other_seed_, other_shape_}) {
    auto other_engine = MakeEngine(*other);
    auto c = NewSession(*other_engine, Greedy());
    ASSERT_TRUE(c->AppendTokens(RandomTokens(40, 3, n_vocab(), 10)).ok());
    auto foreign = c->SaveState();
    ASSERT_TRUE(foreign.ok());
    refused(*foreign, absl::StatusCode::kInvalidArgument, "another model");
  }
  // The session still continues exactly as an untouched copy does.
  auto twin = NewSession(*engine, Greedy());
  ASSERT_TRUE(twin->AppendTokens(b->tokens()).ok());
  EXPECT_EQ(Continue(*b, 6), Continue(*twin, 6));
}

TEST_F(TinyState, CacheLimitsAndKvTypes) {
  auto engine = MakeEngine(*model_);
  auto a = NewSession(*engine, Greedy());
  ASSERT_TRUE(a->AppendTokens(RandomTokens(100, 3, n_vocab(), 12)).ok());
  auto saved = a->SaveState();
  SaveStateOptions tokens_only;
  tokens_only.kv = false;
  auto small = a->SaveState(tokens_only);
  ASSERT_TRUE(saved.ok() && small.ok());
  const std::vector<int32_t> expected = Continue(*a, 5);

  // Another K/V type: the K/V cannot be used, the tokens can.
  EngineOptions f32;
  f32.kv_type = GgmlType::kF32;
  auto f32_engine = MakeEngine(*model_, f32);
  auto b = NewSession(*f32_engine, Greedy());
  absl::Status st = b->LoadState(*saved);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("f16"), std::string::npos) << st;
  EXPECT_EQ(b->n_tokens(), 0);
  EXPECT_TRUE(b->LoadState(*small).ok());
  EXPECT_EQ(b->n_tokens(), 100);

  // A context too short.
  EngineOptions short_ctx;
  short_ctx.n_ctx = 64;
  auto short_engine = MakeEngine(*model_, short_ctx);
  auto c = NewSession(*short_engine, Greedy());
  st = c->LoadState(*saved);
  EXPECT_EQ(st.code(), absl::StatusCode::kOutOfRange) << st;
  EXPECT_NE(st.message().find("n_ctx"), std::string::npos) << st;

  // A pool of 4 blocks (64 tokens): cache full, nothing changed; fits once the session is the
  // only one left.
  EngineOptions tiny_pool;
  tiny_pool.n_ctx = 128;
  tiny_pool.pool_bytes = 9 * engine->Counters().block_bytes;  // 8 usable blocks + the null block
  tiny_pool.prefix_caching = false;
  auto pool_engine = MakeEngine(*model_, tiny_pool);
  auto d = NewSession(*pool_engine, Greedy());
  ASSERT_TRUE(d->AppendTokens(RandomTokens(60, 3, n_vocab(), 13)).ok());  // 4 blocks
  const Snapshot before = Observe(*d, *pool_engine);
  st = d->LoadState(*saved);  // 100 tokens: 7 blocks, 4 free
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  ExpectUnchanged(before, *d, *pool_engine);
  ASSERT_TRUE(d->Rewind(d->n_tokens()).ok());
  ASSERT_TRUE(d->LoadState(*saved).ok());
  EXPECT_EQ(Continue(*d, 5), expected);
  EXPECT_TRUE(
      pool_engine->Locked([](KvCache& cache, ForwardPass&) { return cache.CheckInvariants(); })
          .ok());
}

// A q8_0 cache saves its K/V rows as stored (34 bytes per 32 values) and restores them bit for
// bit; its state does not go into an f16 cache, nor an f16 state into it, except tokens only.
TEST_F(TinyState, Q8_0CacheStateRoundTripsAndKeepsToItsType) {
  EngineOptions q8;
  q8.kv_type = GgmlType::kQ8_0;
  auto engine = MakeEngine(*model_, q8);
  auto other_engine = MakeEngine(*model_, q8);
  // tiny-llama-gqa: 2 layers x 2 KV heads x (K, V) x 64 values as 2 blocks of 34 bytes.
  EXPECT_EQ(engine->Counters().bytes_per_token, 2u * 2 * 2 * 68);
  const std::vector<int32_t> prompt = RandomTokens(45, 3, n_vocab(), 14);
  auto a = NewSession(*engine, Greedy(), 42);
  ASSERT_TRUE(a->AppendTokens(prompt).ok());
  ExpectSameContinuation(*a, *other_engine, SaveStateOptions(), Greedy(), 8);

  auto saved = a->SaveState();
  ASSERT_TRUE(saved.ok()) << saved.status();
  auto f16_engine = MakeEngine(*model_);
  auto b = NewSession(*f16_engine, Greedy());
  absl::Status st = b->LoadState(*saved);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("q8_0"), std::string::npos) << st;
  EXPECT_EQ(b->n_tokens(), 0);
  ASSERT_TRUE(b->AppendTokens(prompt).ok());
  auto f16_saved = b->SaveState();
  ASSERT_TRUE(f16_saved.ok());
  auto c = NewSession(*engine, Greedy());
  st = c->LoadState(*f16_saved);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("this cache holds q8_0"), std::string::npos) << st;
  SaveStateOptions tokens_only;
  tokens_only.kv = false;
  auto small = b->SaveState(tokens_only);
  ASSERT_TRUE(small.ok());
  EXPECT_TRUE(c->LoadState(*small).ok());
  EXPECT_EQ(c->n_tokens(), static_cast<int32_t>(prompt.size()));
}

TEST_F(TinyState, TokensOnlyRestoreAttachesCachedPrefix) {
  auto engine = MakeEngine(*model_);
  auto a = NewSession(*engine, Greedy());
  ASSERT_TRUE(a->AppendTokens(RandomTokens(70, 3, n_vocab(), 14)).ok());
  SaveStateOptions tokens_only;
  tokens_only.kv = false;
  auto small = a->SaveState(tokens_only);
  ASSERT_TRUE(small.ok());
  auto b = NewSession(*engine, Greedy());
  ASSERT_TRUE(b->LoadState(*small).ok());
  // 69 attachable tokens: 4 full blocks of 16 come from the prefix cache.
  EXPECT_EQ(b->stats().attached_tokens, 64);
  EXPECT_EQ(b->stats().computed_tokens, 6);
  EXPECT_EQ(Continue(*b, 6), Continue(*a, 6));
}

// ------------------------------------------------------------------ default model

class DefaultModelState : public kiln::testing::SpecModelTest {
 protected:
  static void SetUpTestSuite() { LoadDefaultModel(2048); }
  static void TearDownTestSuite() { FreeDefaultModel(); }
};

const std::string kCopyPrompt = kiln::testing::ChatPrompt(
    "Repeat this paragraph exactly: The committee met on Tuesday to review the budget. After a "
    "long discussion, the members agreed to increase funding for the library, reduce spending on "
    "travel, and postpone the new parking lot until next year.");

#if KILN_TEST_SANITIZED
constexpr int32_t kFirst = 8, kMore = 12;
#else
constexpr int32_t kFirst = 16, kMore = 32;
#endif

TEST_F(DefaultModelState, GreedyAndSeededContinuationsMatch) {
  for (bool kv : {true, false}) {
    for (bool sampled : {false, true}) {
      SCOPED_TRACE(kiln::StrCat(kv ? "K/V" : "tokens only", sampled ? ", sampled" : ", greedy"));
      sample::SamplerParams params = kiln::testing::GreedyParams();
      if (sampled) params = sample::SamplerParams{};  // llama.cpp's defaults, temperature 0.8
      auto a = NewSession(*engine_, params, 1234);
      ASSERT_TRUE(a->AppendText(kCopyPrompt, true, true).ok());
      Generate(*a, kFirst);
      SaveStateOptions options;
      options.kv = kv;
      auto saved = a->SaveState(options);
      ASSERT_TRUE(saved.ok()) << saved.status();
      auto saved_kv = a->SaveState();
      ASSERT_TRUE(saved_kv.ok()) << saved_kv.status();
      const std::vector<int32_t> expected = Continue(*a, kMore);
      auto b = NewSession(*engine_, kiln::testing::GreedyParams(), 5);
      ASSERT_TRUE(b->LoadState(*saved).ok());
      // The same K/V bits, also when recomputed from the tokens.
      auto restored_kv = b->SaveState();
      ASSERT_TRUE(restored_kv.ok()) << restored_kv.status();
      const state::SessionState want = Payload(*saved_kv), got = Payload(*restored_kv);
      ASSERT_EQ(got.kv().tiles_size(), want.kv().tiles_size());
      for (int t = 0; t < want.kv().tiles_size(); ++t) {
        EXPECT_TRUE(got.kv().tiles(t) == want.kv().tiles(t)) << "K/V tile " << t << " differs";
      }
      EXPECT_EQ(Continue(*b, kMore), expected);
    }
  }
}

TEST_F(DefaultModelState, NgramStrategyStateIsRestored) {
  spec::NgramParams np;
  np.fixed_pass_cost_beta = 0.25;  // deterministic draft lengths, so seeded text repeats
  sample::SamplerParams params;    // seeded sampling: the draft lengths change the random stream
  auto make = [&](const spec::NgramParams& p) {
    auto ngram = spec::NgramStrategy::Create(p);
    EXPECT_TRUE(ngram.ok());
    return std::move(*ngram);
  };
  auto strategy_a = make(np);
  auto a = NewSession(*engine_, params, 99);
  ASSERT_TRUE(a->AppendText(kCopyPrompt, true, true).ok());
  ASSERT_TRUE(a->SetStrategy(strategy_a.get()).ok());
  Generate(*a, kFirst);
  EXPECT_GT(a->spec_metrics().drafted, 0);
  auto saved = a->SaveState();
  ASSERT_TRUE(saved.ok()) << saved.status();
  const spec::PassCostModel::Snapshot cost = a->spec_cost_model()->snapshot();
  const std::string strategy_state = *strategy_a->SaveState();
  const size_t at_save = a->tokens().size();
  const std::vector<int32_t> expected = Continue(*a, kMore);

  auto strategy_b = make(np);
  auto b = NewSession(*engine_, kiln::testing::GreedyParams(), 5);
  ASSERT_TRUE(b->SetStrategy(strategy_b.get()).ok());
  ASSERT_TRUE(b->LoadState(*saved).ok());
  EXPECT_EQ(*strategy_b->SaveState(), strategy_state);
  ASSERT_NE(b->spec_cost_model(), nullptr);
  EXPECT_EQ(b->spec_cost_model()->snapshot().n1, cost.n1);
  EXPECT_EQ(b->spec_cost_model()->snapshot().t1, cost.t1);
  EXPECT_EQ(Continue(*b, kMore), expected);
  EXPECT_GT(b->spec_metrics().drafted, 0);

  // A strategy with other parameters is refused, naming the field; nothing changes.
  spec::NgramParams other = np;
  other.max_draft = 5;
  auto strategy_c = make(other);
  auto c = NewSession(*engine_, kiln::testing::GreedyParams(), 5);
  ASSERT_TRUE(c->SetStrategy(strategy_c.get()).ok());
  absl::Status st = c->LoadState(*saved);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("max_draft"), std::string::npos) << st;
  EXPECT_EQ(c->n_tokens(), 0);
  // Without a strategy the session restores and decodes plainly (greedy: the same text).
  ASSERT_TRUE(c->SetStrategy(nullptr).ok());
  EXPECT_TRUE(c->LoadState(*saved).ok());
  EXPECT_EQ(c->n_tokens(), static_cast<int32_t>(at_save));
}

// Rewound into its computed tokens, a speculating session holds no logits for its last token: it
// recomputes that token as the root of a speculative step. A state saved there without the K/V
// must continue the same way, not sample from logits the restore recomputed (which draws from the
// random stream differently).
TEST_F(DefaultModelState, NgramSessionRewoundIntoItsComputedTokens) {
  spec::NgramParams np;
  np.fixed_pass_cost_beta = 0.25;
  for (bool kv : {true, false}) {
    SCOPED_TRACE(kv ? "K/V" : "tokens only");
    auto strategy_a = std::move(*spec::NgramStrategy::Create(np));
    // A flat distribution: the random stream decides most tokens.
    sample::SamplerParams params;
    params.temperature = 1.5f;
    params.top_k = 0;
    params.top_p = 1.0f;
    params.min_p = 0.0f;
    auto a = NewSession(*engine_, params, 7);
    ASSERT_TRUE(a->SetStrategy(strategy_a.get()).ok());
    ASSERT_TRUE(a->AppendText(kCopyPrompt, true, true).ok());
    Generate(*a, kFirst);
    ASSERT_TRUE(a->Rewind(3).ok());
    SaveStateOptions options;
    options.kv = kv;
    auto saved = a->SaveState(options);
    ASSERT_TRUE(saved.ok()) << saved.status();
    const int64_t steps_before = a->spec_metrics().steps;
    const std::vector<int32_t> expected = Continue(*a, kMore);
    const int64_t steps = a->spec_metrics().steps - steps_before;
    auto strategy_b = std::move(*spec::NgramStrategy::Create(np));
    auto b = NewSession(*engine_, kiln::testing::GreedyParams(), 5);
    ASSERT_TRUE(b->SetStrategy(strategy_b.get()).ok());
    ASSERT_TRUE(b->LoadState(*saved).ok());
    const int64_t restored_before = b->spec_metrics().steps;
    EXPECT_EQ(Continue(*b, kMore), expected);
    // Every token of the continuation from a speculative step, as in the saved session.
    EXPECT_EQ(b->spec_metrics().steps - restored_before, steps);
  }
}

TEST_F(DefaultModelState, DraftModelStrategyCannotBeSavedUnlessLeftOut) {
  spec::DraftModelParams dp;
  dp.n_threads = 1;
  dp.n_ctx = 512;
  auto draft = spec::DraftModelStrategy::Create(*model_, model_->hparams().n_vocab, dp);
  ASSERT_TRUE(draft.ok()) << draft.status();
  auto a = NewSession(*engine_, kiln::testing::GreedyParams(), 1);
  ASSERT_TRUE(a->AppendText(kCopyPrompt, true, true).ok());
  ASSERT_TRUE(a->SetStrategy(draft->get()).ok());
  Generate(*a, 4);
  auto refused = a->SaveState();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(refused.status().message().find("draft"), std::string::npos) << refused.status();
  SaveStateOptions options;
  options.strategy = false;
  auto saved = a->SaveState(options);
  ASSERT_TRUE(saved.ok()) << saved.status();
  const std::vector<int32_t> expected = Continue(*a, 8);
  auto b = NewSession(*engine_, kiln::testing::GreedyParams(), 1);
  ASSERT_TRUE(b->LoadState(*saved).ok());
  EXPECT_EQ(Continue(*b, 8), expected);  // greedy: the same text with or without a strategy
}

}  // namespace
}  // namespace kiln
