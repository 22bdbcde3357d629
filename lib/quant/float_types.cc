// F32, F16 and BF16 element types: scalar reference kernels and registration of all levels.
//
// Activation type of all three is F32 (see legacy_kernels.h for why). Scalar dot order: one float
// accumulator, acc += w[i] * a[i] (product rounded, then added; no FMA) for i = 0..n-1. The SIMD
// orders are documented in kernels/cpu/float_avx2.cc and kernels/cpu/float_avx512.cc.
#include <cstring>

#include "lib/common/half.h"
#include "lib/quant/legacy_kernels.h"
#include "lib/quant/quant.h"

namespace kiln {
namespace quant {

void QuantizeRowF32Ref(const float* x, void* y, int64_t n) {
  std::memcpy(y, x, static_cast<size_t>(n) * sizeof(float));
}
void DequantizeRowF32Ref(const void* x, float* y, int64_t n) {
  std::memcpy(y, x, static_cast<size_t>(n) * sizeof(float));
}

void QuantizeRowF16Ref(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<uint8_t*>(vy);
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = Fp32ToFp16(x[i]);
    std::memcpy(y + 2 * i, &h, 2);
  }
}
void DequantizeRowF16Ref(const void* vx, float* y, int64_t n) {
  const auto* x = static_cast<const uint8_t*>(vx);
  for (int64_t i = 0; i < n; ++i) y[i] = LoadHalf(x + 2 * i);
}

void QuantizeRowBf16Ref(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<uint8_t*>(vy);
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t b = Fp32ToBf16(x[i]);
    std::memcpy(y + 2 * i, &b, 2);
  }
}
void DequantizeRowBf16Ref(const void* vx, float* y, int64_t n) {
  const auto* x = static_cast<const uint8_t*>(vx);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t b;
    std::memcpy(&b, x + 2 * i, 2);
    y[i] = Bf16ToFp32(b);
  }
}

float VecDotF32F32Ref(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const uint8_t*>(vw);
  const auto* a = static_cast<const uint8_t*>(va);
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    float wi, ai;
    std::memcpy(&wi, w + 4 * i, 4);
    std::memcpy(&ai, a + 4 * i, 4);
    acc += wi * ai;
  }
  return acc;
}

float VecDotF16F32Ref(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const uint8_t*>(vw);
  const auto* a = static_cast<const uint8_t*>(va);
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    float ai;
    std::memcpy(&ai, a + 4 * i, 4);
    acc += LoadHalf(w + 2 * i) * ai;
  }
  return acc;
}

float VecDotBf16F32Ref(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const uint8_t*>(vw);
  const auto* a = static_cast<const uint8_t*>(va);
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    uint16_t b;
    float ai;
    std::memcpy(&b, w + 2 * i, 2);
    std::memcpy(&ai, a + 4 * i, 4);
    acc += Bf16ToFp32(b) * ai;
  }
  return acc;
}

}  // namespace quant

void RegisterFloatTypes(QuantRegistry& r, CpuLevel level) {
  using namespace quant;
  auto set = [&r](GgmlType t, QuantizeRowFn q, DequantizeRowFn dq, VecDotFn dot) {
    QuantKernels& k = r[t];
    k.type = t;
    k.quantize = q;
    k.dequantize = dq;
    k.vec_dot_type = GgmlType::kF32;
    k.vec_dot = dot;
  };
  switch (level) {
    case CpuLevel::kScalar:
      set(GgmlType::kF32, QuantizeRowF32Ref, DequantizeRowF32Ref, VecDotF32F32Ref);
      set(GgmlType::kF16, QuantizeRowF16Ref, DequantizeRowF16Ref, VecDotF16F32Ref);
      set(GgmlType::kBF16, QuantizeRowBf16Ref, DequantizeRowBf16Ref, VecDotBf16F32Ref);
      break;
    case CpuLevel::kAvx2:
      set(GgmlType::kF32, nullptr, nullptr, VecDotF32F32Avx2);
      set(GgmlType::kF16, QuantizeRowF16Avx2, DequantizeRowF16Avx2, VecDotF16F32Avx2);
      set(GgmlType::kBF16, QuantizeRowBf16Avx2, DequantizeRowBf16Avx2, VecDotBf16F32Avx2);
      break;
    case CpuLevel::kAvx512:
      set(GgmlType::kF32, nullptr, nullptr, VecDotF32F32Avx512);
      set(GgmlType::kF16, nullptr, nullptr, VecDotF16F32Avx512);
      set(GgmlType::kBF16, nullptr, nullptr, VecDotBf16F32Avx512);
      break;
  }
}

}  // namespace kiln
