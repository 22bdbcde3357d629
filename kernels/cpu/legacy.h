// The float types (F32, F16, BF16) and the legacy 32-element block quants (Q4_0, Q4_1, Q5_0, Q5_1,
// Q8_0, Q8_1): block layouts, the arithmetic every level's kernels follow, and the SIMD kernels of
// kernels/cpu. The scalar references are in kernels/cpu/legacy.h; everyone else reaches
// the kernels through GetQuantKernels() (lib/quant/quant.h).
//
// Contract (same as quant.h): n is a multiple of the type's block size (32 for the quants, 1 for
// the float types); pointers are valid for the row's bytes; no alignment is required (blocks are
// read through byte pointers). All functions are pure and thread-safe. The SIMD variants must only
// be called on CPUs that have their instruction set (the registry guarantees it).
//
// Pairings (weight type -> activation type, the QuantKernels::vec_dot_type):
//   F32 -> F32, F16 -> F32, BF16 -> F32 (the weight is widened exactly on the fly; activations stay
//   F32, so these dots lose nothing to activation rounding; the weight bytes, not the arithmetic,
//   bound the speed), Q4_0/Q5_0/Q8_0 -> Q8_0, Q4_1/Q5_1/Q8_1 -> Q8_1.
//
// Quantizers are bit-exact with ggml's reference quantizers (GGUF_FACTS.md §2): d and m are rounded
// to f16 only when stored; the quantized values are computed with the unrounded float d. The SIMD
// activation quantizers (Q8_0, Q8_1) produce the same bytes as the scalar ones.
//
// Dot-product accumulation order (all results are a pure function of (n, w, a), the same bits at
// every level: the scalar references compute it too):
//   Quants: for each block b, 4 int32 lanes P_b[l] = exact Σ of qw*qa over the elements j of the
//     block with j % 16 in 4l..4l+3 (l = 0..3); s_b = dw_b * da_b (float product);
//     acc[b % 4][l] = fma(s_b, float(P_b[l]), acc[b % 4][l]).
//     Q5_1 (the _1 weight type with a min) also keeps four scalar chains mins[b % 4] +=
//     mw_b * sa_b (product rounded, then added). End: v[l] = (acc[0][l] + acc[2][l]) +
//     (acc[1][l] + acc[3][l]); v2[i] = v[i] + v[i + 2]; r = v2[0] + v2[1]; then r += (mins[0] +
//     mins[2]) + (mins[1] + mins[3]). (Missing blocks of a last partial group of 4 may be treated
//     as zero blocks: they add exact zeros, and an accumulator that starts at +0 never becomes -0,
//     so the bits are the same.)
//   Exception, Q4_1 x Q8_1 (every level): ggml's x86 order, so that kiln reproduces llama.cpp's
//     results bit for bit on Q4_1 models (see lib/quant/activation.h for why the last bit
//     matters): per block b, 8 int32 lanes P_b[l] = exact Σ qw*qa over elements 4l..4l+3
//     (l = 0..7, elements 0..15 from the low nibbles, 16..31 from the high ones);
//     s_b = dw_b * da_b; acc[l] = fma(s_b, float(P_b[l]), acc[l]); one scalar chain
//     mins = fma(mw_b, sa_b, mins). End: ((acc4 + acc0) + (acc6 + acc2)) + ((acc5 + acc1) +
//     (acc7 + acc3)), then + mins (ggml's hsum_float_8(acc) + summs).
//   Float types (F32, F16, BF16 weights x F32 activations; weights widened exactly): 64 lanes,
//     element i into lane i % 64: acc[i % 64] = fma(w_i, a_i, acc[i % 64]). End:
//     v[l] = (acc[l] + acc[16 + l]) + (acc[32 + l] + acc[48 + l]) (l < 16), then halving:
//     v8[l] = v[l] + v[8 + l], v4[l] = v8[l] + v8[4 + l], v2[l] = v4[l] + v4[2 + l],
//     r = v2[0] + v2[1] (lanes past n are zeros, which change nothing).
//   A batched kernel (several rows or columns at once) reproduces vec_dot bit-for-bit by following
//   exactly these steps for each (row, column) pair.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "lib/common/half.h"

namespace kiln::quant {

inline constexpr int kQK = 32;  // elements per legacy block

// Block layouts (packed, byte-aligned; f16 fields as raw little-endian bytes).
struct BlockQ4_0 {  // 18 B: element j = ((qs[j] & 15) - 8) * d, j+16 = ((qs[j] >> 4) - 8) * d
  uint8_t d[2];     // f16
  uint8_t qs[kQK / 2];
};
struct BlockQ4_1 {  // 20 B: element j = (qs[j] & 15) * d + m, j+16 = (qs[j] >> 4) * d + m
  uint8_t d[2];     // f16
  uint8_t m[2];     // f16
  uint8_t qs[kQK / 2];
};
struct BlockQ5_0 {  // 22 B: 5-bit q = low nibble | bit j of qh (LE u32) << 4; value (q - 16) * d
  uint8_t d[2];
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
struct BlockQ5_1 {  // 24 B: value q * d + m with q as in Q5_0
  uint8_t d[2];
  uint8_t m[2];
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
struct BlockQ8_0 {  // 34 B: element j = qs[j] * d
  uint8_t d[2];
  int8_t qs[kQK];
};
struct BlockQ8_1 {  // 36 B: element j = qs[j] * d; s = f16(d * Σ qs) for the min term of _1 dots
  uint8_t d[2];
  uint8_t s[2];
  int8_t qs[kQK];
};
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34 && sizeof(BlockQ8_1) == 36);

// `static inline` as in half.h: the SIMD translation units include this header, and an
// out-of-line copy with external linkage compiled there could serve every caller.
static inline float LoadHalf(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return Fp16ToFp32(h);
}
static inline void StoreHalf(uint8_t* p, float f) {
  const uint16_t h = Fp32ToFp16(f);
  std::memcpy(p, &h, 2);
}

// --- AVX2 + FMA + F16C (kernels/cpu/legacy_avx2.cc). Same signatures and results as the scalar
// references (kernels/cpu/legacy.h) for quantize/dequantize; dots follow the SIMD order documented
// at the top of this file.
void QuantizeRowQ8_0Avx2(const float* x, void* y, int64_t n);
void QuantizeRowQ8_1Avx2(const float* x, void* y, int64_t n);
void DequantizeRowQ4_0Avx2(const void* x, float* y, int64_t n);
void DequantizeRowQ4_1Avx2(const void* x, float* y, int64_t n);
void DequantizeRowQ5_0Avx2(const void* x, float* y, int64_t n);
void DequantizeRowQ5_1Avx2(const void* x, float* y, int64_t n);
void DequantizeRowQ8_0Avx2(const void* x, float* y, int64_t n);
void DequantizeRowQ8_1Avx2(const void* x, float* y, int64_t n);
float VecDotQ4_0Q8_0Avx2(int64_t n, const void* w, const void* a);
float VecDotQ4_1Q8_1Avx2(int64_t n, const void* w, const void* a);
float VecDotQ5_0Q8_0Avx2(int64_t n, const void* w, const void* a);
float VecDotQ5_1Q8_1Avx2(int64_t n, const void* w, const void* a);
float VecDotQ8_0Q8_0Avx2(int64_t n, const void* w, const void* a);
float VecDotQ8_1Q8_1Avx2(int64_t n, const void* w, const void* a);

// --- AVX-512 F/BW/VL + VNNI (kernels/cpu/legacy_avx512.cc). Dequantize falls back to AVX2, and
// so do the Q8_0 / Q8_1 weight dots: a 4-block-group AVX-512 version measured slower than the
// AVX2 kernel on Zen 4 (both give the same bits by design, so the choice is free).
void QuantizeRowQ8_0Avx512(const float* x, void* y, int64_t n);
void QuantizeRowQ8_1Avx512(const float* x, void* y, int64_t n);
float VecDotQ4_0Q8_0Avx512(int64_t n, const void* w, const void* a);
float VecDotQ4_1Q8_1Avx512(int64_t n, const void* w, const void* a);
float VecDotQ5_0Q8_0Avx512(int64_t n, const void* w, const void* a);
float VecDotQ5_1Q8_1Avx512(int64_t n, const void* w, const void* a);

// Multi-row dots: out[r] = VecDot...Avx512(n, w + r * w_stride, a) bit for bit, r < n_rows
// (n_rows >= 0); each activation group is loaded once for up to 4 rows.
void VecDotRowsQ4_0Q8_0Avx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                              float* out);
void VecDotRowsQ4_1Q8_1Avx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                              float* out);
void VecDotRowsQ5_0Q8_0Avx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                              float* out);
void VecDotRowsQ5_1Q8_1Avx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                              float* out);
// Q8_0 weights: the same bits as VecDotQ8_0Q8_0Avx2 (the single-row Q8_0 dot at every SIMD level).
void VecDotRowsQ8_0Q8_0Avx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                              float* out);

// --- Float types (scalar references in lib/quant/float_types.cc): SIMD in
// kernels/cpu/float_avx2.cc and kernels/cpu/float_avx512.cc. F16/BF16 quantizers round to nearest
// even (NaN stays NaN; the payload of a NaN is not preserved bit-exactly across levels).
void QuantizeRowF16Avx2(const float* x, void* y, int64_t n);
void DequantizeRowF16Avx2(const void* x, float* y, int64_t n);
void QuantizeRowBf16Avx2(const float* x, void* y, int64_t n);
void DequantizeRowBf16Avx2(const void* x, float* y, int64_t n);
float VecDotF32F32Avx2(int64_t n, const void* w, const void* a);
float VecDotF16F32Avx2(int64_t n, const void* w, const void* a);
float VecDotBf16F32Avx2(int64_t n, const void* w, const void* a);

float VecDotF32F32Avx512(int64_t n, const void* w, const void* a);
float VecDotF16F32Avx512(int64_t n, const void* w, const void* a);
float VecDotBf16F32Avx512(int64_t n, const void* w, const void* a);

// Rows x tokens tiles (QuantKernels::vec_dot_tile) of F32, F16 and BF16 weights x F32 activations:
// out[t * out_stride + r] = the same level's vec_dot of weight row r and activation row t, bit
// for bit (the dot order above, per pair); register tiles of several rows and tokens, each
// accumulator lane group in turn, when n % 64 == 0; vec_dot per pair otherwise. The scalar
// references are VecDotTileF32F32Ref, VecDotTileF16F32Ref and VecDotTileBf16F32Ref
// (lib/quant/float_types.cc): the scalar vec_dot per pair.
void VecDotTileF32F32Avx2(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                          size_t a_stride, int n_tokens, float* out, size_t out_stride);
void VecDotTileF16F32Avx2(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                          size_t a_stride, int n_tokens, float* out, size_t out_stride);
void VecDotTileBf16F32Avx2(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                           size_t a_stride, int n_tokens, float* out, size_t out_stride);
void VecDotTileF32F32Avx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                            size_t a_stride, int n_tokens, float* out, size_t out_stride);
void VecDotTileF16F32Avx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                            size_t a_stride, int n_tokens, float* out, size_t out_stride);
void VecDotTileBf16F32Avx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                             size_t a_stride, int n_tokens, float* out, size_t out_stride);

// --- MatMul's activation quantizers (rules: lib/quant/activation.h), AVX2 and AVX-512
// (kernels/cpu/activation_avx2.cc, activation_avx512.cc): the same bytes as the scalar ones.
void QuantizeActivationQ8_0Avx2(const float* x, void* y, int64_t n);
void QuantizeActivationQ8_1Avx2(const float* x, void* y, int64_t n);
void QuantizeActivationQ8_0Avx512(const float* x, void* y, int64_t n);
void QuantizeActivationQ8_1Avx512(const float* x, void* y, int64_t n);

}  // namespace kiln::quant
