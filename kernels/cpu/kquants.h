// K-quant tensor types (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K weights; Q8_K activations): block layouts,
// scale (un)packing, the dot-product contract every level follows and the SIMD row kernels of
// kernels/cpu. The scalar references (whose integer formulas the contract names) are in
// lib/quant/kquants.h; the engine reaches the kernels through GetQuantKernels()
// (lib/quant/quant.h).
//
// Layouts follow ggml exactly (GGUF_FACTS.md §2.7): a super-block holds QK_K = 256 elements.
//
// Dot-product contract (all levels, all K-quant weight types). For a weight row w and a Q8_K
// activation row a of n elements (n % 256 == 0), super-block i = 0 .. n/256-1 in order:
//   isum_i = exact int32 sum of the type's integer formula (VecDot*Scalar, lib/quant/kquants.h),
//   msum_i = exact int32 "min" sum (types with dmin; 0 otherwise),
//   d_i    = a.d * f16(w.d),  dmin_i = a.d * f16(w.dmin)       (float products)
//   acc    = acc + (d_i * (float)isum_i - dmin_i * (float)msum_i)   (float, acc starts at 0)
// with every float operation rounded separately (no FMA contraction; the files are compiled with
// -ffp-contract=off). Integer sums are exact in every order, so every level returns the SAME
// float bits: the result is a pure function of (n, w, a). A batched kernel reproduces vec_dot
// bit for bit by computing the same integers and the same per-super-block float sequence.
// The integer formulas read a.bsums wherever they need group sums of a.qs (Q2_K..Q6_K), so the
// result is identical across levels even for a row whose bsums are inconsistent with its qs.
#pragma once

#include <cstddef>
#include <cstdint>

#include "lib/common/half.h"

namespace kiln::kquants {

inline constexpr int kQK = 256;         // elements per super-block
inline constexpr int kScaleBytes = 12;  // packed 6-bit scales of Q3_K/Q4_K/Q5_K

#pragma pack(push, 1)
// Q2_K: 16 sub-blocks x 16; value = d*(scales[g]&15)*q2 - dmin*(scales[g]>>4), q2 in 0..3.
struct BlockQ2K {
  uint8_t scales[16];  // low nibble: scale, high nibble: min
  uint8_t qs[64];      // 2-bit quants, element 128n+32j+l in bits 2j of qs[32n+l]
  uint16_t d;          // f16
  uint16_t dmin;       // f16
};
// Q3_K: 16 sub-blocks x 16; value = d*(s[g]-32)*q3, q3 = q2 - (hbit ? 0 : 4) in -4..3.
struct BlockQ3K {
  uint8_t hmask[32];   // high bit of element 128n+32j+l: bit 4n+j of hmask[l]
  uint8_t qs[64];      // low 2 bits, same placement as Q2_K
  uint8_t scales[12];  // 16 x 6-bit scales s[g] (see UnpackQ3KScales)
  uint16_t d;          // f16
};
// Q4_K: 8 sub-blocks x 32; value = d*sc[j]*q4 - dmin*m[j], q4 in 0..15.
struct BlockQ4K {
  uint16_t d;          // f16
  uint16_t dmin;       // f16
  uint8_t scales[12];  // 8 x 6-bit scales + 8 x 6-bit mins (see UnpackQ4KScales)
  uint8_t qs[128];     // element 64c+l: low nibble of qs[32c+l]; 64c+32+l: high nibble
};
// Q5_K: Q4_K plus a fifth bit: bit j of qh[l] for element 32j+l; q5 in 0..31.
struct BlockQ5K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
// Q6_K: 16 sub-blocks x 16; value = d*scales[g]*(q6-32), q6 in 0..63 (see DecodeQ6K in .cc).
struct BlockQ6K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;  // f16
};
// Q8_K: activation format; value = d*qs[e]; bsums[g] = sum of qs[16g .. 16g+15].
struct BlockQ8K {
  float d;
  int8_t qs[256];
  int16_t bsums[16];
};
#pragma pack(pop)

static_assert(sizeof(BlockQ2K) == 84);
static_assert(sizeof(BlockQ3K) == 110);
static_assert(sizeof(BlockQ4K) == 144);
static_assert(sizeof(BlockQ5K) == 176);
static_assert(sizeof(BlockQ6K) == 210);
static_assert(sizeof(BlockQ8K) == 292);

// The helpers below are `static inline` on purpose: this header is included by translation
// units compiled with different instruction sets (kernels/cpu/kquants_avx*.cc), and an
// out-of-line copy of an ordinary inline function could be shared by the linker between them,
// running AVX-512 code on a CPU without it.

// Unpacks the 12 scale bytes of Q4_K/Q5_K into sc[0..7] and m[0..7] (each 0..63):
// bytes 0-3: low 6 bits sc0..3, top 2 bits = bits 4-5 of sc4..7; bytes 4-7: same for m;
// bytes 8-11: low nibble = bits 0-3 of sc4..7, high nibble = bits 0-3 of m4..7.
static inline void UnpackQ4KScales(const uint8_t* q, uint8_t* sc, uint8_t* m) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = q[j] & 63;
    m[j] = q[j + 4] & 63;
    sc[j + 4] = static_cast<uint8_t>((q[j + 8] & 0x0F) | ((q[j] >> 6) << 4));
    m[j + 4] = static_cast<uint8_t>((q[j + 8] >> 4) | ((q[j + 4] >> 6) << 4));
  }
}
// Inverse of UnpackQ4KScales; sc[j], m[j] must be < 64.
static inline void PackQ4KScales(const uint8_t* sc, const uint8_t* m, uint8_t* q) {
  for (int j = 0; j < 4; ++j) {
    q[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    q[j + 4] = static_cast<uint8_t>(m[j] | ((m[j + 4] >> 4) << 6));
    q[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0x0F) | ((m[j + 4] & 0x0F) << 4));
  }
}

// Unpacks the 12 scale bytes of Q3_K into the signed scales s[g] - 32 (g = 0..15, -32..31).
// For i = 0..3: s[i] = b[i]&15 | (b[8+i]&3)<<4; s[4+i] = b[4+i]&15 | ((b[8+i]>>2)&3)<<4;
// s[8+i] = b[i]>>4 | ((b[8+i]>>4)&3)<<4; s[12+i] = b[4+i]>>4 | ((b[8+i]>>6)&3)<<4.
static inline void UnpackQ3KScales(const uint8_t* b, int8_t* s) {
  for (int i = 0; i < 4; ++i) {
    s[i] = static_cast<int8_t>(((b[i] & 15) | ((b[8 + i] & 3) << 4)) - 32);
    s[4 + i] = static_cast<int8_t>(((b[4 + i] & 15) | (((b[8 + i] >> 2) & 3) << 4)) - 32);
    s[8 + i] = static_cast<int8_t>(((b[i] >> 4) | (((b[8 + i] >> 4) & 3) << 4)) - 32);
    s[12 + i] = static_cast<int8_t>(((b[4 + i] >> 4) | (((b[8 + i] >> 6) & 3) << 4)) - 32);
  }
}
// Inverse of UnpackQ3KScales; s[g] in -32..31.
static inline void PackQ3KScales(const int8_t* s, uint8_t* b) {
  for (int i = 0; i < 4; ++i) {
    const int s0 = s[i] + 32, s1 = s[4 + i] + 32, s2 = s[8 + i] + 32, s3 = s[12 + i] + 32;
    b[i] = static_cast<uint8_t>((s0 & 15) | ((s2 & 15) << 4));
    b[4 + i] = static_cast<uint8_t>((s1 & 15) | ((s3 & 15) << 4));
    b[8 + i] =
        static_cast<uint8_t>((s0 >> 4) | ((s1 >> 4) << 2) | ((s2 >> 4) << 4) | ((s3 >> 4) << 6));
  }
}

// ggml's nearest_int: round half to even for |f| <= 2^22 (the magic-number trick).
static inline int NearestInt(float f) {
  const float v = f + 12582912.0f;
  const uint32_t bits = Fp32ToBits(v);
  return static_cast<int>(bits & 0x007FFFFF) - 0x00400000;
}

// The per-super-block float step of the contract above (kept in one place).
static inline float AccumulateSuperBlock(float acc, float d, int32_t isum, float dmin,
                                         int32_t msum) {
  const float t_scale = d * static_cast<float>(isum);
  const float t_min = dmin * static_cast<float>(msum);
  return acc + (t_scale - t_min);
}

// The interleaved copy of a Q4_K / Q5_K / Q6_K matrix (written by the CPU backend after load,
// lib/quant/interleave.h), read by the AVX-512 kernels: the rows in groups of 16
// (quant::kInterleaveRows), each group four quads of 4 rows whose super-blocks are interleaved,
// quad-major, then super-block i, then row r % 4, the blocks byte for byte the file's. A group is
// 16 rows' bytes; rows past the matrix's last one are zero. Why: the one-token kernels take four
// rows a pass, and the file's four rows are four streams, which one core fetches from memory
// 15-25% slower than the quad's one (bench/cpu_ops_bench --stream).
inline constexpr int kQuadRows = 4;
// Rows [n_rows] of n_in elements (w_stride bytes apart) -> out, ceil(n_rows / 16) groups.
void InterleaveQuadsQ4K(const void* w, size_t w_stride, int64_t n_in, int64_t n_rows, void* out);
void InterleaveQuadsQ5K(const void* w, size_t w_stride, int64_t n_in, int64_t n_rows, void* out);
void InterleaveQuadsQ6K(const void* w, size_t w_stride, int64_t n_in, int64_t n_rows, void* out);
size_t QuadGroupBytesQ4K(int64_t n_in);
size_t QuadGroupBytesQ5K(int64_t n_in);
size_t QuadGroupBytesQ6K(int64_t n_in);
// Row `row` of the copy at `groups` back in the file's layout (n_in / 256 blocks at out).
void QuadRowQ4K(const void* groups, int64_t n_in, int64_t row, void* out);
void QuadRowQ5K(const void* groups, int64_t n_in, int64_t row, void* out);
void QuadRowQ6K(const void* groups, int64_t n_in, int64_t row, void* out);

#if defined(__x86_64__) || defined(_M_X64)
#define KILN_KQUANTS_X86 1
// --- AVX2+FMA+F16C (kernels/cpu/kquants_avx2.cc): same results as the scalar kernels, bit for
// bit (dequantize, Q8_K quantize and vec_dot).
void QuantizeRowQ8KAvx2(const float* x, void* y, int64_t n);
void DequantizeRowQ2KAvx2(const void* x, float* y, int64_t n);
void DequantizeRowQ3KAvx2(const void* x, float* y, int64_t n);
void DequantizeRowQ4KAvx2(const void* x, float* y, int64_t n);
void DequantizeRowQ5KAvx2(const void* x, float* y, int64_t n);
void DequantizeRowQ6KAvx2(const void* x, float* y, int64_t n);
float VecDotQ2KAvx2(int64_t n, const void* w, const void* a);
float VecDotQ3KAvx2(int64_t n, const void* w, const void* a);
float VecDotQ4KAvx2(int64_t n, const void* w, const void* a);
float VecDotQ5KAvx2(int64_t n, const void* w, const void* a);
float VecDotQ6KAvx2(int64_t n, const void* w, const void* a);
float VecDotQ8KAvx2(int64_t n, const void* w, const void* a);
// vec_dot_tile (quant.h VecDotTileFn) of Q4_K/Q5_K/Q6_K: every output the vec_dot's bits.
void VecDotTileQ4KAvx2(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                       size_t a_stride, int n_tokens, float* out, size_t out_stride);
void VecDotTileQ5KAvx2(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                       size_t a_stride, int n_tokens, float* out, size_t out_stride);
void VecDotTileQ6KAvx2(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                       size_t a_stride, int n_tokens, float* out, size_t out_stride);

// --- AVX-512 F/BW/VL + VNNI (kernels/cpu/kquants_avx512.cc): same results, bit for bit.
// Dequantize has no AVX-512 path (falls back to AVX2; it is not on the decode hot path).
void QuantizeRowQ8KAvx512(const float* x, void* y, int64_t n);
float VecDotQ2KAvx512(int64_t n, const void* w, const void* a);
float VecDotQ3KAvx512(int64_t n, const void* w, const void* a);
float VecDotQ4KAvx512(int64_t n, const void* w, const void* a);
float VecDotQ5KAvx512(int64_t n, const void* w, const void* a);
float VecDotQ6KAvx512(int64_t n, const void* w, const void* a);
float VecDotQ8KAvx512(int64_t n, const void* w, const void* a);
// vec_dot_tile (quant.h VecDotTileFn) of Q4_K/Q5_K/Q6_K: every output the vec_dot's bits.
void VecDotTileQ4KAvx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                         size_t a_stride, int n_tokens, float* out, size_t out_stride);
void VecDotTileQ5KAvx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                         size_t a_stride, int n_tokens, float* out, size_t out_stride);
void VecDotTileQ6KAvx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                         size_t a_stride, int n_tokens, float* out, size_t out_stride);
// The same on the interleaved copy (quant.h InterleavedTileFn; groups: the copy from row 0 of
// the tile, a multiple of 16): every output the vec_dot's bits.
void QuadTileQ4KAvx512(int64_t n, const void* groups, int n_rows, const void* a, size_t a_stride,
                       int n_tokens, float* out, size_t out_stride);
void QuadTileQ5KAvx512(int64_t n, const void* groups, int n_rows, const void* a, size_t a_stride,
                       int n_tokens, float* out, size_t out_stride);
void QuadTileQ6KAvx512(int64_t n, const void* groups, int n_rows, const void* a, size_t a_stride,
                       int n_tokens, float* out, size_t out_stride);
#endif

}  // namespace kiln::kquants
