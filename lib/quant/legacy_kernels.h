// Scalar references of the float types (F32, F16, BF16) and the legacy 32-element block quants
// (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1). Internal to lib/quant; everyone else reaches these through
// GetQuantKernels() (quant.h). Block layouts, the accumulation orders and the SIMD kernels:
// kernels/cpu/legacy.h (included here).
//
// Contract (same as quant.h): n is a multiple of the type's block size (32 for the quants, 1 for
// the float types); pointers are valid for the row's bytes; no alignment is required. Pure and
// thread-safe.
#pragma once

#include <cstdint>

#include "kernels/cpu/legacy.h"

namespace kiln::quant {

// --- Scalar references (lib/quant/legacy_ref.cc). Quantize: x [n] -> n/32 blocks.
void QuantizeRowQ4_0Ref(const float* x, void* y, int64_t n);
void QuantizeRowQ4_1Ref(const float* x, void* y, int64_t n);
void QuantizeRowQ5_0Ref(const float* x, void* y, int64_t n);
void QuantizeRowQ5_1Ref(const float* x, void* y, int64_t n);
void QuantizeRowQ8_0Ref(const float* x, void* y, int64_t n);
void QuantizeRowQ8_1Ref(const float* x, void* y, int64_t n);
// Dequantize: n/32 blocks -> y [n]. _1 types compute q * d + m as a product, then a sum (no FMA).
void DequantizeRowQ4_0Ref(const void* x, float* y, int64_t n);
void DequantizeRowQ4_1Ref(const void* x, float* y, int64_t n);
void DequantizeRowQ5_0Ref(const void* x, float* y, int64_t n);
void DequantizeRowQ5_1Ref(const void* x, float* y, int64_t n);
void DequantizeRowQ8_0Ref(const void* x, float* y, int64_t n);
void DequantizeRowQ8_1Ref(const void* x, float* y, int64_t n);
// Dots: w [n/32 blocks of the weight type] · a [n/32 blocks of the activation type].
float VecDotQ4_0Q8_0Ref(int64_t n, const void* w, const void* a);
float VecDotQ4_1Q8_1Ref(int64_t n, const void* w, const void* a);
float VecDotQ5_0Q8_0Ref(int64_t n, const void* w, const void* a);
float VecDotQ5_1Q8_1Ref(int64_t n, const void* w, const void* a);
float VecDotQ8_0Q8_0Ref(int64_t n, const void* w, const void* a);
float VecDotQ8_1Q8_1Ref(int64_t n, const void* w, const void* a);

// --- Float types (lib/quant/float_types.cc). F16/BF16 quantizers round to nearest even (NaN
// stays NaN).
void QuantizeRowF32Ref(const float* x, void* y, int64_t n);
void DequantizeRowF32Ref(const void* x, float* y, int64_t n);
void QuantizeRowF16Ref(const float* x, void* y, int64_t n);
void DequantizeRowF16Ref(const void* x, float* y, int64_t n);
void QuantizeRowBf16Ref(const float* x, void* y, int64_t n);
void DequantizeRowBf16Ref(const void* x, float* y, int64_t n);
float VecDotF32F32Ref(int64_t n, const void* w, const void* a);
float VecDotF16F32Ref(int64_t n, const void* w, const void* a);
float VecDotBf16F32Ref(int64_t n, const void* w, const void* a);
// The plain rows x tokens tiles of F32, F16 and BF16 weights (VecDotTileFn): the Ref vec_dot of
// every (row, token) pair; what the AVX2 and AVX-512 tiles (kernels/cpu/legacy.h) are checked
// against.
void VecDotTileF32F32Ref(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                         size_t a_stride, int n_tokens, float* out, size_t out_stride);
void VecDotTileF16F32Ref(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                         size_t a_stride, int n_tokens, float* out, size_t out_stride);
void VecDotTileBf16F32Ref(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                          size_t a_stride, int n_tokens, float* out, size_t out_stride);

}  // namespace kiln::quant
