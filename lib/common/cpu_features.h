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
  // The core, where a kernel's best choice was measured to differ between microarchitectures:
  // AMD's, and the x86 family (CPUID leaf 1, base + extended: 0x19 Zen 3/4, 0x1A Zen 5).
  bool amd = false;
  int x86_family = 0;
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
