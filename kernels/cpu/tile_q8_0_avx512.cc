// Rows x tokens tile kernels for Q8_0 activations (Q8_0, Q4_0 and Q5_0 weights) with 512-bit VNNI
// (vpdpbusd). Compiled with -ffp-contract=off (kernels/cpu/CMakeLists.txt): every FMA is an
// explicit _mm512_fmadd_ps.
//
// Bit-exactness with the vec_dot of the level (VecDotQ8_0Q8_0Avx2 for Q8_0 at AVX2 and AVX-512,
// VecDotQ4_0Q8_0Avx512 / VecDotQ5_0Q8_0Avx512 for Q4_0 / Q5_0; all follow the documented SIMD order
// of legacy.h): for each (row, token) pair the kernel keeps one __m512 holding acc[0..3][0..3] as
// [acc0 | acc1 | acc2 | acc3] (4 lanes each). A group of 4 blocks b = 4g..4g+3 is repacked so that
// 128-bit lane q holds block 4g+q: `lo` its elements 0..15, `hi` its elements 16..31, the weights
// as unsigned bytes u = qw + kOffset (kOffset = 128 for Q8_0, 8 for Q4_0, 16 for Q5_0). Then
//   dpbusd(dpbusd(corr, w_lo, a_lo), w_hi, a_hi)
// gives in int32 lane 4q+l exactly P_b[l] = Σ qw*qa over j % 16 in 4l..4l+3 (exact integers:
// Σ u * qa - kOffset * Σ qa, with corr = -kOffset * Σ qa per lane, precomputed per token),
// the scale lanes are dw_b * da_b (one rounded float product, as the vec_dot kernels' scalar
// multiply), and one FMA per group performs acc[b % 4][l] = fma(s_b, float(P_b[l]), acc) for
// the 4 blocks. A last partial group is padded with zero blocks (s = 0, P = 0: adds exact zeros,
// as documented). The final reduction is the documented one ((acc0 + acc2) + (acc1 + acc3), then
// 4 -> 2 -> 1). Activation values must be in [-127, 127] (the AVX2 kernel's sign trick is exact
// only there; the Q8_0 quantizers never produce -128).
//
// Cost model: activations are repacked once per call (shared by every row), weights once per 4
// rows (shared by every token); the inner loop is 2 vpdpbusd + cvt + mul + fma per (row, token)
// per 128 elements, on a 4 rows x 4 tokens register tile (16 accumulators).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/legacy.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/tile_kernels.h"
#include "kernels/cpu/unroll.h"

namespace kiln::quant {
namespace {

constexpr int kGroupBlocks = 4;  // blocks per repacked group (128 elements)
constexpr int kTileRows = 4;     // weight rows per register tile
constexpr int kTileTokens = 4;   // tokens per register tile

// One group of 4 blocks of an activation row, repacked (256 B).
struct alignas(64) ActGroup {
  __m512i lo;    // bytes 16q..16q+15 = qs[0..15] of block 4g+q (zeros past the row's end)
  __m512i hi;    // bytes 16q..16q+15 = qs[16..31] of block 4g+q
  __m512i corr;  // int32 lane 4q+l = -128 * Σ qs[j] over j % 16 in 4l..4l+3 of block 4g+q
  __m512 d;      // lane 4q+l = d of block 4g+q (0 past the row's end)
};
// One group of 4 blocks of a weight row, repacked (192 B): qs bytes xor 0x80 (qw + 128 unsigned).
struct alignas(64) WeightGroup {
  __m512i lo;
  __m512i hi;
  __m512 d;
};

// d of blocks b..b+3 of any legacy block type (0 past nb), each repeated over its 4 lanes. The
// four f16 values are assembled in a general register (no store-to-load forwarding stall).
template <typename Block>
inline __m512 GroupScales(const Block* blk, int64_t b, int64_t nb) {
  uint64_t packed = 0;
  for (int q = 0; q < kGroupBlocks && b + q < nb; ++q) {  // constant bound: fully unrolled
    uint16_t h;
    std::memcpy(&h, blk[b + q].d, 2);
    packed |= static_cast<uint64_t>(h) << (16 * q);
  }
  const __m128 d4 = _mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<int64_t>(packed)));
  const __m512i quads = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  return _mm512_permutexvar_ps(quads, _mm512_castps128_ps512(d4));
}

// 16 bytes at byte `off` of the qs of blocks b..b+3 -> the four 128-bit lanes (zeros for blocks
// at or past nb). (A 16-bit word-permute gather over the group's bytes, vpermt2w, measured
// slower on Zen 4.)
template <typename Block>
inline __m512i GroupQs16(const Block* blk, int64_t b, int64_t nb, int off) {
  auto part = [&](int q) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk[b + q].qs + off));
  };
  if (b + kGroupBlocks <= nb) {
    __m512i v = _mm512_castsi128_si512(part(0));
    v = _mm512_inserti32x4(v, part(1), 1);
    v = _mm512_inserti32x4(v, part(2), 2);
    return _mm512_inserti32x4(v, part(3), 3);
  }
  alignas(64) uint8_t bytes[64] = {};
  for (int q = 0; q < kGroupBlocks && b + q < nb; ++q) {
    std::memcpy(bytes + 16 * q, blk[b + q].qs + off, 16);
  }
  return _mm512_load_si512(bytes);
}

// Q8_0 / Q4_0 blocks b..b+3 -> lo (elements 0..15 of each block) and hi (elements 16..31) as
// unsigned bytes u = qw + kOffset (128 for Q8_0: the sign bit flipped; 8 for Q4_0: the raw
// nibble). Padding blocks past nb meet zero activations (and a zero scale): their bytes add 0.
inline void WeightGroupQs(const BlockQ8_0* blk, int64_t b, int64_t nb, __m512i* lo, __m512i* hi) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  *lo = _mm512_xor_si512(GroupQs16(blk, b, nb, 0), flip);
  *hi = _mm512_xor_si512(GroupQs16(blk, b, nb, 16), flip);
}
inline void WeightGroupQs(const BlockQ4_0* blk, int64_t b, int64_t nb, __m512i* lo, __m512i* hi) {
  const __m512i nibbles = GroupQs16(blk, b, nb, 0);  // element j: qs[j] & 15, j + 16: qs[j] >> 4
  const __m512i mask = _mm512_set1_epi8(0x0F);
  *lo = _mm512_and_si512(nibbles, mask);
  *hi = _mm512_and_si512(_mm512_srli_epi16(nibbles, 4), mask);
}
// Q5_0: the Q4_0 nibbles plus bit 4 from qh (bit j for element j): u = qw + 16 in 0..31. The
// four blocks' qh words become two 64-bit byte masks, lane q's 16 bits from block 4g+q (its low
// half for lo, its high half for hi); padding blocks keep zero bits.
inline void WeightGroupQs(const BlockQ5_0* blk, int64_t b, int64_t nb, __m512i* lo, __m512i* hi) {
  const __m512i nibbles = GroupQs16(blk, b, nb, 0);
  const __m512i mask = _mm512_set1_epi8(0x0F);
  uint64_t lo_bits = 0, hi_bits = 0;
  for (int q = 0; q < kGroupBlocks && b + q < nb; ++q) {  // constant bound: fully unrolled
    uint32_t qh;
    std::memcpy(&qh, blk[b + q].qh, 4);
    lo_bits |= static_cast<uint64_t>(qh & 0xFFFF) << (16 * q);
    hi_bits |= static_cast<uint64_t>(qh >> 16) << (16 * q);
  }
  const __m512i bit4 = _mm512_set1_epi8(0x10);
  const __m512i lo4 = _mm512_and_si512(nibbles, mask);
  const __m512i hi4 = _mm512_and_si512(_mm512_srli_epi16(nibbles, 4), mask);
  *lo = _mm512_mask_add_epi8(lo4, _cvtu64_mask64(lo_bits), lo4, bit4);
  *hi = _mm512_mask_add_epi8(hi4, _cvtu64_mask64(hi_bits), hi4, bit4);
}

// One activation row [nb blocks] -> ceil(nb / 4) groups; corr = -kOffset * Σ qa per lane, the
// term that turns Σ u * qa (u = qw + kOffset, the weights' unsigned form) into Σ qw * qa.
template <int kOffset>
void PackActRow(const BlockQ8_0* a, int64_t nb, ActGroup* dst) {
  const __m512i offset = _mm512_set1_epi8(static_cast<char>(kOffset));
  const __m512i zero = _mm512_setzero_si512();
  for (int64_t b = 0; b < nb; b += kGroupBlocks, ++dst) {
    const __m512i lo = GroupQs16(a, b, nb, 0), hi = GroupQs16(a, b, nb, 16);
    const __m512i sum = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, offset, lo), offset, hi);
    dst->lo = lo;
    dst->hi = hi;
    dst->corr = _mm512_sub_epi32(zero, sum);
    dst->d = GroupScales(a, b, nb);
  }
}

// n_rows (<= kTileRows) weight rows -> groups interleaved by row: dst[g * n_rows + r].
template <typename Block>
void PackWeightRows(const uint8_t* w, size_t w_stride, int n_rows, int64_t nb, WeightGroup* dst) {
  // Row by row: one sequential read stream at a time (4 interleaved row streams ran 3x slower
  // from memory on Zen 4; software prefetching did not help either order).
  for (int r = 0; r < n_rows; ++r) {
    const auto* row = reinterpret_cast<const Block*>(w + r * w_stride);
    WeightGroup* d = dst + r;
    for (int64_t b = 0; b < nb; b += kGroupBlocks, d += n_rows) {
      WeightGroupQs(row, b, nb, &d->lo, &d->hi);
      d->d = GroupScales(row, b, nb);
    }
  }
}

// [acc0 | acc1 | acc2 | acc3] -> (acc0 + acc2) + (acc1 + acc3), then 4 -> 2 -> 1.
inline float Reduce(__m256 acc01, __m256 acc23) {
  const __m256 t = _mm256_add_ps(acc01, acc23);
  const __m128 v = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
  const __m128 v2 = _mm_add_ps(v, _mm_movehl_ps(v, v));
  return _mm_cvtss_f32(_mm_add_ss(v2, _mm_movehdup_ps(v2)));
}

// Reduce for 4 outputs at once (the same additions, lane-parallel): out[r] = the reduction of
// acc[r] ([acc0 | acc1 | acc2 | acc3] each), r < 4.
inline void Reduce4(const __m512 acc[4], float* out) {
  // [t0 | t1], [t2 | t3] with t_r = acc_r[0..7] + acc_r[8..15] (acc01 + acc23).
  const __m512 t01 = _mm512_add_ps(_mm512_shuffle_f32x4(acc[0], acc[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_f32x4(acc[0], acc[1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 t23 = _mm512_add_ps(_mm512_shuffle_f32x4(acc[2], acc[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_f32x4(acc[2], acc[3], _MM_SHUFFLE(3, 2, 3, 2)));
  // [v0 | v1 | v2 | v3] with v_r = t_r[0..3] + t_r[4..7].
  const __m512 v = _mm512_add_ps(_mm512_shuffle_f32x4(t01, t23, _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_f32x4(t01, t23, _MM_SHUFFLE(3, 1, 3, 1)));
  // Per 128-bit lane: v2 = [v[0] + v[2], v[1] + v[3]], r = v2[0] + v2[1] in element 0.
  const __m512 v2 = _mm512_add_ps(v, _mm512_permute_ps(v, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 r = _mm512_add_ps(v2, _mm512_permute_ps(v2, _MM_SHUFFLE(1, 1, 1, 1)));
  const __m512i firsts = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0);
  _mm_storeu_ps(out, _mm512_castps512_ps128(_mm512_permutexvar_ps(firsts, r)));
}

// R rows x T tokens. w: groups interleaved by row (w[g * R + r]); a: T rows of ng groups.
// half_tail: the last group holds only 1 or 2 blocks (acc0 / acc1); it runs as 256-bit ops on
// the low half of the accumulators (the same FMAs: the skipped zero blocks would add exact 0).
// R = 4 reduces the 4 rows of each token together (Reduce4) and stores them with one store.
template <int R, int T>
inline void Tile(const WeightGroup* w, const ActGroup* a, int64_t ng, bool half_tail, float* out,
                 size_t out_stride) {
  __m512 acc[R][T];
  Unroll<R>([&](auto r) { Unroll<T>([&](auto t) { acc[r][t] = _mm512_setzero_ps(); }); });
  const int64_t ng_zmm = half_tail ? ng - 1 : ng;
  for (int64_t g = 0; g < ng_zmm; ++g, w += R) {
    __m512i wlo[R], whi[R];
    Unroll<R>([&](auto r) {
      wlo[r] = w[r].lo;
      whi[r] = w[r].hi;
    });
    Unroll<T>([&](auto t) {
      const ActGroup& ag = a[t * ng + g];
      Unroll<R>([&](auto r) {
        const __m512i p =
            _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(ag.corr, wlo[r], ag.lo), whi[r], ag.hi);
        const __m512 s = _mm512_mul_ps(w[r].d, ag.d);
        acc[r][t] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(p), acc[r][t]);
      });
    });
  }
  if (half_tail) {
    Unroll<T>([&](auto t) {
      const ActGroup& ag = a[t * ng + ng - 1];
      Unroll<R>([&](auto r) {
        const __m256i p = _mm256_dpbusd_epi32(
            _mm256_dpbusd_epi32(_mm512_castsi512_si256(ag.corr), _mm512_castsi512_si256(w[r].lo),
                                _mm512_castsi512_si256(ag.lo)),
            _mm512_castsi512_si256(w[r].hi), _mm512_castsi512_si256(ag.hi));
        const __m256 s =
            _mm256_mul_ps(_mm512_castps512_ps256(w[r].d), _mm512_castps512_ps256(ag.d));
        const __m256 acc01 =
            _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(p), _mm512_castps512_ps256(acc[r][t]));
        acc[r][t] = _mm512_insertf32x8(acc[r][t], acc01, 0);
      });
    });
  }
  Unroll<T>([&](auto t) {
    if constexpr (R == 4) {
      const __m512 four[4] = {acc[0][t], acc[1][t], acc[2][t], acc[3][t]};
      Reduce4(four, out + t * out_stride);
    } else {
      Unroll<R>([&](auto r) {
        out[t * out_stride + r] =
            Reduce(_mm512_castps512_ps256(acc[r][t]), _mm512_extractf32x8_ps(acc[r][t], 1));
      });
    }
  });
}

template <int R>
void RowBlock(const WeightGroup* w, const ActGroup* a, int64_t ng, bool half_tail, int n_tokens,
              float* out, size_t out_stride) {
  ForEachTile<kTileTokens>(n_tokens, [&]<int T>(int t) {
    Tile<R, T>(w, a + t * ng, ng, half_tail, out + t * out_stride, out_stride);
  });
}

template <typename Block, int kOffset>
void VecDotTile(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  if (n_rows <= 0 || n_tokens <= 0) return;
  const int64_t nb = n / kQK;
  const int64_t ng = (nb + kGroupBlocks - 1) / kGroupBlocks;
  const bool half_tail = nb % kGroupBlocks == 1 || nb % kGroupBlocks == 2;  // e.g. n = 576
  // Per-thread scratch: activations [n_tokens][ng], weights [ng][kTileRows].
  auto* act = static_cast<ActGroup*>(kernels::ThreadScratch(0, n_tokens * ng * sizeof(ActGroup)));
  auto* wts =
      static_cast<WeightGroup*>(kernels::ThreadScratch(1, kTileRows * ng * sizeof(WeightGroup)));
  const auto* ap = static_cast<const uint8_t*>(a);
  for (int t = 0; t < n_tokens; ++t) {
    PackActRow<kOffset>(reinterpret_cast<const BlockQ8_0*>(ap + t * a_stride), nb, act + t * ng);
  }
  const auto* wp = static_cast<const uint8_t*>(w);
  static_assert(kTileRows == 4, "the switch below covers 1..4 rows");
  for (int r = 0; r < n_rows; r += kTileRows) {
    const int rows = n_rows - r < kTileRows ? n_rows - r : kTileRows;
    PackWeightRows<Block>(wp + r * w_stride, w_stride, rows, nb, wts);
    float* o = out + r;
    switch (rows) {
      case 4:
        RowBlock<4>(wts, act, ng, half_tail, n_tokens, o, out_stride);
        break;
      case 3:
        RowBlock<3>(wts, act, ng, half_tail, n_tokens, o, out_stride);
        break;
      case 2:
        RowBlock<2>(wts, act, ng, half_tail, n_tokens, o, out_stride);
        break;
      default:
        RowBlock<1>(wts, act, ng, half_tail, n_tokens, o, out_stride);
        break;
    }
  }
}

}  // namespace

void VecDotTileQ8_0Q8_0Avx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                              size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  VecDotTile<BlockQ8_0, 128>(n, w, w_stride, n_rows, a, a_stride, n_tokens, out, out_stride);
}

void VecDotTileQ4_0Q8_0Avx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                              size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  VecDotTile<BlockQ4_0, 8>(n, w, w_stride, n_rows, a, a_stride, n_tokens, out, out_stride);
}

void VecDotTileQ5_0Q8_0Avx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                              size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  VecDotTile<BlockQ5_0, 16>(n, w, w_stride, n_rows, a, a_stride, n_tokens, out, out_stride);
}

}  // namespace kiln::quant
