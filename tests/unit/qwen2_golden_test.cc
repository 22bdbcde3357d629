// kiln's qwen2 architecture (lib/model/arch/qwen2.cc: Q/K/V biases, NEOX RoPE) against llama.cpp
// on random-weight qwen2 models: tiny-qwen2 (tied output) and tiny-qwen2-untied, each at f32,
// f16 and q8_0, each with llama.cpp's KV cache in f32 and in f16. The golden
// (tests/data/golden/qwen2_greedy.json, written by scripts/gen_qwen2_goldens.py with
// llama-cpp-python from kiln-mkmodel's files) holds llama.cpp's prompt ids, 32 greedy tokens per
// prompt and the top-2 logits at each step. This test regenerates the same files through the
// library (same shape, type and seed; their size and FNV-1a hash must equal what llama.cpp
// loaded), then, feeding llama.cpp's tokens back one at a time after the prompt's single batch:
//   - kiln's tokenizer gives llama.cpp's prompt ids;
//   - in llama.cpp's order (Backend::set_llama_cpp_order) kiln's logits of llama.cpp's top two
//     tokens equal llama.cpp's bit for bit at every step, and kiln's greedy token is llama.cpp's;
//   - in kiln's own order (the default, batch invariant, other summation orders) those logits are
//     within the weight type's KilnOrderTolerance of llama.cpp's, and kiln's greedy token is
//     llama.cpp's wherever llama.cpp's top two are further apart than twice that.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "lib/gguf/file_type.h"
#include "lib/gguf/gguf_writer.h"
#include "lib/model/model.h"
#include "lib/model/random_model.h"
#include "lib/tokenizer/tokenizer.h"
#include "tests/common/forward_util.h"
#include "tests/common/golden.h"
#include "tests/common/test_util.h"

namespace kiln {
namespace {

using testing::Json;
using testing::Top2;
using testing::TopTwo;

constexpr int kThreads = 2;
constexpr char kGolden[] = "tests/data/golden/qwen2_greedy.json";
// kiln's order vs llama.cpp's: the bound on |kiln - llama.cpp| of the logits of llama.cpp's top
// two tokens (logits here are about 1 to 4). Measured maxima over the golden: f32 5.4e-4 (f16 KV),
// f16 1.9e-3, q8_0 4.1e-2 (the 8-bit activations turn last-bit differences into roundings to
// the neighbouring integer).
double KilnOrderTolerance(const std::string& weight_type) {
  if (weight_type == "f32") return 2e-3;
  if (weight_type == "f16") return 5e-3;
  return 0.1;  // q8_0
}

uint64_t Fnv1a64(const std::string& bytes) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001B3ull;
  return h;
}

struct GoldenModel {
  std::string label;  // "tiny-qwen2 q8_0"
  const Json* entry = nullptr;
  std::unique_ptr<Model> model;
};

// One kv type's comparison over every prompt of one model.
struct RunSummary {
  size_t tokens = 0;
  int argmax_mismatches = 0;
  double max_logit_diff = 0;
};

class Qwen2Golden : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    golden_ = new Json(testing::LoadGolden(kGolden, "scripts/gen_qwen2_goldens.py"));
    models_ = new std::vector<GoldenModel>();
    for (const Json& entry : (*golden_)["models"].items) {
      GoldenModel m;
      m.label = entry["shape"].str + " " + entry["type"].str;
      m.entry = &entry;
      auto shape = RandomModelShapeByName(entry["shape"].str);
      ASSERT_TRUE(shape.ok()) << shape.status();
      auto type = gguf::WeightTypeByName(entry["type"].str);
      ASSERT_TRUE(type.ok()) << type.status();
      RandomModelOptions options;
      options.shape = *shape;
      options.type = *type;
      options.seed = static_cast<uint64_t>(entry["seed"].number);
      gguf::GgufWriter writer;
      ASSERT_TRUE(BuildRandomModel(options, &writer).ok()) << m.label;
      const std::string path =
          testing::TempDir() + "/" + entry["shape"].str + "-" + entry["type"].str + ".gguf";
      ASSERT_TRUE(writer.WriteToFile(path).ok()) << m.label;
      const std::string bytes = testing::ReadFile(path);
      char hash[17];
      std::snprintf(hash, sizeof(hash), "%016llx", static_cast<unsigned long long>(Fnv1a64(bytes)));
      // The generator must still write the file llama.cpp saw; otherwise the golden is stale.
      ASSERT_EQ(static_cast<double>(bytes.size()), entry["file_bytes"].number)
          << m.label << ": kiln-mkmodel's output changed; rerun scripts/gen_qwen2_goldens.py";
      ASSERT_EQ(std::string(hash), entry["file_fnv1a64"].str)
          << m.label << ": kiln-mkmodel's output changed; rerun scripts/gen_qwen2_goldens.py";
      ModelLoadOptions load;
      load.path = path;
      auto model = Model::Load(load);
      ASSERT_TRUE(model.ok()) << m.label << ": " << model.status();
      ASSERT_EQ((*model)->architecture().name(), "qwen2");
      m.model = std::move(*model);
      models_->push_back(std::move(m));
    }
  }
  static void TearDownTestSuite() {
    delete models_;
    models_ = nullptr;
    delete golden_;
    golden_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(models_, nullptr);
    ASSERT_EQ(models_->size(), 6u) << "2 shapes x 3 types expected in " << kGolden;
  }

  // Greedy decoding of every prompt of `run` (one kv type) on `m`, fed llama.cpp's tokens.
  // llama_cpp_order: logits bit for bit and every argmax llama.cpp's; otherwise logits within
  // `tolerance` and the argmax llama.cpp's where its top two are further apart than 2 * tolerance.
  static RunSummary CheckRun(const GoldenModel& m, const Json& run, bool llama_cpp_order,
                             double tolerance) {
    RunSummary summary;
    const std::string& kv_name = run["kv_type"].str;
    EXPECT_TRUE(kv_name == "f32" || kv_name == "f16") << kv_name;
    const GgmlType kv_type = kv_name == "f16" ? GgmlType::kF16 : GgmlType::kF32;
    auto layout = CpuForward::CacheLayout(m.model->hparams(), kv_type, 16);
    EXPECT_TRUE(layout.ok()) << layout.status();
    if (!layout.ok()) return summary;
    KvCacheOptions cache_options;
    cache_options.num_blocks = 8;  // 128 tokens: one prompt and its continuation at a time
    auto cache = KvCache::Create(*layout, cache_options);
    EXPECT_TRUE(cache.ok()) << cache.status();
    if (!cache.ok()) return summary;
    CpuForward forward(*m.model, kThreads);
    forward.set_llama_cpp_order(llama_cpp_order);
    const int64_t n_vocab = m.model->hparams().n_vocab;

    const Json& cases = run["cases"];
    EXPECT_GE(cases.items.size(), 3u);
    for (size_t c = 0; c < cases.items.size(); ++c) {
      const Json& tc = cases.items[c];
      SCOPED_TRACE(m.label + ", KV " + kv_name + ", " +
                   (llama_cpp_order ? "llama.cpp order" : "kiln order") + ", prompt " +
                   std::to_string(c));
      const std::vector<int32_t> prompt = tc["prompt_ids"].Ints();
      const std::vector<int32_t> expected = tc["generated_ids"].Ints();
      EXPECT_FALSE(prompt.empty());
      EXPECT_EQ(expected.size(), tc["top2_ids"].items.size());
      if (prompt.empty() || expected.size() != tc["top2_ids"].items.size()) continue;

      const SeqId seq = (*cache)->CreateSequence();
      EXPECT_TRUE((*cache)->AppendSlots(seq, prompt).ok());
      // The whole prompt in one batch, the last token's logits only, as llama.cpp evaluated it.
      ForwardBatch batch;
      const int32_t n_prompt = static_cast<int32_t>(prompt.size());
      for (int32_t i = 0; i < n_prompt; ++i) batch.Add(prompt[i], seq, i, i == n_prompt - 1);
      ForwardOutput out;
      const absl::Status prompt_status = forward.Forward(batch, **cache, &out);
      EXPECT_TRUE(prompt_status.ok()) << prompt_status;
      if (!prompt_status.ok()) return summary;
      for (size_t step = 0; step < expected.size(); ++step) {
        EXPECT_EQ(out.logit_tokens.size(), 1u);
        const float* row = out.LogitsRow(0);  // [n_vocab]
        const Top2 kiln = TopTwo(row, n_vocab);
        const std::vector<int32_t> llama_ids = tc["top2_ids"].items[step].Ints();
        const Json& llama_logits = tc["top2_logits"].items[step];
        for (int k = 0; k < 2; ++k) {
          const double diff = std::abs(row[llama_ids[k]] - llama_logits.items[k].number);
          summary.max_logit_diff = std::max(summary.max_logit_diff, diff);
          if (llama_cpp_order) {
            EXPECT_EQ(static_cast<double>(row[llama_ids[k]]), llama_logits.items[k].number)
                << "step " << step << ", token " << llama_ids[k];
          } else {
            EXPECT_LE(diff, tolerance) << "step " << step << ", token " << llama_ids[k];
          }
        }
        const double llama_gap = llama_logits.items[0].number - llama_logits.items[1].number;
        if (kiln.id[0] != expected[step]) {
          ++summary.argmax_mismatches;
          std::printf(
              "%s, KV %s, %s, prompt %zu, step %zu: kiln chose %d (%.6f), llama.cpp %d "
              "(%.6f; its top two %.6f apart)\n",
              m.label.c_str(), kv_name.c_str(), llama_cpp_order ? "llama.cpp order" : "kiln order",
              c, step, kiln.id[0], kiln.logit[0], expected[step], llama_logits.items[0].number,
              llama_gap);
          if (llama_cpp_order || llama_gap > 2 * tolerance) {
            ADD_FAILURE() << "step " << step << ": kiln's greedy token " << kiln.id[0]
                          << " is not llama.cpp's " << expected[step];
          }
        }
        ++summary.tokens;
        if (step + 1 == expected.size()) break;
        const int32_t token = expected[step];
        const int32_t pos = n_prompt + static_cast<int32_t>(step);
        EXPECT_TRUE((*cache)->AppendSlots(seq, std::span(&token, 1)).ok());
        ForwardBatch next;
        next.Add(token, seq, pos, true);
        const absl::Status st = forward.Forward(next, **cache, &out);
        EXPECT_TRUE(st.ok()) << st;
        if (!st.ok()) return summary;
      }
      EXPECT_TRUE((*cache)->Free(seq).ok());
    }
    return summary;
  }

  // Runs CheckRun over every model and kv type and prints one line per run.
  static void CheckAll(bool llama_cpp_order) {
    size_t tokens = 0;
    int mismatches = 0;
    for (const GoldenModel& m : *models_) {
      const Json& runs = (*m.entry)["runs"];
      EXPECT_EQ(runs.items.size(), 2u) << m.label;
      for (const Json& run : runs.items) {
        const double tolerance = llama_cpp_order ? 0.0 : KilnOrderTolerance((*m.entry)["type"].str);
        const RunSummary s = CheckRun(m, run, llama_cpp_order, tolerance);
        std::printf(
            "%-24s KV %s, %s: %zu tokens, %d argmax differences, max |kiln - llama.cpp| "
            "of llama.cpp's top-2 logits %.2e\n",
            m.label.c_str(), run["kv_type"].str.c_str(),
            llama_cpp_order ? "llama.cpp order" : "kiln order", s.tokens, s.argmax_mismatches,
            s.max_logit_diff);
        tokens += s.tokens;
        mismatches += s.argmax_mismatches;
      }
    }
    EXPECT_GE(tokens, 6u * 2u * 3u * 32u);
    if (llama_cpp_order) {
      EXPECT_EQ(mismatches, 0);
    }
  }

  static Json* golden_;
  static std::vector<GoldenModel>* models_;
};
Json* Qwen2Golden::golden_ = nullptr;
std::vector<GoldenModel>* Qwen2Golden::models_ = nullptr;

TEST_F(Qwen2Golden, PromptsTokenizeLikeLlamaCpp) {
  for (const GoldenModel& m : *models_) {
    for (const Json& run : (*m.entry)["runs"].items) {
      for (const Json& tc : run["cases"].items) {
        auto ids = m.model->tokenizer().Encode(tc["prompt"].str, /*add_special=*/true,
                                               /*parse_special=*/false);
        ASSERT_TRUE(ids.ok()) << ids.status();
        EXPECT_EQ(*ids, tc["prompt_ids"].Ints()) << m.label << ": " << tc["prompt"].str;
      }
    }
  }
}

TEST_F(Qwen2Golden, GreedyMatchesLlamaCppInLlamaCppOrder) { CheckAll(/*llama_cpp_order=*/true); }

TEST_F(Qwen2Golden, KilnOrderAgreesWithLlamaCpp) { CheckAll(/*llama_cpp_order=*/false); }

}  // namespace
}  // namespace kiln
