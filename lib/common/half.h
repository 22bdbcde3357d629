// IEEE binary16 and bfloat16 conversions (scalar, exact, no intrinsics needed).
// `static inline` on purpose: SIMD translation units (compiled with -mavx512f etc.) include this
// header too, and an out-of-line copy with external linkage could be picked by the linker for
// every caller, running AVX-512 code on CPUs without it. Internal linkage keeps copies apart.
#pragma once

#include <cstdint>
#include <cstring>

namespace kiln {

static inline float Fp32FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
static inline uint32_t Fp32ToBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return bits;
}

// binary16 -> binary32, exact for every input (subnormals, inf, NaN included).
static inline float Fp16ToFp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF;
  if (exp == 0) {
    if (mant == 0) return Fp32FromBits(sign);
    // Subnormal: value = mant * 2^-24.
    float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  if (exp == 31) return Fp32FromBits(sign | 0x7F800000 | (mant << 13));
  return Fp32FromBits(sign | ((exp + 112) << 23) | (mant << 13));
}

// binary32 -> binary16 with round-to-nearest-even (matches F16C's _cvtss_sh default rounding).
static inline uint16_t Fp32ToFp16(float f) {
  const uint32_t x = Fp32ToBits(f);
  const uint32_t sign = (x >> 16) & 0x8000;
  const uint32_t abs = x & 0x7FFFFFFF;
  if (abs >= 0x7F800000) {  // inf or NaN
    return static_cast<uint16_t>(sign | 0x7C00 | (abs > 0x7F800000 ? 0x200 : 0));
  }
  if (abs >= 0x477FF000) return static_cast<uint16_t>(sign | 0x7C00);  // rounds to >= 65520: inf
  if (abs < 0x38800000) {  // result is subnormal or zero in f16
    // value = abs_f * 2^24 rounded to an integer, ties to even.
    const uint32_t e = abs >> 23;
    if (e < 102) return static_cast<uint16_t>(sign);  // < 2^-25: rounds to zero
    const uint32_t m = (abs & 0x7FFFFF) | 0x800000;
    const uint32_t shift = 126 - e;  // 14..24
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  // Normal: rebias exponent, round mantissa from 23 to 10 bits (carry may bump the exponent).
  uint32_t h = ((abs >> 23) - 112) << 10 | ((abs >> 13) & 0x3FF);
  const uint32_t rem = abs & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;
  return static_cast<uint16_t>(sign | h);
}

static inline float Bf16ToFp32(uint16_t b) { return Fp32FromBits(static_cast<uint32_t>(b) << 16); }

// Round-to-nearest-even; NaN stays NaN (quiet).
static inline uint16_t Fp32ToBf16(float f) {
  uint32_t x = Fp32ToBits(f);
  if ((x & 0x7FFFFFFF) > 0x7F800000) return static_cast<uint16_t>((x >> 16) | 0x40);
  x += 0x7FFF + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

}  // namespace kiln
