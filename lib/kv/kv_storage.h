// KvStorage: the memory behind a KvCache's blocks. lib/kv keeps the bookkeeping (block pool,
// tables, prefix index); the bytes belong to a backend (lib/backend/backend.h,
// Backend::NewKvStorage), which holds each block's tiles (kv_layout.h) where its KvPlacement
// says. Host memory (NewHostKvStorage, tile-major) is what the CPU backend provides, and the
// default for caches made without a backend (tests, tools).
//
// Thread-safety: none; the owning KvCache serializes calls. Kernels may read and write block
// memory between calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "lib/common/status.h"
#include "lib/kv/kv_layout.h"

namespace kiln {

using BlockId = int32_t;

// Where a storage puts its blocks' tiles (KvLayout's tile order): tile t of block b starts at
// base + b * block_stride + t * tile_stride.
//   BlockMajor: a block's tiles side by side (block_stride = block_bytes, tile_stride =
//     tile_bytes), so a block is one region and copy-on-write one copy.
//   TileMajor: tile t of every block side by side (block_stride = tile_bytes, tile_stride =
//     n_blocks * tile_bytes), so one kv head's rows of a sequence whose blocks were handed out in
//     order are one run of memory. A decode step reads one kv head's tile of every block of its
//     context; block-major spreads those a whole block apart, and one core streamed them at
//     half its read bandwidth (docs/kv_cache.md).
struct KvPlacement {
  std::byte* base = nullptr;
  size_t block_stride = 0;
  size_t tile_stride = 0;

  std::byte* Tile(BlockId b, size_t t) const {
    return base + static_cast<size_t>(b) * block_stride + t * tile_stride;
  }
  static KvPlacement BlockMajor(std::byte* base, const KvLayout& layout) {
    return {base, layout.block_bytes(), layout.tile_bytes()};
  }
  static KvPlacement TileMajor(std::byte* base, const KvLayout& layout, int32_t n_blocks) {
    return {base, layout.tile_bytes(), static_cast<size_t>(n_blocks) * layout.tile_bytes()};
  }
};

class KvStorage {
 public:
  virtual ~KvStorage() = default;
  // Where block b's tiles are. Addresses are host addresses when host_addressable(), else
  // addresses in the backend's device memory that only its kernels and copies may use.
  const KvPlacement& placement() const { return placement_; }
  // Whether the host may read and write the tiles' bytes (false for device memory: code that
  // reads blocks on the host, such as saving a session's K/V, must refuse such a cache).
  virtual bool host_addressable() const { return true; }
  // Copies block `from`'s tiles into block `to` (copy-on-write).
  virtual void CopyBlock(BlockId from, BlockId to) = 0;

 protected:
  explicit KvStorage(const KvPlacement& placement) : placement_(placement) {}

 private:
  KvPlacement placement_;
};

// n_blocks blocks in one aligned host allocation of n_blocks * layout.block_bytes() bytes, placed
// tile-major, zeroed. Errors: InvalidArgument (n_blocks < 1, size overflow), ResourceExhausted
// (allocation failed).
absl::StatusOr<std::unique_ptr<KvStorage>> NewHostKvStorage(const KvLayout& layout,
                                                            int32_t n_blocks);

}  // namespace kiln
