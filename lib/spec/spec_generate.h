// GenerateSpeculative: a self-contained generation loop over the SpeculativeDecoder, for tests,
// benchmarks and tools that do not need a Session (sessions use the decoder directly).
//
// It creates a sequence in the engine's cache, computes prompt[0, n - 1) in chunks (the last
// prompt token is the first root; that first step is plain for strategies that draft from target
// features, as in a session), then runs decoder steps until max_tokens tokens, an
// end-of-generation token (kept, like Session::Generate), or the engine's n_ctx. The sequence is
// freed at the end. With strategy == nullptr it is plain decoding, one token per target pass.
//
// Thread-safety: as the decoder (the engine serializes cache and forward calls).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "lib/engine/engine.h"
#include "lib/engine/speculative_decoder.h"
#include "lib/engine/strategy.h"
#include "lib/sample/sampler.h"

namespace kiln::spec {

struct SpecGenerateResult {
  std::vector<int32_t> tokens;  // generated tokens only
  bool end_of_generation = false;
  SpecMetrics metrics;
  double decode_seconds = 0.0;      // wall time of the decoding steps (prefill excluded)
  double decode_cpu_seconds = 0.0;  // process CPU time (all threads) of the same steps
  double pass_cost_beta = 0.0;      // the decoder's cost slope at the end (draft_policy.h)
};

// Errors: InvalidArgument (empty prompt, max_tokens < 0, a token id out of range naming its
// index, bad sampler parameters), OutOfRange (prompt longer than n_ctx), cache, strategy and
// sampler errors. `cost` (optional) carries the measured pass cost across calls, as a session
// does: the decoder starts from *cost and writes its state back at the end.
absl::StatusOr<SpecGenerateResult> GenerateSpeculative(
    Engine& engine, std::span<const int32_t> prompt, const sample::SamplerParams& params,
    uint64_t seed, Strategy* strategy, int32_t max_tokens, PassCostModel* cost = nullptr);

}  // namespace kiln::spec
