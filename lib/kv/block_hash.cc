#include "lib/kv/block_hash.h"

namespace kiln {
namespace {

// SplitMix64's finalizer: a bijective avalanche on 64 bits.
inline uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// A second, different bijective finalizer (Murmur3's fmix64) for the high lane.
inline uint64_t Fmix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

constexpr uint64_t kLaneLo = 0x9e3779b97f4a7c15ULL;
constexpr uint64_t kLaneHi = 0xd6e8feb86659fd93ULL;

}  // namespace

BlockHash RootBlockHash(uint64_t extra_key, uint64_t seed) {
  return {Mix64(extra_key ^ Mix64(seed ^ kLaneLo)), Fmix64(extra_key + Fmix64(seed + kLaneHi))};
}

BlockHash ChainBlockHash(const BlockHash& parent, uint64_t extra_key,
                         std::span<const int32_t> tokens) {
  uint64_t lo = Mix64(parent.lo ^ Mix64(extra_key + kLaneLo));
  uint64_t hi = Fmix64(parent.hi + Fmix64(extra_key ^ kLaneHi));
  // Two token ids per step, as one 64-bit word.
  size_t i = 0;
  for (; i + 1 < tokens.size(); i += 2) {
    const uint64_t word = static_cast<uint64_t>(static_cast<uint32_t>(tokens[i])) |
                          (static_cast<uint64_t>(static_cast<uint32_t>(tokens[i + 1])) << 32);
    lo = Mix64(lo + word * kLaneLo);
    hi = Fmix64(hi ^ (word + kLaneHi));
  }
  if (i < tokens.size()) {
    const uint64_t word = static_cast<uint64_t>(static_cast<uint32_t>(tokens[i])) | (1ULL << 63);
    lo = Mix64(lo + word * kLaneLo);
    hi = Fmix64(hi ^ (word + kLaneHi));
  }
  // Length in the final step so blocks of different sizes never alias.
  lo = Mix64(lo ^ tokens.size());
  hi = Fmix64(hi + tokens.size());
  return {lo, hi};
}

}  // namespace kiln
