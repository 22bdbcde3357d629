#include "lib/quant/quant.h"

#include <algorithm>
#include <array>

#include "kernels/cpu/prefetch.h"
#include "lib/common/cpu_features.h"

namespace kiln {

const char* CpuLevelName(CpuLevel level) {
  switch (level) {
    case CpuLevel::kScalar:
      return "scalar";
    case CpuLevel::kAvx2:
      return "avx2";
    case CpuLevel::kAvx512:
      return "avx512";
  }
  return "?";
}

CpuLevel BestCpuLevel() {
  const CpuFeatures& f = GetCpuFeatures();
  if (f.HasAvx512Set()) return CpuLevel::kAvx512;
  if (f.HasAvx2Set()) return CpuLevel::kAvx2;
  return CpuLevel::kScalar;
}

namespace {

constexpr int kLevels = 3;

// One registry per level up to this CPU's (the levels above stay empty and are never handed
// out, so no kernel of an instruction set the CPU lacks is even registered); level L starts as a
// copy of level L-1, then the families overwrite the slots they accelerate at L.
std::array<QuantRegistry, kLevels> BuildRegistries() {
  const CpuFeatures& cpu = GetCpuFeatures();
  SetPrefetchForCore(cpu.amd, cpu.x86_family);  // kernels/cpu/prefetch.h
  std::array<QuantRegistry, kLevels> regs{};
  for (int t = 0; t < static_cast<int>(GgmlType::kCount); ++t) {
    regs[0].kernels[t].type = static_cast<GgmlType>(t);
  }
  for (int l = 0; l <= static_cast<int>(BestCpuLevel()); ++l) {
    if (l > 0) regs[l] = regs[l - 1];
    QuantRegistry fresh{};
    const CpuLevel level = static_cast<CpuLevel>(l);
    RegisterFloatTypes(fresh, level);
    RegisterLegacyTypes(fresh, level);
    RegisterKQuantTypes(fresh, level);
    for (int t = 0; t < static_cast<int>(GgmlType::kCount); ++t) {
      QuantKernels& dst = regs[l].kernels[t];
      const QuantKernels& src = fresh.kernels[t];
      if (src.quantize) dst.quantize = src.quantize;
      if (src.dequantize) dst.dequantize = src.dequantize;
      if (src.vec_dot) {
        dst.vec_dot = src.vec_dot;
        dst.vec_dot_type = src.vec_dot_type;
        dst.vec_dot_rows = src.vec_dot_rows;  // never pair a new vec_dot with an older rows fn
        dst.vec_dot_tile = src.vec_dot_tile;  // nor with an older tile fn
        dst.tile_for_one_token = src.tile_for_one_token;
      } else {
        if (src.vec_dot_rows) dst.vec_dot_rows = src.vec_dot_rows;
        if (src.vec_dot_tile) {
          dst.vec_dot_tile = src.vec_dot_tile;
          dst.tile_for_one_token = src.tile_for_one_token;
        }
      }
      if (src.interleaved_tile) {  // its own numeric order: independent of vec_dot
        dst.SetInterleavedForm(src.interleave, src.interleaved_group_bytes, src.interleaved_row,
                               src.interleaved_tile, src.in_place_tile);
      }
    }
  }
  return regs;
}

}  // namespace

const QuantKernels* GetQuantKernels(GgmlType type, CpuLevel level) {
  static const std::array<QuantRegistry, kLevels> regs = BuildRegistries();
  const int t = static_cast<int>(type);
  if (t < 0 || t >= static_cast<int>(GgmlType::kCount)) return nullptr;
  const int best = static_cast<int>(BestCpuLevel());
  const int l = static_cast<int>(level) < 0 ? 0 : std::min(static_cast<int>(level), best);
  const QuantKernels& k = regs[l].kernels[t];
  return k.IsSupported() ? &k : nullptr;
}

}  // namespace kiln
