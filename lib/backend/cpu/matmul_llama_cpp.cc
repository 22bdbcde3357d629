#include "lib/backend/cpu/matmul_llama_cpp.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_format.h"
#include "kernels/cpu/kquants.h"
#include "kernels/cpu/legacy.h"
#include "lib/backend/cpu/dispatch.h"
#include "lib/common/half.h"
#include "lib/quant/activation.h"

namespace kiln::cpu {
namespace {

constexpr int64_t kQ8Block = 32;                // elements per Q8_0 block
constexpr size_t kQ8BlockBytes = 2 + kQ8Block;  // f16 d, 32 x int8
constexpr int64_t kRowsPerTask = 16;            // weight rows per parallel task
constexpr int64_t kQK = kquants::kQK;           // elements per K-quant super-block
// ggml takes its tiled K-quant kernels for batches of at least this many rows (and weights it
// did not repack).
constexpr int64_t kTiledMinRows = 8;

using kquants::BlockQ4K;
using kquants::BlockQ5K;
using kquants::BlockQ6K;
using kquants::BlockQ8K;

// hsum_float_8: ((x4 + x0) + (x6 + x2)) + ((x5 + x1) + (x7 + x3)).
float HsumFloat8(const float* x) {
  return ((x[4] + x[0]) + (x[6] + x[2])) + ((x[5] + x[1]) + (x[7] + x[3]));
}

// Byte k of kBit4OfByte[b] is 0x10 where bit k of b is set: Q5_0's fifth bits, 8 at a time.
constexpr auto kBit4OfByte = [] {
  std::array<uint64_t, 256> t{};
  for (int b = 0; b < 256; ++b) {
    for (int k = 0; k < 8; ++k) t[b] |= static_cast<uint64_t>((b >> k) & 1) << (8 * k + 4);
  }
  return t;
}();
constexpr uint64_t kEveryByte = 0x0101010101010101;

// Eight values v < 2 bias (bias 16 or 8; one per byte of v) as the int8 bytes v - bias: from the
// bias up that is v mod bias, below it v - bias + 256 = (v mod bias) | (256 - bias), the bit
// `bias` clear times (256 - bias) / bias (no carry between bytes).
uint64_t MinusBias(uint64_t v, uint64_t bias) {
  return (v & (bias - 1) * kEveryByte) | ((~v & bias * kEveryByte) * ((256 - bias) / bias));
}

// A Q5_0 weight row as the Q8_0 row of its values q - 16 (same d): ggml_vec_dot_q5_0_q8_0 is
// then op_kernels.h's q8_0_dot_ggml on it (the same scale product, the same lanes). Element j of
// a block is (qs[j] & 15) | bit j of qh << 4, element j + 16 (qs[j] >> 4) | bit j + 16 << 4.
void Q5_0RowAsQ8_0(const uint8_t* w, int64_t n_in, uint8_t* out) {
  for (int64_t b = 0; b < n_in / kQ8Block; ++b) {
    const auto* wb = reinterpret_cast<const quant::BlockQ5_0*>(w + b * sizeof(quant::BlockQ5_0));
    uint8_t* ob = out + b * kQ8BlockBytes;
    std::memcpy(ob, wb->d, 2);
    uint32_t qh;
    std::memcpy(&qh, wb->qh, 4);
    for (int j = 0; j < 16; j += 8) {
      uint64_t qs;
      std::memcpy(&qs, wb->qs + j, 8);
      const uint64_t lo = (qs & 15 * kEveryByte) | kBit4OfByte[(qh >> j) & 255];
      const uint64_t hi = ((qs >> 4) & 15 * kEveryByte) | kBit4OfByte[(qh >> (j + 16)) & 255];
      const uint64_t q_lo = MinusBias(lo, 16), q_hi = MinusBias(hi, 16);
      std::memcpy(ob + 2 + j, &q_lo, 8);
      std::memcpy(ob + 2 + 16 + j, &q_hi, 8);
    }
  }
}

// A Q4_0 weight row as the Q8_0 row of its values q - 8 (same d): ggml_vec_dot_q4_0_q8_0 and
// tinyBLAS_Q0_AVX are then op_kernels.h's q8_0_dot_ggml on it, as for Q5_0. Element j of a
// block is qs[j] & 15, element j + 16 qs[j] >> 4.
void Q4_0RowAsQ8_0(const uint8_t* w, int64_t n_in, uint8_t* out) {
  for (int64_t b = 0; b < n_in / kQ8Block; ++b) {
    const auto* wb = reinterpret_cast<const quant::BlockQ4_0*>(w + b * sizeof(quant::BlockQ4_0));
    uint8_t* ob = out + b * kQ8BlockBytes;
    std::memcpy(ob, wb->d, 2);
    for (int j = 0; j < 16; j += 8) {
      uint64_t qs;
      std::memcpy(&qs, wb->qs + j, 8);
      const uint64_t q_lo = MinusBias(qs & 15 * kEveryByte, 8);
      const uint64_t q_hi = MinusBias((qs >> 4) & 15 * kEveryByte, 8);
      std::memcpy(ob + 2 + j, &q_lo, 8);
      std::memcpy(ob + 2 + 16 + j, &q_hi, 8);
    }
  }
}

// Q4_0 repacked (ggml_gemv_q4_0_8x8_q8_0 / ggml_gemm_q4_0_8x8_q8_0, a matrix with n_out % 8 == 0;
// the gemm's 4x8 activation quantizer rounds as quantize_row_q8_0): per block the exact int32
// sum isum of the 32 products, acc = fma(float(isum), dw * da, acc). w: the row as Q8_0
// (Q4_0RowAsQ8_0), a: the Q8_0 activation row.
float DotQ4_0Repacked(int64_t n_in, const uint8_t* w, const uint8_t* a) {
  float acc = 0.0f;
  for (int64_t b = 0; b < n_in / kQ8Block; ++b, w += kQ8BlockBytes, a += kQ8BlockBytes) {
    uint16_t dw, da;
    std::memcpy(&dw, w, 2);
    std::memcpy(&da, a, 2);
    const auto* qw = reinterpret_cast<const int8_t*>(w + 2);
    const auto* qa = reinterpret_cast<const int8_t*>(a + 2);
    int32_t isum = 0;
    for (int e = 0; e < kQ8Block; ++e) isum += qw[e] * qa[e];
    acc = std::fma(static_cast<float>(isum), Fp16ToFp32(dw) * Fp16ToFp32(da), acc);
  }
  return acc;
}

// Q5_1, ggml_vec_dot_q5_1_q8_1 (AVX2 form; ggml has no other Q5_1 matmul on x86): per block,
// codes q in 0..31, 8 int32 lanes P[l] = exact Σ q·qa over elements 4l..4l+3;
// acc[l] = fma(float(P[l]), dw * da, acc[l]); summs = fma(mw, sa, summs) (GCC contracts
// `summs += m * s`); result hsum(acc) + summs. a: the Q8_1 activation row.
float DotQ5_1(int64_t n_in, const uint8_t* w, const uint8_t* a) {
  const auto* wb = reinterpret_cast<const quant::BlockQ5_1*>(w);
  const auto* ab = reinterpret_cast<const quant::BlockQ8_1*>(a);
  float acc[8] = {}, summs = 0.0f;
  for (int64_t b = 0; b < n_in / kQ8Block; ++b) {
    uint16_t dw, mw, da, sa;
    std::memcpy(&dw, wb[b].d, 2);
    std::memcpy(&mw, wb[b].m, 2);
    std::memcpy(&da, ab[b].d, 2);
    std::memcpy(&sa, ab[b].s, 2);
    summs = std::fma(Fp16ToFp32(mw), Fp16ToFp32(sa), summs);
    uint32_t qh;
    std::memcpy(&qh, wb[b].qh, 4);
    int32_t q[kQ8Block];
    for (int j = 0; j < 16; ++j) {
      q[j] = (wb[b].qs[j] & 15) | (((qh >> j) & 1) << 4);
      q[j + 16] = (wb[b].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
    }
    const float s = Fp16ToFp32(dw) * Fp16ToFp32(da);
    for (int l = 0; l < 8; ++l) {
      int32_t p = 0;
      for (int e = 4 * l; e < 4 * l + 4; ++e) p += q[e] * ab[b].qs[e];
      acc[l] = std::fma(static_cast<float>(p), s, acc[l]);
    }
  }
  return HsumFloat8(acc) + summs;
}

// ---- K-quants (Q8_K activations) --------------------------------------------------------------

// quantize_row_q8_K_ref: max = the first element of largest |x| (signed), iscale = -127 / max,
// q = min(127, round-half-even(iscale * x)), d = 1 / iscale, bsums = 16-element sums. With
// `positive_max_wins` the sign rule of ggml_quantize_mat_q8_K_4x8 (the activations of a repacked
// Q4_K matmul's groups of four rows): iscale = -127 / amax whenever some element equals +amax,
// 127 / amax otherwise (the two differ only when +amax and -amax both occur).
void QuantizeQ8K(const float* x, BlockQ8K* y, int64_t n, bool positive_max_wins) {
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    BlockQ8K& b = y[i];
    float amax = 0.0f, max = 0.0f;
    for (int e = 0; e < kQK; ++e) {
      if (std::fabs(x[e]) > amax) {
        amax = std::fabs(x[e]);
        max = x[e];
      }
    }
    if (amax == 0.0f) {
      b = BlockQ8K{};
      continue;
    }
    if (positive_max_wins) {
      max = -amax;
      for (int e = 0; e < kQK; ++e) {
        if (x[e] == amax) max = amax;
      }
    }
    const float iscale = -127.0f / max;
    for (int e = 0; e < kQK; ++e) {
      const int v = static_cast<int>(std::nearbyint(iscale * x[e]));
      b.qs[e] = static_cast<int8_t>(std::min(127, v));
    }
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int e = 16 * g; e < 16 * g + 16; ++e) sum += b.qs[e];
      b.bsums[g] = static_cast<int16_t>(sum);
    }
    b.d = 1.0f / iscale;
  }
}

// Q4_K super-block codes u[e] in 0..15 and its 6-bit scales and mins per 32 elements.
void DecodeQ4K(const BlockQ4K& b, uint8_t* u, uint8_t* sc, uint8_t* m) {
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      u[64 * c + l] = b.qs[32 * c + l] & 15;
      u[64 * c + 32 + l] = b.qs[32 * c + l] >> 4;
    }
  }
  kquants::UnpackQ4KScales(b.scales, sc, m);
}

// Q6_K super-block codes u[e] in 0..63 (value (u - 32) * scale).
void DecodeQ6K(const BlockQ6K& b, uint8_t* u) {
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = b.ql + 64 * h;
    const uint8_t* qh = b.qh + 32 * h;
    uint8_t* q = u + 128 * h;
    for (int l = 0; l < 32; ++l) {
      q[l] = static_cast<uint8_t>((ql[l] & 15) | ((qh[l] & 3) << 4));
      q[l + 32] = static_cast<uint8_t>((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4));
      q[l + 64] = static_cast<uint8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
      q[l + 96] = static_cast<uint8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
    }
  }
}

int32_t CodeDot(const uint8_t* u, const int8_t* a, int n) {
  int32_t s = 0;
  for (int e = 0; e < n; ++e) s += u[e] * a[e];
  return s;
}

// The exact integer sums of sub-blocks [j0, j1) of a Q4_K super-block (every ggml Q4_K kernel
// computes these): isum = Σ_j sc_j · Σ_{e in j} u_e a_e, msum = Σ_j m_j · (bsums_2j + bsums_2j+1).
void Q4KSums(const BlockQ4K& w, const BlockQ8K& a, int j0, int j1, int32_t* isum, int32_t* msum) {
  uint8_t u[kQK], sc[8], m[8];
  DecodeQ4K(w, u, sc, m);
  *isum = *msum = 0;
  for (int j = j0; j < j1; ++j) {
    *isum += sc[j] * CodeDot(u + 32 * j, a.qs + 32 * j, 32);
    *msum += m[j] * (a.bsums[2 * j] + a.bsums[2 * j + 1]);
  }
}
void Q4KSums(const BlockQ4K& w, const BlockQ8K& a, int32_t* isum, int32_t* msum) {
  Q4KSums(w, a, 0, 8, isum, msum);
}

// Q4_K, ggml_gemv_q4_K_8x8_q8_K (the repacked weights of a matrix with n_out % 8 == 0, rows not
// in a group of four): acc = fma(isum, dw * da, acc), mins = fma(msum, dminw * da, mins) per
// super-block; acc - mins.
float DotQ4KRepacked(int64_t n_in, const uint8_t* w, const uint8_t* a) {
  const auto* wb = reinterpret_cast<const BlockQ4K*>(w);
  const auto* ab = reinterpret_cast<const BlockQ8K*>(a);
  float acc = 0.0f, mins = 0.0f;
  for (int64_t i = 0; i < n_in / kQK; ++i) {
    int32_t isum, msum;
    Q4KSums(wb[i], ab[i], &isum, &msum);
    acc = std::fma(static_cast<float>(isum), Fp16ToFp32(wb[i].d) * ab[i].d, acc);
    mins = std::fma(static_cast<float>(msum), Fp16ToFp32(wb[i].dmin) * ab[i].d, mins);
  }
  return acc - mins;
}

// Q4_K, ggml_gemm_q4_K_8x8_q8_K (repacked, rows in groups of four): as the gemv but the two
// FMAs run per pair of 32-element sub-blocks, four times per super-block.
float DotQ4KRepackedGemm(int64_t n_in, const uint8_t* w, const uint8_t* a) {
  const auto* wb = reinterpret_cast<const BlockQ4K*>(w);
  const auto* ab = reinterpret_cast<const BlockQ8K*>(a);
  float acc = 0.0f, mins = 0.0f;
  for (int64_t i = 0; i < n_in / kQK; ++i) {
    const float d = Fp16ToFp32(wb[i].d) * ab[i].d, dmin = Fp16ToFp32(wb[i].dmin) * ab[i].d;
    for (int pair = 0; pair < 4; ++pair) {
      int32_t isum, msum;
      Q4KSums(wb[i], ab[i], 2 * pair, 2 * pair + 2, &isum, &msum);
      acc = std::fma(static_cast<float>(isum), d, acc);
      mins = std::fma(static_cast<float>(msum), dmin, mins);
    }
  }
  return acc - mins;
}

// Q4_K, ggml's tiled kernel (8 or more rows, weights not repacked): per super-block
// r = fma(-msum, dminw, isum * dw); acc = fma(r, da, acc).
float DotQ4KTiled(int64_t n_in, const uint8_t* w, const uint8_t* a) {
  const auto* wb = reinterpret_cast<const BlockQ4K*>(w);
  const auto* ab = reinterpret_cast<const BlockQ8K*>(a);
  float acc = 0.0f;
  for (int64_t i = 0; i < n_in / kQK; ++i) {
    int32_t isum, msum;
    Q4KSums(wb[i], ab[i], &isum, &msum);
    const float r = std::fma(-static_cast<float>(msum), Fp16ToFp32(wb[i].dmin),
                             static_cast<float>(isum) * Fp16ToFp32(wb[i].d));
    acc = std::fma(r, ab[i].d, acc);
  }
  return acc;
}

// Q4_K, ggml_vec_dot_q4_K_q8_K (AVX2 form; fewer than 8 rows, weights not repacked): 8 int32
// lanes, lane l = Σ_j sc_j · Σ of the products of elements 4l..4l+3 of sub-block j;
// acc[l] = fma(dw * da, lane, acc[l]); 4 min lanes k = m_2k bs32_2k + m_2k+1 bs32_2k+1,
// mins[k] = fma(-da * dminw, lane, mins[k]); result hsum(acc) + ((mins0 + mins2) + (mins1 +
// mins3)).
float DotQ4KVec(int64_t n_in, const uint8_t* w, const uint8_t* a) {
  const auto* wb = reinterpret_cast<const BlockQ4K*>(w);
  const auto* ab = reinterpret_cast<const BlockQ8K*>(a);
  float acc[8] = {}, mins[4] = {};
  for (int64_t i = 0; i < n_in / kQK; ++i) {
    uint8_t u[kQK], sc[8], m[8];
    DecodeQ4K(wb[i], u, sc, m);
    const float d = ab[i].d * Fp16ToFp32(wb[i].d);
    const float dmin = -ab[i].d * Fp16ToFp32(wb[i].dmin);
    for (int k = 0; k < 4; ++k) {
      const int32_t lane = m[2 * k] * (ab[i].bsums[4 * k] + ab[i].bsums[4 * k + 1]) +
                           m[2 * k + 1] * (ab[i].bsums[4 * k + 2] + ab[i].bsums[4 * k + 3]);
      mins[k] = std::fma(dmin, static_cast<float>(lane), mins[k]);
    }
    for (int l = 0; l < 8; ++l) {
      int32_t lane = 0;
      for (int j = 0; j < 8; ++j)
        lane += sc[j] * CodeDot(u + 32 * j + 4 * l, ab[i].qs + 32 * j + 4 * l, 4);
      acc[l] = std::fma(d, static_cast<float>(lane), acc[l]);
    }
  }
  return HsumFloat8(acc) + ((mins[0] + mins[2]) + (mins[1] + mins[3]));
}

// Q5_K super-block codes u[e] in 0..31 (element 32j + l: nibble of qs plus bit j of qh[l]) and
// its 6-bit scales and mins per 32 elements.
void DecodeQ5K(const BlockQ5K& b, uint8_t* u, uint8_t* sc, uint8_t* m) {
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      u[64 * c + l] =
          static_cast<uint8_t>((b.qs[32 * c + l] & 15) | (((b.qh[l] >> (2 * c)) & 1) << 4));
      u[64 * c + 32 + l] =
          static_cast<uint8_t>((b.qs[32 * c + l] >> 4) | (((b.qh[l] >> (2 * c + 1)) & 1) << 4));
    }
  }
  kquants::UnpackQ4KScales(b.scales, sc, m);
}

// Q5_K, ggml's tiled kernel (8 or more rows; the template Q4_K's runs, so its formula):
// per super-block r = fma(-msum, dminw, isum * dw); acc = fma(r, da, acc), isum and msum as
// Q4KSums over the 5-bit codes.
float DotQ5KTiled(int64_t n_in, const uint8_t* w, const uint8_t* a) {
  const auto* wb = reinterpret_cast<const BlockQ5K*>(w);
  const auto* ab = reinterpret_cast<const BlockQ8K*>(a);
  float acc = 0.0f;
  for (int64_t i = 0; i < n_in / kQK; ++i) {
    uint8_t u[kQK], sc[8], m[8];
    DecodeQ5K(wb[i], u, sc, m);
    int32_t isum = 0, msum = 0;
    for (int j = 0; j < 8; ++j) {
      isum += sc[j] * CodeDot(u + 32 * j, ab[i].qs + 32 * j, 32);
      msum += m[j] * (ab[i].bsums[2 * j] + ab[i].bsums[2 * j + 1]);
    }
    const float r = std::fma(-static_cast<float>(msum), Fp16ToFp32(wb[i].dmin),
                             static_cast<float>(isum) * Fp16ToFp32(wb[i].d));
    acc = std::fma(r, ab[i].d, acc);
  }
  return acc;
}

// Q5_K, ggml_vec_dot_q5_K_q8_K (AVX2 form; fewer than 8 rows): 8 int32 lanes, lane l =
// Σ_j sc_j · Σ of the products of elements 4l..4l+3 of sub-block j; acc[l] = fma(da * dw, lane,
// acc[l]); one min chain summs = fma(-da * dminw, float(msum), summs) (GCC contracts
// `summs += dmin * msum`); result hsum(acc) + summs.
float DotQ5KVec(int64_t n_in, const uint8_t* w, const uint8_t* a) {
  const auto* wb = reinterpret_cast<const BlockQ5K*>(w);
  const auto* ab = reinterpret_cast<const BlockQ8K*>(a);
  float acc[8] = {}, summs = 0.0f;
  for (int64_t i = 0; i < n_in / kQK; ++i) {
    uint8_t u[kQK], sc[8], m[8];
    DecodeQ5K(wb[i], u, sc, m);
    const float d = ab[i].d * Fp16ToFp32(wb[i].d);
    const float dmin = -ab[i].d * Fp16ToFp32(wb[i].dmin);
    int32_t msum = 0;
    for (int j = 0; j < 8; ++j) msum += m[j] * (ab[i].bsums[2 * j] + ab[i].bsums[2 * j + 1]);
    summs = std::fma(dmin, static_cast<float>(msum), summs);
    for (int l = 0; l < 8; ++l) {
      int32_t lane = 0;
      for (int j = 0; j < 8; ++j)
        lane += sc[j] * CodeDot(u + 32 * j + 4 * l, ab[i].qs + 32 * j + 4 * l, 4);
      acc[l] = std::fma(d, static_cast<float>(lane), acc[l]);
    }
  }
  return HsumFloat8(acc) + summs;
}

// Q6_K exact super-block sum Σ_g scale_g · (Σ_{e in g} u_e a_e - 32 bsums_g).
int32_t Q6KSum(const BlockQ6K& w, const BlockQ8K& a) {
  uint8_t u[kQK];
  DecodeQ6K(w, u);
  int32_t isum = 0;
  for (int g = 0; g < 16; ++g) {
    isum += w.scales[g] * (CodeDot(u + 16 * g, a.qs + 16 * g, 16) - 32 * a.bsums[g]);
  }
  return isum;
}

// Q6_K, ggml's tiled kernel (8 or more rows): acc = fma(isum * dw, da, acc) per super-block.
float DotQ6KTiled(int64_t n_in, const uint8_t* w, const uint8_t* a) {
  const auto* wb = reinterpret_cast<const BlockQ6K*>(w);
  const auto* ab = reinterpret_cast<const BlockQ8K*>(a);
  float acc = 0.0f;
  for (int64_t i = 0; i < n_in / kQK; ++i) {
    acc = std::fma(static_cast<float>(Q6KSum(wb[i], ab[i])) * Fp16ToFp32(wb[i].d), ab[i].d, acc);
  }
  return acc;
}

// Q6_K, ggml_vec_dot_q6_K_q8_K (AVX2 form; fewer than 8 rows): 8 int32 lanes, lane l =
// Σ over the 32-element chunks c of scale(c, l) · Σ of the products of elements 4l..4l+3 of c
// (scale of the chunk's first 16 elements for l < 4, of its second 16 for l >= 4), minus
// 32 (scales_2l bsums_2l + scales_2l+1 bsums_2l+1); acc[l] = fma(da * dw, lane, acc[l]);
// result hsum(acc).
float DotQ6KVec(int64_t n_in, const uint8_t* w, const uint8_t* a) {
  const auto* wb = reinterpret_cast<const BlockQ6K*>(w);
  const auto* ab = reinterpret_cast<const BlockQ8K*>(a);
  float acc[8] = {};
  for (int64_t i = 0; i < n_in / kQK; ++i) {
    uint8_t u[kQK];
    DecodeQ6K(wb[i], u);
    const int8_t* sc = wb[i].scales;
    const float d = ab[i].d * Fp16ToFp32(wb[i].d);
    for (int l = 0; l < 8; ++l) {
      int32_t lane = 0;
      for (int c = 0; c < 8; ++c) {
        const int e = 32 * c + 4 * l;
        lane += sc[2 * c + l / 4] * CodeDot(u + e, ab[i].qs + e, 4);
      }
      lane -= 32 * (sc[2 * l] * ab[i].bsums[2 * l] + sc[2 * l + 1] * ab[i].bsums[2 * l + 1]);
      acc[l] = std::fma(d, static_cast<float>(lane), acc[l]);
    }
  }
  return HsumFloat8(acc);
}

using DotFn = float (*)(int64_t n_in, const uint8_t* w, const uint8_t* a);

}  // namespace

bool HasLlamaCppMatMul(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
      return true;
    default:
      return false;
  }
}

absl::Status MatMulLlamaCpp(ThreadPool& pool, const WeightView& w, const float* x,
                            const int32_t* rows, int64_t n_rows, float* y, Scratch& scratch) {
  if (!HasLlamaCppMatMul(w.type)) {
    return absl::UnimplementedError(absl::StrFormat("MatMulLlamaCpp: weight type %s",
                                                    GgmlTypeName(static_cast<uint32_t>(w.type))));
  }
  if (w.data == nullptr || x == nullptr || y == nullptr) {
    return absl::InvalidArgumentError("MatMulLlamaCpp: null weight, x or y");
  }
  if (w.n_in <= 0 || w.n_out <= 0 || n_rows < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("MatMulLlamaCpp: shape {%d, %d} with %d rows", w.n_in, w.n_out, n_rows));
  }
  const bool k_quant =
      w.type == GgmlType::kQ4_K || w.type == GgmlType::kQ5_K || w.type == GgmlType::kQ6_K;
  // Q8_0 activations, and the weight rows widened to Q8_0 values before the dot.
  const bool q8_0_act =
      w.type == GgmlType::kQ8_0 || w.type == GgmlType::kQ5_0 || w.type == GgmlType::kQ4_0;
  const bool q8_1_act = w.type == GgmlType::kQ5_1;
  const int64_t block = k_quant ? kQK : q8_0_act || q8_1_act ? kQ8Block : 1;
  if (w.n_in % block != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("MatMulLlamaCpp: n_in %d is not a multiple of %d", w.n_in, block));
  }
  if (n_rows == 0) return absl::OkStatus();
  const int64_t n_in = w.n_in, n_out = w.n_out;
  auto x_row = [&](int64_t r) { return x + (rows ? rows[r] : r) * n_in; };
  const size_t w_row_bytes = w.row_bytes();
  const auto* wdata = static_cast<const uint8_t*>(w.data);
  const int64_t n_tasks = (n_out + kRowsPerTask - 1) / kRowsPerTask;

  if (q8_0_act || q8_1_act || k_quant) {
    // Activations: one Q8_0, Q8_1 or Q8_K row per token, quantized as ggml does.
    const size_t act_row_bytes =
        k_quant    ? static_cast<size_t>(n_in / kQK) * sizeof(BlockQ8K)
        : q8_1_act ? static_cast<size_t>(n_in / kQ8Block) * sizeof(quant::BlockQ8_1)
                   : static_cast<size_t>(n_in / kQ8Block) * kQ8BlockBytes;
    auto* act = static_cast<uint8_t*>(scratch.Get(n_rows * act_row_bytes));
    if (act == nullptr) return absl::ResourceExhaustedError("MatMulLlamaCpp: scratch");
    // ggml repacks a Q4_K or Q4_0 matrix whose row count is a multiple of 8 (x86 with AVX2) and
    // then runs its own kernels; otherwise batches of 8 or more rows take the tiled kernels
    // (K-quants).
    const bool repacked =
        (w.type == GgmlType::kQ4_K || w.type == GgmlType::kQ4_0) && n_out % 8 == 0;
    const bool tiled = !repacked && n_rows >= kTiledMinRows;
    DotFn dot = nullptr;
    if (w.type == GgmlType::kQ4_K)
      dot = repacked ? DotQ4KRepacked : tiled ? DotQ4KTiled : DotQ4KVec;
    if (w.type == GgmlType::kQ5_K) dot = tiled ? DotQ5KTiled : DotQ5KVec;
    if (w.type == GgmlType::kQ6_K) dot = tiled ? DotQ6KTiled : DotQ6KVec;
    if (w.type == GgmlType::kQ4_0 && repacked) dot = DotQ4_0Repacked;
    if (w.type == GgmlType::kQ5_1) dot = DotQ5_1;
    const auto q8_0_dot = GetOpKernels(BestCpuLevel()).q8_0_dot_ggml;
    // A repacked Q4_K matrix takes ggml's 4-row gemm for whole groups of four rows, quantized
    // with its own sign rule; the gemv for the rest. (Q4_0's gemm and gemv give the same bits.)
    const int64_t grouped = repacked && w.type == GgmlType::kQ4_K ? n_rows - n_rows % 4 : 0;
    if (k_quant) {
      for (int64_t r = 0; r < n_rows; ++r) {
        QuantizeQ8K(x_row(r), reinterpret_cast<BlockQ8K*>(act + r * act_row_bytes), n_in,
                    r < grouped);
      }
    } else {
      const QuantizeRowFn quantize =
          ActivationQuantizer(q8_1_act ? GgmlType::kQ8_1 : GgmlType::kQ8_0, BestCpuLevel());
      if (quantize == nullptr) return absl::InternalError("MatMulLlamaCpp: no Q8 quantizer");
      for (int64_t r = 0; r < n_rows; ++r) quantize(x_row(r), act + r * act_row_bytes, n_in);
    }
    pool.ParallelFor(n_tasks, [&](int64_t t0, int64_t t1, int) {
      const bool widen = w.type == GgmlType::kQ5_0 || w.type == GgmlType::kQ4_0;
      std::vector<uint8_t> as_q8(widen ? act_row_bytes : 0);
      for (int64_t o = t0 * kRowsPerTask; o < std::min(n_out, t1 * kRowsPerTask); ++o) {
        const uint8_t* w_row = wdata + o * w_row_bytes;
        if (widen) {
          (w.type == GgmlType::kQ5_0 ? Q5_0RowAsQ8_0 : Q4_0RowAsQ8_0)(w_row, n_in, as_q8.data());
          w_row = as_q8.data();
        }
        for (int64_t r = 0; r < n_rows; ++r) {
          const uint8_t* a_row = act + r * act_row_bytes;
          const DotFn row_dot = r < grouped ? DotQ4KRepackedGemm : dot;
          y[r * n_out + o] = row_dot ? row_dot(n_in, w_row, a_row) : q8_0_dot(w_row, a_row, n_in);
        }
      }
    });
    return absl::OkStatus();
  }

  // F32 / F16: activations as f32 rows (rounded to f16 for F16 weights), then the attention
  // kernels' K . q dot (kernels.h kv_scores: the same two lane orders) with the weight rows as K
  // rows and the tokens as query heads: scores[t * n_out + o] = W[o, :] . act[t, :].
  const bool tiny_blas = n_rows >= 2 && n_out % 4 == 0 && n_in % 16 == 0;
  const int64_t n_lanes = tiny_blas ? kAttnLanesTinyBlas : kAttnLanes;
  auto* act = static_cast<float*>(scratch.Get(n_rows * n_in * sizeof(float)));
  if (act == nullptr) return absl::ResourceExhaustedError("MatMulLlamaCpp: scratch");
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x_row(r);
    float* ar = act + r * n_in;
    for (int64_t i = 0; i < n_in; ++i) {
      ar[i] = w.type == GgmlType::kF16 ? Fp16ToFp32(Fp32ToFp16(xr[i])) : xr[i];
    }
  }
  // The SIMD levels' kv_scores need whole lane steps; the scalar one takes any length.
  const OpKernels& best = GetOpKernels(BestCpuLevel());
  const auto kv_scores = n_in % (tiny_blas ? 16 : 64) == 0
                             ? best.kv_scores
                             : GetOpKernels(CpuLevel::kScalar).kv_scores;
  const KvElem elem = w.type == GgmlType::kF16 ? KvElem::kF16 : KvElem::kF32;
  pool.ParallelFor(n_tasks, [&](int64_t t0, int64_t t1, int) {
    const int64_t o0 = t0 * kRowsPerTask, o1 = std::min(n_out, t1 * kRowsPerTask);
    kv_scores(act, n_rows, wdata + o0 * w_row_bytes, o1 - o0, elem, n_in, n_lanes, y + o0, n_out);
  });
  return absl::OkStatus();
}

}  // namespace kiln::cpu
