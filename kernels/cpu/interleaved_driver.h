// The per-call driver the SIMD integer-order kernels share (interleaved_avx2.cc,
// interleaved_avx512.cc): the activations' scales converted once per call, then each group of 16
// rows. Every template here is instantiated with a format type local to one of those files, so
// each level's copy is its own (compiled with that file's instruction set).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/interleaved.h"
#include "kernels/cpu/legacy.h"
#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/scratch.h"

namespace kiln::quant::interleaved {

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
