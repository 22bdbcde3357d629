// AVX2 + FMA + F16C kernels of the legacy block quants. Compiled with -ffp-contract=off (see
// kernels/cpu/CMakeLists.txt): every FMA here is an explicit _mm256_fmadd_ps, so the rounding is
// the one the accumulation-order contract in kernels/cpu/legacy.h describes.
//
// Dots: one 32-element block per __m256i. Weights and activations are laid out element-major
// (byte j = element j); the 8 int32 lanes of the integer dot (elements 4l..4l+3) are folded to
// the 4 lanes P_b[l] of the documented order (lane l + lane l+4), exactly the values the AVX-512
// kernels compute, with the same FMAs and reduction: both levels give bit-identical results.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/legacy.h"

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
inline float HalfToFloat(const uint8_t* p) { return _cvtsh_ss(LoadU16(p)); }

// 16 packed nibbles -> 32 bytes: byte j = low nibble of qs[j], byte j+16 = high nibble of qs[j].
inline __m256i UnpackNibbles(const uint8_t* qs) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// The 32 bits of qh -> 32 bytes, byte j = 0xFF when bit j is set, else 0x00.
inline __m256i BitsToBytes(const uint8_t* qh) {
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(LoadU32(qh))),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
  const __m256i bit =
      _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));  // 1 << (j % 8)
  return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
}

// 8 int32 lanes: lane l = Σ_{j=4l}^{4l+3} u[j] * s[j]; u unsigned bytes, s signed bytes, no pair
// of products may exceed the int16 range (true for |u| <= 128, |s| <= 127).
inline __m256i DotU8I8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
// Same for two signed operands: |x| times y with x's sign moved onto y.
inline __m256i DotI8I8(__m256i x, __m256i y) {
  return DotU8I8(_mm256_abs_epi8(x), _mm256_sign_epi8(y, x));
}

// Final reduction of the documented order from acc01 = [acc0 | acc1] and acc23 = [acc2 | acc3]
// (4 lanes each): v = (acc0 + acc2) + (acc1 + acc3), then 4 -> 2 -> 1.
inline float ReduceAcc(__m256 acc01, __m256 acc23) {
  const __m256 t = _mm256_add_ps(acc01, acc23);
  const __m128 v = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
  const __m128 v2 = _mm_add_ps(v, _mm_movehl_ps(v, v));
  return _mm_cvtss_f32(_mm_add_ss(v2, _mm_movehdup_ps(v2)));
}

// ggml's hsum_float_8: ((a4 + a0) + (a6 + a2)) + ((a5 + a1) + (a7 + a3)).
inline float Hsum8Ggml(__m256 x) {
  __m128 r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  return _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)));
}

inline float Lane1(__m128 v) { return _mm_cvtss_f32(_mm_shuffle_ps(v, v, 1)); }

// Dot of weight blocks against activation blocks in the documented order. `int_dot(w, a)` returns
// 8 int32 lanes (elements 4l..4l+3); two blocks b, b+1 are folded to [P_b | P_b+1] (lane l + lane
// l+4) and accumulated into acc01 (b % 4 == 0) or acc23 (b % 4 == 2). kHasMin adds the mw * sa
// chains (_1 types, whose d/m and d/s pairs are the first 4 bytes of each block).
template <typename WeightBlock, typename ActBlock, bool kHasMin, typename IntDot>
inline float DotBlocks(int64_t n, const void* vw, const void* va, IntDot int_dot) {
  const auto* w = static_cast<const WeightBlock*>(vw);
  const auto* a = static_cast<const ActBlock*>(va);
  const int64_t nb = n / kQK;
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};  // acc01, acc23
  __m128 mins[4] = {_mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps(),
                    _mm_setzero_ps()};  // lane 1 holds the chain
  // Scale of one block as a 4-lane vector; updates its mins chain.
  auto scale_of = [&](int k, const WeightBlock& wb, const ActBlock& ab) {
    if constexpr (kHasMin) {
      // [dw, mw] * [da, sa] = [dw*da, mw*sa]
      const __m128 wdm = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(LoadU32(wb.d))));
      const __m128 ads = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(LoadU32(ab.d))));
      const __m128 prod = _mm_mul_ps(wdm, ads);
      mins[k] = _mm_add_ps(mins[k], prod);
      return _mm_broadcastss_ps(prod);
    } else {
      return _mm_set1_ps(HalfToFloat(wb.d) * HalfToFloat(ab.d));
    }
  };
  // Blocks b (acc index k) and b + 1 (k + 1); `two` = false pads the second with zeros.
  auto pair = [&](int k, int64_t b, bool two) {
    const __m128 s0 = scale_of(k, w[b], a[b]);
    const __m256i p0 = int_dot(w[b], a[b]);
    __m128 s1 = _mm_setzero_ps();
    __m256i p1 = _mm256_setzero_si256();
    if (two) {
      s1 = scale_of(k + 1, w[b + 1], a[b + 1]);
      p1 = int_dot(w[b + 1], a[b + 1]);
    }
    const __m256i folded = _mm256_add_epi32(_mm256_permute2x128_si256(p0, p1, 0x20),
                                            _mm256_permute2x128_si256(p0, p1, 0x31));
    acc[k / 2] = _mm256_fmadd_ps(_mm256_set_m128(s1, s0), _mm256_cvtepi32_ps(folded), acc[k / 2]);
  };
  int64_t b = 0;
  for (; b + 4 <= nb; b += 4) {
    pair(0, b, true);
    pair(2, b + 2, true);
  }
  if (b + 2 <= nb) {
    pair(0, b, true);
    b += 2;
    if (b < nb) pair(2, b, false);
  } else if (b < nb) {
    pair(0, b, false);
  }
  float r = ReduceAcc(acc[0], acc[1]);
  if constexpr (kHasMin) r += (Lane1(mins[0]) + Lane1(mins[2])) + (Lane1(mins[1]) + Lane1(mins[3]));
  return r;
}

inline __m256i LoadQs(const int8_t* qs) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
}

// --- Activation quantizers: same bytes as QuantizeRowQ8_{0,1}Ref. ---

// roundf() on 8 lanes (half away from zero), exact for |v| < 2^23: trunc, then step away from
// zero when the dropped fraction is >= 0.5.
inline __m256 RoundHalfAway(__m256 v) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(v, t));
  const __m256 need = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
  const __m256 step = _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(1.0f));
  return _mm256_add_ps(t, _mm256_and_ps(need, step));
}

// Quantizes one block of 32 floats: stores qs, returns d (unrounded float) and the int sum.
inline float QuantizeBlockQ8(const float* x, int8_t* qs, int32_t* sum) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4];
  for (int k = 0; k < 4; ++k) v[k] = _mm256_loadu_ps(x + 8 * k);
  __m256 m =
      _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                    _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float amax = _mm_cvtss_f32(m4);
  const float d = amax / 127;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const __m256 vid = _mm256_set1_ps(id);
  __m256i q[4];
  for (int k = 0; k < 4; ++k) q[k] = _mm256_cvtps_epi32(RoundHalfAway(_mm256_mul_ps(v[k], vid)));
  const __m256i total =
      _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
  __m128i t4 = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
  t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0x4E));
  t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0xB1));
  *sum = _mm_cvtsi128_si32(t4);
  // Pack 32 int32 -> 32 int8 (values are within [-127, 127]); packs interleave 128-bit lanes,
  // the final permute restores element order.
  const __m256i p16a = _mm256_packs_epi32(q[0], q[1]);
  const __m256i p16b = _mm256_packs_epi32(q[2], q[3]);
  const __m256i p8 = _mm256_packs_epi16(p16a, p16b);
  const __m256i ordered =
      _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs), ordered);
  return d;
}

inline void StoreHalfF16c(uint8_t* p, float f) {
  const uint16_t h = _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
  std::memcpy(p, &h, 2);
}

// Writes 32 floats: float(q[j]) * d (+ m), q given as 32 signed bytes.
template <bool kHasMin>
inline void StoreDequant(__m256i q, float d, float m, float* y) {
  const __m256 vd = _mm256_set1_ps(d);
  const __m256 vm = _mm256_set1_ps(m);
  const __m128i lo = _mm256_castsi256_si128(q);
  const __m128i hi = _mm256_extracti128_si256(q, 1);
  const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
  for (int k = 0; k < 4; ++k) {
    __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[k])), vd);
    if constexpr (kHasMin) f = _mm256_add_ps(f, vm);
    _mm256_storeu_ps(y + 8 * k, f);
  }
}

}  // namespace

void QuantizeRowQ8_0Avx2(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<BlockQ8_0*>(vy);
  for (int64_t i = 0; i < n / kQK; ++i) {
    int32_t sum;
    StoreHalfF16c(y[i].d, QuantizeBlockQ8(x + i * kQK, y[i].qs, &sum));
  }
}

void QuantizeRowQ8_1Avx2(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<BlockQ8_1*>(vy);
  for (int64_t i = 0; i < n / kQK; ++i) {
    int32_t sum;
    const float d = QuantizeBlockQ8(x + i * kQK, y[i].qs, &sum);
    StoreHalfF16c(y[i].d, d);
    StoreHalfF16c(y[i].s, static_cast<float>(sum) * d);
  }
}

// --- Dequantizers: same floats as the scalar references. ---

void DequantizeRowQ4_0Avx2(const void* vx, float* y, int64_t n) {
  const auto* x = static_cast<const BlockQ4_0*>(vx);
  for (int64_t i = 0; i < n / kQK; ++i) {
    const __m256i q = _mm256_sub_epi8(UnpackNibbles(x[i].qs), _mm256_set1_epi8(8));
    StoreDequant<false>(q, HalfToFloat(x[i].d), 0.0f, y + i * kQK);
  }
}

void DequantizeRowQ4_1Avx2(const void* vx, float* y, int64_t n) {
  const auto* x = static_cast<const BlockQ4_1*>(vx);
  for (int64_t i = 0; i < n / kQK; ++i) {
    StoreDequant<true>(UnpackNibbles(x[i].qs), HalfToFloat(x[i].d), HalfToFloat(x[i].m),
                       y + i * kQK);
  }
}

void DequantizeRowQ5_0Avx2(const void* vx, float* y, int64_t n) {
  const auto* x = static_cast<const BlockQ5_0*>(vx);
  for (int64_t i = 0; i < n / kQK; ++i) {
    // q - 16 as a signed byte: low nibble | 0xF0 when bit 4 is clear.
    const __m256i high = _mm256_andnot_si256(BitsToBytes(x[i].qh), _mm256_set1_epi8(-16));
    const __m256i q = _mm256_or_si256(UnpackNibbles(x[i].qs), high);
    StoreDequant<false>(q, HalfToFloat(x[i].d), 0.0f, y + i * kQK);
  }
}

void DequantizeRowQ5_1Avx2(const void* vx, float* y, int64_t n) {
  const auto* x = static_cast<const BlockQ5_1*>(vx);
  for (int64_t i = 0; i < n / kQK; ++i) {
    const __m256i high = _mm256_and_si256(BitsToBytes(x[i].qh), _mm256_set1_epi8(0x10));
    const __m256i q = _mm256_or_si256(UnpackNibbles(x[i].qs), high);
    StoreDequant<true>(q, HalfToFloat(x[i].d), HalfToFloat(x[i].m), y + i * kQK);
  }
}

void DequantizeRowQ8_0Avx2(const void* vx, float* y, int64_t n) {
  const auto* x = static_cast<const BlockQ8_0*>(vx);
  for (int64_t i = 0; i < n / kQK; ++i) {
    StoreDequant<false>(LoadQs(x[i].qs), HalfToFloat(x[i].d), 0.0f, y + i * kQK);
  }
}

void DequantizeRowQ8_1Avx2(const void* vx, float* y, int64_t n) {
  const auto* x = static_cast<const BlockQ8_1*>(vx);
  for (int64_t i = 0; i < n / kQK; ++i) {
    StoreDequant<false>(LoadQs(x[i].qs), HalfToFloat(x[i].d), 0.0f, y + i * kQK);
  }
}

// --- Dots ---

float VecDotQ4_0Q8_0Avx2(int64_t n, const void* w, const void* a) {
  return DotBlocks<BlockQ4_0, BlockQ8_0, false>(
      n, w, a, [](const BlockQ4_0& wb, const BlockQ8_0& ab) {
        const __m256i q = _mm256_sub_epi8(UnpackNibbles(wb.qs), _mm256_set1_epi8(8));
        return DotI8I8(q, LoadQs(ab.qs));
      });
}

float VecDotQ4_1Q8_1Avx2(int64_t n, const void* vw, const void* va) {
  // ggml's x86 order (legacy.h, "Q4_1 x Q8_1").
  const auto* w = static_cast<const BlockQ4_1*>(vw);
  const auto* a = static_cast<const BlockQ8_1*>(va);
  __m256 acc = _mm256_setzero_ps();
  float mins = 0.0f;
  for (int64_t i = 0; i < n / kQK; ++i) {
    mins = std::fma(HalfToFloat(w[i].m), HalfToFloat(a[i].s), mins);
    const __m256 scale = _mm256_set1_ps(HalfToFloat(w[i].d) * HalfToFloat(a[i].d));
    const __m256 xy = _mm256_cvtepi32_ps(DotU8I8(UnpackNibbles(w[i].qs), LoadQs(a[i].qs)));
    acc = _mm256_fmadd_ps(scale, xy, acc);
  }
  return Hsum8Ggml(acc) + mins;
}

float VecDotQ5_0Q8_0Avx2(int64_t n, const void* w, const void* a) {
  return DotBlocks<BlockQ5_0, BlockQ8_0, false>(
      n, w, a, [](const BlockQ5_0& wb, const BlockQ8_0& ab) {
        const __m256i high = _mm256_andnot_si256(BitsToBytes(wb.qh), _mm256_set1_epi8(-16));
        return DotI8I8(_mm256_or_si256(UnpackNibbles(wb.qs), high), LoadQs(ab.qs));
      });
}

float VecDotQ5_1Q8_1Avx2(int64_t n, const void* w, const void* a) {
  return DotBlocks<BlockQ5_1, BlockQ8_1, true>(
      n, w, a, [](const BlockQ5_1& wb, const BlockQ8_1& ab) {
        const __m256i high = _mm256_and_si256(BitsToBytes(wb.qh), _mm256_set1_epi8(0x10));
        return DotU8I8(_mm256_or_si256(UnpackNibbles(wb.qs), high), LoadQs(ab.qs));
      });
}

float VecDotQ8_0Q8_0Avx2(int64_t n, const void* w, const void* a) {
  return DotBlocks<BlockQ8_0, BlockQ8_0, false>(n, w, a,
                                                [](const BlockQ8_0& wb, const BlockQ8_0& ab) {
                                                  return DotI8I8(LoadQs(wb.qs), LoadQs(ab.qs));
                                                });
}

float VecDotQ8_1Q8_1Avx2(int64_t n, const void* w, const void* a) {
  return DotBlocks<BlockQ8_1, BlockQ8_1, false>(n, w, a,
                                                [](const BlockQ8_1& wb, const BlockQ8_1& ab) {
                                                  return DotI8I8(LoadQs(wb.qs), LoadQs(ab.qs));
                                                });
}

}  // namespace kiln::quant
