#include "tests/common/spec_test_util.h"

#include "lib/gguf/gguf_writer.h"
#include "lib/model/random_model.h"
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

void SpecModelTest::LoadTinyModel(const std::string& shape, int32_t n_ctx) {
  auto model_shape = RandomModelShapeByName(shape);
  ASSERT_TRUE(model_shape.ok()) << model_shape.status();
  RandomModelOptions options;
  options.shape = *model_shape;
  options.type = static_cast<uint32_t>(GgmlType::kF16);
  options.seed = 11;
  gguf::GgufWriter writer;
  ASSERT_TRUE(BuildRandomModel(options, &writer).ok());
  const std::string path = ::testing::TempDir() + "/spec-" + shape + ".gguf";
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

}  // namespace kiln::testing
