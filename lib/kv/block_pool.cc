#include "lib/kv/block_pool.h"

#include <algorithm>
#include <cassert>

namespace kiln {

absl::StatusOr<std::unique_ptr<BlockPool>> BlockPool::Create(const KvLayout& layout,
                                                             int32_t n_blocks) {
  if (n_blocks < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "BlockPool: n_blocks must be >= 2 (block 0 is the reserved null block), got ", n_blocks));
  }
  return std::unique_ptr<BlockPool>(new BlockPool(layout, n_blocks));
}

BlockPool::BlockPool(const KvLayout& layout, int32_t n_blocks)
    : layout_(layout),
      n_blocks_(n_blocks),
      ref_(n_blocks, 0),
      prev_(n_blocks + 2, 0),
      next_(n_blocks + 2, 0),
      list_(n_blocks, kNoList),
      has_hash_(n_blocks, 0),
      hash_(n_blocks),
      parent_hash_(n_blocks),
      extra_key_(n_blocks, 0),
      tokens_(static_cast<size_t>(n_blocks) * layout.block_size(), 0) {
  for (ListId list : {kFreeList, kLruList}) {
    const int32_t s = Sentinel(list);
    prev_[s] = next_[s] = s;
  }
  // Blocks 1..n-1 in order, so a fresh pool hands out 1, 2, 3, ...
  for (BlockId b = 1; b < n_blocks; ++b) PushBack(kFreeList, b);
}

void BlockPool::PushFront(ListId list, BlockId b) {
  const int32_t s = Sentinel(list);
  const int32_t first = next_[s];
  prev_[b] = s;
  next_[b] = first;
  prev_[first] = b;
  next_[s] = b;
  list_[b] = list;
  (list == kFreeList ? free_count_ : lru_count_) += 1;
}

void BlockPool::PushBack(ListId list, BlockId b) {
  const int32_t s = Sentinel(list);
  const int32_t last = prev_[s];
  next_[b] = s;
  prev_[b] = last;
  next_[last] = b;
  prev_[s] = b;
  list_[b] = list;
  (list == kFreeList ? free_count_ : lru_count_) += 1;
}

void BlockPool::Unlink(BlockId b) {
  assert(list_[b] != kNoList);
  next_[prev_[b]] = next_[b];
  prev_[next_[b]] = prev_[b];
  (list_[b] == kFreeList ? free_count_ : lru_count_) -= 1;
  list_[b] = kNoList;
}

void BlockPool::DropHash(BlockId b) {
  if (!has_hash_[b]) return;
  auto it = index_.find(hash_[b]);
  if (it != index_.end() && it->second == b) index_.erase(it);
  has_hash_[b] = 0;
}

BlockId BlockPool::Allocate() {
  assert(num_available() > 0);
  BlockId b;
  if (free_count_ > 0) {
    b = next_[Sentinel(kFreeList)];
  } else {
    b = next_[Sentinel(kLruList)];  // least recently released cached block
    DropHash(b);
    ++evictions_;
  }
  Unlink(b);
  ref_[b] = 1;
  return b;
}

void BlockPool::Ref(BlockId b) {
  assert(b > kNullBlock && b < n_blocks_);
  if (ref_[b]++ == 0) Unlink(b);  // a cached block becomes used again
}

void BlockPool::Release(BlockId b) {
  assert(b > kNullBlock && b < n_blocks_ && ref_[b] >= 1);
  if (--ref_[b] > 0) return;
  if (has_hash_[b]) {
    PushBack(kLruList, b);
  } else {
    PushFront(kFreeList, b);
  }
}

bool BlockPool::RegisterHash(BlockId b, const BlockHash& hash, const BlockHash& parent,
                             uint64_t extra_key, std::span<const int32_t> tokens) {
  assert(!has_hash_[b] && ref_[b] >= 1);
  assert(tokens.size() == static_cast<size_t>(layout_.block_size()));
  if (!index_.try_emplace(hash, b).second) return false;
  has_hash_[b] = 1;
  hash_[b] = hash;
  parent_hash_[b] = parent;
  extra_key_[b] = extra_key;
  std::copy(tokens.begin(), tokens.end(),
            tokens_.begin() + static_cast<ptrdiff_t>(b) * layout_.block_size());
  return true;
}

BlockId BlockPool::Lookup(const BlockHash& hash, const BlockHash& parent, uint64_t extra_key,
                          std::span<const int32_t> tokens) const {
  auto it = index_.find(hash);
  if (it == index_.end()) return kNullBlock;
  const BlockId b = it->second;
  if (!(parent_hash_[b] == parent) || extra_key_[b] != extra_key ||
      tokens.size() != static_cast<size_t>(layout_.block_size()) ||
      !std::equal(tokens.begin(), tokens.end(),
                  tokens_.begin() + static_cast<ptrdiff_t>(b) * layout_.block_size())) {
    return kNullBlock;
  }
  return b;
}

absl::Status BlockPool::CheckInvariants() const {
  if (ref_[kNullBlock] != 0 || list_[kNullBlock] != kNoList || has_hash_[kNullBlock]) {
    return absl::InternalError("BlockPool: the null block was allocated, listed or hashed");
  }
  for (ListId list : {kFreeList, kLruList}) {
    const int32_t s = Sentinel(list);
    int32_t count = 0;
    for (int32_t b = next_[s]; b != s; b = next_[b]) {
      if (b <= kNullBlock || b >= n_blocks_) {
        return absl::InternalError(absl::StrCat("BlockPool: list ", list, " holds block id ", b));
      }
      if (list_[b] != list || ref_[b] != 0 || prev_[next_[b]] != b) {
        return absl::InternalError(
            absl::StrCat("BlockPool: block ", b, " is badly linked in list ", list));
      }
      if ((list == kLruList) != (has_hash_[b] != 0)) {
        return absl::InternalError(
            absl::StrCat("BlockPool: block ", b, " in list ", list, " has hash=", has_hash_[b]));
      }
      if (++count > n_blocks_) return absl::InternalError("BlockPool: a list has a cycle");
    }
    if (count != (list == kFreeList ? free_count_ : lru_count_)) {
      return absl::InternalError(absl::StrCat("BlockPool: list ", list, " has ", count,
                                              " blocks, counter says ",
                                              list == kFreeList ? free_count_ : lru_count_));
    }
  }
  int32_t hashed = 0;
  for (BlockId b = 1; b < n_blocks_; ++b) {
    if (ref_[b] < 0) return absl::InternalError(absl::StrCat("BlockPool: block ", b, " ref < 0"));
    if ((ref_[b] == 0) == (list_[b] == kNoList)) {
      return absl::InternalError(
          absl::StrCat("BlockPool: block ", b, " ref ", ref_[b], " but list ", list_[b]));
    }
    if (has_hash_[b]) {
      ++hashed;
      auto it = index_.find(hash_[b]);
      if (it == index_.end() || it->second != b) {
        return absl::InternalError(
            absl::StrCat("BlockPool: block ", b, " has a hash missing from the index"));
      }
    }
  }
  if (hashed != static_cast<int32_t>(index_.size())) {
    return absl::InternalError(absl::StrCat("BlockPool: index has ", index_.size(), " entries, ",
                                            hashed, " blocks carry a hash"));
  }
  return absl::OkStatus();
}

std::vector<BlockId> BlockPool::LruOrder() const {
  std::vector<BlockId> out;
  const int32_t s = Sentinel(kLruList);
  for (int32_t b = next_[s]; b != s; b = next_[b]) out.push_back(b);
  return out;
}

}  // namespace kiln
