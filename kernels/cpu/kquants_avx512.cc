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
#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/transpose_avx512.h"
#include "kernels/cpu/unroll.h"

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
// Packed group scales (Q6_K's one-token dot): for packs_epi32(P_2q, P_2q+1) of the per-chunk
// vpdpbusd sums (dword l of P_c: group 4c + l / 4), 128-bit lane k holds words 0..3 of P_2q (group
// 8q + k) and words 4..7 of P_2q+1 (group 8q + 4 + k).
struct ScaleIndexTables {
  alignas(64) int16_t group[4][32];
  alignas(64) int16_t sub_block[4][32];
  alignas(64) int16_t packed_group[2][32];
  constexpr ScaleIndexTables() : group(), sub_block(), packed_group() {
    for (int t = 0; t < 4; ++t) {
      for (int l = 0; l < 32; ++l) {
        group[t][l] = static_cast<int16_t>(4 * t + l / 8);
        sub_block[t][l] = static_cast<int16_t>(2 * t + l / 16);
      }
    }
    for (int q = 0; q < 2; ++q) {
      for (int l = 0; l < 32; ++l) {
        packed_group[q][l] = static_cast<int16_t>(8 * q + (l % 8 < 4 ? 0 : 4) + l / 8);
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

// The 256 codes of a Q4_K / Q5_K super-block as unsigned bytes in element order: codes[k] lines
// up with activation bytes 64k..64k+63.
template <bool kHasHighBit, typename Block>
inline void Q45KCodes512(const Block& b, __m512i codes[4]) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i v16 = _mm512_set1_epi8(0x10);
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
    codes[2 * h] = w0;
    codes[2 * h + 1] = w1;
  }
}

// The 256 codes (q6 in 0..63, the "- 32" not applied) of a Q6_K super-block, as Q45KCodes512:
// the low nibbles from ql, bits 4-5 from qh, merged by one bit select (vpternlogd 0xCA: m4 ? ql :
// high bits) each.
inline void Q6KCodes512(const BlockQ6K& b, __m512i codes[4]) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i m33 = _mm512_set1_epi8(0x33);
  for (int half = 0; half < 2; ++half) {
    const __m512i ql = Load512(b.ql + 64 * half);
    const __m256i qh = Load256(b.qh + 32 * half);
    // Per byte, bits 0-1: the high bits of codes 0..63 of the half; bits 4-5: of 64..127.
    const __m512i hb = _mm512_and_si512(Concat(qh, _mm256_srli_epi16(qh, 2)), m33);
    codes[2 * half] = _mm512_ternarylogic_epi32(m4, ql, _mm512_slli_epi16(hb, 4), 0xCA);
    codes[2 * half + 1] = _mm512_ternarylogic_epi32(m4, _mm512_srli_epi16(ql, 4), hb, 0xCA);
  }
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
  const __m512i scale_index0 = _mm512_load_si512(kScaleIndex.packed_group[0]);
  const __m512i scale_index1 = _mm512_load_si512(kScaleIndex.packed_group[1]);
  return ReduceSuperBlocksF16<false>(
      n / kQK, w, a, [&](int64_t i, __m256i& isum_out, __m256i& msum_out) {
        const BlockQ6K& b = w[i];
        const BlockQ8K& y = a[i];
        const __m256i s16_256 = _mm256_cvtepi8_epi16(Load128(b.scales));
        const __m256i corr = _mm256_madd_epi16(s16_256, Load256(y.bsums));
        const __m512i s16 = _mm512_castsi256_si512(s16_256);
        __m512i codes[4];
        Q6KCodes512(b, codes);
        // P_c: int32 sums of 4 products (|P| <= 4 * 63 * 128: packs to int16 exactly).
        __m512i p[4];
        for (int c = 0; c < 4; ++c) {
          p[c] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes[c], Load512(y.qs + 64 * c));
        }
        const __m512i isum_v = _mm512_dpwssd_epi32(
            _mm512_madd_epi16(_mm512_packs_epi32(p[0], p[1]),
                              _mm512_permutexvar_epi16(scale_index0, s16)),
            _mm512_packs_epi32(p[2], p[3]), _mm512_permutexvar_epi16(scale_index1, s16));
        isum_out = _mm256_sub_epi32(Fold512(isum_v), _mm256_slli_epi32(corr, 5));
        msum_out = _mm256_setzero_si256();
      });
}

namespace {

// ---- One token over many rows (decode): Q4_K / Q5_K, 4 rows a pass ----
// The one-token vec_dot spends about 39 vector instructions on a 144-byte Q4_K super-block, so
// one core cannot stream the weights faster than about 22 GB/s. Four rows a pass share what is
// per token or per super-block: the token's Q8_K row is rearranged once a call (OneTokenQ8K) so
// that a 64-byte load of qs needs no cross-lane shuffle (the low nibbles of qs[0..63] are
// elements 0..31 | 64..95 and line up with one activation vector as they are); the four rows'
// first 16 bytes (d, dmin, 12 scale bytes) sit one row per 128-bit lane, so one unpack, one min
// product and one f16 conversion serve all four; the sixteen (super-block, row) integer sums
// reduce together, and vec_dot's float step runs on sixteen lanes. Each output keeps vec_dot's
// exact isum / msum and its IEEE operations in order: the same bits.

// One token's Q8_K row, rearranged: per super-block i, qs[4i + c] for the nibble planes of
// qs[0..63] (c = 0: low, 1: high) and qs[64..127] (c = 2, 3); sub_sums[i] the eight sub-block
// sums (bsums pairs) as int16; d4[i] = d four times.
struct OneTokenQ8K {
  const __m512i* qs;
  const __m128i* sub_sums;
  const __m128* d4;
};

inline OneTokenQ8K RearrangeOneToken(const BlockQ8K* a, int64_t nb) {
  const int64_t nb4 = (nb + 3) / 4 * 4;  // the float step reads d4 four super-blocks at a time
  auto* base = static_cast<uint8_t*>(
      kernels::ThreadScratch(0, nb * 4 * sizeof(__m512i) + nb4 * 2 * sizeof(__m128i)));
  auto* qs = reinterpret_cast<__m512i*>(base);
  auto* sub_sums = reinterpret_cast<__m128i*>(base + nb * 4 * sizeof(__m512i));
  auto* d4 = reinterpret_cast<__m128*>(sub_sums + nb4);
  for (int64_t i = 0; i < nb; ++i) {
    const BlockQ8K& y = a[i];
    for (int h = 0; h < 2; ++h) {
      const int8_t* q = y.qs + 128 * h;
      qs[4 * i + 2 * h] = Concat(Load256(q), Load256(q + 64));
      qs[4 * i + 2 * h + 1] = Concat(Load256(q + 32), Load256(q + 96));
    }
    sub_sums[i] = _mm_hadd_epi16(Load128(y.bsums), Load128(y.bsums + 8));  // |sum| <= 32 * 128
    d4[i] = _mm_set1_ps(y.d);
  }
  for (int64_t i = nb; i < nb4; ++i) d4[i] = _mm_setzero_ps();
  return {qs, sub_sums, d4};
}

// vpermw controls: the int16 scale of every word of packs_epi32(P_lo, P_hi) for row r, picked
// from the scales sc0..sc7 as words in 128-bit lane r. P_lo / P_hi are the vpdpbusd sums of the
// low / high nibble plane of the 64-byte half h of qs: dwords 0..7 belong to sub-block 4h + (0 |
// 1) and 8..15 to 4h + 2 + (0 | 1); packs puts dwords 4L..4L+3 of P_lo, then of P_hi, in 128-bit
// lane L.
struct OneTokenScaleControls {
  alignas(64) int16_t ctl[4][2][32];  // [row][half h]
  constexpr OneTokenScaleControls() : ctl() {
    for (int r = 0; r < 4; ++r) {
      for (int h = 0; h < 2; ++h) {
        for (int word = 0; word < 32; ++word) {
          const int lane = word / 8;
          const int sub_block = 4 * h + (lane < 2 ? 0 : 2) + (word % 8 < 4 ? 0 : 1);
          ctl[r][h][word] = static_cast<int16_t>(8 * r + sub_block);
        }
      }
    }
  }
};
constexpr OneTokenScaleControls kOneTokenScale;

// Dword k of 128-bit lane L: the sum of v[k]'s four dwords in lane L (k = 0..3).
inline __m512i InLaneSums4(const __m512i v[4]) {
  const __m512i a01 = _mm512_add_epi32(_mm512_unpacklo_epi32(v[0], v[1]),
                                       _mm512_unpackhi_epi32(v[0], v[1]));  // [0 1 0 1] / lane
  const __m512i a23 =
      _mm512_add_epi32(_mm512_unpacklo_epi32(v[2], v[3]), _mm512_unpackhi_epi32(v[2], v[3]));
  return _mm512_add_epi32(_mm512_unpacklo_epi64(a01, a23),
                          _mm512_unpackhi_epi64(a01, a23));  // [0 1 2 3] / lane
}

// 128-bit lane k: the sum of w[k]'s four 128-bit lanes (k = 0..3).
inline __m512i CrossLaneSums4(const __m512i w[4]) {
  const __m512i c01 = _mm512_add_epi32(_mm512_shuffle_i32x4(w[0], w[1], 0x88),
                                       _mm512_shuffle_i32x4(w[0], w[1], 0xDD));
  const __m512i c23 = _mm512_add_epi32(_mm512_shuffle_i32x4(w[2], w[3], 0x88),
                                       _mm512_shuffle_i32x4(w[2], w[3], 0xDD));
  return _mm512_add_epi32(_mm512_shuffle_i32x4(c01, c23, 0x88),
                          _mm512_shuffle_i32x4(c01, c23, 0xDD));
}

// The Q4_K/Q5_K scale unpack (UnpackQ4KScalesVec) of four rows at once: lane r of `head` holds
// row r's first 16 bytes [d | dmin, scale bytes 0..11]; lane r of the result [sc0..7, m0..7].
inline __m512i UnpackQ4KScalesFourRows(__m512i head) {
  const __m512i a = _mm512_shuffle_epi32(head, static_cast<_MM_PERM_ENUM>(0xED));  // [u0 u2 u1 u2]
  const __m512i b = _mm512_shuffle_epi32(head, static_cast<_MM_PERM_ENUM>(0xA5));  // [u0 u0 u1 u1]
  const __m512i low =
      _mm512_and_si512(_mm512_srlv_epi32(a, _mm512_set4_epi32(4, 0, 0, 0)),
                       _mm512_set4_epi32(0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F));
  // low | (b >> 2 & [0, 0x30.., 0, 0x30..])
  return _mm512_ternarylogic_epi32(low, _mm512_srli_epi32(b, 2),
                                   _mm512_set4_epi32(0x30303030, 0, 0x30303030, 0), 0xF8);
}

// The four rows' results of a four-row kernel: group(i0, count) returns the float-step terms of
// super-blocks i0 .. i0 + count - 1 (lane 4k + r: row r, super-block i0 + k; count < 4 only for
// the last group); each row's terms are added from +0 in super-block order, as vec_dot does.
template <typename GroupFn>
inline __m128 SumFourRowsTerms(int64_t nb, GroupFn&& group) {
  __m128 acc = _mm_setzero_ps();  // rows 0..3
  auto add = [&](__m512 t, int count) {
    acc = _mm_add_ps(acc, _mm512_castps512_ps128(t));
    if (count > 1) acc = _mm_add_ps(acc, _mm512_extractf32x4_ps(t, 1));
    if (count > 2) acc = _mm_add_ps(acc, _mm512_extractf32x4_ps(t, 2));
    if (count > 3) acc = _mm_add_ps(acc, _mm512_extractf32x4_ps(t, 3));
  };
  int64_t i0 = 0;
  for (; i0 + 4 <= nb; i0 += 4) add(group(i0, 4), 4);
  if (i0 < nb) {
    const int count = static_cast<int>(nb - i0);
    add(group(i0, count), count);
  }
  return acc;
}

// How far ahead of each of the four row streams of the file's rows the weights are prefetched
// into L2. The hardware prefetcher alone does not keep four interleaved streams going
// (llama-1b-q4_K decode, 1 thread, kiln generate: 16 tok/s without, 41 at kStreamPrefetchBytes'
// 8 KiB, 44 at 16, 48-50 at 24-64; into L1 at 8 KiB: 19). The legacy and float kernels measured
// no faster at 32 KiB.
constexpr size_t kFourRowsPrefetchBytes = 32768;
// The same for the copy's quads, one stream (cpu_ops_bench --stream, 2048 x 8192 matrices, 1
// thread, GB/s Q4_K / Q6_K: 2 KiB 34 / 30, 4 KiB 36 / 35, 8 KiB 40 / 36, 12 KiB 40 / 33, 32 KiB
// 40 / 30, without 34 / 31; the file's rows at their best, 32 KiB: 33 / 28).
constexpr size_t kQuadPrefetchBytes = 8192;

// Where the kernels below find a row's super-blocks: the file's rows (row r at r * w_stride, its
// super-blocks consecutive) or the interleaved copy's quads (kernels/cpu/kquants.h: quad r / 4,
// row r % 4's super-block i at slot 4i + r % 4, the last quad whole).
struct SuperBlockRows {
  const uint8_t* base;
  size_t quad_stride;        // row r to r + 4, r a multiple of 4
  size_t row_stride;         // row r to r + 1 within a quad
  size_t sb_stride;          // a row's super-block i to i + 1
  size_t prefetch_distance;  // bytes ahead of the block in use that the one-token kernels fetch
  bool whole_quads;          // rows up to the next multiple of 4 exist (zero past n_rows)
  const uint8_t* Row(int r) const {
    return base + static_cast<size_t>(r / kQuadRows) * quad_stride +
           static_cast<size_t>(r % kQuadRows) * row_stride;
  }
};

template <typename Block>
SuperBlockRows FileRows(const void* w, size_t w_stride) {
  return {static_cast<const uint8_t*>(w),
          kQuadRows * w_stride,
          w_stride,
          sizeof(Block),
          kFourRowsPrefetchBytes,
          false};
}

template <typename Block>
SuperBlockRows CopyQuads(const void* groups, int64_t nb) {
  return {static_cast<const uint8_t*>(groups),
          kQuadRows * nb * sizeof(Block),
          sizeof(Block),
          kQuadRows * sizeof(Block),
          kQuadPrefetchBytes,
          true};
}

// out[0..3] for rows r0 .. r0 + 3 (r0 a multiple of 4) and the token `act`, each vec_dot's bits.
template <bool kHasHighBit, typename Block>
inline void Q45KFourRows(int64_t nb, const SuperBlockRows& rows, int r0, const OneTokenQ8K& act,
                         float* out) {
  const uint8_t* w = rows.Row(r0);
  const size_t w_stride = rows.row_stride;
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i v16 = _mm512_set1_epi8(0x10);
  const __m512i zero = _mm512_setzero_si512();
  // pair_index[4k + r] = 4r: the d | dmin dword of row r (lane r) into dword r of lane k.
  const __m512i pair_index = _mm512_set4_epi32(12, 8, 4, 0);
  // k_major[4k + r] = 4r + k: [row][super-block] -> [super-block][row].
  const __m512i k_major = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  // Super-blocks i0 .. i0 + count - 1 (count <= 4): the exact sums, then the float step's terms.
  auto four_super_blocks = [&](int64_t i0, int count) {
    __m512i isum[4], msum[4];
    __m512i pairs = zero;  // dword 4k + r: row r's d | dmin of super-block i0 + k
    for (int k = 0; k < 4; ++k) {
      if (k >= count) {
        isum[k] = zero;
        msum[k] = zero;
        continue;
      }
      const int64_t i = i0 + k;
      const uint8_t* b0 = w + i * rows.sb_stride;
      __m512i head = _mm512_castsi128_si512(Load128(b0));
      head = _mm512_inserti32x4(head, Load128(b0 + w_stride), 1);
      head = _mm512_inserti32x4(head, Load128(b0 + 2 * w_stride), 2);
      head = _mm512_inserti32x4(head, Load128(b0 + 3 * w_stride), 3);
      pairs = _mm512_mask_permutexvar_epi32(pairs, static_cast<__mmask16>(0xF << (4 * k)),
                                            pair_index, head);
      const __m512i scm = UnpackQ4KScalesFourRows(head);
      msum[k] = _mm512_madd_epi16(_mm512_unpackhi_epi8(scm, zero),
                                  _mm512_broadcast_i32x4(act.sub_sums[i]));
      const __m512i sc16 = _mm512_unpacklo_epi8(scm, zero);  // lane r: row r's sc0..7
      __m512i row_sums[4];
      for (int r = 0; r < 4; ++r) {
        const Block& blk = *reinterpret_cast<const Block*>(b0 + r * w_stride);
        PrefetchStreamAhead(&blk, sizeof(Block), rows.prefetch_distance);
        __m512i hbx;
        if constexpr (kHasHighBit) {
          hbx = _mm512_broadcast_i64x4(Load256(blk.qh));
        }
        __m512i x[2];
        for (int h = 0; h < 2; ++h) {
          const __m512i q = Load512(blk.qs + 64 * h);
          __m512i lo = _mm512_and_si512(q, m4);
          __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
          if constexpr (kHasHighBit) {
            // Bytes 0..31 of the low plane take bit 4h of qh, bytes 32..63 bit 4h + 2; the high
            // plane the next bit up.
            const __m512i bit_lo = Concat(_mm256_set1_epi8(static_cast<char>(1 << (4 * h))),
                                          _mm256_set1_epi8(static_cast<char>(4 << (4 * h))));
            const __mmask64 hl = _mm512_test_epi8_mask(hbx, bit_lo);
            const __mmask64 hh = _mm512_test_epi8_mask(hbx, _mm512_add_epi8(bit_lo, bit_lo));
            lo = _mm512_mask_add_epi8(lo, hl, lo, v16);
            hi = _mm512_mask_add_epi8(hi, hh, hi, v16);
          }
          // |P| <= 4 * 31 * 128: packs to int16 exactly.
          const __m512i p_lo = _mm512_dpbusd_epi32(zero, lo, act.qs[4 * i + 2 * h]);
          const __m512i p_hi = _mm512_dpbusd_epi32(zero, hi, act.qs[4 * i + 2 * h + 1]);
          x[h] = _mm512_packs_epi32(p_lo, p_hi);
        }
        const __m512i s0 =
            _mm512_permutexvar_epi16(_mm512_load_si512(kOneTokenScale.ctl[r][0]), sc16);
        const __m512i s1 =
            _mm512_permutexvar_epi16(_mm512_load_si512(kOneTokenScale.ctl[r][1]), sc16);
        row_sums[r] = _mm512_dpwssd_epi32(_mm512_madd_epi16(x[0], s0), x[1], s1);
      }
      isum[k] = InLaneSums4(row_sums);
    }
    const __m512i isum_k = CrossLaneSums4(isum);                                  // [k][r]
    const __m512i msum_k = _mm512_permutexvar_epi32(k_major, InLaneSums4(msum));  // [k][r]
    // vec_dot's float step (FinishFourSuperBlocksF16) on 16 lanes: t = (a.d * d) * isum -
    // (a.d * dmin) * msum.
    const __m512 ad = _mm512_loadu_ps(reinterpret_cast<const float*>(act.d4 + i0));
    const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(pairs));
    const __m512 dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(pairs, 16)));
    const __m512 t =
        _mm512_sub_ps(_mm512_mul_ps(_mm512_mul_ps(ad, d), _mm512_cvtepi32_ps(isum_k)),
                      _mm512_mul_ps(_mm512_mul_ps(ad, dmin), _mm512_cvtepi32_ps(msum_k)));
    return t;
  };
  _mm_storeu_ps(out, SumFourRowsTerms(nb, four_super_blocks));
}

// One token (a: one Q8_K row) over n_rows rows: four at a time; the rest by vec_dot (the file's
// rows) or as a whole quad (the copy's).
template <bool kHasHighBit, typename Block>
inline void OneTokenRowsQ45K512(int64_t n, const SuperBlockRows& rows, int n_rows, const void* va,
                                float* out) {
  const auto* a = static_cast<const BlockQ8K*>(va);
  const int64_t nb = n / kQK;
  int r = 0;
  if (n_rows >= 4 || (rows.whole_quads && n_rows > 0)) {
    const OneTokenQ8K act = RearrangeOneToken(a, nb);
    for (; r + 4 <= n_rows; r += 4) Q45KFourRows<kHasHighBit, Block>(nb, rows, r, act, out + r);
    if (rows.whole_quads && r < n_rows) {
      float quad[kQuadRows];
      Q45KFourRows<kHasHighBit, Block>(nb, rows, r, act, quad);
      for (; r < n_rows; ++r) out[r] = quad[r % kQuadRows];
    }
  }
  for (; r < n_rows; ++r) {
    out[r] = VecDotQ45KAvx512<kHasHighBit>(n, reinterpret_cast<const Block*>(rows.Row(r)), a);
  }
}

// ---- One token over many rows (decode): Q6_K, 4 rows a pass ----
// As Q45KFourRows, for Q6_K: its codes need no rearranged activations (Q6KCodes512 lines them up
// with the Q8_K bytes as they are); two rows' 16 int8 scales widen in one instruction; the
// "- 32" correction (-32 * sum_g s_g * bsums_g) is one masked vpdpwssd per row into its own
// sums (32 s_g against -bsums_g: both fit int16); the sixteen d of four super-blocks come in one
// gather. Same bits as vec_dot.
inline void Q6KFourRows(int64_t nb, const SuperBlockRows& rows, int r0, const BlockQ8K* a,
                        float* out) {
  const uint8_t* w = rows.Row(r0);
  const size_t w_stride = rows.row_stride;
  const __m512i zero = _mm512_setzero_si512();
  // d_offset[4k + r]: where row r's f16 d of super-block k (of a group of four) ends, read as
  // the high half of the dword at d - 2 (inside the block: no read past the last row).
  constexpr int kDOffset = static_cast<int>(offsetof(BlockQ6K, d)) - 2;
  const int s = static_cast<int>(w_stride), b = static_cast<int>(rows.sb_stride);
  const __m512i d_offset =
      _mm512_add_epi32(_mm512_setr_epi32(0, s, 2 * s, 3 * s, b, b + s, b + 2 * s, b + 3 * s, 2 * b,
                                         2 * b + s, 2 * b + 2 * s, 2 * b + 3 * s, 3 * b, 3 * b + s,
                                         3 * b + 2 * s, 3 * b + 3 * s),
                       _mm512_set1_epi32(kDOffset));
  const __m512i scale_index[2][2] = {
      // [row parity][packs pair]
      {_mm512_load_si512(kScaleIndex.packed_group[0]),
       _mm512_load_si512(kScaleIndex.packed_group[1])},
      {_mm512_add_epi16(_mm512_load_si512(kScaleIndex.packed_group[0]), _mm512_set1_epi16(16)),
       _mm512_add_epi16(_mm512_load_si512(kScaleIndex.packed_group[1]), _mm512_set1_epi16(16))}};
  auto four_super_blocks = [&](int64_t i0, int count) {
    __m512i isum[4];
    for (int k = 0; k < 4; ++k) {
      if (k >= count) {
        isum[k] = zero;
        continue;
      }
      const int64_t i = i0 + k;
      const BlockQ8K& y = a[i];
      const uint8_t* b0 = w + i * rows.sb_stride;
      auto row = [&](int r) -> const BlockQ6K& {
        return *reinterpret_cast<const BlockQ6K*>(b0 + r * w_stride);
      };
      // s16[p]: rows 2p, 2p + 1's sixteen scales as int16 (row 2p in words 0..15).
      __m512i s16[2], s32[2];
      for (int p = 0; p < 2; ++p) {
        s16[p] = _mm512_cvtepi8_epi16(_mm256_inserti128_si256(
            _mm256_castsi128_si256(Load128(row(2 * p).scales)), Load128(row(2 * p + 1).scales), 1));
        s32[p] = _mm512_slli_epi16(s16[p], 5);
      }
      const __m512i neg_bsums = _mm512_sub_epi16(zero, _mm512_broadcast_i64x4(Load256(y.bsums)));
      __m512i row_sums[4];
      for (int r = 0; r < 4; ++r) {
        const BlockQ6K& blk = row(r);
        PrefetchStreamAhead(&blk, sizeof(BlockQ6K), rows.prefetch_distance);
        __m512i codes[4];
        Q6KCodes512(blk, codes);
        __m512i p[4];  // |P| <= 4 * 63 * 128: packs to int16 exactly
        for (int c = 0; c < 4; ++c) {
          p[c] = _mm512_dpbusd_epi32(zero, codes[c], Load512(y.qs + 64 * c));
        }
        const __m512i sw = s16[r / 2];
        __m512i sum = _mm512_dpwssd_epi32(
            _mm512_madd_epi16(_mm512_packs_epi32(p[0], p[1]),
                              _mm512_permutexvar_epi16(scale_index[r % 2][0], sw)),
            _mm512_packs_epi32(p[2], p[3]), _mm512_permutexvar_epi16(scale_index[r % 2][1], sw));
        // Row r's words of s32 meet -bsums in dwords 0..7 (even r) or 8..15 (odd r).
        row_sums[r] = _mm512_mask_dpwssd_epi32(sum, r % 2 ? 0xFF00 : 0x00FF, s32[r / 2], neg_bsums);
      }
      isum[k] = InLaneSums4(row_sums);
    }
    const __m512i isum_k = CrossLaneSums4(isum);  // [k][r]
    const __mmask16 valid = static_cast<__mmask16>((1u << (4 * count)) - 1);
    const __m512i d_dwords =
        _mm512_mask_i32gather_epi32(zero, valid, d_offset, w + i0 * rows.sb_stride, 1);
    const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(d_dwords, 16)));
    alignas(16) float ad4[4] = {};
    for (int k = 0; k < count; ++k) ad4[k] = a[i0 + k].d;
    const __m512 ad =
        _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                              _mm512_castps128_ps512(_mm_load_ps(ad4)));
    // vec_dot's float step (FinishFourSuperBlocksF16<false>): t = (a.d * d) * isum.
    const __m512 t = _mm512_mul_ps(_mm512_mul_ps(ad, d), _mm512_cvtepi32_ps(isum_k));
    return t;
  };
  _mm_storeu_ps(out, SumFourRowsTerms(nb, four_super_blocks));
}

inline void OneTokenRowsQ6K512(int64_t n, const SuperBlockRows& rows, int n_rows, const void* va,
                               float* out) {
  const auto* a = static_cast<const BlockQ8K*>(va);
  int r = 0;
  for (; r + 4 <= n_rows; r += 4) Q6KFourRows(n / kQK, rows, r, a, out + r);
  if (rows.whole_quads && r < n_rows) {
    float quad[kQuadRows];
    Q6KFourRows(n / kQK, rows, r, a, quad);
    for (; r < n_rows; ++r) out[r] = quad[r % kQuadRows];
  }
  for (; r < n_rows; ++r) out[r] = VecDotQ6KAvx512(n, rows.Row(r), a);
}
}  // namespace

// ---------------------------------------------------------------------------------------------
// vec_dot_tile (Q4_K, Q5_K, Q6_K): rows x tokens, each output bit for bit the vec_dot above.
// One token: four rows a pass (Q45KFourRows, Q6KFourRows above). 2..7 tokens: a weight
// super-block is unpacked once (codes and per-lane scales in registers) and dotted with the
// super-block of up to 4 tokens; each (row, token) keeps vec_dot's own float sequence
// (FinishSuperBlocks over groups of 4 super-blocks, in order). 8 or more: the packed path below
// (16 tokens across the lanes). All read the GGUF blocks as they are, in the file's rows or in
// the copy that only reorders them (SuperBlockRows).

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
  const __m128i scm = UnpackQ4KScalesVec(b.scales);  // [sc0..7, m0..7]
  u.aux16 = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(scm, scm));
  const __m512i s16 = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(scm));
  Q45KCodes512<kHasHighBit>(b, u.codes);
  for (int h = 0; h < 2; ++h) {
    u.scales[2 * h] = SubBlockScales(s16, 4 * h);
    u.scales[2 * h + 1] = SubBlockScales(s16, 4 * h + 2);
  }
  u.d = F16(b.d);
  u.dmin = F16(b.dmin);
}

inline void UnpackQ6K512(const BlockQ6K& b, UnpackedSuperBlock512& u) {
  u.aux16 = _mm256_cvtepi8_epi16(Load128(b.scales));
  const __m512i s16 = _mm512_castsi256_si512(u.aux16);
  Q6KCodes512(b, u.codes);
  for (int half = 0; half < 2; ++half) {
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

constexpr int kRowBlock = 4;  // rows whose weights stay in L1 across the token groups

// out[t * out_stride + r] for kTokens tokens starting at `a` and rows r0 .. r0 + n_rows - 1.
template <int kTokens, typename Block, bool kQ6K, typename UnpackFn>
inline void TileRowsK512(int64_t nb, const SuperBlockRows& rows, int r0, int n_rows,
                         const uint8_t* a, size_t a_stride, float* out, size_t out_stride,
                         UnpackFn unpack) {
  for (int r = 0; r < n_rows; ++r) {
    const uint8_t* wr = rows.Row(r0 + r);
    float acc[kTokens] = {};
    SuperBlockSums s[kTokens][4];
    for (int64_t i0 = 0; i0 < nb; i0 += 4) {
      const int count = static_cast<int>(nb - i0 < 4 ? nb - i0 : 4);
      for (int k = 0; k < 4; ++k) {
        if (k < count) {
          UnpackedSuperBlock512 u;
          unpack(*reinterpret_cast<const Block*>(wr + (i0 + k) * rows.sb_stride), u);
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

// ---- Eight or more tokens: 16 tokens across the lanes ----
// The activations of each group of 16 tokens are packed so that one zmm holds the same 4 bytes of
// all 16 tokens; a weight super-block is unpacked once into bytes, and each 4 of them, broadcast,
// meet the 16 tokens' bytes in one vpdpbusd (64 multiply-adds an instruction, where the
// per-token path spends two, vpmaddubsw + vpdpwssd, and a horizontal sum per super-block). Each
// lane keeps its token's exact isum / msum of the contract and runs vec_dot's float step with
// the same IEEE operations in the same order: the same bits.

// One super-block of a group of 16 tokens. Tokens past the end are zero (d = 0).
// Q4_K/Q5_K: qs[k][t] is token t's bytes 4k..4k+3 (signed, against the unsigned codes), and
// bsums[q][t] for q < 4 token t's sub-block sums 2q, 2q+1 (bsums 4q + 4q+1 and 4q+2 + 4q+3,
// |sum| <= 32 * 128: an int16 pair), so the minimums take 4 vpdpwssd where the 16 bsums would
// take 8. Q6_K: qs holds the bytes plus 128 (unsigned, against the signed codes q - 32), so the
// "- 32" of the contract needs no activation sums: sum (a + 128)(q - 32) = sum a (q - 32) +
// 128 sum (q - 32), and the second term is the weights' own (UnpackQ6KBytes); bsums unused.
struct PackedQ8KGroup {
  int32_t qs[64][16];
  int32_t bsums[4][16];
  float d[16];
};
static_assert(sizeof(PackedQ8KGroup) % 64 == 0);

// out[i] for super-blocks i < nb of the n_tokens (1..16) Q8_K rows at a.
template <bool kQ6K>
inline void PackQ8KGroup(const uint8_t* a, size_t a_stride, int n_tokens, int64_t nb,
                         PackedQ8KGroup* out) {
  for (int64_t i = 0; i < nb; ++i) {
    PackedQ8KGroup& p = out[i];
    const BlockQ8K* y[16];
    for (int t = 0; t < 16; ++t) {
      y[t] = t < n_tokens ? reinterpret_cast<const BlockQ8K*>(a + t * a_stride) + i : nullptr;
    }
    __m512i r[16];
    for (int k0 = 0; k0 < 64; k0 += 16) {
      for (int t = 0; t < 16; ++t) {
        r[t] = y[t] != nullptr ? Load512(y[t]->qs + 4 * k0) : _mm512_setzero_si512();
      }
      Transpose16x16(r);
      for (int k = 0; k < 16; ++k) {
        if constexpr (kQ6K) r[k] = _mm512_xor_si512(r[k], _mm512_set1_epi8(-128));  // + 128
        _mm512_store_si512(p.qs[k0 + k], r[k]);
      }
    }
    for (int t = 0; t < 16; ++t) p.d[t] = y[t] != nullptr ? y[t]->d : 0.0f;
    if constexpr (kQ6K) continue;
    for (int t = 0; t < 16; ++t) {  // dwords 0..3 are the pairs; the rest unused
      r[t] = _mm512_setzero_si512();
      if (y[t] == nullptr) continue;
      const __m256i sums = _mm256_madd_epi16(Load256(y[t]->bsums), _mm256_set1_epi16(1));
      const __m128i packed = _mm_packs_epi32(_mm256_castsi256_si128(sums),  // exact: <= 4096
                                             _mm256_extracti128_si256(sums, 1));
      r[t] = _mm512_castsi128_si512(packed);
    }
    Transpose16x16(r);
    for (int q = 0; q < 4; ++q) _mm512_store_si512(p.bsums[q], r[q]);
  }
}

// One weight super-block for the packed path.
struct UnpackedBytes {
  int32_t codes[64];  // codes[k]: elements 4k..4k+3, Q4_K/Q5_K unsigned, Q6_K q - 32 (signed)
  int32_t scale[16];  // Q4_K/Q5_K: sub-block j's scale at j (8 used); Q6_K: group g's at g
  int32_t pair[4];    // Q4_K/Q5_K: int16 pairs (m_2q, m_2q+1) against the packed sub-block sums
  int32_t offset;     // Q6_K: 128 * sum_g scale_g * sum (q - 32), what the + 128 adds to isum
  float d;
  float dmin;
};

template <bool kHasHighBit, typename Block>
inline void UnpackQ45KBytes(const Block& b, UnpackedBytes& u) {
  __m512i codes[4];
  Q45KCodes512<kHasHighBit>(b, codes);
  for (int k = 0; k < 4; ++k) _mm512_storeu_si512(u.codes + 16 * k, codes[k]);
  const __m128i scm = UnpackQ4KScalesVec(b.scales);  // [sc0..7, m0..7]
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(u.scale), _mm256_cvtepu8_epi32(scm));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(u.pair), _mm_cvtepu8_epi16(_mm_srli_si128(scm, 8)));
  u.d = F16(b.d);
  u.dmin = F16(b.dmin);
}

inline void UnpackQ6KBytes(const BlockQ6K& b, UnpackedBytes& u) {
  __m512i codes[4];
  Q6KCodes512(b, codes);
  const __m128i s8 = Load128(b.scales);
  const __m512i scales = _mm512_cvtepi8_epi32(s8);
  // sum_g scale_g * sum of group g's codes: codes[k] holds groups 4k..4k+3, 16 bytes each, and
  // 128-bit lane L of a byte vector of scale 4k + L (vpshufb within lanes) meets group 4k + L.
  const __m512i s8_lanes = _mm512_broadcast_i32x4(s8);
  const __m512i lane = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  __m512i scaled_codes = _mm512_setzero_si512();
  for (int k = 0; k < 4; ++k) {
    const __m512i index = _mm512_mullo_epi32(_mm512_add_epi32(lane, _mm512_set1_epi32(4 * k)),
                                             _mm512_set1_epi32(0x01010101));
    scaled_codes =
        _mm512_dpbusd_epi32(scaled_codes, codes[k], _mm512_shuffle_epi8(s8_lanes, index));
    _mm512_storeu_si512(u.codes + 16 * k, _mm512_sub_epi8(codes[k], _mm512_set1_epi8(32)));
  }
  // Group g's sum of q - 32 is its code sum - 16 * 32 (lane g of scales: scale_g), one
  // reduction for both; |offset| <= 128 * 16 * 128 * 512 < 2^31.
  u.offset =
      128 * _mm512_reduce_add_epi32(_mm512_sub_epi32(scaled_codes, _mm512_slli_epi32(scales, 9)));
  _mm512_storeu_si512(u.scale, scales);
  u.d = F16(b.d);
  u.dmin = 0.0f;
}

constexpr int kPackedMinTokens = 8;  // below: the per-token path (TileRowsK512)
constexpr int kPackedGroups = 4;     // token groups of 16 per pass over the weights

// acc[r][16 (g0 + c) + t] (row r, token t of group g0 + c) plus the float step of one
// super-block, for kRows weight rows and kGroups token groups p[c]: each weight dword broadcast
// once for the kGroups groups, each activation load shared by the kRows rows. (noinline: inlined
// into PackedRowsK512 with both group counts, the one-group pass of Q4_K/Q5_K ran at half speed.)
template <bool kQ6K, int kRows, int kGroups>
__attribute__((noinline)) void DotPackedGroups(const UnpackedBytes* u,
                                               const PackedQ8KGroup* const* p,
                                               float (*acc)[16 * kPackedGroups], int g0) {
  // Q4_K/Q5_K: 8 sub-blocks of 8 dwords; Q6_K: 16 groups of 4. (Unroll: every register array
  // indexed by constants, see unroll.h; with loops GCC kept isum on the stack and copied the
  // chains between registers every k.)
  constexpr int kScales = kQ6K ? 16 : 8, kDwords = 64 / kScales;
  // Two scale groups at a time, their dword steps interleaved: 2 x kRows x kGroups independent
  // vpdpbusd chains. With the 8 chains of one group this core (2 vpdpbusd a cycle, 4 cycles of
  // latency) ran at 89% of its rate on vpdpbusd alone and the K-quants' loop well below the
  // instruction mix's bound; two groups made the 1536 x 576 x 512-token tiles 2-4% faster
  // (Zen 5).
  constexpr int kInterleave = 2;
  __m512i isum[kRows][kGroups];
  Unroll<kRows>(
      [&](auto r) { Unroll<kGroups>([&](auto c) { isum[r][c] = _mm512_setzero_si512(); }); });
  for (int j0 = 0; j0 < kScales; j0 += kInterleave) {
    __m512i s[kInterleave][kRows][kGroups];
    Unroll<kInterleave>([&](auto h) {
      Unroll<kRows>(
          [&](auto r) { Unroll<kGroups>([&](auto c) { s[h][r][c] = _mm512_setzero_si512(); }); });
    });
    Unroll<kDwords>([&](auto kk) {
      Unroll<kInterleave>([&](auto h) {
        const int k = kDwords * (j0 + h) + kk;
        __m512i a[kGroups];
        Unroll<kGroups>([&](auto c) { a[c] = _mm512_load_si512(p[c]->qs[k]); });
        Unroll<kRows>([&](auto r) {
          const __m512i w = _mm512_set1_epi32(u[r].codes[k]);
          Unroll<kGroups>([&](auto c) {  // the unsigned operand first
            s[h][r][c] = kQ6K ? _mm512_dpbusd_epi32(s[h][r][c], a[c], w)
                              : _mm512_dpbusd_epi32(s[h][r][c], w, a[c]);
          });
        });
      });
    });
    Unroll<kInterleave>([&](auto h) {
      Unroll<kRows>([&](auto r) {
        const __m512i scale = _mm512_set1_epi32(u[r].scale[j0 + h]);
        Unroll<kGroups>([&](auto c) {
          isum[r][c] = _mm512_add_epi32(isum[r][c], _mm512_mullo_epi32(s[h][r][c], scale));
        });
      });
    });
  }
  Unroll<kGroups>([&](auto c) {
    const __m512 ad = _mm512_load_ps(p[c]->d);
    Unroll<kRows>([&](auto r) {
      const __m512 d = _mm512_mul_ps(ad, _mm512_set1_ps(u[r].d));
      __m512 term;
      if constexpr (kQ6K) {
        term = _mm512_mul_ps(
            d, _mm512_cvtepi32_ps(_mm512_sub_epi32(isum[r][c], _mm512_set1_epi32(u[r].offset))));
      } else {
        // msum: 4 vpdpwssd on the sub-block pairs. After the main loop, so that its registers
        // are free for the interleaved chains (computed first, they were live throughout).
        __m512i msum = _mm512_setzero_si512();
        Unroll<4>([&](auto q) {
          msum = _mm512_dpwssd_epi32(msum, _mm512_load_si512(p[c]->bsums[q]),
                                     _mm512_set1_epi32(u[r].pair[q]));
        });
        const __m512 dmin = _mm512_mul_ps(ad, _mm512_set1_ps(u[r].dmin));
        term = _mm512_sub_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(isum[r][c])),
                             _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(msum)));
      }
      float* lanes = &acc[r][16 * (g0 + c)];
      _mm512_store_ps(lanes, _mm512_add_ps(_mm512_load_ps(lanes), term));
    });
  });
}

constexpr int kPackedRows = 4;  // weight rows sharing each activation load
// Rows whose outputs are gathered before they are stored, so that a token's 16 outputs fill one
// cache line: stored 4 rows at a time, each token's line (out_stride apart: with a 4,096-float
// stride all 64 fall into one L1 set) came back once per 4 rows.
constexpr int kStoreRows = 16;

// acc[r][t] = row r0 + r's dot with token t, for the n_tokens tokens packed in `packed`
// ([n_groups][nb]) and rows r0 .. r0 + kRows - 1 (r0 a multiple of 4 when kRows is 4). Each
// row's super-blocks are prefetched 4 ahead: the 4 interleaved row streams of a matrix larger
// than L2 are not followed by the hardware prefetcher. (noinline: inlined into the kStoreRows
// loop, GCC 12's code ran 25% slower.)
template <int kRows, typename Block, bool kQ6K, typename UnpackFn>
__attribute__((noinline)) void PackedRowsK512(int64_t nb, const SuperBlockRows& rows, int r0,
                                              const PackedQ8KGroup* packed, int n_tokens,
                                              float (*acc)[16 * kPackedGroups], UnpackFn unpack) {
  const uint8_t* w = rows.Row(r0);
  const int n_groups = (n_tokens + 15) / 16;
  // Every group zeroed, unrolled: the loop over n_groups became a rep stos a row (2.5% of a
  // 512-token Q4_K tile).
  Unroll<kRows>([&](auto r) {
    Unroll<kPackedGroups>([&](auto g) { _mm512_store_ps(&acc[r][16 * g], _mm512_setzero_ps()); });
  });
  for (int64_t i = 0; i < nb; ++i) {
    UnpackedBytes u[kRows];
    for (int r = 0; r < kRows; ++r) {
      const Block& b =
          *reinterpret_cast<const Block*>(w + r * rows.row_stride + i * rows.sb_stride);
      PrefetchStreamAhead(&b, sizeof(Block), 4 * rows.sb_stride);
      unpack(b, u[r]);
    }
    // Groups in pairs (a weight broadcast serves two), then a last one alone.
    int g = 0;
    for (; g + 2 <= n_groups; g += 2) {
      const PackedQ8KGroup* p[2] = {&packed[g * nb + i], &packed[(g + 1) * nb + i]};
      DotPackedGroups<kQ6K, kRows, 2>(u, p, acc, g);
    }
    if (g < n_groups) {
      const PackedQ8KGroup* p[1] = {&packed[g * nb + i]};
      DotPackedGroups<kQ6K, kRows, 1>(u, p, acc, g);
    }
  }
}

template <typename Block, bool kQ6K, typename UnpackFn>
inline void VecDotTilePackedK512(int64_t n, const SuperBlockRows& w, int n_rows, const uint8_t* a,
                                 size_t a_stride, int n_tokens, float* out, size_t out_stride,
                                 UnpackFn unpack) {
  const int64_t nb = n / kQK;
  auto* packed = static_cast<PackedQ8KGroup*>(
      kernels::ThreadScratch(0, kPackedGroups * nb * sizeof(PackedQ8KGroup)));
  for (int t0 = 0; t0 < n_tokens; t0 += 16 * kPackedGroups) {
    const int tokens = n_tokens - t0 < 16 * kPackedGroups ? n_tokens - t0 : 16 * kPackedGroups;
    for (int g = 0; 16 * g < tokens; ++g) {
      const int count = tokens - 16 * g < 16 ? tokens - 16 * g : 16;
      PackQ8KGroup<kQ6K>(a + (t0 + 16 * g) * a_stride, a_stride, count, nb, packed + g * nb);
    }
    float* o = out + t0 * out_stride;
    for (int r0 = 0; r0 < n_rows; r0 += kStoreRows) {
      const int rows = n_rows - r0 < kStoreRows ? n_rows - r0 : kStoreRows;
      // The copy's last quad is computed whole (its rows past n_rows are zero).
      const int computed = w.whole_quads ? (rows + kQuadRows - 1) / kQuadRows * kQuadRows : rows;
      alignas(64) float tile[kStoreRows][16 * kPackedGroups];  // [row][token]
      int r = 0;
      for (; r + kPackedRows <= computed; r += kPackedRows) {
        PackedRowsK512<kPackedRows, Block, kQ6K>(nb, w, r0 + r, packed, tokens, &tile[r], unpack);
      }
      for (; r < computed; ++r) {
        PackedRowsK512<1, Block, kQ6K>(nb, w, r0 + r, packed, tokens, &tile[r], unpack);
      }
      // A 16 x 16 transpose per token group: token t's outputs of the rows are one masked store
      // (stored one float at a time from each row's vector, they took 4% of a Q6_K tile).
      const __mmask16 store = static_cast<__mmask16>((1u << rows) - 1);
      for (int g = 0; 16 * g < tokens; ++g) {
        __m512i v[16];
        for (int i = 0; i < 16; ++i) {
          v[i] = i < computed ? _mm512_load_si512(&tile[i][16 * g]) : _mm512_setzero_si512();
        }
        Transpose16x16(v);
        const int count = tokens - 16 * g < 16 ? tokens - 16 * g : 16;
        for (int t = 0; t < count; ++t) {
          _mm512_mask_storeu_ps(o + (16 * g + t) * out_stride + r0, store,
                                _mm512_castsi512_ps(v[t]));
        }
      }
    }
  }
}

template <typename Block, bool kQ6K, typename UnpackFn, typename PackedUnpackFn>
inline void VecDotTileK512(int64_t n, const SuperBlockRows& w, int n_rows, const void* va,
                           size_t a_stride, int n_tokens, float* out, size_t out_stride,
                           UnpackFn unpack, PackedUnpackFn packed_unpack) {
  const auto* a = static_cast<const uint8_t*>(va);
  const int64_t nb = n / kQK;
  if (n_tokens >= kPackedMinTokens) {
    return VecDotTilePackedK512<Block, kQ6K>(n, w, n_rows, a, a_stride, n_tokens, out, out_stride,
                                             packed_unpack);
  }
  // Blocks of kRowBlock rows: their weights stay in L1 while every token group passes over
  // them (a matrix larger than the caches is streamed from memory once per call).
  for (int r0 = 0; r0 < n_rows; r0 += kRowBlock) {
    const int rows = n_rows - r0 < kRowBlock ? n_rows - r0 : kRowBlock;
    float* ob = out + r0;
    // 1..7 tokens as 4 + 2 + 1.
    int t = 0;
    if (n_tokens - t >= 4) {
      TileRowsK512<4, Block, kQ6K>(nb, w, r0, rows, a + t * a_stride, a_stride, ob + t * out_stride,
                                   out_stride, unpack);
      t += 4;
    }
    if (n_tokens - t >= 2) {
      TileRowsK512<2, Block, kQ6K>(nb, w, r0, rows, a + t * a_stride, a_stride, ob + t * out_stride,
                                   out_stride, unpack);
      t += 2;
    }
    if (n_tokens - t >= 1) {
      TileRowsK512<1, Block, kQ6K>(nb, w, r0, rows, a + t * a_stride, a_stride, ob + t * out_stride,
                                   out_stride, unpack);
    }
  }
}

}  // namespace

namespace {

template <bool kHasHighBit, typename Block>
void TileQ45K512(int64_t n, const SuperBlockRows& w, int n_rows, const void* a, size_t a_stride,
                 int n_tokens, float* out, size_t out_stride) {
  if (n_tokens == 1) return OneTokenRowsQ45K512<kHasHighBit, Block>(n, w, n_rows, a, out);
  VecDotTileK512<Block, false>(
      n, w, n_rows, a, a_stride, n_tokens, out, out_stride,
      [](const Block& b, UnpackedSuperBlock512& u) { UnpackQ45K512<kHasHighBit>(b, u); },
      [](const Block& b, UnpackedBytes& u) { UnpackQ45KBytes<kHasHighBit>(b, u); });
}

void TileQ6K512(int64_t n, const SuperBlockRows& w, int n_rows, const void* a, size_t a_stride,
                int n_tokens, float* out, size_t out_stride) {
  if (n_tokens == 1) return OneTokenRowsQ6K512(n, w, n_rows, a, out);
  VecDotTileK512<BlockQ6K, true>(
      n, w, n_rows, a, a_stride, n_tokens, out, out_stride,
      [](const BlockQ6K& b, UnpackedSuperBlock512& u) { UnpackQ6K512(b, u); },
      [](const BlockQ6K& b, UnpackedBytes& u) { UnpackQ6KBytes(b, u); });
}

}  // namespace

void VecDotTileQ4KAvx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                         size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  TileQ45K512<false, BlockQ4K>(n, FileRows<BlockQ4K>(w, w_stride), n_rows, a, a_stride, n_tokens,
                               out, out_stride);
}
void VecDotTileQ5KAvx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                         size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  TileQ45K512<true, BlockQ5K>(n, FileRows<BlockQ5K>(w, w_stride), n_rows, a, a_stride, n_tokens,
                              out, out_stride);
}
void VecDotTileQ6KAvx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                         size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  TileQ6K512(n, FileRows<BlockQ6K>(w, w_stride), n_rows, a, a_stride, n_tokens, out, out_stride);
}

void QuadTileQ4KAvx512(int64_t n, const void* groups, int n_rows, const void* a, size_t a_stride,
                       int n_tokens, float* out, size_t out_stride) {
  TileQ45K512<false, BlockQ4K>(n, CopyQuads<BlockQ4K>(groups, n / kQK), n_rows, a, a_stride,
                               n_tokens, out, out_stride);
}
void QuadTileQ5KAvx512(int64_t n, const void* groups, int n_rows, const void* a, size_t a_stride,
                       int n_tokens, float* out, size_t out_stride) {
  TileQ45K512<true, BlockQ5K>(n, CopyQuads<BlockQ5K>(groups, n / kQK), n_rows, a, a_stride,
                              n_tokens, out, out_stride);
}
void QuadTileQ6KAvx512(int64_t n, const void* groups, int n_rows, const void* a, size_t a_stride,
                       int n_tokens, float* out, size_t out_stride) {
  TileQ6K512(n, CopyQuads<BlockQ6K>(groups, n / kQK), n_rows, a, a_stride, n_tokens, out,
             out_stride);
}

}  // namespace kiln::kquants
