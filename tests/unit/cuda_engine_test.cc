// Whole models on the CUDA backend against the CPU backend, and speculative decoding on the
// device. Every test needs a device and skips (with the reason) without one.
//
// Whole model: the CPU engine decodes greedily after a 40-token prompt; the CUDA engine is fed
// the same tokens (the prompt in one pass: the cuBLASLt GEMM path; then one-token passes: the
// GEMV path; then a 6-token pass: GEMV over several tokens). Every logits row is compared.
// Bounds: the two backends do not share their arithmetic (the CPU quantizes activations to
// 8 bits against Q8_0/Q4_1 weights as llama.cpp does, the device's GEMV multiplies f32
// activations and its GEMM f16 ones; attention sums in another order), so rows are compared
// relative to their spread (largest minus smallest logit): the largest difference of a row must
// stay under kMaxDiffOfSpread of it, and the device's argmax must be the CPU's wherever the CPU's
// top-two margin exceeds twice that row's largest difference (elsewhere it is a near-tie, and
// at most a fifth of the rows may be one). Measured on an H200: at most 2.2% of the spread
// (smollm2-135m's shape, Q4_K: 30 layers of random weights carry the 8-bit activations'
// difference furthest), at most 6 near-ties in 62 rows. A wrong kernel moves logits by the order
// of the spread itself. A MoE model's router turns the small differences into other experts at
// its near-ties, and such a token's logits move by a large part of the spread: for MoE models a
// tenth of the rows may leave the bound (the rule of the CPU's MoE goldens; measured: 2 of 62
// rows of tiny-deepseek2-moe at 12% and 27% of the spread, the others within 4.0%).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "lib/backend/cuda_loader.h"
#include "lib/common/status.h"
#include "lib/engine/engine.h"
#include "lib/spec/ngram_strategy.h"
#include "tests/common/session_util.h"
#include "tests/common/test_util.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// The largest logit difference allowed, as a fraction of the CPU row's spread.
constexpr float kMaxDiffOfSpread = 0.05f;

class CudaEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (GetCudaModule(&why) == nullptr) GTEST_SKIP() << "no CUDA device: " << why;
  }

  static std::unique_ptr<Engine> MakeEngine(const Model& model, BackendKind backend,
                                            GgmlType kv_type) {
    EngineOptions options;
    options.n_threads = 2;
    options.n_ctx = 256;
    options.kv_type = kv_type;
    options.backend = backend;
    std::unique_ptr<Engine> engine = testing::MakeEngine(model, options);
    if (engine != nullptr && backend == BackendKind::kCuda) {
      EXPECT_THAT(engine->BackendDescription(), StartsWith("cuda ("));
      // The weights went to the device (else every matmul would run on the embedded CPU).
      EXPECT_THAT(engine->BackendDescription(), Not(HasSubstr("weights 0.0 MiB")));
    }
    return engine;
  }
};

// Logits rows of one sequence: runs `tokens` through Prefill in passes of the given sizes,
// logits for every token.
std::vector<std::vector<float>> RunPasses(Engine& engine, const std::vector<int32_t>& tokens,
                                          const std::vector<int32_t>& pass_sizes) {
  const int64_t n_vocab = engine.model().hparams().n_vocab;
  std::vector<std::vector<float>> rows;
  const SeqId seq =
      engine.Locked([](KvCache& cache, ForwardPass&) { return cache.CreateSequence(); });
  size_t at = 0;
  for (int32_t size : pass_sizes) {
    PrefillRequest request;
    request.seq = seq;
    request.tokens = std::span<const int32_t>(tokens).subspan(at, size);
    request.logits_from = 0;
    request.on_logits = [&](int32_t, const float* logits) {
      rows.emplace_back(logits, logits + n_vocab);
    };
    const absl::Status status = engine.Prefill(request);
    EXPECT_TRUE(status.ok()) << status;
    if (!status.ok()) return {};
    at += size;
  }
  return rows;
}

int32_t Argmax(const std::vector<float>& row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

// Compares the device's rows with the CPU's (the file's bounds); prints the figures.
// moe: a tenth of the rows may leave the bound (the router's near-ties).
void ExpectRowsAgree(const std::vector<std::vector<float>>& cpu,
                     const std::vector<std::vector<float>>& gpu, bool moe,
                     const std::string& what) {
  ASSERT_EQ(cpu.size(), gpu.size());
  int off_bound = 0;
  float worst = 0.0f;
  int argmax_same = 0, near_ties = 0;
  for (size_t r = 0; r < cpu.size(); ++r) {
    const auto& c = cpu[r];
    const auto& g = gpu[r];
    ASSERT_EQ(c.size(), g.size());
    float diff = 0.0f;
    for (size_t i = 0; i < c.size(); ++i) diff = std::max(diff, std::fabs(c[i] - g[i]));
    const auto [lo, hi] = std::minmax_element(c.begin(), c.end());
    const float spread = *hi - *lo;
    worst = std::max(worst, diff / spread);
    if (diff > kMaxDiffOfSpread * spread) {
      ++off_bound;
      if (!moe)
        ADD_FAILURE() << what << " row " << r << ": difference " << diff << " > "
                      << kMaxDiffOfSpread << " x spread " << spread;
    }
    std::vector<float> sorted = c;
    std::nth_element(sorted.begin(), sorted.begin() + 1, sorted.end(), std::greater<float>());
    const float margin = sorted[0] - sorted[1];
    if (Argmax(c) == Argmax(g)) {
      ++argmax_same;
    } else if (margin <= 2 * diff) {
      ++near_ties;
    } else {
      ADD_FAILURE() << what << " row " << r << ": argmax " << Argmax(g) << " on the device, "
                    << Argmax(c) << " on the CPU (margin " << margin << ", difference " << diff
                    << ")";
    }
  }
  EXPECT_LE(near_ties * 5, static_cast<int>(cpu.size())) << what;
  EXPECT_LE(off_bound * 10, static_cast<int>(cpu.size())) << what << ": rows off the bound";
  std::printf(
      "[ figures  ] %s: %zu rows, largest difference %.2e of the spread, argmax equal in "
      "%d, near-ties %d\n",
      what.c_str(), cpu.size(), worst, argmax_same, near_ties);
}

// The CPU's greedy continuation of `prompt` (n_new tokens, one per pass; kiln-mkmodel's control
// tokens 0-2 excluded): the prompt followed by them.
std::vector<int32_t> CpuGreedy(Engine& cpu, std::vector<int32_t> tokens, int n_new) {
  const SeqId seq = cpu.Locked([](KvCache& cache, ForwardPass&) { return cache.CreateSequence(); });
  const int64_t n_vocab = cpu.model().hparams().n_vocab;
  size_t at = 0;
  for (int i = 0; i < n_new; ++i) {
    PrefillRequest request;
    request.seq = seq;
    request.tokens = std::span<const int32_t>(tokens).subspan(at);
    int32_t next = -1;
    request.on_logits = [&](int32_t, const float* logits) {
      next = static_cast<int32_t>(std::max_element(logits + 3, logits + n_vocab) - logits);
    };
    const absl::Status status = cpu.Prefill(request);
    EXPECT_TRUE(status.ok()) << status;
    if (!status.ok() || next < 0) return {};
    at = tokens.size();
    tokens.push_back(next);
  }
  return tokens;
}

struct ModelCase {
  const char* shape;
  const char* type;
  GgmlType kv_type;
};

TEST_F(CudaEngineTest, WholeModelMatchesCpu) {
  for (const ModelCase& c : {ModelCase{"tiny-llama-gqa", "q8_0", GgmlType::kF16},
                             ModelCase{"tiny-llama-gqa", "f16", GgmlType::kQ8_0},
                             ModelCase{"smollm2-135m", "q4_1", GgmlType::kF16},
                             ModelCase{"smollm2-135m", "q4_K", GgmlType::kF16},
                             ModelCase{"tiny-qwen2", "q8_0", GgmlType::kF16},
                             ModelCase{"tiny-deepseek2", "q8_0", GgmlType::kF16},
                             ModelCase{"tiny-deepseek2-moe", "q8_0", GgmlType::kF16}}) {
    const std::string what = StrCat(c.shape, " ", c.type, " weights, ",
                                    c.kv_type == GgmlType::kF16 ? "f16" : "q8_0", " cache");
    SCOPED_TRACE(what);
    std::unique_ptr<Model> model =
        testing::LoadRandomModel(c.shape, c.type, 7, StrCat("cuda-engine-", c.shape, ".gguf"));
    ASSERT_NE(model, nullptr);
    auto cpu = MakeEngine(*model, BackendKind::kCpu, c.kv_type);
    auto gpu = MakeEngine(*model, BackendKind::kCuda, c.kv_type);
    ASSERT_TRUE(cpu != nullptr && gpu != nullptr);

    const int64_t n_vocab = model->hparams().n_vocab;
    std::vector<int32_t> tokens =
        CpuGreedy(*cpu, testing::RandomTokens(40, 3, n_vocab, 5), /*n_new=*/16);
    ASSERT_EQ(tokens.size(), 56u);
    const auto tail = testing::RandomTokens(6, 3, n_vocab, 6);
    tokens.insert(tokens.end(), tail.begin(), tail.end());
    std::vector<int32_t> passes = {40};
    passes.insert(passes.end(), 16, 1);
    passes.push_back(6);
    const auto want = RunPasses(*cpu, tokens, passes);
    const auto got = RunPasses(*gpu, tokens, passes);
    ExpectRowsAgree(want, got, model->hparams().moe.n_expert > 0, what);
  }
}

// Greedy speculative decoding on the device: the n-gram strategy's output is plain decoding's on
// the same CUDA engine, and drafts were verified (a prompt that repeats itself, so the n-gram
// lookup finds candidates from the first step).
TEST_F(CudaEngineTest, SpeculativeGreedyEqualsPlainOnTheDevice) {
  std::unique_ptr<Model> model =
      testing::LoadRandomModel("tiny-llama-gqa", "q8_0", 7, "cuda-engine-spec.gguf");
  ASSERT_NE(model, nullptr);
  auto gpu = MakeEngine(*model, BackendKind::kCuda, GgmlType::kF16);
  ASSERT_NE(gpu, nullptr);
  std::vector<int32_t> prompt = testing::RandomTokens(24, 3, model->hparams().n_vocab, 9);
  prompt.insert(prompt.end(), prompt.begin(), prompt.end());

  auto ngram = spec::NgramStrategy::Create(spec::NgramParams{.adaptive = false});
  ASSERT_TRUE(ngram.ok()) << ngram.status();
  auto plain = testing::NewSession(*gpu, testing::Greedy());
  auto speculative = testing::NewSession(*gpu, testing::Greedy());
  ASSERT_TRUE(plain != nullptr && speculative != nullptr);
  ASSERT_TRUE(speculative->SetStrategy(ngram->get()).ok());
  GenerateOptions options;
  options.max_tokens = 48;
  for (Session* s : {plain.get(), speculative.get()}) {
    ASSERT_TRUE(s->AppendTokens(prompt).ok());
    auto r = s->Generate(options);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->n_tokens, 48);
  }
  EXPECT_EQ(speculative->tokens(), plain->tokens());
  const spec::SpecMetrics m = speculative->spec_metrics();
  EXPECT_GT(m.drafted, 0);
  std::printf("[ figures  ] n-gram on the device: drafted %lld, accepted %lld\n",
              static_cast<long long>(m.drafted), static_cast<long long>(m.accepted));
}

}  // namespace
}  // namespace kiln
