// Rows x tokens tile kernel for Q4_1 weights x Q8_1 activations with 512-bit VNNI (vpdpbusd).
// Compiled with -ffp-contract=off (sources.cmake): every FMA is an explicit fmadd intrinsic.
//
// Bit-exactness with VecDotQ4_1Q8_1Avx512 (ggml's x86 order, legacy_kernels.h "Exception, Q4_1 x
// Q8_1"): each (row, token) pair has its own 8-lane float chain and its own mins chain, exactly as
// the vec_dot: per block b,
//   P_b[l] = Σ qw * qa over elements 4l..4l+3 (elements 0..15: low nibbles, 16..31: high ones;
//            exact int32 from vpdpbusd with a zero accumulator),
//   s_b    = dw_b * da_b (one rounded float product),
//   acc[l] = fma(s_b, float(P_b[l]), acc[l]),   mins = fma(mw_b, sa_b, mins),
// and at the end ((acc4 + acc0) + (acc6 + acc2)) + ((acc5 + acc1) + (acc7 + acc3)) + mins.
// A zmm holds the chains of two weight rows for one token: lanes 0..7 row 2p, lanes 8..15 row
// 2p + 1. The weights of a row pair are unpacked once per call into 64 bytes per block ([row 2p
// elements 0..31 | row 2p + 1 elements 0..31], nibbles as unsigned bytes) with their scales
// ([dw x 8 | dw x 8]); the activation block's 32 qs bytes are broadcast to both halves straight
// from the Q8_1 row. The mins chains of the 4 rows of a register tile run in one xmm per token
// (lane r = row r; a vector FMA rounds as std::fma does).
//
// Cost model: per (row pair, token, block) 1 vpdpbusd + cvt + mul + fma on zmm (64 MACs), plus one
// xmm FMA per (4 rows, token, block) for the mins; weights unpacked once per 4 rows per call,
// activation scales converted once per token per call. Register tile: 4 rows x 4 tokens.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/tile_kernels.h"
#include "lib/quant/legacy_kernels.h"

namespace kiln::quant {
namespace {

constexpr int kTileRows = 4;      // weight rows per register tile (2 row pairs)
constexpr int kTileTokens = 4;    // tokens per register tile
constexpr int kPrefetchRows = 8;  // weight rows prefetched ahead of the row block being packed

// One block of 4 weight rows, unpacked (192 B).
struct alignas(64) WeightBlock4 {
  __m512i qs[2];  // pair p: bytes 0..31 = row 2p elements 0..31, bytes 32..63 = row 2p + 1
  __m512 d[2];    // pair p: lanes 0..7 = dw of row 2p, lanes 8..15 = dw of row 2p + 1
  __m128 m;       // lane r = mw of row r (0 for padding rows)
};

// Activation scales of one token, converted to float once per call.
struct ActScales {
  float d;  // da
  float s;  // sa
};

inline float HalfToFloat(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(v)));
}

// 16 packed bytes -> [low nibbles | high nibbles] (elements 0..15 then 16..31) as a 256-bit pair
// of 128-bit lanes, still unmasked.
inline __m256i NibblePairs(const BlockQ4_1& b) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs));
  return _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed);
}

// n_rows (1..4) weight rows [nb blocks each] -> nb WeightBlock4 (rows past n_rows: zeros).
void PackWeightRows(const uint8_t* w, size_t w_stride, int n_rows, int64_t nb, WeightBlock4* dst) {
  const __m512i mask = _mm512_set1_epi8(0x0F);
  const BlockQ4_1* rows[kTileRows];
  for (int r = 0; r < kTileRows; ++r) {
    rows[r] = r < n_rows ? reinterpret_cast<const BlockQ4_1*>(w + r * w_stride) : nullptr;
  }
  for (int64_t b = 0; b < nb; ++b, ++dst) {
    float dw[kTileRows] = {}, mw[kTileRows] = {};
    __m256i half[kTileRows];
    for (int r = 0; r < kTileRows; ++r) {
      if (rows[r] != nullptr) {
        half[r] = NibblePairs(rows[r][b]);
        dw[r] = HalfToFloat(rows[r][b].d);
        mw[r] = HalfToFloat(rows[r][b].m);
      } else {
        half[r] = _mm256_setzero_si256();
      }
    }
    for (int p = 0; p < 2; ++p) {
      const __m512i both =
          _mm512_inserti64x4(_mm512_castsi256_si512(half[2 * p]), half[2 * p + 1], 1);
      dst->qs[p] = _mm512_and_si512(both, mask);
      dst->d[p] = _mm512_insertf32x8(_mm512_set1_ps(dw[2 * p]), _mm256_set1_ps(dw[2 * p + 1]), 1);
    }
    dst->m = _mm_loadu_ps(mw);
  }
}

// Reduction of the 4 rows of one token: pair accumulators a01 (rows 0, 1) and a23 (rows 2, 3),
// each [acc0..7 of row 2p | acc0..7 of row 2p + 1] -> ((acc4 + acc0) + (acc6 + acc2)) + ((acc5 +
// acc1) + (acc7 + acc3)) per row (the same additions as the vec_dot's Hsum, lane-parallel), plus
// mins; rows r < n_store are stored to out[r].
inline void Reduce4(__m512 a01, __m512 a23, __m128 mins, float* out, int n_store) {
  // Per 128-bit lane q of the result: row q's x[i] = acc[4 + i] + acc[i].
  const __m512 lo = _mm512_shuffle_f32x4(a01, a23, _MM_SHUFFLE(2, 0, 2, 0));
  const __m512 hi = _mm512_shuffle_f32x4(a01, a23, _MM_SHUFFLE(3, 1, 3, 1));
  const __m512 x = _mm512_add_ps(hi, lo);
  // Lane 0: x0 + x2, lane 1: x1 + x3 (movehl), then lane 0 + lane 1 (movehdup).
  const __m512 v2 = _mm512_add_ps(x, _mm512_permute_ps(x, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 r = _mm512_add_ps(v2, _mm512_permute_ps(v2, _MM_SHUFFLE(1, 1, 1, 1)));
  const __m512i firsts = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0);
  const __m128 sums = _mm_add_ps(_mm512_castps512_ps128(_mm512_permutexvar_ps(firsts, r)), mins);
  if (n_store == kTileRows) {
    _mm_storeu_ps(out, sums);
  } else {
    _mm_mask_storeu_ps(out, static_cast<__mmask8>((1u << n_store) - 1), sums);
  }
}

// 4 rows (packed, nb blocks) x T tokens. a: the T tokens' Q8_1 rows (a_stride bytes apart);
// scales: their converted scales, [T][nb].
template <int T>
inline void Tile(const WeightBlock4* w, int64_t nb, const uint8_t* a, size_t a_stride,
                 const ActScales* scales, int n_rows, float* out, size_t out_stride) {
  __m512 acc[2][T];
  __m128 mins[T];
  for (int t = 0; t < T; ++t) {
    acc[0][t] = _mm512_setzero_ps();
    acc[1][t] = _mm512_setzero_ps();
    mins[t] = _mm_setzero_ps();
  }
  const BlockQ8_1* act[T];
  for (int t = 0; t < T; ++t) act[t] = reinterpret_cast<const BlockQ8_1*>(a + t * a_stride);
  for (int64_t b = 0; b < nb; ++b) {
    const WeightBlock4& wb = w[b];
    for (int t = 0; t < T; ++t) {
      const __m512i qa = _mm512_broadcast_i64x4(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(act[t][b].qs)));
      const ActScales sc = scales[t * nb + b];
      const __m512 da = _mm512_set1_ps(sc.d);
      for (int p = 0; p < 2; ++p) {
        const __m512i isum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wb.qs[p], qa);
        const __m512 s = _mm512_mul_ps(wb.d[p], da);
        acc[p][t] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(isum), acc[p][t]);
      }
      mins[t] = _mm_fmadd_ps(wb.m, _mm_set1_ps(sc.s), mins[t]);
    }
  }
  for (int t = 0; t < T; ++t) Reduce4(acc[0][t], acc[1][t], mins[t], out + t * out_stride, n_rows);
}

void RowBlock(const WeightBlock4* w, int64_t nb, const uint8_t* a, size_t a_stride,
              const ActScales* scales, int n_tokens, int n_rows, float* out, size_t out_stride) {
  int t = 0;
  for (; t + kTileTokens <= n_tokens; t += kTileTokens) {
    Tile<kTileTokens>(w, nb, a + t * a_stride, a_stride, scales + t * nb, n_rows,
                      out + t * out_stride, out_stride);
  }
  static_assert(kTileTokens == 4, "tails below cover 1..3 tokens");
  const uint8_t* at = a + t * a_stride;
  const ActScales* st = scales + t * nb;
  float* ot = out + t * out_stride;
  switch (n_tokens - t) {
    case 3:
      Tile<3>(w, nb, at, a_stride, st, n_rows, ot, out_stride);
      break;
    case 2:
      Tile<2>(w, nb, at, a_stride, st, n_rows, ot, out_stride);
      break;
    case 1:
      Tile<1>(w, nb, at, a_stride, st, n_rows, ot, out_stride);
      break;
    default:
      break;
  }
}

}  // namespace

void VecDotTileQ4_1Q8_1Avx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                              size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  if (n_rows <= 0 || n_tokens <= 0) return;
  const int64_t nb = n / kQK;
  // Per-thread scratch: activation scales [n_tokens][nb], weights [nb] blocks of 4 rows.
  thread_local std::vector<ActScales> scales;
  thread_local std::vector<WeightBlock4> wts;
  if (scales.size() < static_cast<size_t>(n_tokens * nb)) scales.resize(n_tokens * nb);
  if (wts.size() < static_cast<size_t>(nb)) wts.resize(nb);
  const auto* ap = static_cast<const uint8_t*>(a);
  for (int t = 0; t < n_tokens; ++t) {
    const auto* row = reinterpret_cast<const BlockQ8_1*>(ap + t * a_stride);
    for (int64_t b = 0; b < nb; ++b) {
      scales[t * nb + b] = {HalfToFloat(row[b].d), HalfToFloat(row[b].s)};
    }
  }
  const auto* wp = static_cast<const uint8_t*>(w);
  const int64_t row_bytes = nb * static_cast<int64_t>(sizeof(BlockQ4_1));
  for (int r = 0; r < n_rows; r += kTileRows) {
    const int rows = std::min(kTileRows, n_rows - r);
    // Weights stream from memory once per call: fetch the rows kPrefetchRows ahead explicitly
    // (4 interleaved row streams defeat the hardware prefetcher).
    for (int pr = r + kPrefetchRows; pr < std::min(n_rows, r + kPrefetchRows + kTileRows); ++pr) {
      const uint8_t* row = wp + pr * w_stride;
      for (int64_t off = 0; off < row_bytes; off += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(row + off), _MM_HINT_T0);
      }
    }
    PackWeightRows(wp + r * w_stride, w_stride, rows, nb, wts.data());
    RowBlock(wts.data(), nb, ap, a_stride, scales.data(), n_tokens, rows, out + r, out_stride);
  }
}

}  // namespace kiln::quant
