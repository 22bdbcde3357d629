// Inner loops of the CPU ops (lib/backend/cpu/ops.h), one table per SIMD level: scalar in
// ops_scalar.cc, AVX2 and AVX-512 in ops_avx2.cc and ops_avx512.cc, each compiled with its own
// flags (kernels/cpu/CMakeLists.txt). lib/backend/cpu/dispatch.h hands out the table of a level.
//
// This header is included by the SIMD translation units, so it must hold declarations only:
// no inline functions or templates (an inline function compiled with -mavx512f could be the
// copy the linker keeps for everyone).
//
// Arithmetic of the llama-path kernels (rms_norm, swiglu, kv_scores, softmax_exp,
// kv_accumulate; not kv_scores_rows / kv_accumulate_rows, kiln's own order) is ggml's CPU
// backend on x86 with AVX-512, step for step, so that kiln's activations equal llama.cpp's bit for
// bit (quantized models amplify any last-bit difference; see lib/quant/activation.h). Every level
// gives the same bits; a level without its own version uses the scalar one. The scalar versions are
// the definitions.
//
// All functions are pure, thread-safe, and accept unaligned pointers. `n` counts floats.
#pragma once

#include <cstdint>

namespace kiln::cpu {

// Element type of a K or V row in the paged cache. A kQ8_0 row is ggml's block_q8_0 list (per 32
// elements an f16 scale d, then 32 int8 q; d % 32 == 0): element i is f32(d) * float(q), a
// product that is exact in f32 (11 + 8 significant bits), so widening a Q8_0 row gives the same
// floats on every level and the kernels below run on them as on an f32 row.
enum class KvElem : int32_t { kF32 = 0, kF16 = 1, kBf16 = 2, kQ8_0 = 3 };
// Bytes of one row of d elements: 4 d (f32), 2 d (f16, bf16), 34 d / 32 (q8_0). Each translation
// unit has its own copy (no inline functions here).

// Lanes of kv_accumulate's accumulator: ggml_vec_dot_f32's 4 x 16 lanes on AVX-512 (what
// llama.cpp uses for one-token batches), or tinyBLAS's 16 (llama.cpp's prompt batches).
inline constexpr int64_t kAttnLanes = 64;
inline constexpr int64_t kAttnLanesTinyBlas = 16;

struct OpKernels {
  // ggml's rms_norm + mul on each of n_rows rows of n floats: ss = double sum of
  // float(x[i] * x[i]) in order; scale = 1 / sqrtf(float(ss / n) + eps);
  // y[i] = (x[i] * scale) * w[i]. x and y may alias. (Rows at once: the in-order double sum is
  // one add-latency chain per row, so independent rows are what can run side by side.)
  void (*rms_norm)(const float* x, const float* w, int64_t n_rows, int64_t n, float eps, float* y);
  // y[i] = (g / (1 + ExpGgml(0 - g))) * up[i], g = gate[i] (ggml_vec_swiglu_f32). y may alias
  // gate or up. ExpGgml is ggml_v_expf's polynomial (ops_scalar.cc).
  void (*swiglu)(const float* gate, const float* up, int64_t n, float* y);
  // ggml_vec_geglu_f32 (GGML_GELU_FP16), g = gate[i]: y[i] = 0 for g <= -10, g * up[i] for
  // g >= 10, else Fp16ToFp32(table[Fp32ToFp16(g)]) * up[i]. table: the 65536 f16 GELU values by
  // f16 bits, plus one readable padding entry (a SIMD level may gather 32 bits at entry 65535).
  // y may alias gate or up.
  void (*geglu)(const float* gate, const float* up, const uint16_t* table, int64_t n, float* y);
  // y[i] = a[i] + b[i]. y may alias a or b.
  void (*add)(const float* a, const float* b, int64_t n, float* y);
  // max_i x[i] (n >= 1).
  float (*max)(const float* x, int64_t n);
  // y[i] = exp(x[i] - sub); returns the sum of y. x and y may alias. (Generic softmax.)
  float (*exp_sum)(const float* x, float sub, int64_t n, float* y);
  // x[i] *= s.
  void (*scale)(float* x, float s, int64_t n);
  // x[i] = x[i] rounded to f16 (nearest, ties to even) and widened back.
  void (*round_f16)(float* x, int64_t n);
  // y[i] = Fp32ToFp16(x[i]) (lib/common/half.h: nearest, ties to even; every NaN as the quiet
  // NaN 0x7E00 with x's sign). For the K/V cache stores.
  void (*store_f16)(const float* x, int64_t n, uint16_t* y);
  // ggml's rotate_pairs as GCC contracts it, on the n_pairs pairs (x[p], x[p + stride]) of one
  // head, p = 2 i (stride 1, NORM) or i (stride n_pairs, NEOX), with c[i], s[i] of pair i:
  //   (x0, x1) -> (fma(x0, c, -(x1 * s)), fma(x0, s, x1 * c)).
  void (*rope_pairs)(float* x, const float* c, const float* s, int64_t n_pairs, int64_t stride);
  // Attention scores of n_q query heads against n_rows consecutive K rows (row-major tile of
  // `elem`, d per row): scores[g * score_stride + j] = Dot(k_rows + j*d, q + g*d). K rows of
  // f16/bf16 are widened to f32 first. With n_lanes = kAttnLanes, Dot is ggml_vec_dot_f32: 4 x 16
  // FMA lanes over each 64 elements, reduced ((l0 + l2) + (l1 + l3)) then as
  // _mm512_reduce_add_ps, then the tail added one product at a time (to a double for f16, as
  // ggml_vec_dot_f16); with n_lanes =
  // kAttnLanesTinyBlas (d % 16 == 0) it is tinyBLAS's: 16 FMA lanes, _mm512_reduce_add_ps.
  void (*kv_scores)(const float* q, int64_t n_q, const void* k_rows, int64_t n_rows, KvElem elem,
                    int64_t d, int64_t n_lanes, float* scores, int64_t score_stride);
  // ggml_vec_soft_max_f32: y[i] = ExpGgml(x[i] - max); returns the double sum over chunks of
  // 16 (i = 16c..16c+15, missing lanes as 0), each chunk summed in _mm512_reduce_add_ps order.
  double (*softmax_exp)(const float* x, float max, int64_t n, float* y);
  // The V side of ggml's kqv = V^T . softmax as a lane-major accumulator acc[n_lanes][d]:
  // row j (visible index lane0 + j) goes to lane (lane0 + j) % n_lanes:
  //   acc[lane][i] = fma(v_j[i], p[j], acc[lane][i]).
  void (*kv_accumulate)(float* acc, const float* p, const void* v_rows, int64_t n_rows,
                        int64_t lane0, int64_t n_lanes, KvElem elem, int64_t d);
  // Same result as kv_accumulate over n_groups runs of 16 rows, run r holding visible indices
  // 16 r .. 16 r + 15 at v_groups[r] (p: [16 n_groups]); a faster loop order (each lane's
  // accumulator stays in a register across the runs).
  void (*kv_accumulate_groups)(float* acc, const float* p, const void* const* v_groups,
                               int64_t n_groups, int64_t n_lanes, KvElem elem, int64_t d);
  // kiln's batch-invariant scores (AttentionOrder::kBatchInvariant): for each visible row j (K
  // at k_rows[j], widened to f32) and head g, 16 lanes l each run one FMA chain from 0 over the
  // row's elements i = 16 c + l, c = 0, 1, ..., in order; the lanes x[0..15] are summed as
  // ((Q0 + Q2) + (Q1 + Q3)), Q_q = (x[4q] + x[4q + 2]) + (x[4q + 1] + x[4q + 3]); the last
  // d % 16 elements follow one FMA each: scores[g * score_stride + j] = s.
  void (*kv_scores_rows)(const float* q, int64_t n_q, const void* const* k_rows, int64_t n_rows,
                         KvElem elem, int64_t d, float* scores, int64_t score_stride);
  // kiln's batch-invariant scores against q8_0 K rows, with the queries quantized too (q8: n_q
  // rows of d / 32 block_q8_0, as MatMul's Q8_0 activation quantizer writes them; d % 32 == 0,
  // d <= 1024):
  // for each visible row j and head g, s = +0, then for each block b in order
  //   s = fma(f32(dk_b) * f32(dq_b), float(isum_b), s),   isum_b = the exact int32 sum of the
  // block's 32 int8 products; scores[g * score_stride + j] = s. (kv_scores_rows on a q8_0 row
  // widens it and runs f32 FMAs, which bound a q8_0 cache's decode by their compute; the integer
  // dot needs no conversion.)
  void (*kv_scores_rows_q8_0)(const void* q8, int64_t n_q, const void* const* k_rows,
                              int64_t n_rows, int64_t d, float* scores, int64_t score_stride);
  // kiln's batch-invariant V side (AttentionOrder::kBatchInvariant), no lanes: for each of n_q
  // heads g and element i one FMA chain over the visible rows in index order, continuing from
  // out's value (the caller zeroes out first; a later call continues the chains with more rows):
  //   out[g * d + i] = fma(v_rows[j][i], p[g * p_stride + j], out[g * d + i]), j = 0 .. n_rows - 1,
  // so a V row can be widened once for several of the n_q heads that share it (heads of a GQA
  // group, or of several tokens seeing the same rows).
  void (*kv_accumulate_rows)(float* out, const float* p, int64_t p_stride, int64_t n_q,
                             const void* const* v_rows, int64_t n_rows, KvElem elem, int64_t d);
  // out[i] = the reduction of acc[n_lanes][d] column i (see kv_accumulate): for 64 lanes
  // ggml_vec_dot_f32's ((l0 + l2) + (l1 + l3)) then _mm512_reduce_add_ps order, for 16 lanes
  // tinyBLAS's _mm512_reduce_add_ps.
  void (*reduce_lanes)(const float* acc, int64_t n_lanes, int64_t d, float* out);
  // ggml_vec_dot_q8_0_q8_0 (its AVX2 form, which ggml's x86 builds run) of a Q8_0 weight row and
  // a Q8_0 activation row of n elements (n % 32 == 0; blocks of an f16 d and 32 int8): per block
  // b, s = f32(dw_b) * f32(da_b) and 8 exact int32 lanes P[l] = the sum of the products of
  // elements 4l .. 4l + 3; acc[l] = fma(s, float(P[l]), acc[l]); the result is
  // ((acc4 + acc0) + (acc6 + acc2)) + ((acc5 + acc1) + (acc7 + acc3)).
  float (*q8_0_dot_ggml)(const void* w, const void* a, int64_t n);
};

// Fill the slots a level accelerates (defined in kernels/cpu/ops_<level>.cc); slots left
// untouched keep the lower level's function. A level's function may itself use its instruction
// set: call it only on a CPU that has it.
void FillOpKernelsScalar(OpKernels* k);
void FillOpKernelsAvx2(OpKernels* k);
void FillOpKernelsAvx512(OpKernels* k);

}  // namespace kiln::cpu
