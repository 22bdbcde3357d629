// K-quants: scalar reference kernels (dequantize, Q8_K quantize, vec_dot) and registration of
// every level. Layout and contract: lib/quant/kquants.h.
#include "lib/quant/kquants.h"

#include <cmath>
#include <cstring>

#include "lib/common/half.h"
#include "lib/quant/interleave.h"
#include "lib/quant/quant.h"

namespace kiln {
namespace kquants {

// ---------------------------------------------------------------------------------------------
// Q8_K

void QuantizeRowQ8KScalar(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<BlockQ8K*>(vy);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {  // x: [256] per block
    BlockQ8K& b = y[i];
    float max = 0.0f, amax = 0.0f;
    for (int e = 0; e < kQK; ++e) {
      const float ax = std::fabs(x[e]);
      if (ax > amax) {
        amax = ax;
        max = x[e];
      }
    }
    const float iscale = amax > 0.0f ? -127.0f / max : 0.0f;
    if (!(amax > 0.0f) || !std::isfinite(iscale)) {
      b.d = 0.0f;
      std::memset(b.qs, 0, sizeof(b.qs));
      std::memset(b.bsums, 0, sizeof(b.bsums));
      continue;
    }
    for (int e = 0; e < kQK; ++e) {
      float v = iscale * x[e];
      if (v != v) v = 0.0f;  // NaN element
      const int q = NearestInt(v);
      b.qs[e] = static_cast<int8_t>(q < 127 ? q : 127);
    }
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += b.qs[16 * g + l];
      b.bsums[g] = static_cast<int16_t>(sum);
    }
    b.d = 1.0f / iscale;
  }
}

void DequantizeRowQ8KScalar(const void* vx, float* y, int64_t n) {
  const auto* x = static_cast<const BlockQ8K*>(vx);
  for (int64_t i = 0; i < n / kQK; ++i) {
    for (int e = 0; e < kQK; ++e) *y++ = x[i].d * static_cast<float>(x[i].qs[e]);
  }
}

// ---------------------------------------------------------------------------------------------
// Dequantize. Float operations mirror ggml's dequantize_row_* exactly (scale products first,
// then value = dl*q - ml), so files from llama.cpp decode to the same bits.

void DequantizeRowQ2KScalar(const void* vx, float* y, int64_t n) {
  const auto* x = static_cast<const BlockQ2K*>(vx);
  for (int64_t i = 0; i < n / kQK; ++i) {
    const float d = Fp16ToFp32(x[i].d);
    const float dmin = Fp16ToFp32(x[i].dmin);
    for (int e = 0; e < kQK; ++e) {
      const int half = e / 128, j = (e % 128) / 32, l = e % 32;
      const uint8_t sc = x[i].scales[e / 16];
      const float dl = d * static_cast<float>(sc & 0xF);
      const float ml = dmin * static_cast<float>(sc >> 4);
      const int q = (x[i].qs[32 * half + l] >> (2 * j)) & 3;
      *y++ = dl * static_cast<float>(q) - ml;
    }
  }
}

void DequantizeRowQ3KScalar(const void* vx, float* y, int64_t n) {
  const auto* x = static_cast<const BlockQ3K*>(vx);
  for (int64_t i = 0; i < n / kQK; ++i) {
    const float d = Fp16ToFp32(x[i].d);
    int8_t s[16];
    UnpackQ3KScales(x[i].scales, s);
    for (int e = 0; e < kQK; ++e) {
      const int half = e / 128, j = (e % 128) / 32, l = e % 32;
      const int q2 = (x[i].qs[32 * half + l] >> (2 * j)) & 3;
      const int hbit = (x[i].hmask[l] >> (4 * half + j)) & 1;
      const int q3 = q2 - (hbit ? 0 : 4);
      const float dl = d * static_cast<float>(s[e / 16]);
      *y++ = dl * static_cast<float>(q3);
    }
  }
}

void DequantizeRowQ4KScalar(const void* vx, float* y, int64_t n) {
  const auto* x = static_cast<const BlockQ4K*>(vx);
  for (int64_t i = 0; i < n / kQK; ++i) {
    const float d = Fp16ToFp32(x[i].d);
    const float dmin = Fp16ToFp32(x[i].dmin);
    uint8_t sc[8], m[8];
    UnpackQ4KScales(x[i].scales, sc, m);
    for (int j = 0; j < 8; ++j) {
      const float dl = d * static_cast<float>(sc[j]);
      const float ml = dmin * static_cast<float>(m[j]);
      const uint8_t* q = x[i].qs + 32 * (j / 2);
      const int shift = (j % 2) * 4;
      for (int l = 0; l < 32; ++l) *y++ = dl * static_cast<float>((q[l] >> shift) & 0xF) - ml;
    }
  }
}

void DequantizeRowQ5KScalar(const void* vx, float* y, int64_t n) {
  const auto* x = static_cast<const BlockQ5K*>(vx);
  for (int64_t i = 0; i < n / kQK; ++i) {
    const float d = Fp16ToFp32(x[i].d);
    const float dmin = Fp16ToFp32(x[i].dmin);
    uint8_t sc[8], m[8];
    UnpackQ4KScales(x[i].scales, sc, m);
    for (int j = 0; j < 8; ++j) {
      const float dl = d * static_cast<float>(sc[j]);
      const float ml = dmin * static_cast<float>(m[j]);
      const uint8_t* q = x[i].qs + 32 * (j / 2);
      const int shift = (j % 2) * 4;
      for (int l = 0; l < 32; ++l) {
        const int q5 = ((q[l] >> shift) & 0xF) | (((x[i].qh[l] >> j) & 1) << 4);
        *y++ = dl * static_cast<float>(q5) - ml;
      }
    }
  }
}

// 6-bit value (0..63) of element e of a Q6_K block.
static inline int DecodeQ6K(const BlockQ6K& b, int e) {
  const int half = e / 128, r = e % 128, quarter = r / 32, l = r % 32;
  const uint8_t* ql = b.ql + 64 * half;
  const uint8_t* qh = b.qh + 32 * half;
  const int low = (quarter & 1) ? ql[l + 32] : ql[l];
  const int low4 = (quarter & 2) ? (low >> 4) : (low & 0xF);
  return low4 | (((qh[l] >> (2 * quarter)) & 3) << 4);
}

void DequantizeRowQ6KScalar(const void* vx, float* y, int64_t n) {
  const auto* x = static_cast<const BlockQ6K*>(vx);
  for (int64_t i = 0; i < n / kQK; ++i) {
    const float d = Fp16ToFp32(x[i].d);
    for (int e = 0; e < kQK; ++e) {
      const float dl = d * static_cast<float>(x[i].scales[e / 16]);
      *y++ = dl * static_cast<float>(DecodeQ6K(x[i], e) - 32);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// vec_dot: decode the weight codes of a super-block (the unsigned integers of the formulas in
// kquants.h), exact integer sums per group, then AccumulateSuperBlock in order.

// u[e] = q2 (0..3) of element e = 128*half + 32*j + l.
static void DecodeCodesQ2K(const BlockQ2K& b, uint8_t* u) {
  for (int half = 0; half < 2; ++half) {
    for (int j = 0; j < 4; ++j) {
      for (int l = 0; l < 32; ++l) {
        u[128 * half + 32 * j + l] = static_cast<uint8_t>((b.qs[32 * half + l] >> (2 * j)) & 3);
      }
    }
  }
}
// u[e] = q3 + 4 (0..7): low 2 bits from qs, bit 2 from hmask.
static void DecodeCodesQ3K(const BlockQ3K& b, uint8_t* u) {
  for (int half = 0; half < 2; ++half) {
    for (int j = 0; j < 4; ++j) {
      for (int l = 0; l < 32; ++l) {
        u[128 * half + 32 * j + l] = static_cast<uint8_t>(
            ((b.qs[32 * half + l] >> (2 * j)) & 3) | (((b.hmask[l] >> (4 * half + j)) & 1) << 2));
      }
    }
  }
}
// u[e] = q4 (0..15), or q5 (0..31) with the qh bit; e = 32*j + l.
template <typename Block, bool kHasHighBit>
static void DecodeCodesQ45K(const Block& b, uint8_t* u) {
  for (int j = 0; j < 8; ++j) {
    for (int l = 0; l < 32; ++l) {
      int v = (b.qs[32 * (j / 2) + l] >> ((j % 2) * 4)) & 0xF;
      if constexpr (kHasHighBit) v |= ((b.qh[l] >> j) & 1) << 4;
      u[32 * j + l] = static_cast<uint8_t>(v);
    }
  }
}
// u[e] = q6 (0..63); the four quarters of each 128-element half share ql/qh bytes.
static void DecodeCodesQ6K(const BlockQ6K& b, uint8_t* u) {
  for (int half = 0; half < 2; ++half) {
    const uint8_t* ql = b.ql + 64 * half;
    const uint8_t* qh = b.qh + 32 * half;
    uint8_t* out = u + 128 * half;
    for (int l = 0; l < 32; ++l) {
      out[l] = static_cast<uint8_t>((ql[l] & 0xF) | ((qh[l] & 3) << 4));
      out[l + 32] = static_cast<uint8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
      out[l + 64] = static_cast<uint8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
      out[l + 96] = static_cast<uint8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
    }
  }
}

// sum over elements first .. first+kLen-1 of u[e] * a.qs[e].
template <int kLen>
static inline int32_t CodeDot(const uint8_t* u, const BlockQ8K& a, int first) {
  int32_t s = 0;
  for (int e = 0; e < kLen; ++e) s += u[first + e] * a.qs[first + e];
  return s;
}

float VecDotQ2KScalar(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const BlockQ2K*>(vw);
  const auto* a = static_cast<const BlockQ8K*>(va);
  float acc = 0.0f;
  uint8_t u[kQK];
  for (int64_t i = 0; i < n / kQK; ++i) {
    DecodeCodesQ2K(w[i], u);
    int32_t isum = 0, msum = 0;
    for (int g = 0; g < 16; ++g) {
      isum += (w[i].scales[g] & 0xF) * CodeDot<16>(u, a[i], 16 * g);
      msum += (w[i].scales[g] >> 4) * a[i].bsums[g];
    }
    acc = AccumulateSuperBlock(acc, a[i].d * Fp16ToFp32(w[i].d), isum,
                               a[i].d * Fp16ToFp32(w[i].dmin), msum);
  }
  return acc;
}

float VecDotQ3KScalar(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const BlockQ3K*>(vw);
  const auto* a = static_cast<const BlockQ8K*>(va);
  float acc = 0.0f;
  uint8_t u[kQK];
  for (int64_t i = 0; i < n / kQK; ++i) {
    DecodeCodesQ3K(w[i], u);
    int8_t s[16];
    UnpackQ3KScales(w[i].scales, s);
    int32_t isum = 0;
    for (int g = 0; g < 16; ++g) isum += s[g] * (CodeDot<16>(u, a[i], 16 * g) - 4 * a[i].bsums[g]);
    acc = AccumulateSuperBlock(acc, a[i].d * Fp16ToFp32(w[i].d), isum, 0.0f, 0);
  }
  return acc;
}

template <typename Block, bool kHasHighBit>
static float VecDotQ45KScalar(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const Block*>(vw);
  const auto* a = static_cast<const BlockQ8K*>(va);
  float acc = 0.0f;
  uint8_t u[kQK];
  for (int64_t i = 0; i < n / kQK; ++i) {
    DecodeCodesQ45K<Block, kHasHighBit>(w[i], u);
    uint8_t sc[8], m[8];
    UnpackQ4KScales(w[i].scales, sc, m);
    int32_t isum = 0, msum = 0;
    for (int j = 0; j < 8; ++j) {
      isum += sc[j] * CodeDot<32>(u, a[i], 32 * j);
      msum += m[j] * (a[i].bsums[2 * j] + a[i].bsums[2 * j + 1]);
    }
    acc = AccumulateSuperBlock(acc, a[i].d * Fp16ToFp32(w[i].d), isum,
                               a[i].d * Fp16ToFp32(w[i].dmin), msum);
  }
  return acc;
}

float VecDotQ4KScalar(int64_t n, const void* w, const void* a) {
  return VecDotQ45KScalar<BlockQ4K, false>(n, w, a);
}
float VecDotQ5KScalar(int64_t n, const void* w, const void* a) {
  return VecDotQ45KScalar<BlockQ5K, true>(n, w, a);
}

float VecDotQ6KScalar(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const BlockQ6K*>(vw);
  const auto* a = static_cast<const BlockQ8K*>(va);
  float acc = 0.0f;
  uint8_t u[kQK];
  for (int64_t i = 0; i < n / kQK; ++i) {
    DecodeCodesQ6K(w[i], u);
    int32_t isum = 0;
    for (int g = 0; g < 16; ++g) {
      isum += w[i].scales[g] * (CodeDot<16>(u, a[i], 16 * g) - 32 * a[i].bsums[g]);
    }
    acc = AccumulateSuperBlock(acc, a[i].d * Fp16ToFp32(w[i].d), isum, 0.0f, 0);
  }
  return acc;
}

float VecDotQ8KScalar(int64_t n, const void* vw, const void* va) {
  const auto* w = static_cast<const BlockQ8K*>(vw);
  const auto* a = static_cast<const BlockQ8K*>(va);
  float acc = 0.0f;
  for (int64_t i = 0; i < n / kQK; ++i) {
    int32_t isum = 0;
    for (int e = 0; e < kQK; ++e) isum += w[i].qs[e] * a[i].qs[e];
    acc = AccumulateSuperBlock(acc, w[i].d * a[i].d, isum, 0.0f, 0);
  }
  return acc;
}

// ---------------------------------------------------------------------------------------------
// The interleaved copy (kernels/cpu/kquants.h: quads of 4 rows, super-block-major)

namespace {

template <typename Block>
void InterleaveQuads(const void* vw, size_t w_stride, int64_t n_in, int64_t n_rows, void* vout) {
  const auto* w = static_cast<const uint8_t*>(vw);
  auto* out = static_cast<uint8_t*>(vout);
  const int64_t nb = n_in / kQK;
  const int64_t padded =
      (n_rows + quant::kInterleaveRows - 1) / quant::kInterleaveRows * quant::kInterleaveRows;
  for (int64_t r = 0; r < padded; ++r) {
    // Row r's super-block i at quad r / 4, slot i * 4 + r % 4.
    uint8_t* dst = out + ((r / kQuadRows) * nb * kQuadRows + r % kQuadRows) * sizeof(Block);
    for (int64_t i = 0; i < nb; ++i, dst += kQuadRows * sizeof(Block)) {
      if (r < n_rows) {
        std::memcpy(dst, w + r * w_stride + i * sizeof(Block), sizeof(Block));
      } else {
        std::memset(dst, 0, sizeof(Block));
      }
    }
  }
}

template <typename Block>
size_t QuadGroupBytes(int64_t n_in) {
  return static_cast<size_t>(quant::kInterleaveRows) * (n_in / kQK) * sizeof(Block);
}

template <typename Block>
void QuadRow(const void* groups, int64_t n_in, int64_t row, void* vout) {
  const int64_t nb = n_in / kQK;
  const auto* src = static_cast<const uint8_t*>(groups) +
                    ((row / kQuadRows) * nb * kQuadRows + row % kQuadRows) * sizeof(Block);
  auto* out = static_cast<uint8_t*>(vout);
  for (int64_t i = 0; i < nb; ++i) {
    std::memcpy(out + i * sizeof(Block), src + i * kQuadRows * sizeof(Block), sizeof(Block));
  }
}

}  // namespace

void InterleaveQuadsQ4K(const void* w, size_t w_stride, int64_t n_in, int64_t n_rows, void* out) {
  InterleaveQuads<BlockQ4K>(w, w_stride, n_in, n_rows, out);
}
void InterleaveQuadsQ5K(const void* w, size_t w_stride, int64_t n_in, int64_t n_rows, void* out) {
  InterleaveQuads<BlockQ5K>(w, w_stride, n_in, n_rows, out);
}
void InterleaveQuadsQ6K(const void* w, size_t w_stride, int64_t n_in, int64_t n_rows, void* out) {
  InterleaveQuads<BlockQ6K>(w, w_stride, n_in, n_rows, out);
}
size_t QuadGroupBytesQ4K(int64_t n_in) { return QuadGroupBytes<BlockQ4K>(n_in); }
size_t QuadGroupBytesQ5K(int64_t n_in) { return QuadGroupBytes<BlockQ5K>(n_in); }
size_t QuadGroupBytesQ6K(int64_t n_in) { return QuadGroupBytes<BlockQ6K>(n_in); }
void QuadRowQ4K(const void* groups, int64_t n_in, int64_t row, void* out) {
  QuadRow<BlockQ4K>(groups, n_in, row, out);
}
void QuadRowQ5K(const void* groups, int64_t n_in, int64_t row, void* out) {
  QuadRow<BlockQ5K>(groups, n_in, row, out);
}
void QuadRowQ6K(const void* groups, int64_t n_in, int64_t row, void* out) {
  QuadRow<BlockQ6K>(groups, n_in, row, out);
}

}  // namespace kquants

// ---------------------------------------------------------------------------------------------

void RegisterKQuantTypes(QuantRegistry& r, CpuLevel level) {
  using namespace kquants;
  auto set = [&r](GgmlType t, QuantizeRowFn q, DequantizeRowFn dq, VecDotFn dot) {
    QuantKernels& k = r[t];
    k.type = t;
    k.quantize = q;
    k.dequantize = dq;
    if (dot) {
      k.vec_dot = dot;
      k.vec_dot_type = GgmlType::kQ8_K;
    }
  };
  // Rows x tokens form of the level's vec_dot (same bits): unpacks each weight super-block once
  // for several tokens; also the one-token path (no per-row call, no repeated setup).
  [[maybe_unused]] auto set_tile = [&r](GgmlType t, VecDotTileFn tile) {
    r[t].vec_dot_tile = tile;
    r[t].tile_for_one_token = true;
  };
  switch (level) {
    case CpuLevel::kScalar:
      set(GgmlType::kQ2_K, QuantizeRowQ2KRef, DequantizeRowQ2KScalar, VecDotQ2KScalar);
      set(GgmlType::kQ3_K, QuantizeRowQ3KRef, DequantizeRowQ3KScalar, VecDotQ3KScalar);
      set(GgmlType::kQ4_K, QuantizeRowQ4KRef, DequantizeRowQ4KScalar, VecDotQ4KScalar);
      set(GgmlType::kQ5_K, QuantizeRowQ5KRef, DequantizeRowQ5KScalar, VecDotQ5KScalar);
      set(GgmlType::kQ6_K, QuantizeRowQ6KRef, DequantizeRowQ6KScalar, VecDotQ6KScalar);
      // Q8_K is the activation format; its own Q8_K x Q8_K dot makes the registry entry
      // complete (GetQuantKernels(kQ8_K) returns the quantizer the engine runs on activations).
      set(GgmlType::kQ8_K, QuantizeRowQ8KScalar, DequantizeRowQ8KScalar, VecDotQ8KScalar);
      break;
#if defined(KILN_KQUANTS_X86)
    case CpuLevel::kAvx2:
      set(GgmlType::kQ2_K, nullptr, DequantizeRowQ2KAvx2, VecDotQ2KAvx2);
      set(GgmlType::kQ3_K, nullptr, DequantizeRowQ3KAvx2, VecDotQ3KAvx2);
      set(GgmlType::kQ4_K, nullptr, DequantizeRowQ4KAvx2, VecDotQ4KAvx2);
      set(GgmlType::kQ5_K, nullptr, DequantizeRowQ5KAvx2, VecDotQ5KAvx2);
      set(GgmlType::kQ6_K, nullptr, DequantizeRowQ6KAvx2, VecDotQ6KAvx2);
      set(GgmlType::kQ8_K, QuantizeRowQ8KAvx2, nullptr, VecDotQ8KAvx2);
      set_tile(GgmlType::kQ4_K, VecDotTileQ4KAvx2);
      set_tile(GgmlType::kQ5_K, VecDotTileQ5KAvx2);
      set_tile(GgmlType::kQ6_K, VecDotTileQ6KAvx2);
      break;
    case CpuLevel::kAvx512:
      set(GgmlType::kQ2_K, nullptr, nullptr, VecDotQ2KAvx512);
      set(GgmlType::kQ3_K, nullptr, nullptr, VecDotQ3KAvx512);
      set(GgmlType::kQ4_K, nullptr, nullptr, VecDotQ4KAvx512);
      set(GgmlType::kQ5_K, nullptr, nullptr, VecDotQ5KAvx512);
      set(GgmlType::kQ6_K, nullptr, nullptr, VecDotQ6KAvx512);
      set(GgmlType::kQ8_K, QuantizeRowQ8KAvx512, nullptr, VecDotQ8KAvx512);
      set_tile(GgmlType::kQ4_K, VecDotTileQ4KAvx512);
      set_tile(GgmlType::kQ5_K, VecDotTileQ5KAvx512);
      set_tile(GgmlType::kQ6_K, VecDotTileQ6KAvx512);
      // The interleaved copy (kernels/cpu/kquants.h), written after load while the same kernels
      // read the file's rows in place (the same bits: vec_dot's).
      r[GgmlType::kQ4_K].SetInterleavedForm(InterleaveQuadsQ4K, QuadGroupBytesQ4K, QuadRowQ4K,
                                            QuadTileQ4KAvx512, VecDotTileQ4KAvx512);
      r[GgmlType::kQ5_K].SetInterleavedForm(InterleaveQuadsQ5K, QuadGroupBytesQ5K, QuadRowQ5K,
                                            QuadTileQ5KAvx512, VecDotTileQ5KAvx512);
      r[GgmlType::kQ6_K].SetInterleavedForm(InterleaveQuadsQ6K, QuadGroupBytesQ6K, QuadRowQ6K,
                                            QuadTileQ6KAvx512, VecDotTileQ6KAvx512);
      break;
#endif
    default:
      break;
  }
}

}  // namespace kiln
