// Helpers shared by the x86 K-quant kernels (kernels/cpu/kquants_avx2.cc, kquants_avx512.cc).
// Include ONLY from translation units compiled with at least -mavx2 -mfma -mf16c. Everything
// here is `static inline` so that each instruction-set TU keeps its own copy (see kquants.h).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/kquants.h"

namespace kiln::kquants {

static inline __m256i Load256(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}
static inline __m128i Load128(const void* p) {
  return _mm_loadu_si128(static_cast<const __m128i*>(p));
}

static inline int32_t HsumI32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

static inline float F16(uint16_t h) { return _cvtsh_ss(h); }  // exact, same as Fp16ToFp32

// Q4_K/Q5_K: the 12 scale bytes -> 16 bytes [sc0..sc7, m0..m7] (UnpackQ4KScales, 4 bytes per
// 32-bit lane). Reads 16 bytes from `scales`: the caller's block continues past them.
static inline __m128i UnpackQ4KScalesVec(const uint8_t* scales) {
  const __m128i u = Load128(scales);             // [u0, u1, u2, junk]
  const __m128i a = _mm_shuffle_epi32(u, 0x98);  // [u0, u2, u1, u2]
  const __m128i b = _mm_shuffle_epi32(u, 0x50);  // [u0, u0, u1, u1]
  // Lanes 0/2: sc0..3 / m0..3 = u0/u1 & 63. Lanes 1/3: low nibbles from u2 (>> 0 / >> 4) plus
  // bits 4-5 = top 2 bits of each byte of u0/u1 (((x >> 6) & 3) << 4 == (x >> 2) & 0x30).
  const __m128i low = _mm_and_si128(_mm_srlv_epi32(a, _mm_setr_epi32(0, 0, 0, 4)),
                                    _mm_setr_epi32(0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F));
  const __m128i high =
      _mm_and_si128(_mm_srli_epi32(b, 2), _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
  return _mm_or_si128(low, high);
}

// Q3_K: the 12 scale bytes -> 16 signed scales s[g]-32 (UnpackQ3KScales).
static inline __m128i UnpackQ3KScalesVec(const uint8_t* scales) {
  uint32_t u[3];
  std::memcpy(u, scales, 12);
  const uint32_t s0 = (u[0] & 0x0F0F0F0F) | ((u[2] & 0x03030303) << 4);
  const uint32_t s1 = (u[1] & 0x0F0F0F0F) | (((u[2] >> 2) & 0x03030303) << 4);
  const uint32_t s2 = ((u[0] >> 4) & 0x0F0F0F0F) | (((u[2] >> 4) & 0x03030303) << 4);
  const uint32_t s3 = ((u[1] >> 4) & 0x0F0F0F0F) | (((u[2] >> 6) & 0x03030303) << 4);
  const __m128i s = _mm_setr_epi32(static_cast<int>(s0), static_cast<int>(s1), static_cast<int>(s2),
                                   static_cast<int>(s3));
  return _mm_sub_epi8(s, _mm_set1_epi8(32));
}

// What one super-block contributes before the float step: int32 lanes whose sums are the
// exact isum / msum of the contract, and the float factors d, dmin.
struct SuperBlockSums {
  __m256i isum;
  __m256i msum;
  float d;
  float dmin;
};

// The float step of the contract (AccumulateSuperBlock) for `count` <= 4 super-blocks: the
// four horizontal sums share one hadd tree, the products and differences are computed 4-wide
// (the same IEEE operations per lane), and the additions into acc stay sequential, in order.
static inline float FinishSuperBlocks(float acc, const SuperBlockSums* s, int count) {
  const __m256i i01 = _mm256_hadd_epi32(s[0].isum, s[1].isum);
  const __m256i i23 = _mm256_hadd_epi32(s[2].isum, s[3].isum);
  const __m256i m01 = _mm256_hadd_epi32(s[0].msum, s[1].msum);
  const __m256i m23 = _mm256_hadd_epi32(s[2].msum, s[3].msum);
  const __m256i i4 = _mm256_hadd_epi32(i01, i23);  // [S0 S1 S2 S3 | S0' S1' S2' S3'] halves
  const __m256i m4 = _mm256_hadd_epi32(m01, m23);
  const __m128i isum = _mm_add_epi32(_mm256_castsi256_si128(i4), _mm256_extracti128_si256(i4, 1));
  const __m128i msum = _mm_add_epi32(_mm256_castsi256_si128(m4), _mm256_extracti128_si256(m4, 1));
  const __m128 d = _mm_setr_ps(s[0].d, s[1].d, s[2].d, s[3].d);
  const __m128 dmin = _mm_setr_ps(s[0].dmin, s[1].dmin, s[2].dmin, s[3].dmin);
  const __m128 t =
      _mm_sub_ps(_mm_mul_ps(d, _mm_cvtepi32_ps(isum)), _mm_mul_ps(dmin, _mm_cvtepi32_ps(msum)));
  alignas(16) float terms[4];
  _mm_store_ps(terms, t);
  for (int k = 0; k < count; ++k) acc += terms[k];
  return acc;
}

// Runs fn(i, SuperBlockSums&) for super-blocks i = 0 .. nb-1 and folds them into the result,
// four at a time.
template <typename SuperBlockFn>
static inline float ReduceSuperBlocks(int64_t nb, SuperBlockFn&& fn) {
  float acc = 0.0f;
  SuperBlockSums s[4];
  int64_t i = 0;
  for (; i + 4 <= nb; i += 4) {
    fn(i, s[0]);
    fn(i + 1, s[1]);
    fn(i + 2, s[2]);
    fn(i + 3, s[3]);
    acc = FinishSuperBlocks(acc, s, 4);
  }
  if (i < nb) {
    const int count = static_cast<int>(nb - i);
    for (int k = 0; k < 4; ++k) {
      if (k < count) {
        fn(i + k, s[k]);
      } else {
        s[k] = SuperBlockSums{_mm256_setzero_si256(), _mm256_setzero_si256(), 0.0f, 0.0f};
      }
    }
    acc = FinishSuperBlocks(acc, s, count);
  }
  return acc;
}

}  // namespace kiln::kquants
