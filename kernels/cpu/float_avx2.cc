// AVX2 + FMA + F16C kernels of the float types (F32, F16, BF16; activations F32). Compiled with
// -ffp-contract=off (kernels/cpu/CMakeLists.txt); every FMA is explicit.
//
// Dot order: the one of every level (legacy.h, "Float types"): 64 lanes, lane i % 64 for element
// i. Here the 16-lane accumulator acc[k] of that order is two registers, lanes 0..7 and 8..15, so
// a chunk of 64 elements takes 8 FMAs into 8 independent chains. A last partial chunk is padded
// with zeros (w = a = 0 leaves an accumulator unchanged).
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/legacy.h"

namespace kiln::quant {
namespace {

constexpr int kChunk = 64;

// acc[2 k + h]: lanes 8 h .. 8 h + 7 of the order's accumulator k. v = (acc0 + acc1) + (acc2 +
// acc3) on both halves, then 16 -> 8 (v[0..7] + v[8..15]) -> 4 -> 2 -> 1.
inline float Reduce(const __m256 acc[8]) {
  const __m256 lo = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[4], acc[6]));
  const __m256 hi = _mm256_add_ps(_mm256_add_ps(acc[1], acc[3]), _mm256_add_ps(acc[5], acc[7]));
  const __m256 v8 = _mm256_add_ps(lo, hi);
  const __m128 v4 = _mm_add_ps(_mm256_castps256_ps128(v8), _mm256_extractf128_ps(v8, 1));
  const __m128 v2 = _mm_add_ps(v4, _mm_movehl_ps(v4, v4));
  return _mm_cvtss_f32(_mm_add_ss(v2, _mm_movehdup_ps(v2)));
}

// Weight loaders: 8 weights starting at element i of the row, widened to f32.
struct LoadF32 {
  static constexpr int kBytes = 4;
  static __m256 Load(const uint8_t* w) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(w));
  }
};
struct LoadF16 {
  static constexpr int kBytes = 2;
  static __m256 Load(const uint8_t* w) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
  }
};
struct LoadBf16 {
  static constexpr int kBytes = 2;
  static __m256 Load(const uint8_t* w) {
    const __m256i wide =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
};

template <typename Loader>
inline void AccumulateChunk(const uint8_t* w, const float* a, __m256 acc[8]) {
  for (int k = 0; k < 8; ++k) {
    acc[k] = _mm256_fmadd_ps(Loader::Load(w + 8 * k * Loader::kBytes), _mm256_loadu_ps(a + 8 * k),
                             acc[k]);
  }
}

template <typename Loader>
inline float Dot(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const uint8_t*>(vw);
  const auto* a = static_cast<const float*>(va);
  __m256 acc[8];
  for (__m256& v : acc) v = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + kChunk <= n; i += kChunk) AccumulateChunk<Loader>(w + i * Loader::kBytes, a + i, acc);
  if (i < n) {
    alignas(32) uint8_t wpad[kChunk * 4] = {};
    alignas(32) float apad[kChunk] = {};
    const int64_t rest = n - i;
    std::memcpy(wpad, w + i * Loader::kBytes, static_cast<size_t>(rest) * Loader::kBytes);
    std::memcpy(apad, a + i, static_cast<size_t>(rest) * sizeof(float));
    AccumulateChunk<Loader>(wpad, apad, acc);
  }
  return Reduce(acc);
}

// A register tile of kR weight rows x kT tokens, n % 64 == 0: every (row, token) pair runs Dot's
// eight accumulator chains, one eighth of the chunk lanes at a time (eighth j: elements
// 64 c + 8 j .. + 7 of every chunk c, Dot's acc[j]), so each load serves kT or kR FMAs and the
// kR x kT chains of an eighth run side by side (2 x 4 chains, 2 weight registers and one
// activation register fit AVX2's 16); the eighths then reduce as Dot's do.
//   w: kR rows, w_stride bytes apart   a: kT rows of n floats, a_stride bytes apart
template <typename Loader, int kR, int kT>
inline void MicroTile(int64_t n, const uint8_t* w, size_t w_stride, const uint8_t* a,
                      size_t a_stride, float* out, size_t out_stride) {
  __m256 eighths[kR][kT][8];
  for (int j = 0; j < 8; ++j) {
    __m256 acc[kR][kT];
    for (int r = 0; r < kR; ++r) {
      for (int t = 0; t < kT; ++t) acc[r][t] = _mm256_setzero_ps();
    }
    for (int64_t e = 8 * j; e < n; e += kChunk) {
      __m256 wv[kR];
      for (int r = 0; r < kR; ++r) wv[r] = Loader::Load(w + r * w_stride + e * Loader::kBytes);
      for (int t = 0; t < kT; ++t) {
        const __m256 av = _mm256_loadu_ps(reinterpret_cast<const float*>(a + t * a_stride) + e);
        for (int r = 0; r < kR; ++r) acc[r][t] = _mm256_fmadd_ps(wv[r], av, acc[r][t]);
      }
    }
    for (int r = 0; r < kR; ++r) {
      for (int t = 0; t < kT; ++t) eighths[r][t][j] = acc[r][t];
    }
  }
  for (int r = 0; r < kR; ++r) {
    for (int t = 0; t < kT; ++t) out[t * out_stride + r] = Reduce(eighths[r][t]);
  }
}

// VecDotTileFn of the float types: out[t * out_stride + r] = Dot(n, w row r, a row t), bit for
// bit. Blocks of 8 weight rows (they stay in L1 while every token block passes), 2 x 4
// register tiles inside, smaller tiles at the edges. A row length that is not a whole number of
// chunks takes Dot per pair.
template <typename Loader>
void Tile(int64_t n, const void* vw, size_t w_stride, int n_rows, const void* va, size_t a_stride,
          int n_tokens, float* out, size_t out_stride) {
  const auto* w = static_cast<const uint8_t*>(vw);
  const auto* a = static_cast<const uint8_t*>(va);
  if (n % kChunk != 0) {
    for (int t = 0; t < n_tokens; ++t) {
      for (int r = 0; r < n_rows; ++r) {
        out[t * out_stride + r] = Dot<Loader>(n, w + r * w_stride, a + t * a_stride);
      }
    }
    return;
  }
  constexpr int kRowBlock = 8, kR = 2, kT = 4;
  for (int rb = 0; rb < n_rows; rb += kRowBlock) {
    const int re = std::min(n_rows, rb + kRowBlock);
    for (int t = 0; t < n_tokens; t += kT) {
      const int nt = std::min(kT, n_tokens - t);
      const uint8_t* at = a + t * a_stride;
      for (int r = rb; r < re; r += kR) {
        const int nr = std::min(kR, re - r);
        const uint8_t* wr = w + r * w_stride;
        float* o = out + t * out_stride + r;
        if (nr == kR && nt == kT) {
          MicroTile<Loader, kR, kT>(n, wr, w_stride, at, a_stride, o, out_stride);
        } else if (nr == kR) {
          for (int j = 0; j < nt; ++j) {
            MicroTile<Loader, kR, 1>(n, wr, w_stride, at + j * a_stride, a_stride,
                                     o + j * out_stride, out_stride);
          }
        } else if (nt == kT) {
          MicroTile<Loader, 1, kT>(n, wr, w_stride, at, a_stride, o, out_stride);
        } else {
          for (int j = 0; j < nt; ++j) {
            MicroTile<Loader, 1, 1>(n, wr, w_stride, at + j * a_stride, a_stride,
                                    o + j * out_stride, out_stride);
          }
        }
      }
    }
  }
}

// bf16 round-to-nearest-even of 8 lanes, NaN kept quiet (same as Fp32ToBf16).
inline __m256i Bf16Round(__m256 v) {
  const __m256i x = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF)), odd), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
  const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7FFFFFFF)),
                                            _mm256_set1_epi32(0x7F800000));
  return _mm256_blendv_epi8(rounded, quiet, is_nan);
}

inline uint16_t Bf16RoundOne(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7FFFFFFF) > 0x7F800000) return static_cast<uint16_t>((x >> 16) | 0x40);
  return static_cast<uint16_t>((x + 0x7FFF + ((x >> 16) & 1)) >> 16);
}

}  // namespace

void QuantizeRowF16Avx2(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<uint8_t*>(vy);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + 2 * i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) {
    const uint16_t h = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT);
    std::memcpy(y + 2 * i, &h, 2);
  }
}

void DequantizeRowF16Avx2(const void* vx, float* y, int64_t n) {
  const auto* x = static_cast<const uint8_t*>(vx);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, LoadF16::Load(x + 2 * i));
  for (; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, x + 2 * i, 2);
    y[i] = _cvtsh_ss(h);
  }
}

void QuantizeRowBf16Avx2(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<uint8_t*>(vy);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i lo = Bf16Round(_mm256_loadu_ps(x + i));
    const __m256i hi = Bf16Round(_mm256_loadu_ps(x + i + 8));
    // packus interleaves 128-bit lanes: [lo0-3, hi0-3, lo4-7, hi4-7] -> restore order.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + 2 * i), packed);
  }
  for (; i < n; ++i) {
    const uint16_t b = Bf16RoundOne(x[i]);
    std::memcpy(y + 2 * i, &b, 2);
  }
}

void DequantizeRowBf16Avx2(const void* vx, float* y, int64_t n) {
  const auto* x = static_cast<const uint8_t*>(vx);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, LoadBf16::Load(x + 2 * i));
  for (; i < n; ++i) {
    uint16_t b;
    std::memcpy(&b, x + 2 * i, 2);
    const uint32_t bits = static_cast<uint32_t>(b) << 16;
    std::memcpy(y + i, &bits, 4);
  }
}

float VecDotF32F32Avx2(int64_t n, const void* w, const void* a) { return Dot<LoadF32>(n, w, a); }
float VecDotF16F32Avx2(int64_t n, const void* w, const void* a) { return Dot<LoadF16>(n, w, a); }
float VecDotBf16F32Avx2(int64_t n, const void* w, const void* a) { return Dot<LoadBf16>(n, w, a); }

void VecDotTileF32F32Avx2(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                          size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  Tile<LoadF32>(n, w, w_stride, n_rows, a, a_stride, n_tokens, out, out_stride);
}
void VecDotTileF16F32Avx2(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                          size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  Tile<LoadF16>(n, w, w_stride, n_rows, a, a_stride, n_tokens, out, out_stride);
}
void VecDotTileBf16F32Avx2(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                           size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  Tile<LoadBf16>(n, w, w_stride, n_rows, a, a_stride, n_tokens, out, out_stride);
}

}  // namespace kiln::quant
