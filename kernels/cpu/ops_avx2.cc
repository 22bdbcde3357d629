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

}  // namespace

void FillOpKernelsAvx2(OpKernels* k) {
  // The llama-path kernels (rms_norm, swiglu, attention) keep the scalar definitions here:
  // same bits as ggml's AVX-512 arithmetic (kernels.h); AVX-512 machines get the fast ones.
  k->add = Add;
  k->max = Max;
  k->exp_sum = ExpSum;
  k->scale = Scale;
}

}  // namespace kiln::cpu
