// Helpers shared by the CPU kernel tests (cpu_ops_test, cpu_attention_test).
#pragma once

#include <random>
#include <vector>

#include "lib/quant/activation.h"
#include "lib/quant/quant.h"

namespace kiln::testing {

// n floats uniform in [lo, hi).
inline std::vector<float> RandomVector(size_t n, std::mt19937& rng, float lo = -1.0f,
                                       float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Levels this CPU runs, scalar first.
inline std::vector<CpuLevel> Levels() {
  std::vector<CpuLevel> out;
  for (int l = 0; l <= static_cast<int>(BestCpuLevel()); ++l)
    out.push_back(static_cast<CpuLevel>(l));
  return out;
}

// x rounded through Q8_0 blocks of 32 (MatMul's activation quantizer) and widened back: the
// query kiln's batch-invariant order scores a q8_0 K cache against (kv_scores_rows_q8_0), and a
// query that rounding leaves as it is. n % 32 == 0.
inline std::vector<float> OnQ8_0Grid(const float* x, size_t n) {
  std::vector<uint8_t> blocks(n / 32 * 34);
  std::vector<float> out(n);
  ActivationQuantizer(GgmlType::kQ8_0, CpuLevel::kScalar)(x, blocks.data(),
                                                          static_cast<int64_t>(n));
  GetQuantKernels(GgmlType::kQ8_0, CpuLevel::kScalar)
      ->dequantize(blocks.data(), out.data(), static_cast<int64_t>(n));
  return out;
}

}  // namespace kiln::testing
