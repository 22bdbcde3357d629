// A seeded, portable pseudo-random generator for sampling: xoshiro256** (Blackman & Vigna 2018)
// seeded through splitmix64. Implemented here, bit for bit, so the same seed gives the same
// tokens on every platform and standard library (std::mt19937 is portable but the
// std::*_distribution adaptors are not).
//
// Thread-safety: none; one Rng per session (or per thread).
#pragma once

#include <array>
#include <cstdint>

namespace kiln::sample {

class Rng {
 public:
  explicit Rng(uint64_t seed) { Seed(seed); }

  // Resets the state as if constructed with `seed`. Any 64-bit seed is fine (0 included).
  void Seed(uint64_t seed) {
    uint64_t x = seed;
    for (uint64_t& word : state_) word = SplitMix64(x);
  }

  // The next 64 uniformly distributed bits.
  uint64_t NextU64() {
    const uint64_t result = Rotl(state_[1] * 5, 7) * 9;
    const uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = Rotl(state_[3], 45);
    return result;
  }

  // A uniform double in [0, 1): the top 53 bits of NextU64() times 2^-53. Exactly representable,
  // never 1.0.
  double NextDouble() { return static_cast<double>(NextU64() >> 11) * 0x1.0p-53; }

  // The whole generator state (four words, never all zero), for saving a session
  // (lib/session/session_state.h) and continuing it bit for bit with SetState.
  std::array<uint64_t, 4> state() const { return {state_[0], state_[1], state_[2], state_[3]}; }
  // Restores a state() (the caller checks it is not all zero: xoshiro256** would stay at zero).
  void SetState(const std::array<uint64_t, 4>& state) {
    for (int i = 0; i < 4; ++i) state_[i] = state[i];
  }

  // Number of 64-bit words drawn so far is not tracked; tests compare whole states instead.
  bool operator==(const Rng& other) const = default;

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  static uint64_t SplitMix64(uint64_t& x) {
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

  uint64_t state_[4];
};

}  // namespace kiln::sample
