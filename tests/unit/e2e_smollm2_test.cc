// End-to-end check of kiln's engine against llama.cpp on the real default model
// (SmolLM2-135M-Instruct Q4_1): greedy continuations of raw and chat-templated prompts token by
// token, kiln's tokenizer and chat template against the prompts llama.cpp saw, and perplexity by
// llama-perplexity's method. Goldens: tests/data/golden/smollm2_{greedy,perplexity}.json, made by
// scripts/gen_llama_goldens.py (llama-cpp-python; its docstring describes both methods). Plus
// the logits of an all-f32 copy (kiln-quantize --type f32) against llama.cpp's on the same copy:
// tests/data/golden/smollm2_f32_logits.json.
//
// The rule: at most one prompt may diverge, and only where kiln's top two logits at the
// divergence are within 1e-3 of each other (a near-tie that a different summation order flips).
// Perplexity within 1% of llama.cpp's.
//
// Run time, release build, 2 threads: 116 s of CPU (4.8 min wall on the shared 2-core machine at
// load average 14; greedy ~30 s of CPU per KV type, perplexity over 14 chunks the most). Under
// sanitizers (ASan/UBSan: 1.9 min of CPU with the subset, 4.3 min wall at that load) or
// when KILN_QUICK=1 is set, a documented subset runs: every prompt's prompt tokens and
// template are still checked, but only the first 16 generated tokens of the first 4 prompts are
// compared, perplexity is computed over the first 2 chunks against the per-chunk running value
// llama.cpp printed for the same chunks (the golden's "running_perplexity"), and the f32 copy is
// checked on its first prompt only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "lib/model/model.h"
#include "lib/quant/requantize.h"
#include "lib/tokenizer/chat_template.h"
#include "lib/tokenizer/tokenizer.h"
#include "tests/common/e2e_fixture.h"
#include "tests/common/forward_util.h"
#include "tests/common/golden.h"
#include "tests/common/test_util.h"

namespace kiln {
namespace {

constexpr double kNearTie = 1e-3;

using testing::Json;
using testing::QuickMode;
using testing::ReadFile;
using testing::Top2;
using testing::TopTwo;

Json LoadGolden(const std::string& relative) {
  return testing::LoadGolden(relative, "scripts/gen_llama_goldens.py");
}

class E2eSmolLm2 : public testing::E2eModelTest {
 protected:
  static void SetUpTestSuite() { LoadModel(testing::DefaultModelPath(), "the default model"); }

  // 64 blocks of 16 = 1024 tokens: one perplexity chunk or one greedy case at a time.
  void MakeCache(GgmlType kv_type) { E2eModelTest::MakeCache(kv_type, 64); }

  // Perplexity by llama-perplexity's method (scripts/gen_llama_goldens.py docstring) over the
  // golden text's first n_chunk chunks, with a cache of kv_type.
  void Perplexity(GgmlType kv_type, int32_t n_chunk, double* ppl) {
    const Json golden = LoadGolden("tests/data/golden/smollm2_perplexity.json");
    ASSERT_GE(golden["n_text_tokens"].number, 4096);
    ASSERT_NO_FATAL_FAILURE(MakeCache(kv_type));
    ASSERT_NO_FATAL_FAILURE(ChunkPerplexity(golden, n_chunk, ppl));
  }

  // Greedy decoding of every golden prompt, compared token by token (the rule).
  // kiln runs in llama.cpp's order (Backend::set_llama_cpp_order), which reproduces its
  // arithmetic bit for bit, prompt batches included.
  void CheckGreedy(const std::string& golden_path, GgmlType kv_type) {
    ASSERT_NO_FATAL_FAILURE(MakeCache(kv_type));
    forward_->set_llama_cpp_order(true);
    const Json golden = LoadGolden(golden_path);
    ASSERT_EQ(golden["kv_type"].str, GgmlTypeName(static_cast<uint32_t>(kv_type)));
    const Json& cases = golden["cases"];
    ASSERT_GE(cases.items.size(), 10u);
    const int64_t n_vocab = model_->hparams().n_vocab;
    const size_t max_compare = QuickMode() ? 16 : SIZE_MAX;
    const size_t n_cases = QuickMode() ? 4 : cases.items.size();

    int fully_matched = 0, diverged = 0;
    size_t compared_tokens = 0;
    double max_top1_diff = 0;  // |kiln - llama.cpp| of the chosen token's logit, while in step
    for (size_t c = 0; c < n_cases; ++c) {
      const Json& tc = cases.items[c];
      const std::vector<int32_t> prompt = tc["prompt_ids"].Ints();
      const std::vector<int32_t> expected = tc["generated_ids"].Ints();
      const size_t n_compare = std::min(expected.size(), max_compare);
      ASSERT_FALSE(prompt.empty());

      const SeqId seq = cache_->CreateSequence();
      ForwardOutput out;
      const int32_t n_prompt = static_cast<int32_t>(prompt.size());
      ASSERT_TRUE(Run(seq, prompt, 0, n_prompt - 1, &out).ok());
      bool matched = true;
      for (size_t step = 0; step < n_compare; ++step) {
        ASSERT_EQ(out.logit_tokens.size(), 1u);
        const Top2 kiln = TopTwo(out.LogitsRow(0), n_vocab);
        const Json& llama_ids = tc["top2_ids"].items[step];
        const Json& llama_logits = tc["top2_logits"].items[step];
        ++compared_tokens;
        if (kiln.id[0] != expected[step]) {
          matched = false;
          ++diverged;
          const double kiln_gap = kiln.logit[0] - kiln.logit[1];
          std::printf(
              "case %zu (%s) diverges at generated token %zu: kiln top-2 %d (%.6f), %d (%.6f), gap "
              "%.6f; llama.cpp top-2 %d (%.6f), %d (%.6f), gap %.6f\n",
              c, tc["user_text"].str.c_str(), step, kiln.id[0], kiln.logit[0], kiln.id[1],
              kiln.logit[1], kiln_gap, static_cast<int>(llama_ids.items[0].number),
              llama_logits.items[0].number, static_cast<int>(llama_ids.items[1].number),
              llama_logits.items[1].number,
              llama_logits.items[0].number - llama_logits.items[1].number);
          EXPECT_LE(kiln_gap, kNearTie)
              << "case " << c << " diverges at token " << step << " without a near-tie";
          break;
        }
        max_top1_diff =
            std::max(max_top1_diff, std::abs(kiln.logit[0] - llama_logits.items[0].number));
        if (step + 1 == n_compare) break;
        const int32_t token = expected[step];
        ASSERT_TRUE(
            Run(seq, std::span(&token, 1), n_prompt + static_cast<int32_t>(step), 0, &out).ok());
      }
      if (matched) ++fully_matched;
      ASSERT_TRUE(cache_->Free(seq).ok());
    }
    std::printf(
        "greedy, KV cache %s on both sides: %d of %zu prompts match llama.cpp fully (%zu tokens "
        "compared%s), %d diverged; max "
        "|kiln - llama.cpp| of the chosen logit %.4f\n",
        golden["kv_type"].str.c_str(), fully_matched, n_cases, compared_tokens,
        QuickMode() ? ", quick mode: first 16 per prompt" : "", diverged, max_top1_diff);
    EXPECT_LE(diverged, 1) << "at most one prompt may diverge (at a near-tie)";
  }
};

TEST_F(E2eSmolLm2, PromptsTokenizeAndTemplateLikeLlamaCpp) {
  const Json golden = LoadGolden("tests/data/golden/smollm2_greedy.json");
  const Json& cases = golden["cases"];
  ASSERT_GE(cases.items.size(), 10u);
  int templated = 0;
  for (size_t c = 0; c < cases.items.size(); ++c) {
    const Json& tc = cases.items[c];
    SCOPED_TRACE("case " + std::to_string(c) + ": " + tc["user_text"].str);
    if (tc["templated"].boolean) {
      ++templated;
      const ChatMessage message{"user", tc["user_text"].str};
      auto rendered =
          ApplyChatTemplate(model_->chat_template(), std::span(&message, 1),
                            /*add_generation_prompt=*/true, {"<|im_start|>", "<|im_end|>"});
      ASSERT_TRUE(rendered.ok()) << rendered.status();
      EXPECT_EQ(*rendered, tc["prompt"].str);
    }
    auto ids = model_->tokenizer().Encode(tc["prompt"].str, /*add_special=*/true,
                                          /*parse_special=*/tc["templated"].boolean);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, tc["prompt_ids"].Ints());
  }
  EXPECT_GE(templated, 5);
  EXPECT_GE(static_cast<int>(cases.items.size()) - templated, 5);
}

// The rule: at most one prompt may diverge from llama.cpp, and only at a near-tie.
// llama.cpp with an f32 KV cache; kiln in llama.cpp order (Backend::set_llama_cpp_order),
// which reproduces llama.cpp's arithmetic bit for bit, including its prompt-batch V . P order.
TEST_F(E2eSmolLm2, GreedyMatchesLlamaCppWithF32KvCache) {
  CheckGreedy("tests/data/golden/smollm2_greedy_kv_f32.json", GgmlType::kF32);
}

// llama.cpp's default: an f16 KV cache, with which it rounds q (for K.q) and the softmax
// weights (for V.p) to f16 and runs both products through ggml_vec_dot_f16 (one-token batches)
// or tinyBLAS f16 (prompt batches); kiln does the same for an f16 cache.
TEST_F(E2eSmolLm2, GreedyMatchesLlamaCppWithF16KvCache) {
  CheckGreedy("tests/data/golden/smollm2_greedy.json", GgmlType::kF16);
}

// Tree verification on the real model: each node's logits equal, bit for bit, those of its
// root-to-node path evaluated causally (attention numbers the visible rows like a chain).
TEST_F(E2eSmolLm2, TreeNodesEqualTheirPathsBitwise) {
  ASSERT_NO_FATAL_FAILURE(MakeCache(GgmlType::kF16));
  auto ids = model_->tokenizer().Encode("The quick brown fox jumps over the lazy dog because", true,
                                        false);
  ASSERT_TRUE(ids.ok());
  const std::vector<int32_t> prompt = *ids;
  const int32_t n = static_cast<int32_t>(prompt.size());
  const int64_t V = model_->hparams().n_vocab;
  const SeqId seq = cache_->CreateSequence();
  ForwardOutput out;
  ASSERT_TRUE(Run(seq, std::span(prompt).first(n - 1), 0, n, &out).ok());
  // Tree: root r = the prompt's last token (causal, position n - 1); a, b children of r; c child
  // of a; d child of c. Cache order r a b c d.
  const int32_t r = prompt.back();
  const std::vector<int32_t> tree = {r, 253, 314, 260, 1234};
  const std::vector<int32_t> parent = {-1, 0, 0, 1, 3};
  const std::vector<int32_t> depth = {0, 1, 1, 2, 3};
  ASSERT_TRUE(cache_->AppendSlots(seq, tree).ok());
  ForwardBatch batch;
  for (size_t i = 0; i < tree.size(); ++i) {
    batch.Add(tree[i], seq, n - 1 + depth[i], true, parent[i], n - 1 + static_cast<int32_t>(i));
  }
  ForwardOutput tree_out;
  ASSERT_TRUE(forward_->Forward(batch, *cache_, &tree_out).ok());
  const std::vector<std::vector<int32_t>> paths = {
      {r}, {r, 253}, {r, 314}, {r, 253, 260}, {r, 253, 260, 1234}};
  for (size_t node = 0; node < paths.size(); ++node) {
    const SeqId chain = cache_->CreateSequence();
    std::vector<int32_t> full(prompt.begin(), prompt.end() - 1);
    full.insert(full.end(), paths[node].begin(), paths[node].end());
    ForwardOutput causal;
    ASSERT_TRUE(Run(chain, full, 0, static_cast<int32_t>(full.size()) - 1, &causal).ok());
    EXPECT_EQ(0, std::memcmp(tree_out.LogitsRow(node), causal.LogitsRow(0), V * sizeof(float)))
        << "tree node " << node;
    ASSERT_TRUE(cache_->Free(chain).ok());
  }
}

// The forward pass without quantized arithmetic: an all-f32 copy of the default model written
// by kiln's requantizer, KV f32 on both sides. llama.cpp then rounds nothing either (f32 weights
// take f32 activations), so the logits must agree to float rounding (measured max 5e-5).
TEST_F(E2eSmolLm2, F32CopyLogitsMatchLlamaCpp) {
  const Json golden = LoadGolden("tests/data/golden/smollm2_f32_logits.json");
  ASSERT_FALSE(golden["cases"].items.empty());
  const std::string f32_path = testing::TempDir() + "/smollm2-f32.gguf";
  RequantizeOptions requantize;
  requantize.target = GgmlType::kF32;
  ASSERT_TRUE(RequantizeFile(testing::DefaultModelPath(), f32_path, requantize).ok());
  ModelLoadOptions options;
  options.path = f32_path;
  auto model = Model::Load(options);
  std::filesystem::remove(f32_path);  // ~540 MB; the mapping keeps the data alive
  ASSERT_TRUE(model.ok()) << model.status();
  CpuForward forward(**model, kThreads);
  auto layout = CpuForward::CacheLayout((*model)->hparams(), GgmlType::kF32, 16);
  ASSERT_TRUE(layout.ok()) << layout.status();
  KvCacheOptions cache_options;
  cache_options.num_blocks = 16;
  auto cache = KvCache::Create(*layout, cache_options);
  ASSERT_TRUE(cache.ok()) << cache.status();

  const size_t n_cases = QuickMode() ? 1 : golden["cases"].items.size();
  double max_diff = 0;
  size_t positions = 0;
  for (size_t c = 0; c < n_cases; ++c) {
    const Json& tc = golden["cases"].items[c];
    const std::vector<int32_t> ids = tc["ids"].Ints();
    const SeqId seq = (*cache)->CreateSequence();
    ASSERT_TRUE((*cache)->AppendSlots(seq, ids).ok());
    ForwardBatch batch;
    for (size_t i = 0; i < ids.size(); ++i) batch.Add(ids[i], seq, static_cast<int32_t>(i), true);
    ForwardOutput out;
    ASSERT_TRUE(forward.Forward(batch, **cache, &out).ok());
    ASSERT_EQ(out.logit_tokens.size(), ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      const float* row = out.LogitsRow(i);  // [n_vocab]
      const std::vector<int32_t> top = tc["top5_ids"].items[i].Ints();
      EXPECT_EQ(TopTwo(row, out.n_vocab).id[0], top[0]) << "case " << c << " position " << i;
      for (size_t k = 0; k < top.size(); ++k) {
        const double diff = std::abs(row[top[k]] - tc["top5_logits"].items[i].items[k].number);
        max_diff = std::max(max_diff, diff);
        EXPECT_LE(diff, 1e-3) << "case " << c << " position " << i << " token " << top[k];
      }
      ++positions;
    }
    ASSERT_TRUE((*cache)->Free(seq).ok());
  }
  std::printf(
      "f32 copy: %zu positions, same argmax everywhere expected; max |kiln - llama.cpp| "
      "over the top-5 logits %.2e\n",
      positions, max_diff);
}

TEST_F(E2eSmolLm2, PerplexityWithinOnePercentOfLlamaCpp) {
  const Json golden = LoadGolden("tests/data/golden/smollm2_perplexity.json");
  const int32_t n_chunk_all = static_cast<int32_t>(golden["n_chunks"].number);
  const int32_t n_chunk = QuickMode() ? 2 : n_chunk_all;
  double kiln_ppl = 0;
  // llama-perplexity's default cache type.
  ASSERT_NO_FATAL_FAILURE(Perplexity(GgmlType::kF16, n_chunk, &kiln_ppl));
  double llama_ppl = golden["perplexity"].number;
  if (n_chunk < n_chunk_all) {
    const Json& running = golden["running_perplexity"];
    ASSERT_GE(running.items.size(), static_cast<size_t>(n_chunk));
    llama_ppl = running.items[n_chunk - 1].number;
  }
  std::printf("kiln %.4f, llama.cpp %.4f, ratio %.5f\n", kiln_ppl, llama_ppl, kiln_ppl / llama_ppl);
  EXPECT_NEAR(kiln_ppl / llama_ppl, 1.0, 0.01);
}

// A q8_0 K/V cache against the f16 one on the first two chunks (1,024 tokens, 510 scored):
// within 0.5% (the target; measured +0.27% on these chunks). Not in quick mode
// (sanitizers), as e2e_gemma3_test's.
TEST_F(E2eSmolLm2, Q8_0KvCachePerplexityWithinHalfAPercentOfF16) {
  if (QuickMode()) GTEST_SKIP() << "quick mode: q8_0 perplexity runs in the release tests";
  double f16_ppl = 0, q8_0_ppl = 0;
  ASSERT_NO_FATAL_FAILURE(Perplexity(GgmlType::kF16, 2, &f16_ppl));
  ASSERT_NO_FATAL_FAILURE(Perplexity(GgmlType::kQ8_0, 2, &q8_0_ppl));
  std::printf("q8_0 / f16 cache perplexity: %.5f\n", q8_0_ppl / f16_ppl);
  EXPECT_NE(q8_0_ppl, f16_ppl);  // the cache type reached the kernels
  EXPECT_NEAR(q8_0_ppl / f16_ppl, 1.0, 0.005);
}

}  // namespace
}  // namespace kiln
