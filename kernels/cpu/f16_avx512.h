// f32 -> f16 of 16 lanes with the rounding and NaN rule of Fp32ToFp16 (lib/common/half.h), for
// the AVX-512 translation units only (included after <immintrin.h>; `static inline`, see
// half.h).
#pragma once

#include <immintrin.h>

namespace kiln {

// Nearest, ties to even (vcvtps2ph); a NaN as sign | 0x7E00 (vcvtps2ph would keep its payload).
static inline __m256i F16OfLanesAvx512(__m512 v) {
  __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  if (const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q)) {
    const __m512i sign =
        _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(v), 16), _mm512_set1_epi32(0x8000));
    h = _mm256_mask_blend_epi16(
        nan, h, _mm512_cvtepi32_epi16(_mm512_or_si512(sign, _mm512_set1_epi32(0x7E00))));
  }
  return h;
}

}  // namespace kiln
