#include "lib/backend/cuda/cuda_plan.h"

#include <algorithm>

namespace kiln::cuda {

MatMulPath ChooseMatMulPath(const MatMulCaps& caps, bool weight_on_device, int64_t n_out,
                            int64_t n_in, int64_t n_tokens) {
  if (!weight_on_device || n_tokens < 1) return MatMulPath::kCpu;
  const bool gemv = caps.gemv_max_tokens > 0;
  if (gemv && n_tokens <= std::min<int64_t>(kGemvMaxTokens, caps.gemv_max_tokens)) {
    return MatMulPath::kGemv;
  }
  if (caps.gemm && n_out % 8 == 0 && n_in % 8 == 0) return MatMulPath::kGemm;
  return gemv ? MatMulPath::kGemv : MatMulPath::kCpu;
}

KilnCudaPagedKv PagedKvOf(const KvLayout& layout, const KvPlacement& placement, int32_t n_blocks,
                          int32_t layer) {
  KilnCudaPagedKv kv = {};
  kv.block_stride_bytes = static_cast<int64_t>(placement.block_stride);
  kv.head_stride_bytes = static_cast<int64_t>(placement.tile_stride);
  kv.row_bytes = static_cast<int64_t>(layout.row_bytes());
  kv.n_blocks = n_blocks;
  kv.block_size = layout.block_size();
  kv.head_dim = layout.row_elems();
  kv.elem_type = static_cast<uint32_t>(layout.elem_type());
  if (layout.kind() == KvAttentionKind::kMla) {
    kv.d_k_base = kv.d_v_base = placement.Tile(0, layout.LatentTileIndex(layer));
    kv.n_kv_heads = 1;
    // The RoPE part is stored in another type only in a q8_0 cache (f16 after the blocks of c).
    if (layout.rope_elem_type() != layout.elem_type()) {
      kv.tail_start = layout.kv_lora_rank();
      kv.tail_offset_bytes = static_cast<int64_t>(layout.rope_offset_bytes());
    }
  } else {
    kv.d_k_base = placement.Tile(0, layout.KeyTileIndex(layer, 0));
    kv.d_v_base = placement.Tile(0, layout.ValueTileIndex(layer, 0));
    kv.n_kv_heads = layout.n_kv_heads();
  }
  return kv;
}

PackedMask PackMask(const AttentionMask& mask, int32_t group) {
  PackedMask p;
  p.n_tokens = static_cast<int64_t>(mask.seq.size());
  auto append = [&p](std::span<const int32_t> a) {
    const size_t at = p.data.size();
    p.data.insert(p.data.end(), a.begin(), a.end());
    return at;
  };
  p.seq = append(mask.seq);
  p.kv_indptr = append(mask.tables->indptr);
  p.kv_indices = append(mask.tables->indices_of(group));
  p.n_visible = append(mask.n_visible);
  if (!mask.first_visible.empty()) p.first_visible = append(mask.first_visible);
  if (!mask.extra_indptr.empty()) {
    p.extra_indptr = append(mask.extra_indptr);
    p.extra_positions = append(mask.extra_positions);
  }
  p.error = p.data.size();
  p.data.push_back(0);
  for (int64_t t = 0; t < p.n_tokens; ++t) {
    const int32_t first = mask.first_visible.empty() ? 0 : mask.first_visible[t];
    const int32_t extra =
        mask.extra_indptr.empty() ? 0 : mask.extra_indptr[t + 1] - mask.extra_indptr[t];
    p.max_visible = std::max(p.max_visible, mask.n_visible[t] - first + extra);
  }
  return p;
}

KilnCudaAttentionBatch BatchAt(const PackedMask& packed, int32_t* base) {
  auto at = [base](size_t offset) -> int32_t* {
    return offset == PackedMask::kAbsent ? nullptr : base + offset;
  };
  KilnCudaAttentionBatch b = {};
  b.n_tokens = packed.n_tokens;
  b.d_seq = at(packed.seq);
  b.d_kv_indptr = at(packed.kv_indptr);
  b.d_kv_indices = at(packed.kv_indices);
  b.d_n_visible = at(packed.n_visible);
  b.d_first_visible = at(packed.first_visible);
  b.d_extra_indptr = at(packed.extra_indptr);
  b.d_extra_positions = at(packed.extra_positions);
  b.d_error = at(packed.error);
  return b;
}

int32_t ChooseSplits(int64_t n_rows, int32_t max_visible) {
  if (n_rows < 1 || max_visible <= kMinRowsPerSplit) return 1;
  const int64_t to_fill = (kSplitTargetBlocks + n_rows - 1) / n_rows;
  const int64_t by_rows = max_visible / kMinRowsPerSplit;
  return static_cast<int32_t>(std::clamp<int64_t>(std::min(to_fill, by_rows), 1, kMaxSplits));
}

void DeviceCopies::Add(const void* host, size_t bytes, void* device) {
  ranges_[reinterpret_cast<uintptr_t>(host)] = {bytes, static_cast<std::byte*>(device)};
  bytes_ += bytes;
}

const void* DeviceCopies::Find(const void* host, size_t bytes) const {
  if (host == nullptr) return nullptr;
  const auto h = reinterpret_cast<uintptr_t>(host);
  auto it = ranges_.upper_bound(h);  // the first range starting after h
  if (it == ranges_.begin()) return nullptr;
  --it;  // the last range starting at or before h
  const size_t offset = h - it->first;
  if (offset > it->second.bytes || bytes > it->second.bytes - offset) return nullptr;
  return it->second.device + offset;
}

}  // namespace kiln::cuda
