// Scalar reference kernels of the legacy block quants (layouts and orders: kernels/cpu/legacy.h).
// The quantizers follow ggml's reference quantizers step by step (same float operations in the
// same order), so the bytes match files written by llama.cpp. This file must be compiled without
// FP contraction (lib/quant/CMakeLists.txt adds -ffp-contract=off), or a * b + c could become an
// FMA and change the rounding.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "lib/quant/legacy_kernels.h"

namespace kiln::quant {
namespace {

constexpr int kHalf = kQK / 2;

// ggml: the element with the largest |x| (first one on ties), signed.
float SignedAbsMax(const float* x) {
  float amax = 0.0f;
  float max = 0.0f;
  for (int j = 0; j < kQK; ++j) {
    const float v = x[j];
    if (amax < std::fabs(v)) {
      amax = std::fabs(v);
      max = v;
    }
  }
  return max;
}

void MinMax(const float* x, float* min_out, float* max_out) {
  float min = FLT_MAX;
  float max = -FLT_MAX;
  for (int j = 0; j < kQK; ++j) {
    const float v = x[j];
    if (v < min) min = v;
    if (v > max) max = v;
  }
  *min_out = min;
  *max_out = max;
}

float AbsMax(const float* x) {
  float amax = 0.0f;
  for (int j = 0; j < kQK; ++j) {
    const float v = std::fabs(x[j]);
    amax = amax > v ? amax : v;  // ggml's MAX(amax, fabsf(v))
  }
  return amax;
}

inline uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// 5-bit value j (0..31) of a Q5 block: low nibble from qs, bit j of qh as bit 4.
inline int Q5Value(const uint8_t* qs, uint32_t qh, int j) {
  const int nib = j < kHalf ? (qs[j] & 0x0F) : (qs[j - kHalf] >> 4);
  return nib | static_cast<int>(((qh >> j) & 1u) << 4);
}

// The dot order of every level (legacy.h, "quants"): per block b, 4 exact int32 lanes
// P_b[l] = Σ qw * qa over the elements j with j % 16 in 4l..4l+3, s_b = dw_b * da_b,
// acc[b % 4][l] = fma(s_b, float(P_b[l]), acc[b % 4][l]); kHasMin (Q5_1) adds mw_b * sa_b to
// mins[b % 4]; then v[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]),
// r = (v[0] + v[2]) + (v[1] + v[3]), r += (mins[0] + mins[2]) + (mins[1] + mins[3]).
// weight(block, j) is element j of a weight block as an integer.
template <typename WeightBlock, typename ActBlock, bool kHasMin, typename WeightFn>
float DotBlocks(int64_t n, const void* vw, const void* va, WeightFn weight) {
  const auto* w = static_cast<const WeightBlock*>(vw);
  const auto* a = static_cast<const ActBlock*>(va);
  float acc[4][4] = {};
  float mins[4] = {};
  for (int64_t b = 0; b < n / kQK; ++b) {
    int32_t p[4] = {};
    for (int j = 0; j < kQK; ++j) p[(j % 16) / 4] += weight(w[b], j) * a[b].qs[j];
    const float s = LoadHalf(w[b].d) * LoadHalf(a[b].d);
    for (int l = 0; l < 4; ++l)
      acc[b % 4][l] = std::fma(s, static_cast<float>(p[l]), acc[b % 4][l]);
    if constexpr (kHasMin) mins[b % 4] += LoadHalf(w[b].m) * LoadHalf(a[b].s);
  }
  float v[4];
  for (int l = 0; l < 4; ++l) v[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
  float r = (v[0] + v[2]) + (v[1] + v[3]);
  if constexpr (kHasMin) r += (mins[0] + mins[2]) + (mins[1] + mins[3]);
  return r;
}

}  // namespace

// --- Quantizers -------------------------------------------------------------------------------

void QuantizeRowQ4_0Ref(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<BlockQ4_0*>(vy);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    const float max = SignedAbsMax(x);
    const float d = max / -8;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    StoreHalf(y[i].d, d);
    for (int j = 0; j < kHalf; ++j) {
      const float x0 = x[j] * id;
      const float x1 = x[kHalf + j] * id;
      const uint8_t q0 = std::min<uint8_t>(15, static_cast<int8_t>(x0 + 8.5f));
      const uint8_t q1 = std::min<uint8_t>(15, static_cast<int8_t>(x1 + 8.5f));
      y[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void QuantizeRowQ4_1Ref(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<BlockQ4_1*>(vy);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    float min, max;
    MinMax(x, &min, &max);
    const float d = (max - min) / 15;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    StoreHalf(y[i].d, d);
    StoreHalf(y[i].m, min);
    for (int j = 0; j < kHalf; ++j) {
      const float x0 = (x[j] - min) * id;
      const float x1 = (x[kHalf + j] - min) * id;
      const uint8_t q0 = std::min<uint8_t>(15, static_cast<int8_t>(x0 + 0.5f));
      const uint8_t q1 = std::min<uint8_t>(15, static_cast<int8_t>(x1 + 0.5f));
      y[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void QuantizeRowQ5_0Ref(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<BlockQ5_0*>(vy);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    const float max = SignedAbsMax(x);
    const float d = max / -16;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    StoreHalf(y[i].d, d);
    uint32_t qh = 0;
    for (int j = 0; j < kHalf; ++j) {
      const float x0 = x[j] * id;
      const float x1 = x[kHalf + j] * id;
      const uint8_t q0 = std::min<uint8_t>(31, static_cast<int8_t>(x0 + 16.5f));
      const uint8_t q1 = std::min<uint8_t>(31, static_cast<int8_t>(x1 + 16.5f));
      y[i].qs[j] = static_cast<uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4));
      qh |= ((q0 & 0x10u) >> 4) << j;
      qh |= ((q1 & 0x10u) >> 4) << (j + kHalf);
    }
    std::memcpy(y[i].qh, &qh, 4);
  }
}

void QuantizeRowQ5_1Ref(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<BlockQ5_1*>(vy);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    float min, max;
    MinMax(x, &min, &max);
    const float d = (max - min) / 31;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    StoreHalf(y[i].d, d);
    StoreHalf(y[i].m, min);
    uint32_t qh = 0;
    for (int j = 0; j < kHalf; ++j) {
      const float x0 = (x[j] - min) * id;
      const float x1 = (x[kHalf + j] - min) * id;
      const uint8_t q0 = static_cast<uint8_t>(x0 + 0.5f);
      const uint8_t q1 = static_cast<uint8_t>(x1 + 0.5f);
      y[i].qs[j] = static_cast<uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4));
      qh |= ((q0 & 0x10u) >> 4) << j;
      qh |= ((q1 & 0x10u) >> 4) << (j + kHalf);
    }
    std::memcpy(y[i].qh, &qh, 4);
  }
}

void QuantizeRowQ8_0Ref(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<BlockQ8_0*>(vy);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    const float amax = AbsMax(x);
    const float d = amax / 127;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    StoreHalf(y[i].d, d);
    for (int j = 0; j < kQK; ++j) y[i].qs[j] = static_cast<int8_t>(std::round(x[j] * id));
  }
}

void QuantizeRowQ8_1Ref(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<BlockQ8_1*>(vy);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    const float amax = AbsMax(x);
    const float d = amax / 127;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    StoreHalf(y[i].d, d);
    int sum = 0;
    for (int j = 0; j < kQK; ++j) {
      y[i].qs[j] = static_cast<int8_t>(std::round(x[j] * id));
      sum += y[i].qs[j];
    }
    StoreHalf(y[i].s, static_cast<float>(sum) * d);
  }
}

// --- Dequantizers -----------------------------------------------------------------------------

void DequantizeRowQ4_0Ref(const void* vx, float* y, int64_t n) {
  const auto* x = static_cast<const BlockQ4_0*>(vx);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const float d = LoadHalf(x[i].d);
    for (int j = 0; j < kHalf; ++j) {
      y[j] = static_cast<float>((x[i].qs[j] & 0x0F) - 8) * d;
      y[j + kHalf] = static_cast<float>((x[i].qs[j] >> 4) - 8) * d;
    }
  }
}

void DequantizeRowQ4_1Ref(const void* vx, float* y, int64_t n) {
  const auto* x = static_cast<const BlockQ4_1*>(vx);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const float d = LoadHalf(x[i].d);
    const float m = LoadHalf(x[i].m);
    for (int j = 0; j < kHalf; ++j) {
      y[j] = static_cast<float>(x[i].qs[j] & 0x0F) * d + m;
      y[j + kHalf] = static_cast<float>(x[i].qs[j] >> 4) * d + m;
    }
  }
}

void DequantizeRowQ5_0Ref(const void* vx, float* y, int64_t n) {
  const auto* x = static_cast<const BlockQ5_0*>(vx);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const float d = LoadHalf(x[i].d);
    const uint32_t qh = LoadU32(x[i].qh);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(Q5Value(x[i].qs, qh, j) - 16) * d;
  }
}

void DequantizeRowQ5_1Ref(const void* vx, float* y, int64_t n) {
  const auto* x = static_cast<const BlockQ5_1*>(vx);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const float d = LoadHalf(x[i].d);
    const float m = LoadHalf(x[i].m);
    const uint32_t qh = LoadU32(x[i].qh);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(Q5Value(x[i].qs, qh, j)) * d + m;
  }
}

void DequantizeRowQ8_0Ref(const void* vx, float* y, int64_t n) {
  const auto* x = static_cast<const BlockQ8_0*>(vx);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const float d = LoadHalf(x[i].d);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(x[i].qs[j]) * d;
  }
}

void DequantizeRowQ8_1Ref(const void* vx, float* y, int64_t n) {
  const auto* x = static_cast<const BlockQ8_1*>(vx);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const float d = LoadHalf(x[i].d);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(x[i].qs[j]) * d;
  }
}

// --- Dot products (order: DotBlocks above; Q4_1 x Q8_1: ggml's, see legacy.h) -----------------

float VecDotQ4_0Q8_0Ref(int64_t n, const void* w, const void* a) {
  return DotBlocks<BlockQ4_0, BlockQ8_0, false>(n, w, a, [](const BlockQ4_0& b, int j) {
    return (j < kHalf ? (b.qs[j] & 0x0F) : (b.qs[j - kHalf] >> 4)) - 8;
  });
}

float VecDotQ4_1Q8_1Ref(int64_t n, const void* vw, const void* va) {
  // ggml's x86 order (legacy.h, "Q4_1 x Q8_1"): 8 lanes, one FMA chain per lane.
  const auto* w = static_cast<const BlockQ4_1*>(vw);
  const auto* a = static_cast<const BlockQ8_1*>(va);
  float acc[8] = {};
  float mins = 0.0f;
  for (int64_t i = 0; i < n / kQK; ++i) {
    mins = std::fma(LoadHalf(w[i].m), LoadHalf(a[i].s), mins);
    const float scale = LoadHalf(w[i].d) * LoadHalf(a[i].d);
    for (int l = 0; l < 8; ++l) {
      int32_t isum = 0;
      for (int j = 4 * l; j < 4 * l + 4; ++j) {
        const int q = j < kHalf ? (w[i].qs[j] & 0x0F) : (w[i].qs[j - kHalf] >> 4);
        isum += q * a[i].qs[j];
      }
      acc[l] = std::fma(scale, static_cast<float>(isum), acc[l]);
    }
  }
  const float lo = (acc[4] + acc[0]) + (acc[6] + acc[2]);
  const float hi = (acc[5] + acc[1]) + (acc[7] + acc[3]);
  return (lo + hi) + mins;
}

float VecDotQ5_0Q8_0Ref(int64_t n, const void* w, const void* a) {
  return DotBlocks<BlockQ5_0, BlockQ8_0, false>(
      n, w, a, [](const BlockQ5_0& b, int j) { return Q5Value(b.qs, LoadU32(b.qh), j) - 16; });
}

float VecDotQ5_1Q8_1Ref(int64_t n, const void* w, const void* a) {
  return DotBlocks<BlockQ5_1, BlockQ8_1, true>(
      n, w, a, [](const BlockQ5_1& b, int j) { return Q5Value(b.qs, LoadU32(b.qh), j); });
}

float VecDotQ8_0Q8_0Ref(int64_t n, const void* w, const void* a) {
  return DotBlocks<BlockQ8_0, BlockQ8_0, false>(
      n, w, a, [](const BlockQ8_0& b, int j) { return static_cast<int>(b.qs[j]); });
}

// Q8_1 weights (rare; kept so the activation type is a complete type): the s field is not needed.
float VecDotQ8_1Q8_1Ref(int64_t n, const void* w, const void* a) {
  return DotBlocks<BlockQ8_1, BlockQ8_1, false>(
      n, w, a, [](const BlockQ8_1& b, int j) { return static_cast<int>(b.qs[j]); });
}

}  // namespace kiln::quant
