// Software prefetch for weights that stream from memory once per call (x86 kernels of every
// level: _mm_prefetch is SSE).
//
// Why: decode reads each weight byte once, and the hardware prefetcher restarts on every short
// row; fetching the bytes kStreamPrefetchBytes ahead into L2 keeps the stream going. The AVX-512
// float dot: smollm2-f16 decode 63 -> 82 tok/s (llama-1b-f16 without it: 0.84x). The AVX2
// interleaved kernels use it at every width; the AVX-512 ones for prefill, and for decode only on
// the cores where one long contiguous stream read once goes faster so (PrefetchOneTokenStream).
// (Measured, not kept: into L1, 2 KB ahead, for tiles of 3+ tokens: as fast at 8 tokens, slower at
// 3-4 with 2 threads, where the two cores share the bandwidth.)
#pragma once

#include <xmmintrin.h>

#include <cstddef>

namespace kiln {

constexpr size_t kStreamPrefetchBytes = 8192;

// Whether the AVX-512 kernels on an interleaved copy prefetch its one contiguous stream for a
// single token too (decode), which the hardware prefetcher follows alone. Measured both ways: on
// Zen 4 (the 2-core VM of 2026-12-01..05) the stream went faster without (decode128, 1 thread:
// llama-1b-q4_0 37.5 -> 51.2 tok/s, the default model 232 -> 259); on Zen 5 (the same VM's cores
// from 2026-12-06) faster with (llama-1b-q4_0 57-58 -> 64, q5_0 45 -> 53, the default model
// 324-332 -> 389-396; cpu_ops_bench --stream Q5_0 75% -> 89% of a plain read). Off until set
// (SetPrefetchForCore).
void SetPrefetchOneTokenStream(bool on);
bool PrefetchOneTokenStream();

// Whether the AVX-512 attention kernels prefetch the K/V rows into L1 (non-temporal, a few KiB
// ahead) rather than into L2 (64 rows ahead), measured per core like the above: into L2 on Zen 4
// (kernels/cpu/ops_avx512.cc), into L1 on Zen 5 (decode from memory 15-17% faster for an f16
// cache). Off until set.
void SetPrefetchKvIntoL1(bool on);
bool PrefetchKvIntoL1();

// Sets both choices above for the running core, the one place that says which cores take which:
// AMD's from Zen 5 (family 0x1A) both on, every other core as measured on Zen 4. Called by each
// kernel table before it hands out a kernel (lib/quant/quant.cc, lib/backend/cpu/ops.cc).
void SetPrefetchForCore(bool amd, int x86_family);

// Prefetches into L2 the cache lines of [p + distance, + bytes): call it for the bytes about to
// be read, once each. (Kernels reading several streams at once may need a longer distance:
// kquants_avx512.cc's four-row kernels.)
//
// A helper whose only effect is a prefetch must be always_inline: GCC 12 finds such a function
// free of side effects when it is not inlined early, and deletes its calls (the AVX2 attention
// kernels lost their K/V prefetch that way).
__attribute__((always_inline)) inline void PrefetchStreamAhead(
    const void* p, size_t bytes, size_t distance = kStreamPrefetchBytes) {
  const char* ahead = static_cast<const char*>(p) + distance;
  for (size_t off = 0; off < bytes; off += 64) _mm_prefetch(ahead + off, _MM_HINT_T1);
}

}  // namespace kiln
