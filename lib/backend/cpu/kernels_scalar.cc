// Scalar (portable) versions of the op kernels; the base every SIMD level overrides.
#include <cmath>
#include <cstddef>

#include "lib/backend/cpu/kernels.h"
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
  }
  return 0.0f;
}

void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* y) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * inv * w[i];
}

void SwiGlu(const float* gate, const float* up, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    y[i] = g / (1.0f + std::exp(-g)) * up[i];
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

void RopePairs(float* x, const float* cos_dup, const float* sin_alt, int64_t n_rot) {
  for (int64_t i = 0; i < n_rot; i += 2) {
    const float x0 = x[i], x1 = x[i + 1];
    x[i] = x0 * cos_dup[i] + x1 * sin_alt[i];              // x0 c - x1 s
    x[i + 1] = x1 * cos_dup[i + 1] + x0 * sin_alt[i + 1];  // x1 c + x0 s
  }
}

void RopeHalves(float* x, const float* cos, const float* sin, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float x0 = x[i], x1 = x[i + half];
    x[i] = x0 * cos[i] - x1 * sin[i];
    x[i + half] = x0 * sin[i] + x1 * cos[i];
  }
}

size_t ElemBytes(KvElem elem) { return elem == KvElem::kF32 ? 4 : 2; }

void KvScores(const float* q, int64_t n_q, const void* k_rows, int64_t n_rows, KvElem elem,
              int64_t d, float* scores, int64_t score_stride) {
  for (int64_t j = 0; j < n_rows; ++j) {
    const void* k = static_cast<const uint8_t*>(k_rows) + j * d * ElemBytes(elem);
    for (int64_t g = 0; g < n_q; ++g) {
      float s = 0.0f;
      for (int64_t i = 0; i < d; ++i) s += q[g * d + i] * LoadKv(k, elem, i);
      scores[g * score_stride + j] = s;
    }
  }
}

void KvAccumulate(float* acc, const float* p, int64_t p_stride, int64_t n_q, const void* v_rows,
                  int64_t n_rows, KvElem elem, int64_t d) {
  for (int64_t j = 0; j < n_rows; ++j) {
    const void* v = static_cast<const uint8_t*>(v_rows) + j * d * ElemBytes(elem);
    for (int64_t i = 0; i < d; ++i) {
      const float vi = LoadKv(v, elem, i);
      for (int64_t g = 0; g < n_q; ++g) acc[g * d + i] += p[g * p_stride + j] * vi;
    }
  }
}

}  // namespace

void FillOpKernelsScalar(OpKernels* k) {
  k->rms_norm = RmsNorm;
  k->swiglu = SwiGlu;
  k->add = Add;
  k->max = Max;
  k->exp_sum = ExpSum;
  k->scale = Scale;
  k->rope_pairs = RopePairs;
  k->rope_halves = RopeHalves;
  k->kv_scores = KvScores;
  k->kv_accumulate = KvAccumulate;
}

}  // namespace kiln::cpu
