// Integer-order matmul kernels on row-interleaved weights (interleaved.h) with AVX2 + FMA + F16C:
// Q4_1 x Q8_1, Q4_0 x Q8_0, Q5_0 x Q8_0, Q5_1 x Q8_1 and Q8_0 x Q8_0, bit for bit the scalar
// kernels (interleaved_scalar.cc) and the AVX-512 ones. Compiled with -ffp-contract=off: every FMA
// is explicit.
//
// A 64-byte line of an x16 block holds 4 elements of 16 rows; its two 32-byte halves are the
// rows 0..7 and 8..15 of the group ("octets"), one int32 lane per row. A register tile is one
// octet x up to kTileTokens tokens. AVX2 has no vpdpbusd, so a block's integer sums P come from
// vpmaddubsw (unsigned x signed bytes -> int16 pairs) and vpmaddwd (pairs -> int32), both exact
// on the operands they get here:
//   Q4_1: nibbles (0..15) x activations (|qa| <= 128): each int16 pair sum is at most
//     2 * 15 * 128 = 3840 in magnitude, so the 8 products of a block (8 x 4 elements per row)
//     are summed in int16 (<= 30720) before one vpmaddwd.
//   Q4_0 / Q5_0: nibbles (Q5_0: plus bit 4 from the row's qh, spread by vpshufb, a test and a
//     compare) x activations in [-127, 127]: pair sums up to 2 * 31 * 127 = 7874, so int16 sums
//     of two lines (<= 31496) are widened by vpmaddwd twice a block; then
//     P = Σ q * qa - offset * Σ qa (offset 8 / 16), the second term exact and per (token, block).
//   Q5_1: Q5_0's codes x Q8_1 activations (|qa| <= 128: int16 sums of two lines <= 31744), as
//     Q4_1 otherwise.
//   Q8_0: the packer stores qw + 128; vpmaddubsw(|qw|, sign(qa, qw)) gives each pair sum
//     qw * qa + qw' * qa' with at most 2 * 128 * 127 = 32512 in magnitude (activations in
//     [-127, 127], what MatMul's quantizer produces), widened by vpmaddwd right away.
// The float step per (row, token, block) is the reference's: s = dw * da (vmulps),
// acc = fma(s, float(P), acc), and for Q4_1 / Q5_1 mins = fma(mw, sa, mins), result acc + mins; the
// mins chains run in a second pass over the blocks (same operations per chain, fewer registers
// live in the first).
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

constexpr int kOctet = 8;       // rows per register (int32 lanes of a ymm)
constexpr int kTileTokens = 4;  // tokens per register tile

inline __m256i Broadcast(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return _mm256_set1_epi32(v);
}

// The 8 f16 values h[0..7] -> floats.
inline __m256 HalvesToFloats(const uint8_t (*h)[2]) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
}

// Weights stream from memory once per call (kernels/cpu/prefetch.h).
template <typename Block>
inline void PrefetchAhead(const Block* w, int64_t b) {
  PrefetchStreamAhead(w + b, sizeof(Block));
}

// Stores lanes r < n_rows of v to out[r].
inline void StoreRows(float* out, __m256 v, int n_rows) {
  if (n_rows >= kOctet) {
    _mm256_storeu_ps(out, v);
    return;
  }
  const __m256i mask =
      _mm256_cmpgt_epi32(_mm256_set1_epi32(n_rows), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  _mm256_maskstore_ps(out, mask, v);
}

// Line i of an octet's nibbles (its 32 bytes at `line`): lo = elements 4i..4i+3, hi = elements
// 16+4i..16+4i+3 of the 8 rows.
inline void LineNibbles(const uint8_t* line, __m256i* lo, __m256i* hi) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(line));
  *lo = _mm256_and_si256(packed, low);
  *hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
}

// The products of line i's elements (lo, hi as LineNibbles gives them, 0..31) with the activation
// block's qs, as int16 sums of four (at most 4 * 31 * 128 = 15872 in magnitude).
inline __m256i LineSums16(__m256i lo, __m256i hi, const int8_t* qa, int i) {
  return _mm256_add_epi16(_mm256_maddubs_epi16(lo, Broadcast(qa + 4 * i)),
                          _mm256_maddubs_epi16(hi, Broadcast(qa + 16 + 4 * i)));
}

// Byte k of each row's dword copied to the row's 4 bytes (vpshufb works in 128-bit lanes).
inline __m256i SpreadByte(int k) {
  const __m128i lane = _mm_setr_epi32(k * 0x01010101, (4 + k) * 0x01010101, (8 + k) * 0x01010101,
                                      (12 + k) * 0x01010101);
  return _mm256_set_m128i(lane, lane);
}

// Bit 4 of the 5-bit formats' elements (Q5_0, Q5_1), from an octet's qh dwords.
struct HighBits {
  __m256i spread[4] = {SpreadByte(0), SpreadByte(1), SpreadByte(2), SpreadByte(3)};
  // Byte j of a row's lanes tests bit j (even lines) or 4 + j (odd lines) of the spread byte.
  __m256i test[2] = {_mm256_set1_epi32(0x08040201),
                     _mm256_set1_epi32(static_cast<int>(0x80402010u))};

  // bytes[k]: byte k of each row's qh over the row's 4 bytes.
  __attribute__((always_inline)) void Spread(const uint8_t (*qh_rows)[4], __m256i bytes[4]) const {
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh_rows));
    Unroll<4>([&](auto k) { bytes[k] = _mm256_shuffle_epi8(qh, spread[k]); });
  }
  // Line i's nibbles (LineNibbles) plus 16 where the element's bit 4 is set.
  __attribute__((always_inline)) void Add(const __m256i bytes[4], int i, __m256i* lo,
                                          __m256i* hi) const {
    *lo = _mm256_or_si256(*lo, Bit4(bytes[i / 2], test[i % 2]));
    *hi = _mm256_or_si256(*hi, Bit4(bytes[2 + i / 2], test[i % 2]));
  }

 private:
  // 0x10 in the bytes whose bit in `test` is set in `bytes`, else 0.
  static __m256i Bit4(__m256i bytes, __m256i test) {
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, test), test);
    return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
  }
};

// sum[t] = Σ q * qa over block b's 32 elements of an octet (its lines' nibbles, plus bit 4 from
// the rows' qh when kFiveBit) and token t's activation block (exact int32). The int16 pair sums
// (vpmaddubsw) of kLinesPerWiden lines are added before one vpmaddwd widens them: all 4 lines for
// Q4_1 (8 pair sums of at most 2 * 15 * 128: 30720), 2 for the 5-bit codes and Q4_0 (4 of at
// most 2 * 31 * 128: 31744).
template <int T, int kLinesPerWiden, bool kFiveBit, typename ActBlock, typename Block>
__attribute__((always_inline)) inline void OctetBlockSums(const Block& blk, int half, int64_t b,
                                                          const uint8_t* a, size_t a_stride,
                                                          const HighBits& high, __m256i sum[T]) {
  const __m256i ones = _mm256_set1_epi16(1);
  [[maybe_unused]] __m256i high_bytes[4];
  if constexpr (kFiveBit) high.Spread(blk.qh + kOctet * half, high_bytes);
  __m256i sum16[T];
  Unroll<T>([&](auto t) { sum[t] = _mm256_setzero_si256(); });
  Unroll<4>([&](auto i) {
    __m256i lo, hi;
    LineNibbles(blk.qs[i] + 32 * half, &lo, &hi);
    if constexpr (kFiveBit) high.Add(high_bytes, i, &lo, &hi);
    Unroll<T>([&](auto t) {
      const int8_t* qa = reinterpret_cast<const ActBlock*>(a + t * a_stride)[b].qs;
      const __m256i pair = LineSums16(lo, hi, qa, i);
      constexpr int kLine = decltype(i)::value % kLinesPerWiden;
      sum16[t] = kLine == 0 ? pair : _mm256_add_epi16(sum16[t], pair);
      if constexpr (kLine == kLinesPerWiden - 1) {
        sum[t] = _mm256_add_epi32(sum[t], _mm256_madd_epi16(sum16[t], ones));
      }
    });
  });
}

// Q4_1 and Q5_1 (kFiveBit) weights x Q8_1 activations: P = Σ q * qa, and the mins.
template <typename B, bool kFiveBit>
struct MinFormat {
  using Block = B;
  using ActBlock = BlockQ8_1;
  using Aux = float;  // sa: f32 of the activation block's s (d * Σ qa)
  static void Scales(const ActBlock& a, float* d, Aux* aux) {
    *d = interleaved::HalfToFloat(a.d);
    *aux = interleaved::HalfToFloat(a.s);
  }
  // Octet `half` of one group x T tokens; a: the T tokens' rows; d, aux: their scales (stride
  // nb). flatten: keep the Unroll lambdas inline (as in the AVX-512 kernels).
  template <int T>
  __attribute__((flatten)) static void Tile(const Block* w, int64_t nb, int half, const uint8_t* a,
                                            size_t a_stride, const float* d, const Aux* aux,
                                            int n_rows, float* out, size_t out_stride) {
    __m256 acc[T];
    Unroll<T>([&](auto t) { acc[t] = _mm256_setzero_ps(); });
    const HighBits high;
    for (int64_t b = 0; b < nb; ++b) {
      PrefetchAhead(w, b);
      __m256i p[T];
      OctetBlockSums<T, kFiveBit ? 2 : 4, kFiveBit, ActBlock>(w[b], half, b, a, a_stride, high, p);
      const __m256 dw = HalvesToFloats(w[b].d + kOctet * half);
      Unroll<T>([&](auto t) {
        const __m256 s = _mm256_mul_ps(dw, _mm256_set1_ps(d[t * nb + b]));
        acc[t] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(p[t]), acc[t]);
      });
    }
    __m256 mins[T];
    Unroll<T>([&](auto t) { mins[t] = _mm256_setzero_ps(); });
    for (int64_t b = 0; b < nb; ++b) {
      const __m256 mw = HalvesToFloats(w[b].m + kOctet * half);
      Unroll<T>(
          [&](auto t) { mins[t] = _mm256_fmadd_ps(mw, _mm256_set1_ps(aux[t * nb + b]), mins[t]); });
    }
    Unroll<T>(
        [&](auto t) { StoreRows(out + t * out_stride, _mm256_add_ps(acc[t], mins[t]), n_rows); });
  }
};
using Q4_1Format = MinFormat<BlockQ4_1x16, false>;
using Q5_1Format = MinFormat<BlockQ5_1x16, true>;

// Q4_0 (kOffset 8) and Q5_0 (kOffset 16, bit 4 of each element from the row's qh) weights x Q8_0
// activations: P = Σ q * qa - kOffset * Σ qa, no mins.
template <typename B, int kOffset>
struct OffsetFormat {
  static constexpr bool kFiveBit = kOffset == 16;
  using Block = B;
  using ActBlock = BlockQ8_0;
  using Aux = int32_t;  // -kOffset * Σ qa: the correction for the weights' offset
  static void Scales(const ActBlock& a, float* d, Aux* aux) {
    *d = interleaved::HalfToFloat(a.d);
    *aux = -kOffset * interleaved::SumQsSad(a);
  }
  template <int T>
  __attribute__((flatten)) static void Tile(const Block* w, int64_t nb, int half, const uint8_t* a,
                                            size_t a_stride, const float* d, const Aux* aux,
                                            int n_rows, float* out, size_t out_stride) {
    __m256 acc[T];
    Unroll<T>([&](auto t) { acc[t] = _mm256_setzero_ps(); });
    const HighBits high;
    for (int64_t b = 0; b < nb; ++b) {
      PrefetchAhead(w, b);
      __m256i sum[T];
      OctetBlockSums<T, 2, kFiveBit, ActBlock>(w[b], half, b, a, a_stride, high, sum);
      const __m256 dw = HalvesToFloats(w[b].d + kOctet * half);
      Unroll<T>([&](auto t) {
        const __m256i p = _mm256_add_epi32(sum[t], _mm256_set1_epi32(aux[t * nb + b]));
        const __m256 s = _mm256_mul_ps(dw, _mm256_set1_ps(d[t * nb + b]));
        acc[t] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(p), acc[t]);
      });
    }
    Unroll<T>([&](auto t) { StoreRows(out + t * out_stride, acc[t], n_rows); });
  }
};
using Q4_0Format = OffsetFormat<BlockQ4_0x16, 8>;
using Q5_0Format = OffsetFormat<BlockQ5_0x16, 16>;

// One block of an octet x T tokens of Q8_0: qw the 8 lines' signed weights (4 elements of the 8
// rows each), dw their scales; P = Σ qw * qa by vpmaddubsw(|qw|, sign(qa, qw)) (pair sums at most
// 2 * 128 * 127) and vpmaddwd, then acc = fma(dw * da, float(P), acc).
template <int T>
inline void AccumulateQ8_0Block(const __m256i qw[8], __m256 dw, int64_t b, int64_t nb,
                                const uint8_t* a, size_t a_stride, const float* d, __m256 acc[T]) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i sum[T];
  Unroll<T>([&](auto t) { sum[t] = _mm256_setzero_si256(); });
  Unroll<8>([&](auto i) {
    const __m256i abs_qw = _mm256_sign_epi8(qw[i], qw[i]);  // -128 stays 0x80: 128 unsigned
    Unroll<T>([&](auto t) {
      const int8_t* qa = reinterpret_cast<const BlockQ8_0*>(a + t * a_stride)[b].qs;
      const __m256i signed_qa = _mm256_sign_epi8(Broadcast(qa + 4 * i), qw[i]);
      sum[t] = _mm256_add_epi32(sum[t],
                                _mm256_madd_epi16(_mm256_maddubs_epi16(abs_qw, signed_qa), ones));
    });
  });
  Unroll<T>([&](auto t) {
    const __m256 s = _mm256_mul_ps(dw, _mm256_set1_ps(d[t * nb + b]));
    acc[t] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(sum[t]), acc[t]);
  });
}

struct Q8_0Format {
  using Block = BlockQ8_0x16;
  using ActBlock = BlockQ8_0;
  using Aux = float;  // unused
  static void Scales(const ActBlock& a, float* d, Aux* aux) {
    *d = interleaved::HalfToFloat(a.d);
    *aux = 0.0f;
  }
  template <int T>
  __attribute__((flatten)) static void Tile(const Block* w, int64_t nb, int half, const uint8_t* a,
                                            size_t a_stride, const float* d, const Aux*, int n_rows,
                                            float* out, size_t out_stride) {
    __m256 acc[T];
    Unroll<T>([&](auto t) { acc[t] = _mm256_setzero_ps(); });
    const __m256i offset = _mm256_set1_epi8(static_cast<char>(0x80));
    for (int64_t b = 0; b < nb; ++b) {
      PrefetchAhead(w, b);
      __m256i qw[8];
      Unroll<8>([&](auto i) {
        qw[i] = _mm256_xor_si256(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].qs[i] + 32 * half)), offset);
      });
      AccumulateQ8_0Block<T>(qw, HalvesToFloats(w[b].d + kOctet * half), b, nb, a, a_stride, d,
                             acc);
    }
    Unroll<T>([&](auto t) { StoreRows(out + t * out_stride, acc[t], n_rows); });
  }
};

// One group of 16 rows (n_rows of them real): each octet x every token, in register tiles of up
// to kTileTokens tokens.
template <typename F>
void GroupTiles(const typename F::Block* g, int64_t nb, int n_rows, const uint8_t* a,
                size_t a_stride, int n_tokens, const float* d, const typename F::Aux* aux,
                float* out, size_t out_stride) {
  for (int half = 0; half < 2; ++half) {
    const int r0 = kOctet * half;
    if (r0 >= n_rows) break;
    const int rows = n_rows - r0 < kOctet ? n_rows - r0 : kOctet;
    ForEachTile<kTileTokens>(n_tokens, [&]<int T>(int t) {
      F::template Tile<T>(g, nb, half, a + t * a_stride, a_stride, d + t * nb, aux + t * nb, rows,
                          out + t * out_stride + r0, out_stride);
    });
  }
}

// 16 Q8_0 rows (w_stride bytes apart) read in place. Per block and octet, the 8 rows' 32 qs bytes
// as 8 dword vectors, transposed (unpacks and a 128-bit lane permute) into the octet's 8 lines
// (line i: elements 4i..4i+3 of the 8 rows). Prefetched as the AVX-512 Q8_0Rows explains: the
// group's 16 rows are one contiguous stream, read 16 places at once; each block prefetches as
// many bytes of the group at least one group and 2 * kStreamPrefetchBytes on as it reads (half
// of them in each octet's pass).
struct Q8_0Rows {
  const uint8_t* w;
  size_t w_stride;
  const char* ahead;
  Q8_0Rows(const uint8_t* rows, size_t stride)
      : w(rows),
        w_stride(stride),
        ahead(reinterpret_cast<const char*>(rows) +
              (1 + 2 * kStreamPrefetchBytes / (kInterleaveRows * stride)) * kInterleaveRows *
                  stride) {}

  // The signed lines of block b, octet `half`; nb: the row's blocks (where this pass prefetches).
  __attribute__((always_inline)) void Lines(int64_t b, int half, int64_t nb, __m256i q[8]) const {
    constexpr size_t kHalfBlock = kInterleaveRows * sizeof(BlockQ8_0) / 2;  // 272 bytes
    const char* p = ahead + (half * nb + b) * kHalfBlock;
    for (int line = 0; line < 5; ++line) _mm_prefetch(p + 64 * line, _MM_HINT_T1);
    const uint8_t* octet = w + kOctet * half * w_stride + b * sizeof(BlockQ8_0) + 2;
    __m256i z[8], t[8], u[8];
    Unroll<8>([&](auto r) {
      z[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(octet + r * w_stride));
    });
    Unroll<4>([&](auto k) {
      t[2 * k] = _mm256_unpacklo_epi32(z[2 * k], z[2 * k + 1]);
      t[2 * k + 1] = _mm256_unpackhi_epi32(z[2 * k], z[2 * k + 1]);
    });
    // u[i] (i < 4): dword i of rows 0-3 (low 128 bits) and dword i + 4 (high); u[4 + i]: the
    // same of rows 4-7.
    Unroll<2>([&](auto h) {
      u[4 * h + 0] = _mm256_unpacklo_epi64(t[4 * h + 0], t[4 * h + 2]);
      u[4 * h + 1] = _mm256_unpackhi_epi64(t[4 * h + 0], t[4 * h + 2]);
      u[4 * h + 2] = _mm256_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
      u[4 * h + 3] = _mm256_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
    });
    Unroll<4>([&](auto i) {
      q[i] = _mm256_permute2x128_si256(u[i], u[4 + i], 0x20);
      q[i + 4] = _mm256_permute2x128_si256(u[i], u[4 + i], 0x31);
    });
  }
  __attribute__((always_inline)) __m256 Scales(int64_t b, int half) const {
    uint16_t h[kOctet];
    const uint8_t* block = w + kOctet * half * w_stride + b * sizeof(BlockQ8_0);
    for (int r = 0; r < kOctet; ++r) std::memcpy(&h[r], block + r * w_stride, 2);
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
  }
};

// An octet of 16 Q8_0 rows x T tokens straight from the rows, for a few tokens (more share a
// packed copy).
template <int T>
__attribute__((flatten)) void Q8_0RowsTile(const Q8_0Rows& rows, int64_t nb, int half,
                                           const uint8_t* a, size_t a_stride, const float* d,
                                           float* out, size_t out_stride) {
  __m256 acc[T];
  Unroll<T>([&](auto t) { acc[t] = _mm256_setzero_ps(); });
  for (int64_t b = 0; b < nb; ++b) {
    __m256i q[8];
    rows.Lines(b, half, nb, q);
    AccumulateQ8_0Block<T>(q, rows.Scales(b, half), b, nb, a, a_stride, d, acc);
  }
  Unroll<T>([&](auto t) { _mm256_storeu_ps(out + t * out_stride, acc[t]); });
}

void PackQ8_0x16Rows(const uint8_t* w, size_t w_stride, int64_t nb, BlockQ8_0x16* out) {
  const Q8_0Rows rows(w, w_stride);
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int half = 0; half < 2; ++half) {
    for (int64_t b = 0; b < nb; ++b) {
      __m256i q[8];
      rows.Lines(b, half, nb, q);
      Unroll<8>([&](auto i) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[b].qs[i] + 32 * half),
                            _mm256_xor_si256(q[i], flip));
      });
      for (int r = 0; r < kOctet; ++r) {
        std::memcpy(out[b].d[kOctet * half + r],
                    w + (kOctet * half + r) * w_stride + b * sizeof(BlockQ8_0), 2);
      }
    }
  }
}

// The InterleavedTileFn contract for format F (interleaved_driver.h with this file's GroupTiles).
template <typename F>
void InterleavedTile(int64_t n, const void* w, int n_rows, const void* a, size_t a_stride,
                     int n_tokens, float* out, size_t out_stride) {
  interleaved::InterleavedTile<F>(n, w, n_rows, a, a_stride, n_tokens, out, out_stride,
                                  GroupTiles<F>);
}

}  // namespace

void InterleavedTileQ4_1Q8_1Avx2(int64_t n, const void* w, int n_rows, const void* a,
                                 size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  InterleavedTile<Q4_1Format>(n, w, n_rows, a, a_stride, n_tokens, out, out_stride);
}

void InterleavedTileQ4_0Q8_0Avx2(int64_t n, const void* w, int n_rows, const void* a,
                                 size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  InterleavedTile<Q4_0Format>(n, w, n_rows, a, a_stride, n_tokens, out, out_stride);
}

void InterleavedTileQ5_0Q8_0Avx2(int64_t n, const void* w, int n_rows, const void* a,
                                 size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  InterleavedTile<Q5_0Format>(n, w, n_rows, a, a_stride, n_tokens, out, out_stride);
}

void InterleavedTileQ5_1Q8_1Avx2(int64_t n, const void* w, int n_rows, const void* a,
                                 size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  InterleavedTile<Q5_1Format>(n, w, n_rows, a, a_stride, n_tokens, out, out_stride);
}

void InterleavedTileQ8_0Q8_0Avx2(int64_t n, const void* w, int n_rows, const void* a,
                                 size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  InterleavedTile<Q8_0Format>(n, w, n_rows, a, a_stride, n_tokens, out, out_stride);
}

void PackQ8_0x16Avx2(const void* w, size_t w_stride, int n_rows, int64_t nb, BlockQ8_0x16* out) {
  if (n_rows < kInterleaveRows) return PackQ8_0x16(w, w_stride, n_rows, nb, out);
  PackQ8_0x16Rows(static_cast<const uint8_t*>(w), w_stride, nb, out);
}

// Up to kTileTokens tokens: each full group of 16 rows straight from the rows (Q8_0RowsTile);
// more: each group packed into per-thread scratch (slot 2) once for all of them, then the
// interleaved kernel. A last partial group is packed (zero rows past the matrix).
void InPlaceTileQ8_0Q8_0Avx2(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                             size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  if (n_rows <= 0 || n_tokens <= 0) return;
  const int64_t nb = n / kQK;
  const auto* ap = static_cast<const uint8_t*>(a);
  float* d;
  Q8_0Format::Aux* aux;
  interleaved::ActivationScales<Q8_0Format>(nb, ap, a_stride, n_tokens, &d, &aux);
  const auto* rows = static_cast<const uint8_t*>(w);
  BlockQ8_0x16* packed = nullptr;
  for (int r = 0; r < n_rows; r += kInterleaveRows) {
    const uint8_t* group = rows + r * w_stride;
    if (n_tokens <= kTileTokens && n_rows - r >= kInterleaveRows) {
      const Q8_0Rows source(group, w_stride);
      for (int half = 0; half < 2; ++half) {
        ForEachTile<kTileTokens>(n_tokens, [&]<int T>(int t) {
          Q8_0RowsTile<T>(source, nb, half, ap + t * a_stride, a_stride, d + t * nb,
                          out + t * out_stride + r + kOctet * half, out_stride);
        });
      }
      continue;
    }
    if (packed == nullptr) {
      packed = static_cast<BlockQ8_0x16*>(kernels::ThreadScratch(2, nb * sizeof(BlockQ8_0x16)));
    }
    PackQ8_0x16Avx2(group, w_stride, n_rows - r, nb, packed);
    GroupTiles<Q8_0Format>(packed, nb, n_rows - r, ap, a_stride, n_tokens, d, aux, out + r,
                           out_stride);
  }
}

}  // namespace kiln::quant
