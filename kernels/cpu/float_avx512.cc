// AVX-512 (F/BW/VL) dot kernels of the float types (F32, F16, BF16 weights; F32 activations).
// Compiled with -ffp-contract=off (kernels/cpu/CMakeLists.txt); every FMA is explicit.
//
// Dot order: the one of every level (legacy.h, "Float types"): elements in chunks of 64; element
// i of a chunk goes to accumulator acc[i / 16] lane i % 16 via acc = fma(w, a, acc). A last
// partial chunk is read with zero-filling masked loads. End: v = (acc0 + acc1) + (acc2 + acc3)
// (16 lanes); v8 = v[0..7] + v[8..15]; v4 = v8[0..3] + v8[4..7]; v2 = v4[0..1] + v4[2..3];
// r = v2[0] + v2[1].
// (BF16 weights are widened exactly; vdpbf16ps would need bf16 activations and buys no bandwidth.)
#include <immintrin.h>

// GCC 12's AVX-512 intrinsic headers initialize results from _mm512_undefined_*() and then trip
// -Wuninitialized when inlined (a known false positive); silence it for this file only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <cstdint>

#include "kernels/cpu/legacy.h"

namespace kiln::quant {
namespace {

constexpr int kChunk = 64;

inline float Reduce4(const __m512 acc[4]) {
  const __m512 v = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
  const __m256 v8 = _mm256_add_ps(_mm512_castps512_ps256(v),
                                  _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  const __m128 v4 = _mm_add_ps(_mm256_castps256_ps128(v8), _mm256_extractf128_ps(v8, 1));
  const __m128 v2 = _mm_add_ps(v4, _mm_movehl_ps(v4, v4));
  return _mm_cvtss_f32(_mm_add_ss(v2, _mm_movehdup_ps(v2)));
}

// 16 weights from element i, widened to f32: Load (full) and LoadMasked (only the lanes in
// `mask` are read; the others are 0).
struct LoadF32 {
  static constexpr int kBytes = 4;
  static __m512 Load(const uint8_t* w) { return _mm512_loadu_ps(w); }
  static __m512 LoadMasked(const uint8_t* w, __mmask16 mask) {
    return _mm512_maskz_loadu_ps(mask, w);
  }
};
struct LoadF16 {
  static constexpr int kBytes = 2;
  static __m512 Load(const uint8_t* w) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
  }
  static __m512 LoadMasked(const uint8_t* w, __mmask16 mask) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, w));
  }
};
struct LoadBf16 {
  static constexpr int kBytes = 2;
  static __m512 Widen(__m256i bits) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
  }
  static __m512 Load(const uint8_t* w) {
    return Widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
  }
  static __m512 LoadMasked(const uint8_t* w, __mmask16 mask) {
    return Widen(_mm256_maskz_loadu_epi16(mask, w));
  }
};

template <typename Loader>
inline float Dot(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const uint8_t*>(vw);
  const auto* a = static_cast<const float*>(va);
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                   _mm512_setzero_ps()};
  int64_t i = 0;
  for (; i + kChunk <= n; i += kChunk) {
    for (int k = 0; k < 4; ++k) {
      const int64_t e = i + 16 * k;
      acc[k] =
          _mm512_fmadd_ps(Loader::Load(w + e * Loader::kBytes), _mm512_loadu_ps(a + e), acc[k]);
    }
  }
  for (int k = 0; i + 16 * k < n; ++k) {  // last partial chunk
    const int64_t e = i + 16 * k;
    const int64_t rest = n - e;
    const __mmask16 mask =
        rest >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << rest) - 1);
    acc[k] = _mm512_fmadd_ps(Loader::LoadMasked(w + e * Loader::kBytes, mask),
                             _mm512_maskz_loadu_ps(mask, a + e), acc[k]);
  }
  return Reduce4(acc);
}

}  // namespace

float VecDotF32F32Avx512(int64_t n, const void* w, const void* a) { return Dot<LoadF32>(n, w, a); }
float VecDotF16F32Avx512(int64_t n, const void* w, const void* a) { return Dot<LoadF16>(n, w, a); }
float VecDotBf16F32Avx512(int64_t n, const void* w, const void* a) {
  return Dot<LoadBf16>(n, w, a);
}

}  // namespace kiln::quant
