// Run-time CPU feature detection; kernels pick their SIMD path from this once.
#pragma once

#include <string>

namespace kiln {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512dq = false;
  bool avx512vl = false;
  bool avx512vnni = false;
  bool avx512bf16 = false;
  // NEON would go here for aarch64 builds.

  // The AVX2 kernels need all three.
  bool HasAvx2Set() const { return avx2 && fma && f16c; }
  // The AVX-512 kernels are compiled for F, BW, DQ, VL and VNNI (plus the AVX2 set for tails);
  // the compiler may use any of them (kernels/cpu/CMakeLists.txt).
  bool HasAvx512Set() const {
    return HasAvx2Set() && avx512f && avx512bw && avx512dq && avx512vl && avx512vnni;
  }
  std::string ToString() const;
};

// Detected once; honours KILN_CPU_LEVEL=scalar|avx2|avx512 to force a lower path (tests, bench).
const CpuFeatures& GetCpuFeatures();

}  // namespace kiln
