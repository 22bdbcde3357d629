// Row-interleaved weights and kiln's integer dot order: the matmuls of the default
// (batch-invariant) numeric mode on Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 weights, at every CPU level
// with the same bits (scalar, AVX2 and AVX-512 kernels in kernels/cpu/interleaved.h), beside the
// ggml-order kernels of quant.h that EngineOptions::llama_cpp_order keeps.
//
// Layout ("x16", kernels/cpu/interleaved.h): a matrix's rows in groups of kInterleaveRows = 16,
// each group stored block by block, so one 512-bit register holds the same 4 elements of all 16
// rows (a lane per row) and a dot product never needs a horizontal reduction. Rows past the
// matrix's last one are zero. Until the CPU backend has written a matrix's copy (in the
// background after load), in-place kernels (QuantKernels::in_place_tile) make the layout from the
// rows as they go.
//
// The same hooks (InterleaveFn, InterleavedTileFn, ...) also carry the AVX-512 K-quant kernels'
// copy, which keeps vec_dot's order and only reorders the super-blocks (groups of 16 rows, each
// four quads of 4 rows interleaved super-block by super-block: kernels/cpu/kquants.h).
//
// Integer order, per (weight row w, activation row a) of nb = n / 32 blocks:
//   Q4_1 x Q8_1:
//     acc = 0, mins = 0
//     for b in 0 .. nb-1:
//       P    = Σ_j qw_j * qa_j over the block's 32 elements  (exact int32; |P| <= 32 * 15 * 127)
//       acc  = fma(f32(dw_b) * f32(da_b), float(P), acc)    (one rounded product, then one FMA)
//       mins = fma(f32(mw_b), f32(sa_b), mins)
//     result = acc + mins
//   Q8_0 x Q8_0: the same without the mins (|P| <= 32 * 127 * 127, exact in float too).
//   Q4_0 x Q8_0: the same, with qw_j = nibble_j - 8 (|P| <= 32 * 8 * 127).
//   Q5_0 x Q8_0: the same, with qw_j = (5-bit q_j) - 16 (|P| <= 32 * 16 * 127).
//   Q5_1 x Q8_1: Q4_1's, with qw_j the 5-bit q_j (|P| <= 32 * 31 * 127).
// ggml's x86 order instead keeps 4 or 8 float partial sums per (row, token), each FMA'd per
// block (legacy_kernels.h); that needs a convert, multiply and FMA per 4 or 8 elements where this
// order needs them per 32, and the interleaved layout shares every weight load across 16 rows.
// The two orders differ in the last bits of a result. Each output depends only on its own weight
// row and activation row, so results are batch invariant by construction.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/interleaved.h"

namespace kiln::quant {

// Rows [n_rows] of n_in elements (w_stride bytes apart) -> out: ceil(n_rows / 16) groups of
// n_in / 32 interleaved blocks, group-major. n_in a multiple of 32.
using InterleaveFn = void (*)(const void* w, size_t w_stride, int64_t n_in, int64_t n_rows,
                              void* out);
// Bytes of one group of 16 interleaved rows of n_in elements.
using InterleavedGroupBytesFn = size_t (*)(int64_t n_in);

// out[t * out_stride + r] = integer-order dot of interleaved row r (of the groups at w) and
// activation row t (at a + t * a_stride), for r < n_rows, t < n_tokens; bit for bit the
// reference below. Writes nothing else. Thread-safe (per-thread scratch).
using InterleavedTileFn = void (*)(int64_t n, const void* w, int n_rows, const void* a,
                                   size_t a_stride, int n_tokens, float* out, size_t out_stride);

void InterleaveQ4_1(const void* w, size_t w_stride, int64_t n_in, int64_t n_rows, void* out);
size_t InterleavedGroupBytesQ4_1(int64_t n_in);

void InterleaveQ4_0(const void* w, size_t w_stride, int64_t n_in, int64_t n_rows, void* out);
size_t InterleavedGroupBytesQ4_0(int64_t n_in);

void InterleaveQ5_0(const void* w, size_t w_stride, int64_t n_in, int64_t n_rows, void* out);
size_t InterleavedGroupBytesQ5_0(int64_t n_in);

void InterleaveQ5_1(const void* w, size_t w_stride, int64_t n_in, int64_t n_rows, void* out);
size_t InterleavedGroupBytesQ5_1(int64_t n_in);

void InterleaveQ8_0(const void* w, size_t w_stride, int64_t n_in, int64_t n_rows, void* out);
size_t InterleavedGroupBytesQ8_0(int64_t n_in);

// Row `row` of a matrix that an InterleaveFn wrote at `groups`, back in its original blocks
// (n_in / 32 of them at out): the bytes of the source row. Lets an embedding lookup read the copy
// instead of the file pages the copy let go.
using InterleavedRowFn = void (*)(const void* groups, int64_t n_in, int64_t row, void* out);

void InterleavedRowQ4_0(const void* groups, int64_t n_in, int64_t row, void* out);
void InterleavedRowQ4_1(const void* groups, int64_t n_in, int64_t row, void* out);
void InterleavedRowQ5_0(const void* groups, int64_t n_in, int64_t row, void* out);
void InterleavedRowQ5_1(const void* groups, int64_t n_in, int64_t row, void* out);
void InterleavedRowQ8_0(const void* groups, int64_t n_in, int64_t row, void* out);

// The plain references of the integer order for one weight row and one activation row (the
// original, not interleaved, layouts).
float VecDotQ4_0Q8_0IntegerRef(int64_t n, const void* w, const void* a);
float VecDotQ4_1Q8_1IntegerRef(int64_t n, const void* w, const void* a);
float VecDotQ5_0Q8_0IntegerRef(int64_t n, const void* w, const void* a);
float VecDotQ5_1Q8_1IntegerRef(int64_t n, const void* w, const void* a);
float VecDotQ8_0Q8_0IntegerRef(int64_t n, const void* w, const void* a);

}  // namespace kiln::quant
