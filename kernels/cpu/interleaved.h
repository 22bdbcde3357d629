// Row-interleaved ("x16") weight blocks and the integer-order tile kernels that read them, one per
// CPU level. The integer order itself, the packers and the plain references are described in
// lib/quant/interleave.h; every kernel here gives exactly the reference's bits, so the default
// numeric mode's results do not depend on the CPU.
//
// Kernel contract (InterleavedTileFn): out[t * out_stride + r] = the integer-order dot of
// interleaved row r (of the groups at w) and activation row t (a + t * a_stride), r < n_rows,
// t < n_tokens; n a multiple of 32; nothing else written. Activation rows as MatMul's activation
// quantizers produce them (qs in [-127, 127]; the AVX2 Q8_0 kernel's pair sums need that bound).
// Thread-safe (per-thread scratch). The SIMD kernels must only run on CPUs with their
// instruction set (the registry guarantees it).
#pragma once

#include <cstddef>
#include <cstdint>

namespace kiln::quant {

inline constexpr int kInterleaveRows = 16;

// 16 Q4_1 rows x one 32-element block (320 B, five cache lines).
struct alignas(64) BlockQ4_1x16 {
  // qs[i][4 r + j] = byte 4 i + j of row r's block qs: its low nibble is element 4 i + j, its
  // high nibble element 16 + 4 i + j (Q4_1's own nibble order, BlockQ4_1).
  uint8_t qs[4][64];
  uint8_t d[kInterleaveRows][2];  // f16 scale of row r
  uint8_t m[kInterleaveRows][2];  // f16 min of row r
};
static_assert(sizeof(BlockQ4_1x16) == 320);

// 16 Q4_0 rows x one 32-element block (288 B: the 16 source blocks' own bytes).
struct alignas(32) BlockQ4_0x16 {
  // qs[i][4 r + j] = byte 4 i + j of row r's block qs (as in BlockQ4_1x16; weight = nibble - 8).
  uint8_t qs[4][64];
  uint8_t d[kInterleaveRows][2];  // f16 scale of row r
};
static_assert(sizeof(BlockQ4_0x16) == 288);

// 16 Q5_0 rows x one 32-element block (352 B: the 16 source blocks' own bytes).
struct alignas(32) BlockQ5_0x16 {
  uint8_t qs[4][64];               // as BlockQ4_0x16's: the low 4 bits of each element
  uint8_t qh[kInterleaveRows][4];  // row r's qh: bit j = bit 4 of element j (weight = q - 16)
  uint8_t d[kInterleaveRows][2];   // f16 scale of row r
};
static_assert(sizeof(BlockQ5_0x16) == 352);

// 16 Q5_1 rows x one 32-element block (384 B: the 16 source blocks' own bytes).
struct alignas(64) BlockQ5_1x16 {
  uint8_t qs[4][64];               // as BlockQ5_0x16's
  uint8_t qh[kInterleaveRows][4];  // as BlockQ5_0x16's (weight = q * d + m, q in 0..31)
  uint8_t d[kInterleaveRows][2];   // f16 scale of row r
  uint8_t m[kInterleaveRows][2];   // f16 min of row r
};
static_assert(sizeof(BlockQ5_1x16) == 384);

// 16 Q8_0 rows x one 32-element block (544 B).
struct alignas(32) BlockQ8_0x16 {
  // qs[i][4 r + j] = element 4 i + j of row r plus 128 (as an unsigned byte).
  uint8_t qs[8][64];
  uint8_t d[kInterleaveRows][2];  // f16 scale of row r
};
static_assert(sizeof(BlockQ8_0x16) == 544);

// Q4_1 weights x Q8_1 activations.
// Scalar: plain C++ (kernels/cpu/interleaved_scalar.cc).
void InterleavedTileQ4_1Q8_1Scalar(int64_t n, const void* w, int n_rows, const void* a,
                                   size_t a_stride, int n_tokens, float* out, size_t out_stride);
// AVX2 + FMA + F16C (kernels/cpu/interleaved_avx2.cc).
void InterleavedTileQ4_1Q8_1Avx2(int64_t n, const void* w, int n_rows, const void* a,
                                 size_t a_stride, int n_tokens, float* out, size_t out_stride);
// AVX-512 F/BW/VL/VNNI, F16C (kernels/cpu/interleaved_avx512.cc).
void InterleavedTileQ4_1Q8_1Avx512(int64_t n, const void* w, int n_rows, const void* a,
                                   size_t a_stride, int n_tokens, float* out, size_t out_stride);

// Q4_0 weights x Q8_0 activations, in the same three files.
void InterleavedTileQ4_0Q8_0Scalar(int64_t n, const void* w, int n_rows, const void* a,
                                   size_t a_stride, int n_tokens, float* out, size_t out_stride);
void InterleavedTileQ4_0Q8_0Avx2(int64_t n, const void* w, int n_rows, const void* a,
                                 size_t a_stride, int n_tokens, float* out, size_t out_stride);
void InterleavedTileQ4_0Q8_0Avx512(int64_t n, const void* w, int n_rows, const void* a,
                                   size_t a_stride, int n_tokens, float* out, size_t out_stride);

// Q5_0 weights x Q8_0 activations, in the same three files.
void InterleavedTileQ5_0Q8_0Scalar(int64_t n, const void* w, int n_rows, const void* a,
                                   size_t a_stride, int n_tokens, float* out, size_t out_stride);
void InterleavedTileQ5_0Q8_0Avx2(int64_t n, const void* w, int n_rows, const void* a,
                                 size_t a_stride, int n_tokens, float* out, size_t out_stride);
void InterleavedTileQ5_0Q8_0Avx512(int64_t n, const void* w, int n_rows, const void* a,
                                   size_t a_stride, int n_tokens, float* out, size_t out_stride);

// Q5_1 weights x Q8_1 activations, in the same three files.
void InterleavedTileQ5_1Q8_1Scalar(int64_t n, const void* w, int n_rows, const void* a,
                                   size_t a_stride, int n_tokens, float* out, size_t out_stride);
void InterleavedTileQ5_1Q8_1Avx2(int64_t n, const void* w, int n_rows, const void* a,
                                 size_t a_stride, int n_tokens, float* out, size_t out_stride);
void InterleavedTileQ5_1Q8_1Avx512(int64_t n, const void* w, int n_rows, const void* a,
                                   size_t a_stride, int n_tokens, float* out, size_t out_stride);

// Q8_0 weights x Q8_0 activations, in the same three files.
void InterleavedTileQ8_0Q8_0Scalar(int64_t n, const void* w, int n_rows, const void* a,
                                   size_t a_stride, int n_tokens, float* out, size_t out_stride);
void InterleavedTileQ8_0Q8_0Avx2(int64_t n, const void* w, int n_rows, const void* a,
                                 size_t a_stride, int n_tokens, float* out, size_t out_stride);
void InterleavedTileQ8_0Q8_0Avx512(int64_t n, const void* w, int n_rows, const void* a,
                                   size_t a_stride, int n_tokens, float* out, size_t out_stride);

// Q8_0 weights read in place: the rows as the file stores them (w_stride bytes apart), until the
// interleaved copy written in the background after load holds them. The contract of VecDotTileFn
// (tile_kernels.h) with the integer order's bits: out[t * out_stride + r] is bit for bit what
// InterleavedTileQ8_0Q8_0* gives on the interleaved copy of the same rows. The SIMD levels pack each group of 16 rows into per-thread
// scratch as they go (PackQ8_0x16*) and run their interleaved kernel on it; the scalar level
// follows the reference row by row.
void InPlaceTileQ8_0Q8_0Scalar(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                               size_t a_stride, int n_tokens, float* out, size_t out_stride);
void InPlaceTileQ8_0Q8_0Avx2(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                             size_t a_stride, int n_tokens, float* out, size_t out_stride);
void InPlaceTileQ8_0Q8_0Avx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                               size_t a_stride, int n_tokens, float* out, size_t out_stride);

// Q4_0, Q4_1, Q5_0 and Q5_1 weights read in place, with the same contract and bits (against
// their InterleavedTile* kernels): the AVX-512 level makes each group's x16 blocks in registers
// for a few tokens and in per-thread scratch for more.
void InPlaceTileQ4_0Q8_0Avx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                               size_t a_stride, int n_tokens, float* out, size_t out_stride);
void InPlaceTileQ4_1Q8_1Avx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                               size_t a_stride, int n_tokens, float* out, size_t out_stride);
void InPlaceTileQ5_0Q8_0Avx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                               size_t a_stride, int n_tokens, float* out, size_t out_stride);
void InPlaceTileQ5_1Q8_1Avx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                               size_t a_stride, int n_tokens, float* out, size_t out_stride);

// One group of up to 16 Q8_0 rows (n_rows of them, w_stride bytes apart; the rest zero) as nb x16
// blocks at out: the bytes InterleaveQ8_0 (lib/quant/interleave.h) writes for them. Plain C++,
// and the AVX2 and AVX-512 versions the in-place kernels use.
void PackQ8_0x16(const void* w, size_t w_stride, int n_rows, int64_t nb, BlockQ8_0x16* out);
void PackQ8_0x16Avx2(const void* w, size_t w_stride, int n_rows, int64_t nb, BlockQ8_0x16* out);
void PackQ8_0x16Avx512(const void* w, size_t w_stride, int n_rows, int64_t nb, BlockQ8_0x16* out);

}  // namespace kiln::quant
