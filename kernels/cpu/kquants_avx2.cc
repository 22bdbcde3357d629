// K-quants, AVX2+FMA+F16C level: Q8_K quantize, row dequantize and vec_dot for Q2_K..Q6_K.
// Compiled with -mavx2 -mfma -mf16c -ffp-contract=off (kernels/cpu/CMakeLists.txt); chosen at
// run time by lib/quant/kquants.cc. Every function returns exactly the bits of its scalar
// reference (lib/quant/kquants.h): integer sums are exact, and the float steps are the same
// operations in the same order.
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "kernels/cpu/kquants.h"
#include "kernels/cpu/kquants_x86.h"

namespace kiln::kquants {
namespace {

// 16 signed scale bytes as int16, each half broadcast to both 128-bit lanes:
// lo = [s0..s7 | s0..s7], hi = [s8..s15 | s8..s15].
struct Scales16 {
  __m256i lo, hi;
};
inline Scales16 MakeScales16(__m128i s8) {
  return {_mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(s8)),
          _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_srli_si128(s8, 8)))};
}
// Scale vector for one maddubs result of 32 elements = 16 int16 lanes: lanes 0..7 (elements
// 0..15) get scale a, lanes 8..15 get scale b; a and b in the same half (both < 8 or both >= 8).
inline __m256i ScalePair(const Scales16& s, int a, int b) {
  const int a2 = 2 * (a % 8), b2 = 2 * (b % 8);
  const __m256i idx = _mm256_setr_m128i(_mm_set1_epi16(static_cast<short>(((a2 + 1) << 8) | a2)),
                                        _mm_set1_epi16(static_cast<short>(((b2 + 1) << 8) | b2)));
  return _mm256_shuffle_epi8(a < 8 ? s.lo : s.hi, idx);
}

// y[0..31] = dl * q - ml for 32 signed bytes q; the first 16 use (dl0, ml0), the rest (dl1, ml1).
inline void Dequant32(float* y, __m256i q, float dl0, float ml0, float dl1, float ml1) {
  const __m128i halves[2] = {_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)};
  const float dl[2] = {dl0, dl1}, ml[2] = {ml0, ml1};
  for (int h = 0; h < 2; ++h) {
    const __m256 vd = _mm256_set1_ps(dl[h]), vm = _mm256_set1_ps(ml[h]);
    const __m256 f0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(halves[h]));
    const __m256 f1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(halves[h], 8)));
    _mm256_storeu_ps(y + 16 * h, _mm256_sub_ps(_mm256_mul_ps(vd, f0), vm));
    _mm256_storeu_ps(y + 16 * h + 8, _mm256_sub_ps(_mm256_mul_ps(vd, f1), vm));
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Q8_K

void QuantizeRowQ8KAvx2(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<BlockQ8K*>(vy);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {  // x: [256] per block
    BlockQ8K& b = y[i];
    __m256 vmax = _mm256_setzero_ps();
    for (int e = 0; e < kQK; e += 8) {
      // Operand order: a NaN element leaves vmax unchanged (scalar: `ax > amax` is false).
      vmax = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + e), abs_mask), vmax);
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    const float amax = _mm_cvtss_f32(m4);
    float max = 0.0f;
    const __m256 vamax = _mm256_set1_ps(amax);
    for (int e = 0; e < kQK; e += 8) {  // the first element with |x| == amax, as in the scalar
      const int hits = _mm256_movemask_ps(
          _mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(x + e), abs_mask), vamax, _CMP_EQ_OQ));
      if (hits) {
        max = x[e + __builtin_ctz(static_cast<unsigned>(hits))];
        break;
      }
    }
    const float iscale = amax > 0.0f ? -127.0f / max : 0.0f;
    if (!(amax > 0.0f) || !std::isfinite(iscale)) {
      b.d = 0.0f;
      std::memset(b.qs, 0, sizeof(b.qs));
      std::memset(b.bsums, 0, sizeof(b.bsums));
      continue;
    }
    const __m256 vis = _mm256_set1_ps(iscale);
    const __m256i v127 = _mm256_set1_epi32(127);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i ones8 = _mm256_set1_epi8(1);
    const __m256i ones16 = _mm256_set1_epi16(1);
    __m256i quads[8];  // per 32 elements: 8 sums of 4 consecutive qs
    for (int e = 0; e < kQK; e += 32) {
      __m256i q[4];
      for (int k = 0; k < 4; ++k) {
        __m256 v = _mm256_mul_ps(vis, _mm256_loadu_ps(x + e + 8 * k));
        v = _mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q));                  // NaN -> 0
        v = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);  // half to even
        q[k] = _mm256_min_epi32(_mm256_cvtps_epi32(v), v127);
      }
      const __m256i q16a = _mm256_packs_epi32(q[0], q[1]);
      const __m256i q16b = _mm256_packs_epi32(q[2], q[3]);
      const __m256i q8 =
          _mm256_permutevar8x32_epi32(_mm256_packs_epi16(q16a, q16b), order);  // back in order
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(b.qs + e), q8);
      quads[e / 32] = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q8), ones16);
    }
    for (int h = 0; h < 2; ++h) {  // groups 8h..8h+7 from quads[4h..4h+3]
      const __m256i ab = _mm256_hadd_epi32(quads[4 * h], quads[4 * h + 1]);
      const __m256i cd = _mm256_hadd_epi32(quads[4 * h + 2], quads[4 * h + 3]);
      // [g0 g2 g4 g6 | g1 g3 g5 g7] -> g0..g7
      const __m256i g = _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(ab, cd), order);
      const __m128i g16 =
          _mm_packs_epi32(_mm256_castsi256_si128(g), _mm256_extracti128_si256(g, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(b.bsums + 8 * h), g16);
    }
    b.d = 1.0f / iscale;
  }
}

float VecDotQ8KAvx2(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const BlockQ8K*>(vw);
  const auto* a = static_cast<const BlockQ8K*>(va);
  return ReduceSuperBlocks(n / kQK, [&](int64_t i, SuperBlockSums& out) {
    __m256i s = _mm256_setzero_si256();
    for (int e = 0; e < kQK; e += 16) {
      const __m256i wq = _mm256_cvtepi8_epi16(Load128(w[i].qs + e));
      const __m256i aq = _mm256_cvtepi8_epi16(Load128(a[i].qs + e));
      s = _mm256_add_epi32(s, _mm256_madd_epi16(wq, aq));
    }
    out = {s, _mm256_setzero_si256(), w[i].d * a[i].d, 0.0f};
  });
}

// ---------------------------------------------------------------------------------------------
// vec_dot. Per super-block: maddubs(unsigned weight codes, signed activations) -> int16 pair
// sums (no saturation: codes <= 63), madd with the sub-block scales -> int32 lanes, horizontal
// sum -> the exact isum/msum of kquants.h, then AccumulateSuperBlock.

float VecDotQ2KAvx2(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const BlockQ2K*>(vw);
  const auto* a = static_cast<const BlockQ8K*>(va);
  const __m256i m3 = _mm256_set1_epi8(3);
  return ReduceSuperBlocksF16<true>(
      n / kQK, w, a, [&](int64_t i, __m256i& isum_out, __m256i& msum_out) {
        const BlockQ2K& b = w[i];
        const BlockQ8K& y = a[i];
        const __m128i sc8 = Load128(b.scales);
        const __m128i scales = _mm_and_si128(sc8, _mm_set1_epi8(0x0F));
        const __m128i mins = _mm_and_si128(_mm_srli_epi16(sc8, 4), _mm_set1_epi8(0x0F));
        const __m256i msum_v = _mm256_madd_epi16(_mm256_cvtepu8_epi16(mins), Load256(y.bsums));
        const Scales16 scb = MakeScales16(scales);
        __m256i isum_v = _mm256_setzero_si256();
        for (int half = 0; half < 2; ++half) {
          const __m256i q = Load256(b.qs + 32 * half);  // 4 x 2 bits per byte
          for (int j = 0; j < 4; ++j) {
            const __m256i q2 = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m3);
            const __m256i p = _mm256_maddubs_epi16(q2, Load256(y.qs + 128 * half + 32 * j));
            const int g = 8 * half + 2 * j;
            isum_v = _mm256_add_epi32(isum_v, _mm256_madd_epi16(p, ScalePair(scb, g, g + 1)));
          }
        }
        isum_out = isum_v;
        msum_out = msum_v;
      });
}

float VecDotQ3KAvx2(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const BlockQ3K*>(vw);
  const auto* a = static_cast<const BlockQ8K*>(va);
  const __m256i m3 = _mm256_set1_epi8(3);
  const __m256i m4 = _mm256_set1_epi8(4);
  return ReduceSuperBlocksF16<false>(
      n / kQK, w, a, [&](int64_t i, __m256i& isum_out, __m256i& msum_out) {
        const BlockQ3K& b = w[i];
        const BlockQ8K& y = a[i];
        const __m128i s8 = UnpackQ3KScalesVec(b.scales);  // 16 x (s-32)
        // sum_g s_g * bs_g, subtracted 4 times (q3 = u - 4).
        const __m256i corr = _mm256_madd_epi16(_mm256_cvtepi8_epi16(s8), Load256(y.bsums));
        const Scales16 scb = MakeScales16(s8);
        __m256i hbits = Load256(b.hmask);  // bit t of each byte -> shifted to bit 0 at step t
        __m256i isum_v = _mm256_setzero_si256();
        for (int half = 0; half < 2; ++half) {
          const __m256i q = Load256(b.qs + 32 * half);
          for (int j = 0; j < 4; ++j) {
            const __m256i q2 = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m3);
            const __m256i h = _mm256_and_si256(_mm256_slli_epi16(hbits, 2), m4);
            hbits = _mm256_srli_epi16(hbits, 1);
            const __m256i u = _mm256_or_si256(q2, h);  // q3 + 4, 0..7
            const __m256i p = _mm256_maddubs_epi16(u, Load256(y.qs + 128 * half + 32 * j));
            const int g = 8 * half + 2 * j;
            isum_v = _mm256_add_epi32(isum_v, _mm256_madd_epi16(p, ScalePair(scb, g, g + 1)));
          }
        }
        isum_v = _mm256_sub_epi32(isum_v, _mm256_slli_epi32(corr, 2));
        isum_out = isum_v;
        msum_out = _mm256_setzero_si256();
      });
}

template <bool kHasHighBit, typename Block>
static inline float VecDotQ45KAvx2(int64_t n, const Block* w, const BlockQ8K* a) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i bit4 = _mm256_set1_epi8(0x10);
  return ReduceSuperBlocksF16<true>(
      n / kQK, w, a, [&](int64_t i, __m256i& isum_out, __m256i& msum_out) {
        const Block& b = w[i];
        const BlockQ8K& y = a[i];
        const __m128i scm = UnpackQ4KScalesVec(b.scales);  // [sc0..7, m0..7]
        // msum: m_j pairs with bsums 2j and 2j+1.
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(scm, scm));
        const __m256i msum_v = _mm256_madd_epi16(mins, Load256(y.bsums));
        const Scales16 scb = MakeScales16(scm);
        __m256i hbits;
        if constexpr (kHasHighBit) hbits = Load256(b.qh);
        __m256i isum_v = _mm256_setzero_si256();
        for (int c = 0; c < 4; ++c) {  // sub-blocks 2c (low nibbles) and 2c+1 (high nibbles)
          const __m256i q = Load256(b.qs + 32 * c);
          __m256i lo = _mm256_and_si256(q, m4);
          __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
          if constexpr (kHasHighBit) {
            lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(hbits, 4), bit4));
            hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(hbits, 3), bit4));
            hbits = _mm256_srli_epi16(hbits, 2);
          }
          const __m256i p_lo = _mm256_maddubs_epi16(lo, Load256(y.qs + 64 * c));
          const __m256i p_hi = _mm256_maddubs_epi16(hi, Load256(y.qs + 64 * c + 32));
          isum_v = _mm256_add_epi32(isum_v, _mm256_madd_epi16(p_lo, ScalePair(scb, 2 * c, 2 * c)));
          isum_v = _mm256_add_epi32(isum_v,
                                    _mm256_madd_epi16(p_hi, ScalePair(scb, 2 * c + 1, 2 * c + 1)));
        }
        isum_out = isum_v;
        msum_out = msum_v;
      });
}

float VecDotQ4KAvx2(int64_t n, const void* w, const void* a) {
  return VecDotQ45KAvx2<false>(n, static_cast<const BlockQ4K*>(w), static_cast<const BlockQ8K*>(a));
}
float VecDotQ5KAvx2(int64_t n, const void* w, const void* a) {
  return VecDotQ45KAvx2<true>(n, static_cast<const BlockQ5K*>(w), static_cast<const BlockQ8K*>(a));
}

// Q6_K: the four 32-element quarters of a 128-element half as unsigned 6-bit codes.
inline void Q6KQuarters(const BlockQ6K& b, int half, __m256i out[4]) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i m30 = _mm256_set1_epi8(0x30);
  const __m256i ql0 = Load256(b.ql + 64 * half);
  const __m256i ql1 = Load256(b.ql + 64 * half + 32);
  const __m256i qh = Load256(b.qh + 32 * half);
  out[0] =
      _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
  out[1] =
      _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
  out[2] =
      _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m30));
  out[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                           _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
}

float VecDotQ6KAvx2(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const BlockQ6K*>(vw);
  const auto* a = static_cast<const BlockQ8K*>(va);
  return ReduceSuperBlocksF16<false>(
      n / kQK, w, a, [&](int64_t i, __m256i& isum_out, __m256i& msum_out) {
        const BlockQ6K& b = w[i];
        const BlockQ8K& y = a[i];
        const __m128i s8 = Load128(b.scales);
        const __m256i corr = _mm256_madd_epi16(_mm256_cvtepi8_epi16(s8), Load256(y.bsums));
        const Scales16 scb = MakeScales16(s8);
        __m256i isum_v = _mm256_setzero_si256();
        for (int half = 0; half < 2; ++half) {
          __m256i q[4];
          Q6KQuarters(b, half, q);
          for (int k = 0; k < 4; ++k) {
            const __m256i p = _mm256_maddubs_epi16(q[k], Load256(y.qs + 128 * half + 32 * k));
            const int g = 8 * half + 2 * k;
            isum_v = _mm256_add_epi32(isum_v, _mm256_madd_epi16(p, ScalePair(scb, g, g + 1)));
          }
        }
        isum_v = _mm256_sub_epi32(isum_v, _mm256_slli_epi32(corr, 5));  // q6 - 32
        isum_out = isum_v;
        msum_out = _mm256_setzero_si256();
      });
}

// ---------------------------------------------------------------------------------------------
// Dequantize: SIMD bit unpacking, then dl*q - ml with dl = d*scale and ml = dmin*min computed
// exactly as the scalar reference (x - 0.0f == x, so types without a min use ml = 0).

void DequantizeRowQ2KAvx2(const void* vx, float* y, int64_t n) {
  const auto* x = static_cast<const BlockQ2K*>(vx);
  const __m256i m3 = _mm256_set1_epi8(3);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const BlockQ2K& b = x[i];
    const float d = F16(b.d), dmin = F16(b.dmin);
    float dl[16], ml[16];
    for (int g = 0; g < 16; ++g) {
      dl[g] = d * static_cast<float>(b.scales[g] & 0xF);
      ml[g] = dmin * static_cast<float>(b.scales[g] >> 4);
    }
    for (int half = 0; half < 2; ++half) {
      const __m256i q = Load256(b.qs + 32 * half);
      for (int j = 0; j < 4; ++j) {
        const int g = 8 * half + 2 * j;
        Dequant32(y + 16 * g, _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m3), dl[g], ml[g],
                  dl[g + 1], ml[g + 1]);
      }
    }
  }
}

void DequantizeRowQ3KAvx2(const void* vx, float* y, int64_t n) {
  const auto* x = static_cast<const BlockQ3K*>(vx);
  const __m256i m3 = _mm256_set1_epi8(3);
  const __m256i m4 = _mm256_set1_epi8(4);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const BlockQ3K& b = x[i];
    const float d = F16(b.d);
    int8_t s[16];
    UnpackQ3KScales(b.scales, s);
    float dl[16];
    for (int g = 0; g < 16; ++g) dl[g] = d * static_cast<float>(s[g]);
    __m256i hbits = Load256(b.hmask);
    for (int half = 0; half < 2; ++half) {
      const __m256i q = Load256(b.qs + 32 * half);
      for (int j = 0; j < 4; ++j) {
        const __m256i q2 = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m3);
        const __m256i h = _mm256_and_si256(_mm256_slli_epi16(hbits, 2), m4);
        hbits = _mm256_srli_epi16(hbits, 1);
        const __m256i q3 = _mm256_sub_epi8(_mm256_or_si256(q2, h), m4);  // -4..3
        const int g = 8 * half + 2 * j;
        Dequant32(y + 16 * g, q3, dl[g], 0.0f, dl[g + 1], 0.0f);
      }
    }
  }
}

template <bool kHasHighBit, typename Block>
static void DequantizeRowQ45KAvx2(const Block* x, float* y, int64_t n) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i bit4 = _mm256_set1_epi8(0x10);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const Block& b = x[i];
    const float d = F16(b.d), dmin = F16(b.dmin);
    uint8_t sc[8], m[8];
    UnpackQ4KScales(b.scales, sc, m);
    __m256i hbits;
    if constexpr (kHasHighBit) hbits = Load256(b.qh);
    for (int c = 0; c < 4; ++c) {
      const __m256i q = Load256(b.qs + 32 * c);
      __m256i lo = _mm256_and_si256(q, m4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      if constexpr (kHasHighBit) {
        lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(hbits, 4), bit4));
        hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(hbits, 3), bit4));
        hbits = _mm256_srli_epi16(hbits, 2);
      }
      const float dl0 = d * static_cast<float>(sc[2 * c]);
      const float ml0 = dmin * static_cast<float>(m[2 * c]);
      const float dl1 = d * static_cast<float>(sc[2 * c + 1]);
      const float ml1 = dmin * static_cast<float>(m[2 * c + 1]);
      Dequant32(y + 64 * c, lo, dl0, ml0, dl0, ml0);
      Dequant32(y + 64 * c + 32, hi, dl1, ml1, dl1, ml1);
    }
  }
}

void DequantizeRowQ4KAvx2(const void* x, float* y, int64_t n) {
  DequantizeRowQ45KAvx2<false>(static_cast<const BlockQ4K*>(x), y, n);
}
void DequantizeRowQ5KAvx2(const void* x, float* y, int64_t n) {
  DequantizeRowQ45KAvx2<true>(static_cast<const BlockQ5K*>(x), y, n);
}

void DequantizeRowQ6KAvx2(const void* vx, float* y, int64_t n) {
  const auto* x = static_cast<const BlockQ6K*>(vx);
  const __m256i v32 = _mm256_set1_epi8(32);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const BlockQ6K& b = x[i];
    const float d = F16(b.d);
    float dl[16];
    for (int g = 0; g < 16; ++g) dl[g] = d * static_cast<float>(b.scales[g]);
    for (int half = 0; half < 2; ++half) {
      __m256i q[4];
      Q6KQuarters(b, half, q);
      for (int k = 0; k < 4; ++k) {
        const int g = 8 * half + 2 * k;
        Dequant32(y + 16 * g, _mm256_sub_epi8(q[k], v32), dl[g], 0.0f, dl[g + 1], 0.0f);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// vec_dot_tile (Q4_K, Q5_K, Q6_K): rows x tokens, each output bit for bit the vec_dot above.
// Each half of a weight super-block (128 elements) is unpacked once (4 code vectors and their
// scale pairs: 8 of the 16 ymm registers) and dotted with up to kTileTokens tokens; each
// (row, token) keeps vec_dot's own float sequence (FinishSuperBlocks over groups of 4
// super-blocks, in order). A single token takes the type's vec_dot per row (unpacking to
// registers first only pays off when a second token reuses them). Reads the GGUF blocks as
// they are: no repacked copy of the weights.

namespace {

// Half `half` of a super-block: codes[k] lines up with activation bytes 128*half + 32k .. +31,
// scales[k] holds the int16 scales of its 16 maddubs pair sums.
struct UnpackedHalf256 {
  __m256i codes[4];
  __m256i scales[4];
};

// Per super-block data shared by both halves: scale pairs, aux16 (Q4_K/Q5_K: the 8 mins, each
// twice, pairing with the 16 bsums; Q6_K: the 16 group scales for the "- 32" correction) and the
// f16 factors.
struct SuperBlockHeader256 {
  Scales16 scb;
  __m256i aux16;
  float d;
  float dmin;
};

template <bool kHasHighBit, typename Block>
struct Q45KTile256 {
  using BlockType = Block;
  static constexpr bool kQ6K = false;
  static inline SuperBlockHeader256 Header(const Block& b) {
    const __m128i scm = UnpackQ4KScalesVec(b.scales);  // [sc0..7, m0..7]
    return {MakeScales16(scm), _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(scm, scm)), F16(b.d),
            F16(b.dmin)};
  }
  static inline void Unpack(const Block& b, const SuperBlockHeader256& h, int half,
                            UnpackedHalf256& u) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i bit4 = _mm256_set1_epi8(0x10);
    __m256i hbits;
    if constexpr (kHasHighBit) hbits = _mm256_srli_epi16(Load256(b.qh), 4 * half);
    for (int cc = 0; cc < 2; ++cc) {
      const int c = 2 * half + cc;  // sub-blocks 2c (low nibbles) and 2c+1 (high nibbles)
      const __m256i q = Load256(b.qs + 32 * c);
      __m256i lo = _mm256_and_si256(q, m4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      if constexpr (kHasHighBit) {
        lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(hbits, 4), bit4));
        hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(hbits, 3), bit4));
        hbits = _mm256_srli_epi16(hbits, 2);
      }
      u.codes[2 * cc] = lo;
      u.codes[2 * cc + 1] = hi;
      u.scales[2 * cc] = ScalePair(h.scb, 2 * c, 2 * c);
      u.scales[2 * cc + 1] = ScalePair(h.scb, 2 * c + 1, 2 * c + 1);
    }
  }
};

struct Q6KTile256 {
  using BlockType = BlockQ6K;
  static constexpr bool kQ6K = true;
  static inline SuperBlockHeader256 Header(const BlockQ6K& b) {
    const __m128i s8 = Load128(b.scales);
    return {MakeScales16(s8), _mm256_cvtepi8_epi16(s8), F16(b.d), 0.0f};
  }
  static inline void Unpack(const BlockQ6K& b, const SuperBlockHeader256& h, int half,
                            UnpackedHalf256& u) {
    Q6KQuarters(b, half, u.codes);
    for (int k = 0; k < 4; ++k) {
      const int g = 8 * half + 2 * k;
      u.scales[k] = ScalePair(h.scb, g, g + 1);
    }
  }
};

constexpr int kTileTokens = 4;  // tokens sharing one unpacked weight half super-block
constexpr int kRowBlock = 4;    // rows whose weights stay in L1 across the token groups

// out[t * out_stride + r] for kTokens (>= 2) tokens starting at `a` and rows 0..n_rows-1.
template <int kTokens, typename Type>
inline void TileRowsK256(int64_t nb, const uint8_t* w, size_t w_stride, int n_rows,
                         const uint8_t* a, size_t a_stride, float* out, size_t out_stride) {
  using Block = typename Type::BlockType;
  for (int r = 0; r < n_rows; ++r) {
    const auto* wr = reinterpret_cast<const Block*>(w + r * w_stride);
    float acc[kTokens] = {};
    SuperBlockSums s[kTokens][4];
    for (int64_t i0 = 0; i0 < nb; i0 += 4) {
      const int count = static_cast<int>(nb - i0 < 4 ? nb - i0 : 4);
      for (int k = 0; k < 4; ++k) {
        if (k >= count) {
          for (int t = 0; t < kTokens; ++t) {
            s[t][k] = SuperBlockSums{_mm256_setzero_si256(), _mm256_setzero_si256(), 0.0f, 0.0f};
          }
          continue;
        }
        const Block& b = wr[i0 + k];
        const SuperBlockHeader256 h = Type::Header(b);
        __m256i isum[kTokens];
        for (int t = 0; t < kTokens; ++t) isum[t] = _mm256_setzero_si256();
        for (int half = 0; half < 2; ++half) {
          UnpackedHalf256 u;
          Type::Unpack(b, h, half, u);
          for (int t = 0; t < kTokens; ++t) {
            const auto& y = reinterpret_cast<const BlockQ8K*>(a + t * a_stride)[i0 + k];
            for (int j = 0; j < 4; ++j) {
              const __m256i p =
                  _mm256_maddubs_epi16(u.codes[j], Load256(y.qs + 128 * half + 32 * j));
              isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(p, u.scales[j]));
            }
          }
        }
        for (int t = 0; t < kTokens; ++t) {
          const auto& y = reinterpret_cast<const BlockQ8K*>(a + t * a_stride)[i0 + k];
          const __m256i aux = _mm256_madd_epi16(h.aux16, Load256(y.bsums));
          if constexpr (Type::kQ6K) {
            s[t][k] = {_mm256_sub_epi32(isum[t], _mm256_slli_epi32(aux, 5)), _mm256_setzero_si256(),
                       y.d * h.d, 0.0f};
          } else {
            s[t][k] = {isum[t], aux, y.d * h.d, y.d * h.dmin};
          }
        }
      }
      for (int t = 0; t < kTokens; ++t) acc[t] = FinishSuperBlocks(acc[t], s[t], count);
    }
    for (int t = 0; t < kTokens; ++t) out[t * out_stride + r] = acc[t];
  }
}

template <typename Type>
inline void VecDotTileK256(int64_t n, const void* vw, size_t w_stride, int n_rows, const void* va,
                           size_t a_stride, int n_tokens, float* out, size_t out_stride,
                           float (*vec_dot)(int64_t, const void*, const void*)) {
  const auto* w = static_cast<const uint8_t*>(vw);
  const auto* a = static_cast<const uint8_t*>(va);
  const int64_t nb = n / kQK;
  // Blocks of kRowBlock rows: their weights stay in L1 while every token group passes over
  // them (a matrix larger than the caches is streamed from memory once per call).
  for (int r0 = 0; r0 < n_rows; r0 += kRowBlock) {
    const int rows = n_rows - r0 < kRowBlock ? n_rows - r0 : kRowBlock;
    const uint8_t* wb = w + r0 * w_stride;
    float* ob = out + r0;
    int t = 0;
    for (; t + kTileTokens <= n_tokens; t += kTileTokens) {
      TileRowsK256<kTileTokens, Type>(nb, wb, w_stride, rows, a + t * a_stride, a_stride,
                                      ob + t * out_stride, out_stride);
    }
    // The remaining 0..3 tokens as 2 + 1.
    if (n_tokens - t >= 2) {
      TileRowsK256<2, Type>(nb, wb, w_stride, rows, a + t * a_stride, a_stride, ob + t * out_stride,
                            out_stride);
      t += 2;
    }
    if (n_tokens - t >= 1) {
      for (int r = 0; r < rows; ++r) {
        ob[t * out_stride + r] = vec_dot(n, wb + r * w_stride, a + t * a_stride);
      }
    }
  }
}

}  // namespace

void VecDotTileQ4KAvx2(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                       size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  if (n_tokens == 1) return VecDotRowsOneToken(VecDotQ4KAvx2, n, w, w_stride, n_rows, a, out);
  VecDotTileK256<Q45KTile256<false, BlockQ4K>>(n, w, w_stride, n_rows, a, a_stride, n_tokens, out,
                                               out_stride, VecDotQ4KAvx2);
}
void VecDotTileQ5KAvx2(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                       size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  if (n_tokens == 1) return VecDotRowsOneToken(VecDotQ5KAvx2, n, w, w_stride, n_rows, a, out);
  VecDotTileK256<Q45KTile256<true, BlockQ5K>>(n, w, w_stride, n_rows, a, a_stride, n_tokens, out,
                                              out_stride, VecDotQ5KAvx2);
}
void VecDotTileQ6KAvx2(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                       size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  if (n_tokens == 1) return VecDotRowsOneToken(VecDotQ6KAvx2, n, w, w_stride, n_rows, a, out);
  VecDotTileK256<Q6KTile256>(n, w, w_stride, n_rows, a, a_stride, n_tokens, out, out_stride,
                             VecDotQ6KAvx2);
}

}  // namespace kiln::kquants
