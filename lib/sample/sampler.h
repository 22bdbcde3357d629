// The sampler chain: raw logits [vocab] -> a sparse normalized Distribution -> one token drawn
// with a seeded per-session Rng. Pure math over a logit array; no model needed.
//
// Stage order (fixed). It is llama.cpp's default chain (common/common.h `samplers` default plus the
// logit-bias sampler that common_sampler_init puts first), minus the stages kiln does not have
// (DRY, top-n-sigma, XTC):
//
//   1. logit bias         logit[t] += bias[t]
//   2. penalties          over the last `penalty_last_n` tokens of the history, for each distinct
//                         token t seen c > 0 times:
//                           repetition (llama.cpp): logit = logit <= 0 ? logit * r : logit / r
//                           frequency + presence (OpenAI): logit -= c * freq + presence
//   3. top-k              keep the k highest logits (ties: lower id first)
//   4. typical            locally typical sampling (Meister et al. 2022) with llama.cpp's rule:
//                         H = entropy of softmax; sort by |-log p - H| ascending; keep the shortest
//                         prefix whose mass is > typical_p (at least one token)
//   5. top-p (nucleus)    keep the smallest highest-probability set with mass >= top_p (>= 1 token)
//   6. min-p              keep tokens with p >= min_p * p_max
//   7. temperature        p ∝ exp(logit / T); T <= 0 is greedy: the single best survivor
//   8. dist               the final softmax; Sample() draws from it
//
// Why this order: it is what llama.cpp users get by default, so `kiln` and llama.cpp agree token
// for token on the same logits, bias and seed-independent decisions. Consequence worth knowing:
// stages 3-6 judge probabilities at temperature 1 (softmax of the penalized logits); temperature
// only reshapes the survivors. Each truncation stage renormalizes over the current survivors
// (top-p after top-k measures mass within the top k), exactly as llama.cpp does.
//
// Greedy (temperature <= 0) returns a one-hot Distribution of the highest penalized logit (ties:
// lowest id); top-k/top-p/min-p always keep that token, typical sampling may drop it, in which case
// greedy picks the best token typical kept (llama.cpp's behaviour too). Sample() on a one-token
// distribution returns it without drawing, so greedy never consumes randomness.
//
// Input checks: NaN or +inf logits -> InvalidArgument naming the index; -inf logits are allowed
// (banned tokens); no finite logit left -> FailedPrecondition. Bias/history token ids outside
// [0, vocab) -> InvalidArgument naming the index. Bad parameters -> InvalidArgument naming the
// field (reported by every Apply()).
//
// Cost for a 49,152 vocab: one validation pass; a copy only when bias/penalties apply; top-k by a
// size-k heap in one pass (no sort of the vocabulary); without top-k, top-p/min-p use one exp pass
// plus a logit histogram so only the nucleus is sorted. bench/sample_bench.cc, thread CPU time on
// the shared dev box (x86-64 baseline SSE2 build): greedy 12 µs, default chain 31 µs, default +
// repeat penalty 38 µs, default + 5 logprobs 135 µs, top-p 0.95 only 177 µs (LM-like logits) to
// 1.04 ms (flat logits whose nucleus holds ~12,000 tokens, all sorted).
//
// Thread-safety: a Sampler owns scratch buffers, so one Sampler per session/thread; distinct
// Samplers are independent. Apply() does not touch the Rng; only Sample()/Next() do.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/sample/distribution.h"
#include "lib/sample/rng.h"

namespace kiln::sample {

struct LogitBias {
  int32_t token = 0;
  float bias = 0.0f;  // added to the logit; -INFINITY bans the token
};

// Defaults are those of llama.cpp's common_params_sampling.
struct SamplerParams {
  std::vector<LogitBias> logit_bias;  // default: none
  // Window (most recent tokens of the history) for all three penalties. 0 = penalties off,
  // -1 = the whole history. Default 64.
  int32_t penalty_last_n = 64;
  float repeat_penalty = 1.0f;     // > 0; 1 = off (llama.cpp semantics, see above)
  float frequency_penalty = 0.0f;  // 0 = off (OpenAI semantics)
  float presence_penalty = 0.0f;   // 0 = off (OpenAI semantics)
  int32_t top_k = 40;              // <= 0 or >= vocab = off
  float typical_p = 1.0f;          // >= 1 = off
  float top_p = 0.95f;             // >= 1 = off; <= 0 keeps one token
  float min_p = 0.05f;             // <= 0 = off
  float temperature = 0.8f;        // <= 0 = greedy (argmax)
  // Fill Distribution::top_logprobs with this many raw log-probabilities (0 = off; costs one extra
  // exp pass over the vocabulary).
  int32_t n_logprobs = 0;
};

namespace internal {
// A candidate token during truncation: its (biased, penalized) logit and id.
struct ScoredToken {
  float logit;
  int32_t token;
};
}  // namespace internal

class Sampler {
 public:
  explicit Sampler(SamplerParams params);

  // OK, or InvalidArgument naming the first bad field (NaN anywhere, repeat_penalty <= 0,
  // n_logprobs < 0, penalty_last_n < -1, non-finite bias value other than -inf).
  static absl::Status Validate(const SamplerParams& params);

  const SamplerParams& params() const { return params_; }

  // logits: [vocab] raw scores; history: the tokens so far (prompt + generated; only the last
  // penalty_last_n matter). Writes the chain's distribution to *out (reusing its capacity).
  absl::Status Apply(std::span<const float> logits, std::span<const int32_t> history,
                     Distribution* out);

  // Draws a token from `dist` with one rng.NextDouble() (none when dist has a single candidate).
  // Precondition: dist non-empty (as Apply() guarantees); returns -1 otherwise.
  static int32_t Sample(const Distribution& dist, Rng& rng);
  // The inverse-CDF draw Sample() uses, for a given uniform u in [0, 1): the first candidate (in
  // the distribution's order) whose cumulative probability exceeds u * total.
  static int32_t SampleWithUniform(const Distribution& dist, double u);

  // Apply() then Sample().
  absl::StatusOr<int32_t> Next(std::span<const float> logits, std::span<const int32_t> history,
                               Rng& rng);

 private:
  absl::Status ApplyBiasAndPenalties(std::span<const float> logits,
                                     std::span<const int32_t> history,
                                     std::span<const float>* view);
  // Fills candidates_ (sorted by logit desc, id asc) with top-k / all finite tokens, applying
  // top-p and min-p directly in the no-top-k path. Sets *truncated_exactly when top-p and min-p
  // have already been applied.
  absl::Status CollectCandidates(std::span<const float> view, bool* truncated_exactly);
  void ApplyTypical();
  void ApplyTopP();
  void ApplyMinP();
  // Temperature and final softmax of candidates_ into out.
  void Finish(Distribution* out);
  void FillLogprobs(std::span<const float> logits, Distribution* out);

  SamplerParams params_;
  absl::Status params_status_;
  std::vector<float> work_logits_;  // [vocab] biased/penalized logits (only when needed)
  std::vector<internal::ScoredToken> candidates_;  // current survivors, sorted
  std::vector<double> probs_;                      // [candidates_.size()] scratch softmax
  std::vector<int32_t> window_;                    // penalty window, sorted
  std::vector<float> exp_;                         // [vocab] e^(logit - max) for top-p / logprobs
  std::vector<double> bucket_mass_;                // [512] top-p mass per logit-distance bucket
  Distribution scratch_dist_;                      // for Next()
};

// Indices of the k largest values of `values` (k clipped to size), sorted by value desc then index
// asc; -inf values are skipped. One pass with a size-k heap. Exposed for tests and logprobs.
void SelectTopK(std::span<const float> values, int32_t k, std::vector<int32_t>* indices);

}  // namespace kiln::sample
