// Device decoders of the ggml weight blocks the CUDA kernels read, written to match kiln's CPU
// reference dequantizers element for element (lib/quant/legacy_ref.cc, lib/quant/kquants.cc).
// Multi-byte fields are assembled from bytes: blocks of 20, 22, 34 or 210 bytes leave them
// unaligned for wider loads.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/gemv_units.h"  // the ggml type ids

namespace kiln::cuda {

__device__ __forceinline__ float LoadHalf(const uint8_t* p) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(p[0] | (p[1] << 8))));
}

// A type's block: kElems elements in kBytes bytes. Decode(block, e) is element e of the block.
template <uint32_t kType>
struct Block;

template <>
struct Block<kTypeF16> {
  static constexpr int kElems = 1, kBytes = 2;
  __device__ static float Decode(const uint8_t* b, int) { return LoadHalf(b); }
};

template <>
struct Block<kTypeQ8_0> {  // d (f16), qs[32] int8; value d * qs[e]
  static constexpr int kElems = 32, kBytes = 34;
  __device__ static float Decode(const uint8_t* b, int e) {
    return LoadHalf(b) * static_cast<float>(static_cast<int8_t>(b[2 + e]));
  }
};

template <>
struct Block<kTypeQ4_1> {  // d, m (f16), qs[16]: e < 16 low nibble of qs[e], else high of qs[e-16]
  static constexpr int kElems = 32, kBytes = 20;
  __device__ static float Decode(const uint8_t* b, int e) {
    const int q = e < 16 ? (b[4 + e] & 0xF) : (b[4 + e - 16] >> 4);
    return LoadHalf(b) * static_cast<float>(q) + LoadHalf(b + 2);
  }
};

template <>
struct Block<kTypeQ5_0> {  // d (f16), qh (LE u32), qs[16]; q = nibble | bit e of qh << 4
  static constexpr int kElems = 32, kBytes = 22;
  __device__ static float Decode(const uint8_t* b, int e) {
    const int nib = e < 16 ? (b[6 + e] & 0xF) : (b[6 + e - 16] >> 4);
    const int high = (b[2 + e / 8] >> (e % 8)) & 1;
    return static_cast<float>((nib | (high << 4)) - 16) * LoadHalf(b);
  }
};

template <>
struct Block<kTypeQ4_K> {  // d, dmin (f16), scales[12] (6-bit sc, m per 32), qs[128]
  static constexpr int kElems = 256, kBytes = 144;
  __device__ static float Decode(const uint8_t* b, int e) {
    const uint8_t* q = b + 4;  // packed scales
    const int j = e / 32, l = e % 32;
    int sc, m;
    if (j < 4) {
      sc = q[j] & 63;
      m = q[j + 4] & 63;
    } else {
      sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
      m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
    const int nib = (b[16 + 32 * (j / 2) + l] >> ((j % 2) * 4)) & 0xF;
    return LoadHalf(b) * static_cast<float>(sc) * static_cast<float>(nib) -
           LoadHalf(b + 2) * static_cast<float>(m);
  }
};

template <>
struct Block<kTypeQ6_K> {  // ql[128], qh[64], scales[16] int8, d (f16); value d*sc[e/16]*(q-32)
  static constexpr int kElems = 256, kBytes = 210;
  __device__ static float Decode(const uint8_t* b, int e) {
    const int half = e / 128, r = e % 128, quarter = r / 32, l = r % 32;
    const uint8_t* ql = b + 64 * half;
    const uint8_t* qh = b + 128 + 32 * half;
    const int low = (quarter & 1) ? ql[l + 32] : ql[l];
    const int low4 = (quarter & 2) ? (low >> 4) : (low & 0xF);
    const int q6 = low4 | (((qh[l] >> (2 * quarter)) & 3) << 4);
    const float scale = static_cast<float>(static_cast<int8_t>(b[192 + e / 16]));
    return LoadHalf(b + 208) * scale * static_cast<float>(q6 - 32);
  }
};

}  // namespace kiln::cuda
