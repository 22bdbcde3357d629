// The GEMV kernel's unit decoders for the weight types it reads a word at a time (gemv.cu):
// unit u of a row is kElems consecutive elements, decoded to the values of the CPU's
// dequantizers (lib/quant). Host and device code alike, so that tests/unit/cuda_kernels_test.cc
// replays them on a machine without a device against the CPU's dequantizers.
//
// Each decoder loads whole 2- or 4-byte fields (16 bytes for f16), so the row must start at a
// multiple of kAlign bytes (gemv.cu checks it and otherwise decodes element by element).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#define KILN_CUDA_HD __host__ __device__ __forceinline__
#else
#define KILN_CUDA_HD inline
#endif
#if defined(__CUDA_ARCH__)  // the device pass only: the host compiler does not know the pragma
#define KILN_CUDA_UNROLL _Pragma("unroll")
#else
#define KILN_CUDA_UNROLL
#endif

namespace kiln::cuda {

// ggml type ids (lib/common/ggml_type.h).
enum : uint32_t {
  kTypeF32 = 0,
  kTypeF16 = 1,
  kTypeQ4_1 = 3,
  kTypeQ5_0 = 6,
  kTypeQ8_0 = 8,
  kTypeQ4_K = 12,
  kTypeQ6_K = 14,
  kTypeBF16 = 30,
};

// The f16 in the low 16 bits of `bits`, as f32 (exact either way).
KILN_CUDA_HD float HalfBits(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits & 0xFFFF)));
#else
  const uint32_t sign = (bits & 0x8000u) << 16, exp = (bits >> 10) & 0x1F, mant = bits & 0x3FF;
  uint32_t f;
  if (exp == 0x1F) {
    f = sign | 0x7F800000u | (mant << 13);  // inf, NaN
  } else if (exp != 0) {
    f = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    f = sign;
  } else {  // subnormal: normalize
    int e = -1;
    uint32_t m = mant;
    do {
      ++e;
      m <<= 1;
    } while ((m & 0x400) == 0);
    f = sign | ((112 - e) << 23) | ((m & 0x3FF) << 13);
  }
  float out;
  std::memcpy(&out, &f, 4);
  return out;
#endif
}

// An aligned 2- or 4-byte field (a plain load on the device; memcpy on the host).
template <typename T>
KILN_CUDA_HD T LoadField(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const T*>(p);
#else
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
#endif
}

template <uint32_t kType>
struct WordUnit;  // defined for the types below only

template <>
struct WordUnit<kTypeF16> {  // 8 elements: 16 bytes
  static constexpr int kElems = 8, kAlign = 16;
  KILN_CUDA_HD static void Decode(const uint8_t* row, int64_t u, float* w) {
    const uint8_t* p = row + u * 16;
#if defined(__CUDA_ARCH__)
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#else
    uint32_t words[4];
    std::memcpy(words, p, 16);
#endif
    KILN_CUDA_UNROLL
    for (int i = 0; i < 4; ++i) {
      w[2 * i] = HalfBits(words[i]);
      w[2 * i + 1] = HalfBits(words[i] >> 16);
    }
  }
};

template <>
struct WordUnit<kTypeQ4_1> {  // one block of 20 bytes: d, m (f16), qs[16]; 5 words
  static constexpr int kElems = 32, kAlign = 4;
  KILN_CUDA_HD static void Decode(const uint8_t* row, int64_t u, float* w) {
    const uint8_t* b = row + u * 20;
    const uint32_t dm = LoadField<uint32_t>(b);
    const float d = HalfBits(dm), m = HalfBits(dm >> 16);
    KILN_CUDA_UNROLL
    for (int i = 0; i < 4; ++i) {
      const uint32_t q = LoadField<uint32_t>(b + 4 + 4 * i);
      KILN_CUDA_UNROLL
      for (int j = 0; j < 4; ++j) {
        const uint32_t byte = (q >> (8 * j)) & 0xFF;
        w[4 * i + j] = d * static_cast<float>(byte & 0xF) + m;
        w[16 + 4 * i + j] = d * static_cast<float>(byte >> 4) + m;
      }
    }
  }
};

template <>
struct WordUnit<kTypeQ8_0> {  // one block of 34 bytes: d (f16), qs[32] int8; 17 half-words
  static constexpr int kElems = 32, kAlign = 2;
  KILN_CUDA_HD static void Decode(const uint8_t* row, int64_t u, float* w) {
    const uint8_t* b = row + u * 34;
    const float d = HalfBits(LoadField<uint16_t>(b));
    KILN_CUDA_UNROLL
    for (int i = 0; i < 16; ++i) {
      const uint16_t q = LoadField<uint16_t>(b + 2 + 2 * i);
      w[2 * i] = d * static_cast<float>(static_cast<int8_t>(q & 0xFF));
      w[2 * i + 1] = d * static_cast<float>(static_cast<int8_t>(q >> 8));
    }
  }
};

template <>
struct WordUnit<kTypeQ4_K> {  // sub-block u % 8 of super-block u / 8 (144 bytes: 36 words)
  static constexpr int kElems = 32, kAlign = 4;
  KILN_CUDA_HD static void Decode(const uint8_t* row, int64_t u, float* w) {
    const uint8_t* b = row + u / 8 * 144;
    const int j = static_cast<int>(u % 8);
    const uint32_t dm = LoadField<uint32_t>(b);
    const float d = HalfBits(dm), dmin = HalfBits(dm >> 16);
    // Byte i of the 12 packed scale bytes (selects, not an array: j is not a constant).
    const uint32_t s0 = LoadField<uint32_t>(b + 4), s1 = LoadField<uint32_t>(b + 8),
                   s2 = LoadField<uint32_t>(b + 12);
    auto q = [&](int i) -> int {
      const uint32_t word = i < 4 ? s0 : (i < 8 ? s1 : s2);
      return static_cast<int>((word >> (8 * (i & 3))) & 0xFF);
    };
    int sc, m;
    if (j < 4) {
      sc = q(j) & 63;
      m = q(j + 4) & 63;
    } else {
      sc = (q(j + 4) & 0x0F) | ((q(j - 4) >> 6) << 4);
      m = (q(j + 4) >> 4) | ((q(j) >> 6) << 4);
    }
    const uint8_t* qs = b + 16 + 32 * (j / 2);
    const int shift = (j % 2) * 4;
    KILN_CUDA_UNROLL
    for (int i = 0; i < 8; ++i) {
      const uint32_t v = LoadField<uint32_t>(qs + 4 * i);
      KILN_CUDA_UNROLL
      for (int k = 0; k < 4; ++k) {
        const int nib = (v >> (8 * k + shift)) & 0xF;
        w[4 * i + k] =
            d * static_cast<float>(sc) * static_cast<float>(nib) - dmin * static_cast<float>(m);
      }
    }
  }
};

}  // namespace kiln::cuda
