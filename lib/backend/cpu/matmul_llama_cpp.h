// MatMul in llama.cpp's arithmetic for the weight types whose kiln kernels sum in their own order:
// F32, F16, Q8_0, Q4_0, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K (Q4_1's own kernels already sum in
// ggml's order). The llama.cpp order (Backend::set_llama_cpp_order)
// multiplies these with this; docs/numerics.md has the rules of the other ops and types.
//
// What ggml's x86 CPU backend (an AVX-512 build with llamafile) computes for y = W x, x of
// n_tokens rows (the number of columns of src1 in its mul_mat):
//   Q8_0: x quantized as ActivationQuantizer(Q8_0) (lib/quant/activation.h); per output, for each
//     block b, 8 int32 lanes P_b[l] = exact Σ qw*qa over elements 4l..4l+3, s_b = dw_b * da_b,
//     acc[l] = fma(s_b, float(P_b[l]), acc[l]); y = ((acc4 + acc0) + (acc6 + acc2)) + ((acc5 +
//     acc1) + (acc7 + acc3)) (ggml_vec_dot_q8_0_q8_0, and tinyBLAS_Q0_AVX, which sums the same
//     lanes in the same order: the same bits for any n_tokens).
//   Q5_0: as Q8_0 with the weights' values q - 16 (ggml_vec_dot_q5_0_q8_0; tinyBLAS alike).
//   Q4_0 with n_out % 8 != 0: as Q8_0 with the values q - 8 (ggml_vec_dot_q4_0_q8_0; tinyBLAS
//     alike). With n_out % 8 == 0 ggml repacks it (q4_0_8x8): per block the exact int32 sum isum
//     of the 32 products, acc = fma(float(isum), dw * da, acc), in its gemv and its 4-row gemm
//     alike (the gemm's activations round as ActivationQuantizer(Q8_0)): batch invariant.
//   Q5_1: x quantized as ActivationQuantizer(Q8_1); per block 8 int32 lanes P[l] (elements
//     4l..4l+3 of the codes 0..31), acc[l] = fma(float(P[l]), dw * da, acc[l]) and one chain
//     summs = fma(mw, sa, summs); y = hsum(acc) + summs (ggml_vec_dot_q5_1_q8_1, every batch).
//   Q4_K, Q6_K: x quantized to Q8_K as quantize_row_q8_K_ref; per super-block the exact integer
//     sums isum (scales x code products, Q6_K's -32 through the bsums) and msum (Q4_K: mins x
//     bsums), dw, dminw the weight's f16 scales, da the activation's:
//     Q4_K with n_out % 8 == 0 (ggml repacks it, 8x8 gemv/gemm): acc = fma(isum, dw * da, acc),
//       mins = fma(msum, dminw * da, mins), y = acc - mins, per super-block (gemv) or, for the
//       rows in whole groups of four (gemm), per pair of 32-element sub-blocks; those rows are
//       quantized with ggml_quantize_mat_q8_K_4x8's sign rule (+amax wins a tie with -amax);
//     otherwise n_tokens >= 8 (ggml's tiled kernels): Q6_K acc = fma(isum * dw, da, acc);
//       Q4_K and Q5_K acc = fma(fma(-msum, dminw, isum * dw), da, acc);
//     otherwise ggml_vec_dot_q4_K_q8_K / _q6_K (AVX2): 8 int32 lanes of 4-element product sums,
//       acc[l] = fma(da * dw, lane, acc[l]), summed as Q8_0's (plus Q4_K's 4 min lanes,
//       fma(-da * dminw, ..), summed ((m0 + m2) + (m1 + m3))).
//     Q5_K below 8 rows: ggml_vec_dot_q5_K_q8_K (AVX2): Q4_K's 8 lanes over the 5-bit codes,
//       acc[l] = fma(da * dw, lane, acc[l]), but one min chain summs = fma(-da * dminw,
//       float(msum), summs); y = hsum(acc) + summs. (ggml repacks Q5_K on ARM only.)
//     So Q4_K (unless repacked), Q5_K and Q6_K are, like llama.cpp, not batch invariant.
//   F32, F16 (x rounded to f16 first for F16 weights, as ggml converts src1 to the weight type):
//     tinyBLAS when n_tokens >= 2, n_out % 4 == 0 and n_in % 16 == 0: 16 FMA lanes
//     acc[l] = fma(w[16c + l], x[16c + l], acc[l]) over c in order, summed in
//     _mm512_reduce_add_ps order; otherwise ggml_vec_dot_f32 / _f16: 4 x 16 lanes over each 64
//     elements, ((L0 + L2) + (L1 + L3)) then _mm512_reduce_add_ps order, then the last
//     n_in % 64 products added one at a time, unfused (F32: to the float sum; F16: to a double,
//     as ggml_vec_dot_f16 does; both checked by the deepseek2 goldens, whose 32-element
//     attn_k_b rows are all tail).
//     So, like llama.cpp itself, these two types are not batch invariant.
//
// The same bits on every CPU. The float types use the attention kernels' dot (kernels.h
// kv_scores, SIMD on AVX-512); the quantized types are plain C++ (std::fma), slower than kiln's
// own kernels: the llama.cpp order is for checking kiln against llama.cpp, not for speed.
// Thread-safe; `scratch` must not be shared by concurrent calls.
#pragma once

#include <cstdint>

#include "lib/backend/cpu/ops.h"
#include "lib/backend/cpu/thread_pool.h"
#include "lib/backend/weight_view.h"
#include "lib/common/ggml_type.h"
#include "lib/common/status.h"

namespace kiln::cpu {

// Whether MatMulLlamaCpp handles weights of `type` (F32, F16, Q8_0, Q4_0, Q5_0, Q5_1, Q4_K, Q5_K,
// Q6_K).
bool HasLlamaCppMatMul(GgmlType type);

// y[r, o] = W[o, :] . x[rows[r], :] for r < n_rows (rows == nullptr: row r of x) in llama.cpp's
// arithmetic; n_rows is the batch llama.cpp's matmul would see. x: [*, w.n_in], y: [n_rows,
// w.n_out]. Errors: a type HasLlamaCppMatMul rejects, n_in not a multiple of the block size,
// null data, non-positive sizes.
absl::Status MatMulLlamaCpp(ThreadPool& pool, const WeightView& w, const float* x,
                            const int32_t* rows, int64_t n_rows, float* y, Scratch& scratch);

}  // namespace kiln::cpu
