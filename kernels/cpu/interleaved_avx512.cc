// Integer-order matmul kernels on row-interleaved weights (lib/quant/interleave.h) with 512-bit
// VNNI: Q4_1 x Q8_1, Q4_0 x Q8_0, Q5_0 x Q8_0 and Q8_0 x Q8_0. Compiled with -ffp-contract=off
// (kernels/cpu/CMakeLists.txt): every FMA is explicit.
//
// Lane r of every vector is weight row 16 g + r of the group in use, so a block's dot product
// needs no horizontal reduction: per (group, block, token) eight vpdpbusd (the activation's
// dwords as broadcast operands, two independent chains summed: exact int32), the scale multiply,
// the convert and one FMA (Q4_1: plus the mins FMA; Q8_0: plus the offset correction) give 16
// rows x 32 elements in 12 vector ops, where the ggml order needs about 5 per 64 elements. A
// register tile is one group x up to 8 tokens; the group's weight block is decoded once per tile
// and the group's bytes stay in L1 for the next token tile. The bound is vpdpbusd throughput (one
// zmm per cycle on Zen 4): cpu_ops_bench --tile measures ~330 GFLOP/s for Q4_1 at 8+ tokens, about
// 85% of it. (Measured, not kept: one chain of eight vpdpbusd instead of two: 3-5% slower at 8
// tokens.)
//
// Q4_1: four 64-byte loads give the 32 nibbles of 16 rows (AND: elements 4i..4i+3; shift + AND:
// 16+4i..16+4i+3), one vcvtph2ps each the 16 scales and mins.
// Q4_0: Q4_1's nibbles, then Σ (nibble - 8) * qa = Σ nibble * qa - 8 * Σ qa, the second term
// exact and per (token, block), computed once per call; no mins.
// Q5_0: Q4_0's steps with 5-bit q (offset 16); bit 4 of the elements of line i sits in byte i / 2
// (low nibbles) and 2 + i / 2 (high nibbles) of the row's qh dword, at bits 4 (i % 2) + j: one
// vpshufb spreads that byte over the row's 4 lanes, one vptestmb makes the mask, a masked add
// puts the 16 in.
// Q8_0: the packer stores qw + 128 (unsigned bytes, what vpdpbusd multiplies), so
// Σ qw * qa = Σ (qw + 128) * qa - 128 * Σ qa; the second term is exact and per (token, block),
// computed once per call.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/interleaved.h"
#include "kernels/cpu/legacy.h"
#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/unroll.h"

namespace kiln::quant {
namespace {

constexpr int kTileTokens = 8;

inline __m512i Broadcast(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return _mm512_set1_epi32(v);
}

// Σ over 32 elements of w (weight bytes, unsigned, as 8 dword vectors: w[i] pairs with activation
// dword i) times the activation block's qs: two chains of four vpdpbusd, exact int32.
inline __m512i BlockDot(const __m512i w[8], const int8_t* qa) {
  __m512i p0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], Broadcast(qa));
  __m512i p1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[4], Broadcast(qa + 16));
  Unroll<3>([&](auto k) {
    p0 = _mm512_dpbusd_epi32(p0, w[k + 1], Broadcast(qa + 4 * (k + 1)));
    p1 = _mm512_dpbusd_epi32(p1, w[k + 5], Broadcast(qa + 16 + 4 * (k + 1)));
  });
  return _mm512_add_epi32(p0, p1);
}

// Weights stream from memory once per call (kernels/cpu/prefetch.h).
template <typename Block>
inline void PrefetchAhead(const Block* w, int64_t b) {
  PrefetchStreamAhead(w + b, sizeof(Block));
}

inline __m512 HalvesToFloats(const uint8_t (*h)[2]) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h)));
}

// The low 4 bits of a block's 32 elements of 16 rows: q[i] elements 4i..4i+3 (i < 4), q[i + 4]
// elements 16+4i..16+4i+3 (the x16 layouts' qs lines).
inline void Nibbles(const uint8_t (*qs)[64], __m512i q[8]) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  Unroll<4>([&](auto i) {
    const __m512i packed = _mm512_loadu_si512(qs[i]);
    q[i] = _mm512_and_si512(packed, low);
    q[i + 4] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low);
  });
}

// Byte k of each row's dword copied to the row's 4 bytes (vpshufb works in 128-bit lanes of 4
// rows each).
inline __m512i SpreadByte(int k) {
  return _mm512_broadcast_i32x4(_mm_setr_epi32(k * 0x01010101, (4 + k) * 0x01010101,
                                               (8 + k) * 0x01010101, (12 + k) * 0x01010101));
}

struct Q4_1Format {
  using Block = BlockQ4_1x16;
  using ActBlock = BlockQ8_1;
  using Aux = float;  // sa: f32 of the activation block's s (d * Σ qa)
  static void Scales(const ActBlock& a, float* d, Aux* aux) {
    *d = LoadHalf(a.d);
    *aux = LoadHalf(a.s);
  }
  // One group of 16 rows x T tokens; a: the T tokens' rows; d, aux: their scales (stride nb).
  // flatten: GCC otherwise leaves some Unroll lambdas as calls (2-4x slower at 3-7 tokens).
  template <int T>
  __attribute__((flatten)) static void Tile(const Block* w, int64_t nb, const uint8_t* a,
                                            size_t a_stride, const float* d, const Aux* aux,
                                            int n_rows, float* out, size_t out_stride) {
    __m512 acc[T], mins[T];
    Unroll<T>([&](auto t) {
      acc[t] = _mm512_setzero_ps();
      mins[t] = _mm512_setzero_ps();
    });
    for (int64_t b = 0; b < nb; ++b) {
      PrefetchAhead(w, b);
      __m512i q[8];
      Nibbles(w[b].qs, q);
      const __m512 dw = HalvesToFloats(w[b].d);
      const __m512 mw = HalvesToFloats(w[b].m);
      Unroll<T>([&](auto t) {
        const auto* act = reinterpret_cast<const ActBlock*>(a + t * a_stride) + b;
        const __m512 s = _mm512_mul_ps(dw, _mm512_set1_ps(d[t * nb + b]));
        acc[t] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(BlockDot(q, act->qs)), acc[t]);
        mins[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(aux[t * nb + b]), mins[t]);
      });
    }
    const __mmask16 store = n_rows >= kInterleaveRows ? 0xFFFF : (1u << n_rows) - 1;
    Unroll<T>([&](auto t) {
      _mm512_mask_storeu_ps(out + t * out_stride, store, _mm512_add_ps(acc[t], mins[t]));
    });
  }
};

// Q4_0 (kOffset 8), Q5_0 (kOffset 16, bit 4 of each element from the row's qh) and Q8_0 (kOffset
// 128: the packer stored qw + 128) weights x Q8_0 activations: P = Σ q * qa - kOffset * Σ qa, no
// mins.
template <typename B, int kOffset>
struct OffsetFormat {
  static constexpr bool kFiveBit = kOffset == 16;
  static constexpr bool kBytes = kOffset == 128;
  using Block = B;
  using ActBlock = BlockQ8_0;
  using Aux = int32_t;  // -kOffset * Σ qa: the correction for the weights' offset
  static void Scales(const ActBlock& a, float* d, Aux* aux) {
    *d = LoadHalf(a.d);
    *aux = -kOffset * SumQs(a);
  }
  template <int T>
  __attribute__((flatten)) static void Tile(const Block* w, int64_t nb, const uint8_t* a,
                                            size_t a_stride, const float* d, const Aux* aux,
                                            int n_rows, float* out, size_t out_stride) {
    __m512 acc[T];
    Unroll<T>([&](auto t) { acc[t] = _mm512_setzero_ps(); });
    [[maybe_unused]] const __m512i bit4 = _mm512_set1_epi8(0x10);
    [[maybe_unused]] const __m512i spread[4] = {SpreadByte(0), SpreadByte(1), SpreadByte(2),
                                                SpreadByte(3)};
    // Byte j of a row's lanes tests bit j (even lines) or 4 + j (odd lines) of the spread byte.
    [[maybe_unused]] const __m512i test[2] = {_mm512_set1_epi32(0x08040201),
                                              _mm512_set1_epi32(0x80402010)};
    for (int64_t b = 0; b < nb; ++b) {
      PrefetchAhead(w, b);
      __m512i q[8];
      if constexpr (kBytes) {
        Unroll<8>([&](auto i) { q[i] = _mm512_loadu_si512(w[b].qs[i]); });
      } else {
        Nibbles(w[b].qs, q);
      }
      if constexpr (kFiveBit) {
        const __m512i qh = _mm512_loadu_si512(w[b].qh);
        __m512i high_bytes[4];
        Unroll<4>([&](auto k) { high_bytes[k] = _mm512_shuffle_epi8(qh, spread[k]); });
        Unroll<4>([&](auto i) {
          const __mmask64 lo_set = _mm512_test_epi8_mask(high_bytes[i / 2], test[i % 2]);
          const __mmask64 hi_set = _mm512_test_epi8_mask(high_bytes[2 + i / 2], test[i % 2]);
          q[i] = _mm512_mask_add_epi8(q[i], lo_set, q[i], bit4);
          q[i + 4] = _mm512_mask_add_epi8(q[i + 4], hi_set, q[i + 4], bit4);
        });
      }
      const __m512 dw = HalvesToFloats(w[b].d);
      Unroll<T>([&](auto t) {
        const auto* act = reinterpret_cast<const ActBlock*>(a + t * a_stride) + b;
        const __m512i p =
            _mm512_add_epi32(BlockDot(q, act->qs), _mm512_set1_epi32(aux[t * nb + b]));
        const __m512 s = _mm512_mul_ps(dw, _mm512_set1_ps(d[t * nb + b]));
        acc[t] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(p), acc[t]);
      });
    }
    const __mmask16 store = n_rows >= kInterleaveRows ? 0xFFFF : (1u << n_rows) - 1;
    Unroll<T>([&](auto t) { _mm512_mask_storeu_ps(out + t * out_stride, store, acc[t]); });
  }
};
using Q4_0Format = OffsetFormat<BlockQ4_0x16, 8>;
using Q5_0Format = OffsetFormat<BlockQ5_0x16, 16>;
using Q8_0Format = OffsetFormat<BlockQ8_0x16, 128>;

// The InterleavedTileFn contract for one format: activation scales converted once per call,
// then every group of 16 rows in register tiles of up to kTileTokens tokens.
template <typename F>
void InterleavedTile(int64_t n, const void* w, int n_rows, const void* a, size_t a_stride,
                     int n_tokens, float* out, size_t out_stride) {
  if (n_rows <= 0 || n_tokens <= 0) return;
  const int64_t nb = n / kQK;
  const size_t need = static_cast<size_t>(n_tokens) * nb;
  auto* d = static_cast<float*>(kernels::ThreadScratch(0, need * sizeof(float)));
  auto* aux =
      static_cast<typename F::Aux*>(kernels::ThreadScratch(1, need * sizeof(typename F::Aux)));
  const auto* ap = static_cast<const uint8_t*>(a);
  for (int t = 0; t < n_tokens; ++t) {
    const auto* row = reinterpret_cast<const typename F::ActBlock*>(ap + t * a_stride);
    for (int64_t b = 0; b < nb; ++b) F::Scales(row[b], d + t * nb + b, aux + t * nb + b);
  }
  const auto* groups = static_cast<const typename F::Block*>(w);
  for (int r = 0; r < n_rows; r += kInterleaveRows) {
    const typename F::Block* g = groups + r / kInterleaveRows * nb;
    ForEachTile<kTileTokens>(n_tokens, [&]<int T>(int t) {
      F::template Tile<T>(g, nb, ap + t * a_stride, a_stride, d + t * nb, aux + t * nb, n_rows - r,
                          out + t * out_stride + r, out_stride);
    });
  }
}

}  // namespace

void InterleavedTileQ4_1Q8_1Avx512(int64_t n, const void* w, int n_rows, const void* a,
                                   size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  InterleavedTile<Q4_1Format>(n, w, n_rows, a, a_stride, n_tokens, out, out_stride);
}

void InterleavedTileQ4_0Q8_0Avx512(int64_t n, const void* w, int n_rows, const void* a,
                                   size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  InterleavedTile<Q4_0Format>(n, w, n_rows, a, a_stride, n_tokens, out, out_stride);
}

void InterleavedTileQ5_0Q8_0Avx512(int64_t n, const void* w, int n_rows, const void* a,
                                   size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  InterleavedTile<Q5_0Format>(n, w, n_rows, a, a_stride, n_tokens, out, out_stride);
}

void InterleavedTileQ8_0Q8_0Avx512(int64_t n, const void* w, int n_rows, const void* a,
                                   size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  InterleavedTile<Q8_0Format>(n, w, n_rows, a, a_stride, n_tokens, out, out_stride);
}

}  // namespace kiln::quant
