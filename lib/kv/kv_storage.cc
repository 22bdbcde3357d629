#include "lib/kv/kv_storage.h"

#include <cstring>

#include "lib/common/platform.h"

namespace kiln {
namespace {

class HostKvStorage final : public KvStorage {
 public:
  HostKvStorage(std::byte* base, const KvLayout& layout, int32_t n_blocks)
      : KvStorage(KvPlacement::TileMajor(base, layout, n_blocks)),
        tiles_per_block_(static_cast<size_t>(layout.tiles_per_block())),
        tile_bytes_(layout.tile_bytes()) {}
  ~HostKvStorage() override { platform::AlignedFree(placement().base); }
  void CopyBlock(BlockId from, BlockId to) override {
    for (size_t t = 0; t < tiles_per_block_; ++t) {
      std::memcpy(placement().Tile(to, t), placement().Tile(from, t), tile_bytes_);
    }
  }

 private:
  size_t tiles_per_block_;
  size_t tile_bytes_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<KvStorage>> NewHostKvStorage(const KvLayout& layout,
                                                            int32_t n_blocks) {
  if (n_blocks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("KV storage: n_blocks ", n_blocks, " < 1"));
  }
  const size_t bytes = static_cast<size_t>(n_blocks) * layout.block_bytes();
  if (bytes / layout.block_bytes() != static_cast<size_t>(n_blocks)) {
    return absl::InvalidArgumentError("KV storage: n_blocks * block_bytes overflows size_t");
  }
  // Huge pages, all touched here: an attention pass reads one head's tile of every block of a
  // sequence, and on 4 KiB pages each run of them costs its own TLB walk (engine_bench, default
  // model, 1 thread, block-major placement: decode4096 72-76 -> 79-86 tok/s). Touching the pool
  // now, as llama.cpp clears its cache at creation, keeps first-touch zeroing of a 2 MiB page out
  // of the decode steps (it pushed kiln-game's frame p99 over its budget when the pages were
  // faulted in lazily).
  auto* raw = static_cast<std::byte*>(platform::AlignedAllocLarge(bytes));
  if (raw == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV storage: cannot allocate ", bytes, " bytes for ", n_blocks, " blocks"));
  }
  std::memset(raw, 0, bytes);
  return std::unique_ptr<KvStorage>(new HostKvStorage(raw, layout, n_blocks));
}

}  // namespace kiln
