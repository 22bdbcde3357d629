// KvStorage: the memory behind a KvCache's blocks. lib/kv keeps the bookkeeping (block pool,
// tables, prefix index); the bytes belong to a backend (lib/backend/backend.h,
// Backend::NewKvStorage), which lays block b out as kv_layout.h describes. Host memory
// (NewHostKvStorage) is what the CPU backend provides, and the default for caches made without
// a backend (tests, tools).
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

class KvStorage {
 public:
  virtual ~KvStorage() = default;
  // Start of physical block b (layout.block_bytes() bytes, KvLayout::kBlockAlignment aligned).
  // A host address when host_addressable(), else an address in the backend's device memory that
  // only its kernels and copies may use. Precondition: 0 <= b < the storage's block count.
  virtual std::byte* BlockData(BlockId b) = 0;
  // Whether the host may read and write BlockData's bytes (false for device memory: code that
  // reads blocks on the host, such as saving a session's K/V, must refuse such a cache).
  virtual bool host_addressable() const { return true; }
  // Copies block `from`'s bytes into block `to` (copy-on-write).
  virtual void CopyBlock(BlockId from, BlockId to) = 0;
};

// n_blocks blocks of layout.block_bytes() in one aligned host allocation (contents undefined).
// Errors: InvalidArgument (n_blocks < 1, size overflow), ResourceExhausted (allocation failed).
absl::StatusOr<std::unique_ptr<KvStorage>> NewHostKvStorage(const KvLayout& layout,
                                                            int32_t n_blocks);

}  // namespace kiln
