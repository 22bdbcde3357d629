// Tensor element types kiln computes with: reference quantizers, row dequantizers and the dot
// product of one weight row with one activation row, per CPU level.
//
// Every weight type W has an activation ("vec dot") type A: activations are quantized to A once
// per row, then dot(W row, A row) runs in integer or float SIMD. E.g. Q4_0 -> Q8_0,
// Q4_1 -> Q8_1, K-quants -> Q8_K, F32 -> F32.
//
// Contract of every function: n is a multiple of the type's block size; pointers are valid for
// the row's bytes; no alignment is required. Thread-safe (pure functions).
#pragma once

#include <cstddef>
#include <cstdint>

#include "lib/common/ggml_type.h"
#include "lib/quant/interleave.h"

namespace kiln {

using quant::InterleavedGroupBytesFn;
using quant::InterleavedRowFn;
using quant::InterleavedTileFn;
using quant::InterleaveFn;

enum class CpuLevel { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };
const char* CpuLevelName(CpuLevel level);

// Highest level this CPU supports (honours KILN_CPU_LEVEL, see cpu_features.h).
CpuLevel BestCpuLevel();

// x: n floats -> y: n/block_size blocks of the type.
using QuantizeRowFn = void (*)(const float* x, void* y, int64_t n);
// x: n/block_size blocks -> y: n floats.
using DequantizeRowFn = void (*)(const void* x, float* y, int64_t n);
// Sum over n elements of w[i] * a[i]; w is a row of the weight type, a a row of vec_dot_type.
using VecDotFn = float (*)(int64_t n, const void* w, const void* a);

// out[r] = vec_dot(n, w + r * w_stride, a) for r in [0, n_rows), bit for bit (each row follows
// exactly the vec_dot steps; the activation row is decoded once for several rows). n_rows >= 0.
using VecDotRowsFn = void (*)(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                              float* out);

// Tile of weight rows x activation rows ("tokens"):
//   out[t * out_stride + r] = vec_dot(n, w + r * w_stride, a + t * a_stride)
// for r in [0, n_rows), t in [0, n_tokens), bit for bit the same float as vec_dot at the same
// CPU level (each (row, token) pair follows exactly the vec_dot steps; loads of a weight block
// and of an activation block serve several outputs). Writes nothing else. n_rows, n_tokens >= 0.
// Activation rows must be what the vec_dot_type's quantizer produces (e.g. Q8_0 values in
// [-127, 127]). Thread-safe; may use per-thread scratch memory internally.
using VecDotTileFn = void (*)(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                              size_t a_stride, int n_tokens, float* out, size_t out_stride);

struct QuantKernels {
  GgmlType type;
  QuantizeRowFn quantize = nullptr;      // reference quantizer (deterministic)
  DequantizeRowFn dequantize = nullptr;  // exact block decode
  GgmlType vec_dot_type = GgmlType::kF32;
  VecDotFn vec_dot = nullptr;
  // Optional multi-row form of vec_dot (same bits); null: call vec_dot per row.
  VecDotRowsFn vec_dot_rows = nullptr;
  // Optional rows x tokens form of vec_dot (same bits); null: use vec_dot_rows / vec_dot.
  VecDotTileFn vec_dot_tile = nullptr;
  // vec_dot_tile is also the fastest path for a single token (otherwise one token keeps
  // vec_dot_rows / vec_dot).
  bool tile_for_one_token = false;
  // Row-interleaved form and its tile kernel (interleave.h; the integer order's x16 groups of the
  // legacy types, the AVX-512 K-quants' quads in vec_dot's order): the default numeric mode's
  // matmul where set (null: the type keeps vec_dot's order in every mode). The CPU backend writes
  // the copy in the background after load (PrepareCpuWeights), the file's pages released behind
  // it: the kernels on the copy stream it faster (the legacy types 2.3-3x at one token, the
  // K-quants 15-25%: one stream where the rows are four).
  InterleaveFn interleave = nullptr;
  InterleavedGroupBytesFn interleaved_group_bytes = nullptr;
  InterleavedRowFn interleaved_row = nullptr;  // one row back out of the interleaved form
  InterleavedTileFn interleaved_tile = nullptr;
  // The same order reading the file's rows in place (the VecDotTileFn signature,
  // interleaved_tile's bits), until the copy holds them (WeightView::in_place).
  VecDotTileFn in_place_tile = nullptr;
  bool IsSupported() const { return quantize && dequantize && vec_dot; }
  // The interleaved form's hooks, which serve only together.
  void SetInterleavedForm(InterleaveFn pack, InterleavedGroupBytesFn group_bytes,
                          InterleavedRowFn row, InterleavedTileFn tile, VecDotTileFn in_place) {
    interleave = pack;
    interleaved_group_bytes = group_bytes;
    interleaved_row = row;
    interleaved_tile = tile;
    in_place_tile = in_place;
  }
};

// Kernels of `type` at `level` (falling back to lower levels where a type has no faster path),
// or nullptr when kiln cannot compute with the type. The returned table lives forever.
const QuantKernels* GetQuantKernels(GgmlType type, CpuLevel level);
inline const QuantKernels* GetQuantKernels(GgmlType type) {
  return GetQuantKernels(type, BestCpuLevel());
}

// --- Registration hooks, one per family; each fills the slots of its types for one level.
// Leaving a slot null at a level means "use the next lower level's function".
struct QuantRegistry {
  QuantKernels kernels[static_cast<int>(GgmlType::kCount)];
  QuantKernels& operator[](GgmlType t) { return kernels[static_cast<int>(t)]; }
};
void RegisterFloatTypes(QuantRegistry& r,
                        CpuLevel level);  // F32, F16, BF16   (lib/quant/float_types.cc)
void RegisterLegacyTypes(QuantRegistry& r, CpuLevel level);  // Q4_0..Q8_1 (lib/quant/legacy.cc)
void RegisterKQuantTypes(QuantRegistry& r,
                         CpuLevel level);  // Q2_K..Q6_K, Q8_K (lib/quant/kquants.cc)

}  // namespace kiln
