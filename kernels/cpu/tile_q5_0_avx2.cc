// Rows x tokens tile kernel for Q5_0 weights x Q8_0 activations with AVX2 (no VNNI: vpmaddubsw +
// vpmaddwd). Compiled with -ffp-contract=off (kernels/cpu/CMakeLists.txt): every FMA is an
// explicit _mm256_fmadd_ps.
//
// Bit-exactness with VecDotQ5_0Q8_0Avx2 (legacy_avx2.cc DotBlocks, the documented order of
// legacy.h): blocks go in pairs (b, b + 1), b even, into acc01 (b % 4 == 0) or acc23 (b % 4 ==
// 2), each __m256 holding [acc_b%4 | acc_(b+1)%4] (4 lanes each). A pair is repacked so that
// 128-bit lane q holds block b + q: `lo` its elements 0..15, `hi` its elements 16..31, the
// weights as unsigned u = qw + 16 (0..31). Then
//   madd(maddubs(w_lo, a_lo) + maddubs(w_hi, a_hi), 1) + corr
// gives in int32 lane 4q + l exactly P_b+q[l] = Σ qw * qa over j % 16 in 4l..4l+3 (each int16
// sum is at most 4 * 31 * 127 = 15748, so neither vpmaddubsw nor the int16 add saturates; corr =
// -16 * Σ qa per lane, precomputed per token), the scale lanes are dw * da (the same rounded float
// product as the vec_dot's scalar multiply), and one FMA per pair performs the vec_dot's FMA. A
// missing last block of an odd count is a zero block (s = 0, P = 0: adds exact zeros, as the
// vec_dot's padding does). The final reduction is the vec_dot's ((acc0 + acc2) + (acc1 + acc3),
// then 4 -> 2 -> 1). Activation values must be in [-127, 127] (the Q8_0 quantizers' range).
//
// Cost model: activations are repacked once per call (shared by every row), weights once per
// kTileRows rows (shared by every token); the inner loop is 2 vpmaddubsw + add + vpmaddwd + add +
// cvt + mul + fma per (row, token) per 64 elements, on a 2 rows x 2 tokens register tile.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/legacy.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/tile_kernels.h"
#include "kernels/cpu/unroll.h"

namespace kiln::quant {
namespace {

constexpr int kPairBlocks = 2;  // blocks per repacked pair (64 elements)
constexpr int kTileRows = 2;    // weight rows per register tile (and per weight repack)
constexpr int kTileTokens = 2;  // tokens per register tile

// One pair of blocks of an activation row, repacked (128 B).
struct alignas(32) ActPair {
  __m256i lo;    // bytes 16q..16q+15 = qs[0..15] of block b + q (zeros past the row's end)
  __m256i hi;    // bytes 16q..16q+15 = qs[16..31] of block b + q
  __m256i corr;  // int32 lane 4q + l = -16 * Σ qs[j] over j % 16 in 4l..4l+3 of block b + q
  __m256 d;      // lanes 4q..4q+3 = d of block b + q (0 past the row's end)
};
// One pair of blocks of a weight row, repacked (96 B): u = qw + 16.
struct alignas(32) WeightPair {
  __m256i lo;
  __m256i hi;
  __m256 d;
};

inline float HalfToFloat(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// d of blocks b, b + 1 (0 for a block at or past nb), each over its 4 lanes.
template <typename Block>
inline __m256 PairScales(const Block* blk, int64_t b, int64_t nb) {
  const float d0 = HalfToFloat(blk[b].d);
  const float d1 = b + 1 < nb ? HalfToFloat(blk[b + 1].d) : 0.0f;
  return _mm256_set_m128(_mm_set1_ps(d1), _mm_set1_ps(d0));
}

// Activation blocks b, b + 1 -> lo, hi (zeros for a missing second block).
inline void ActPairQs(const BlockQ8_0* a, int64_t b, int64_t nb, __m256i* lo, __m256i* hi) {
  auto half = [&](int64_t blk, int off) {
    return blk < nb ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(a[blk].qs + off))
                    : _mm_setzero_si128();
  };
  *lo = _mm256_set_m128i(half(b + 1, 0), half(b, 0));
  *hi = _mm256_set_m128i(half(b + 1, 16), half(b, 16));
}

// Q5_0 block -> its 32 values u = qw + 16 as bytes (element j at byte j).
inline __m256i UnpackQ5_0(const BlockQ5_0& blk) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.qs));
  const __m256i nibbles =
      _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), _mm256_set1_epi8(0x0F));
  uint32_t qh;
  std::memcpy(&qh, blk.qh, 4);
  // Byte j of the broadcast qh word holds bits 8 (j / 8) .. 8 (j / 8) + 7; pick bit j % 8.
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(qh)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
  return _mm256_or_si256(nibbles, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
}

// Weight blocks b, b + 1 -> lo (elements 0..15 of each) and hi (16..31); a missing second block
// is zeros.
inline void WeightPairQs(const BlockQ5_0* w, int64_t b, int64_t nb, __m256i* lo, __m256i* hi) {
  const __m256i u0 = UnpackQ5_0(w[b]);
  const __m256i u1 = b + 1 < nb ? UnpackQ5_0(w[b + 1]) : _mm256_setzero_si256();
  *lo = _mm256_permute2x128_si256(u0, u1, 0x20);
  *hi = _mm256_permute2x128_si256(u0, u1, 0x31);
}

// 8 int32 lanes: lane l = Σ u[j] * s[j] over j in 4l..4l+3 of lo plus the same of hi.
inline __m256i PairDot(__m256i wlo, __m256i whi, __m256i alo, __m256i ahi) {
  const __m256i sum16 =
      _mm256_add_epi16(_mm256_maddubs_epi16(wlo, alo), _mm256_maddubs_epi16(whi, ahi));
  return _mm256_madd_epi16(sum16, _mm256_set1_epi16(1));
}

void PackActRow(const BlockQ8_0* a, int64_t nb, ActPair* dst) {
  const __m256i sixteen = _mm256_set1_epi8(16);
  for (int64_t b = 0; b < nb; b += kPairBlocks, ++dst) {
    __m256i lo, hi;
    ActPairQs(a, b, nb, &lo, &hi);
    dst->lo = lo;
    dst->hi = hi;
    dst->corr = _mm256_sub_epi32(_mm256_setzero_si256(), PairDot(sixteen, sixteen, lo, hi));
    dst->d = PairScales(a, b, nb);
  }
}

// n_rows (<= kTileRows) weight rows -> pairs interleaved by row: dst[p * n_rows + r].
void PackWeightRows(const uint8_t* w, size_t w_stride, int n_rows, int64_t nb, WeightPair* dst) {
  for (int r = 0; r < n_rows; ++r) {
    const auto* row = reinterpret_cast<const BlockQ5_0*>(w + r * w_stride);
    WeightPair* d = dst + r;
    for (int64_t b = 0; b < nb; b += kPairBlocks, d += n_rows) {
      WeightPairQs(row, b, nb, &d->lo, &d->hi);
      d->d = PairScales(row, b, nb);
    }
  }
}

// [acc0 | acc1], [acc2 | acc3] -> (acc0 + acc2) + (acc1 + acc3), then 4 -> 2 -> 1.
inline float Reduce(__m256 acc01, __m256 acc23) {
  const __m256 t = _mm256_add_ps(acc01, acc23);
  const __m128 v = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
  const __m128 v2 = _mm_add_ps(v, _mm_movehl_ps(v, v));
  return _mm_cvtss_f32(_mm_add_ss(v2, _mm_movehdup_ps(v2)));
}

// R rows x T tokens. w: pairs interleaved by row (w[p * R + r]); a: T rows of np pairs.
template <int R, int T>
inline void Tile(const WeightPair* w, const ActPair* a, int64_t np, float* out, size_t out_stride) {
  __m256 acc[2][R][T];  // [pair % 2]: acc01, acc23
  Unroll<R>([&](auto r) {
    Unroll<T>([&](auto t) { acc[0][r][t] = acc[1][r][t] = _mm256_setzero_ps(); });
  });
  auto step = [&](auto k, int64_t p) {
    const WeightPair* wp = w + p * R;
    Unroll<T>([&](auto t) {
      const ActPair& ap = a[t * np + p];
      Unroll<R>([&](auto r) {
        const __m256i dot = _mm256_add_epi32(PairDot(wp[r].lo, wp[r].hi, ap.lo, ap.hi), ap.corr);
        const __m256 s = _mm256_mul_ps(wp[r].d, ap.d);
        acc[k][r][t] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(dot), acc[k][r][t]);
      });
    });
  };
  int64_t p = 0;
  for (; p + 2 <= np; p += 2) {
    step(std::integral_constant<int, 0>{}, p);
    step(std::integral_constant<int, 1>{}, p + 1);
  }
  if (p < np) step(std::integral_constant<int, 0>{}, p);
  Unroll<T>([&](auto t) {
    Unroll<R>([&](auto r) { out[t * out_stride + r] = Reduce(acc[0][r][t], acc[1][r][t]); });
  });
}

template <int R>
void RowBlock(const WeightPair* w, const ActPair* a, int64_t np, int n_tokens, float* out,
              size_t out_stride) {
  ForEachTile<kTileTokens>(n_tokens, [&]<int T>(int t) {
    Tile<R, T>(w, a + t * np, np, out + t * out_stride, out_stride);
  });
}

}  // namespace

void VecDotTileQ5_0Q8_0Avx2(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                            size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  if (n_rows <= 0 || n_tokens <= 0) return;
  const int64_t nb = n / kQK;
  const int64_t np = (nb + kPairBlocks - 1) / kPairBlocks;
  // Per-thread scratch: activations [n_tokens][np], weights [np][kTileRows].
  auto* act = static_cast<ActPair*>(kernels::ThreadScratch(0, n_tokens * np * sizeof(ActPair)));
  auto* wts =
      static_cast<WeightPair*>(kernels::ThreadScratch(1, kTileRows * np * sizeof(WeightPair)));
  const auto* ap = static_cast<const uint8_t*>(a);
  for (int t = 0; t < n_tokens; ++t) {
    PackActRow(reinterpret_cast<const BlockQ8_0*>(ap + t * a_stride), nb, act + t * np);
  }
  const auto* wp = static_cast<const uint8_t*>(w);
  static_assert(kTileRows == 2, "the branch below covers 1..2 rows");
  for (int r = 0; r < n_rows; r += kTileRows) {
    const int rows = n_rows - r < kTileRows ? n_rows - r : kTileRows;
    PackWeightRows(wp + r * w_stride, w_stride, rows, nb, wts);
    if (rows == 2) {
      RowBlock<2>(wts, act, np, n_tokens, out + r, out_stride);
    } else {
      RowBlock<1>(wts, act, np, n_tokens, out + r, out_stride);
    }
  }
}

}  // namespace kiln::quant
