// Inner loops of the CPU ops, one table per SIMD level (scalar here in kernels_scalar.cc; AVX2
// and AVX-512 in kernels/cpu/ops_avx2.cc and ops_avx512.cc, compiled with their own flags).
//
// This header is included by the SIMD translation units, so it must hold declarations only:
// no inline functions or templates (an inline function compiled with -mavx512f could be the
// copy the linker keeps for everyone).
//
// All functions are pure, thread-safe, and accept unaligned pointers. `n` counts floats.
#pragma once

#include <cstdint>

namespace kiln::cpu {

// Element type of a K or V row in the paged cache.
enum class KvElem : int32_t { kF32 = 0, kF16 = 1, kBf16 = 2 };

struct OpKernels {
  // y[i] = x[i] * w[i] / sqrt(mean(x^2) + eps). x and y may alias.
  void (*rms_norm)(const float* x, const float* w, int64_t n, float eps, float* y);
  // y[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)). y may alias gate or up.
  void (*swiglu)(const float* gate, const float* up, int64_t n, float* y);
  // y[i] = a[i] + b[i]. y may alias a or b.
  void (*add)(const float* a, const float* b, int64_t n, float* y);
  // max_i x[i] (n >= 1).
  float (*max)(const float* x, int64_t n);
  // y[i] = exp(x[i] - sub); returns the sum of y. x and y may alias.
  float (*exp_sum)(const float* x, float sub, int64_t n, float* y);
  // x[i] *= s.
  void (*scale)(float* x, float s, int64_t n);
  // RoPE NORM mode on n_rot floats: pairs (2i, 2i+1); cos_dup = {c0,c0,c1,c1,..},
  // sin_alt = {-s0,+s0,-s1,+s1,..}: y = x * cos_dup + swap_pairs(x) * sin_alt.
  void (*rope_pairs)(float* x, const float* cos_dup, const float* sin_alt, int64_t n_rot);
  // RoPE NEOX mode: pairs (i, i + half), cos/sin have `half` entries.
  void (*rope_halves)(float* x, const float* cos, const float* sin, int64_t half);
  // Attention scores of n_q query heads against n_rows consecutive K rows (row-major tile of
  // `elem`, d per row): scores[g * score_stride + j] = dot(q + g*d, k_rows + j*d), j < n_rows.
  void (*kv_scores)(const float* q, int64_t n_q, const void* k_rows, int64_t n_rows, KvElem elem,
                    int64_t d, float* scores, int64_t score_stride);
  // acc[g*d + i] += sum over j < n_rows, in increasing j, of p[g * p_stride + j] * v[j][i].
  void (*kv_accumulate)(float* acc, const float* p, int64_t p_stride, int64_t n_q,
                        const void* v_rows, int64_t n_rows, KvElem elem, int64_t d);
};

// Fill the slots a level accelerates (defined in kernels/cpu/ops_<level>.cc); slots left
// untouched keep the lower level's function.
void FillOpKernelsScalar(OpKernels* k);
void FillOpKernelsAvx2(OpKernels* k);
void FillOpKernelsAvx512(OpKernels* k);

}  // namespace kiln::cpu
