#include "tests/common/spec_test_util.h"

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

void SpecModelTest::LoadDefaultModel(int32_t n_ctx) {
  ModelLoadOptions load;
  load.path = DefaultModelPath();
  auto model = Model::Load(load);
  ASSERT_TRUE(model.ok()) << model.status();
  model_ = model->release();
  EngineOptions options;
  options.n_threads = 2;
  options.n_ctx = n_ctx;
  auto engine = Engine::Create(*model_, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  engine_ = engine->release();
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

std::vector<int32_t> SpecModelTest::PlainGreedy(std::span<const int32_t> prompt,
                                                int32_t max_tokens) {
  auto session = Session::Create(*engine_, GreedyParams(), 1);
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
