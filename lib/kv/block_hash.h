// Chained content hashes of full KV blocks, the keys of the prefix cache.
//
// The hash of block i of a sequence covers everything that determines its K/V content:
//   hash_0 = H(root(extra_key, seed), tokens[0 .. bs))
//   hash_i = H(hash_{i-1}, extra_key, tokens[i*bs .. (i+1)*bs))
// so equal hashes mean (up to a collision) equal token prefixes under the same extra key (model,
// LoRA adapter, ...). The hash is 128 bits from two independent 64-bit lanes; it is fast, not
// cryptographic. Collisions cannot corrupt a sequence: a hit is verified against the stored
// token ids, the stored parent hash and the extra key (block_pool.h). The per-cache `seed` makes
// hashes unpredictable across processes when it is set from a random source.
#pragma once

#include <cstdint>
#include <span>
#include <utility>

namespace kiln {

struct BlockHash {
  uint64_t lo = 0;
  uint64_t hi = 0;

  friend bool operator==(const BlockHash&, const BlockHash&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const BlockHash& b) {
    return H::combine(std::move(h), b.lo, b.hi);
  }
};

// The parent of block 0: depends on the extra key and the cache's seed.
BlockHash RootBlockHash(uint64_t extra_key, uint64_t seed);

// Hash of one full block given its parent's hash. `tokens` has block_size ids.
BlockHash ChainBlockHash(const BlockHash& parent, uint64_t extra_key,
                         std::span<const int32_t> tokens);

}  // namespace kiln
