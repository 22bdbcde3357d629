// AVX-512 versions of the CPU op kernels (kernels/cpu/op_kernels.h). Compiled with
// -mavx512f/bw/vl/... (kernels/cpu/CMakeLists.txt); only called when the CPU has AVX-512.
// No std:: templates or shared inline functions with external linkage here (see op_kernels.h).
// GCC 12 flags the _mm512_undefined_* placeholders inside its own intrinsics as uninitialized
// when they are inlined here (GCC bug 105593); the warning is a false positive.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/f16_avx512.h"
#include "kernels/cpu/kv_elem_dispatch.h"
#include "kernels/cpu/op_kernels.h"
#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/transpose_avx512.h"
#include "kernels/cpu/unroll.h"
#include "lib/common/half.h"

namespace kiln::cpu {
namespace {

inline __mmask16 TailMask(int64_t remaining) {
  return remaining >= 16 ? static_cast<__mmask16>(0xFFFF)
                         : static_cast<__mmask16>((1u << remaining) - 1);
}

// exp(x) for x in [-inf, 88.7] (generic softmax): n = round(x / ln2), r = x - n ln2 (|r| <= ln2/2),
// e^r by its degree-7 Taylor polynomial (relative error < 1e-8), times 2^n via scalef (underflows
// to 0).
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

// Bytes of one K/V row of d elements (op_kernels.h).
inline int64_t RowBytes(KvElem elem, int64_t d) {
  return elem == KvElem::kF32 ? 4 * d : elem == KvElem::kQ8_0 ? d / 32 * 34 : 2 * d;
}

// How far ahead of the rows being computed the K/V kernels prefetch (PrefetchRowsAhead), in
// bytes of rows, at least 16 rows: into L2, kL2PrefetchBytes (64 f16 rows of 64, where 32 and
// 128 rows measured within noise, Zen 4; 120 q8_0 rows of 64 on Zen 5, where 64 rows ran
// 6.9 ns a row from memory and 120 6.1-6.4); into L1, kL1PrefetchBytes (2 and 8 KiB measured,
// Zen 5).
constexpr int64_t kL2PrefetchBytes = 8192;
constexpr int64_t kL1PrefetchBytes = 4096;

// Asks for the cache lines of the 16 K/V rows of `elem` that start a prefetch distance after row
// j of `rows` (none past n_rows). A kv head's rows of one layer are contiguous within a block (16
// rows), the blocks anywhere in the pool: the kernels do not rely on the hardware prefetchers
// following them. Into L2 measured on the default model at context 1,024 (engine_bench, 4
// interleaved runs each, Zen 4): 1 thread 106-117 -> 133-146 tok/s, 2 threads 133-155 -> 161-186;
// into L1 instead, 32 rows ahead, gave 111-119 there. Into L1 (non-temporal) where
// PrefetchKvIntoL1() (prefetch.h), for rows of floats: on Zen 5 the default model's f16 K/V at
// context 4,096 from memory (cpu_ops_bench --attention) 10.6 -> 9.4 ns a row. Not q8_0 rows, whose
// scores kernel keeps a 16 KiB transposed tile in L1: 7.4 -> 8.1 ns a row there (Gemma 3's wider
// q8_0 rows went the other way, 42 -> 36). The call at row 0 also asks for the rows before the
// distance, which no call would otherwise (SmolLM2's q8_0 rows, Zen 5: 6.9 -> 6.7 ns a row at
// context 4,096, 7.2 -> 6.7 at 1,024). always_inline: see prefetch.h.
__attribute__((always_inline)) inline void PrefetchRowsAhead(const void* const* rows, int64_t j,
                                                             int64_t n_rows, KvElem elem,
                                                             int64_t row_bytes) {
  const bool into_l1 = elem != KvElem::kQ8_0 && PrefetchKvIntoL1();
  const int64_t ahead =
      std::max<int64_t>(16, (into_l1 ? kL1PrefetchBytes : kL2PrefetchBytes) / row_bytes);
  const int64_t last = std::min(n_rows, j + ahead + 16);
  for (int64_t r = j == 0 ? 0 : std::min(n_rows, j + ahead); r < last; ++r) {
    const char* row = static_cast<const char*>(rows[r]);
    for (int64_t off = 0; off < row_bytes; off += 64) {
      if (into_l1) {
        _mm_prefetch(row + off, _MM_HINT_NTA);
      } else {
        _mm_prefetch(row + off, _MM_HINT_T2);
      }
    }
  }
}

// The f16 scale of block b of a q8_0 row, in every lane.
inline __m512 Q8BlockScale(const void* row, int64_t b) {
  const auto* block = static_cast<const uint8_t*>(row) + b * 34;
  return _mm512_cvtph_ps(
      _mm256_set1_epi16(static_cast<int16_t>(block[0] | static_cast<uint16_t>(block[1]) << 8)));
}
// The int8 values of 16 (or fewer, masked) elements of a q8_0 row at offset i (i % 16 == 0), as
// floats, without the block's scale.
inline __m512 Q8Ints(const void* row, int64_t i, __mmask16 m) {
  const __m128i q =
      _mm_maskz_loadu_epi8(m, static_cast<const uint8_t*>(row) + i / 32 * 34 + 2 + i % 32);
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
}

// 16 (or fewer, masked) K/V elements of `elem` at element offset i as floats (i % 16 == 0 for
// kQ8_0: the 16 elements lie in one block).
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
    case KvElem::kQ8_0:
      return _mm512_mul_ps(Q8BlockScale(row, i / 32), Q8Ints(row, i, m));
  }
  return _mm512_setzero_ps();
}

// ggml_v_expf on 16 lanes (definition: ExpGgml in kernels/cpu/ops_scalar.cc).
inline __m512 ExpGgml512(__m512 x) {
  const __m512 shift = _mm512_set1_ps(0x1.8p23f);
  const __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), shift);
  const __m512 n = _mm512_sub_ps(z, shift);
  const __m512 b = _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.7f7d1cp-20f),
                                    _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e4p-1f), x));
  const __mmask16 big = _mm512_cmp_ps_mask(_mm512_abs_ps(n), _mm512_set1_ps(192.0f), _CMP_GT_OQ);
  const __m512 u = _mm512_mul_ps(b, b);
  const __m512 j = _mm512_fmadd_ps(
      _mm512_fmadd_ps(
          _mm512_fmadd_ps(_mm512_set1_ps(0x1.0e4020p-7f), b, _mm512_set1_ps(0x1.573e2ep-5f)), u,
          _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), b, _mm512_set1_ps(0x1.fffdb6p-2f))),
      u, _mm512_fmadd_ps(_mm512_set1_ps(0x1.ffffecp-1f), b, _mm512_set1_ps(1.0f)));
  const __m512 res = _mm512_scalef_ps(j, n);
  if (big == 0) return res;
  const __m512 saturated =
      _mm512_mask_blend_ps(_mm512_cmp_ps_mask(n, _mm512_setzero_ps(), _CMP_LE_OQ),
                           _mm512_set1_ps(__builtin_inff()), _mm512_setzero_ps());
  return _mm512_mask_blend_ps(big, res, saturated);
}

void SwiGlu(const float* gate, const float* up, int64_t n, float* y) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = TailMask(n - i);
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    const __m512 u = _mm512_maskz_loadu_ps(m, up + i);
    const __m512 e = ExpGgml512(_mm512_sub_ps(_mm512_setzero_ps(), g));
    _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), u));
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

void RoundF16(float* x, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = TailMask(n - i);
    _mm512_mask_storeu_ps(x + i, m,
                          _mm512_cvtph_ps(F16OfLanesAvx512(_mm512_maskz_loadu_ps(m, x + i))));
  }
}

void StoreF16(const float* x, int64_t n, uint16_t* y) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = TailMask(n - i);
    _mm256_mask_storeu_epi16(y + i, m, F16OfLanesAvx512(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

// (fma(x0, c, -(x1 * s)) is fmsub(x0, c, x1 * s): the same single rounding.)
void RopePairs(float* x, const float* c, const float* s, int64_t n_pairs, int64_t stride) {
  if (stride != 1) {  // NEOX: x0 and x1 are separate runs of n_pairs floats
    for (int64_t i = 0; i < n_pairs; i += 16) {
      const __mmask16 m = TailMask(n_pairs - i);
      const __m512 x0 = _mm512_maskz_loadu_ps(m, x + i);
      const __m512 x1 = _mm512_maskz_loadu_ps(m, x + stride + i);
      const __m512 cv = _mm512_maskz_loadu_ps(m, c + i);
      const __m512 sv = _mm512_maskz_loadu_ps(m, s + i);
      _mm512_mask_storeu_ps(x + i, m, _mm512_fmsub_ps(x0, cv, _mm512_mul_ps(x1, sv)));
      _mm512_mask_storeu_ps(x + stride + i, m, _mm512_fmadd_ps(x0, sv, _mm512_mul_ps(x1, cv)));
    }
    return;
  }
  // NORM: 8 pairs per vector, x0 in the even lanes, x1 in the odd ones.
  const __m512i dup = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  for (int64_t i = 0; i < n_pairs; i += 8) {
    const int64_t pairs = n_pairs - i < 8 ? n_pairs - i : 8;
    const __mmask16 m = TailMask(2 * pairs);
    const __mmask16 mp = TailMask(pairs);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + 2 * i);
    const __m512 swapped = _mm512_permute_ps(v, 0xB1);  // x1 in the even lanes, x0 in the odd
    const __m512 cv = _mm512_permutexvar_ps(dup, _mm512_maskz_loadu_ps(mp, c + i));
    const __m512 sv = _mm512_permutexvar_ps(dup, _mm512_maskz_loadu_ps(mp, s + i));
    const __m512 even = _mm512_fmsub_ps(v, cv, _mm512_mul_ps(swapped, sv));
    const __m512 odd = _mm512_fmadd_ps(swapped, sv, _mm512_mul_ps(v, cv));
    _mm512_mask_storeu_ps(x + 2 * i, m, _mm512_mask_blend_ps(0xAAAA, even, odd));
  }
}

// GCC's _mm512_reduce_add_ps, spelled out so the order is fixed whatever the compiler.
inline float Reduce16(__m512 v) {
  const __m256 t3 = _mm256_add_ps(_mm512_extractf32x8_ps(v, 1), _mm512_castps512_ps256(v));
  const __m128 t6 = _mm_add_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
  const __m128 t8 = _mm_add_ps(t6, _mm_movehl_ps(t6, t6));  // (t6[0] + t6[2], t6[1] + t6[3])
  return _mm_cvtss_f32(_mm_add_ss(t8, _mm_movehdup_ps(t8)));
}

// K rows against NG query heads; d % 64 == 0 handled here (the caller checks).
template <int NG>
void KvScoresFixed(const float* q, const void* k_rows, int64_t n_rows, KvElem elem, int64_t d,
                   float* scores, int64_t score_stride) {
  const int64_t row_bytes = RowBytes(elem, d);
  for (int64_t j = 0; j < n_rows; ++j) {
    const void* k_row = static_cast<const uint8_t*>(k_rows) + j * row_bytes;
    __m512 acc[NG][4];
    for (int g = 0; g < NG; ++g) {
      for (int l = 0; l < 4; ++l) acc[g][l] = _mm512_setzero_ps();
    }
    for (int64_t i = 0; i < d; i += 64) {
      for (int l = 0; l < 4; ++l) {
        const __m512 k = LoadKv(k_row, elem, i + 16 * l, 0xFFFF);
        for (int g = 0; g < NG; ++g) {
          acc[g][l] = _mm512_fmadd_ps(k, _mm512_loadu_ps(q + g * d + i + 16 * l), acc[g][l]);
        }
      }
    }
    for (int g = 0; g < NG; ++g) {
      const __m512 v =
          _mm512_add_ps(_mm512_add_ps(acc[g][0], acc[g][2]), _mm512_add_ps(acc[g][1], acc[g][3]));
      scores[g * score_stride + j] = Reduce16(v);
    }
  }
}

// tinyBLAS order: one 16-lane FMA chain per (row, head) over d (d % 16 == 0).
void KvScores16(const float* q, int64_t n_q, const void* k_rows, int64_t n_rows, KvElem elem,
                int64_t d, float* scores, int64_t score_stride) {
  const int64_t row_bytes = RowBytes(elem, d);
  for (int64_t j = 0; j < n_rows; ++j) {
    const void* k_row = static_cast<const uint8_t*>(k_rows) + j * row_bytes;
    for (int64_t g = 0; g < n_q; ++g) {
      __m512 acc = _mm512_setzero_ps();
      for (int64_t i = 0; i < d; i += 16) {
        acc = _mm512_fmadd_ps(LoadKv(k_row, elem, i, 0xFFFF), _mm512_loadu_ps(q + g * d + i), acc);
      }
      scores[g * score_stride + j] = Reduce16(acc);
    }
  }
}

// Precondition: d % 64 == 0 for n_lanes = kAttnLanes, d % 16 == 0 for kAttnLanesTinyBlas
// (PagedAttention uses the scalar kernel otherwise).
void KvScores(const float* q, int64_t n_q, const void* k_rows, int64_t n_rows, KvElem elem,
              int64_t d, int64_t n_lanes, float* scores, int64_t score_stride) {
  if (n_lanes == kAttnLanesTinyBlas) {
    KvScores16(q, n_q, k_rows, n_rows, elem, d, scores, score_stride);
    return;
  }
  for (int64_t g0 = 0; g0 < n_q; g0 += 4) {
    const float* qg = q + g0 * d;
    float* sg = scores + g0 * score_stride;
    switch (n_q - g0 < 4 ? n_q - g0 : 4) {
      case 1:
        KvScoresFixed<1>(qg, k_rows, n_rows, elem, d, sg, score_stride);
        break;
      case 2:
        KvScoresFixed<2>(qg, k_rows, n_rows, elem, d, sg, score_stride);
        break;
      case 3:
        KvScoresFixed<3>(qg, k_rows, n_rows, elem, d, sg, score_stride);
        break;
      default:
        KvScoresFixed<4>(qg, k_rows, n_rows, elem, d, sg, score_stride);
        break;
    }
  }
}

double SoftmaxExp(const float* x, float max, int64_t n, float* y) {
  const __m512 mv = _mm512_set1_ps(max);
  double sum = 0.0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {  // whole vectors without masks, then the tail
    const __m512 e = ExpGgml512(_mm512_sub_ps(_mm512_loadu_ps(x + i), mv));
    _mm512_storeu_ps(y + i, e);
    sum += static_cast<double>(Reduce16(e));
  }
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    const __m512 e =
        _mm512_maskz_mov_ps(m, ExpGgml512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), mv)));
    _mm512_mask_storeu_ps(y + i, m, e);
    sum += static_cast<double>(Reduce16(e));
  }
  return sum;
}

void KvAccumulate(float* acc, const float* p, const void* v_rows, int64_t n_rows, int64_t lane0,
                  int64_t n_lanes, KvElem elem, int64_t d) {
  const int64_t row_bytes = RowBytes(elem, d);
  for (int64_t j = 0; j < n_rows; ++j) {
    const void* v = static_cast<const uint8_t*>(v_rows) + j * row_bytes;
    float* a = acc + ((lane0 + j) % n_lanes) * d;
    const __m512 pj = _mm512_set1_ps(p[j]);
    for (int64_t i = 0; i < d; i += 16) {
      const __mmask16 m = TailMask(d - i);
      _mm512_mask_storeu_ps(
          a + i, m, _mm512_fmadd_ps(LoadKv(v, elem, i, m), pj, _mm512_maskz_loadu_ps(m, a + i)));
    }
  }
}

// Runs of 16 rows in ggml lane groups: for each 16-lane group and 16-float slice of d, the 16
// accumulators stay in registers over every run of that group (runs are visited in index order,
// so each lane's FMA order is kv_accumulate's).
void KvAccumulateGroups(float* acc, const float* p, const void* const* v_groups, int64_t n_groups,
                        int64_t n_lanes, KvElem elem, int64_t d) {
  const int64_t lane_groups = n_lanes / 16;
  const int64_t row_bytes = RowBytes(elem, d);
  for (int64_t lg = 0; lg < lane_groups && lg < n_groups; ++lg) {
    for (int64_t i = 0; i < d; i += 16) {
      const __mmask16 m = TailMask(d - i);
      __m512 a[16];
      for (int l = 0; l < 16; ++l) a[l] = _mm512_maskz_loadu_ps(m, acc + (lg * 16 + l) * d + i);
      // The runs of this lane group: r = lg, lg + lane_groups, ... (index order).
      for (int64_t r = lg; r < n_groups; r += lane_groups) {
        const uint8_t* rows = static_cast<const uint8_t*>(v_groups[r]);
        const float* pr = p + 16 * r;
        for (int l = 0; l < 16; ++l) {
          a[l] = _mm512_fmadd_ps(LoadKv(rows + l * row_bytes, elem, i, m), _mm512_set1_ps(pr[l]),
                                 a[l]);
        }
      }
      for (int l = 0; l < 16; ++l) _mm512_mask_storeu_ps(acc + (lg * 16 + l) * d + i, m, a[l]);
    }
  }
}

// kv_scores_rows's lane tree, transposed: rows' 16-lane vectors in, one lane per row out.
// Level 1 pairs rows (unpacklo/hi: x[4q] + x[4q+2] next to x[4q+1] + x[4q+3]); level 2 gives the
// quad sums: for a[0..3], 128-bit lane q, element e = Q_q of row e.
inline __m512 QuadSums4(const __m512* a) {
  const __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(a[0], a[1]), _mm512_unpackhi_ps(a[0], a[1]));
  const __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(a[2], a[3]), _mm512_unpackhi_ps(a[2], a[3]));
  // t0, per 128-bit lane q: [r0: x0+x2, r1: x0+x2, r0: x1+x3, r1: x1+x3].
  return _mm512_add_ps(_mm512_shuffle_ps(t0, t1, _MM_SHUFFLE(1, 0, 1, 0)),
                       _mm512_shuffle_ps(t0, t1, _MM_SHUFFLE(3, 2, 3, 2)));
}
// Quad sums of rows 0..3 (u0) and 4..7 (u1) -> 128-bit lanes [Q0+Q2 | Q1+Q3 of rows 0..3,
// Q0+Q2 | Q1+Q3 of rows 4..7].
inline __m512 HalfSums8(__m512 u0, __m512 u1) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(u0, u1, _MM_SHUFFLE(1, 0, 1, 0)),
                       _mm512_shuffle_f32x4(u0, u1, _MM_SHUFFLE(3, 2, 3, 2)));
}
// a[0..15] -> lane r = row r's sum ((Q0 + Q2) + (Q1 + Q3)).
inline __m512 TransposeSum16(const __m512 a[16]) {
  const __m512 s01 = HalfSums8(QuadSums4(a), QuadSums4(a + 4));
  const __m512 s23 = HalfSums8(QuadSums4(a + 8), QuadSums4(a + 12));
  return _mm512_add_ps(_mm512_shuffle_f32x4(s01, s23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(s01, s23, _MM_SHUFFLE(3, 1, 3, 1)));
}
// a[0..7] -> lane r = row r's sum.
inline __m256 TransposeSum8(const __m512 a[8]) {
  const __m512 s = HalfSums8(QuadSums4(a), QuadSums4(a + 4));
  return _mm512_castps512_ps256(_mm512_add_ps(_mm512_shuffle_f32x4(s, s, _MM_SHUFFLE(2, 0, 2, 0)),
                                              _mm512_shuffle_f32x4(s, s, _MM_SHUFFLE(3, 1, 3, 1))));
}

// Scores of NQ <= 3 heads (q: [NQ, d]) against 8 rows (missing rows point at zeros), into
// scores[g * score_stride + r] for r < n_valid. Each slice of 16 K elements is widened once in a
// register for the NQ heads: 8 NQ accumulators, no widened copy in memory (see
// kMaxRegisterHeads for what that saves).
template <int NQ, KvElem kElem>
__attribute__((always_inline)) inline void ScoresOf8Rows(const float* q, int64_t d,
                                                         const void* const rows[8], int n_valid,
                                                         float* scores, int64_t score_stride) {
  __m512 acc[NQ][8];
  Unroll<NQ>([&](auto g) { Unroll<8>([&](auto r) { acc[g][r] = _mm512_setzero_ps(); }); });
  for (int64_t i = 0; i < d; i += 16) {
    __m512 qv[NQ];
    Unroll<NQ>([&](auto g) { qv[g] = _mm512_loadu_ps(q + g * d + i); });
    Unroll<8>([&](auto r) {
      const __m512 k = LoadKv(rows[r], kElem, i, 0xFFFF);
      Unroll<NQ>([&](auto g) { acc[g][r] = _mm512_fmadd_ps(k, qv[g], acc[g][r]); });
    });
  }
  const __mmask8 m = static_cast<__mmask8>((1u << n_valid) - 1);
  if constexpr (NQ >= 2) {  // heads 0 and 1 in one tree: lanes 0..7 and 8..15
    __m512 a[16];
    Unroll<8>([&](auto r) {
      a[r] = acc[0][r];
      a[8 + r] = acc[1][r];
    });
    const __m512 s = TransposeSum16(a);
    _mm256_mask_storeu_ps(scores, m, _mm512_castps512_ps256(s));
    _mm256_mask_storeu_ps(scores + score_stride, m, _mm512_extractf32x8_ps(s, 1));
  }
  if constexpr (NQ != 2) {
    _mm256_mask_storeu_ps(scores + (NQ - 1) * score_stride, m, TransposeSum8(acc[NQ - 1]));
  }
}

// Rows [0, rows) of `src` (K elements of kElem, d per row) widened into dst in slice-major
// order: element 16 c + l of row r at dst[(16 c + r) * 16 + l], so the 16 rows' slice c is one
// run of 16 vectors at fixed offsets from its start. Rows up to 16 are zero-filled. d % 16 == 0.
template <KvElem kElem>
void WidenRows(const void* const* src, int rows, int64_t d, float* dst) {
  for (int r = 0; r < 16; ++r) {
    for (int64_t c = 0; c < d / 16; ++c) {
      _mm512_store_ps(dst + (16 * c + r) * 16,
                      r < rows ? LoadKv(src[r], kElem, 16 * c, 0xFFFF) : _mm512_setzero_ps());
    }
  }
}

// WidenedScores serves heads up to this wide (its stack buffer holds 16 rows of them).
constexpr int64_t kMaxWidenedDim = 64;

// kv_scores_rows for more than kMaxRegisterHeads narrow heads (several tokens' heads of a prompt
// chunk): per block of 16 rows, the rows widened once into a slice-major buffer, then per head 16
// accumulators reading each slice back.
template <KvElem kElem>
void WidenedScores(const float* q, int64_t n_q, const void* const* k_rows, int64_t n_rows,
                   int64_t d, float* scores, int64_t score_stride) {
  alignas(64) float widened[16 * kMaxWidenedDim];
  const int64_t row_bytes = RowBytes(kElem, d);
  for (int64_t j0 = 0; j0 < n_rows; j0 += 16) {
    const int rows = n_rows - j0 < 16 ? static_cast<int>(n_rows - j0) : 16;
    PrefetchRowsAhead(k_rows, j0, n_rows, kElem, row_bytes);
    WidenRows<kElem>(k_rows + j0, rows, d, widened);
    for (int64_t g = 0; g < n_q; ++g) {
      const float* qg = q + g * d;
      __m512 acc[16];
      Unroll<16>([&](auto r) { acc[r] = _mm512_setzero_ps(); });
      for (int64_t i = 0; i < d; i += 16) {
        const __m512 qv = _mm512_loadu_ps(qg + i);
        const float* slice = widened + i * 16;  // [16 rows][16]
        Unroll<16>(
            [&](auto r) { acc[r] = _mm512_fmadd_ps(_mm512_load_ps(slice + 16 * r), qv, acc[r]); });
      }
      _mm512_mask_storeu_ps(scores + g * score_stride + j0, TailMask(rows), TransposeSum16(acc));
    }
  }
}

// Up to this many heads, or for heads wider than kMaxWidenedDim, kv_scores_rows converts each K
// slice in registers once per group of 3 heads; more heads of 64 or fewer share one widened copy.
// One thread, 1,024 f16 rows in L2, cycles per row in registers / widened: head_dim 64: 3 heads
// 20.3 / 25.3, 6: 38.3 / 42.5, 9: 56.8 / 57.0, 12: 74.9 / 70.9, 24: 146.6 / 128.2; head_dim
// 128: 4 heads 51.9 / 64.2, 24: 244.2 / 252.4; head_dim 256: 4 heads 96.3 / 127.0, 24: 441.5 /
// 502.1.
constexpr int64_t kMaxRegisterHeads = 9;

// kv_scores_rows for d % 16 == 0 and d <= 1024 (the zero row; PagedAttention rejects wider
// heads), one K element type. Up to kMaxRegisterHeads heads (a decode step's GQA group) or heads
// wider than kMaxWidenedDim: per run of 8 rows, the heads in groups of up to 3
// (ScoresOf8Rows); the missing rows of a last partial run read zeros and their sums are dropped
// (each lane of the tree adds only its own row's values). More heads: WidenedScores.
template <KvElem kElem>
void KvScoresRowsOf(const float* q, int64_t n_q, const void* const* k_rows, int64_t n_rows,
                    int64_t d, float* scores, int64_t score_stride) {
  if (n_q > kMaxRegisterHeads && d <= kMaxWidenedDim) {
    return WidenedScores<kElem>(q, n_q, k_rows, n_rows, d, scores, score_stride);
  }
  alignas(64) static const float kZeroRow[1024] = {};
  const int64_t row_bytes = RowBytes(kElem, d);
  for (int64_t j0 = 0; j0 < n_rows; j0 += 8) {
    const int rows = n_rows - j0 < 8 ? static_cast<int>(n_rows - j0) : 8;
    if (j0 % 16 == 0) {
      PrefetchRowsAhead(k_rows, j0, n_rows, kElem, row_bytes);
    }
    const void* tail[8];
    const void* const* block = k_rows + j0;
    if (rows < 8) {
      for (int r = 0; r < 8; ++r) tail[r] = r < rows ? k_rows[j0 + r] : kZeroRow;
      block = tail;
    }
    ForEachTile<3>(static_cast<int>(n_q), [&]<int NQ>(int g) {
      ScoresOf8Rows<NQ, kElem>(q + g * d, d, block, rows, scores + g * score_stride + j0,
                               score_stride);
    });
  }
}

void KvScoresRows(const float* q, int64_t n_q, const void* const* k_rows, int64_t n_rows,
                  KvElem elem, int64_t d, float* scores, int64_t score_stride) {
  WithKvElem(elem, [&]<KvElem E>() {
    KvScoresRowsOf<E>(q, n_q, k_rows, n_rows, d, scores, score_stride);
  });
}

// kv_scores_rows_q8_0 (op_kernels.h), 16 rows a pass. Each pair of blocks of the 16 rows (their
// 64 int8) is transposed once, so that one register holds the same 4 bytes of all 16 rows; each 4
// query bytes, broadcast, then meet the 16 rows in one vpdpbusd, and each lane ends with its
// row's exact block sums, no horizontal sums. vpdpbusd multiplies unsigned by signed bytes: K is
// read as k ^ 0x80 = k + 128, and 128 * (the query block's sum) starts the chain below zero.
void KvScoresRowsQ8_0(const void* q8, int64_t n_q, const void* const* k_rows, int64_t n_rows,
                      int64_t d, float* scores, int64_t score_stride) {
  constexpr int64_t kBlockBytes = 34;
  const int64_t nb = d / 32, n_pairs = (nb + 1) / 2;
  const auto* q = static_cast<const uint8_t*>(q8);
  alignas(64) static const uint8_t kZeroRow[kBlockBytes * 32] = {};  // d <= 1024
  alignas(64) __m512i k_t[16 * 16];  // [pair][dword k]: dword k of the pair's 64 bytes, 16 rows
  alignas(64) float dk[32][16];      // [block][row]
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  const int64_t row_bytes = nb * kBlockBytes;
  // q_bias[g * nb + b] = -128 * (the sum of head g's block b), once a call: the sum of q + 128
  // over the 32 bytes, less 32 * 128.
  auto* q_bias = static_cast<int32_t*>(kernels::ThreadScratch(0, n_q * nb * sizeof(int32_t)));
  for (int64_t i = 0; i < n_q * nb; ++i) {
    const __m256i qv =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + i * kBlockBytes + 2));
    const __m256i sad = _mm256_sad_epu8(
        _mm256_xor_si256(qv, _mm256_set1_epi8(static_cast<char>(0x80))), _mm256_setzero_si256());
    const __m128i sad2 =
        _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
    const int32_t sum = static_cast<int32_t>(_mm_cvtsi128_si64(
                            _mm_add_epi64(sad2, _mm_unpackhi_epi64(sad2, sad2)))) -
                        32 * 128;
    q_bias[i] = -128 * sum;
  }
  for (int64_t j0 = 0; j0 < n_rows; j0 += 16) {
    const int rows = n_rows - j0 < 16 ? static_cast<int>(n_rows - j0) : 16;
    PrefetchRowsAhead(k_rows, j0, n_rows, KvElem::kQ8_0, row_bytes);
    const uint8_t* row[16];
    for (int r = 0; r < 16; ++r) {
      row[r] = r < rows ? static_cast<const uint8_t*>(k_rows[j0 + r]) : kZeroRow;
    }
    for (int64_t b = 0; b < nb; ++b) {
      alignas(32) uint16_t h[16];
      for (int r = 0; r < 16; ++r) std::memcpy(&h[r], row[r] + b * kBlockBytes, 2);
      _mm512_store_ps(dk[b], _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<__m256i*>(h))));
    }
    for (int64_t p = 0; p < n_pairs; ++p) {
      const bool two = 2 * p + 1 < nb;
      __m512i* t = k_t + 16 * p;
      for (int r = 0; r < 16; ++r) {
        const uint8_t* blocks = row[r] + 2 * p * kBlockBytes + 2;
        const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blocks));
        const __m256i hi =
            two ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blocks + kBlockBytes))
                : _mm256_setzero_si256();
        t[r] = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), bias);
      }
      Transpose16x16(t);
    }
    const __mmask16 m = TailMask(rows);
    // Heads in tiles of up to 3, each block's 8 transposed dwords loaded once for the tile; each
    // head's chain over the blocks in order.
    ForEachTile<3>(static_cast<int>(n_q), [&]<int NQ>(int g0) {
      __m512 s[NQ];
      Unroll<NQ>([&](auto h) { s[h] = _mm512_setzero_ps(); });
      for (int64_t b = 0; b < nb; ++b) {
        const __m512i* t = k_t + 16 * (b / 2) + 8 * (b % 2);
        __m512i kt[8];
        Unroll<8>([&](auto k) { kt[k] = _mm512_load_si512(t + k); });
        const __m512 dkb = _mm512_load_ps(dk[b]);
        Unroll<NQ>([&](auto h) {
          const int64_t g = g0 + h;
          const uint8_t* qb = q + (g * nb + b) * kBlockBytes;
          __m512i acc[2] = {_mm512_set1_epi32(q_bias[g * nb + b]), _mm512_setzero_si512()};
          Unroll<8>([&](auto k) {
            int32_t qd;
            std::memcpy(&qd, qb + 2 + 4 * k, 4);
            acc[k % 2] = _mm512_dpbusd_epi32(acc[k % 2], kt[k], _mm512_set1_epi32(qd));
          });
          uint16_t hq;
          std::memcpy(&hq, qb, 2);
          // (_cvtsh_ss: exact, as Fp16ToFp32, whose portable bit steps and branches were a third
          // of this loop's instructions.)
          const __m512 scale = _mm512_mul_ps(dkb, _mm512_set1_ps(_cvtsh_ss(hq)));
          s[h] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(_mm512_add_epi32(acc[0], acc[1])), s[h]);
        });
      }
      Unroll<NQ>(
          [&](auto h) { _mm512_mask_storeu_ps(scores + (g0 + h) * score_stride + j0, m, s[h]); });
    });
  }
}

// NQ heads x kSlices slices of 16 columns [c0, c0 + 16 kSlices) per pass over the rows (the last
// slice masked by last_mask: the tail of d), one V element type, continuing the chains in out:
// NQ * kSlices accumulators stay in registers, each V slice is widened once for the NQ heads.
template <int NQ, KvElem kElem, int kSlices>
inline void KvAccumulateColumns(float* out, const float* p, int64_t p_stride,
                                const void* const* v_rows, int64_t n_rows, int64_t d, int64_t c0,
                                __mmask16 last_mask) {
  const int64_t row_bytes = RowBytes(kElem, d);
  auto mask = [&](int s) { return s == kSlices - 1 ? last_mask : static_cast<__mmask16>(0xFFFF); };
  __m512 acc[NQ][kSlices];
  Unroll<NQ>([&](auto g) {
    Unroll<kSlices>(
        [&](auto s) { acc[g][s] = _mm512_maskz_loadu_ps(mask(s), out + g * d + c0 + 16 * s); });
  });
  for (int64_t j = 0; j < n_rows; ++j) {
    if (c0 == 0 && j % 16 == 0) {
      PrefetchRowsAhead(v_rows, j, n_rows, kElem, row_bytes);
    }
    __m512 pj[NQ];
    Unroll<NQ>([&](auto g) { pj[g] = _mm512_set1_ps(p[g * p_stride + j]); });
    // q8_0: each block's scale once for its two slices (LoadKv's product, the same bits).
    constexpr int kBlocks = (kSlices + 1) / 2;
    __m512 q8_scale[kBlocks];
    if constexpr (kElem == KvElem::kQ8_0) {
      Unroll<kBlocks>([&](auto h) { q8_scale[h] = Q8BlockScale(v_rows[j], c0 / 32 + h); });
    }
    Unroll<kSlices>([&](auto s) {
      __m512 v;
      if constexpr (kElem == KvElem::kQ8_0) {
        v = _mm512_mul_ps(q8_scale[s / 2], Q8Ints(v_rows[j], c0 + 16 * s, mask(s)));
      } else {
        v = LoadKv(v_rows[j], kElem, c0 + 16 * s, mask(s));
      }
      Unroll<NQ>([&](auto g) { acc[g][s] = _mm512_fmadd_ps(v, pj[g], acc[g][s]); });
    });
  }
  Unroll<NQ>([&](auto g) {
    Unroll<kSlices>(
        [&](auto s) { _mm512_mask_storeu_ps(out + g * d + c0 + 16 * s, mask(s), acc[g][s]); });
  });
}

// The columns of d in passes of 64, then the tail in as many slices as it needs (a q8_0 row's
// tail is one whole block: two unmasked slices).
template <int NQ, KvElem kElem>
void KvAccumulateRowsOf(float* out, const float* p, int64_t p_stride, const void* const* v_rows,
                        int64_t n_rows, int64_t d) {
  int64_t c0 = 0;
  for (; c0 + 64 <= d; c0 += 64) {
    KvAccumulateColumns<NQ, kElem, 4>(out, p, p_stride, v_rows, n_rows, d, c0, 0xFFFF);
  }
  const int64_t tail = d - c0;
  if (tail == 0) return;
  const __mmask16 last = TailMask(tail - 16 * ((tail - 1) / 16));
  switch ((tail + 15) / 16) {
    case 1:
      KvAccumulateColumns<NQ, kElem, 1>(out, p, p_stride, v_rows, n_rows, d, c0, last);
      break;
    case 2:
      KvAccumulateColumns<NQ, kElem, 2>(out, p, p_stride, v_rows, n_rows, d, c0, last);
      break;
    default:
      KvAccumulateColumns<NQ, kElem, 3>(out, p, p_stride, v_rows, n_rows, d, c0, last);
      break;
  }
}

// kv_accumulate_rows for one V element type, in groups of up to 4 heads. (Widening 16 rows into
// a buffer once for all the heads of a chunk, as the scores do, measured no faster here: the
// FMAs, not the conversions, bound this loop.)
template <KvElem kElem>
void KvAccumulateRowsElem(float* out, const float* p, int64_t p_stride, int64_t n_q,
                          const void* const* v_rows, int64_t n_rows, int64_t d) {
  ForEachTile<4>(static_cast<int>(n_q), [&]<int NQ>(int g0) {
    KvAccumulateRowsOf<NQ, kElem>(out + g0 * d, p + g0 * p_stride, p_stride, v_rows, n_rows, d);
  });
}

void KvAccumulateRows(float* out, const float* p, int64_t p_stride, int64_t n_q,
                      const void* const* v_rows, int64_t n_rows, KvElem elem, int64_t d) {
  WithKvElem(
      elem, [&]<KvElem E>() { KvAccumulateRowsElem<E>(out, p, p_stride, n_q, v_rows, n_rows, d); });
}

void ReduceLanes(const float* acc, int64_t n_lanes, int64_t d, float* out) {
  for (int64_t i = 0; i < d; i += 16) {
    const __mmask16 m = TailMask(d - i);
    auto lane = [&](int64_t l) { return _mm512_maskz_loadu_ps(m, acc + l * d + i); };
    __m512 v[16];
    for (int l = 0; l < 16; ++l) {
      v[l] = n_lanes == kAttnLanesTinyBlas
                 ? lane(l)
                 : _mm512_add_ps(_mm512_add_ps(lane(l), lane(32 + l)),
                                 _mm512_add_ps(lane(16 + l), lane(48 + l)));
    }
    // _mm512_reduce_add_ps's tree across the 16 lanes, element-wise over d.
    __m512 t3[8], t6[4];
    for (int l = 0; l < 8; ++l) t3[l] = _mm512_add_ps(v[8 + l], v[l]);
    for (int l = 0; l < 4; ++l) t6[l] = _mm512_add_ps(t3[4 + l], t3[l]);
    const __m512 r = _mm512_add_ps(_mm512_add_ps(t6[0], t6[2]), _mm512_add_ps(t6[1], t6[3]));
    _mm512_mask_storeu_ps(out + i, m, r);
  }
}

// ggml's f16-table GeGLU (op_kernels.h), 16 lanes: vcvtps2ph (nearest even, as Fp32ToFp16 on
// every non-NaN) gives the table index, a 32-bit gather at 2-byte scale reads the entry (its high
// half is the next entry or the padding entry, dropped by vpmovdw). A chunk holding a NaN gate
// takes the scalar steps (Fp32ToFp16's NaN bits differ from vcvtps2ph's).
void GeGlu(const float* gate, const float* up, const uint16_t* table, int64_t n, float* y) {
  const __m512 lo = _mm512_set1_ps(-10.0f), hi = _mm512_set1_ps(10.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = TailMask(n - i);
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    const __m512 u = _mm512_maskz_loadu_ps(m, up + i);
    if (_mm512_cmp_ps_mask(g, g, _CMP_UNORD_Q) != 0) {
      for (int64_t j = i; j < n && j < i + 16; ++j) {
        const float gj = gate[j];
        y[j] = gj <= -10.0f  ? 0.0f
               : gj >= 10.0f ? gj * up[j]
                             : Fp16ToFp32(table[Fp32ToFp16(gj)]) * up[j];
      }
      continue;
    }
    const __m512i idx = _mm512_cvtepu16_epi32(_mm512_cvtps_ph(g, _MM_FROUND_TO_NEAREST_INT));
    const __m512i entries = _mm512_i32gather_epi32(idx, table, 2);
    __m512 r = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(entries)), u);
    r = _mm512_mask_mul_ps(r, _mm512_cmp_ps_mask(g, hi, _CMP_GE_OQ), g, u);
    r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(g, lo, _CMP_LE_OQ), _mm512_setzero_ps());
    _mm512_mask_storeu_ps(y + i, m, r);
  }
}

}  // namespace

void FillOpKernelsAvx512(OpKernels* k) {
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
  k->kv_scores_rows_q8_0 = KvScoresRowsQ8_0;
  k->kv_scores_rows = KvScoresRows;  // PagedAttention calls it for d % 16 == 0 only
  k->kv_accumulate_rows = KvAccumulateRows;
  k->reduce_lanes = ReduceLanes;
  k->kv_accumulate = KvAccumulate;
}

}  // namespace kiln::cpu
