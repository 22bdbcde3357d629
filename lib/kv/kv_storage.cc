#include "lib/kv/kv_storage.h"

#include <cstring>
#include <new>

namespace kiln {
namespace {

class HostKvStorage final : public KvStorage {
 public:
  HostKvStorage(std::byte* base, size_t block_bytes) : base_(base), block_bytes_(block_bytes) {}
  ~HostKvStorage() override {
    ::operator delete[](base_, std::align_val_t{KvLayout::kBlockAlignment});
  }
  std::byte* BlockData(BlockId b) override { return base_ + static_cast<size_t>(b) * block_bytes_; }
  void CopyBlock(BlockId from, BlockId to) override {
    std::memcpy(BlockData(to), BlockData(from), block_bytes_);
  }

 private:
  std::byte* base_;  // [n_blocks, block_bytes]
  size_t block_bytes_;
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
  auto* raw = static_cast<std::byte*>(
      ::operator new[](bytes, std::align_val_t{KvLayout::kBlockAlignment}, std::nothrow));
  if (raw == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV storage: cannot allocate ", bytes, " bytes for ", n_blocks, " blocks"));
  }
  return std::unique_ptr<KvStorage>(new HostKvStorage(raw, layout.block_bytes()));
}

}  // namespace kiln
