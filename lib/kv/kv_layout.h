// Byte layout of one physical KV-cache block, chosen by the model's attention type.
//
// A block holds `block_size` consecutive token slots of one sequence for every layer, as a list
// of tiles; a tile is [block_size, row_elems] elements of `elem_type`, row-major (one row per
// token slot). A block's tiles, in tile-index order:
//
//   GQA/MHA/MQA:  [n_layers][2 (K, V)][n_kv_heads] tiles of [block_size, head_dim]
//   MLA:          [n_layers] tiles of [block_size, kv_lora_rank + rope_dim]
//                 (per row: the compressed latent c_kv first, then the decoupled RoPE key k_r)
//
// One KV head's keys for a block are one contiguous tile, so an attention kernel reads each tile
// once for all query heads of its group. Where the tiles of all blocks sit in memory is the
// storage's choice (KvPlacement, kv_storage.h): a block's tiles side by side, or one tile index
// of every block side by side. `block_bytes()` is a block's share of the pool (its tiles, rounded
// up to 64 bytes).
//
// Element types: f32, f16, bf16, and q8_0: a GQA row is ggml's block_q8_0 list (per 32 elements
// an f16 scale then 32 int8, 34 bytes), so head_dim must be a multiple of 32; an MLA row holds
// the latent c as block_q8_0 (kv_lora_rank a multiple of 32) and then the RoPE key k_r
// unquantized as f16 (rope_elem_type, rope_offset_bytes). Rows stay independent (a row is written
// whole, once), so copy-on-write and slot copies are unchanged.
//
// Sliding-window groups (gemma3; WithSlidingGroups): the layers split into groups of at most
// layers_per_group() layers each, global layers (every position) in the leading groups and
// sliding layers (the last `sliding_window` positions) in the rest. A block then belongs to one
// group and holds that group's layers only: the tile formulas above hold with a layer's index
// inside its group. Every group's block has the same bytes (a group of fewer layers leaves the
// rest of its block unused), so all groups draw from one pool, as vLLM's KV-cache groups do:
// blocks a sliding group releases serve any group. KvCache keeps one block table per group per
// sequence, so the sliding groups' blocks that leave every window can be released while the
// global groups keep the whole context (docs/kv_cache.md).
//
// Thread-safety: immutable after creation; free to share between threads.
#pragma once

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "lib/common/ggml_type.h"
#include "lib/common/half.h"
#include "lib/common/status.h"

namespace kiln {

enum class KvAttentionKind : uint8_t {
  kGqa,  // separate K and V per KV head (MHA: n_kv_heads == n_heads, MQA: n_kv_heads == 1)
  kMla,  // one latent row (kv_lora_rank + rope_dim) per token per layer
};

class KvLayout {
 public:
  static constexpr int32_t kDefaultBlockSize = 16;
  static constexpr size_t kBlockAlignment = 64;
  // Most groups a layout splits into (WithSlidingGroups widens the groups to stay within it).
  static constexpr int32_t kMaxGroups = 8;

  // MHA/GQA/MQA. Requires every count >= 1 and elem_type in {f32, f16, bf16, q8_0}; q8_0 needs
  // head_dim % 32 == 0.
  static absl::StatusOr<KvLayout> Gqa(int32_t n_layers, int32_t n_kv_heads, int32_t head_dim,
                                      GgmlType elem_type, int32_t block_size = kDefaultBlockSize);
  // MLA (DeepSeek-V2 style). kv_lora_rank = d_c, rope_dim = d_r; both >= 1.
  static absl::StatusOr<KvLayout> Mla(int32_t n_layers, int32_t kv_lora_rank, int32_t rope_dim,
                                      GgmlType elem_type, int32_t block_size = kDefaultBlockSize);

  // This GQA layout split into groups of one attention kind each: sliding[l] != 0 marks layer l
  // as attending to the last `window` positions only. Groups hold min(global, sliding layers)
  // layers each, more where that would make over kMaxGroups groups; the global layers' groups
  // come first. Requires a GQA layout without groups, sliding.size() == n_layers, window >= 1 and
  // at least one layer of each kind.
  absl::StatusOr<KvLayout> WithSlidingGroups(std::span<const uint8_t> sliding,
                                             int32_t window) const;

  KvAttentionKind kind() const { return kind_; }
  int32_t n_layers() const { return n_layers_; }
  // Groups: 1 (every layer in group 0) or more (WithSlidingGroups).
  int32_t n_groups() const {
    return group_sliding_.empty() ? 1 : static_cast<int32_t>(group_sliding_.size());
  }
  int32_t layer_group(int32_t layer) const {
    return layer_group_.empty() ? 0 : layer_group_[static_cast<size_t>(layer)];
  }
  bool group_is_sliding(int32_t group) const {
    return !group_sliding_.empty() && group_sliding_[static_cast<size_t>(group)] != 0;
  }
  int32_t first_sliding_group() const { return first_sliding_group_; }  // n_groups() without
  // Layers whose tiles one block holds: n_layers without groups.
  int32_t layers_per_group() const { return layers_per_group_; }
  int32_t sliding_window() const { return sliding_window_; }  // 0 without sliding groups
  // GQA: KV heads per layer. MLA: 1 (one latent "head").
  int32_t n_kv_heads() const { return n_kv_heads_; }
  // Elements per token row of one tile: GQA head_dim, MLA kv_lora_rank + rope_dim.
  int32_t row_elems() const { return row_elems_; }
  int32_t head_dim() const { return row_elems_; }
  int32_t kv_lora_rank() const { return kv_lora_rank_; }  // 0 for GQA
  int32_t rope_dim() const { return rope_dim_; }          // 0 for GQA
  int32_t block_size() const { return block_size_; }      // token slots per block
  GgmlType elem_type() const { return elem_type_; }
  // MLA: the element type of a row's RoPE part (f16 in a q8_0 cache, elem_type otherwise) and its
  // byte offset in the row (after the latent c).
  GgmlType rope_elem_type() const {
    return elem_type_ == GgmlType::kQ8_0 ? GgmlType::kF16 : elem_type_;
  }
  size_t rope_offset_bytes() const {
    return row_bytes_ -
           static_cast<size_t>(rope_dim_) * (rope_elem_type() == GgmlType::kF32 ? 4 : 2);
  }
  // Tiles per layer: 2 * n_kv_heads (GQA) or 1 (MLA).
  int32_t tiles_per_layer() const { return kind_ == KvAttentionKind::kGqa ? 2 * n_kv_heads_ : 1; }

  size_t row_bytes() const { return row_bytes_; }
  size_t tile_bytes() const { return row_bytes() * static_cast<size_t>(block_size_); }
  // Bytes of one block's tiles (a group's layers), and its stride (rounded up to
  // kBlockAlignment).
  size_t block_data_bytes() const {
    return tile_bytes() * static_cast<size_t>(layers_per_group_) *
           static_cast<size_t>(tiles_per_layer());
  }
  size_t block_bytes() const { return block_bytes_; }
  // K/V bytes one token occupies in every layer: 2·layers·kv_heads·head_dim·bytes (GQA) or
  // layers·(d_c + d_r)·bytes (MLA). Excludes the block padding.
  size_t bytes_per_token() const {
    return row_bytes() * static_cast<size_t>(n_layers_) * static_cast<size_t>(tiles_per_layer());
  }

  // Tiles one block holds: layers_per_group() * tiles_per_layer().
  int32_t tiles_per_block() const { return layers_per_group_ * tiles_per_layer(); }
  // Indices of tiles in a block's tile order (0 .. tiles_per_block()). Preconditions (checked
  // only by assert): GQA layout for Key/Value, MLA layout for Latent, 0 <= layer < n_layers,
  // 0 <= kv_head < n_kv_heads. With sliding groups, Key/Value tiles are those of a block of the
  // layer's group. One layer's K tiles of consecutive kv heads have consecutive indices, and so
  // have its V tiles.
  size_t KeyTileIndex(int32_t layer, int32_t kv_head) const { return TileIndex(layer, 0, kv_head); }
  size_t ValueTileIndex(int32_t layer, int32_t kv_head) const {
    return TileIndex(layer, 1, kv_head);
  }
  size_t LatentTileIndex(int32_t layer) const { return static_cast<size_t>(layer); }

 private:
  KvLayout() = default;
  static absl::StatusOr<KvLayout> Make(KvAttentionKind kind, int32_t n_layers, int32_t n_kv_heads,
                                       int32_t row_elems, int32_t kv_lora_rank, int32_t rope_dim,
                                       GgmlType elem_type, int32_t block_size);
  size_t TileIndex(int32_t layer, int32_t k_or_v, int32_t kv_head) const {
    assert(layer >= 0 && layer < n_layers_ && kv_head >= 0 && kv_head < n_kv_heads_);
    const int32_t in_group =
        layer_group_.empty() ? layer : layer_in_group_[static_cast<size_t>(layer)];
    return (static_cast<size_t>(in_group) * 2 + static_cast<size_t>(k_or_v)) *
               static_cast<size_t>(n_kv_heads_) +
           static_cast<size_t>(kv_head);
  }

  KvAttentionKind kind_ = KvAttentionKind::kGqa;
  int32_t n_layers_ = 0;
  int32_t n_kv_heads_ = 0;
  int32_t row_elems_ = 0;
  int32_t kv_lora_rank_ = 0;
  int32_t rope_dim_ = 0;
  int32_t block_size_ = 0;
  GgmlType elem_type_ = GgmlType::kF32;
  size_t row_bytes_ = 0;
  int32_t layers_per_group_ = 0;
  size_t block_bytes_ = 0;
  // With sliding groups: [n_layers] each layer's group and its index inside it, and [n_groups]
  // whether a group's layers slide; else empty.
  std::vector<uint8_t> layer_group_;
  std::vector<int32_t> layer_in_group_;
  std::vector<uint8_t> group_sliding_;
  int32_t first_sliding_group_ = 1;
  int32_t sliding_window_ = 0;
};

// Element access for the plain KV element types (f32, f16, bf16; not q8_0): element `i` of a row or
// tile starting at `base`. Conversions are exact on load; stores round to nearest even.
inline float LoadKvElement(GgmlType type, const std::byte* base, size_t i) {
  switch (type) {
    case GgmlType::kF16: {
      uint16_t h;
      std::memcpy(&h, base + 2 * i, 2);
      return Fp16ToFp32(h);
    }
    case GgmlType::kBF16: {
      uint16_t b;
      std::memcpy(&b, base + 2 * i, 2);
      return Bf16ToFp32(b);
    }
    default: {
      float f;
      std::memcpy(&f, base + 4 * i, 4);
      return f;
    }
  }
}

inline void StoreKvElement(GgmlType type, std::byte* base, size_t i, float value) {
  switch (type) {
    case GgmlType::kF16: {
      const uint16_t h = Fp32ToFp16(value);
      std::memcpy(base + 2 * i, &h, 2);
      return;
    }
    case GgmlType::kBF16: {
      const uint16_t b = Fp32ToBf16(value);
      std::memcpy(base + 2 * i, &b, 2);
      return;
    }
    default:
      std::memcpy(base + 4 * i, &value, 4);
      return;
  }
}

}  // namespace kiln
