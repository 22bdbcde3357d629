// K-quants, AVX-512 F/BW/VL + VNNI level: Q8_K quantize and vec_dot for Q2_K..Q6_K.
// Compiled with the AVX-512 flag set plus -ffp-contract=off (kernels/cpu/CMakeLists.txt); chosen
// at run time by lib/quant/kquants.cc. Every function returns exactly the bits of its scalar
// reference (lib/quant/kquants.h).
//
// Shape of every vec_dot: 64 weight codes (unsigned bytes) line up with 64 contiguous
// activation bytes; vpmaddubsw gives 32 int16 pair sums (no saturation: codes <= 63), and
// vpdpwssd multiplies them by the per-lane sub-block scale and adds pairs into 16 int32 lanes
// (Q4_K/Q5_K: vpdpbusd sums of 4 first, scaled after packing to int16). One horizontal sum per
// super-block gives the exact isum of the contract.
// GCC 12's AVX-512 headers initialise "undefined" vectors from themselves, which trips
// -W(maybe-)uninitialized after inlining (GCC bug 105593); the warning is a false positive.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "kernels/cpu/kquants.h"
#include "kernels/cpu/kquants_x86.h"

namespace kiln::kquants {
namespace {

inline __m512i Load512(const void* p) { return _mm512_loadu_si512(p); }

// 16 int32 lanes -> 8 lanes with the same total.
inline __m256i Fold512(__m512i v) {
  return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

// [lo (32 bytes), hi (32 bytes)] as one 512-bit vector.
inline __m512i Concat(__m256i lo, __m256i hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

// vpermw index tables. Group scales (16-element groups, Q2_K/Q3_K/Q6_K): for 64 elements
// starting at group 4t, int16 lanes 8k..8k+7 take scale 4t+k. Sub-block scales (32-element
// sub-blocks, Q4_K/Q5_K): for 64 elements starting at sub-block 2t, lanes 0..15 take 2t and
// lanes 16..31 take 2t+1.
struct ScaleIndexTables {
  alignas(64) int16_t group[4][32];
  alignas(64) int16_t sub_block[4][32];
  constexpr ScaleIndexTables() : group(), sub_block() {
    for (int t = 0; t < 4; ++t) {
      for (int l = 0; l < 32; ++l) {
        group[t][l] = static_cast<int16_t>(4 * t + l / 8);
        sub_block[t][l] = static_cast<int16_t>(2 * t + l / 16);
      }
    }
  }
};
constexpr ScaleIndexTables kScaleIndex;

// `s16` holds the scales as int16 in lanes 0..15; g0 is a multiple of 4, j0 of 2.
inline __m512i GroupScales(__m512i s16, int g0) {
  return _mm512_permutexvar_epi16(_mm512_load_si512(kScaleIndex.group[g0 / 4]), s16);
}
inline __m512i SubBlockScales(__m512i s16, int j0) {
  return _mm512_permutexvar_epi16(_mm512_load_si512(kScaleIndex.sub_block[j0 / 2]), s16);
}

inline __m512i Dot64(__m512i acc, __m512i codes, const int8_t* act, __m512i scales) {
  return _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(codes, Load512(act)), scales);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Q8_K

void QuantizeRowQ8KAvx512(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<BlockQ8K*>(vy);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {  // x: [256] per block
    BlockQ8K& b = y[i];
    __m512 vmax = _mm512_setzero_ps();
    for (int e = 0; e < kQK; e += 16) {
      // Operand order: a NaN element leaves vmax unchanged (scalar: `ax > amax` is false).
      vmax = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + e)), vmax);
    }
    const float amax = _mm512_reduce_max_ps(vmax);
    float max = 0.0f;
    const __m512 vamax = _mm512_set1_ps(amax);
    for (int e = 0; e < kQK; e += 16) {  // the first element with |x| == amax
      const __mmask16 hits =
          _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(x + e)), vamax, _CMP_EQ_OQ);
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
    const __m512 vis = _mm512_set1_ps(iscale);
    const __m512i v127 = _mm512_set1_epi32(127);
    const __m128i bias = _mm_set1_epi8(static_cast<char>(0x80));
    for (int g = 0; g < 16; ++g) {  // one 16-element group per iteration
      __m512 v = _mm512_mul_ps(vis, _mm512_loadu_ps(x + 16 * g));
      v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), v);  // NaN -> 0
      const __m512i q32 = _mm512_min_epi32(
          _mm512_cvt_roundps_epi32(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), v127);
      const __m128i q8 = _mm512_cvtsepi32_epi8(q32);  // values already in -127..127
      _mm_storeu_si128(reinterpret_cast<__m128i*>(b.qs + 16 * g), q8);
      // Sum of 16 signed bytes: sum of (q + 128) as unsigned, minus 16 * 128.
      const __m128i sad = _mm_sad_epu8(_mm_xor_si128(q8, bias), _mm_setzero_si128());
      b.bsums[g] = static_cast<int16_t>(_mm_cvtsi128_si32(sad) + _mm_extract_epi16(sad, 4) - 2048);
    }
    b.d = 1.0f / iscale;
  }
}

float VecDotQ8KAvx512(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const BlockQ8K*>(vw);
  const auto* a = static_cast<const BlockQ8K*>(va);
  return ReduceSuperBlocks(n / kQK, [&](int64_t i, SuperBlockSums& out) {
    __m512i s = _mm512_setzero_si512();
    for (int e = 0; e < kQK; e += 32) {
      const __m512i wq = _mm512_cvtepi8_epi16(Load256(w[i].qs + e));
      const __m512i aq = _mm512_cvtepi8_epi16(Load256(a[i].qs + e));
      s = _mm512_dpwssd_epi32(s, wq, aq);
    }
    out = {Fold512(s), _mm256_setzero_si256(), w[i].d * a[i].d, 0.0f};
  });
}

// ---------------------------------------------------------------------------------------------
// vec_dot

float VecDotQ2KAvx512(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const BlockQ2K*>(vw);
  const auto* a = static_cast<const BlockQ8K*>(va);
  const __m512i m3 = _mm512_set1_epi8(3);
  return ReduceSuperBlocksF16<true>(
      n / kQK, w, a, [&](int64_t i, __m256i& isum_out, __m256i& msum_out) {
        const BlockQ2K& b = w[i];
        const BlockQ8K& y = a[i];
        const __m128i sc8 = Load128(b.scales);
        const __m128i scales = _mm_and_si128(sc8, _mm_set1_epi8(0x0F));
        const __m128i mins = _mm_and_si128(_mm_srli_epi16(sc8, 4), _mm_set1_epi8(0x0F));
        const __m256i msum_v = _mm256_madd_epi16(_mm256_cvtepu8_epi16(mins), Load256(y.bsums));
        const __m512i s16 = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(scales));
        __m512i isum_v = _mm512_setzero_si512();
        for (int half = 0; half < 2; ++half) {
          const __m256i q = Load256(b.qs + 32 * half);
          const __m512i qx = Concat(q, _mm256_srli_epi16(q, 2));               // shifts 0 | 2
          const __m512i w01 = _mm512_and_si512(qx, m3);                        // j = 0, 1
          const __m512i w23 = _mm512_and_si512(_mm512_srli_epi16(qx, 4), m3);  // j = 2, 3
          isum_v = Dot64(isum_v, w01, y.qs + 128 * half, GroupScales(s16, 8 * half));
          isum_v = Dot64(isum_v, w23, y.qs + 128 * half + 64, GroupScales(s16, 8 * half + 4));
        }
        isum_out = Fold512(isum_v);
        msum_out = msum_v;
      });
}

float VecDotQ3KAvx512(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const BlockQ3K*>(vw);
  const auto* a = static_cast<const BlockQ8K*>(va);
  const __m512i m3 = _mm512_set1_epi8(3);
  const __m512i v4 = _mm512_set1_epi8(4);
  return ReduceSuperBlocksF16<false>(
      n / kQK, w, a, [&](int64_t i, __m256i& isum_out, __m256i& msum_out) {
        const BlockQ3K& b = w[i];
        const BlockQ8K& y = a[i];
        const __m128i s8 = UnpackQ3KScalesVec(b.scales);
        const __m256i s16_256 = _mm256_cvtepi8_epi16(s8);
        const __m256i corr = _mm256_madd_epi16(s16_256, Load256(y.bsums));  // sum_g s_g * bs_g
        const __m512i s16 = _mm512_castsi256_si512(s16_256);
        const __m256i hm = Load256(b.hmask);
        const __m512i hmx = Concat(hm, _mm256_srli_epi16(hm, 1));  // lanes 32..63 see bit t+1
        __m512i isum_v = _mm512_setzero_si512();
        for (int half = 0; half < 2; ++half) {
          const __m256i q = Load256(b.qs + 32 * half);
          const __m512i qx = Concat(q, _mm256_srli_epi16(q, 2));
          __m512i w01 = _mm512_and_si512(qx, m3);
          __m512i w23 = _mm512_and_si512(_mm512_srli_epi16(qx, 4), m3);
          const __mmask64 h01 = _mm512_test_epi8_mask(hmx, _mm512_set1_epi8(1 << (4 * half)));
          const __mmask64 h23 = _mm512_test_epi8_mask(hmx, _mm512_set1_epi8(1 << (4 * half + 2)));
          w01 = _mm512_mask_add_epi8(w01, h01, w01, v4);  // u = q3 + 4
          w23 = _mm512_mask_add_epi8(w23, h23, w23, v4);
          isum_v = Dot64(isum_v, w01, y.qs + 128 * half, GroupScales(s16, 8 * half));
          isum_v = Dot64(isum_v, w23, y.qs + 128 * half + 64, GroupScales(s16, 8 * half + 4));
        }
        isum_out = _mm256_sub_epi32(Fold512(isum_v), _mm256_slli_epi32(corr, 2));
        msum_out = _mm256_setzero_si256();
      });
}

// vpshufb controls for the one-token Q4_K/Q5_K dot: int16 lane scales, picked from a register
// holding [sc0..sc7, ...] in every 128-bit lane (in-lane byte shuffles, no vpermw), that line up
// with packs_epi32(P_c, P_c+1) of the per-chunk vpdpbusd sums P (dword l of P_c: sub-block 2c
// for l < 8, 2c+1 otherwise). packs puts in 128-bit lane k: words 0..3 = P_c dwords 4k..4k+3,
// words 4..7 = P_c+1 dwords 4k..4k+3. Row p of the table serves chunks 2p, 2p+1.
struct PackedScaleControls {
  alignas(64) int8_t ctl[2][64];
  constexpr PackedScaleControls() : ctl() {
    for (int p = 0; p < 2; ++p) {
      for (int b = 0; b < 64; ++b) {
        const int lane = b / 16, word = (b % 16) / 2;
        const int chunk = 2 * p + (word < 4 ? 0 : 1);
        const int sub_block = 2 * chunk + (lane < 2 ? 0 : 1);
        ctl[p][b] = static_cast<int8_t>(b % 2 == 1 ? -128 : sub_block);
      }
    }
  }
};
constexpr PackedScaleControls kPackedScale;

template <bool kHasHighBit, typename Block>
static inline float VecDotQ45KAvx512(int64_t n, const Block* w, const BlockQ8K* a) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i v16 = _mm512_set1_epi8(0x10);
  const __m512i nibble_shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
  return ReduceSuperBlocksF16<true>(
      n / kQK, w, a, [&](int64_t i, __m256i& isum_out, __m256i& msum_out) {
        const Block& b = w[i];
        const BlockQ8K& y = a[i];
        const __m128i scm = UnpackQ4KScalesVec(b.scales);  // [sc0..7, m0..7]
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(scm, scm));
        const __m256i msum_v = _mm256_madd_epi16(mins, Load256(y.bsums));
        const __m512i sc = _mm512_broadcast_i32x4(scm);
        __m512i hbx;
        if constexpr (kHasHighBit) {
          const __m256i hb = Load256(b.qh);
          hbx = Concat(hb, _mm256_srli_epi16(hb, 1));  // lanes 32..63 see bit t+1
        }
        // P_c: int32 sums of 4 products (|P| <= 4 * 31 * 128: packs to int16 exactly).
        __m512i p[4];
        for (int c = 0; c < 4; ++c) {
          const __m512i q = _mm512_broadcast_i64x4(Load256(b.qs + 32 * c));
          __m512i codes = _mm512_and_si512(_mm512_srlv_epi16(q, nibble_shift), m4);
          if constexpr (kHasHighBit) {  // bit 2c (bytes 0..31) | 2c+1 (bytes 32..63) of qh
            const __mmask64 h = _mm512_test_epi8_mask(hbx, _mm512_set1_epi8(1 << (2 * c)));
            codes = _mm512_mask_add_epi8(codes, h, codes, v16);
          }
          p[c] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes, Load512(y.qs + 64 * c));
        }
        const __m512i s01 = _mm512_shuffle_epi8(sc, _mm512_load_si512(kPackedScale.ctl[0]));
        const __m512i s23 = _mm512_shuffle_epi8(sc, _mm512_load_si512(kPackedScale.ctl[1]));
        const __m512i isum_v =
            _mm512_dpwssd_epi32(_mm512_madd_epi16(_mm512_packs_epi32(p[0], p[1]), s01),
                                _mm512_packs_epi32(p[2], p[3]), s23);
        isum_out = Fold512(isum_v);
        msum_out = msum_v;
      });
}

float VecDotQ4KAvx512(int64_t n, const void* w, const void* a) {
  return VecDotQ45KAvx512<false>(n, static_cast<const BlockQ4K*>(w),
                                 static_cast<const BlockQ8K*>(a));
}
float VecDotQ5KAvx512(int64_t n, const void* w, const void* a) {
  return VecDotQ45KAvx512<true>(n, static_cast<const BlockQ5K*>(w),
                                static_cast<const BlockQ8K*>(a));
}

float VecDotQ6KAvx512(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const BlockQ6K*>(vw);
  const auto* a = static_cast<const BlockQ8K*>(va);
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i m30 = _mm512_set1_epi8(0x30);
  return ReduceSuperBlocksF16<false>(
      n / kQK, w, a, [&](int64_t i, __m256i& isum_out, __m256i& msum_out) {
        const BlockQ6K& b = w[i];
        const BlockQ8K& y = a[i];
        const __m256i s16_256 = _mm256_cvtepi8_epi16(Load128(b.scales));
        const __m256i corr = _mm256_madd_epi16(s16_256, Load256(y.bsums));
        const __m512i s16 = _mm512_castsi256_si512(s16_256);
        __m512i isum_v = _mm512_setzero_si512();
        for (int half = 0; half < 2; ++half) {
          const __m512i ql = Load512(b.ql + 64 * half);
          const __m256i qh = Load256(b.qh + 32 * half);
          const __m512i qhx = Concat(qh, _mm256_srli_epi16(qh, 2));
          // Elements 0..63 of the half: low nibbles + qh bits 0-1 | 2-3.
          const __m512i w01 = _mm512_or_si512(_mm512_and_si512(ql, m4),
                                              _mm512_and_si512(_mm512_slli_epi16(qhx, 4), m30));
          // Elements 64..127: high nibbles + qh bits 4-5 | 6-7.
          const __m512i w23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                              _mm512_and_si512(qhx, m30));
          isum_v = Dot64(isum_v, w01, y.qs + 128 * half, GroupScales(s16, 8 * half));
          isum_v = Dot64(isum_v, w23, y.qs + 128 * half + 64, GroupScales(s16, 8 * half + 4));
        }
        isum_out = _mm256_sub_epi32(Fold512(isum_v), _mm256_slli_epi32(corr, 5));
        msum_out = _mm256_setzero_si256();
      });
}

// ---------------------------------------------------------------------------------------------
// vec_dot_tile (Q4_K, Q5_K, Q6_K): rows x tokens, each output bit for bit the vec_dot above.
// A weight super-block is unpacked once (codes and per-lane scales in registers) and dotted with
// the super-block of up to kTileTokens tokens; each (row, token) keeps vec_dot's own float
// sequence (FinishSuperBlocks over groups of 4 super-blocks, in order). Reads the GGUF blocks
// as they are: no repacked copy of the weights.

namespace {

// One unpacked weight super-block: codes[k] lines up with activation bytes 64k..64k+63 and
// scales[k] holds their int16 lane scales. Q4_K/Q5_K: aux16 = the 8 mins, each twice (pairs
// with the 16 bsums); Q6_K: aux16 = the 16 group scales (the "- 32" correction).
struct UnpackedSuperBlock512 {
  __m512i codes[4];
  __m512i scales[4];
  __m256i aux16;
  float d;
  float dmin;
};

template <bool kHasHighBit, typename Block>
inline void UnpackQ45K512(const Block& b, UnpackedSuperBlock512& u) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i v16 = _mm512_set1_epi8(0x10);
  const __m128i scm = UnpackQ4KScalesVec(b.scales);  // [sc0..7, m0..7]
  u.aux16 = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(scm, scm));
  const __m512i s16 = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(scm));
  __m512i hbx;
  if constexpr (kHasHighBit) {
    const __m256i hb = Load256(b.qh);
    hbx = Concat(hb, _mm256_srli_epi16(hb, 1));
  }
  for (int h = 0; h < 2; ++h) {
    const __m512i q = Load512(b.qs + 64 * h);
    const __m512i lo = _mm512_and_si512(q, m4);
    const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
    __m512i w0 = _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(1, 0, 1, 0));
    __m512i w1 = _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(3, 2, 3, 2));
    if constexpr (kHasHighBit) {
      const __mmask64 h0 = _mm512_test_epi8_mask(hbx, _mm512_set1_epi8(1 << (4 * h)));
      const __mmask64 h1 = _mm512_test_epi8_mask(hbx, _mm512_set1_epi8(1 << (4 * h + 2)));
      w0 = _mm512_mask_add_epi8(w0, h0, w0, v16);
      w1 = _mm512_mask_add_epi8(w1, h1, w1, v16);
    }
    u.codes[2 * h] = w0;
    u.codes[2 * h + 1] = w1;
    u.scales[2 * h] = SubBlockScales(s16, 4 * h);
    u.scales[2 * h + 1] = SubBlockScales(s16, 4 * h + 2);
  }
  u.d = F16(b.d);
  u.dmin = F16(b.dmin);
}

inline void UnpackQ6K512(const BlockQ6K& b, UnpackedSuperBlock512& u) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i m30 = _mm512_set1_epi8(0x30);
  u.aux16 = _mm256_cvtepi8_epi16(Load128(b.scales));
  const __m512i s16 = _mm512_castsi256_si512(u.aux16);
  for (int half = 0; half < 2; ++half) {
    const __m512i ql = Load512(b.ql + 64 * half);
    const __m256i qh = Load256(b.qh + 32 * half);
    const __m512i qhx = Concat(qh, _mm256_srli_epi16(qh, 2));
    u.codes[2 * half] =
        _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_and_si512(_mm512_slli_epi16(qhx, 4), m30));
    u.codes[2 * half + 1] =
        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4), _mm512_and_si512(qhx, m30));
    u.scales[2 * half] = GroupScales(s16, 8 * half);
    u.scales[2 * half + 1] = GroupScales(s16, 8 * half + 4);
  }
  u.d = F16(b.d);
  u.dmin = 0.0f;
}

// The exact sums of one unpacked super-block with one activation super-block (as vec_dot).
template <bool kQ6K>
inline SuperBlockSums DotUnpacked512(const UnpackedSuperBlock512& u, const BlockQ8K& y) {
  __m512i isum_v = _mm512_setzero_si512();
  for (int k = 0; k < 4; ++k) isum_v = Dot64(isum_v, u.codes[k], y.qs + 64 * k, u.scales[k]);
  const __m256i aux = _mm256_madd_epi16(u.aux16, Load256(y.bsums));
  if constexpr (kQ6K) {
    return {_mm256_sub_epi32(Fold512(isum_v), _mm256_slli_epi32(aux, 5)), _mm256_setzero_si256(),
            y.d * u.d, 0.0f};
  } else {
    return {Fold512(isum_v), aux, y.d * u.d, y.d * u.dmin};
  }
}

constexpr int kTileTokens = 8;  // tokens sharing one unpacked weight super-block
constexpr int kRowBlock = 4;    // rows whose weights stay in L1 across the token groups

// out[t * out_stride + r] for kTokens tokens starting at `a` and rows 0..n_rows-1.
template <int kTokens, typename Block, bool kQ6K, typename UnpackFn>
inline void TileRowsK512(int64_t nb, const uint8_t* w, size_t w_stride, int n_rows,
                         const uint8_t* a, size_t a_stride, float* out, size_t out_stride,
                         UnpackFn unpack) {
  for (int r = 0; r < n_rows; ++r) {
    const auto* wr = reinterpret_cast<const Block*>(w + r * w_stride);
    float acc[kTokens] = {};
    SuperBlockSums s[kTokens][4];
    for (int64_t i0 = 0; i0 < nb; i0 += 4) {
      const int count = static_cast<int>(nb - i0 < 4 ? nb - i0 : 4);
      for (int k = 0; k < 4; ++k) {
        if (k < count) {
          UnpackedSuperBlock512 u;
          unpack(wr[i0 + k], u);
          for (int t = 0; t < kTokens; ++t) {
            const auto* at = reinterpret_cast<const BlockQ8K*>(a + t * a_stride);
            s[t][k] = DotUnpacked512<kQ6K>(u, at[i0 + k]);
          }
        } else {
          for (int t = 0; t < kTokens; ++t) {
            s[t][k] = SuperBlockSums{_mm256_setzero_si256(), _mm256_setzero_si256(), 0.0f, 0.0f};
          }
        }
      }
      for (int t = 0; t < kTokens; ++t) acc[t] = FinishSuperBlocks(acc[t], s[t], count);
    }
    for (int t = 0; t < kTokens; ++t) out[t * out_stride + r] = acc[t];
  }
}

template <typename Block, bool kQ6K, typename UnpackFn>
inline void VecDotTileK512(int64_t n, const void* vw, size_t w_stride, int n_rows, const void* va,
                           size_t a_stride, int n_tokens, float* out, size_t out_stride,
                           UnpackFn unpack) {
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
      TileRowsK512<kTileTokens, Block, kQ6K>(nb, wb, w_stride, rows, a + t * a_stride, a_stride,
                                             ob + t * out_stride, out_stride, unpack);
    }
    // The remaining 0..7 tokens as 4 + 2 + 1.
    if (n_tokens - t >= 4) {
      TileRowsK512<4, Block, kQ6K>(nb, wb, w_stride, rows, a + t * a_stride, a_stride,
                                   ob + t * out_stride, out_stride, unpack);
      t += 4;
    }
    if (n_tokens - t >= 2) {
      TileRowsK512<2, Block, kQ6K>(nb, wb, w_stride, rows, a + t * a_stride, a_stride,
                                   ob + t * out_stride, out_stride, unpack);
      t += 2;
    }
    if (n_tokens - t >= 1) {
      TileRowsK512<1, Block, kQ6K>(nb, wb, w_stride, rows, a + t * a_stride, a_stride,
                                   ob + t * out_stride, out_stride, unpack);
    }
  }
}

}  // namespace

void VecDotTileQ4KAvx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                         size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  if (n_tokens == 1) return VecDotRowsOneToken(VecDotQ4KAvx512, n, w, w_stride, n_rows, a, out);
  VecDotTileK512<BlockQ4K, false>(
      n, w, w_stride, n_rows, a, a_stride, n_tokens, out, out_stride,
      [](const BlockQ4K& b, UnpackedSuperBlock512& u) { UnpackQ45K512<false>(b, u); });
}
void VecDotTileQ5KAvx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                         size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  if (n_tokens == 1) return VecDotRowsOneToken(VecDotQ5KAvx512, n, w, w_stride, n_rows, a, out);
  VecDotTileK512<BlockQ5K, false>(
      n, w, w_stride, n_rows, a, a_stride, n_tokens, out, out_stride,
      [](const BlockQ5K& b, UnpackedSuperBlock512& u) { UnpackQ45K512<true>(b, u); });
}
void VecDotTileQ6KAvx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                         size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  if (n_tokens == 1) return VecDotRowsOneToken(VecDotQ6KAvx512, n, w, w_stride, n_rows, a, out);
  VecDotTileK512<BlockQ6K, true>(
      n, w, w_stride, n_rows, a, a_stride, n_tokens, out, out_stride,
      [](const BlockQ6K& b, UnpackedSuperBlock512& u) { UnpackQ6K512(b, u); });
}

}  // namespace kiln::kquants
