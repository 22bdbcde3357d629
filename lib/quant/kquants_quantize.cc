// Reference (weight) quantizers for Q2_K..Q6_K. Layouts and dequantization: kquants.h.
//
// How these differ from ggml. ggml's quantize_row_q*_K_ref run an iterative search per
// sub-block (make_qkx2_quants for the asymmetric types Q2_K/Q4_K/Q5_K: a grid of candidate
// (min, scale) pairs refined by weighted least squares; make_qx_quants/make_q3_quants for the
// symmetric Q3_K/Q6_K: a scan of candidate scales around amax/K minimising weighted squared
// error), then quantize the sub-block scales to 4/6/8 bits with nearest rounding. That search
// minimises RMS error but lets values clamp, so it gives no per-element error bound.
// Here instead, per super-block:
//   * asymmetric types (value = d*sc_j*q - dmin*m_j, q in 0..nmax): the offset dmin*m_j is the
//     smallest grid point <= min(0, min x_j) (m_j rounded UP), then the step d*sc_j is the
//     smallest grid step that still reaches max x_j (sc_j rounded UP); d and dmin are rounded up
//     to f16. No value ever clamps by more than float rounding, so |x - x^| <= step_j / 2.
//     Refinement: offsets m_j+1..m_j+3 (each with its own smallest covering step) are tried
//     too; the one with the least squared error wins (ties: the smaller m).
//   * symmetric types (value = d*s_g*q, q in -K..K-1): |d*s_g| is the smallest grid step with
//     K*|d*s_g| >= amax_g, signed so that the largest-|x| element maps to -K (ggml's trick to
//     use the extra negative level). Refinement: |s_g|+1 and both signs are tried; least squared
//     error wins (ties: first candidate). Only the +K side can clamp, by at most one step, so
//     |x - x^| <= |d*s_g|.
// Both are deterministic pure functions of the input row. Inputs must be finite; magnitudes
// beyond what an f16 super-block scale can express (about 65504 * scale_max * q_max) saturate.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "lib/common/half.h"
#include "lib/quant/kquants.h"

namespace kiln::kquants {
namespace {

// Smallest f16 value >= v (v >= 0), saturating at the largest finite f16 (65504).
uint16_t Fp16RoundUp(float v) {
  if (!(v > 0.0f)) return 0;
  if (v >= 65504.0f) return 0x7BFF;
  uint16_t h = Fp32ToFp16(v);
  if (Fp16ToFp32(h) < v) ++h;  // next representable positive f16
  return h;
}

int ClampInt(float v, int lo, int hi) {  // NaN-safe: NaN -> lo
  if (!(v >= static_cast<float>(lo))) return lo;
  if (v >= static_cast<float>(hi)) return hi;
  return static_cast<int>(v);
}

// Asymmetric super-block: n_sub sub-blocks of `len` elements each; q in 0..nmax; 6-bit or 4-bit
// scale and min codes up to smax. Outputs d, dmin (f16 bits), sc[], m[] and q[256].
struct AsymSuperBlock {
  uint16_t d = 0, dmin = 0;
  uint8_t sc[16] = {}, m[16] = {};
  uint8_t q[kQK] = {};
};

AsymSuperBlock QuantizeAsym(const float* x, int n_sub, int len, int nmax, int smax) {
  AsymSuperBlock out;
  float lo[16], hi[16];
  float max_need_min = 0.0f;
  for (int j = 0; j < n_sub; ++j) {
    lo[j] = 0.0f;  // the offset always reaches 0 (ggml forces min <= 0 as well)
    hi[j] = -INFINITY;
    for (int l = 0; l < len; ++l) {
      lo[j] = std::min(lo[j], x[j * len + l]);
      hi[j] = std::max(hi[j], x[j * len + l]);
    }
    max_need_min = std::max(max_need_min, -lo[j]);
  }
  out.dmin = Fp16RoundUp(max_need_min / static_cast<float>(smax));
  const float dmin = Fp16ToFp32(out.dmin);
  // The offset code of each sub-block, then the step each one needs.
  float need_step[16];
  float max_need_step = 0.0f;
  for (int j = 0; j < n_sub; ++j) {
    int m = dmin > 0.0f ? ClampInt(std::ceil(-lo[j] / dmin), 0, smax) : 0;
    if (dmin * static_cast<float>(m) < -lo[j] && m < smax) ++m;  // float rounding of the ratio
    out.m[j] = static_cast<uint8_t>(m);
    need_step[j] =
        std::max(0.0f, (hi[j] + dmin * static_cast<float>(m)) / static_cast<float>(nmax));
    max_need_step = std::max(max_need_step, need_step[j]);
  }
  out.d = Fp16RoundUp(max_need_step / static_cast<float>(smax));
  const float d = Fp16ToFp32(out.d);
  for (int j = 0; j < n_sub; ++j) {
    const float* xj = x + j * len;
    int best_sc = 0, best_m = out.m[j];
    float best_err = INFINITY;
    for (int m = out.m[j]; m <= std::min(smax, out.m[j] + 3); ++m) {
      const float ml = dmin * static_cast<float>(m);  // same products as the dequantizer
      int sc =
          d > 0.0f ? ClampInt(std::ceil((hi[j] + ml) / static_cast<float>(nmax) / d), 0, smax) : 0;
      if (d * static_cast<float>(sc) * static_cast<float>(nmax) - ml < hi[j] && sc < smax) ++sc;
      const float dl = d * static_cast<float>(sc);
      if (m > out.m[j] && dl * static_cast<float>(nmax) - ml < hi[j]) break;  // no longer covers
      float err = 0.0f;
      for (int l = 0; l < len; ++l) {
        const int q = dl > 0.0f ? ClampInt(std::nearbyint((xj[l] + ml) / dl), 0, nmax) : 0;
        const float e = dl * static_cast<float>(q) - ml - xj[l];
        err += e * e;
      }
      if (err < best_err) {
        best_err = err;
        best_sc = sc;
        best_m = m;
      }
    }
    out.sc[j] = static_cast<uint8_t>(best_sc);
    out.m[j] = static_cast<uint8_t>(best_m);
    const float dl = d * static_cast<float>(best_sc);
    const float ml = dmin * static_cast<float>(best_m);
    for (int l = 0; l < len; ++l) {
      out.q[j * len + l] = static_cast<uint8_t>(
          dl > 0.0f ? ClampInt(std::nearbyint((xj[l] + ml) / dl), 0, nmax) : 0);
    }
  }
  return out;
}

// Symmetric super-block: 16 groups of 16; q in -k..k-1; signed scale codes |s| <= smax.
struct SymSuperBlock {
  uint16_t d = 0;
  int8_t s[16] = {};
  int8_t q[kQK] = {};
};

SymSuperBlock QuantizeSym(const float* x, int k, int smax) {
  SymSuperBlock out;
  float amax[16], vmax[16];
  float max_need = 0.0f;
  for (int g = 0; g < 16; ++g) {
    amax[g] = 0.0f;
    vmax[g] = 0.0f;
    for (int l = 0; l < 16; ++l) {
      const float ax = std::fabs(x[16 * g + l]);
      if (ax > amax[g]) {
        amax[g] = ax;
        vmax[g] = x[16 * g + l];
      }
    }
    max_need = std::max(max_need, amax[g] / static_cast<float>(k));
  }
  out.d = Fp16RoundUp(max_need / static_cast<float>(smax));
  const float d = Fp16ToFp32(out.d);
  if (!(d > 0.0f)) return out;
  for (int g = 0; g < 16; ++g) {
    const float* xg = x + 16 * g;
    int mag = ClampInt(std::ceil(amax[g] / static_cast<float>(k) / d), 0, smax);
    if (d * static_cast<float>(mag) * static_cast<float>(k) < amax[g] && mag < smax) ++mag;
    const int sign = vmax[g] > 0.0f ? -1 : 1;  // largest |x| -> q = -k
    const int candidates[4] = {sign * mag, -sign * mag, sign * std::min(mag + 1, smax),
                               -sign * std::min(mag + 1, smax)};
    int best = 0;
    float best_err = INFINITY;
    for (int c : candidates) {
      const float dl = d * static_cast<float>(c);
      float err = 0.0f;
      for (int l = 0; l < 16; ++l) {
        const int q = c != 0 ? ClampInt(std::nearbyint(xg[l] / dl), -k, k - 1) : 0;
        const float e = dl * static_cast<float>(q) - xg[l];
        err += e * e;
      }
      if (err < best_err) {
        best_err = err;
        best = c;
      }
    }
    out.s[g] = static_cast<int8_t>(best);
    const float dl = d * static_cast<float>(best);
    for (int l = 0; l < 16; ++l) {
      out.q[16 * g + l] =
          static_cast<int8_t>(best != 0 ? ClampInt(std::nearbyint(xg[l] / dl), -k, k - 1) : 0);
    }
  }
  return out;
}

}  // namespace

void QuantizeRowQ2KRef(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<BlockQ2K*>(vy);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    const AsymSuperBlock s = QuantizeAsym(x, 16, 16, 3, 15);
    BlockQ2K& b = y[i];
    std::memset(&b, 0, sizeof(b));
    b.d = s.d;
    b.dmin = s.dmin;
    for (int g = 0; g < 16; ++g) b.scales[g] = static_cast<uint8_t>(s.sc[g] | (s.m[g] << 4));
    for (int e = 0; e < kQK; ++e) {
      const int half = e / 128, j = (e % 128) / 32, l = e % 32;
      b.qs[32 * half + l] |= static_cast<uint8_t>(s.q[e] << (2 * j));
    }
  }
}

void QuantizeRowQ3KRef(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<BlockQ3K*>(vy);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    SymSuperBlock s = QuantizeSym(x, 4, 31);
    BlockQ3K& b = y[i];
    std::memset(&b, 0, sizeof(b));
    b.d = s.d;
    PackQ3KScales(s.s, b.scales);
    for (int e = 0; e < kQK; ++e) {
      const int u = s.q[e] + 4;  // 0..7: low 2 bits in qs, bit 2 in hmask
      const int half = e / 128, j = (e % 128) / 32, l = e % 32;
      b.qs[32 * half + l] |= static_cast<uint8_t>((u & 3) << (2 * j));
      b.hmask[l] |= static_cast<uint8_t>((u >> 2) << (4 * half + j));
    }
  }
}

template <typename Block, bool kHasHighBit>
static void QuantizeRowQ45K(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<Block*>(vy);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    const AsymSuperBlock s = QuantizeAsym(x, 8, 32, kHasHighBit ? 31 : 15, 63);
    Block& b = y[i];
    std::memset(&b, 0, sizeof(b));
    b.d = s.d;
    b.dmin = s.dmin;
    PackQ4KScales(s.sc, s.m, b.scales);
    for (int e = 0; e < kQK; ++e) {
      const int j = e / 32, l = e % 32;
      b.qs[32 * (j / 2) + l] |= static_cast<uint8_t>((s.q[e] & 0xF) << ((j % 2) * 4));
      if constexpr (kHasHighBit) b.qh[l] |= static_cast<uint8_t>((s.q[e] >> 4) << j);
    }
  }
}

void QuantizeRowQ4KRef(const float* x, void* y, int64_t n) {
  QuantizeRowQ45K<BlockQ4K, false>(x, y, n);
}
void QuantizeRowQ5KRef(const float* x, void* y, int64_t n) {
  QuantizeRowQ45K<BlockQ5K, true>(x, y, n);
}

void QuantizeRowQ6KRef(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<BlockQ6K*>(vy);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    const SymSuperBlock s = QuantizeSym(x, 32, 127);
    BlockQ6K& b = y[i];
    std::memset(&b, 0, sizeof(b));
    b.d = s.d;
    std::memcpy(b.scales, s.s, 16);
    for (int e = 0; e < kQK; ++e) {
      const int u = s.q[e] + 32;  // 0..63
      const int half = e / 128, r = e % 128, quarter = r / 32, l = r % 32;
      uint8_t* ql = b.ql + 64 * half + ((quarter & 1) ? 32 : 0);
      ql[l] |= static_cast<uint8_t>((u & 0xF) << ((quarter & 2) ? 4 : 0));
      b.qh[32 * half + l] |= static_cast<uint8_t>((u >> 4) << (2 * quarter));
    }
  }
}

}  // namespace kiln::kquants
