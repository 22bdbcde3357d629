// Helpers shared by the x86 K-quant kernels (kernels/cpu/kquants_avx2.cc, kquants_avx512.cc).
// Include ONLY from translation units compiled with at least -mavx2 -mfma -mf16c. Everything
// here is `static inline` so that each instruction-set TU keeps its own copy (see kquants.h).
#pragma once

#include <immintrin.h>

#include <cstddef>
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

// The float step of the contract for four super-blocks of a weight type whose d (and dmin) are
// f16 fields, in fewer instructions than FinishSuperBlocks (the one-token decode path spends a
// fifth of its instructions here): the eight integer sums reduce interleaved as
// [I0 M0 I1 M1 | I2 M2 I3 M3], the f16 pairs (d | dmin << 16) convert in one vcvtph2ps to the
// same layout, and one vector multiply per step gives the scalar products lane by lane (the
// same IEEE operations: a.d * f16 and d * (float)isum commute). Types without dmin pass
// kHasMin = false: their term is d * (float)isum (x - 0.0f == x), so no NaN from 0 * inf can
// leak in. Lanes k >= count are computed but never added.
template <bool kHasMin>
static inline float FinishFourSuperBlocksF16(float acc, const __m256i isum[4],
                                             const __m256i msum[4], __m128i w_f16_pairs, __m128 a_d,
                                             int count) {
  __m256i z;
  if constexpr (kHasMin) {
    const __m256i x0 = _mm256_hadd_epi32(isum[0], msum[0]);  // per 128: [i i m m]
    const __m256i x1 = _mm256_hadd_epi32(isum[1], msum[1]);
    const __m256i x2 = _mm256_hadd_epi32(isum[2], msum[2]);
    const __m256i x3 = _mm256_hadd_epi32(isum[3], msum[3]);
    const __m256i y01 = _mm256_hadd_epi32(x0, x1);  // per 128: [I0 M0 I1 M1] (half sums)
    const __m256i y23 = _mm256_hadd_epi32(x2, x3);
    z = _mm256_add_epi32(_mm256_permute2x128_si256(y01, y23, 0x20),
                         _mm256_permute2x128_si256(y01, y23, 0x31));
  } else {
    const __m256i x01 = _mm256_hadd_epi32(isum[0], isum[1]);  // per 128: [i0 i0 i1 i1]
    const __m256i x23 = _mm256_hadd_epi32(isum[2], isum[3]);
    const __m256i y = _mm256_hadd_epi32(x01, x23);  // per 128: [I0 I1 I2 I3] (half sums)
    const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(y), _mm256_extracti128_si256(y, 1));
    z = _mm256_cvtepu32_epi64(s);  // [I0 0 I1 0 | I2 0 I3 0]
  }
  const __m256 d = _mm256_cvtph_ps(w_f16_pairs);  // [d0 dmin0 d1 dmin1 | ...]
  const __m256 ad = _mm256_set_m128(_mm_unpackhi_ps(a_d, a_d), _mm_unpacklo_ps(a_d, a_d));
  const __m256 p = _mm256_mul_ps(_mm256_mul_ps(ad, d), _mm256_cvtepi32_ps(z));
  // Even lanes: t_k = d_k * isum_k - dmin_k * msum_k (or d_k * isum_k).
  const __m256 t = kHasMin ? _mm256_sub_ps(p, _mm256_movehdup_ps(p)) : p;
  const __m128 t01 = _mm256_castps256_ps128(t);
  const __m128 t23 = _mm256_extractf128_ps(t, 1);
  acc += _mm_cvtss_f32(t01);
  if (count > 1) acc += _mm_cvtss_f32(_mm_movehl_ps(t01, t01));
  if (count > 2) acc += _mm_cvtss_f32(t23);
  if (count > 3) acc += _mm_cvtss_f32(_mm_movehl_ps(t23, t23));
  return acc;
}

// ReduceSuperBlocks for weight blocks with f16 `d` (and, with kHasMin, f16 `dmin` right after
// it): fn(i, isum, msum) gives the integer sums of super-block i; the float factors are read
// here. Same bits as ReduceSuperBlocks with d = a.d * f16(d), dmin = a.d * f16(dmin).
// always_inline: when kquants_avx512.cc grew, GCC 12 called this and Q6_K's fn out of line (the
// sums through memory and a call per row: Q6_K's vec_dot 10-20% slower); inlined, fn is too.
template <bool kHasMin, typename Block, typename SumsFn>
__attribute__((always_inline)) static inline float ReduceSuperBlocksF16(int64_t nb, const Block* w,
                                                                        const BlockQ8K* a,
                                                                        SumsFn&& fn) {
  if constexpr (kHasMin) {
    static_assert(offsetof(Block, dmin) == offsetof(Block, d) + 2, "d, dmin adjacent");
  }
  // d | dmin << 16 of super-block i (only d's 16 bits without kHasMin: reads no further).
  auto f16_pair = [w](int64_t i) -> int {
    if constexpr (kHasMin) {
      uint32_t v;
      std::memcpy(&v, reinterpret_cast<const uint8_t*>(w + i) + offsetof(Block, d), 4);
      return static_cast<int>(v);
    } else {
      return w[i].d;
    }
  };
  float acc = 0.0f;
  __m256i isum[4], msum[4];
  int64_t i = 0;
  for (; i + 4 <= nb; i += 4) {
    // Written out (not a loop) so that the four bodies inline into one straight block.
    fn(i, isum[0], msum[0]);
    fn(i + 1, isum[1], msum[1]);
    fn(i + 2, isum[2], msum[2]);
    fn(i + 3, isum[3], msum[3]);
    acc = FinishFourSuperBlocksF16<kHasMin>(
        acc, isum, msum,
        _mm_setr_epi32(f16_pair(i), f16_pair(i + 1), f16_pair(i + 2), f16_pair(i + 3)),
        _mm_setr_ps(a[i].d, a[i + 1].d, a[i + 2].d, a[i + 3].d), 4);
  }
  if (i < nb) {
    const int count = static_cast<int>(nb - i);
    alignas(16) int pairs[4] = {};
    alignas(16) float ad[4] = {};
    for (int k = 0; k < 4; ++k) {
      if (k < count) {
        fn(i + k, isum[k], msum[k]);
        pairs[k] = f16_pair(i + k);
        ad[k] = a[i + k].d;
      } else {
        isum[k] = msum[k] = _mm256_setzero_si256();
      }
    }
    acc = FinishFourSuperBlocksF16<kHasMin>(acc, isum, msum,
                                            _mm_load_si128(reinterpret_cast<const __m128i*>(pairs)),
                                            _mm_load_ps(ad), count);
  }
  return acc;
}

// One token of a vec_dot_tile: the row-by-row vec_dot (fewest instructions per super-block; the
// tile's unpacked super-block only pays off when several tokens share it). Same bits.
static inline void VecDotRowsOneToken(float (*vec_dot)(int64_t, const void*, const void*),
                                      int64_t n, const void* w, size_t w_stride, int n_rows,
                                      const void* a, float* out) {
  const auto* rows = static_cast<const uint8_t*>(w);
  for (int r = 0; r < n_rows; ++r) out[r] = vec_dot(n, rows + r * w_stride, a);
}

}  // namespace kiln::kquants
