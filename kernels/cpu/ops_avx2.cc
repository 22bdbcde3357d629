// AVX2+FMA+F16C versions of the CPU op kernels (lib/backend/cpu/kernels.h). Compiled with
// -mavx2 -mfma -mf16c (kernels/cpu/sources.cmake); only called when the CPU has them.
// No std:: templates or shared inline functions here (see kernels.h). Tails (n % 8) run
// scalar code in the same order on every call, so results stay deterministic.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "lib/backend/cpu/kernels.h"

namespace kiln::cpu {
namespace {

constexpr int kMaxGroup = 8;  // query heads held in registers per K/V row pass

inline float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float HorizontalMax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// exp(x): same range reduction and polynomial as the AVX-512 version; 2^n is built in the
// exponent bits, inputs below -87.3 give 0.
inline __m256 Exp256(__m256 x) {
  const __m256 too_small = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
  x = _mm256_min_ps(x, _mm256_set1_ps(88.72283f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860682030941723e-6f), r);
  __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  // n in [-126, 128]: 2^n = (n + 127) << 23; n = 128 only for x near 88.72, split as 2 * 2^127.
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i half_n = _mm256_srai_epi32(ni, 1);
  const __m256 s1 =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half_n, _mm256_set1_epi32(127)), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(
      _mm256_add_epi32(_mm256_sub_epi32(ni, half_n), _mm256_set1_epi32(127)), 23));
  return _mm256_andnot_ps(too_small, _mm256_mul_ps(_mm256_mul_ps(p, s1), s2));
}

inline float ScalarKv(const void* row, KvElem elem, int64_t i) {
  switch (elem) {
    case KvElem::kF32:
      return static_cast<const float*>(row)[i];
    case KvElem::kF16:
      return _cvtsh_ss(static_cast<const uint16_t*>(row)[i]);
    case KvElem::kBf16: {
      const uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t*>(row)[i]) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
  }
  return 0.0f;
}

inline __m256 LoadKv8(const void* row, KvElem elem, int64_t i) {
  switch (elem) {
    case KvElem::kF32:
      return _mm256_loadu_ps(static_cast<const float*>(row) + i);
    case KvElem::kF16:
      return _mm256_cvtph_ps(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + i)));
    case KvElem::kBf16: {
      const __m128i h =
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + i));
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
  }
  return _mm256_setzero_ps();
}

void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* y) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 a = _mm256_loadu_ps(x + i);
    acc = _mm256_fmadd_ps(a, a, acc);
  }
  float ss = HorizontalSum(acc);
  for (; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / __builtin_sqrtf(ss / static_cast<float>(n) + eps);
  const __m256 inv8 = _mm256_set1_ps(inv);
  for (i = 0; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(
        y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), inv8), _mm256_loadu_ps(w + i)));
  }
  for (; i < n; ++i) y[i] = x[i] * inv * w[i];
}

void SwiGlu(const float* gate, const float* up, int64_t n, float* y) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 u = _mm256_loadu_ps(up + i);
    const __m256 e = Exp256(_mm256_sub_ps(_mm256_setzero_ps(), g));
    _mm256_storeu_ps(y + i, _mm256_div_ps(_mm256_mul_ps(g, u), _mm256_add_ps(one, e)));
  }
  for (; i < n; ++i) y[i] = gate[i] * up[i] / (1.0f + __builtin_expf(-gate[i]));
}

void Add(const float* a, const float* b, int64_t n, float* y) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  }
  for (; i < n; ++i) y[i] = a[i] + b[i];
}

float Max(const float* x, int64_t n) {
  float m = x[0];
  int64_t i = 0;
  if (n >= 8) {
    __m256 mx = _mm256_loadu_ps(x);
    for (i = 8; i + 8 <= n; i += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(x + i));
    m = HorizontalMax(mx);
  }
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

float ExpSum(const float* x, float sub, int64_t n, float* y) {
  const __m256 s = _mm256_set1_ps(sub);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = Exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), s));
    _mm256_storeu_ps(y + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  float sum = HorizontalSum(acc);
  for (; i < n; ++i) {
    y[i] = __builtin_expf(x[i] - sub);
    sum += y[i];
  }
  return sum;
}

void Scale(float* x, float s, int64_t n) {
  const __m256 sv = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), sv));
  for (; i < n; ++i) x[i] *= s;
}

void RopePairs(float* x, const float* cos_dup, const float* sin_alt, int64_t n_rot) {
  int64_t i = 0;
  for (; i + 8 <= n_rot; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 swapped = _mm256_permute_ps(v, 0xB1);
    _mm256_storeu_ps(x + i, _mm256_fmadd_ps(v, _mm256_loadu_ps(cos_dup + i),
                                            _mm256_mul_ps(swapped, _mm256_loadu_ps(sin_alt + i))));
  }
  for (; i < n_rot; i += 2) {
    const float x0 = x[i], x1 = x[i + 1];
    x[i] = __builtin_fmaf(x0, cos_dup[i], x1 * sin_alt[i]);
    x[i + 1] = __builtin_fmaf(x1, cos_dup[i + 1], x0 * sin_alt[i + 1]);
  }
}

void RopeHalves(float* x, const float* cos, const float* sin, int64_t half) {
  int64_t i = 0;
  for (; i + 8 <= half; i += 8) {
    const __m256 x0 = _mm256_loadu_ps(x + i);
    const __m256 x1 = _mm256_loadu_ps(x + i + half);
    const __m256 c = _mm256_loadu_ps(cos + i);
    const __m256 s = _mm256_loadu_ps(sin + i);
    _mm256_storeu_ps(x + i, _mm256_fmsub_ps(x0, c, _mm256_mul_ps(x1, s)));
    _mm256_storeu_ps(x + i + half, _mm256_fmadd_ps(x0, s, _mm256_mul_ps(x1, c)));
  }
  for (; i < half; ++i) {
    const float x0 = x[i], x1 = x[i + half];
    x[i] = x0 * cos[i] - x1 * sin[i];
    x[i + half] = x0 * sin[i] + x1 * cos[i];
  }
}

void KvScores(const float* q, int64_t n_q, const void* k_rows, int64_t n_rows, KvElem elem,
              int64_t d, float* scores, int64_t score_stride) {
  const int64_t d8 = d & ~int64_t{7};
  const int64_t row_bytes = d * (elem == KvElem::kF32 ? 4 : 2);
  for (int64_t j = 0; j < n_rows; ++j) {
    const void* k_row = static_cast<const uint8_t*>(k_rows) + j * row_bytes;
    for (int64_t g0 = 0; g0 < n_q; g0 += kMaxGroup) {
      const int64_t ng = n_q - g0 < kMaxGroup ? n_q - g0 : kMaxGroup;
      __m256 acc[kMaxGroup];
      for (int64_t g = 0; g < ng; ++g) acc[g] = _mm256_setzero_ps();
      for (int64_t i = 0; i < d8; i += 8) {
        const __m256 k = LoadKv8(k_row, elem, i);
        for (int64_t g = 0; g < ng; ++g) {
          acc[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + (g0 + g) * d + i), k, acc[g]);
        }
      }
      for (int64_t g = 0; g < ng; ++g) {
        float s = HorizontalSum(acc[g]);
        for (int64_t i = d8; i < d; ++i) s += q[(g0 + g) * d + i] * ScalarKv(k_row, elem, i);
        scores[(g0 + g) * score_stride + j] = s;
      }
    }
  }
}

void KvAccumulate(float* acc, const float* p, int64_t p_stride, int64_t n_q, const void* v_rows,
                  int64_t n_rows, KvElem elem, int64_t d) {
  const int64_t d8 = d & ~int64_t{7};
  const int64_t row_bytes = d * (elem == KvElem::kF32 ? 4 : 2);
  for (int64_t i = 0; i < d8; i += 8) {
    for (int64_t g0 = 0; g0 < n_q; g0 += kMaxGroup) {
      const int64_t ng = n_q - g0 < kMaxGroup ? n_q - g0 : kMaxGroup;
      __m256 a[kMaxGroup];
      for (int64_t g = 0; g < ng; ++g) a[g] = _mm256_loadu_ps(acc + (g0 + g) * d + i);
      for (int64_t j = 0; j < n_rows; ++j) {
        const __m256 v = LoadKv8(static_cast<const uint8_t*>(v_rows) + j * row_bytes, elem, i);
        for (int64_t g = 0; g < ng; ++g) {
          a[g] = _mm256_fmadd_ps(_mm256_set1_ps(p[(g0 + g) * p_stride + j]), v, a[g]);
        }
      }
      for (int64_t g = 0; g < ng; ++g) _mm256_storeu_ps(acc + (g0 + g) * d + i, a[g]);
    }
  }
  for (int64_t j = 0; j < n_rows; ++j) {
    const void* v_row = static_cast<const uint8_t*>(v_rows) + j * row_bytes;
    for (int64_t i = d8; i < d; ++i) {
      const float v = ScalarKv(v_row, elem, i);
      for (int64_t g = 0; g < n_q; ++g) acc[g * d + i] += p[g * p_stride + j] * v;
    }
  }
}

}  // namespace

void FillOpKernelsAvx2(OpKernels* k) {
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
