// AVX2 row kernels of the activation quantizers (rules: lib/quant/activation.h). Same bytes as
// the scalar forms: |x * id| <= 127 always, so the saturating narrowing never clips.
//
// As the AVX-512 form (activation_avx512.cc), blocks go in groups, here of 8: each block's amax
// is a reduction of its own (max is exact in any order), the divisions and the f16 conversions
// run as one vector per group.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/legacy.h"
#include "lib/common/half.h"

namespace kiln::quant {
namespace {

// Fp32ToFp16 (lib/common/half.h) of 8 lanes: F16C's nearest-even conversion, and every NaN as
// the quiet NaN 0x7E00 with its sign.
inline void StoreF16Lanes(__m256 v, uint16_t* out) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out),
                   _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0) {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, v);
    for (int j = 0; j < 8; ++j) out[j] = Fp32ToFp16(lanes[j]);
  }
}

// 32 floats -> 32 int8 (the four 8-lane products rounded with MXCSR's mode: to nearest, ties to
// even) and the sum of the 32.
inline int32_t QuantizeBlock(const float* x, __m256 id, int8_t* q) {
  __m256i i[4];
  for (int k = 0; k < 4; ++k)
    i[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), id));
  const __m256i sum = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
  // Narrow to int8 (packs interleave 128-bit lanes; the permute puts the 32 back in order).
  const __m256i w01 = _mm256_packs_epi32(i[0], i[1]), w23 = _mm256_packs_epi32(i[2], i[3]);
  const __m256i b = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w01, w23),
                                                _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), b);
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

template <typename Block>
void QuantizeRow(const float* x, void* vy, int64_t n) {
  constexpr bool kHasSum = sizeof(Block) == sizeof(BlockQ8_1);
  auto* y = static_cast<Block*>(vy);
  const int64_t nb = n / kQK;
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int64_t b0 = 0; b0 < nb; b0 += 8) {
    const int g = nb - b0 < 8 ? static_cast<int>(nb - b0) : 8;
    const float* xg = x + b0 * kQK;
    alignas(32) float amax[8] = {};
    for (int j = 0; j < g; ++j) {
      __m256 m = _mm256_setzero_ps();
      // max(m, |x|) keeps m when |x| is NaN, as std::max(amax, fabs(x)) does.
      for (int k = 0; k < 4; ++k) {
        m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(xg + j * kQK + 8 * k), abs_mask), m);
      }
      __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
      h = _mm_max_ps(h, _mm_movehl_ps(h, h));
      amax[j] = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
    }
    const __m256 a = _mm256_load_ps(amax);
    const __m256 d = _mm256_div_ps(a, _mm256_set1_ps(127.0f));
    // id = amax != 0 ? 127 / amax : 0.
    const __m256 nonzero = _mm256_cmp_ps(a, _mm256_setzero_ps(), _CMP_NEQ_UQ);
    alignas(32) float id[8];
    _mm256_store_ps(id, _mm256_and_ps(nonzero, _mm256_div_ps(_mm256_set1_ps(127.0f), a)));
    alignas(32) int32_t sum[8] = {};
    for (int j = 0; j < g; ++j) {
      sum[j] = QuantizeBlock(xg + j * kQK, _mm256_set1_ps(id[j]), y[b0 + j].qs);
    }
    alignas(32) uint16_t dh[8], sh[8];
    StoreF16Lanes(d, dh);
    if constexpr (kHasSum) {
      StoreF16Lanes(_mm256_mul_ps(d, _mm256_cvtepi32_ps(
                                         _mm256_load_si256(reinterpret_cast<const __m256i*>(sum)))),
                    sh);
    }
    for (int j = 0; j < g; ++j) {
      std::memcpy(y[b0 + j].d, &dh[j], 2);
      if constexpr (kHasSum) std::memcpy(y[b0 + j].s, &sh[j], 2);
    }
  }
}

}  // namespace

void QuantizeActivationQ8_0Avx2(const float* x, void* y, int64_t n) {
  QuantizeRow<BlockQ8_0>(x, y, n);
}
void QuantizeActivationQ8_1Avx2(const float* x, void* y, int64_t n) {
  QuantizeRow<BlockQ8_1>(x, y, n);
}

}  // namespace kiln::quant
