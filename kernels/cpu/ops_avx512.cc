// AVX-512 versions of the CPU op kernels (lib/backend/cpu/kernels.h). Compiled with
// -mavx512f/bw/vl/... (kernels/cpu/sources.cmake); only called when the CPU has AVX-512.
// No std:: templates or shared inline functions here (see kernels.h).
// GCC 12 flags the _mm512_undefined_* placeholders inside its own intrinsics as uninitialized
// when they are inlined here (GCC bug 105593); the warning is a false positive.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>

#include "lib/backend/cpu/kernels.h"

namespace kiln::cpu {
namespace {

inline __mmask16 TailMask(int64_t remaining) {
  return remaining >= 16 ? static_cast<__mmask16>(0xFFFF)
                         : static_cast<__mmask16>((1u << remaining) - 1);
}

// exp(x) for x in [-inf, 88.7]: n = round(x / ln2), r = x - n ln2 (|r| <= ln2/2), e^r by its
// degree-7 Taylor polynomial (relative error < 1e-8), times 2^n via scalef (underflows to 0).
inline __m512 Exp512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
  x = _mm512_min_ps(x, _mm512_set1_ps(88.72283f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860682030941723e-6f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// 16 (or fewer, masked) K/V elements of `elem` at element offset i as floats.
inline __m512 LoadKv(const void* row, KvElem elem, int64_t i, __mmask16 m) {
  switch (elem) {
    case KvElem::kF32:
      return _mm512_maskz_loadu_ps(m, static_cast<const float*>(row) + i);
    case KvElem::kF16:
      return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(row) + i));
    case KvElem::kBf16: {
      const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(row) + i);
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
  }
  return _mm512_setzero_ps();
}

void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* y) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
    acc0 = _mm512_fmadd_ps(a, a, acc0);
    acc1 = _mm512_fmadd_ps(b, b, acc1);
  }
  for (; i < n; i += 16) {
    const __m512 a = _mm512_maskz_loadu_ps(TailMask(n - i), x + i);
    acc0 = _mm512_fmadd_ps(a, a, acc0);
  }
  const float ss = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
  const __m512 inv = _mm512_set1_ps(1.0f / __builtin_sqrtf(ss / static_cast<float>(n) + eps));
  for (i = 0; i < n; i += 16) {
    const __mmask16 m = TailMask(n - i);
    const __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv),
                                   _mm512_maskz_loadu_ps(m, w + i));
    _mm512_mask_storeu_ps(y + i, m, v);
  }
}

void SwiGlu(const float* gate, const float* up, int64_t n, float* y) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = TailMask(n - i);
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    const __m512 u = _mm512_maskz_loadu_ps(m, up + i);
    const __m512 e = Exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
    _mm512_mask_storeu_ps(y + i, m, _mm512_div_ps(_mm512_mul_ps(g, u), _mm512_add_ps(one, e)));
  }
}

void Add(const float* a, const float* b, int64_t n, float* y) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = TailMask(n - i);
    _mm512_mask_storeu_ps(
        y + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i)));
  }
}

float Max(const float* x, int64_t n) {
  const __m512 neg_inf = _mm512_set1_ps(-__builtin_inff());
  __m512 mx = neg_inf;
  for (int64_t i = 0; i < n; i += 16) {
    mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(neg_inf, TailMask(n - i), x + i));
  }
  return _mm512_reduce_max_ps(mx);
}

float ExpSum(const float* x, float sub, int64_t n, float* y) {
  const __m512 s = _mm512_set1_ps(sub);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = TailMask(n - i);
    const __m512 e =
        _mm512_maskz_mov_ps(m, Exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), s)));
    _mm512_mask_storeu_ps(y + i, m, e);
    sum = _mm512_add_ps(sum, e);
  }
  return _mm512_reduce_add_ps(sum);
}

void Scale(float* x, float s, int64_t n) {
  const __m512 sv = _mm512_set1_ps(s);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = TailMask(n - i);
    _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), sv));
  }
}

void RopePairs(float* x, const float* cos_dup, const float* sin_alt, int64_t n_rot) {
  for (int64_t i = 0; i < n_rot; i += 16) {
    const __mmask16 m = TailMask(n_rot - i);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    const __m512 swapped = _mm512_permute_ps(v, 0xB1);  // (x1, x0, x3, x2, ...)
    const __m512 r = _mm512_fmadd_ps(v, _mm512_maskz_loadu_ps(m, cos_dup + i),
                                     _mm512_mul_ps(swapped, _mm512_maskz_loadu_ps(m, sin_alt + i)));
    _mm512_mask_storeu_ps(x + i, m, r);
  }
}

void RopeHalves(float* x, const float* cos, const float* sin, int64_t half) {
  for (int64_t i = 0; i < half; i += 16) {
    const __mmask16 m = TailMask(half - i);
    const __m512 x0 = _mm512_maskz_loadu_ps(m, x + i);
    const __m512 x1 = _mm512_maskz_loadu_ps(m, x + i + half);
    const __m512 c = _mm512_maskz_loadu_ps(m, cos + i);
    const __m512 s = _mm512_maskz_loadu_ps(m, sin + i);
    _mm512_mask_storeu_ps(x + i, m, _mm512_fmsub_ps(x0, c, _mm512_mul_ps(x1, s)));
    _mm512_mask_storeu_ps(x + i + half, m, _mm512_fmadd_ps(x0, s, _mm512_mul_ps(x1, c)));
  }
}

// Scores of NG query heads (compile-time, so the accumulators stay in registers).
template <int NG>
void KvScoresFixed(const float* q, const void* k_rows, int64_t n_rows, KvElem elem, int64_t d,
                   float* scores, int64_t score_stride) {
  const int64_t row_bytes = d * (elem == KvElem::kF32 ? 4 : 2);
  for (int64_t j = 0; j < n_rows; ++j) {
    const void* k_row = static_cast<const uint8_t*>(k_rows) + j * row_bytes;
    __m512 acc[NG];
    for (int g = 0; g < NG; ++g) acc[g] = _mm512_setzero_ps();
    for (int64_t i = 0; i < d; i += 16) {
      const __mmask16 m = TailMask(d - i);
      const __m512 k = LoadKv(k_row, elem, i, m);
      for (int g = 0; g < NG; ++g) {
        acc[g] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + g * d + i), k, acc[g]);
      }
    }
    for (int g = 0; g < NG; ++g) scores[g * score_stride + j] = _mm512_reduce_add_ps(acc[g]);
  }
}

template <int NG>
void KvAccumulateFixed(float* acc, const float* p, int64_t p_stride, const void* v_rows,
                       int64_t n_rows, KvElem elem, int64_t d) {
  const int64_t row_bytes = d * (elem == KvElem::kF32 ? 4 : 2);
  // One 16-float slice of d at a time, the NG accumulators held in registers over all rows.
  for (int64_t i = 0; i < d; i += 16) {
    const __mmask16 m = TailMask(d - i);
    __m512 a[NG];
    for (int g = 0; g < NG; ++g) a[g] = _mm512_maskz_loadu_ps(m, acc + g * d + i);
    for (int64_t j = 0; j < n_rows; ++j) {
      const __m512 v = LoadKv(static_cast<const uint8_t*>(v_rows) + j * row_bytes, elem, i, m);
      for (int g = 0; g < NG; ++g) {
        a[g] = _mm512_fmadd_ps(_mm512_set1_ps(p[g * p_stride + j]), v, a[g]);
      }
    }
    for (int g = 0; g < NG; ++g) _mm512_mask_storeu_ps(acc + g * d + i, m, a[g]);
  }
}

// Head groups are split into slices of at most 8 (GQA groups are 1..8 in practice); each
// slice's result does not depend on the slicing, only on its own heads.
void KvScores(const float* q, int64_t n_q, const void* k_rows, int64_t n_rows, KvElem elem,
              int64_t d, float* scores, int64_t score_stride) {
  for (int64_t g0 = 0; g0 < n_q; g0 += 8) {
    const float* qg = q + g0 * d;
    float* sg = scores + g0 * score_stride;
    switch (n_q - g0 < 8 ? n_q - g0 : 8) {
      case 1:
        KvScoresFixed<1>(qg, k_rows, n_rows, elem, d, sg, score_stride);
        break;
      case 2:
        KvScoresFixed<2>(qg, k_rows, n_rows, elem, d, sg, score_stride);
        break;
      case 3:
        KvScoresFixed<3>(qg, k_rows, n_rows, elem, d, sg, score_stride);
        break;
      case 4:
        KvScoresFixed<4>(qg, k_rows, n_rows, elem, d, sg, score_stride);
        break;
      case 5:
        KvScoresFixed<5>(qg, k_rows, n_rows, elem, d, sg, score_stride);
        break;
      case 6:
        KvScoresFixed<6>(qg, k_rows, n_rows, elem, d, sg, score_stride);
        break;
      case 7:
        KvScoresFixed<7>(qg, k_rows, n_rows, elem, d, sg, score_stride);
        break;
      default:
        KvScoresFixed<8>(qg, k_rows, n_rows, elem, d, sg, score_stride);
        break;
    }
  }
}

void KvAccumulate(float* acc, const float* p, int64_t p_stride, int64_t n_q, const void* v_rows,
                  int64_t n_rows, KvElem elem, int64_t d) {
  for (int64_t g0 = 0; g0 < n_q; g0 += 8) {
    float* ag = acc + g0 * d;
    const float* pg = p + g0 * p_stride;
    switch (n_q - g0 < 8 ? n_q - g0 : 8) {
      case 1:
        KvAccumulateFixed<1>(ag, pg, p_stride, v_rows, n_rows, elem, d);
        break;
      case 2:
        KvAccumulateFixed<2>(ag, pg, p_stride, v_rows, n_rows, elem, d);
        break;
      case 3:
        KvAccumulateFixed<3>(ag, pg, p_stride, v_rows, n_rows, elem, d);
        break;
      case 4:
        KvAccumulateFixed<4>(ag, pg, p_stride, v_rows, n_rows, elem, d);
        break;
      case 5:
        KvAccumulateFixed<5>(ag, pg, p_stride, v_rows, n_rows, elem, d);
        break;
      case 6:
        KvAccumulateFixed<6>(ag, pg, p_stride, v_rows, n_rows, elem, d);
        break;
      case 7:
        KvAccumulateFixed<7>(ag, pg, p_stride, v_rows, n_rows, elem, d);
        break;
      default:
        KvAccumulateFixed<8>(ag, pg, p_stride, v_rows, n_rows, elem, d);
        break;
    }
  }
}

}  // namespace

void FillOpKernelsAvx512(OpKernels* k) {
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
