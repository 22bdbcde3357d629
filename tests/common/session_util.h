// Helpers of the tests that drive sessions over an engine (session, session_state, scheduler):
// an engine and a session whose creation failing fails the test instead of crashing it.
#pragma once

#include <cstdint>
#include <memory>

#include "lib/engine/engine.h"
#include "lib/model/model.h"
#include "lib/sample/sampler.h"
#include "lib/session/session.h"

namespace kiln::testing {

// An Engine on `model` (2 threads unless options.n_threads says otherwise); nullptr, with a test
// failure, when Engine::Create refuses.
std::unique_ptr<Engine> MakeEngine(const Model& model, EngineOptions options = {});

// A session of `engine`; nullptr, with a test failure, when Session::Create refuses.
std::unique_ptr<Session> NewSession(Engine& engine, const sample::SamplerParams& params,
                                    uint64_t seed = 1);

}  // namespace kiln::testing
