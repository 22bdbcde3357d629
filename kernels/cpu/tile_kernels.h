// Rows x tokens ("tile") quantized dot kernels: QuantKernels::vec_dot_tile (lib/quant/quant.h)
// for the types that have one. Registered in lib/quant/legacy.cc.
//
// Contract (as VecDotTileFn): out[t * out_stride + r] = vec_dot(n, w + r * w_stride,
// a + t * a_stride) bit for bit, r < n_rows, t < n_tokens; n a multiple of 32; activation values
// in [-127, 127] (what the Q8_0 quantizers produce). Thread-safe (per-thread scratch). Only call
// on CPUs with the instruction set of the kernel's suffix (the registry guarantees it).
#pragma once

#include <cstddef>
#include <cstdint>

namespace kiln::quant {

// Q8_0 weights x Q8_0 activations; the same bits as VecDotQ8_0Q8_0Avx2 (the Q8_0 vec_dot at the
// AVX2 and AVX-512 levels). AVX-512 F/BW/VNNI (kernels/cpu/tile_q8_0_avx512.cc, which holds every
// kernel for Q8_0 activations).
void VecDotTileQ8_0Q8_0Avx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                              size_t a_stride, int n_tokens, float* out, size_t out_stride);

// Q4_0 weights x Q8_0 activations; the same bits as VecDotQ4_0Q8_0Avx512 (same file).
void VecDotTileQ4_0Q8_0Avx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                              size_t a_stride, int n_tokens, float* out, size_t out_stride);

// Q5_0 weights x Q8_0 activations; the same bits as VecDotQ5_0Q8_0Avx512 (same file).
void VecDotTileQ5_0Q8_0Avx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                              size_t a_stride, int n_tokens, float* out, size_t out_stride);

// The same with AVX2 (no VNNI); the same bits as VecDotQ5_0Q8_0Avx2 (which equals the AVX-512
// vec_dot). AVX2, FMA, F16C (kernels/cpu/tile_q5_0_avx2.cc).
void VecDotTileQ5_0Q8_0Avx2(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                            size_t a_stride, int n_tokens, float* out, size_t out_stride);

// Q4_1 weights x Q8_1 activations; the same bits as VecDotQ4_1Q8_1Avx512 (ggml's x86 order:
// one 8-lane chain and one mins chain per (row, token)). Activation rows as the Q8_1 quantizers
// produce them (any int8 qs is exact here). AVX-512 F/BW/VL/VNNI, F16C
// (kernels/cpu/tile_q4_1_avx512.cc).
void VecDotTileQ4_1Q8_1Avx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                              size_t a_stride, int n_tokens, float* out, size_t out_stride);

}  // namespace kiln::quant
