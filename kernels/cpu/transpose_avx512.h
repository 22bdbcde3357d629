// AVX-512 helpers shared by kernel files (kquants_avx512.cc, ops_avx512.cc). Include only from
// translation units compiled with the AVX-512 flag set; everything is `static inline`, so each
// keeps its own copy (no copy compiled with -mavx512f can stand in for another level's).
#pragma once

#include <immintrin.h>

namespace kiln {

// Transposes 16 rows of 16 dwords: afterwards r[k] holds dword k of every row (lane t = row t).
static inline void Transpose16x16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {  // per 128-bit lane: [r_i[4j], r_i+1[4j], r_i[4j+1], ...]
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // r[i + c]: 128-bit lane j holds dword 4j + c of rows i..i+3
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  // t[c]: dwords c, 8 + c of rows 0..7; t[4 + c]: dwords 4 + c, 12 + c; t[8 + c], t[12 + c]: the
  // same of rows 8..15.
  for (int c = 0; c < 4; ++c) {
    t[c] = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x88);
    t[4 + c] = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xDD);
    t[8 + c] = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x88);
    t[12 + c] = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xDD);
  }
  for (int c = 0; c < 4; ++c) {  // r[k]: dword k of rows 0..15
    r[c] = _mm512_shuffle_i32x4(t[c], t[8 + c], 0x88);
    r[8 + c] = _mm512_shuffle_i32x4(t[c], t[8 + c], 0xDD);
    r[4 + c] = _mm512_shuffle_i32x4(t[4 + c], t[12 + c], 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(t[4 + c], t[12 + c], 0xDD);
  }
}

}  // namespace kiln
