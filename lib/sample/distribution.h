// Distribution: the sparse, normalized next-token distribution produced by the sampler chain
// (sampler.h) and consumed by sampling and by the rejection sampler (rejection_sampler.h).
//
// Representation: only the candidates that survived truncation, sorted by probability (highest
// first; equal probabilities keep the order of their logits, then the lower token id first), with
// every prob > 0 and the probs summing to 1 (up to float rounding). After the default chain that is
// at most top_k = 40 entries, so everything downstream is O(40), not O(vocab).
//
// Thread-safety: a plain value type; const methods may be called concurrently.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"

namespace kiln::sample {

struct TokenProb {
  int32_t token = 0;
  float prob = 0.0f;
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct Distribution {
  // Size of the vocabulary the token ids index into (ids are in [0, vocab_size)).
  int32_t vocab_size = 0;
  // [n] surviving tokens, sorted as described above; never empty after a successful Apply().
  std::vector<TokenProb> candidates;
  // [min(n_logprobs, vocab)] the highest log-probabilities of the *raw* logits given to Apply()
  // (log-softmax before bias, penalties, truncation and temperature; what llama.cpp's server and
  // the OpenAI API report), highest first, ties by lower id. Empty unless requested.
  std::vector<TokenLogprob> top_logprobs;
  // log(sum(exp(raw logits))) when top_logprobs were requested (so the caller can compute the raw
  // log-probability of any token as logits[token] - raw_log_normalizer); 0 otherwise.
  double raw_log_normalizer = 0.0;

  // Probability of `token` (0 when it is not a candidate). O(n).
  float ProbOf(int32_t token) const;
  // The most probable token (candidates[0]); -1 when empty.
  int32_t Argmax() const { return candidates.empty() ? -1 : candidates[0].token; }

  // A distribution with all mass on `token`.
  static Distribution OneHot(int32_t vocab_size, int32_t token);
  // From dense non-negative weights [vocab] (need not sum to 1): zeros are dropped, the rest
  // normalized and sorted. InvalidArgument for an empty span, a negative/NaN/inf weight (names the
  // index) or an all-zero vector.
  static absl::StatusOr<Distribution> FromWeights(std::span<const double> weights);
};

// Total variation distance 0.5 * sum |a - b| over the union of supports. Ignores vocab_size.
double TotalVariation(const Distribution& a, const Distribution& b);

}  // namespace kiln::sample
