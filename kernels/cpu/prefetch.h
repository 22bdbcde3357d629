// Software prefetch for weights that stream from memory once per call (x86 kernels of every
// level: _mm_prefetch is SSE).
//
// Why: decode reads each weight byte once, and the hardware prefetcher restarts on every short
// row; fetching the bytes kStreamPrefetchBytes ahead into L2 keeps the stream going. The AVX-512
// float dot: smollm2-f16 decode 63 -> 82 tok/s (llama-1b-f16 without it: 0.84x). The AVX2
// interleaved kernels use it at every width; the AVX-512 ones only for prefill, since one long
// contiguous stream read once (their decode) goes faster with the hardware prefetcher alone
// (interleaved_avx512.cc, PrefetchAhead). (Measured, not kept: into L1, 2 KB ahead, for tiles of
// 3+ tokens: as fast at 8 tokens, slower at 3-4 with 2 threads, where the two cores share the
// bandwidth.)
#pragma once

#include <xmmintrin.h>

#include <cstddef>

namespace kiln {

constexpr size_t kStreamPrefetchBytes = 8192;

// Prefetches into L2 the cache lines of [p + distance, + bytes): call it for the bytes about to
// be read, once each. (Kernels reading several streams at once may need a longer distance:
// kquants_avx512.cc's four-row kernels.)
inline void PrefetchStreamAhead(const void* p, size_t bytes,
                                size_t distance = kStreamPrefetchBytes) {
  const char* ahead = static_cast<const char*>(p) + distance;
  for (size_t off = 0; off < bytes; off += 64) _mm_prefetch(ahead + off, _MM_HINT_T1);
}

}  // namespace kiln
