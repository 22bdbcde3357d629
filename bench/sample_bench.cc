// Sampler chain cost per decode step on a 49,152-token vocabulary (SmolLM2's): µs per
// Apply() + Sample() for greedy, the default chain (penalties off, top_k 40, top_p 0.95,
// min_p 0.05, temp 0.8), top-p only (no top-k, no min-p), the default chain with a repetition
// penalty over 64 tokens or with 5 logprobs; and the rejection sampler on an 8-node tree.
//
// Two logit families: "peaked" (LM-like: a few strong tokens hold ~90% of the mass over a
// Gaussian tail) and "flat" (Gaussian sd 2 tail holding most of the mass: the worst case for
// top-p, whose nucleus then has ~10^4 tokens).
//
// Usage: sample_bench [iterations]   (default 2000). Reports the best of 5 repetitions (the
// machine is shared; the minimum is the least disturbed measurement) and the median, both in
// thread CPU time.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "lib/common/platform.h"
#include "lib/sample/rejection_sampler.h"
#include "lib/sample/sampler.h"

namespace {

using kiln::sample::Distribution;
using kiln::sample::Rng;
using kiln::sample::Sampler;
using kiln::sample::SamplerParams;

constexpr int kVocab = 49152;
constexpr int kLogitSets = 16;
constexpr int kRepetitions = 5;

// CPU time of this thread in µs: unlike wall time it does not count time other processes on the
// shared machine hold the core (caches are still shared, so numbers are somewhat pessimistic).
double ThreadMicros() { return 1e6 * kiln::platform::ThreadCpuSeconds(); }

double Gaussian(Rng& rng) {
  const double u1 = 1.0 - rng.NextDouble(), u2 = rng.NextDouble();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// [kLogitSets][kVocab]
std::vector<std::vector<float>> MakeLogits(double tail_sd, double strong_min, double strong_span,
                                           uint64_t seed) {
  Rng rng(seed);
  std::vector<std::vector<float>> sets(kLogitSets, std::vector<float>(kVocab));
  for (auto& logits : sets) {
    for (float& l : logits) l = static_cast<float>(tail_sd * Gaussian(rng));
    for (int i = 0; i < 20; ++i) {
      logits[rng.NextU64() % kVocab] +=
          static_cast<float>(strong_min + strong_span * rng.NextDouble());
    }
  }
  return sets;
}

void BenchChain(const char* name, const SamplerParams& params,
                const std::vector<std::vector<float>>& sets, int iterations) {
  Sampler sampler(params);
  Rng rng(7);
  std::vector<int32_t> history;
  for (int i = 0; i < 64; ++i) history.push_back(static_cast<int32_t>(rng.NextU64() % kVocab));
  long checksum = 0;
  size_t candidates = 0;
  Distribution dist;
  for (int i = 0; i < 50; ++i) (void)sampler.Apply(sets[i % kLogitSets], history, &dist);
  std::vector<double> reps;
  for (int rep = 0; rep < kRepetitions; ++rep) {
    const double start = ThreadMicros();
    for (int i = 0; i < iterations; ++i) {
      const absl::Status s = sampler.Apply(sets[i % kLogitSets], history, &dist);
      if (!s.ok()) {
        std::fprintf(stderr, "%s: %s\n", name, s.ToString().c_str());
        std::exit(1);
      }
      checksum += Sampler::Sample(dist, rng);
      candidates += dist.candidates.size();
    }
    reps.push_back((ThreadMicros() - start) / iterations);
  }
  std::sort(reps.begin(), reps.end());
  std::printf("%-34s best %8.2f us  median %8.2f us   (avg %7.1f candidates, checksum %ld)\n", name,
              reps[0], reps[kRepetitions / 2],
              static_cast<double>(candidates) / (iterations * kRepetitions), checksum);
}

void BenchTreeVerify(const std::vector<std::vector<float>>& sets, int iterations) {
  // Target p: default chain on each set. Draft q: default chain on the same logits plus Gaussian
  // noise (sd 1), so acceptance is partial. Tree: binary, depth 3 (2 + 4 children... 8 nodes).
  Sampler sampler(SamplerParams{});
  std::vector<Distribution> p(kLogitSets), q(kLogitSets);
  Rng noise(3);
  for (int i = 0; i < kLogitSets; ++i) {
    (void)sampler.Apply(sets[i], {}, &p[i]);
    std::vector<float> noisy = sets[i];
    for (float& l : noisy) l += static_cast<float>(Gaussian(noise));
    (void)sampler.Apply(noisy, {}, &q[i]);
  }
  Rng rng(9);
  kiln::sample::RngUniformSource uniforms(rng);
  kiln::sample::VerifyResult result;
  std::vector<kiln::sample::DraftNode> nodes(8);
  long accepted = 0;
  const double start = ThreadMicros();
  for (int it = 0; it < iterations; ++it) {
    const int base = it % kLogitSets;
    for (int n = 0; n < 8; ++n) {
      const int parent = n < 2 ? -1 : (n - 2) / 2;
      // Position of node n's prediction: set index derived from its parent (root: base).
      const int parent_set = parent < 0 ? base : (base + parent + 1) % kLogitSets;
      const int own_set = (base + n + 1) % kLogitSets;
      nodes[n] = {parent, Sampler::Sample(q[parent_set], rng), &q[parent_set], &p[own_set]};
    }
    const absl::Status s = kiln::sample::VerifyTree({&p[base], nodes}, uniforms, &result);
    if (!s.ok()) {
      std::fprintf(stderr, "verify: %s\n", s.ToString().c_str());
      std::exit(1);
    }
    accepted += result.num_accepted();
  }
  const double us = (ThreadMicros() - start) / iterations;
  std::printf("%-34s      %8.2f us   (avg %.2f accepted; includes drafting 8 tokens)\n",
              "tree verify (8 nodes, top-40)", us, static_cast<double>(accepted) / iterations);
}

}  // namespace

int main(int argc, char** argv) {
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 2000;
  std::printf("vocab %d, %d iterations x %d repetitions\n", kVocab, iterations, kRepetitions);
  const auto peaked = MakeLogits(1.5, 8.0, 6.0, 1);
  const auto flat = MakeLogits(2.0, 6.0, 3.0, 2);

  SamplerParams greedy;
  greedy.temperature = 0.0f;
  SamplerParams top_p_only;
  top_p_only.top_k = 0;
  top_p_only.min_p = 0.0f;
  top_p_only.top_p = 0.95f;
  SamplerParams penalized;
  penalized.repeat_penalty = 1.1f;
  SamplerParams with_logprobs;
  with_logprobs.n_logprobs = 5;

  for (const auto& [family, sets] : {std::pair{"peaked", &peaked}, std::pair{"flat", &flat}}) {
    std::printf("-- %s logits\n", family);
    BenchChain("greedy", greedy, *sets, iterations);
    BenchChain("default chain", SamplerParams{}, *sets, iterations);
    BenchChain("top-p 0.95 only", top_p_only, *sets, std::max(1, iterations / 4));
    BenchChain("default + repeat penalty (64)", penalized, *sets, iterations);
    BenchChain("default + 5 logprobs", with_logprobs, *sets, iterations);
  }
  BenchTreeVerify(peaked, iterations * 10);
  return 0;
}
