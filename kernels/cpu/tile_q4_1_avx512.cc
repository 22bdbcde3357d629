// Rows x tokens tile kernel for Q4_1 weights x Q8_1 activations with 512-bit VNNI (vpdpbusd).
// Compiled with -ffp-contract=off (kernels/cpu/CMakeLists.txt): every FMA is an explicit fmadd
// intrinsic.
//
// Bit-exactness with VecDotQ4_1Q8_1Avx512 (ggml's x86 order, legacy.h "Exception, Q4_1 x
// Q8_1"): each (row, token) pair has its own 8-lane float chain and its own mins chain, exactly as
// the vec_dot: per block b,
//   P_b[l] = Σ qw * qa over elements 4l..4l+3 (elements 0..15: low nibbles, 16..31: high ones;
//            exact int32 from vpdpbusd with a zero accumulator),
//   s_b    = dw_b * da_b (one rounded float product),
//   acc[l] = fma(s_b, float(P_b[l]), acc[l]),   mins = fma(mw_b, sa_b, mins),
// and at the end ((acc4 + acc0) + (acc6 + acc2)) + ((acc5 + acc1) + (acc7 + acc3)) + mins.
// A zmm holds the chains of two weight rows for one token: lanes 0..7 row 2p, lanes 8..15 row
// 2p + 1. A weight block of a row pair is unpacked into 64 bytes ([row 2p elements 0..31 | row
// 2p + 1 elements 0..31], nibbles as unsigned bytes) with its scales ([dw x 8 | dw x 8]); the
// activation block's 32 qs bytes are broadcast to both halves straight from the Q8_1 row. The
// 16 mins chains of 4 rows x 4 tokens run in one zmm (lane 4i + r: token i, row r; a vector FMA
// rounds as std::fma does).
//
// Cost model: per (row pair, token, block) 1 vpdpbusd + cvt + mul + fma on zmm (64 MACs), plus
// one zmm FMA per (4 rows, 4 tokens, block) for the mins; a register tile is 4 rows x 8 tokens
// (16 accumulators). Calls of <= 16 tokens (speculative verification) unpack each weight block in
// registers where it is used (~17 instructions per 4 rows); longer calls (prefill) unpack each
// block of 4 rows once per call into per-thread scratch, reused by every 8-token tile.
// Activation scales are converted once per call. (Measured, not kept: one ymm chain per (row,
// token) with the 16 scales of a 4 x 4 tile from one multiply, fed to the FMAs as broadcast
// memory operands or vpermps broadcasts, so no multiply per chain: 35-45% slower than this kernel
// at 2-8 tokens on Zen 4, re-measured with the accumulators in registers; a 256-bit vpdpbusd
// costs about what a 512-bit one does.)
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/legacy.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/tile_kernels.h"
#include "kernels/cpu/unroll.h"

namespace kiln::quant {
namespace {

constexpr int kTileRows = 4;       // weight rows per register tile (2 row pairs)
constexpr int kTileTokens = 8;     // tokens per register tile (2 token quads)
constexpr int kPrefetchRows = 16;  // weight rows prefetched (into L2) ahead of the row block in use

// One block of 4 weight rows, unpacked (320 B): what a tile reads per block, in registers
// (unpacked where it is used) or from a per-call copy (prefill).
struct alignas(64) Unpacked4 {
  // Rows past the call's last row repeat its first one (computed, never stored).
  __m512i qs[2];  // pair p: bytes 0..31 = row 2p elements 0..31, bytes 32..63 = row 2p + 1
  __m512 d[2];    // pair p: lanes 0..7 = dw of row 2p, lanes 8..15 = dw of row 2p + 1
  __m512 m;       // lane 4q + r = mw of row r (q = 0..3)
};

// 4 weight rows at block b -> registers. The 20-byte blocks are read with masked loads (no
// bytes past the block), qs repacked with one two-source dword permute per row pair ([qs | qs |
// qs' | qs'], then the odd 128-bit lanes shifted by 4: high nibbles), the 8 halves d0 m0 .. d3 m3
// converted with one vcvtph2ps.
inline Unpacked4 UnpackBlock4(const BlockQ4_1* const rows[kTileRows], int64_t b) {
  constexpr __mmask64 kBlockBytes = (1ull << sizeof(BlockQ4_1)) - 1;
  __m512i raw[kTileRows];
  for (int r = 0; r < kTileRows; ++r) raw[r] = _mm512_maskz_loadu_epi8(kBlockBytes, rows[r] + b);
  // 128-bit lanes 0, 1 <- qs of the first row (dwords 1..4 of its raw block), 2, 3 <- the second's.
  const __m512i qs_index = _mm512_set_epi32(20, 19, 18, 17, 20, 19, 18, 17, 4, 3, 2, 1, 4, 3, 2, 1);
  const __m512i low = _mm512_set1_epi8(0x0F);
  Unpacked4 u;
  for (int p = 0; p < 2; ++p) {
    const __m512i both = _mm512_permutex2var_epi32(raw[2 * p], qs_index, raw[2 * p + 1]);
    // Words of 128-bit lanes 1 and 3 shifted right by 4 (high nibbles), then the low 4 bits.
    u.qs[p] = _mm512_and_si512(_mm512_mask_srli_epi16(both, 0xFF00FF00u, both, 4), low);
  }
  // [d0 m0 d1 m1 | d2 m2 d3 m3] as halves -> 8 floats.
  const __m128i h01 =
      _mm_unpacklo_epi32(_mm512_castsi512_si128(raw[0]), _mm512_castsi512_si128(raw[1]));
  const __m128i h23 =
      _mm_unpacklo_epi32(_mm512_castsi512_si128(raw[2]), _mm512_castsi512_si128(raw[3]));
  const __m512 dm = _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_unpacklo_epi64(h01, h23)));
  u.d[0] =
      _mm512_permutexvar_ps(_mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0), dm);
  u.d[1] =
      _mm512_permutexvar_ps(_mm512_set_epi32(6, 6, 6, 6, 6, 6, 6, 6, 4, 4, 4, 4, 4, 4, 4, 4), dm);
  u.m = _mm512_permutexvar_ps(_mm512_set_epi32(7, 5, 3, 1, 7, 5, 3, 1, 7, 5, 3, 1, 7, 5, 3, 1), dm);
  return u;
}

// Weight sources of a tile: straight from the Q4_1 rows (unpacked in registers per tile, for
// calls with few tokens) or from a per-call unpacked copy (reused by several token tiles).
// Rows past the call's last row repeat its first row of the block (computed, never stored).
struct RawWeights {
  const BlockQ4_1* rows[kTileRows];
  Unpacked4 operator()(int64_t b) const { return UnpackBlock4(rows, b); }
};
struct PackedWeights {
  const Unpacked4* blocks;
  const Unpacked4& operator()(int64_t b) const { return blocks[b]; }
};

// Per-call activation scales: da per token ([n_tokens][nb]) and sa per token quad and block,
// [sa_t0 x 4 | sa_t1 x 4 | sa_t2 x 4 | sa_t3 x 4] (lane 4q + r: token 4 * quad + q; 0 for
// tokens past n_tokens), the layout of the mins chains of a 4-row x 4-token quad.
struct alignas(64) Vec16 {
  __m512 v;
};
struct ActScales {
  float* da;
  Vec16* sa;  // [n_quads][nb]
};

inline float HalfToFloat(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(v)));
}

// Fills sc (per-thread scratch slots 0 and 1).
void ConvertActScales(const uint8_t* a, size_t a_stride, int n_tokens, int64_t nb, ActScales* sc) {
  const int n_quads = (n_tokens + 3) / 4;
  sc->da = static_cast<float*>(kernels::ThreadScratch(0, n_tokens * nb * sizeof(float)));
  sc->sa = static_cast<Vec16*>(kernels::ThreadScratch(1, n_quads * nb * sizeof(Vec16)));
  for (int q = 0; q < n_quads; ++q) {
    const BlockQ8_1* rows[4] = {};
    for (int i = 0; i < 4 && 4 * q + i < n_tokens; ++i) {
      rows[i] = reinterpret_cast<const BlockQ8_1*>(a + (4 * q + i) * a_stride);
    }
    for (int64_t b = 0; b < nb; ++b) {
      alignas(16) float sa[4] = {};
      for (int i = 0; i < 4; ++i) {
        if (rows[i] == nullptr) continue;
        sc->da[(4 * q + i) * nb + b] = HalfToFloat(rows[i][b].d);
        sa[i] = HalfToFloat(rows[i][b].s);
      }
      // lane 4i + r = sa[i]
      sc->sa[q * nb + b].v =
          _mm512_permutexvar_ps(_mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
                                _mm512_castps128_ps512(_mm_load_ps(sa)));
    }
  }
}

// Reduction of the 4 rows of one token: pair accumulators a01 (rows 0, 1) and a23 (rows 2, 3),
// each [acc0..7 of row 2p | acc0..7 of row 2p + 1] -> ((acc4 + acc0) + (acc6 + acc2)) + ((acc5 +
// acc1) + (acc7 + acc3)) per row (the same additions as the vec_dot's Hsum, lane-parallel), plus
// the rows' mins; rows r < n_store are stored to out[r].
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

// 4 rows x T tokens (T <= kTileTokens; the tile starts at a token quad boundary). a: the T
// tokens' Q8_1 rows (a_stride bytes apart); da: their scales [T][nb] (stride nb); sa: their
// quads' sa [quads][nb].
template <int T, typename Weights>
__attribute__((always_inline)) inline void Tile(const Weights& weights, int64_t nb,
                                                const uint8_t* a, size_t a_stride, const float* da,
                                                const Vec16* sa, int n_rows, float* out,
                                                size_t out_stride) {
  constexpr int kQuads = (T + 3) / 4;
  __m512 acc[2][T];
  __m512 mins[kQuads];
  Unroll<T>([&](auto t) {
    acc[0][t] = _mm512_setzero_ps();
    acc[1][t] = _mm512_setzero_ps();
  });
  Unroll<kQuads>([&](auto q) { mins[q] = _mm512_setzero_ps(); });
  for (int64_t b = 0; b < nb; ++b) {
    const Unpacked4& w = weights(b);
    Unroll<T>([&](auto t) {
      const auto* act = reinterpret_cast<const BlockQ8_1*>(a + t * a_stride);
      const __m512i qa =
          _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(act[b].qs)));
      const __m512 dat = _mm512_set1_ps(da[t * nb + b]);
      Unroll<2>([&](auto p) {
        const __m512i isum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w.qs[p], qa);
        const __m512 s = _mm512_mul_ps(w.d[p], dat);
        acc[p][t] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(isum), acc[p][t]);
      });
    });
    Unroll<kQuads>([&](auto q) { mins[q] = _mm512_fmadd_ps(w.m, sa[q * nb + b].v, mins[q]); });
  }
  alignas(64) float mins_f[kQuads * 16];
  Unroll<kQuads>([&](auto q) { _mm512_store_ps(mins_f + 16 * q, mins[q]); });
  Unroll<T>([&](auto t) {
    Reduce4(acc[0][t], acc[1][t], _mm_load_ps(mins_f + 4 * t), out + t * out_stride, n_rows);
  });
}

// All tokens of the call against one block of 4 rows: register tiles of kTileTokens tokens,
// then a tail of 1..7 tokens.
template <typename Weights>
void RowBlock(const Weights& w, int64_t nb, const uint8_t* a, size_t a_stride, const ActScales& sc,
              int n_tokens, int n_rows, float* out, size_t out_stride) {
  auto tile = [&]<int T>(int t) {
    Tile<T>(w, nb, a + t * a_stride, a_stride, sc.da + t * nb, sc.sa + t / 4 * nb, n_rows,
            out + t * out_stride, out_stride);
  };
  ForEachTile<kTileTokens>(n_tokens, tile);
}

}  // namespace

void VecDotTileQ4_1Q8_1Avx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                              size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  if (n_rows <= 0 || n_tokens <= 0) return;
  const int64_t nb = n / kQK;
  // Per-thread scratch (kernels/cpu/scratch.h): activation scales; weights [nb] blocks of 4 rows
  // (many tokens only).
  ActScales scales;
  const auto* ap = static_cast<const uint8_t*>(a);
  ConvertActScales(ap, a_stride, n_tokens, nb, &scales);
  // Up to two register tiles of tokens: unpack each weight block in registers where it is used
  // (for 9-16 tokens that unpacks twice, still faster than the copy: a 9-token pass 37.3 ->
  // 35.1 ms, 16 tokens 57.3 -> 55.2 ms on the default model); more: unpack each block of 4 rows
  // once per call into wts.
  const bool pack = n_tokens > 2 * kTileTokens;
  Unpacked4* wts =
      pack ? static_cast<Unpacked4*>(kernels::ThreadScratch(2, nb * sizeof(Unpacked4))) : nullptr;
  const auto* wp = static_cast<const uint8_t*>(w);
  const int64_t row_bytes = nb * static_cast<int64_t>(sizeof(BlockQ4_1));
  for (int r = 0; r < n_rows; r += kTileRows) {
    const int rows = n_rows - r < kTileRows ? n_rows - r : kTileRows;
    // Weights stream from memory once per call: fetch the rows kPrefetchRows ahead explicitly
    // (4 interleaved row streams defeat the hardware prefetcher), into L2: prefetcht0 8 rows
    // ahead stalled on full miss buffers, and how often depended on the code layout (one-token
    // passes 25% slower after an unrelated function was added elsewhere in the library).
    const int prefetch_end =
        r + kPrefetchRows + kTileRows < n_rows ? r + kPrefetchRows + kTileRows : n_rows;
    for (int pr = r + kPrefetchRows; pr < prefetch_end; ++pr) {
      const uint8_t* row = wp + pr * w_stride;
      for (int64_t off = 0; off < row_bytes; off += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(row + off), _MM_HINT_T1);
      }
    }
    RawWeights raw;
    for (int i = 0; i < kTileRows; ++i) {
      raw.rows[i] = reinterpret_cast<const BlockQ4_1*>(wp + (i < rows ? r + i : r) * w_stride);
    }
    if (!pack) {
      RowBlock(raw, nb, ap, a_stride, scales, n_tokens, rows, out + r, out_stride);
      continue;
    }
    for (int64_t b = 0; b < nb; ++b) wts[b] = raw(b);
    RowBlock(PackedWeights{wts}, nb, ap, a_stride, scales, n_tokens, rows, out + r, out_stride);
  }
}

}  // namespace kiln::quant
