#include "lib/common/cpu_features.h"

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace kiln {
namespace {

CpuFeatures Detect() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a, b, c, d;
  if (__get_cpuid(0, &a, &b, &c, &d)) {
    f.amd = b == 0x68747541 && d == 0x69746E65 && c == 0x444D4163;  // "AuthenticAMD"
  }
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const unsigned base_family = (a >> 8) & 0xF;
  f.x86_family =
      static_cast<int>(base_family == 0xF ? base_family + ((a >> 20) & 0xFF) : base_family);
  const bool osxsave = c & (1u << 27);
  f.fma = c & (1u << 12);
  f.f16c = c & (1u << 29);
  bool avx_os = false, avx512_os = false;
  if (osxsave) {
    unsigned xlo, xhi;
    __asm__("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    avx_os = (xlo & 0x6) == 0x6;
    avx512_os = (xlo & 0xE6) == 0xE6;
  }
  if (!avx_os) {
    f.fma = f.f16c = false;
    return f;
  }
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.avx2 = b & (1u << 5);
    if (avx512_os) {
      f.avx512f = b & (1u << 16);
      f.avx512dq = b & (1u << 17);
      f.avx512bw = b & (1u << 30);
      f.avx512vl = b & (1u << 31);
      f.avx512vnni = c & (1u << 11);
    }
  }
  if (avx512_os && __get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avx512bf16 = a & (1u << 5);
#endif
  return f;
}

CpuFeatures ApplyOverride(CpuFeatures f) {
  const char* level = std::getenv("KILN_CPU_LEVEL");
  if (level == nullptr) return f;
  if (std::strcmp(level, "scalar") == 0) return CpuFeatures{};
  if (std::strcmp(level, "avx2") == 0) {
    f.avx512f = f.avx512bw = f.avx512dq = f.avx512vl = f.avx512vnni = f.avx512bf16 = false;
  }
  return f;
}

}  // namespace

std::string CpuFeatures::ToString() const {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(avx2, "avx2");
  add(fma, "fma");
  add(f16c, "f16c");
  add(avx512f, "avx512f");
  add(avx512bw, "avx512bw");
  add(avx512dq, "avx512dq");
  add(avx512vl, "avx512vl");
  add(avx512vnni, "avx512vnni");
  add(avx512bf16, "avx512bf16");
  return s.empty() ? "none" : s;
}

const CpuFeatures& GetCpuFeatures() {
  static const CpuFeatures features = ApplyOverride(Detect());
  return features;
}

}  // namespace kiln
