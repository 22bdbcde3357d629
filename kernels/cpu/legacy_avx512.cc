// AVX-512 (F/BW/VL) + VNNI kernels of the legacy block quants. Compiled with -ffp-contract=off
// (see sources.cmake); every FMA is explicit.
//
// Dots: two blocks per __m512i (block 2k in lanes 0..7, block 2k+1 in lanes 8..15), integer dot
// by vpdpbusd. The low half of the float accumulator is acc[0] of the documented order (even
// blocks) and the high half acc[1] (odd blocks); an odd last block goes to the low half. So the
// results are bit-identical to the AVX2 kernels (same exact P_b lanes, same FMAs, same reduction).
// Only functions of this file may run on AVX-512 (everything here is in an anonymous namespace
// or has an Avx512 name), so no inline function compiled with AVX-512 leaks to other callers.
#include <immintrin.h>

// GCC 12's AVX-512 intrinsic headers initialize results from _mm512_undefined_*() and then trip
// -Wuninitialized when inlined (a known false positive); silence it for this file only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <cstdint>
#include <cstring>

#include "lib/quant/legacy_kernels.h"

namespace kiln::quant {
namespace {

inline uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// 16 packed nibbles -> 32 bytes: byte j = low nibble of qs[j], byte j+16 = high nibble.
inline __m256i UnpackNibbles(const uint8_t* qs) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}
inline __m512i UnpackNibblesPair(const uint8_t* qs0, const uint8_t* qs1) {
  const __m256i lo = _mm256_set_m128i(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs1)),
                                      _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs0)));
  // [qs0 lo, qs1 lo, qs0 hi, qs1 hi] as 128-bit quarters; reorder to [qs0 lo, qs0 hi, ...].
  const __m512i quarters =
      _mm512_inserti64x4(_mm512_castsi256_si512(lo), _mm256_srli_epi16(lo, 4), 1);
  const __m512i ordered = _mm512_shuffle_i64x2(quarters, quarters, _MM_SHUFFLE(3, 1, 2, 0));
  return _mm512_and_si512(ordered, _mm512_set1_epi8(0x0F));
}

inline __m256i LoadQs(const int8_t* qs) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
}
inline __m512i LoadQsPair(const int8_t* qs0, const int8_t* qs1) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(LoadQs(qs0)), LoadQs(qs1), 1);
}

inline float ReduceAcc(__m256 acc0, __m256 acc1) {
  const __m256 v = _mm256_add_ps(acc0, acc1);
  const __m128 v4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 v2 = _mm_add_ps(v4, _mm_movehl_ps(v4, v4));
  return _mm_cvtss_f32(_mm_add_ss(v2, _mm_movehdup_ps(v2)));
}

// Per-block header products: lane 0 = dw * da, lane 1 = mw * sa for the _1 types (whose d/m and
// d/s pairs are the first 4 bytes of the blocks); for the _0 types only lane 0 matters.
template <bool kHasMin>
inline __m128 HeaderProduct(const uint8_t* w, const uint8_t* a) {
  if constexpr (kHasMin) {
    const __m128 wdm = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(LoadU32(w))));
    const __m128 ads = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(LoadU32(a))));
    return _mm_mul_ps(wdm, ads);
  } else {
    const __m128 wd = _mm_cvtph_ps(_mm_cvtsi32_si128(LoadU16(w)));
    const __m128 ad = _mm_cvtph_ps(_mm_cvtsi32_si128(LoadU16(a)));
    return _mm_mul_ss(wd, ad);
  }
}

// Dot over block pairs. `pair_dot(w0, a0, w1, a1)` returns the 16 int32 lanes [P_2k, P_2k+1];
// `one_dot(w, a)` the 8 lanes of a single (odd last) block.
template <typename WeightBlock, typename ActBlock, bool kHasMin, typename PairDot, typename OneDot>
inline float DotBlocks(int64_t n, const void* vw, const void* va, PairDot pair_dot,
                       OneDot one_dot) {
  const auto* w = static_cast<const WeightBlock*>(vw);
  const auto* a = static_cast<const ActBlock*>(va);
  const int64_t nb = n / kQK;
  __m512 acc = _mm512_setzero_ps();  // [acc0 | acc1]
  __m128 mins0 = _mm_setzero_ps();   // lane 1 holds the chain of even blocks
  __m128 mins1 = _mm_setzero_ps();   // ... of odd blocks
  int64_t b = 0;
  for (; b + 1 < nb; b += 2) {
    const __m128 h0 = HeaderProduct<kHasMin>(w[b].d, a[b].d);
    const __m128 h1 = HeaderProduct<kHasMin>(w[b + 1].d, a[b + 1].d);
    if constexpr (kHasMin) {
      mins0 = _mm_add_ps(mins0, h0);
      mins1 = _mm_add_ps(mins1, h1);
    }
    const __m512 scale =
        _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_broadcastss_ps(h0)),
                                            _mm256_castps_pd(_mm256_broadcastss_ps(h1)), 1));
    const __m512 p = _mm512_cvtepi32_ps(pair_dot(w[b], a[b], w[b + 1], a[b + 1]));
    acc = _mm512_fmadd_ps(scale, p, acc);
  }
  __m256 acc0 = _mm512_castps512_ps256(acc);
  const __m256 acc1 = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1));
  if (b < nb) {
    const __m128 h = HeaderProduct<kHasMin>(w[b].d, a[b].d);
    if constexpr (kHasMin) mins0 = _mm_add_ps(mins0, h);
    acc0 = _mm256_fmadd_ps(_mm256_broadcastss_ps(h), _mm256_cvtepi32_ps(one_dot(w[b], a[b])), acc0);
  }
  float r = ReduceAcc(acc0, acc1);
  if constexpr (kHasMin) {
    r += _mm_cvtss_f32(_mm_shuffle_ps(mins0, mins0, 1)) +
         _mm_cvtss_f32(_mm_shuffle_ps(mins1, mins1, 1));
  }
  return r;
}

// 5-bit weights: the nibbles plus 16 where bit j of qh is set.
inline __m256i Q5Unsigned(const uint8_t* qs, const uint8_t* qh) {
  const __m256i q = UnpackNibbles(qs);
  return _mm256_mask_add_epi8(q, _cvtu32_mask32(LoadU32(qh)), q, _mm256_set1_epi8(0x10));
}
inline __m512i Q5UnsignedPair(const uint8_t* qs0, const uint8_t* qh0, const uint8_t* qs1,
                              const uint8_t* qh1) {
  const __m512i q = UnpackNibblesPair(qs0, qs1);
  const __mmask64 k = _cvtu64_mask64(static_cast<uint64_t>(LoadU32(qh0)) |
                                     (static_cast<uint64_t>(LoadU32(qh1)) << 32));
  return _mm512_mask_add_epi8(q, k, q, _mm512_set1_epi8(0x10));
}

// Signed x signed via the AVX2 sign trick (|x| is at most 128 as an unsigned byte).
inline __m256i DotI8I8(__m256i x, __m256i y) {
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(x), _mm256_sign_epi8(y, x));
}
inline __m512i DotI8I8Pair(__m512i x, __m512i y) {
  // y negated where x < 0 (where x == 0, |x| = 0 makes the product 0 anyway).
  const __m512i zero = _mm512_setzero_si512();
  const __m512i sy = _mm512_mask_sub_epi8(y, _mm512_movepi8_mask(x), zero, y);
  return _mm512_dpbusd_epi32(zero, _mm512_abs_epi8(x), sy);
}

// --- Activation quantizers ---

// Quantizes one block; stores qs, returns the unrounded d and the int sum of qs.
inline float QuantizeBlockQ8(const float* x, int8_t* qs, int32_t* sum) {
  const __m512 v0 = _mm512_loadu_ps(x);
  const __m512 v1 = _mm512_loadu_ps(x + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
  const float d = amax / 127;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const __m512 vid = _mm512_set1_ps(id);
  const __m512i sign = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  const __m512i one = _mm512_set1_epi32(0x3F800000);  // 1.0f
  __m512i q[2];
  const __m512 vs[2] = {_mm512_mul_ps(v0, vid), _mm512_mul_ps(v1, vid)};
  for (int k = 0; k < 2; ++k) {
    // roundf: trunc, then step away from zero when the dropped fraction is >= 0.5.
    const __m512 t = _mm512_roundscale_ps(vs[k], _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __mmask16 need = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(vs[k], t)),
                                              _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    // (v & sign) | 1.0f
    const __m512 step =
        _mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_castps_si512(vs[k]), sign, one, 0xEA));
    q[k] = _mm512_cvtps_epi32(_mm512_mask_add_ps(t, need, t, step));
  }
  *sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q[0], q[1]));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(qs), _mm512_cvtsepi32_epi8(q[0]));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + 16), _mm512_cvtsepi32_epi8(q[1]));
  return d;
}

inline void StoreHalfF16c(uint8_t* p, float f) {
  const uint16_t h = _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
  std::memcpy(p, &h, 2);
}

}  // namespace

void QuantizeRowQ8_0Avx512(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<BlockQ8_0*>(vy);
  for (int64_t i = 0; i < n / kQK; ++i) {
    int32_t sum;
    StoreHalfF16c(y[i].d, QuantizeBlockQ8(x + i * kQK, y[i].qs, &sum));
  }
}

void QuantizeRowQ8_1Avx512(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<BlockQ8_1*>(vy);
  for (int64_t i = 0; i < n / kQK; ++i) {
    int32_t sum;
    const float d = QuantizeBlockQ8(x + i * kQK, y[i].qs, &sum);
    StoreHalfF16c(y[i].d, d);
    StoreHalfF16c(y[i].s, static_cast<float>(sum) * d);
  }
}

// --- Dots. Offset weights (Q4_0, Q5_0) use Σ q*a - Σ off*a with unsigned q (both exact). ---

float VecDotQ4_0Q8_0Avx512(int64_t n, const void* w, const void* a) {
  return DotBlocks<BlockQ4_0, BlockQ8_0, false>(
      n, w, a,
      [](const BlockQ4_0& w0, const BlockQ8_0& a0, const BlockQ4_0& w1, const BlockQ8_0& a1) {
        const __m512i act = LoadQsPair(a0.qs, a1.qs);
        const __m512i zero = _mm512_setzero_si512();
        return _mm512_sub_epi32(_mm512_dpbusd_epi32(zero, UnpackNibblesPair(w0.qs, w1.qs), act),
                                _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(8), act));
      },
      [](const BlockQ4_0& wb, const BlockQ8_0& ab) {
        const __m256i act = LoadQs(ab.qs);
        const __m256i zero = _mm256_setzero_si256();
        return _mm256_sub_epi32(_mm256_dpbusd_epi32(zero, UnpackNibbles(wb.qs), act),
                                _mm256_dpbusd_epi32(zero, _mm256_set1_epi8(8), act));
      });
}

float VecDotQ4_1Q8_1Avx512(int64_t n, const void* w, const void* a) {
  return DotBlocks<BlockQ4_1, BlockQ8_1, true>(
      n, w, a,
      [](const BlockQ4_1& w0, const BlockQ8_1& a0, const BlockQ4_1& w1, const BlockQ8_1& a1) {
        return _mm512_dpbusd_epi32(_mm512_setzero_si512(), UnpackNibblesPair(w0.qs, w1.qs),
                                   LoadQsPair(a0.qs, a1.qs));
      },
      [](const BlockQ4_1& wb, const BlockQ8_1& ab) {
        return _mm256_dpbusd_epi32(_mm256_setzero_si256(), UnpackNibbles(wb.qs), LoadQs(ab.qs));
      });
}

float VecDotQ5_0Q8_0Avx512(int64_t n, const void* w, const void* a) {
  return DotBlocks<BlockQ5_0, BlockQ8_0, false>(
      n, w, a,
      [](const BlockQ5_0& w0, const BlockQ8_0& a0, const BlockQ5_0& w1, const BlockQ8_0& a1) {
        const __m512i act = LoadQsPair(a0.qs, a1.qs);
        const __m512i zero = _mm512_setzero_si512();
        const __m512i q = Q5UnsignedPair(w0.qs, w0.qh, w1.qs, w1.qh);
        return _mm512_sub_epi32(_mm512_dpbusd_epi32(zero, q, act),
                                _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(16), act));
      },
      [](const BlockQ5_0& wb, const BlockQ8_0& ab) {
        const __m256i act = LoadQs(ab.qs);
        const __m256i zero = _mm256_setzero_si256();
        return _mm256_sub_epi32(_mm256_dpbusd_epi32(zero, Q5Unsigned(wb.qs, wb.qh), act),
                                _mm256_dpbusd_epi32(zero, _mm256_set1_epi8(16), act));
      });
}

float VecDotQ5_1Q8_1Avx512(int64_t n, const void* w, const void* a) {
  return DotBlocks<BlockQ5_1, BlockQ8_1, true>(
      n, w, a,
      [](const BlockQ5_1& w0, const BlockQ8_1& a0, const BlockQ5_1& w1, const BlockQ8_1& a1) {
        return _mm512_dpbusd_epi32(_mm512_setzero_si512(),
                                   Q5UnsignedPair(w0.qs, w0.qh, w1.qs, w1.qh),
                                   LoadQsPair(a0.qs, a1.qs));
      },
      [](const BlockQ5_1& wb, const BlockQ8_1& ab) {
        return _mm256_dpbusd_epi32(_mm256_setzero_si256(), Q5Unsigned(wb.qs, wb.qh), LoadQs(ab.qs));
      });
}

float VecDotQ8_0Q8_0Avx512(int64_t n, const void* w, const void* a) {
  return DotBlocks<BlockQ8_0, BlockQ8_0, false>(
      n, w, a,
      [](const BlockQ8_0& w0, const BlockQ8_0& a0, const BlockQ8_0& w1, const BlockQ8_0& a1) {
        return DotI8I8Pair(LoadQsPair(w0.qs, w1.qs), LoadQsPair(a0.qs, a1.qs));
      },
      [](const BlockQ8_0& wb, const BlockQ8_0& ab) {
        return DotI8I8(LoadQs(wb.qs), LoadQs(ab.qs));
      });
}

float VecDotQ8_1Q8_1Avx512(int64_t n, const void* w, const void* a) {
  return DotBlocks<BlockQ8_1, BlockQ8_1, false>(
      n, w, a,
      [](const BlockQ8_1& w0, const BlockQ8_1& a0, const BlockQ8_1& w1, const BlockQ8_1& a1) {
        return DotI8I8Pair(LoadQsPair(w0.qs, w1.qs), LoadQsPair(a0.qs, a1.qs));
      },
      [](const BlockQ8_1& wb, const BlockQ8_1& ab) {
        return DotI8I8(LoadQs(wb.qs), LoadQs(ab.qs));
      });
}

}  // namespace kiln::quant
