// F32, F16 and BF16 element types: scalar reference kernels and registration of all levels.
//
// Activation type of all three is F32 (see kernels/cpu/legacy.h for why). The dot order is the
// same at every level (kernels/cpu/legacy.h, "Float types"); the SIMD kernels are in
// kernels/cpu/float_avx2.cc and kernels/cpu/float_avx512.cc.
#include <cmath>
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

namespace {

// The dot order of every level (kernels/cpu/legacy.h, "Float types"). load(i) is weight i as f32;
// a: the activations (f32, any alignment).
template <typename LoadWeight>
float DotChunks(int64_t n, const void* a, LoadWeight load) {
  constexpr int kLanes = 64;
  const auto* ab = static_cast<const uint8_t*>(a);
  float acc[kLanes] = {};
  for (int64_t i = 0; i < n; ++i) {
    float ai;
    std::memcpy(&ai, ab + 4 * i, 4);
    acc[i % kLanes] = std::fma(load(i), ai, acc[i % kLanes]);
  }
  float v[16];
  for (int l = 0; l < 16; ++l) v[l] = (acc[l] + acc[16 + l]) + (acc[32 + l] + acc[48 + l]);
  for (int l = 0; l < 8; ++l) v[l] = v[l] + v[8 + l];
  for (int l = 0; l < 4; ++l) v[l] = v[l] + v[4 + l];
  for (int l = 0; l < 2; ++l) v[l] = v[l] + v[2 + l];
  return v[0] + v[1];
}

}  // namespace

float VecDotF32F32Ref(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const uint8_t*>(vw);
  return DotChunks(n, va, [w](int64_t i) {
    float v;
    std::memcpy(&v, w + 4 * i, 4);
    return v;
  });
}

float VecDotF16F32Ref(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const uint8_t*>(vw);
  return DotChunks(n, va, [w](int64_t i) { return LoadHalf(w + 2 * i); });
}

float VecDotBf16F32Ref(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const uint8_t*>(vw);
  return DotChunks(n, va, [w](int64_t i) {
    uint16_t b;
    std::memcpy(&b, w + 2 * i, 2);
    return Bf16ToFp32(b);
  });
}

namespace {

template <VecDotFn kDot>
void TilePerPair(int64_t n, const void* vw, size_t w_stride, int n_rows, const void* va,
                 size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  const auto* w = static_cast<const uint8_t*>(vw);
  const auto* a = static_cast<const uint8_t*>(va);
  for (int t = 0; t < n_tokens; ++t) {
    for (int r = 0; r < n_rows; ++r)
      out[t * out_stride + r] = kDot(n, w + r * w_stride, a + t * a_stride);
  }
}

}  // namespace

void VecDotTileF32F32Ref(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                         size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  TilePerPair<VecDotF32F32Ref>(n, w, w_stride, n_rows, a, a_stride, n_tokens, out, out_stride);
}
void VecDotTileF16F32Ref(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                         size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  TilePerPair<VecDotF16F32Ref>(n, w, w_stride, n_rows, a, a_stride, n_tokens, out, out_stride);
}
void VecDotTileBf16F32Ref(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                          size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  TilePerPair<VecDotBf16F32Ref>(n, w, w_stride, n_rows, a, a_stride, n_tokens, out, out_stride);
}

}  // namespace quant

void RegisterFloatTypes(QuantRegistry& r, CpuLevel level) {
  using namespace quant;
  // MatMul runs the tiles for two or more tokens: decode's one token streams each weight row once
  // either way.
  auto set = [&r](GgmlType t, QuantizeRowFn q, DequantizeRowFn dq, VecDotFn dot,
                  VecDotTileFn tile = nullptr) {
    QuantKernels& k = r[t];
    k.type = t;
    k.quantize = q;
    k.dequantize = dq;
    k.vec_dot_type = GgmlType::kF32;
    k.vec_dot = dot;
    k.vec_dot_tile = tile;
  };
  switch (level) {
    case CpuLevel::kScalar:
      set(GgmlType::kF32, QuantizeRowF32Ref, DequantizeRowF32Ref, VecDotF32F32Ref,
          VecDotTileF32F32Ref);
      set(GgmlType::kF16, QuantizeRowF16Ref, DequantizeRowF16Ref, VecDotF16F32Ref,
          VecDotTileF16F32Ref);
      set(GgmlType::kBF16, QuantizeRowBf16Ref, DequantizeRowBf16Ref, VecDotBf16F32Ref,
          VecDotTileBf16F32Ref);
      break;
    case CpuLevel::kAvx2:
      set(GgmlType::kF32, nullptr, nullptr, VecDotF32F32Avx2, VecDotTileF32F32Avx2);
      set(GgmlType::kF16, QuantizeRowF16Avx2, DequantizeRowF16Avx2, VecDotF16F32Avx2,
          VecDotTileF16F32Avx2);
      set(GgmlType::kBF16, QuantizeRowBf16Avx2, DequantizeRowBf16Avx2, VecDotBf16F32Avx2,
          VecDotTileBf16F32Avx2);
      break;
    case CpuLevel::kAvx512:
      set(GgmlType::kF32, nullptr, nullptr, VecDotF32F32Avx512, VecDotTileF32F32Avx512);
      set(GgmlType::kF16, nullptr, nullptr, VecDotF16F32Avx512, VecDotTileF16F32Avx512);
      set(GgmlType::kBF16, nullptr, nullptr, VecDotBf16F32Avx512, VecDotTileBf16F32Avx512);
      break;
  }
}

}  // namespace kiln
