// AVX-512 (F/BW/VL) + VNNI kernels of the legacy block quants. Compiled with -ffp-contract=off
// (kernels/cpu/CMakeLists.txt); every FMA is explicit.
//
// Dots work on groups of 4 blocks (b = 4g + k). The 16 weight bytes of each block's first half
// (elements 0..15) and of its second half (16..31) are gathered from two 128-byte windows with
// vpermt2d/w into "lo" and "hi" registers; two chained vpdpbusd (lo, then hi) leave in lane
// 4k + l the exact P_b[l] of the documented order (elements j with j % 16 in 4l..4l+3). So the
// one float accumulator holds acc[k][l] (acc index = b % 4) and the results are bit-identical to
// the AVX2 kernels. Block headers (d, m / s, qh) of the 4 blocks are
// gathered the same way and converted with one vcvtph2ps. A last partial group is copied into
// zeroed blocks (d = 0 adds exact zeros, which leave every accumulator unchanged).
// Everything here is in an anonymous namespace or has an Avx512 name, so no inline function
// compiled for AVX-512 can be picked by the linker for another caller.
#include <immintrin.h>

// GCC 12's AVX-512 intrinsic headers initialize results from _mm512_undefined_*() and then trip
// -Wuninitialized when inlined (a known false positive); silence it for this file only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/legacy.h"

namespace kiln::quant {
namespace {

constexpr int kGroup = 4;  // blocks per group

// Index vector for a two-register permute over a 128-byte window: dword granular (vpermt2d,
// cheap) when every gathered piece is 4-byte aligned in the window, else word granular (vpermt2w).
struct PermIndex {
  bool dword;
  uint32_t d[16];
  uint16_t w[32];
};

// Gathers `words_per_block` words at byte `first_byte` of each of the 4 blocks (block stride
// `stride`) from the window starting at `window_byte`, packed block after block.
constexpr PermIndex GatherIndex(int stride, int first_byte, int window_byte, int words_per_block) {
  PermIndex r{};
  r.dword = words_per_block % 2 == 0 && stride % 4 == 0 && (first_byte - window_byte) % 4 == 0;
  for (int k = 0; k < kGroup; ++k) {
    const int base = k * stride + first_byte - window_byte;
    for (int i = 0; i < words_per_block; ++i) {
      r.w[words_per_block * k + i] = static_cast<uint16_t>(base / 2 + i);
    }
    for (int i = 0; i < words_per_block / 2; ++i) {
      r.d[words_per_block / 2 * k + i] = static_cast<uint32_t>(base / 4 + i);
    }
  }
  return r;
}
// The 16 bytes (8 words) at `first_byte` of each block: 4 x 16 bytes.
constexpr PermIndex HalfIndex(int stride, int first_byte, int window_byte) {
  return GatherIndex(stride, first_byte, window_byte, 8);
}
// `words_per_block` header words at the start of each block.
constexpr PermIndex HeaderIndex(int stride, int words_per_block) {
  return GatherIndex(stride, 0, 0, words_per_block);
}
// qh of Q5 blocks: the 4 low words, then the 4 high words (word granular).
constexpr PermIndex QhIndex(int stride, int qh_byte) {
  PermIndex r{};
  r.dword = false;
  for (int k = 0; k < kGroup; ++k) {
    r.w[k] = static_cast<uint16_t>((k * stride + qh_byte) / 2);
    r.w[kGroup + k] = static_cast<uint16_t>((k * stride + qh_byte) / 2 + 1);
  }
  return r;
}

struct Perm {
  bool dword;
  __m512i idx;
  __m512i operator()(__m512i a, __m512i b) const {
    return dword ? _mm512_permutex2var_epi32(a, idx, b) : _mm512_permutex2var_epi16(a, idx, b);
  }
};
inline Perm LoadIndex(const PermIndex& p) {
  return {p.dword, p.dword ? _mm512_loadu_si512(p.d) : _mm512_loadu_si512(p.w)};
}

// 64 bytes from p, the ones at and past `avail` read as zeros (not read at all; avail <= 0: all
// zeros). With a constant avail >= 64 after inlining this is a plain load.
inline __m512i LoadUpTo(const uint8_t* p, int avail) {
  if (avail >= 64) return _mm512_loadu_si512(p);
  const __mmask64 m = avail <= 0 ? __mmask64{0} : ((__mmask64{1} << avail) - 1);
  return _mm512_maskz_loadu_epi8(m, p);
}

// 8-bit activation rows (Q8_0 / Q8_1): per group the lo and hi halves of the 4
// blocks' qs and the header words: d, or d and s when kWithSum (the min term of _1 dots).
template <typename ActBlock, bool kWithSum>
struct ActGroup {
  static constexpr int kStride = sizeof(ActBlock);
  static constexpr int kQs = static_cast<int>(offsetof(ActBlock, qs));
  static constexpr bool kHasSum = kWithSum;
  static constexpr int kHiWindow = kQs + 16;  // first byte of block 0's second half
  struct Indices {
    Perm lo, hi, header;
  };
  static Indices Load() {
    static constexpr PermIndex lo = HalfIndex(kStride, kQs, 0);
    static constexpr PermIndex hi = HalfIndex(kStride, kQs + 16, kHiWindow);
    static constexpr PermIndex hdr = HeaderIndex(kStride, kHasSum ? 2 : 1);
    return {LoadIndex(lo), LoadIndex(hi), LoadIndex(hdr)};
  }
  __m512i lo, hi, header;  // header: words in the low 128 bits
  // `valid`: the bytes of p that hold blocks (a last partial group reads the missing blocks as
  // zero blocks, without touching memory past them).
  ActGroup(const uint8_t* p, const Indices& idx, int valid = kGroup * kStride) {
    const __m512i a0 = LoadUpTo(p, valid);
    const __m512i a1 = LoadUpTo(p + 64, (valid < 128 ? valid : 128) - 64);
    lo = idx.lo(a0, a1);
    header = idx.header(a0, a1);
    const __m512i b0 = LoadUpTo(p + kHiWindow, valid - kHiWindow);
    const __m512i b1 = LoadUpTo(p + kHiWindow + 64, valid - kHiWindow - 64);
    hi = idx.hi(b0, b1);
  }
};

// Float scale per lane 4k + l: s_k; from the header products (one float per block, or
// [s, min] pairs for the _1 types).
template <bool kHasMin>
inline __m512 BroadcastScales(__m512 products) {
  const __m512i idx = kHasMin ? _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6)
                              : _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  return _mm512_permutexvar_ps(idx, products);
}

// The final reduction of the documented order, from acc (lanes 4k + l = acc[k][l]) and mins
// (lanes 2k + 1 = mins[k]).
template <bool kHasMin>
inline float Finish(__m512 acc, __m256 mins) {
  // t = [acc0 + acc2 | acc1 + acc3]; v[l] = (acc0 + acc2)[l] + (acc1 + acc3)[l]
  const __m256 t =
      _mm256_add_ps(_mm512_castps512_ps256(acc),
                    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1)));
  const __m128 v = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
  const __m128 v2 = _mm_add_ps(v, _mm_movehl_ps(v, v));
  float r = _mm_cvtss_f32(_mm_add_ss(v2, _mm_movehdup_ps(v2)));
  if constexpr (kHasMin) {
    alignas(32) float m[8];
    _mm256_store_ps(m, mins);
    r += (m[1] + m[5]) + (m[3] + m[7]);
  }
  return r;
}

// Generic group loop. `Weights` knows the weight layout: Weights::Indices Load(), and
// Weights::OffsetDot(act_group), Weights::Dot(w_ptr, idx, act_group, offset_dot, &p,
// &header_words).
template <typename Weights, typename ActBlock>
inline float DotGroups(int64_t n, const void* vw, const void* va) {
  constexpr int kWs = Weights::kStride;
  constexpr int kAs = sizeof(ActBlock);
  constexpr bool kHasMin = Weights::kHasMin;
  const auto* w = static_cast<const uint8_t*>(vw);
  const auto* a = static_cast<const uint8_t*>(va);
  const int64_t nb = n / kQK;
  const typename Weights::Indices widx = Weights::Load();
  using Act = ActGroup<ActBlock, kHasMin>;
  const typename Act::Indices aidx = Act::Load();
  __m512 acc = _mm512_setzero_ps();
  __m256 mins = _mm256_setzero_ps();
  auto group = [&](const uint8_t* wg, const uint8_t* ag, int blocks) {
    const Act act(ag, aidx, blocks * kAs);
    __m512i p, wheader;
    Weights::Dot(wg, widx, act, Weights::OffsetDot(act), &p, &wheader, blocks * kWs);
    __m512 products;
    if constexpr (kHasMin) {
      const __m256 prod = _mm256_mul_ps(_mm256_cvtph_ps(_mm512_castsi512_si128(wheader)),
                                        _mm256_cvtph_ps(_mm512_castsi512_si128(act.header)));
      mins = _mm256_add_ps(mins, prod);
      products = _mm512_castps256_ps512(prod);
    } else {
      products =
          _mm512_castps128_ps512(_mm_mul_ps(_mm_cvtph_ps(_mm512_castsi512_si128(wheader)),
                                            _mm_cvtph_ps(_mm512_castsi512_si128(act.header))));
    }
    const __m512 scale = BroadcastScales<kHasMin>(products);
    acc = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(p), acc);
  };
  int64_t b = 0;
  for (; b + kGroup <= nb; b += kGroup) group(w + b * kWs, a + b * kAs, kGroup);
  // A last partial group: masked loads read the missing blocks as zero blocks.
  if (b < nb) group(w + b * kWs, a + b * kAs, static_cast<int>(nb - b));
  return Finish<kHasMin>(acc, mins);
}

// DotGroups for kRows weight rows (row r at vw + r * w_stride) against one activation row: the
// activation group is loaded and permuted once and used for every row; each row's own steps
// (weight decode, dot, scale, FMA, final reduction) are exactly DotGroups', so out[r] is
// bit-identical to DotGroups(n, row r, va).
template <typename Weights, typename ActBlock, int kRows>
inline void DotGroupsRows(int64_t n, const void* vw, size_t w_stride, const void* va, float* out) {
  constexpr int kWs = Weights::kStride;
  constexpr int kAs = sizeof(ActBlock);
  constexpr bool kHasMin = Weights::kHasMin;
  const auto* w = static_cast<const uint8_t*>(vw);
  const auto* a = static_cast<const uint8_t*>(va);
  const int64_t nb = n / kQK;
  const typename Weights::Indices widx = Weights::Load();
  using Act = ActGroup<ActBlock, kHasMin>;
  const typename Act::Indices aidx = Act::Load();
  __m512 acc[kRows];
  __m256 mins[kRows];
  for (int r = 0; r < kRows; ++r) {
    acc[r] = _mm512_setzero_ps();
    mins[r] = _mm256_setzero_ps();
  }
  // wg(r): the group's first byte in row r.
  auto group = [&](auto wg, const uint8_t* ag, int blocks) {
    const Act act(ag, aidx, blocks * kAs);
    const __m512i offset_dot = Weights::OffsetDot(act);
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      __m512i p, wheader;
      Weights::Dot(wg(r), widx, act, offset_dot, &p, &wheader, blocks * kWs);
      __m512 products;
      if constexpr (kHasMin) {
        const __m256 prod = _mm256_mul_ps(_mm256_cvtph_ps(_mm512_castsi512_si128(wheader)),
                                          _mm256_cvtph_ps(_mm512_castsi512_si128(act.header)));
        mins[r] = _mm256_add_ps(mins[r], prod);
        products = _mm512_castps256_ps512(prod);
      } else {
        products =
            _mm512_castps128_ps512(_mm_mul_ps(_mm_cvtph_ps(_mm512_castsi512_si128(wheader)),
                                              _mm_cvtph_ps(_mm512_castsi512_si128(act.header))));
      }
      const __m512 scale = BroadcastScales<kHasMin>(products);
      acc[r] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(p), acc[r]);
    }
  };
  int64_t b = 0;
  for (; b + kGroup <= nb; b += kGroup) {
    const uint8_t* wb = w + b * kWs;
    group([wb, w_stride](int r) { return wb + r * w_stride; }, a + b * kAs, kGroup);
  }
  if (b < nb) {
    const uint8_t* wb = w + b * kWs;
    group([wb, w_stride](int r) { return wb + r * w_stride; }, a + b * kAs,
          static_cast<int>(nb - b));
  }
  for (int r = 0; r < kRows; ++r) out[r] = Finish<kHasMin>(acc[r], mins[r]);
}

// Rows in blocks of 4, then one call for the 1-3 left.
template <typename Weights, typename ActBlock>
inline void DotRows(int64_t n, const void* vw, size_t w_stride, int n_rows, const void* va,
                    float* out) {
  const auto* w = static_cast<const uint8_t*>(vw);
  int r = 0;
  for (; r + 4 <= n_rows; r += 4) {
    DotGroupsRows<Weights, ActBlock, 4>(n, w + r * w_stride, w_stride, va, out + r);
  }
  switch (n_rows - r) {
    case 3:
      DotGroupsRows<Weights, ActBlock, 3>(n, w + r * w_stride, w_stride, va, out + r);
      break;
    case 2:
      DotGroupsRows<Weights, ActBlock, 2>(n, w + r * w_stride, w_stride, va, out + r);
      break;
    case 1:
      DotGroupsRows<Weights, ActBlock, 1>(n, w + r * w_stride, w_stride, va, out + r);
      break;
    default:
      break;
  }
}

inline __m512i Zero() { return _mm512_setzero_si512(); }

// Nibble weights (Q4_0, Q4_1, Q5_0, Q5_1). kOffset: 8 / 16 subtracted from each weight (_0
// types; done as Σ q*a - Σ off*a, both exact), 0 for the _1 types.
template <typename Block, int kOffset, bool kFiveBit>
struct NibbleWeights {
  static constexpr int kStride = sizeof(Block);
  static constexpr bool kHasMin = kOffset == 0;
  static constexpr int kQs = static_cast<int>(offsetof(Block, qs));
  struct Indices {
    Perm qs, header, qh;
  };
  static Indices Load() {
    static constexpr PermIndex qs = HalfIndex(kStride, kQs, 0);
    static constexpr PermIndex hdr = HeaderIndex(kStride, kHasMin ? 2 : 1);
    static constexpr PermIndex qh = QhIndex(kStride, kFiveBit ? kQs - 4 : 0);
    return {LoadIndex(qs), LoadIndex(hdr), LoadIndex(qh)};
  }
  // The activation-only term Σ kOffset * a of the _0 types (zero otherwise): one per activation
  // group, shared by every row that group meets (DotGroupsRows).
  template <typename Act>
  static __m512i OffsetDot(const Act& act) {
    if constexpr (kOffset != 0) {
      const __m512i off = _mm512_set1_epi8(kOffset);
      return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(Zero(), off, act.lo), off, act.hi);
    } else {
      return Zero();
    }
  }
  // dot: Σ q * a - offset_dot (exact int32 lanes); header: the weight header words.
  template <typename Act>
  static void Dot(const uint8_t* p, const Indices& idx, const Act& act, const __m512i& offset_dot,
                  __m512i* dot, __m512i* header, int valid = kGroup * kStride) {
    const __m512i w0 = LoadUpTo(p, valid);
    const __m512i w1 = LoadUpTo(p + 64, valid - 64);
    const __m512i packed = idx.qs(w0, w1);
    const __m512i mask = _mm512_set1_epi8(0x0F);
    __m512i lo = _mm512_and_si512(packed, mask);
    __m512i hi = _mm512_and_si512(_mm512_srli_epi16(packed, 4), mask);
    if constexpr (kFiveBit) {
      const __m128i qh = _mm512_castsi512_si128(idx.qh(w0, w1));
      const __m512i bit4 = _mm512_set1_epi8(0x10);
      lo = _mm512_mask_add_epi8(lo, _cvtu64_mask64(static_cast<uint64_t>(_mm_cvtsi128_si64(qh))),
                                lo, bit4);
      hi = _mm512_mask_add_epi8(hi, _cvtu64_mask64(static_cast<uint64_t>(_mm_extract_epi64(qh, 1))),
                                hi, bit4);
    }
    *header = idx.header(w0, w1);
    *dot = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(Zero(), lo, act.lo), hi, act.hi);
    if constexpr (kOffset != 0) *dot = _mm512_sub_epi32(*dot, offset_dot);
  }
};

// Q8_0 weights, several rows against one Q8_0 activation row, in the AVX2 kernel's exact steps
// (legacy_avx2.cc DotBlocks: two blocks per __m256i fold, acc01/acc23, the same FMAs and final
// reduction) but with 256-bit VNNI: Σ w * a = Σ (w + 128) * a - Σ 128 * a, both exact in int32,
// where the second term (and each activation block's load and d) is computed once for all rows.
// (The 512-bit group gather measured slower for Q8_0: its 34-byte blocks need word permutes.)
inline float HalfAt(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  // movd zero-extends: no false dependency on an older register (unlike vpinsrw).
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(v)));
}

template <int kRows>
inline void DotRowsQ8_0(int64_t n, const uint8_t* w, size_t w_stride, const void* va, float* out) {
  const auto* a = static_cast<const BlockQ8_0*>(va);
  const int64_t nb = n / kQK;
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256 acc[kRows][2];
  for (int r = 0; r < kRows; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  auto pair = [&](int k, int64_t b, bool two) {
    const __m256i a0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].qs));
    const __m256i c0 = _mm256_sub_epi32(_mm256_setzero_si256(),
                                        _mm256_dpbusd_epi32(_mm256_setzero_si256(), flip, a0));
    const float da0 = HalfAt(a[b].d);
    __m256i a1 = _mm256_setzero_si256(), c1 = a1;
    float da1 = 0.0f;
    if (two) {
      a1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b + 1].qs));
      c1 = _mm256_sub_epi32(_mm256_setzero_si256(),
                            _mm256_dpbusd_epi32(_mm256_setzero_si256(), flip, a1));
      da1 = HalfAt(a[b + 1].d);
    }
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const BlockQ8_0* wb = reinterpret_cast<const BlockQ8_0*>(w + r * w_stride) + b;
      const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb[0].qs));
      const __m256i p0 = _mm256_dpbusd_epi32(c0, _mm256_xor_si256(w0, flip), a0);
      const __m128 s0 = _mm_set1_ps(HalfAt(wb[0].d) * da0);
      __m128 s1 = _mm_setzero_ps();
      __m256i p1 = _mm256_setzero_si256();
      if (two) {
        const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb[1].qs));
        p1 = _mm256_dpbusd_epi32(c1, _mm256_xor_si256(w1, flip), a1);
        s1 = _mm_set1_ps(HalfAt(wb[1].d) * da1);
      }
      const __m256i folded = _mm256_add_epi32(_mm256_permute2x128_si256(p0, p1, 0x20),
                                              _mm256_permute2x128_si256(p0, p1, 0x31));
      acc[r][k / 2] =
          _mm256_fmadd_ps(_mm256_set_m128(s1, s0), _mm256_cvtepi32_ps(folded), acc[r][k / 2]);
    }
  };
  int64_t b = 0;
  for (; b + 4 <= nb; b += 4) {
    pair(0, b, true);
    pair(2, b + 2, true);
  }
  if (b + 2 <= nb) {
    pair(0, b, true);
    b += 2;
    if (b < nb) pair(2, b, false);
  } else if (b < nb) {
    pair(0, b, false);
  }
  for (int r = 0; r < kRows; ++r) {
    // v = (acc0 + acc2) + (acc1 + acc3), then 4 -> 2 -> 1 (legacy.h).
    const __m256 t = _mm256_add_ps(acc[r][0], acc[r][1]);
    const __m128 v = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    const __m128 v2 = _mm_add_ps(v, _mm_movehl_ps(v, v));
    out[r] = _mm_cvtss_f32(_mm_add_ss(v2, _mm_movehdup_ps(v2)));
  }
}

// --- Activation quantizers ---

// Quantizes one block; stores qs, returns the unrounded d and the int sum of qs.
// --- Q4_1 x Q8_1 in ggml's x86 order (legacy.h): per row one 8-lane FMA chain over the
// blocks plus a scalar FMA chain of the mins; 256-bit VNNI for the integer dot of a block.
inline __m256i Q4_1Nibbles(const uint8_t* qs) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed),
                          _mm256_set1_epi8(0x0F));
}
inline float Hsum8Ggml(__m256 x) {
  __m128 r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  return _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)));
}
// R rows (stride w_stride bytes) against one activation row; the activation block is loaded once.
template <int R>
inline void DotRowsQ4_1(int64_t n, const uint8_t* w, size_t w_stride, const void* va, float* out) {
  const auto* a = static_cast<const BlockQ8_1*>(va);
  __m256 acc[R];
  float mins[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm256_setzero_ps();
    mins[r] = 0.0f;
  }
  for (int64_t i = 0; i < n / kQK; ++i) {
    const __m256i qa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[i].qs));
    const float da = HalfAt(a[i].d), sa = HalfAt(a[i].s);
    for (int r = 0; r < R; ++r) {
      const auto* b = reinterpret_cast<const BlockQ4_1*>(w + r * w_stride) + i;
      mins[r] = std::fma(HalfAt(b->m), sa, mins[r]);
      const __m256 scale = _mm256_set1_ps(HalfAt(b->d) * da);
      const __m256i isum = _mm256_dpbusd_epi32(_mm256_setzero_si256(), Q4_1Nibbles(b->qs), qa);
      acc[r] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(isum), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = Hsum8Ggml(acc[r]) + mins[r];
}

inline float QuantizeBlockQ8(const float* x, int8_t* qs, int32_t* sum) {
  const __m512 v0 = _mm512_loadu_ps(x);
  const __m512 v1 = _mm512_loadu_ps(x + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
  const float d = amax / 127;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const __m512 vid = _mm512_set1_ps(id);
  const __m512i sign = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  const __m512i one = _mm512_set1_epi32(0x3F800000);  // 1.0f
  __m512i q[2];
  const __m512 vs[2] = {_mm512_mul_ps(v0, vid), _mm512_mul_ps(v1, vid)};
  for (int k = 0; k < 2; ++k) {
    // roundf: trunc, then step away from zero when the dropped fraction is >= 0.5.
    const __m512 t = _mm512_roundscale_ps(vs[k], _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __mmask16 need = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(vs[k], t)),
                                              _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    // (v & sign) | 1.0f
    const __m512 step =
        _mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_castps_si512(vs[k]), sign, one, 0xEA));
    q[k] = _mm512_cvtps_epi32(_mm512_mask_add_ps(t, need, t, step));
  }
  *sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q[0], q[1]));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(qs), _mm512_cvtsepi32_epi8(q[0]));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + 16), _mm512_cvtsepi32_epi8(q[1]));
  return d;
}

inline void StoreHalfF16c(uint8_t* p, float f) {
  const uint16_t h = _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
  std::memcpy(p, &h, 2);
}

}  // namespace

void QuantizeRowQ8_0Avx512(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<BlockQ8_0*>(vy);
  for (int64_t i = 0; i < n / kQK; ++i) {
    int32_t sum;
    StoreHalfF16c(y[i].d, QuantizeBlockQ8(x + i * kQK, y[i].qs, &sum));
  }
}

void QuantizeRowQ8_1Avx512(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<BlockQ8_1*>(vy);
  for (int64_t i = 0; i < n / kQK; ++i) {
    int32_t sum;
    const float d = QuantizeBlockQ8(x + i * kQK, y[i].qs, &sum);
    StoreHalfF16c(y[i].d, d);
    StoreHalfF16c(y[i].s, static_cast<float>(sum) * d);
  }
}

// --- Dots ---

float VecDotQ4_0Q8_0Avx512(int64_t n, const void* w, const void* a) {
  return DotGroups<NibbleWeights<BlockQ4_0, 8, false>, BlockQ8_0>(n, w, a);
}
float VecDotQ4_1Q8_1Avx512(int64_t n, const void* w, const void* a) {
  float out;
  DotRowsQ4_1<1>(n, static_cast<const uint8_t*>(w), 0, a, &out);
  return out;
}
float VecDotQ5_0Q8_0Avx512(int64_t n, const void* w, const void* a) {
  return DotGroups<NibbleWeights<BlockQ5_0, 16, true>, BlockQ8_0>(n, w, a);
}
float VecDotQ5_1Q8_1Avx512(int64_t n, const void* w, const void* a) {
  return DotGroups<NibbleWeights<BlockQ5_1, 0, true>, BlockQ8_1>(n, w, a);
}

void VecDotRowsQ4_0Q8_0Avx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                              float* out) {
  DotRows<NibbleWeights<BlockQ4_0, 8, false>, BlockQ8_0>(n, w, w_stride, n_rows, a, out);
}
void VecDotRowsQ4_1Q8_1Avx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                              float* out) {
  const auto* wp = static_cast<const uint8_t*>(w);
  int r = 0;
  for (; r + 4 <= n_rows; r += 4) DotRowsQ4_1<4>(n, wp + r * w_stride, w_stride, a, out + r);
  for (; r < n_rows; ++r) DotRowsQ4_1<1>(n, wp + r * w_stride, w_stride, a, out + r);
}
void VecDotRowsQ5_0Q8_0Avx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                              float* out) {
  DotRows<NibbleWeights<BlockQ5_0, 16, true>, BlockQ8_0>(n, w, w_stride, n_rows, a, out);
}
void VecDotRowsQ5_1Q8_1Avx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                              float* out) {
  DotRows<NibbleWeights<BlockQ5_1, 0, true>, BlockQ8_1>(n, w, w_stride, n_rows, a, out);
}

void VecDotRowsQ8_0Q8_0Avx512(int64_t n, const void* w, size_t w_stride, int n_rows, const void* a,
                              float* out) {
  const auto* wp = static_cast<const uint8_t*>(w);
  int r = 0;
  for (; r + 4 <= n_rows; r += 4) DotRowsQ8_0<4>(n, wp + r * w_stride, w_stride, a, out + r);
  switch (n_rows - r) {
    case 3:
      DotRowsQ8_0<3>(n, wp + r * w_stride, w_stride, a, out + r);
      break;
    case 2:
      DotRowsQ8_0<2>(n, wp + r * w_stride, w_stride, a, out + r);
      break;
    case 1:
      DotRowsQ8_0<1>(n, wp + r * w_stride, w_stride, a, out + r);
      break;
    default:
      break;
  }
}

}  // namespace kiln::quant
