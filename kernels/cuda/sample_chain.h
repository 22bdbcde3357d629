// The part of kiln's sampler chain (lib/sample/sampler.h) that the device sampler runs after its
// top-k selection, written once for the kernel and the host tests: candidates sorted by (logit
// descending, id ascending) -> top-p -> min-p -> temperature -> the inverse-CDF draw with a given
// uniform u. Each step uses the CPU sampler's arithmetic (double softmax of float logit
// differences, the min-p cut in logit space, float probabilities summed in double), so the two
// pick the same token unless u lies within rounding of a cumulative-probability boundary.
#pragma once

#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define KILN_SAMPLE_HOST_DEVICE __host__ __device__ inline
#else
#define KILN_SAMPLE_HOST_DEVICE inline
#endif

namespace kiln::cuda {

// The sampler's candidate order: higher logit first, equal logits by lower id.
KILN_SAMPLE_HOST_DEVICE bool RanksBefore(float logit_a, int32_t id_a, float logit_b, int32_t id_b) {
  return logit_a > logit_b || (logit_a == logit_b && id_a < id_b);
}

// The token the chain draws from the n >= 1 candidates (logits[i], tokens[i]), already sorted by
// RanksBefore and cut to top-k. temperature <= 0: candidates[0] (greedy). scratch: [n] doubles.
KILN_SAMPLE_HOST_DEVICE int32_t SampleSortedCandidates(const float* logits, const int32_t* tokens,
                                                       int32_t n, float top_p, float min_p,
                                                       float temperature, double u,
                                                       double* scratch) {
  if (n <= 0) return -1;
  if (temperature <= 0.0f) return tokens[0];
  const float max_logit = logits[0];
  // top-p: the shortest prefix whose softmax mass (at temperature 1) reaches top_p.
  if (top_p < 1.0f && n > 1) {
    double sum = 0.0;
    for (int32_t i = 0; i < n; ++i) {
      scratch[i] = exp(static_cast<double>(logits[i] - max_logit));
      sum += scratch[i];
    }
    double cum = 0.0;
    for (int32_t i = 0; i < n; ++i) {
      cum += scratch[i] / sum;
      if (cum >= top_p) {
        n = i + 1;
        break;
      }
    }
  }
  // min-p: p >= min_p * p_max, i.e. logit >= max + log(min_p).
  if (min_p > 0.0f && n > 1) {
    const float min_logit = max_logit + logf(min_p);
    int32_t keep = 1;
    while (keep < n && logits[keep] >= min_logit) ++keep;
    n = keep;
  }
  if (n == 1) return tokens[0];  // one candidate: no draw
  // Temperature, then the float probabilities of the final distribution.
  const double inv_t = 1.0 / temperature;
  double sum = 0.0;
  for (int32_t i = 0; i < n; ++i) {
    scratch[i] = exp(static_cast<double>(logits[i] - max_logit) * inv_t);
    sum += scratch[i];
  }
  int32_t kept = 0;
  double total = 0.0;
  for (; kept < n; ++kept) {
    const float p = static_cast<float>(scratch[kept] / sum);
    if (!(p > 0.0f)) break;  // sorted: everything after underflowed too
    scratch[kept] = p;
    total += p;
  }
  if (kept == 1) return tokens[0];
  const double target = u * total;
  double cum = 0.0;
  for (int32_t i = 0; i < kept; ++i) {
    cum += scratch[i];
    if (target < cum) return tokens[i];
  }
  return tokens[kept - 1];  // u * total rounded up to total
}

}  // namespace kiln::cuda
