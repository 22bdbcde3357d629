// AVX2+FMA+F16C versions of the CPU op kernels (kernels/cpu/op_kernels.h). Compiled with
// -mavx2 -mfma -mf16c (kernels/cpu/CMakeLists.txt); only called when the CPU has them.
// No std:: templates or shared inline functions here (see op_kernels.h; unroll.h and
// kv_elem_dispatch.h only ever take this file's own lambdas). Tails (n % 8) run
// scalar code in the same order on every call, so results stay deterministic.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/kv_elem_dispatch.h"
#include "kernels/cpu/op_kernels.h"
#include "kernels/cpu/unroll.h"
#include "lib/common/half.h"

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

// ggml_v_expf on 8 lanes, bit for bit ExpGgml (kernels/cpu/ops_scalar.cc): the same FMAs; its
// ldexp(j, n) for |n| <= 192 as (j * 2^(n/2)) * 2^(n - n/2): both factors are normal floats and
// the first product is exact (|j| in [0.7, 1.5]), so the one rounding is ldexp's, subnormal
// results included. |n| > 192 saturates to 0 or inf; NaN stays NaN.
inline __m256 ExpGgml256(__m256 x) {
  const __m256 shift = _mm256_set1_ps(0x1.8p23f);
  const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), shift);
  const __m256 n = _mm256_sub_ps(z, shift);
  const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                    _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
  const __m256 u = _mm256_mul_ps(b, b);
  const __m256 j = _mm256_fmadd_ps(
      _mm256_fmadd_ps(
          _mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)), u,
          _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f))),
      u, _mm256_fmadd_ps(_mm256_set1_ps(0x1.ffffecp-1f), b, _mm256_set1_ps(1.0f)));
  const __m256 abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
  const __m256 big = _mm256_cmp_ps(abs_n, _mm256_set1_ps(192.0f), _CMP_GT_OQ);
  // Big lanes get n = 0 here (any finite scale will do: the blend below replaces them).
  const __m256i ni = _mm256_cvttps_epi32(_mm256_andnot_ps(big, n));
  const __m256i half_n = _mm256_srai_epi32(ni, 1);
  const __m256 s1 =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half_n, _mm256_set1_epi32(127)), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(
      _mm256_add_epi32(_mm256_sub_epi32(ni, half_n), _mm256_set1_epi32(127)), 23));
  const __m256 res = _mm256_mul_ps(_mm256_mul_ps(j, s1), s2);
  if (_mm256_movemask_ps(big) == 0) return res;
  const __m256 saturated = _mm256_blendv_ps(_mm256_set1_ps(__builtin_inff()), _mm256_setzero_ps(),
                                            _mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ));
  return _mm256_blendv_ps(res, saturated, big);
}

// Lanes [0, remaining) set, for maskload/maskstore.
inline __m256i TailMask8(int64_t remaining) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(remaining < 8 ? remaining : 8)),
                            lane);
}

void SwiGlu(const float* gate, const float* up, int64_t n, float* y) {
  const __m256 one = _mm256_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i m = TailMask8(n - i);
    const __m256 g = _mm256_maskload_ps(gate + i, m);
    const __m256 e = ExpGgml256(_mm256_sub_ps(_mm256_setzero_ps(), g));
    _mm256_maskstore_ps(
        y + i, m,
        _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_maskload_ps(up + i, m)));
  }
}

// _mm512_reduce_add_ps's order (GCC) on lanes lo[0..7], hi[0..7] = 8..15.
inline float Reduce16(__m256 lo, __m256 hi) {
  const __m256 t3 = _mm256_add_ps(hi, lo);
  const __m128 t6 = _mm_add_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
  const __m128 t7 = _mm_add_ps(t6, _mm_movehl_ps(t6, t6));  // (t6[0] + t6[2]), (t6[1] + t6[3])
  return _mm_cvtss_f32(_mm_add_ss(t7, _mm_movehdup_ps(t7)));
}

double SoftmaxExp(const float* x, float max, int64_t n, float* y) {
  const __m256 mv = _mm256_set1_ps(max);
  double sum = 0.0;
  for (int64_t c = 0; c < n; c += 16) {
    __m256 e[2];
    for (int h = 0; h < 2; ++h) {
      const int64_t i = c + 8 * h;
      const __m256i m = TailMask8(n - i);
      // Lanes past n are 0 (their exp of the masked load's 0 - max is discarded).
      e[h] = _mm256_and_ps(_mm256_castsi256_ps(m),
                           ExpGgml256(_mm256_sub_ps(_mm256_maskload_ps(x + i, m), mv)));
      _mm256_maskstore_ps(y + i, m, e[h]);
    }
    sum += static_cast<double>(Reduce16(e[0], e[1]));
  }
  return sum;
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

void StoreF16(const float* x, int64_t n, uint16_t* y) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    // vcvtps2ph keeps a NaN's payload; the definition stores every NaN as sign | 0x7E00.
    if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0) {
      for (int64_t j = i; j < i + 8; ++j) y[j] = Fp32ToFp16(x[j]);
    }
  }
  for (; i < n; ++i) y[i] = Fp32ToFp16(x[i]);
}

// (fma(x0, c, -(x1 * s)) is fmsub(x0, c, x1 * s): the same single rounding.)
void RopePairs(float* x, const float* c, const float* s, int64_t n_pairs, int64_t stride) {
  int64_t i = 0;
  if (stride != 1) {  // NEOX: x0 and x1 are separate runs of n_pairs floats
    for (; i + 8 <= n_pairs; i += 8) {
      const __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + stride + i);
      const __m256 cv = _mm256_loadu_ps(c + i), sv = _mm256_loadu_ps(s + i);
      _mm256_storeu_ps(x + i, _mm256_fmsub_ps(x0, cv, _mm256_mul_ps(x1, sv)));
      _mm256_storeu_ps(x + stride + i, _mm256_fmadd_ps(x0, sv, _mm256_mul_ps(x1, cv)));
    }
  } else {  // NORM: 4 pairs per vector, x0 in the even lanes, x1 in the odd ones
    const __m256i dup = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
    for (; i + 4 <= n_pairs; i += 4) {
      const __m256 v = _mm256_loadu_ps(x + 2 * i);
      const __m256 swapped = _mm256_permute_ps(v, 0xB1);
      const __m256 cv = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(c + i)), dup);
      const __m256 sv = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(s + i)), dup);
      const __m256 even = _mm256_fmsub_ps(v, cv, _mm256_mul_ps(swapped, sv));
      const __m256 odd = _mm256_fmadd_ps(swapped, sv, _mm256_mul_ps(v, cv));
      _mm256_storeu_ps(x + 2 * i, _mm256_blend_ps(even, odd, 0xAA));
    }
  }
  for (; i < n_pairs; ++i) {
    float* a = x + (stride == 1 ? 2 * i : i);
    const float x0 = a[0], x1 = a[stride];
    a[0] = std::fma(x0, c[i], -(x1 * s[i]));
    a[stride] = std::fma(x0, s[i], x1 * c[i]);
  }
}

// The f32 of the f16 scale at the start of a Q8_0 block.
inline float Q8_0Scale(const uint8_t* block) {
  uint16_t d;
  std::memcpy(&d, block, 2);
  return _cvtsh_ss(d);
}

// 8 K/V elements of `elem` at element offset i as floats (i % 8 == 0 for kQ8_0).
inline __m256 LoadKv8(const void* row, KvElem elem, int64_t i) {
  const auto* h = reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + i);
  switch (elem) {
    case KvElem::kF32:
      return _mm256_loadu_ps(static_cast<const float*>(row) + i);
    case KvElem::kF16:
      return _mm256_cvtph_ps(_mm_loadu_si128(h));
    case KvElem::kBf16:
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(h)), 16));
    case KvElem::kQ8_0: {
      const auto* block = static_cast<const uint8_t*>(row) + i / 32 * 34;
      const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + 2 + i % 32));
      return _mm256_mul_ps(_mm256_set1_ps(Q8_0Scale(block)),
                           _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
    }
  }
  return _mm256_setzero_ps();
}

inline float LoadKv1(const void* row, KvElem elem, int64_t i) {
  switch (elem) {
    case KvElem::kF32:
      return static_cast<const float*>(row)[i];
    case KvElem::kF16:
      return _cvtsh_ss(static_cast<const uint16_t*>(row)[i]);
    case KvElem::kBf16: {
      const uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t*>(row)[i]) << 16;
      float f;
      std::memcpy(&f, &bits, sizeof(f));
      return f;
    }
    case KvElem::kQ8_0: {
      const auto* block = static_cast<const uint8_t*>(row) + i / 32 * 34;
      return Q8_0Scale(block) * static_cast<float>(static_cast<int8_t>(block[2 + i % 32]));
    }
  }
  return 0.0f;
}

inline int64_t RowBytes(KvElem elem, int64_t d) {
  return elem == KvElem::kF32 ? 4 * d : elem == KvElem::kQ8_0 ? d / 32 * 34 : 2 * d;
}

// The visible rows are scattered over the cache's blocks (a block's rows of one head are
// contiguous, the blocks are not), so the hardware prefetchers lose the stream at every block:
// fetch the whole row kPrefetchRows ahead into L1 while this one is read. Whole rows, also where
// a pass reads only some columns, so that the later passes over the same rows find them in L2.
constexpr int64_t kPrefetchRows = 8;
// (always_inline: see kernels/cpu/prefetch.h.)
__attribute__((always_inline)) inline void PrefetchRow(const void* const* rows, int64_t j,
                                                       int64_t n_rows, int64_t row_bytes) {
  if (j + kPrefetchRows >= n_rows) return;
  const char* row = static_cast<const char*>(rows[j + kPrefetchRows]);
  for (int64_t off = 0; off < row_bytes; off += 64) _mm_prefetch(row + off, _MM_HINT_T0);
  _mm_prefetch(row + row_bytes - 1, _MM_HINT_T0);
}

// Lane sums of 4 rows' 16 lanes (row r: lanes 0..7 in lo[r], 8..15 in hi[r]) -> lane r = row r's
// sum in kv_scores_rows's tree: shuffles pair x[4q] with x[4q + 2] and x[4q + 1] with x[4q + 3]
// of two rows, vhaddps adds those pairs (the quad sums Q_q of 4 rows per 128-bit half: Q0, Q1
// from lo, Q2, Q3 from hi), then (Q0 + Q2) + (Q1 + Q3).
inline __m128 TransposeSum4(const __m256 lo[4], const __m256 hi[4]) {
  auto quads = [](const __m256 v[4]) {
    const __m256 ab = _mm256_add_ps(_mm256_shuffle_ps(v[0], v[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm256_shuffle_ps(v[0], v[1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m256 cd = _mm256_add_ps(_mm256_shuffle_ps(v[2], v[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm256_shuffle_ps(v[2], v[3], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm256_hadd_ps(ab, cd);  // per half: the quad sum of rows 0, 1, 2, 3
  };
  const __m256 s = _mm256_add_ps(quads(lo), quads(hi));  // Q0 + Q2 | Q1 + Q3
  return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

// Widened K rows live in a per-call stack buffer when they fit (head_dim <= 256): batches of rows
// widened together, then scored, so that the scores' loads find the widened rows' stores long
// committed (a run loaded right after it was stored waited on its stores: 15.5 -> 13.8 ns a row
// of 3 heads of 64, f16, interleaved runs on the 2-core AVX2 VM). 16 KiB, so the batch stays in L1
// beside its K rows.
constexpr int64_t kMaxWidenedDim = 256;
constexpr int64_t kWidenedFloats = 4096;

// A decode step's few heads (n_q <= kMaxRegisterHeads) of a converted type: each K slice is
// converted once in registers and multiplied into every head's accumulators, two rows at a time
// (NQ heads x 2 rows x 16 lanes: 12 of the 16 ymm registers at 3 heads, q read from memory),
// instead of through the widened copy. The sums go through TransposeSum4, which keeps its four
// rows apart, so any four (head, row) accumulators can share a call: the bits of the widened path.
constexpr int64_t kMaxRegisterHeads = 3;

template <int NQ, KvElem kElem>
void ScoresInRegisters(const float* q, const void* const* k_rows, int64_t n_rows, int64_t d,
                       float* scores, int64_t score_stride) {
  const int64_t full = d - d % 16, row_bytes = RowBytes(kElem, d);
  for (int64_t j0 = 0; j0 < n_rows; j0 += 2) {
    const int rows = n_rows - j0 < 2 ? 1 : 2;
    const void* run[2] = {k_rows[j0], k_rows[j0 + rows - 1]};  // a lone last row twice
    for (int r = 0; r < rows; ++r) PrefetchRow(k_rows, j0 + r, n_rows, row_bytes);
    __m256 lo[2 * NQ], hi[2 * NQ];  // [head * 2 + row]
    Unroll<2 * NQ>([&](auto k) { lo[k] = hi[k] = _mm256_setzero_ps(); });
    for (int64_t i = 0; i < full; i += 16) {
      Unroll<2>([&](auto r) {
        const __m256 k0 = LoadKv8(run[r], kElem, i), k1 = LoadKv8(run[r], kElem, i + 8);
        Unroll<NQ>([&](auto h) {
          lo[h * 2 + r] = _mm256_fmadd_ps(k0, _mm256_loadu_ps(q + h * d + i), lo[h * 2 + r]);
          hi[h * 2 + r] = _mm256_fmadd_ps(k1, _mm256_loadu_ps(q + h * d + i + 8), hi[h * 2 + r]);
        });
      });
    }
    alignas(16) float sums[2 * NQ + 2];
    for (int k0 = 0; k0 < 2 * NQ; k0 += 4) {
      __m256 l4[4], h4[4];
      for (int k = 0; k < 4; ++k) {
        const int src = k0 + k < 2 * NQ ? k0 + k : k0;
        l4[k] = lo[src];
        h4[k] = hi[src];
      }
      _mm_store_ps(sums + k0, TransposeSum4(l4, h4));
    }
    for (int h = 0; h < NQ; ++h) {
      for (int r = 0; r < rows; ++r) {
        float s = sums[h * 2 + r];
        for (int64_t i = full; i < d; ++i) s = std::fma(LoadKv1(run[r], kElem, i), q[h * d + i], s);
        scores[h * score_stride + j0 + r] = s;
      }
    }
  }
}

// kv_scores_rows for one K element type: up to kMaxRegisterHeads heads of a converted type in
// registers (ScoresInRegisters); otherwise per batch of rows, the rows widened once for all n_q
// heads (d <= kMaxWidenedDim; larger heads convert as they read); then per run of 4 rows and head
// 8 accumulators (4 rows x 16 lanes) in registers and one TransposeSum4; the missing rows of a
// last partial run read zeros and their sums are dropped. The d % 16 tail follows per row, one
// FMA each.
template <KvElem kElem>
void KvScoresRowsOf(const float* q, int64_t n_q, const void* const* k_rows, int64_t n_rows,
                    int64_t d, float* scores, int64_t score_stride) {
  alignas(32) static const float kZeroRow[1024] = {};
  constexpr bool kWiden = kElem != KvElem::kF32;
  if constexpr (kWiden) {
    switch (n_q <= kMaxRegisterHeads ? n_q : 0) {
      case 1:
        return ScoresInRegisters<1, kElem>(q, k_rows, n_rows, d, scores, score_stride);
      case 2:
        return ScoresInRegisters<2, kElem>(q, k_rows, n_rows, d, scores, score_stride);
      case 3:
        return ScoresInRegisters<3, kElem>(q, k_rows, n_rows, d, scores, score_stride);
      default:
        break;
    }
  }
  alignas(32) float widened[kWiden ? kWidenedFloats : 1];
  const bool widen = kWiden && d <= kMaxWidenedDim;
  const int64_t full = d - d % 16, row_bytes = RowBytes(kElem, d);
  const int64_t batch_rows = widen ? kWidenedFloats / d / 4 * 4 : 4;
  for (int64_t b0 = 0; b0 < n_rows; b0 += batch_rows) {
    const int64_t b1 = std::min(n_rows, b0 + batch_rows);
    if (widen) {
      for (int64_t j = b0; j < b1; ++j) {
        PrefetchRow(k_rows, j, n_rows, row_bytes);
        float* dst = widened + (j - b0) * d;
        for (int64_t i = 0; i < full; i += 8)
          _mm256_store_ps(dst + i, LoadKv8(k_rows[j], kElem, i));
      }
    }
    for (int64_t j0 = b0; j0 < b1; j0 += 4) {
      const int rows = b1 - j0 < 4 ? static_cast<int>(b1 - j0) : 4;
      const void* run[4];
      for (int r = 0; r < 4; ++r) {
        run[r] = r >= rows ? kZeroRow
                 : widen   ? static_cast<const void*>(widened + (j0 - b0 + r) * d)
                           : k_rows[j0 + r];
      }
      if (!widen) {
        for (int r = 0; r < rows; ++r) PrefetchRow(k_rows, j0 + r, n_rows, row_bytes);
      }
      auto scores_of = [&]<KvElem E>() {
        for (int64_t g = 0; g < n_q; ++g) {
          const float* qg = q + g * d;
          __m256 lo[4], hi[4];
          Unroll<4>([&](auto r) { lo[r] = hi[r] = _mm256_setzero_ps(); });
          for (int64_t i = 0; i < full; i += 16) {
            const __m256 q0 = _mm256_loadu_ps(qg + i), q1 = _mm256_loadu_ps(qg + i + 8);
            Unroll<4>([&](auto r) {
              lo[r] = _mm256_fmadd_ps(LoadKv8(run[r], E, i), q0, lo[r]);
              hi[r] = _mm256_fmadd_ps(LoadKv8(run[r], E, i + 8), q1, hi[r]);
            });
          }
          alignas(16) float sums[4];
          _mm_store_ps(sums, TransposeSum4(lo, hi));
          float* sg = scores + g * score_stride + j0;
          for (int r = 0; r < rows; ++r) {
            float s = sums[r];
            for (int64_t i = full; i < d; ++i)
              s = std::fma(LoadKv1(k_rows[j0 + r], kElem, i), qg[i], s);
            sg[r] = s;
          }
        }
      };
      if (widen) {
        scores_of.template operator()<KvElem::kF32>();
      } else {
        scores_of.template operator()<kElem>();
      }
    }
  }
}

// kv_scores_rows (op_kernels.h).
void KvScoresRows(const float* q, int64_t n_q, const void* const* k_rows, int64_t n_rows,
                  KvElem elem, int64_t d, float* scores, int64_t score_stride) {
  WithKvElem(elem, [&]<KvElem E>() {
    KvScoresRowsOf<E>(q, n_q, k_rows, n_rows, d, scores, score_stride);
  });
}

// NQ heads x up to S slices of 8 columns per pass over the rows, one V element type, continuing
// the chains in out: NQ * S accumulators stay in registers (at least 8 chains, so the FMA
// latency is hidden; 3 heads x 4 slices fill the 16 ymm registers, and measured faster than
// 3 x 3 where a 64-wide f16 row then takes 3 passes), each V slice converted once for the heads.
template <int NQ, int S, KvElem kElem>
void KvAccumulateRowsOf(float* out, const float* p, int64_t p_stride, const void* const* v_rows,
                        int64_t n_rows, int64_t d) {
  const int64_t full = d - d % 8, row_bytes = RowBytes(kElem, d);
  // Passes of S slices, then one of the 1..S-1 left, each with its slice count a constant: a
  // run-time count kept the accumulators on the stack (every FMA then waited on a store).
  ForEachTile<S>(static_cast<int>(full / 8), [&]<int kSlices>(int slice0) {
    const int64_t c0 = 8 * static_cast<int64_t>(slice0);
    __m256 acc[NQ][kSlices];
    Unroll<NQ>([&](auto g) {
      Unroll<kSlices>([&](auto s) { acc[g][s] = _mm256_loadu_ps(out + g * d + c0 + 8 * s); });
    });
    for (int64_t j = 0; j < n_rows; ++j) {
      PrefetchRow(v_rows, j, n_rows, row_bytes);
      __m256 pj[NQ];
      Unroll<NQ>([&](auto g) { pj[g] = _mm256_set1_ps(p[g * p_stride + j]); });
      Unroll<kSlices>([&](auto s) {
        const __m256 v = LoadKv8(v_rows[j], kElem, c0 + 8 * s);
        Unroll<NQ>([&](auto g) { acc[g][s] = _mm256_fmadd_ps(v, pj[g], acc[g][s]); });
      });
    }
    Unroll<NQ>([&](auto g) {
      Unroll<kSlices>([&](auto s) { _mm256_storeu_ps(out + g * d + c0 + 8 * s, acc[g][s]); });
    });
  });
  for (int g = 0; g < NQ; ++g) {
    for (int64_t i = full; i < d; ++i) {
      float acc = out[g * d + i];
      for (int64_t j = 0; j < n_rows; ++j) {
        acc = std::fma(LoadKv1(v_rows[j], kElem, i), p[g * p_stride + j], acc);
      }
      out[g * d + i] = acc;
    }
  }
}

// kv_scores_rows_q8_0 (op_kernels.h), 8 rows a pass: per head and block, each row's 32 products
// go through vpmaddubsw on |k| and q with k's sign (pair sums at most 2 * 128 * 127: no int16
// saturation) and vpmaddwd, the 8 rows' sums reduce together (lane r: row r), and the float step
// runs on the 8 rows at once.
void KvScoresRowsQ8_0(const void* q8, int64_t n_q, const void* const* k_rows, int64_t n_rows,
                      int64_t d, float* scores, int64_t score_stride) {
  constexpr int64_t kBlockBytes = 34;
  const int64_t nb = d / 32;
  const auto* q = static_cast<const uint8_t*>(q8);
  alignas(32) static const uint8_t kZeroRow[kBlockBytes * 32] = {};  // d <= 1024
  alignas(32) float dk[32][8];                                       // [block][row]
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t j0 = 0; j0 < n_rows; j0 += 8) {
    const int rows = n_rows - j0 < 8 ? static_cast<int>(n_rows - j0) : 8;
    const uint8_t* row[8];
    for (int r = 0; r < 8; ++r) {
      row[r] = r < rows ? static_cast<const uint8_t*>(k_rows[j0 + r]) : kZeroRow;
    }
    for (int64_t b = 0; b < nb; ++b) {
      alignas(16) uint16_t h[8];
      for (int r = 0; r < 8; ++r) std::memcpy(&h[r], row[r] + b * kBlockBytes, 2);
      _mm256_store_ps(dk[b], _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(h))));
    }
    for (int64_t g = 0; g < n_q; ++g) {
      __m256 s = _mm256_setzero_ps();
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* qb = q + (g * nb + b) * kBlockBytes;
        const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qb + 2));
        __m256i p[8];
        for (int r = 0; r < 8; ++r) {
          const __m256i kv =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row[r] + b * kBlockBytes + 2));
          p[r] = _mm256_madd_epi16(
              _mm256_maddubs_epi16(_mm256_abs_epi8(kv), _mm256_sign_epi8(qv, kv)), ones);
        }
        // Per 128-bit lane [rows 0..3 | rows 4..7] partial sums, then the two halves added.
        const __m256i h0 =
            _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
        const __m256i h1 =
            _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
        const __m256i isum = _mm256_add_epi32(_mm256_permute2x128_si256(h0, h1, 0x20),
                                              _mm256_permute2x128_si256(h0, h1, 0x31));
        uint16_t hq;
        std::memcpy(&hq, qb, 2);
        // (_cvtsh_ss: exact, as Fp16ToFp32, without its portable bit steps and branches in the
        // innermost loop.)
        const __m256 scale = _mm256_mul_ps(_mm256_load_ps(dk[b]), _mm256_set1_ps(_cvtsh_ss(hq)));
        s = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(isum), s);
      }
      alignas(32) float out[8];
      _mm256_store_ps(out, s);
      for (int r = 0; r < rows; ++r) scores[g * score_stride + j0 + r] = out[r];
    }
  }
}

// kv_accumulate_rows (op_kernels.h), in groups of up to 4 heads.
void KvAccumulateRows(float* out, const float* p, int64_t p_stride, int64_t n_q,
                      const void* const* v_rows, int64_t n_rows, KvElem elem, int64_t d) {
  WithKvElem(elem, [&]<KvElem E>() {
    for (int64_t g0 = 0; g0 < n_q; g0 += 4) {
      float* og = out + g0 * d;
      const float* pg = p + g0 * p_stride;
      switch (n_q - g0 < 4 ? n_q - g0 : 4) {
        case 1:
          KvAccumulateRowsOf<1, 8, E>(og, pg, p_stride, v_rows, n_rows, d);
          break;
        case 2:
          KvAccumulateRowsOf<2, 4, E>(og, pg, p_stride, v_rows, n_rows, d);
          break;
        case 3:
          KvAccumulateRowsOf<3, 4, E>(og, pg, p_stride, v_rows, n_rows, d);
          break;
        default:
          KvAccumulateRowsOf<4, 2, E>(og, pg, p_stride, v_rows, n_rows, d);
          break;
      }
    }
  });
}

// ---- The llama.cpp order (op_kernels.h): ggml's AVX-512 lanes, 8 at a time. Each lane is one
// FMA chain whatever the register width, so 8-lane registers give the definition's bits when
// the lanes are reduced in its order.

// kv_scores: ggml's 64 lanes as 8 registers (acc[m] = lanes 8m .. 8m + 7) or tinyBLAS's 16 as
// 2, one head at a time (its 8 chains fill the FMA pipes); K widened as it is read. The lanes are
// summed as ((l0 + l2) + (l1 + l3)) per 16 (acc 0/4/2/6 for lanes 0..7, 1/5/3/7 for 8..15), then
// in _mm512_reduce_add_ps's order; a d % step tail (the callers pass none) is the definition's.
void KvScores(const float* q, int64_t n_q, const void* k_rows, int64_t n_rows, KvElem elem,
              int64_t d, int64_t n_lanes, float* scores, int64_t score_stride) {
  const bool tiny_blas = n_lanes == kAttnLanesTinyBlas;
  const int64_t step = tiny_blas ? 16 : 64;
  const int64_t full = d - d % step, row_bytes = RowBytes(elem, d);
  for (int64_t j = 0; j < n_rows; ++j) {
    const void* k = static_cast<const uint8_t*>(k_rows) + j * row_bytes;
    for (int64_t g = 0; g < n_q; ++g) {
      const float* qg = q + g * d;
      __m256 acc[8];
      for (__m256& a : acc) a = _mm256_setzero_ps();
      for (int64_t i0 = 0; i0 < full; i0 += step) {
        for (int m = 0; m < step / 8; ++m) {
          acc[m] = _mm256_fmadd_ps(LoadKv8(k, elem, i0 + 8 * m), _mm256_loadu_ps(qg + i0 + 8 * m),
                                   acc[m]);
        }
      }
      const __m256 lo =
          tiny_blas ? acc[0]
                    : _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6]));
      const __m256 hi =
          tiny_blas ? acc[1]
                    : _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7]));
      float s = Reduce16(lo, hi);
      for (int64_t i = full; i < d; ++i) s += LoadKv1(k, elem, i) * qg[i];
      scores[g * score_stride + j] = s;
    }
  }
}

// kv_accumulate: row j's FMA into its lane's accumulator row, 8 columns at a time.
void KvAccumulate(float* acc, const float* p, const void* v_rows, int64_t n_rows, int64_t lane0,
                  int64_t n_lanes, KvElem elem, int64_t d) {
  const int64_t row_bytes = RowBytes(elem, d), full = d - d % 8;
  for (int64_t j = 0; j < n_rows; ++j) {
    const void* v = static_cast<const uint8_t*>(v_rows) + j * row_bytes;
    float* a = acc + ((lane0 + j) % n_lanes) * d;
    const __m256 pj = _mm256_set1_ps(p[j]);
    for (int64_t i = 0; i < full; i += 8) {
      _mm256_storeu_ps(a + i, _mm256_fmadd_ps(LoadKv8(v, elem, i), pj, _mm256_loadu_ps(a + i)));
    }
    for (int64_t i = full; i < d; ++i) a[i] = std::fma(LoadKv1(v, elem, i), p[j], a[i]);
  }
}

// kv_accumulate_groups: run r's 16 rows go to lanes 16 (r % lane groups) + 0..15. Per lane group,
// half (8 lanes) and 8 columns, the 8 accumulators stay in registers over the group's runs in
// index order, so each lane's FMA order is kv_accumulate's.
void KvAccumulateGroups(float* acc, const float* p, const void* const* v_groups, int64_t n_groups,
                        int64_t n_lanes, KvElem elem, int64_t d) {
  const int64_t lane_groups = n_lanes / 16;
  const int64_t row_bytes = RowBytes(elem, d), full = d - d % 8;
  for (int64_t lg = 0; lg < lane_groups && lg < n_groups; ++lg) {
    for (int64_t half = 0; half < 16; half += 8) {
      float* lanes = acc + (16 * lg + half) * d;  // [8, d]
      for (int64_t i = 0; i < full; i += 8) {
        __m256 a[8];
        for (int l = 0; l < 8; ++l) a[l] = _mm256_loadu_ps(lanes + l * d + i);
        for (int64_t r = lg; r < n_groups; r += lane_groups) {
          const uint8_t* rows = static_cast<const uint8_t*>(v_groups[r]) + half * row_bytes;
          const float* pr = p + 16 * r + half;
          for (int l = 0; l < 8; ++l) {
            a[l] = _mm256_fmadd_ps(LoadKv8(rows + l * row_bytes, elem, i), _mm256_set1_ps(pr[l]),
                                   a[l]);
          }
        }
        for (int l = 0; l < 8; ++l) _mm256_storeu_ps(lanes + l * d + i, a[l]);
      }
      for (int64_t i = full; i < d; ++i) {
        for (int l = 0; l < 8; ++l) {
          float a = lanes[l * d + i];
          for (int64_t r = lg; r < n_groups; r += lane_groups) {
            const uint8_t* row = static_cast<const uint8_t*>(v_groups[r]) + (half + l) * row_bytes;
            a = std::fma(LoadKv1(row, elem, i), p[16 * r + half + l], a);
          }
          lanes[l * d + i] = a;
        }
      }
    }
  }
}

// reduce_lanes: the definition's tree, element-wise over 8 columns at a time.
void ReduceLanes(const float* acc, int64_t n_lanes, int64_t d, float* out) {
  const bool tiny_blas = n_lanes == kAttnLanesTinyBlas;
  const int64_t full = d - d % 8;
  for (int64_t i = 0; i < full; i += 8) {
    auto lane = [&](int64_t l) { return _mm256_loadu_ps(acc + l * d + i); };
    __m256 v[16];
    for (int l = 0; l < 16; ++l) {
      v[l] = tiny_blas ? lane(l)
                       : _mm256_add_ps(_mm256_add_ps(lane(l), lane(32 + l)),
                                       _mm256_add_ps(lane(16 + l), lane(48 + l)));
    }
    __m256 t3[8], t6[4];
    for (int l = 0; l < 8; ++l) t3[l] = _mm256_add_ps(v[8 + l], v[l]);
    for (int l = 0; l < 4; ++l) t6[l] = _mm256_add_ps(t3[4 + l], t3[l]);
    _mm256_storeu_ps(out + i,
                     _mm256_add_ps(_mm256_add_ps(t6[0], t6[2]), _mm256_add_ps(t6[1], t6[3])));
  }
  for (int64_t i = full; i < d; ++i) {
    float v[16];
    for (int l = 0; l < 16; ++l) {
      v[l] = tiny_blas ? acc[l * d + i]
                       : (acc[l * d + i] + acc[(32 + l) * d + i]) +
                             (acc[(16 + l) * d + i] + acc[(48 + l) * d + i]);
    }
    float t3[8], t6[4];
    for (int l = 0; l < 8; ++l) t3[l] = v[8 + l] + v[l];
    for (int l = 0; l < 4; ++l) t6[l] = t3[4 + l] + t3[l];
    out[i] = (t6[0] + t6[2]) + (t6[1] + t6[3]);
  }
}

// round_f16: vcvtps2ph (nearest even) and back; a chunk holding a NaN takes the definition (every
// NaN as sign | 0x7E00, where vcvtps2ph would keep part of its payload).
void RoundF16(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0) break;
    _mm256_storeu_ps(
        x + i, _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
  }
  for (; i < n; ++i) x[i] = Fp16ToFp32(Fp32ToFp16(x[i]));
}

// op_kernels.h's q8_0_dot_ggml: the 4-element lanes from 16-bit products (|q| <= 128 each, so
// every product and pair sum is exact), pair sums widened by madd, then adjacent pairs added.
float Q8_0DotGgml(const void* w, const void* a, int64_t n) {
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* ab = static_cast<const uint8_t*>(a);
  const __m256i order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / 32; ++b, wb += 34, ab += 34) {
    uint16_t dw, da;
    std::memcpy(&dw, wb, 2);
    std::memcpy(&da, ab, 2);
    const float s = Fp16ToFp32(dw) * Fp16ToFp32(da);
    const __m256i qw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 2));
    const __m256i qa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab + 2));
    // Pair sums of elements 0..15 and 16..31: int32 lanes (2i, 2i + 1).
    const __m256i lo = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(qw)),
                                         _mm256_cvtepi8_epi16(_mm256_castsi256_si128(qa)));
    const __m256i hi = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(qw, 1)),
                                         _mm256_cvtepi8_epi16(_mm256_extracti128_si256(qa, 1)));
    // hadd: [P0 P1 P4 P5 | P2 P3 P6 P7]; the permutation puts P0..P7 in order.
    const __m256i lanes = _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(lo, hi), order);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(s), _mm256_cvtepi32_ps(lanes), acc);
  }
  float x[8];
  _mm256_storeu_ps(x, acc);
  return ((x[4] + x[0]) + (x[6] + x[2])) + ((x[5] + x[1]) + (x[7] + x[3]));
}

// ggml's f16-table GeGLU (op_kernels.h), 8 lanes: vcvtps2ph (nearest even, as Fp32ToFp16 on
// every non-NaN) gives the table index, a 32-bit gather at 2-byte scale reads the entry (its high
// half is the next entry or the padding entry, masked off). A chunk holding a NaN gate, and the
// last n % 8 elements, take the scalar steps (Fp32ToFp16's NaN bits differ from vcvtps2ph's).
void GeGluTail(const float* gate, const float* up, const uint16_t* table, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    y[i] = g <= -10.0f ? 0.0f : g >= 10.0f ? g * up[i] : Fp16ToFp32(table[Fp32ToFp16(g)]) * up[i];
  }
}

void GeGlu(const float* gate, const float* up, const uint16_t* table, int64_t n, float* y) {
  const __m256 lo = _mm256_set1_ps(-10.0f), hi = _mm256_set1_ps(10.0f);
  const __m256i low16 = _mm256_set1_epi32(0xFFFF);
  const auto* base = reinterpret_cast<const int*>(table);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 u = _mm256_loadu_ps(up + i);
    if (_mm256_movemask_ps(_mm256_cmp_ps(g, g, _CMP_UNORD_Q)) != 0) {
      GeGluTail(gate + i, up + i, table, 8, y + i);
      continue;
    }
    const __m256i idx = _mm256_cvtepu16_epi32(_mm256_cvtps_ph(g, _MM_FROUND_TO_NEAREST_INT));
    const __m256i entries = _mm256_and_si256(_mm256_i32gather_epi32(base, idx, 2), low16);
    const __m128i h =
        _mm_packus_epi32(_mm256_castsi256_si128(entries), _mm256_extracti128_si256(entries, 1));
    __m256 r = _mm256_mul_ps(_mm256_cvtph_ps(h), u);
    r = _mm256_blendv_ps(r, _mm256_mul_ps(g, u), _mm256_cmp_ps(g, hi, _CMP_GE_OQ));
    r = _mm256_blendv_ps(r, _mm256_setzero_ps(), _mm256_cmp_ps(g, lo, _CMP_LE_OQ));
    _mm256_storeu_ps(y + i, r);
  }
  GeGluTail(gate + i, up + i, table, n - i, y + i);
}

}  // namespace

void FillOpKernelsAvx2(OpKernels* k) {
  // Every kernel is defined per lane, in AVX-512's lanes where ggml's order has them, so 8-lane
  // versions give the definitions' bits. rms_norm keeps the scalar one: its in-order double sum
  // is one add chain per row.
  k->swiglu = SwiGlu;
  k->softmax_exp = SoftmaxExp;
  k->kv_scores_rows = KvScoresRows;
  k->kv_scores_rows_q8_0 = KvScoresRowsQ8_0;
  k->kv_accumulate_rows = KvAccumulateRows;
  k->geglu = GeGlu;  // element-wise: the same bits as the scalar definition
  k->add = Add;
  k->max = Max;
  k->exp_sum = ExpSum;
  k->scale = Scale;
  k->store_f16 = StoreF16;
  k->rope_pairs = RopePairs;
  k->q8_0_dot_ggml = Q8_0DotGgml;
  k->kv_scores = KvScores;
  k->kv_accumulate = KvAccumulate;
  k->kv_accumulate_groups = KvAccumulateGroups;
  k->reduce_lanes = ReduceLanes;
  k->round_f16 = RoundF16;
}

}  // namespace kiln::cpu
