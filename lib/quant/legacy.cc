// Registration of the legacy block quants (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1) at each CPU level.
// Kernels: lib/quant/legacy_ref.cc (scalar), kernels/cpu/legacy_avx2.cc, legacy_avx512.cc; the
// tiles of kernels/cpu/tile_kernels.h and the integer order of kernels/cpu/interleaved.h.
#include "kernels/cpu/tile_kernels.h"
#include "lib/quant/legacy_kernels.h"
#include "lib/quant/quant.h"

namespace kiln {

void RegisterLegacyTypes(QuantRegistry& r, CpuLevel level) {
  using namespace quant;
  // The integer order on interleaved weights (interleave.h), one kernel per level with the same
  // bits: the default numeric mode's matmul on Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 at every level.
  auto set_interleaved = [&r](InterleavedTileFn q4_0, InterleavedTileFn q4_1,
                              InterleavedTileFn q5_0, InterleavedTileFn q5_1,
                              InterleavedTileFn q8_0, VecDotTileFn q8_0_in_place) {
    r[GgmlType::kQ5_0].interleave = InterleaveQ5_0;
    r[GgmlType::kQ5_0].interleaved_group_bytes = InterleavedGroupBytesQ5_0;
    r[GgmlType::kQ5_0].interleaved_row = InterleavedRowQ5_0;
    r[GgmlType::kQ5_0].interleaved_tile = q5_0;
    r[GgmlType::kQ5_1].interleave = InterleaveQ5_1;
    r[GgmlType::kQ5_1].interleaved_group_bytes = InterleavedGroupBytesQ5_1;
    r[GgmlType::kQ5_1].interleaved_row = InterleavedRowQ5_1;
    r[GgmlType::kQ5_1].interleaved_tile = q5_1;
    r[GgmlType::kQ4_0].interleave = InterleaveQ4_0;
    r[GgmlType::kQ4_0].interleaved_group_bytes = InterleavedGroupBytesQ4_0;
    r[GgmlType::kQ4_0].interleaved_row = InterleavedRowQ4_0;
    r[GgmlType::kQ4_0].interleaved_tile = q4_0;
    r[GgmlType::kQ4_1].interleave = InterleaveQ4_1;
    r[GgmlType::kQ4_1].interleaved_group_bytes = InterleavedGroupBytesQ4_1;
    r[GgmlType::kQ4_1].interleaved_row = InterleavedRowQ4_1;
    r[GgmlType::kQ4_1].interleaved_tile = q4_1;
    r[GgmlType::kQ8_0].interleave = InterleaveQ8_0;
    r[GgmlType::kQ8_0].interleaved_group_bytes = InterleavedGroupBytesQ8_0;
    r[GgmlType::kQ8_0].interleaved_tile = q8_0;
    r[GgmlType::kQ8_0].in_place_tile = q8_0_in_place;
  };
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
      set_interleaved(InterleavedTileQ4_0Q8_0Scalar, InterleavedTileQ4_1Q8_1Scalar,
                      InterleavedTileQ5_0Q8_0Scalar, InterleavedTileQ5_1Q8_1Scalar,
                      InterleavedTileQ8_0Q8_0Scalar, InPlaceTileQ8_0Q8_0Scalar);
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
      set_interleaved(InterleavedTileQ4_0Q8_0Avx2, InterleavedTileQ4_1Q8_1Avx2,
                      InterleavedTileQ5_0Q8_0Avx2, InterleavedTileQ5_1Q8_1Avx2,
                      InterleavedTileQ8_0Q8_0Avx2, InPlaceTileQ8_0Q8_0Avx2);
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
      set_interleaved(InterleavedTileQ4_0Q8_0Avx512, InterleavedTileQ4_1Q8_1Avx512,
                      InterleavedTileQ5_0Q8_0Avx512, InterleavedTileQ5_1Q8_1Avx512,
                      InterleavedTileQ8_0Q8_0Avx512, InPlaceTileQ8_0Q8_0Avx512);
      // The nibble types read in place until their copy is written in the background after load
      // (QuantKernels::in_place_until_copied).
      r[GgmlType::kQ4_0].in_place_tile = InPlaceTileQ4_0Q8_0Avx512;
      r[GgmlType::kQ4_1].in_place_tile = InPlaceTileQ4_1Q8_1Avx512;
      r[GgmlType::kQ5_0].in_place_tile = InPlaceTileQ5_0Q8_0Avx512;
      r[GgmlType::kQ5_1].in_place_tile = InPlaceTileQ5_1Q8_1Avx512;
      for (GgmlType t : {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1}) {
        r[t].in_place_until_copied = true;
      }
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
