// Helpers shared by the CPU kernel tests (cpu_ops_test, cpu_attention_test).
#pragma once

#include <random>
#include <vector>

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

}  // namespace kiln::testing
