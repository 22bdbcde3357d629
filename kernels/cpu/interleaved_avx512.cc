// Integer-order matmul kernels on row-interleaved weights (lib/quant/interleave.h) with 512-bit
// VNNI: Q4_1 x Q8_1, Q4_0 x Q8_0, Q5_0 x Q8_0, Q5_1 x Q8_1 and Q8_0 x Q8_0. Compiled with
// -ffp-contract=off (kernels/cpu/CMakeLists.txt): every FMA is explicit.
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
// Q5_1: Q4_1's steps with Q5_0's bit 4.
// Q8_0: the packer stores qw + 128 (unsigned bytes, what vpdpbusd multiplies), so
// Σ qw * qa = Σ (qw + 128) * qa - 128 * Σ qa; the second term is exact and per (token, block),
// computed once per call.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/interleaved.h"
#include "kernels/cpu/interleaved_driver.h"
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

// Weights stream from memory once per call (kernels/cpu/prefetch.h), prefetched where more than
// one token tile passes over each group (prefill), and for one tile (decode, verification passes)
// on the cores that stream the groups' one contiguous stream faster so (PrefetchOneTokenStream:
// on Zen 4 the hardware prefetcher alone was faster, decode128 at 1 thread llama-1b-q4_0 37.5 ->
// 51.2 tok/s, q4_1 34.4 -> 46.1, the default model 232.4 -> 259.2; 2 threads llama-1b-q4_0 56.9
// -> 59.9; prefill512 unchanged, 153.5 -> 153.4, and without the prefetch there too 3% slower).
// The AVX2 kernels, which read each group twice (once per octet), keep it for one token (without
// it: 0.87x on Zen 4).
template <typename Block>
inline void PrefetchAhead(const Block* w, int64_t b) {
  PrefetchStreamAhead(w + b, sizeof(Block));
}

inline __m512 HalvesToFloats(const uint8_t (*h)[2]) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h)));
}

// The low 4 bits of a block's 32 elements of 16 rows from its four qs lines (the x16 layouts'
// qs[i]): q[i] elements 4i..4i+3 (i < 4), q[i + 4] elements 16+4i..16+4i+3.
inline void Nibbles(const __m512i packed[4], __m512i q[8]) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  Unroll<4>([&](auto i) {
    q[i] = _mm512_and_si512(packed[i], low);
    q[i + 4] = _mm512_and_si512(_mm512_srli_epi16(packed[i], 4), low);
  });
}

// Byte k of each row's dword copied to the row's 4 bytes (vpshufb works in 128-bit lanes of 4
// rows each).
inline __m512i SpreadByte(int k) {
  return _mm512_broadcast_i32x4(_mm_setr_epi32(k * 0x01010101, (4 + k) * 0x01010101,
                                               (8 + k) * 0x01010101, (12 + k) * 0x01010101));
}

// Bit 4 of the 5-bit formats' elements (Q5_0, Q5_1): for line i it sits in byte i / 2 (low
// nibbles) and 2 + i / 2 (high nibbles) of the row's qh dword, at bits 4 (i % 2) + j.
struct HighBits {
  __m512i bit4 = _mm512_set1_epi8(0x10);
  __m512i spread[4] = {SpreadByte(0), SpreadByte(1), SpreadByte(2), SpreadByte(3)};
  // Byte j of a row's lanes tests bit j (even lines) or 4 + j (odd lines) of the spread byte.
  __m512i test[2] = {_mm512_set1_epi32(0x08040201), _mm512_set1_epi32(0x80402010)};

  // Adds 16 to the elements of q (Nibbles' lines) whose bit 4 is set in the rows' qh dwords.
  __attribute__((always_inline)) void Add(__m512i qh, __m512i q[8]) const {
    __m512i high_bytes[4];
    Unroll<4>([&](auto k) { high_bytes[k] = _mm512_shuffle_epi8(qh, spread[k]); });
    Unroll<4>([&](auto i) {
      const __mmask64 lo_set = _mm512_test_epi8_mask(high_bytes[i / 2], test[i % 2]);
      const __mmask64 hi_set = _mm512_test_epi8_mask(high_bytes[2 + i / 2], test[i % 2]);
      q[i] = _mm512_mask_add_epi8(q[i], lo_set, q[i], bit4);
      q[i + 4] = _mm512_mask_add_epi8(q[i + 4], hi_set, q[i + 4], bit4);
    });
  }
};

// Where a tile's weight blocks come from. Load(b, q, &dw, &mw) gives block b of the group: its 32
// elements of 16 rows as the eight lines the formats multiply (unsigned bytes, bit 4 added), the
// rows' scales and (Q4_1, Q5_1) mins; Prefetch(b, stream) is called before it (stream: the
// caller wants the copy's stream prefetched, see PrefetchAhead).

// The interleaved copy's group.
template <typename B>
struct CopyBlocks {
  static constexpr bool kFiveBit = requires(B x) { x.qh; };
  static constexpr bool kMins = requires(B x) { x.m; };
  static constexpr bool kBytes = sizeof(B::qs) == 8 * 64;
  const B* w;
  HighBits high;

  explicit CopyBlocks(const B* group) : w(group) {}
  // Q5_1 prefetches its one-token stream on every core (on Zen 4, unlike the other formats, see
  // PrefetchAhead: alternating runs, 1 thread, decode128 of the default model requantized to Q5_1
  // 183-191 -> 218-228 tok/s, llama-1b-q5_1 26.5-26.8 -> 27.9-28.6; Q5_0 the same either way).
  __attribute__((always_inline)) void Prefetch(int64_t b, bool stream) const {
    if (stream || (kFiveBit && kMins)) PrefetchAhead(w, b);
  }
  __attribute__((always_inline)) void Load(int64_t b, __m512i q[8], __m512* dw, __m512* mw) const {
    if constexpr (kBytes) {
      Unroll<8>([&](auto i) { q[i] = _mm512_loadu_si512(w[b].qs[i]); });
    } else {
      __m512i packed[4];
      Unroll<4>([&](auto i) { packed[i] = _mm512_loadu_si512(w[b].qs[i]); });
      Nibbles(packed, q);
    }
    if constexpr (kFiveBit) high.Add(_mm512_loadu_si512(w[b].qh), q);
    *dw = HalvesToFloats(w[b].d);
    if constexpr (kMins) *mw = HalvesToFloats(w[b].m);
  }
};

// 16 rows of the file's Q4_0 / Q4_1 / Q5_0 / Q5_1 blocks (S), w_stride bytes apart, read in
// place: block b's x16 lines made in registers. Four 128-bit loads per zmm put the qs of rows k,
// 4 + k, 8 + k, 12 + k in its lanes (zmm k), and a 4 x 4 dword transpose in every lane makes the
// lines (line i, lane L: dword i of rows 4L..4L+3); one gather brings each row's first dword (d,
// and m in the high half where S has it), one more the qh dwords of the 5-bit formats. As
// Q8_0Rows, each block prefetches as many bytes of the group groups_ahead on as it reads.
template <typename S>
struct NibbleRows {
  static constexpr bool kFiveBit = requires(S x) { x.qh; };
  static constexpr bool kMins = requires(S x) { x.m; };
  static constexpr size_t kGroupsAheadBytes = 2 * kStreamPrefetchBytes;
  static constexpr int kBlockLines = (kInterleaveRows * sizeof(S) + 63) / 64;
  const uint8_t* w;
  size_t w_stride;
  size_t groups_ahead;
  __m512i row_offsets;
  HighBits high;

  NibbleRows(const uint8_t* rows, size_t stride)
      : w(rows),
        w_stride(stride),
        groups_ahead(1 + kGroupsAheadBytes / (kInterleaveRows * stride)),
        row_offsets(_mm512_mullo_epi32(
            _mm512_set1_epi32(static_cast<int>(stride)),
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15))) {}

  __attribute__((always_inline)) void Prefetch(int64_t b, bool /*stream*/) const {
    const char* ahead =
        reinterpret_cast<const char*>(w + groups_ahead * kInterleaveRows * w_stride) +
        b * kInterleaveRows * sizeof(S);
    Unroll<kBlockLines>([&](auto line) { _mm_prefetch(ahead + 64 * line, _MM_HINT_T1); });
  }
  // The x16 block's bytes in registers: qs lines, head (the rows' first dwords: d | m << 16) and
  // qh (the rows' qh dwords; 5-bit formats only).
  __attribute__((always_inline)) void Raw(int64_t b, __m512i packed[4], __m512i* head,
                                          __m512i* qh) const {
    const uint8_t* block = w + b * sizeof(S);
    __m512i z[4];
    Unroll<4>([&](auto k) {
      auto qs = [&](int row) {
        return _mm_loadu_si128(
            reinterpret_cast<const __m128i*>(block + row * w_stride + offsetof(S, qs)));
      };
      __m512i v = _mm512_castsi128_si512(qs(k));
      v = _mm512_inserti32x4(v, qs(4 + k), 1);
      v = _mm512_inserti32x4(v, qs(8 + k), 2);
      z[k] = _mm512_inserti32x4(v, qs(12 + k), 3);
    });
    const __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]), t1 = _mm512_unpackhi_epi32(z[0], z[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]), t3 = _mm512_unpackhi_epi32(z[2], z[3]);
    packed[0] = _mm512_unpacklo_epi64(t0, t2);
    packed[1] = _mm512_unpackhi_epi64(t0, t2);
    packed[2] = _mm512_unpacklo_epi64(t1, t3);
    packed[3] = _mm512_unpackhi_epi64(t1, t3);
    *head = _mm512_i32gather_epi32(row_offsets, block, 1);
    if constexpr (kFiveBit) *qh = _mm512_i32gather_epi32(row_offsets, block + offsetof(S, qh), 1);
  }
  __attribute__((always_inline)) void Load(int64_t b, __m512i q[8], __m512* dw, __m512* mw) const {
    __m512i packed[4], head, qh;
    Raw(b, packed, &head, &qh);
    Nibbles(packed, q);
    if constexpr (kFiveBit) high.Add(qh, q);
    *dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head));
    if constexpr (kMins) *mw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(head, 16)));
  }
};

// A group's blocks decoded once for all the token tiles of a call (more than kTileTokens tokens):
// each tile then loads the lines and scales where it would decode them again (the nibble formats'
// AND and shift, the 5-bit formats' 20 mask operations, the scale conversions). 640 B a block, in
// per-thread scratch (slot 2).
struct DecodedBlock {
  __m512i q[8];
  __m512 dw, mw;  // mw: zero where the format has no mins
};

struct DecodedBlocks {
  const DecodedBlock* w;
  __attribute__((always_inline)) void Prefetch(int64_t, bool) const {}
  __attribute__((always_inline)) void Load(int64_t b, __m512i q[8], __m512* dw, __m512* mw) const {
    Unroll<8>([&](auto i) { q[i] = _mm512_load_si512(&w[b].q[i]); });
    *dw = w[b].dw;
    *mw = w[b].mw;
  }
};

// Blocks [0, nb) of `source` (CopyBlocks or NibbleRows), prefetched as a tile over them would.
template <typename Src>
DecodedBlock* DecodeGroup(const Src& source, int64_t nb) {
  auto* out = static_cast<DecodedBlock*>(kernels::ThreadScratch(2, nb * sizeof(DecodedBlock)));
  for (int64_t b = 0; b < nb; ++b) {
    source.Prefetch(b, /*stream=*/true);
    __m512i q[8];
    __m512 dw, mw = _mm512_setzero_ps();
    source.Load(b, q, &dw, &mw);
    Unroll<8>([&](auto i) { _mm512_store_si512(&out[b].q[i], q[i]); });
    out[b].dw = dw;
    out[b].mw = mw;
  }
  return out;
}

// Q4_1 and Q5_1 (bit 4 from the rows' qh) weights x Q8_1 activations: P = Σ q * qa,
// and the mins.
template <typename B>
struct MinFormat {
  using Block = B;
  using ActBlock = BlockQ8_1;
  using Aux = float;  // sa: f32 of the activation block's s (d * Σ qa)
  static void Scales(const ActBlock& a, float* d, Aux* aux) {
    *d = interleaved::HalfToFloat(a.d);
    *aux = interleaved::HalfToFloat(a.s);
  }
  // One group of 16 rows x T tokens; a: the T tokens' rows; d, aux: their scales (stride nb).
  // flatten: GCC otherwise leaves some Unroll lambdas as calls (2-4x slower at 3-7 tokens).
  template <int T, typename Src>
  __attribute__((flatten)) static void Tile(const Src& w, int64_t nb, const uint8_t* a,
                                            size_t a_stride, const float* d, const Aux* aux,
                                            int n_rows, float* out, size_t out_stride,
                                            bool prefetch) {
    __m512 acc[T], mins[T];
    Unroll<T>([&](auto t) {
      acc[t] = _mm512_setzero_ps();
      mins[t] = _mm512_setzero_ps();
    });
    for (int64_t b = 0; b < nb; ++b) {
      w.Prefetch(b, prefetch);
      __m512i q[8];
      __m512 dw, mw;
      w.Load(b, q, &dw, &mw);
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
using Q4_1Format = MinFormat<BlockQ4_1x16>;
using Q5_1Format = MinFormat<BlockQ5_1x16>;

// One block of 16 rows (its lines q as unsigned bytes, its scales dw) into the T tokens' chains of
// an offset format: P = Σ q * qa + aux (aux = -offset * Σ qa), acc = fma(dw * da, float(P), acc).
template <int T>
inline void AccumulateOffsetBlock(const __m512i q[8], __m512 dw, int64_t b, int64_t nb,
                                  const uint8_t* a, size_t a_stride, const float* d,
                                  const int32_t* aux, __m512 acc[T]) {
  Unroll<T>([&](auto t) {
    const auto* act = reinterpret_cast<const BlockQ8_0*>(a + t * a_stride) + b;
    const __m512i p = _mm512_add_epi32(BlockDot(q, act->qs), _mm512_set1_epi32(aux[t * nb + b]));
    const __m512 s = _mm512_mul_ps(dw, _mm512_set1_ps(d[t * nb + b]));
    acc[t] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(p), acc[t]);
  });
}

template <int T>
inline void StoreTile(const __m512 acc[T], int n_rows, float* out, size_t out_stride) {
  const __mmask16 store = n_rows >= kInterleaveRows ? 0xFFFF : (1u << n_rows) - 1;
  Unroll<T>([&](auto t) { _mm512_mask_storeu_ps(out + t * out_stride, store, acc[t]); });
}

// Q4_0 (kOffset 8), Q5_0 (kOffset 16, bit 4 of each element from the row's qh) and Q8_0 (kOffset
// 128: the packer stored qw + 128) weights x Q8_0 activations: P = Σ q * qa - kOffset * Σ qa, no
// mins.
template <typename B, int kOffset>
struct OffsetFormat {
  using Block = B;
  using ActBlock = BlockQ8_0;
  using Aux = int32_t;  // -kOffset * Σ qa: the correction for the weights' offset
  static void Scales(const ActBlock& a, float* d, Aux* aux) {
    *d = interleaved::HalfToFloat(a.d);
    *aux = -kOffset * interleaved::SumQsSad(a);
  }
  template <int T, typename Src>
  __attribute__((flatten)) static void Tile(const Src& w, int64_t nb, const uint8_t* a,
                                            size_t a_stride, const float* d, const Aux* aux,
                                            int n_rows, float* out, size_t out_stride,
                                            bool prefetch) {
    __m512 acc[T];
    Unroll<T>([&](auto t) { acc[t] = _mm512_setzero_ps(); });
    for (int64_t b = 0; b < nb; ++b) {
      w.Prefetch(b, prefetch);
      __m512i q[8];
      __m512 dw, unused_mins;
      w.Load(b, q, &dw, &unused_mins);
      AccumulateOffsetBlock<T>(q, dw, b, nb, a, a_stride, d, aux, acc);
    }
    StoreTile<T>(acc, n_rows, out, out_stride);
  }
};
using Q4_0Format = OffsetFormat<BlockQ4_0x16, 8>;
using Q5_0Format = OffsetFormat<BlockQ5_0x16, 16>;
using Q8_0Format = OffsetFormat<BlockQ8_0x16, 128>;

// One group of 16 rows (n_rows of them real, blocks from `source`) x every token, in register
// tiles of up to kTileTokens tokens.
template <typename F, typename Src>
void SourceTiles(const Src& source, int64_t nb, int n_rows, const uint8_t* a, size_t a_stride,
                 int n_tokens, const float* d, const typename F::Aux* aux, float* out,
                 size_t out_stride, bool prefetch) {
  ForEachTile<kTileTokens>(n_tokens, [&]<int T>(int t) {
    F::template Tile<T>(source, nb, a + t * a_stride, a_stride, d + t * nb, aux + t * nb, n_rows,
                        out + t * out_stride, out_stride, prefetch);
  });
}

// The copy's group g. The 5-bit formats' groups are decoded once where more than one tile passes
// over them (Zen 5, 512 tokens, the SmolLM2 layer shapes: Q5_0 55-59% -> 59-63% of the int8 peak,
// Q5_1 53-57% -> 59-63%). The 4-bit formats' decode (an AND and a shift a line) is cheap enough to
// repeat: decoded once, they ran no faster on those shapes and slower on the 576 x 49152 head
// (56-61% -> 50-52%: a decoded group takes 640 B a block of L1, the raw one 288-320 B, beside
// outputs that miss to memory). Q8_0's copy holds its lines as they are multiplied.
template <typename F>
void GroupTiles(const typename F::Block* g, int64_t nb, int n_rows, const uint8_t* a,
                size_t a_stride, int n_tokens, const float* d, const typename F::Aux* aux,
                float* out, size_t out_stride) {
  const CopyBlocks<typename F::Block> copy(g);
  if (n_tokens > kTileTokens && copy.kFiveBit) {
    return SourceTiles<F>(DecodedBlocks{DecodeGroup(copy, nb)}, nb, n_rows, a, a_stride, n_tokens,
                          d, aux, out, out_stride, false);
  }
  SourceTiles<F>(copy, nb, n_rows, a, a_stride, n_tokens, d, aux, out, out_stride,
                 n_tokens > kTileTokens || PrefetchOneTokenStream());
}

// Block b of 16 Q8_0 rows (w_stride bytes apart) as an x16 block in registers: q[i] = line i
// (dword i of rows 0..15, + 128: a flip of the top bits), dw the 16 scales. Rows r and r + 8
// share a zmm (low and high 256 bits), and an 8 x 8 dword transpose in both halves at once
// (unpacks, then one two-source qword permute per line) makes the lines; one gather brings the
// scales. The group's 16 rows are one contiguous stream read 16 places at once, which the
// hardware prefetcher does not follow: each block prefetches as many bytes of the group
// groups_ahead on (at least one group, at least kGroupsAheadBytes ahead) as it reads. Measured
// on one core streaming 400 MB (2048 x 8192, 8192 x 2048 and 576 x 49152 matrices): 22-24 GB/s,
// the interleaved copy's 21-23; each row prefetched 512 bytes ahead instead: 16-19 GB/s.
struct Q8_0Rows {
  static constexpr size_t kGroupsAheadBytes = 2 * kStreamPrefetchBytes;
  const uint8_t* w;
  size_t w_stride;
  __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  size_t groups_ahead;
  __m512i row_offsets;
  // Qwords of line i (i < 4) from unpacked u (rows 0-3 / 8-11) and v (rows 4-7 / 12-15): the
  // 128-bit lanes u.0, v.0, u.2, v.2; line i + 4: u.1, v.1, u.3, v.3.
  __m512i low_lanes = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
  __m512i high_lanes = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);

  Q8_0Rows(const uint8_t* rows, size_t stride)
      : w(rows),
        w_stride(stride),
        groups_ahead(1 + kGroupsAheadBytes / (kInterleaveRows * stride)),
        row_offsets(_mm512_mullo_epi32(
            _mm512_set1_epi32(static_cast<int>(stride)),
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15))) {}

  __attribute__((always_inline)) void Lines(int64_t b, __m512i q[8], __m256i* scales) const {
    const uint8_t* block = w + b * sizeof(BlockQ8_0);
    // The next group's bytes, as many per block as a block of this group reads.
    const char* ahead =
        reinterpret_cast<const char*>(w + groups_ahead * kInterleaveRows * w_stride) +
        b * kInterleaveRows * sizeof(BlockQ8_0);
    for (int line = 0; line < 9; ++line) _mm_prefetch(ahead + 64 * line, _MM_HINT_T1);
    __m512i z[8], t[8], u[8];
    Unroll<8>([&](auto r) {
      const auto* lo = reinterpret_cast<const __m256i*>(block + r * w_stride + 2);
      const auto* hi = reinterpret_cast<const __m256i*>(block + (r + 8) * w_stride + 2);
      z[r] = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(lo)),
                                                 _mm256_loadu_si256(hi), 1),
                              flip);
    });
    Unroll<4>([&](auto k) {
      t[2 * k] = _mm512_unpacklo_epi32(z[2 * k], z[2 * k + 1]);
      t[2 * k + 1] = _mm512_unpackhi_epi32(z[2 * k], z[2 * k + 1]);
    });
    // u[0..3]: dwords 0/4, 1/5, 2/6, 3/7 of rows 0-3 (and 8-11); u[4..7] the same of rows 4-7.
    Unroll<2>([&](auto h) {
      u[4 * h + 0] = _mm512_unpacklo_epi64(t[4 * h + 0], t[4 * h + 2]);
      u[4 * h + 1] = _mm512_unpackhi_epi64(t[4 * h + 0], t[4 * h + 2]);
      u[4 * h + 2] = _mm512_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
      u[4 * h + 3] = _mm512_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
    });
    Unroll<4>([&](auto i) {
      q[i] = _mm512_permutex2var_epi64(u[i], low_lanes, u[4 + i]);
      q[i + 4] = _mm512_permutex2var_epi64(u[i], high_lanes, u[4 + i]);
    });
    *scales = _mm512_cvtepi32_epi16(_mm512_i32gather_epi32(row_offsets, block, 1));
  }
};

// Blocks [b0, b1) of 16 Q8_0 rows -> out[0 .. b1 - b0).
void PackQ8_0x16Rows(const uint8_t* w, size_t w_stride, int64_t b0, int64_t b1, BlockQ8_0x16* out) {
  const Q8_0Rows rows(w, w_stride);
  for (int64_t b = b0; b < b1; ++b) {
    __m512i q[8];
    __m256i scales;
    rows.Lines(b, q, &scales);
    Unroll<8>([&](auto i) { _mm512_storeu_si512(out[b - b0].qs[i], q[i]); });
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[b - b0].d), scales);
  }
}

// Blocks [b0, b1) of a group (packed at chunk) x T tokens, continuing the chains out holds when
// b0 > 0 (a float stored and loaded back is the same float: the bits of one pass).
template <int T>
__attribute__((flatten)) void Q8_0ChunkTile(const BlockQ8_0x16* chunk, int64_t b0, int64_t b1,
                                            int64_t nb, const uint8_t* a, size_t a_stride,
                                            const float* d, const int32_t* aux, int n_rows,
                                            float* out, size_t out_stride) {
  const __mmask16 rows = n_rows >= kInterleaveRows ? 0xFFFF : (1u << n_rows) - 1;
  __m512 acc[T];
  Unroll<T>([&](auto t) {
    acc[t] = b0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(rows, out + t * out_stride);
  });
  for (int64_t b = b0; b < b1; ++b) {
    __m512i q[8];
    Unroll<8>([&](auto i) { q[i] = _mm512_loadu_si512(chunk[b - b0].qs[i]); });
    AccumulateOffsetBlock<T>(q, HalvesToFloats(chunk[b - b0].d), b, nb, a, a_stride, d, aux, acc);
  }
  StoreTile<T>(acc, n_rows, out, out_stride);
}

// 16 Q8_0 rows x T tokens straight from the rows: Q8_0Format's tile with the lines made in
// registers, for a few tokens (more share a packed copy).
template <int T>
__attribute__((flatten)) void Q8_0RowsTile(const Q8_0Rows& rows, int64_t nb, const uint8_t* a,
                                           size_t a_stride, const float* d, const int32_t* aux,
                                           float* out, size_t out_stride) {
  __m512 acc[T];
  Unroll<T>([&](auto t) { acc[t] = _mm512_setzero_ps(); });
  for (int64_t b = 0; b < nb; ++b) {
    __m512i q[8];
    __m256i scales;
    rows.Lines(b, q, &scales);
    AccumulateOffsetBlock<T>(q, _mm512_cvtph_ps(scales), b, nb, a, a_stride, d, aux, acc);
  }
  StoreTile<T>(acc, kInterleaveRows, out, out_stride);
}

// The InterleavedTileFn contract for format F (interleaved_driver.h with this file's GroupTiles).
template <typename F>
void InterleavedTile(int64_t n, const void* w, int n_rows, const void* a, size_t a_stride,
                     int n_tokens, float* out, size_t out_stride) {
  interleaved::InterleavedTile<F>(n, w, n_rows, a, a_stride, n_tokens, out, out_stride,
                                  GroupTiles<F>);
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

void InterleavedTileQ5_1Q8_1Avx512(int64_t n, const void* w, int n_rows, const void* a,
                                   size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  InterleavedTile<Q5_1Format>(n, w, n_rows, a, a_stride, n_tokens, out, out_stride);
}

void InterleavedTileQ8_0Q8_0Avx512(int64_t n, const void* w, int n_rows, const void* a,
                                   size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  InterleavedTile<Q8_0Format>(n, w, n_rows, a, a_stride, n_tokens, out, out_stride);
}

void PackQ8_0x16Avx512(const void* w, size_t w_stride, int n_rows, int64_t nb, BlockQ8_0x16* out) {
  if (n_rows < kInterleaveRows) return PackQ8_0x16(w, w_stride, n_rows, nb, out);
  PackQ8_0x16Rows(static_cast<const uint8_t*>(w), w_stride, 0, nb, out);
}

// Up to kTileTokens tokens: each full group of 16 rows straight from the rows (Q8_0RowsTile).
// More: each group kChunkBlocks blocks at a time packed into per-thread scratch (slot 2, 34 KiB),
// every token tile run over the chunk, the chains carried from chunk to chunk in out. A last
// partial group is packed by PackQ8_0x16 (zero rows past the matrix). At 256 tokens a call
// (MatMul's block for this kernel) 64-block chunks ran within 2-6% of the interleaved kernel on
// its copy (2048- and 8192-wide rows); 16- and 32-block chunks 5-15% slower.
void InPlaceTileQ8_0Q8_0Avx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                               size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  constexpr int64_t kChunkBlocks = 64;
  if (n_rows <= 0 || n_tokens <= 0) return;
  const int64_t nb = n / kQK;
  const auto* ap = static_cast<const uint8_t*>(a);
  float* d;
  Q8_0Format::Aux* aux;
  interleaved::ActivationScales<Q8_0Format>(nb, ap, a_stride, n_tokens, &d, &aux);
  const auto* rows = static_cast<const uint8_t*>(w);
  BlockQ8_0x16* chunk = nullptr;
  for (int r = 0; r < n_rows; r += kInterleaveRows) {
    const uint8_t* group = rows + r * w_stride;
    const int group_rows = n_rows - r;
    if (n_tokens <= kTileTokens && group_rows >= kInterleaveRows) {
      const Q8_0Rows source(group, w_stride);
      ForEachTile<kTileTokens>(n_tokens, [&]<int T>(int t) {
        Q8_0RowsTile<T>(source, nb, ap + t * a_stride, a_stride, d + t * nb, aux + t * nb,
                        out + t * out_stride + r, out_stride);
      });
      continue;
    }
    if (chunk == nullptr) {
      chunk = static_cast<BlockQ8_0x16*>(
          kernels::ThreadScratch(2, kChunkBlocks * sizeof(BlockQ8_0x16)));
    }
    for (int64_t b0 = 0; b0 < nb; b0 += kChunkBlocks) {
      const int64_t b1 = b0 + kChunkBlocks < nb ? b0 + kChunkBlocks : nb;
      if (group_rows >= kInterleaveRows) {
        PackQ8_0x16Rows(group, w_stride, b0, b1, chunk);
      } else {
        PackQ8_0x16(group + b0 * sizeof(BlockQ8_0), w_stride, group_rows, b1 - b0, chunk);
      }
      ForEachTile<kTileTokens>(n_tokens, [&]<int T>(int t) {
        Q8_0ChunkTile<T>(chunk, b0, b1, nb, ap + t * a_stride, a_stride, d + t * nb, aux + t * nb,
                         group_rows, out + t * out_stride + r, out_stride);
      });
    }
  }
}

namespace {

// Q4_0 / Q4_1 / Q5_0 / Q5_1 rows (S) in place for format F: up to kTileTokens tokens, each group's
// lines made in registers (NibbleRows, F's tile as on the copy); more, each group decoded once
// (DecodeGroup) and every token tile run over it. A last partial group is first copied to scratch
// (slot 3) with zero rows after it, the rows InterleaveFn adds.
template <typename S, typename F>
void RowsTile(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a, size_t a_stride,
              int n_tokens, float* out, size_t out_stride) {
  if (n_rows <= 0 || n_tokens <= 0) return;
  const int64_t nb = n / kQK;
  const auto* ap = static_cast<const uint8_t*>(a);
  float* d;
  typename F::Aux* aux;
  interleaved::ActivationScales<F>(nb, ap, a_stride, n_tokens, &d, &aux);
  for (int r = 0; r < n_rows; r += kInterleaveRows) {
    const uint8_t* group = static_cast<const uint8_t*>(w) + r * w_stride;
    const int group_rows = n_rows - r < kInterleaveRows ? n_rows - r : kInterleaveRows;
    if (group_rows < kInterleaveRows) {
      auto* padded = static_cast<uint8_t*>(kernels::ThreadScratch(3, kInterleaveRows * w_stride));
      std::memcpy(padded, group, group_rows * w_stride);
      std::memset(padded + group_rows * w_stride, 0, (kInterleaveRows - group_rows) * w_stride);
      group = padded;
    }
    const NibbleRows<S> rows(group, w_stride);
    if (n_tokens <= kTileTokens) {
      SourceTiles<F>(rows, nb, group_rows, ap, a_stride, n_tokens, d, aux, out + r, out_stride,
                     false);
    } else {
      SourceTiles<F>(DecodedBlocks{DecodeGroup(rows, nb)}, nb, group_rows, ap, a_stride, n_tokens,
                     d, aux, out + r, out_stride, false);
    }
  }
}

}  // namespace

void InPlaceTileQ4_0Q8_0Avx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                               size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  RowsTile<BlockQ4_0, Q4_0Format>(n, w, w_stride, n_rows, a, a_stride, n_tokens, out, out_stride);
}

void InPlaceTileQ4_1Q8_1Avx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                               size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  RowsTile<BlockQ4_1, Q4_1Format>(n, w, w_stride, n_rows, a, a_stride, n_tokens, out, out_stride);
}

void InPlaceTileQ5_0Q8_0Avx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                               size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  RowsTile<BlockQ5_0, Q5_0Format>(n, w, w_stride, n_rows, a, a_stride, n_tokens, out, out_stride);
}

void InPlaceTileQ5_1Q8_1Avx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                               size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  RowsTile<BlockQ5_1, Q5_1Format>(n, w, w_stride, n_rows, a, a_stride, n_tokens, out, out_stride);
}

}  // namespace kiln::quant
