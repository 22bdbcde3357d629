// The physical block pool of the KV cache: the bookkeeping of n_blocks fixed-size blocks (their
// bytes live in a KvStorage, kv_storage.h): a reference count per block, two intrusive lists and
// the prefix index.
//
// Block states (every block except the null block is in exactly one):
//   free    ref == 0, no hash      on the free list (LIFO: the most recently freed is reused first)
//   cached  ref == 0, hash         on the LRU list (oldest first), still in the prefix index
//   used    ref >= 1 (hash or not) on no list; held by ref sequences
// Block 0 is the null block: never allocated, never listed, its ref count stays 0. Kernels may
// point padding table entries at it.
//
// Allocate() takes a free block; only when none is left does it evict the head of the LRU (the
// least recently released cached block), dropping its hash. Releasing a chain tail-first (the
// facade does) puts tails ahead of their parents in the LRU, so tails are evicted first.
//
// A block with a hash is immutable: its content equals what produced the hash. The facade never
// writes into one (it copies first).
//
// Thread-safety: none; the owner (KvCache) serializes all calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "lib/common/status.h"
#include "lib/kv/block_hash.h"
#include "lib/kv/kv_layout.h"
#include "lib/kv/kv_storage.h"

namespace kiln {

inline constexpr BlockId kNullBlock = 0;

class BlockPool {
 public:
  // `n_blocks` includes the null block; requires n_blocks >= 2.
  static absl::StatusOr<std::unique_ptr<BlockPool>> Create(const KvLayout& layout,
                                                           int32_t n_blocks);

  const KvLayout& layout() const { return layout_; }
  int32_t num_blocks() const { return n_blocks_; }      // including the null block
  int32_t num_usable() const { return n_blocks_ - 1; }  // excluding it
  int32_t num_free() const { return free_count_; }      // ref 0, no hash
  int32_t num_cached() const { return lru_count_; }     // ref 0, hash (evictable)
  int32_t num_used() const { return num_usable() - free_count_ - lru_count_; }
  int32_t num_available() const { return free_count_ + lru_count_; }
  int64_t evictions() const { return evictions_; }

  // Takes a block (ref 1, no hash). Precondition: num_available() > 0 (asserted).
  BlockId Allocate();
  // ref += 1; a cached block leaves the LRU. Precondition: 1 <= b < n_blocks.
  void Ref(BlockId b);
  // ref -= 1; at 0 the block goes to the LRU tail (hash) or the free list (no hash).
  // Precondition: ref(b) >= 1.
  void Release(BlockId b);
  int32_t ref_count(BlockId b) const { return ref_[b]; }

  // Prefix index. A registered block stores its hash, parent hash, extra key and token ids.
  bool has_hash(BlockId b) const { return has_hash_[b] != 0; }
  const BlockHash& hash(BlockId b) const { return hash_[b]; }
  // Registers used block `b` (no hash yet) under `hash`. Returns false (and changes nothing) when
  // another block already holds that hash: the index keeps the first copy.
  bool RegisterHash(BlockId b, const BlockHash& hash, const BlockHash& parent, uint64_t extra_key,
                    std::span<const int32_t> tokens);
  // The block indexed under `hash` whose stored parent hash, extra key and token ids all equal the
  // arguments, or kNullBlock (a miss, or a hash collision caught by the verification).
  BlockId Lookup(const BlockHash& hash, const BlockHash& parent, uint64_t extra_key,
                 std::span<const int32_t> tokens) const;
  int32_t num_hashed() const { return static_cast<int32_t>(index_.size()); }

  // Walks every list and the index; Internal error naming the first broken invariant.
  absl::Status CheckInvariants() const;

  // Blocks in the LRU, least recently released first (tests, debugging).
  std::vector<BlockId> LruOrder() const;

 private:
  enum ListId : uint8_t { kNoList = 0, kFreeList = 1, kLruList = 2 };
  BlockPool(const KvLayout& layout, int32_t n_blocks);

  int32_t Sentinel(ListId list) const { return n_blocks_ + (list == kFreeList ? 0 : 1); }
  void PushFront(ListId list, BlockId b);
  void PushBack(ListId list, BlockId b);
  void Unlink(BlockId b);
  void DropHash(BlockId b);

  KvLayout layout_;
  int32_t n_blocks_;

  std::vector<int32_t> ref_;   // [n_blocks]
  std::vector<int32_t> prev_;  // [n_blocks + 2]; the two sentinels are the free and LRU heads
  std::vector<int32_t> next_;  // [n_blocks + 2]
  std::vector<uint8_t> list_;  // [n_blocks] ListId
  int32_t free_count_ = 0;
  int32_t lru_count_ = 0;
  int64_t evictions_ = 0;

  std::vector<uint8_t> has_hash_;       // [n_blocks]
  std::vector<BlockHash> hash_;         // [n_blocks]
  std::vector<BlockHash> parent_hash_;  // [n_blocks]
  std::vector<uint64_t> extra_key_;     // [n_blocks]
  std::vector<int32_t> tokens_;         // [n_blocks, block_size] token ids of hashed blocks
  absl::flat_hash_map<BlockHash, BlockId> index_;
};

}  // namespace kiln
