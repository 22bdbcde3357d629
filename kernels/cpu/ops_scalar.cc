// Scalar (portable) versions of the op kernels; the base every SIMD level overrides.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/op_kernels.h"
#include "lib/common/half.h"

namespace kiln::cpu {
namespace {

float LoadKv(const void* row, KvElem elem, int64_t i) {
  switch (elem) {
    case KvElem::kF32:
      return static_cast<const float*>(row)[i];
    case KvElem::kF16:
      return Fp16ToFp32(static_cast<const uint16_t*>(row)[i]);
    case KvElem::kBf16:
      return Bf16ToFp32(static_cast<const uint16_t*>(row)[i]);
    case KvElem::kQ8_0: {
      const auto* block = static_cast<const uint8_t*>(row) + i / 32 * 34;
      uint16_t d;
      std::memcpy(&d, block, 2);
      return Fp16ToFp32(d) * static_cast<float>(static_cast<int8_t>(block[2 + i % 32]));
    }
  }
  return 0.0f;
}

void RmsNorm(const float* x, const float* w, int64_t n_rows, int64_t n, float eps, float* y) {
  // Up to kRows rows' sums advance together (independent chains, each in its row's order).
  constexpr int64_t kRows = 8;
  for (int64_t r0 = 0; r0 < n_rows; r0 += kRows) {
    const int64_t rows = n_rows - r0 < kRows ? n_rows - r0 : kRows;
    const float* xr = x + r0 * n;
    double ss[kRows] = {};
    if (rows == 1) {  // one chain in a register (through ss[], each add waits on a store)
      double s = 0.0;
      for (int64_t i = 0; i < n; ++i) s += static_cast<double>(xr[i] * xr[i]);
      ss[0] = s;
    } else {
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t r = 0; r < rows; ++r) {
          ss[r] += static_cast<double>(xr[r * n + i] * xr[r * n + i]);
        }
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      const float mean = static_cast<float>(ss[r] / static_cast<double>(n));
      const float scale = 1.0f / std::sqrt(mean + eps);
      float* yr = y + (r0 + r) * n;
      for (int64_t i = 0; i < n; ++i) yr[i] = xr[r * n + i] * scale * w[i];
    }
  }
}

// ggml_v_expf (ARM optimized-routines expf, as ggml vectorizes it): n = round(x / ln2) via the
// 1.5 * 2^23 shift, b = x - n ln2 in two FMAs, a degree-5 polynomial, times 2^n; |n| > 192
// saturates to 0 or inf.
float ExpGgml(float x) {
  const float shift = 0x1.8p23f;
  const float z = std::fma(x, 0x1.715476p+0f, shift);
  const float n = z - shift;
  const float b = std::fma(-n, 0x1.7f7d1cp-20f, std::fma(-n, 0x1.62e4p-1f, x));
  const float u = b * b;
  const float j = std::fma(std::fma(std::fma(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u,
                                    std::fma(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                           u, std::fma(0x1.ffffecp-1f, b, 1.0f));
  if (std::fabs(n) > 192.0f) return n <= 0.0f ? 0.0f : HUGE_VALF;
  return std::ldexp(j, static_cast<int>(n));
}

void SwiGlu(const float* gate, const float* up, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    y[i] = g / (1.0f + ExpGgml(0.0f - g)) * up[i];
  }
}

void Add(const float* a, const float* b, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

float Max(const float* x, int64_t n) {
  float m = x[0];
  for (int64_t i = 1; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

float ExpSum(const float* x, float sub, int64_t n, float* y) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    y[i] = std::exp(x[i] - sub);
    sum += y[i];
  }
  return sum;
}

void Scale(float* x, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void RoundF16(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = Fp16ToFp32(Fp32ToFp16(x[i]));
}

void StoreF16(const float* x, int64_t n, uint16_t* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = Fp32ToFp16(x[i]);
}

void RopePairs(float* x, const float* c, const float* s, int64_t n_pairs, int64_t stride) {
  for (int64_t i = 0; i < n_pairs; ++i) {
    float* a = x + (stride == 1 ? 2 * i : i);
    const float x0 = a[0], x1 = a[stride];
    a[0] = std::fma(x0, c[i], -(x1 * s[i]));
    a[stride] = std::fma(x0, s[i], x1 * c[i]);
  }
}

int64_t RowBytes(KvElem elem, int64_t d) {
  return elem == KvElem::kF32 ? 4 * d : elem == KvElem::kQ8_0 ? d / 32 * 34 : 2 * d;
}

// GCC's _mm512_reduce_add_ps order on 16 floats.
float Reduce16(const float* v) {
  float t3[8], t6[4];
  for (int i = 0; i < 8; ++i) t3[i] = v[8 + i] + v[i];
  for (int i = 0; i < 4; ++i) t6[i] = t3[4 + i] + t3[i];
  return (t6[0] + t6[2]) + (t6[1] + t6[3]);
}

void KvScores(const float* q, int64_t n_q, const void* k_rows, int64_t n_rows, KvElem elem,
              int64_t d, int64_t n_lanes, float* scores, int64_t score_stride) {
  const int64_t step = n_lanes == kAttnLanesTinyBlas ? 16 : 64;
  const int64_t full = d - d % step;
  // One widened K row: on the stack for attention (head_dim <= 1024, checked by PagedAttention),
  // on the heap for the longer rows of the llama.cpp order's weight matmuls.
  float stack_k[1024];
  std::vector<float> heap_k(d > 1024 ? d : 0);
  float* k = d > 1024 ? heap_k.data() : stack_k;
  for (int64_t j = 0; j < n_rows; ++j) {
    const void* kr = static_cast<const uint8_t*>(k_rows) + j * RowBytes(elem, d);
    for (int64_t i = 0; i < d; ++i) k[i] = LoadKv(kr, elem, i);
    for (int64_t g = 0; g < n_q; ++g) {
      const float* qg = q + g * d;
      float lanes[64] = {};
      for (int64_t i0 = 0; i0 < full; i0 += step) {
        for (int l = 0; l < step; ++l) lanes[l] = std::fma(k[i0 + l], qg[i0 + l], lanes[l]);
      }
      float v[16];
      for (int l = 0; l < 16; ++l) {
        v[l] = step == 16 ? lanes[l] : (lanes[l] + lanes[32 + l]) + (lanes[16 + l] + lanes[48 + l]);
      }
      float s = Reduce16(v);
      if (elem == KvElem::kF16 && step == 64) {
        // ggml_vec_dot_f16 adds its tail to a double (each f16 x f16 product is exact in f32).
        double sd = s;
        for (int64_t i = full; i < d; ++i) sd += static_cast<double>(k[i] * qg[i]);
        s = static_cast<float>(sd);
      } else {
        for (int64_t i = full; i < d; ++i) s += k[i] * qg[i];
      }
      scores[g * score_stride + j] = s;
    }
  }
}

double SoftmaxExp(const float* x, float max, int64_t n, float* y) {
  double sum = 0.0;
  for (int64_t c = 0; c < n; c += 16) {
    float v[16] = {};
    for (int64_t l = 0; l < 16 && c + l < n; ++l) v[l] = y[c + l] = ExpGgml(x[c + l] - max);
    sum += static_cast<double>(Reduce16(v));
  }
  return sum;
}

void KvAccumulate(float* acc, const float* p, const void* v_rows, int64_t n_rows, int64_t lane0,
                  int64_t n_lanes, KvElem elem, int64_t d) {
  for (int64_t j = 0; j < n_rows; ++j) {
    const void* v = static_cast<const uint8_t*>(v_rows) + j * RowBytes(elem, d);
    float* a = acc + ((lane0 + j) % n_lanes) * d;
    for (int64_t i = 0; i < d; ++i) a[i] = std::fma(LoadKv(v, elem, i), p[j], a[i]);
  }
}

void KvAccumulateGroups(float* acc, const float* p, const void* const* v_groups, int64_t n_groups,
                        int64_t n_lanes, KvElem elem, int64_t d) {
  for (int64_t r = 0; r < n_groups; ++r) {
    KvAccumulate(acc, p + 16 * r, v_groups[r], 16, 16 * r, n_lanes, elem, d);
  }
}

void KvScoresRows(const float* q, int64_t n_q, const void* const* k_rows, int64_t n_rows,
                  KvElem elem, int64_t d, float* scores, int64_t score_stride) {
  const int64_t full = d - d % 16;
  // One widened K row: on the stack for attention (head_dim <= 1024, checked by PagedAttention),
  // on the heap for the longer rows of the llama.cpp order's weight matmuls.
  float stack_k[1024];
  std::vector<float> heap_k(d > 1024 ? d : 0);
  float* k = d > 1024 ? heap_k.data() : stack_k;
  for (int64_t j = 0; j < n_rows; ++j) {
    for (int64_t i = 0; i < d; ++i) k[i] = LoadKv(k_rows[j], elem, i);
    for (int64_t g = 0; g < n_q; ++g) {
      const float* qg = q + g * d;
      float x[16] = {};
      for (int64_t i = 0; i < full; ++i) x[i % 16] = std::fma(k[i], qg[i], x[i % 16]);
      float quad[4];
      for (int q4 = 0; q4 < 4; ++q4) {
        const float* l = x + 4 * q4;
        quad[q4] = (l[0] + l[2]) + (l[1] + l[3]);
      }
      float s = (quad[0] + quad[2]) + (quad[1] + quad[3]);
      for (int64_t i = full; i < d; ++i) s = std::fma(k[i], qg[i], s);
      scores[g * score_stride + j] = s;
    }
  }
}

void KvScoresRowsQ8_0(const void* q8, int64_t n_q, const void* const* k_rows, int64_t n_rows,
                      int64_t d, float* scores, int64_t score_stride) {
  const int64_t nb = d / 32;
  const auto* q = static_cast<const uint8_t*>(q8);
  auto scale = [](const uint8_t* block) {
    uint16_t h;
    std::memcpy(&h, block, 2);
    return Fp16ToFp32(h);
  };
  for (int64_t j = 0; j < n_rows; ++j) {
    const auto* k = static_cast<const uint8_t*>(k_rows[j]);
    for (int64_t g = 0; g < n_q; ++g) {
      float s = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* kb = k + 34 * b;
        const uint8_t* qb = q + (g * nb + b) * 34;
        int32_t isum = 0;
        for (int i = 2; i < 34; ++i) {
          isum += static_cast<int8_t>(kb[i]) * static_cast<int8_t>(qb[i]);
        }
        s = std::fma(scale(kb) * scale(qb), static_cast<float>(isum), s);
      }
      scores[g * score_stride + j] = s;
    }
  }
}

void KvAccumulateRows(float* out, const float* p, int64_t p_stride, int64_t n_q,
                      const void* const* v_rows, int64_t n_rows, KvElem elem, int64_t d) {
  float v[1024];  // one widened V row
  for (int64_t j = 0; j < n_rows; ++j) {
    for (int64_t i = 0; i < d; ++i) v[i] = LoadKv(v_rows[j], elem, i);
    for (int64_t g = 0; g < n_q; ++g) {
      float* o = out + g * d;
      const float pj = p[g * p_stride + j];
      for (int64_t i = 0; i < d; ++i) o[i] = std::fma(v[i], pj, o[i]);
    }
  }
}

void ReduceAttnLanes(const float* acc, int64_t n_lanes, int64_t d, float* out) {
  for (int64_t i = 0; i < d; ++i) {
    float v[16];
    for (int l = 0; l < 16; ++l) {
      v[l] = n_lanes == kAttnLanesTinyBlas ? acc[l * d + i]
                                           : (acc[l * d + i] + acc[(32 + l) * d + i]) +
                                                 (acc[(16 + l) * d + i] + acc[(48 + l) * d + i]);
    }
    out[i] = Reduce16(v);
  }
}

void GeGlu(const float* gate, const float* up, const uint16_t* table, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    if (g <= -10.0f) {
      y[i] = 0.0f;
    } else if (g >= 10.0f) {
      y[i] = g * up[i];
    } else {
      y[i] = Fp16ToFp32(table[Fp32ToFp16(g)]) * up[i];
    }
  }
}

}  // namespace

float Q8_0DotGgml(const void* w, const void* a, int64_t n) {
  constexpr int64_t kBlock = 32, kBlockBytes = 34;
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* ab = static_cast<const uint8_t*>(a);
  float acc[8] = {};
  for (int64_t b = 0; b < n / kBlock; ++b, wb += kBlockBytes, ab += kBlockBytes) {
    uint16_t dw, da;
    std::memcpy(&dw, wb, 2);
    std::memcpy(&da, ab, 2);
    const float s = Fp16ToFp32(dw) * Fp16ToFp32(da);
    const auto* qw = reinterpret_cast<const int8_t*>(wb + 2);
    const auto* qa = reinterpret_cast<const int8_t*>(ab + 2);
    for (int l = 0; l < 8; ++l) {
      int32_t p = 0;
      for (int e = 4 * l; e < 4 * l + 4; ++e) p += qw[e] * qa[e];
      acc[l] = std::fma(s, static_cast<float>(p), acc[l]);
    }
  }
  return ((acc[4] + acc[0]) + (acc[6] + acc[2])) + ((acc[5] + acc[1]) + (acc[7] + acc[3]));
}

void FillOpKernelsScalar(OpKernels* k) {
  k->rms_norm = RmsNorm;
  k->swiglu = SwiGlu;
  k->geglu = GeGlu;
  k->add = Add;
  k->max = Max;
  k->exp_sum = ExpSum;
  k->scale = Scale;
  k->round_f16 = RoundF16;
  k->store_f16 = StoreF16;
  k->rope_pairs = RopePairs;
  k->kv_scores = KvScores;
  k->softmax_exp = SoftmaxExp;
  k->kv_accumulate_groups = KvAccumulateGroups;
  k->reduce_lanes = ReduceAttnLanes;
  k->kv_accumulate = KvAccumulate;
  k->kv_scores_rows = KvScoresRows;
  k->kv_scores_rows_q8_0 = KvScoresRowsQ8_0;
  k->kv_accumulate_rows = KvAccumulateRows;
  k->q8_0_dot_ggml = Q8_0DotGgml;
}

}  // namespace kiln::cpu
