// Registration of the legacy block quants (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1) at each CPU level.
// Kernels: lib/quant/legacy_ref.cc (scalar), kernels/cpu/legacy_avx2.cc, legacy_avx512.cc; the
// tiles of kernels/cpu/tile_kernels.h and the integer order of kernels/cpu/interleaved.h.
#include <algorithm>

#include "kernels/cpu/scratch.h"
#include "kernels/cpu/tile_kernels.h"
#include "lib/quant/interleave.h"
#include "lib/quant/legacy_kernels.h"
#include "lib/quant/quant.h"

namespace kiln {
namespace {

// An in-place form of an interleaved kernel for the levels without a kernel of their own that
// reads the rows: each group of 16 rows packed into per-thread scratch as the copy's
// packer packs it, then the kernel. It serves only until the background copy holds the rows
// (QuantKernels::in_place_tile), so its per-call packing, about what writing the copy
// costs once, lasts as long as the copy takes to write.
template <quant::InterleaveFn kPack, quant::InterleavedGroupBytesFn kGroupBytes,
          quant::InterleavedTileFn kTile>
void PackingInPlaceTile(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                        size_t a_stride, int n_tokens, float* out, size_t out_stride) {
  void* group = kernels::ThreadScratch(kernels::kWrapperScratchSlot, kGroupBytes(n));
  for (int r = 0; r < n_rows; r += quant::kInterleaveRows) {
    const int rows = std::min(quant::kInterleaveRows, n_rows - r);
    kPack(static_cast<const uint8_t*>(w) + r * w_stride, w_stride, n, rows, group);
    kTile(n, group, rows, a, a_stride, n_tokens, out + r, out_stride);
  }
}

// The integer order on interleaved weights (interleave.h), one kernel per level with the same
// bits: the default numeric mode's matmul on Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 at every level.
// Each is read in place until its copy is written: Q8_0 by q8_0_in_place, the nibble types by
// the packing form above unless a level registers its own.
template <quant::InterleavedTileFn kQ4_0, quant::InterleavedTileFn kQ4_1,
          quant::InterleavedTileFn kQ5_0, quant::InterleavedTileFn kQ5_1>
void SetInterleaved(QuantRegistry& r, quant::InterleavedTileFn q8_0, VecDotTileFn q8_0_in_place) {
  using namespace quant;
  auto set = [&r](GgmlType t, InterleaveFn pack, InterleavedGroupBytesFn group_bytes,
                  InterleavedRowFn row, InterleavedTileFn tile, VecDotTileFn in_place) {
    r[t].SetInterleavedForm(pack, group_bytes, row, tile, in_place);
  };
  set(GgmlType::kQ4_0, InterleaveQ4_0, InterleavedGroupBytesQ4_0, InterleavedRowQ4_0, kQ4_0,
      PackingInPlaceTile<InterleaveQ4_0, InterleavedGroupBytesQ4_0, kQ4_0>);
  set(GgmlType::kQ4_1, InterleaveQ4_1, InterleavedGroupBytesQ4_1, InterleavedRowQ4_1, kQ4_1,
      PackingInPlaceTile<InterleaveQ4_1, InterleavedGroupBytesQ4_1, kQ4_1>);
  set(GgmlType::kQ5_0, InterleaveQ5_0, InterleavedGroupBytesQ5_0, InterleavedRowQ5_0, kQ5_0,
      PackingInPlaceTile<InterleaveQ5_0, InterleavedGroupBytesQ5_0, kQ5_0>);
  set(GgmlType::kQ5_1, InterleaveQ5_1, InterleavedGroupBytesQ5_1, InterleavedRowQ5_1, kQ5_1,
      PackingInPlaceTile<InterleaveQ5_1, InterleavedGroupBytesQ5_1, kQ5_1>);
  set(GgmlType::kQ8_0, InterleaveQ8_0, InterleavedGroupBytesQ8_0, InterleavedRowQ8_0, q8_0,
      q8_0_in_place);
}

}  // namespace

void RegisterLegacyTypes(QuantRegistry& r, CpuLevel level) {
  using namespace quant;
  auto set = [&r](GgmlType t, QuantizeRowFn q, DequantizeRowFn dq, GgmlType dot_type,
                  VecDotFn dot) {
    QuantKernels& k = r[t];
    k.type = t;
    k.quantize = q;
    k.dequantize = dq;
    k.vec_dot_type = dot_type;
    k.vec_dot = dot;
  };
  constexpr GgmlType kQ8_0 = GgmlType::kQ8_0;
  constexpr GgmlType kQ8_1 = GgmlType::kQ8_1;
  switch (level) {
    case CpuLevel::kScalar:
      set(GgmlType::kQ4_0, QuantizeRowQ4_0Ref, DequantizeRowQ4_0Ref, kQ8_0, VecDotQ4_0Q8_0Ref);
      set(GgmlType::kQ4_1, QuantizeRowQ4_1Ref, DequantizeRowQ4_1Ref, kQ8_1, VecDotQ4_1Q8_1Ref);
      set(GgmlType::kQ5_0, QuantizeRowQ5_0Ref, DequantizeRowQ5_0Ref, kQ8_0, VecDotQ5_0Q8_0Ref);
      set(GgmlType::kQ5_1, QuantizeRowQ5_1Ref, DequantizeRowQ5_1Ref, kQ8_1, VecDotQ5_1Q8_1Ref);
      set(kQ8_0, QuantizeRowQ8_0Ref, DequantizeRowQ8_0Ref, kQ8_0, VecDotQ8_0Q8_0Ref);
      set(kQ8_1, QuantizeRowQ8_1Ref, DequantizeRowQ8_1Ref, kQ8_1, VecDotQ8_1Q8_1Ref);
      SetInterleaved<InterleavedTileQ4_0Q8_0Scalar, InterleavedTileQ4_1Q8_1Scalar,
                     InterleavedTileQ5_0Q8_0Scalar, InterleavedTileQ5_1Q8_1Scalar>(
          r, InterleavedTileQ8_0Q8_0Scalar, InPlaceTileQ8_0Q8_0Scalar);
      break;
    case CpuLevel::kAvx2:
      // Weight quantizers stay scalar (offline use); activation quantizers are on the hot path.
      set(GgmlType::kQ4_0, nullptr, DequantizeRowQ4_0Avx2, kQ8_0, VecDotQ4_0Q8_0Avx2);
      set(GgmlType::kQ4_1, nullptr, DequantizeRowQ4_1Avx2, kQ8_1, VecDotQ4_1Q8_1Avx2);
      set(GgmlType::kQ5_0, nullptr, DequantizeRowQ5_0Avx2, kQ8_0, VecDotQ5_0Q8_0Avx2);
      set(GgmlType::kQ5_1, nullptr, DequantizeRowQ5_1Avx2, kQ8_1, VecDotQ5_1Q8_1Avx2);
      set(kQ8_0, QuantizeRowQ8_0Avx2, DequantizeRowQ8_0Avx2, kQ8_0, VecDotQ8_0Q8_0Avx2);
      set(kQ8_1, QuantizeRowQ8_1Avx2, DequantizeRowQ8_1Avx2, kQ8_1, VecDotQ8_1Q8_1Avx2);
      r[GgmlType::kQ5_0].vec_dot_tile = VecDotTileQ5_0Q8_0Avx2;  // rows x tokens, same bits
      // One token too: 1.1-1.4x vec_dot per row on an AVX2-only Zen (cpu_ops_bench --tile
      // --types=q5_0, 576-1536 wide), where no multi-row kernel shares the activations.
      r[GgmlType::kQ5_0].tile_for_one_token = true;
      SetInterleaved<InterleavedTileQ4_0Q8_0Avx2, InterleavedTileQ4_1Q8_1Avx2,
                     InterleavedTileQ5_0Q8_0Avx2, InterleavedTileQ5_1Q8_1Avx2>(
          r, InterleavedTileQ8_0Q8_0Avx2, InPlaceTileQ8_0Q8_0Avx2);
      break;
    case CpuLevel::kAvx512:
      set(GgmlType::kQ4_0, nullptr, nullptr, kQ8_0, VecDotQ4_0Q8_0Avx512);
      set(GgmlType::kQ4_1, nullptr, nullptr, kQ8_1, VecDotQ4_1Q8_1Avx512);
      set(GgmlType::kQ5_0, nullptr, nullptr, kQ8_0, VecDotQ5_0Q8_0Avx512);
      set(GgmlType::kQ5_1, nullptr, nullptr, kQ8_1, VecDotQ5_1Q8_1Avx512);
      r[GgmlType::kQ4_0].vec_dot_rows = VecDotRowsQ4_0Q8_0Avx512;
      r[GgmlType::kQ4_1].vec_dot_rows = VecDotRowsQ4_1Q8_1Avx512;
      r[GgmlType::kQ5_0].vec_dot_rows = VecDotRowsQ5_0Q8_0Avx512;
      r[GgmlType::kQ5_1].vec_dot_rows = VecDotRowsQ5_1Q8_1Avx512;
      r[kQ8_0].vec_dot_rows = VecDotRowsQ8_0Q8_0Avx512;
      // Rows x tokens tiles (same bits as each vec_dot; kernels/cpu/tile_kernels.h).
      r[kQ8_0].vec_dot_tile = VecDotTileQ8_0Q8_0Avx512;
      r[GgmlType::kQ4_0].vec_dot_tile = VecDotTileQ4_0Q8_0Avx512;
      r[GgmlType::kQ4_1].vec_dot_tile = VecDotTileQ4_1Q8_1Avx512;
      r[GgmlType::kQ5_0].vec_dot_tile = VecDotTileQ5_0Q8_0Avx512;
      SetInterleaved<InterleavedTileQ4_0Q8_0Avx512, InterleavedTileQ4_1Q8_1Avx512,
                     InterleavedTileQ5_0Q8_0Avx512, InterleavedTileQ5_1Q8_1Avx512>(
          r, InterleavedTileQ8_0Q8_0Avx512, InPlaceTileQ8_0Q8_0Avx512);
      // The nibble types' rows transposed in registers rather than packed per call (Q4_1, one
      // token, cpu_ops_bench --tile, weights in cache: 128-139 GFLOP/s, the copy's 300-370).
      r[GgmlType::kQ4_0].in_place_tile = InPlaceTileQ4_0Q8_0Avx512;
      r[GgmlType::kQ4_1].in_place_tile = InPlaceTileQ4_1Q8_1Avx512;
      r[GgmlType::kQ5_0].in_place_tile = InPlaceTileQ5_0Q8_0Avx512;
      r[GgmlType::kQ5_1].in_place_tile = InPlaceTileQ5_1Q8_1Avx512;
      // Q4_1's tile unpacks the weights in registers: 1.1-1.25x vec_dot_rows at one token
      // (cpu_ops_bench --tile). The Q8_0 / Q4_0 / Q5_0 tiles repack weights per call: slower there.
      r[GgmlType::kQ4_1].tile_for_one_token = true;
      // Single-row Q8 weight dots stay on the AVX2 kernels (faster on Zen 4, same bits); Q8_0
      // has a multi-row kernel (activation blocks shared by 4 rows).
      set(kQ8_0, QuantizeRowQ8_0Avx512, nullptr, kQ8_0, nullptr);
      set(kQ8_1, QuantizeRowQ8_1Avx512, nullptr, kQ8_1, nullptr);
      break;
  }
}

}  // namespace kiln
