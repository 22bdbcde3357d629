// Helpers of the tests that drive sessions over an engine (session, session_state, scheduler):
// an engine and a session whose creation failing fails the test instead of crashing it, a fixture
// holding a model per suite.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>

#include "lib/engine/engine.h"
#include "lib/model/model.h"
#include "lib/sample/sampler.h"
#include "lib/session/session.h"
#include "tests/common/test_util.h"

namespace kiln::testing {

// An Engine on `model` (2 threads unless options.n_threads says otherwise); nullptr, with a test
// failure, when Engine::Create refuses.
std::unique_ptr<Engine> MakeEngine(const Model& model, EngineOptions options = {});

// A session of `engine`; nullptr, with a test failure, when Session::Create refuses.
std::unique_ptr<Session> NewSession(Engine& engine, const sample::SamplerParams& params,
                                    uint64_t seed = 1);

// Greedy decoding; with ban_control the control tokens of kiln-mkmodel's tiny vocabularies (ids
// 0-2) are banned, so that random logits never end a generation early.
sample::SamplerParams Greedy(bool ban_control = true);

// A fixture base holding one model for its whole suite (Suite: the deriving class, so that each
// suite has a model of its own). The suite's SetUpTestSuite sets model_; it is deleted after the
// suite.
template <typename Suite>
class SuiteModelTest : public ::testing::Test {
 protected:
  // model_ = the default model (a fatal failure of the suite's setup when it cannot load).
  static void LoadDefaultModel() {
    ModelLoadOptions load;
    load.path = DefaultModelPath();
    auto model = Model::Load(load);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = model->release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  static inline Model* model_ = nullptr;
};

}  // namespace kiln::testing
