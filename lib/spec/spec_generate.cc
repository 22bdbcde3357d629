#include "lib/spec/spec_generate.h"

#include <algorithm>
#include <chrono>

#include "lib/common/platform.h"

namespace kiln::spec {

absl::StatusOr<SpecGenerateResult> GenerateSpeculative(Engine& engine,
                                                       std::span<const int32_t> prompt,
                                                       const sample::SamplerParams& params,
                                                       uint64_t seed, Strategy* strategy,
                                                       int32_t max_tokens, PassCostModel* cost) {
  if (prompt.empty()) return absl::InvalidArgumentError("GenerateSpeculative: empty prompt");
  if (max_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("GenerateSpeculative: max_tokens ", max_tokens, " < 0"));
  }
  const int64_t n_vocab = engine.model().hparams().n_vocab;
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= n_vocab) {
      return absl::InvalidArgumentError(absl::StrCat("GenerateSpeculative: prompt token ",
                                                     prompt[i], " at index ", i, " is outside [0, ",
                                                     n_vocab, ")"));
    }
  }
  if (static_cast<int64_t>(prompt.size()) > engine.n_ctx()) {
    return absl::OutOfRangeError(absl::StrCat("GenerateSpeculative: prompt of ", prompt.size(),
                                              " tokens passes n_ctx = ", engine.n_ctx()));
  }
  KILN_RETURN_IF_ERROR(sample::Sampler::Validate(params));
  sample::Sampler sampler(params);
  sample::Rng rng(seed);
  const SeqId seq =
      engine.Locked([](KvCache& cache, ForwardPass&) { return cache.CreateSequence(); });
  auto run = [&]() -> absl::StatusOr<SpecGenerateResult> {
    // Prefill prompt[0, n - 1): the last prompt token is the first root.
    PrefillRequest prefill;
    prefill.seq = seq;
    prefill.tokens = prompt.first(prompt.size() - 1);
    prefill.last_logits = false;
    // Strategies that draft from target features get none from the prompt: as in a session,
    // the first step is plain and yields the feature of the prompt's last position. (The row
    // before it, which the prefill could hand over, pairs the second-to-last prompt position
    // with the last prompt token: an entry the heads are never trained on, since their training
    // rows start at the prompt's last position; its drafts were junk.)
    KILN_RETURN_IF_ERROR(engine.Prefill(prefill));
    SpecGenerateResult result;
    std::vector<int32_t> tokens(prompt.begin(), prompt.end());
    SpeculativeDecoder decoder(engine, seq, sampler, rng, strategy);
    if (cost != nullptr) decoder.cost_model() = *cost;
    if (strategy != nullptr) strategy->Reset();
    SpecStepResult step;
    int32_t generated = 0;
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = platform::ProcessCpuSeconds();
    while (generated < max_tokens) {
      const int32_t room = engine.n_ctx() - static_cast<int32_t>(tokens.size());
      if (room <= 0) break;
      const int32_t max_emit = std::min(max_tokens - generated, room);
      KILN_RETURN_IF_ERROR(decoder.Step(&tokens, max_emit, &step));
      generated += static_cast<int32_t>(step.emitted.size());
      if (step.end_of_generation) {
        result.end_of_generation = true;
        break;
      }
    }
    result.tokens.assign(tokens.begin() + static_cast<std::ptrdiff_t>(prompt.size()), tokens.end());
    result.metrics = decoder.metrics();
    result.pass_cost_beta = decoder.cost_model().Beta();
    if (cost != nullptr) *cost = decoder.cost_model();
    result.decode_cpu_seconds = platform::ProcessCpuSeconds() - cpu_start;
    result.decode_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return result;
  };
  auto result = run();
  engine.Locked([&](KvCache& cache, ForwardPass&) { return cache.Free(seq); }).IgnoreError();
  return result;
}

}  // namespace kiln::spec
