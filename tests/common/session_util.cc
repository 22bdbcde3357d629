#include "tests/common/session_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <utility>

namespace kiln::testing {

std::unique_ptr<Engine> MakeEngine(const Model& model, EngineOptions options) {
  if (options.n_threads == 0) options.n_threads = 2;
  auto engine = Engine::Create(model, options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(*engine) : nullptr;
}

std::unique_ptr<Session> NewSession(Engine& engine, const sample::SamplerParams& params,
                                    uint64_t seed) {
  auto s = Session::Create(engine, params, seed);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

sample::SamplerParams Greedy(bool ban_control) {
  sample::SamplerParams p;
  p.temperature = 0.0f;
  if (ban_control) {
    for (int32_t t = 0; t < 3; ++t) p.logit_bias.push_back({t, -INFINITY});
  }
  return p;
}

}  // namespace kiln::testing
