// AVX-512 (F/BW/VL) dot kernels of the float types (F32, F16, BF16 weights; F32 activations) and
// the rows x tokens tiles of all three. Compiled with -ffp-contract=off
// (kernels/cpu/CMakeLists.txt); every FMA is explicit.
//
// Dot order: the one of every level (legacy.h, "Float types"): elements in chunks of 64; element
// i of a chunk goes to accumulator acc[i / 16] lane i % 16 via acc = fma(w, a, acc). A last
// partial chunk is read with zero-filling masked loads. End: v = (acc0 + acc1) + (acc2 + acc3)
// (16 lanes); v8 = v[0..7] + v[8..15]; v4 = v8[0..3] + v8[4..7]; v2 = v4[0..1] + v4[2..3];
// r = v2[0] + v2[1].
// (BF16 weights are widened exactly; vdpbf16ps would need bf16 activations and buys no bandwidth.)
#include <immintrin.h>

// GCC 12's AVX-512 intrinsic headers initialize results from _mm512_undefined_*() and then trip
// -Wuninitialized when inlined (a known false positive); silence it for this file only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/legacy.h"
#include "kernels/cpu/prefetch.h"

namespace kiln::quant {
namespace {

constexpr int kChunk = 64;

inline float Reduce4(const __m512 acc[4]) {
  const __m512 v = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
  const __m256 v8 = _mm256_add_ps(_mm512_castps512_ps256(v),
                                  _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  const __m128 v4 = _mm_add_ps(_mm256_castps256_ps128(v8), _mm256_extractf128_ps(v8, 1));
  const __m128 v2 = _mm_add_ps(v4, _mm_movehl_ps(v4, v4));
  return _mm_cvtss_f32(_mm_add_ss(v2, _mm_movehdup_ps(v2)));
}

// 16 weights from element i, widened to f32: Load (full) and LoadMasked (only the lanes in
// `mask` are read; the others are 0).
struct LoadF32 {
  static constexpr int kBytes = 4;
  static __m512 Load(const uint8_t* w) { return _mm512_loadu_ps(w); }
  static __m512 LoadMasked(const uint8_t* w, __mmask16 mask) {
    return _mm512_maskz_loadu_ps(mask, w);
  }
};
struct LoadF16 {
  static constexpr int kBytes = 2;
  static __m512 Load(const uint8_t* w) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
  }
  static __m512 LoadMasked(const uint8_t* w, __mmask16 mask) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, w));
  }
};
struct LoadBf16 {
  static constexpr int kBytes = 2;
  static __m512 Widen(__m256i bits) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
  }
  static __m512 Load(const uint8_t* w) {
    return Widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
  }
  static __m512 LoadMasked(const uint8_t* w, __mmask16 mask) {
    return Widen(_mm256_maskz_loadu_epi16(mask, w));
  }
};

template <typename Loader>
inline float Dot(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const uint8_t*>(vw);
  const auto* a = static_cast<const float*>(va);
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                   _mm512_setzero_ps()};
  int64_t i = 0;
  for (; i + kChunk <= n; i += kChunk) {
    // One token reads each weight byte once, from memory (kernels/cpu/prefetch.h; llama-1b f16
    // decode, 1 thread: 9.8-10.0 -> 10.6-10.8 tok/s). The limit left: the f32 activations
    // (twice the bytes loaded per weight; kiln's exact order needs them) cost about 15% of the
    // stream against llama.cpp's f16-activation loop (24.6-25.4 vs 28.0-30.0 GB/s over
    // llama-1b-f16's matrices, 1 thread). The activations' address moves it 10-15% (MatMul
    // places one token's: lib/backend/cpu/ops.cc). Four rows a pass sharing each activation load,
    // with or without the loads folded into the FMAs, measured no faster in the engine.
    PrefetchStreamAhead(w + i * Loader::kBytes, kChunk * Loader::kBytes);
    for (int k = 0; k < 4; ++k) {
      const int64_t e = i + 16 * k;
      acc[k] =
          _mm512_fmadd_ps(Loader::Load(w + e * Loader::kBytes), _mm512_loadu_ps(a + e), acc[k]);
    }
  }
  for (int k = 0; i + 16 * k < n; ++k) {  // last partial chunk
    const int64_t e = i + 16 * k;
    const int64_t rest = n - e;
    const __mmask16 mask =
        rest >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << rest) - 1);
    acc[k] = _mm512_fmadd_ps(Loader::LoadMasked(w + e * Loader::kBytes, mask),
                             _mm512_maskz_loadu_ps(mask, a + e), acc[k]);
  }
  return Reduce4(acc);
}

// A register tile of kR weight rows x kT tokens, n % 64 == 0: every (row, token) pair runs Dot's
// four accumulator chains, one quarter of the chunk lanes at a time (quarter q: elements
// 64 c + 16 q .. + 15 of every chunk c, Dot's acc[q]), so each load serves kT or kR FMAs and the
// kR x kT chains of a quarter run side by side; the quarters then reduce as Dot's do.
//   w: kR rows, w_stride bytes apart   a: kT rows of n floats, a_stride bytes apart
template <typename Loader, int kR, int kT>
inline void MicroTile(int64_t n, const uint8_t* w, size_t w_stride, const uint8_t* a,
                      size_t a_stride, float* out, size_t out_stride) {
  __m512 quarters[kR][kT][4];
  for (int q = 0; q < 4; ++q) {
    __m512 acc[kR][kT];
    for (int r = 0; r < kR; ++r) {
      for (int t = 0; t < kT; ++t) acc[r][t] = _mm512_setzero_ps();
    }
    for (int64_t e = 16 * q; e < n; e += kChunk) {
      __m512 wv[kR];
      for (int r = 0; r < kR; ++r) wv[r] = Loader::Load(w + r * w_stride + e * Loader::kBytes);
      for (int t = 0; t < kT; ++t) {
        const __m512 av = _mm512_loadu_ps(reinterpret_cast<const float*>(a + t * a_stride) + e);
        for (int r = 0; r < kR; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], av, acc[r][t]);
      }
    }
    for (int r = 0; r < kR; ++r) {
      for (int t = 0; t < kT; ++t) quarters[r][t][q] = acc[r][t];
    }
  }
  if constexpr (kR == 4 && kT == 4) {
    // Reduce4 of all 16 pairs at once: the same adds of the same lanes, 16 sums per vector.
    __m512 v[16];  // v[4 t + r] = (q0 + q1) + (q2 + q3) of pair (r, t)
    for (int r = 0; r < 4; ++r) {
      for (int t = 0; t < 4; ++t) {
        const __m512* q = quarters[r][t];
        v[4 * t + r] = _mm512_add_ps(_mm512_add_ps(q[0], q[1]), _mm512_add_ps(q[2], q[3]));
      }
    }
    // 16 -> 8 lanes: p[m] = [v8 of v[2m] | v8 of v[2m + 1]], v8[l] = v[l] + v[l + 8].
    __m512 p[8];
    for (int m = 0; m < 8; ++m) {
      const __m512 a = v[2 * m], b = v[2 * m + 1];
      p[m] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                           _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
    }
    // 8 -> 4: s[k] 128-bit lane j = v4 of output 4 k + j, v4[l] = v8[l] + v8[l + 4].
    __m512 s4[4];
    for (int k = 0; k < 4; ++k) {
      const __m512 a = p[2 * k], b = p[2 * k + 1];
      s4[k] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
    }
    // 4 -> 2: u[h] lane j = [v2 of s4[2h] lane j | v2 of s4[2h + 1] lane j], v2[l] = v4[l] + v4[l +
    // 2].
    __m512 u[2];
    for (int h = 0; h < 2; ++h) {
      const __m512 a = s4[2 * h], b = s4[2 * h + 1];
      u[h] = _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                           _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
    }
    // 2 -> 1: element 4 j + e = v2[0] + v2[1] of output 4 e + j, i.e. of pair (r = j, t = e).
    const __m512 sums = _mm512_add_ps(_mm512_shuffle_ps(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                      _mm512_shuffle_ps(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
    alignas(64) float r16[16];
    _mm512_store_ps(r16, sums);
    for (int r = 0; r < 4; ++r) {
      for (int t = 0; t < 4; ++t) out[t * out_stride + r] = r16[4 * r + t];
    }
  } else {
    for (int r = 0; r < kR; ++r) {
      for (int t = 0; t < kT; ++t) out[t * out_stride + r] = Reduce4(quarters[r][t]);
    }
  }
}

// VecDotTileFn of the float types: out[t * out_stride + r] = Dot(n, w row r, a row t), bit for
// bit. Blocks of 8 weight rows (16 KiB of f32 at n = 512: they stay in L1 while every token
// block passes; 16 rows measured no faster), 4 x 4 register tiles inside (their 16 sums reduced
// together), smaller tiles at the edges. A row length that is not a whole number of chunks takes
// Dot per pair.
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
  constexpr int kRowBlock = 8, kR = 4, kT = 4;
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
          for (int i = 0; i < nr; ++i) {
            MicroTile<Loader, 1, kT>(n, wr + i * w_stride, w_stride, at, a_stride, o + i,
                                     out_stride);
          }
        } else {
          for (int j = 0; j < nt; ++j) {
            for (int i = 0; i < nr; ++i) {
              MicroTile<Loader, 1, 1>(n, wr + i * w_stride, w_stride, at + j * a_stride, a_stride,
                                      o + j * out_stride + i, out_stride);
            }
          }
        }
      }
    }
  }
}

}  // namespace

void VecDotTileF32F32Avx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                            size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  Tile<LoadF32>(n, w, w_stride, n_rows, a, a_stride, n_tokens, out, out_stride);
}
void VecDotTileF16F32Avx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                            size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  Tile<LoadF16>(n, w, w_stride, n_rows, a, a_stride, n_tokens, out, out_stride);
}
void VecDotTileBf16F32Avx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                             size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  Tile<LoadBf16>(n, w, w_stride, n_rows, a, a_stride, n_tokens, out, out_stride);
}

float VecDotF32F32Avx512(int64_t n, const void* w, const void* a) { return Dot<LoadF32>(n, w, a); }
float VecDotF16F32Avx512(int64_t n, const void* w, const void* a) { return Dot<LoadF16>(n, w, a); }
float VecDotBf16F32Avx512(int64_t n, const void* w, const void* a) {
  return Dot<LoadBf16>(n, w, a);
}

}  // namespace kiln::quant
