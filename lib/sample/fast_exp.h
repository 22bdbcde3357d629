// exp() for the sampler's softmax passes over the whole vocabulary: plain float arithmetic the
// compiler vectorizes (glibc's expf is a scalar call, ~4 ns each, 200 µs per 49,152-token pass).
// Reference: std::exp; tests/unit/sample_sampler_test.cc compares them (max relative error
// below 3e-7 on [-87, 0]).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

namespace kiln::sample {

// e^x for x <= 0 (the argument is always logit - max_logit). Below -87 returns 0 (true value
// < 1.7e-38, under float's normal range). Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, then a
// degree-7 Taylor polynomial for e^r (truncation error < r^8/8! = 5e-9) and 2^n through the
// exponent bits.
inline float FastExpNonPositive(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693145751953125f;  // ln2 split: hi has 12 significant bits
  constexpr float kLn2Lo = 1.428606765330187e-06f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  // Clamp below -87 with integer operations only (float selects are not if-converted, so they
  // would block vectorization): for x <= 0, x < -87 <=> bits(x) > bits(-87) (-inf included).
  constexpr uint32_t kLimitBits = 0xC2AE0000u;  // bits of -87.0f
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t underflow = 0u - static_cast<uint32_t>(bits > kLimitBits);  // all ones or 0
  x = std::bit_cast<float>((bits & ~underflow) | (kLimitBits & underflow));
  const float n = (x * kLog2e + kRound) - kRound;  // round(x / ln2), in [-126, 0]
  const float r = (x - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t exponent = static_cast<int32_t>(n) + 127;  // >= 1: a normal float
  const float scale = std::bit_cast<float>(static_cast<uint32_t>(exponent) << 23);
  return std::bit_cast<float>(std::bit_cast<uint32_t>(p * scale) & ~underflow);
}

// out[i] = e^(in[i] - shift) for in[i] <= shift (including -inf -> 0). [n]
inline void FastExpShifted(const float* in, float shift, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = FastExpNonPositive(in[i] - shift);
}

}  // namespace kiln::sample
