// The per-call driver the SIMD integer-order kernels share (interleaved_avx2.cc,
// interleaved_avx512.cc): the activations' scales converted once per call, then each group of 16
// rows. Every template here is instantiated with a format type local to one of those files, so
// each level's copy is its own (compiled with that file's instruction set).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/interleaved.h"
#include "kernels/cpu/legacy.h"
#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/scratch.h"

namespace kiln::quant::interleaved {

// An activation block's f16 scale (vcvtph2ps, exact as LoadHalf's software conversion is).
// `static`: each including file keeps its own copy, compiled for its level.
static inline float HalfToFloat(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return _cvtsh_ss(v);
}

// Σ qs of an activation block, by vpsadbw on the bytes + 128, eight at a time: the correction
// for weights stored with an offset (Q4_0's 8, Q5_0's 16, Q8_0's 128 when read as unsigned
// bytes) is -offset * this. Once per (token, block) a call, so it weighs most where few rows
// share it (a 576 x 192 matrix: 12 groups of 16).
static inline int32_t SumQsSad(const BlockQ8_0& a) {
  const __m256i biased = _mm256_xor_si256(
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.qs)), _mm256_set1_epi8(-128));
  const __m256i sums = _mm256_sad_epu8(biased, _mm256_setzero_si256());  // 4 x 8 bytes
  const __m128i two =
      _mm_add_epi64(_mm256_castsi256_si128(sums), _mm256_extracti128_si256(sums, 1));
  return _mm_cvtsi128_si32(_mm_add_epi64(two, _mm_unpackhi_epi64(two, two))) - 128 * kQK;
}

// The activations' scales of n_tokens rows, converted once per call: d[t * nb + b] and
// aux[t * nb + b] (scratch slots 0 and 1), by F::Scales.
template <typename F>
void ActivationScales(int64_t nb, const uint8_t* a, size_t a_stride, int n_tokens, float** d,
                      typename F::Aux** aux) {
  const size_t need = static_cast<size_t>(n_tokens) * nb;
  *d = static_cast<float*>(kernels::ThreadScratch(0, need * sizeof(float)));
  *aux = static_cast<typename F::Aux*>(kernels::ThreadScratch(1, need * sizeof(typename F::Aux)));
  for (int t = 0; t < n_tokens; ++t) {
    const auto* row = reinterpret_cast<const typename F::ActBlock*>(a + t * a_stride);
    for (int64_t b = 0; b < nb; ++b) F::Scales(row[b], *d + t * nb + b, *aux + t * nb + b);
  }
}

// The InterleavedTileFn contract for format F: group_tiles(group, nb, n_rows, a, a_stride,
// n_tokens, d, aux, out, out_stride) runs one group of 16 rows (n_rows of them real) x every token.
template <typename F, typename GroupTilesFn>
void InterleavedTile(int64_t n, const void* w, int n_rows, const void* a, size_t a_stride,
                     int n_tokens, float* out, size_t out_stride, GroupTilesFn group_tiles) {
  if (n_rows <= 0 || n_tokens <= 0) return;
  const int64_t nb = n / kQK;
  const auto* ap = static_cast<const uint8_t*>(a);
  float* d;
  typename F::Aux* aux;
  ActivationScales<F>(nb, ap, a_stride, n_tokens, &d, &aux);
  const auto* groups = static_cast<const typename F::Block*>(w);
  // The call's first kStreamPrefetchBytes: each block prefetches that far ahead of itself, so no
  // block asks for these (a matrix split between threads starts a stream at every thread's
  // first group; the default model's 576 x 576 Q4_1 is about 100 KB a thread).
  const size_t call_bytes = static_cast<size_t>((n_rows + kInterleaveRows - 1) / kInterleaveRows) *
                            nb * sizeof(typename F::Block);
  PrefetchStreamAhead(groups, std::min(call_bytes, kStreamPrefetchBytes), 0);
  for (int r = 0; r < n_rows; r += kInterleaveRows) {
    group_tiles(groups + r / kInterleaveRows * nb, nb, n_rows - r, ap, a_stride, n_tokens, d, aux,
                out + r, out_stride);
  }
}

}  // namespace kiln::quant::interleaved
