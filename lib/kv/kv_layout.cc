#include "lib/kv/kv_layout.h"

#include <limits>

namespace kiln {
namespace {

size_t RoundUpToAlignment(size_t bytes) {
  return (bytes + KvLayout::kBlockAlignment - 1) / KvLayout::kBlockAlignment *
         KvLayout::kBlockAlignment;
}

}  // namespace

absl::StatusOr<KvLayout> KvLayout::Make(KvAttentionKind kind, int32_t n_layers, int32_t n_kv_heads,
                                        int32_t row_elems, int32_t kv_lora_rank, int32_t rope_dim,
                                        GgmlType elem_type, int32_t block_size) {
  const char* what = kind == KvAttentionKind::kGqa ? "GQA" : "MLA";
  if (n_layers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvLayout ", what, ": n_layers must be >= 1, got ", n_layers));
  }
  if (n_kv_heads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvLayout ", what, ": n_kv_heads must be >= 1, got ", n_kv_heads));
  }
  if (row_elems < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvLayout ", what,
                     ": row width (head_dim or kv_lora_rank + rope_dim) must "
                     "be >= 1, got ",
                     row_elems));
  }
  if (block_size < 1 || block_size > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvLayout ", what, ": block_size must be in [1, 4096], got ", block_size));
  }
  size_t row_bytes = 0;
  switch (elem_type) {
    case GgmlType::kF32:
      row_bytes = static_cast<size_t>(row_elems) * 4;
      break;
    case GgmlType::kF16:
    case GgmlType::kBF16:
      row_bytes = static_cast<size_t>(row_elems) * 2;
      break;
    case GgmlType::kQ8_0:
      if (kind == KvAttentionKind::kMla) {
        // The latent c as q8_0 blocks, then the RoPE key unquantized (f16).
        if (kv_lora_rank % 32 != 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "KvLayout ", what, ": a q8_0 latent cache needs kv_lora_rank a multiple of 32, got ",
              kv_lora_rank));
        }
        row_bytes = static_cast<size_t>(kv_lora_rank) / 32 * 34 + static_cast<size_t>(rope_dim) * 2;
        break;
      }
      if (row_elems % 32 != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "KvLayout ", what, ": a q8_0 cache needs head_dim a multiple of 32, got ", row_elems));
      }
      row_bytes = static_cast<size_t>(row_elems) / 32 * 34;
      break;
    default:
      return absl::UnimplementedError(absl::StrCat(
          "KvLayout ", what, ": element type ", GgmlTypeName(static_cast<uint32_t>(elem_type)),
          " is not supported for the KV cache (f32, f16, bf16, q8_0 are)"));
  }
  KvLayout layout;
  layout.kind_ = kind;
  layout.n_layers_ = n_layers;
  layout.n_kv_heads_ = n_kv_heads;
  layout.row_elems_ = row_elems;
  layout.kv_lora_rank_ = kv_lora_rank;
  layout.rope_dim_ = rope_dim;
  layout.block_size_ = block_size;
  layout.elem_type_ = elem_type;
  layout.row_bytes_ = row_bytes;
  // Overflow guard: all factors are < 2^31, so the product of the data size is computed in
  // long double first to refuse absurd shapes instead of wrapping.
  const long double data_bytes =
      static_cast<long double>(row_bytes) * block_size * n_layers * layout.tiles_per_layer();
  if (data_bytes > static_cast<long double>(std::numeric_limits<int64_t>::max() / 2)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KvLayout ", what, ": block of ", static_cast<double>(data_bytes), " bytes is too large"));
  }
  layout.group_n_layers_[0] = n_layers;
  layout.block_bytes_[0] = RoundUpToAlignment(layout.block_data_bytes(0));
  return layout;
}

absl::StatusOr<KvLayout> KvLayout::WithSlidingGroup(std::span<const uint8_t> sliding,
                                                    int32_t window) const {
  if (kind_ != KvAttentionKind::kGqa || n_groups() != 1) {
    return absl::InvalidArgumentError(
        "KvLayout::WithSlidingGroup: needs a GQA layout without groups");
  }
  if (sliding.size() != static_cast<size_t>(n_layers_) || window < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvLayout::WithSlidingGroup: ", sliding.size(), " layer flags for ", n_layers_,
                     " layers, window ", window, " (needs one flag a layer, window >= 1)"));
  }
  KvLayout g = *this;
  g.sliding_window_ = window;
  g.group_n_layers_[0] = g.group_n_layers_[1] = 0;
  for (uint8_t s : sliding) {
    const int32_t group = s != 0 ? 1 : 0;
    g.layer_group_.push_back(static_cast<uint8_t>(group));
    g.layer_in_group_.push_back(g.group_n_layers_[group]++);
  }
  if (g.group_n_layers_[0] == 0 || g.group_n_layers_[1] == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KvLayout::WithSlidingGroup: ", g.group_n_layers_[1], " of ", n_layers_,
        " layers are sliding; a sliding group needs at least one global and one sliding layer"));
  }
  for (int32_t group = 0; group < 2; ++group) {
    g.block_bytes_[group] = RoundUpToAlignment(g.block_data_bytes(group));
  }
  return g;
}

KvLayout KvLayout::GroupLayout(int32_t group) const {
  KvLayout g = *this;
  g.n_layers_ = group_n_layers_[group];
  g.group_n_layers_[0] = g.n_layers_;
  g.group_n_layers_[1] = 0;
  g.block_bytes_[0] = block_bytes_[group];
  g.block_bytes_[1] = 0;
  g.layer_group_.clear();
  g.layer_in_group_.clear();
  g.sliding_window_ = 0;
  return g;
}

absl::StatusOr<KvLayout> KvLayout::Gqa(int32_t n_layers, int32_t n_kv_heads, int32_t head_dim,
                                       GgmlType elem_type, int32_t block_size) {
  return Make(KvAttentionKind::kGqa, n_layers, n_kv_heads, head_dim, 0, 0, elem_type, block_size);
}

absl::StatusOr<KvLayout> KvLayout::Mla(int32_t n_layers, int32_t kv_lora_rank, int32_t rope_dim,
                                       GgmlType elem_type, int32_t block_size) {
  if (kv_lora_rank < 1 || rope_dim < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvLayout MLA: kv_lora_rank and rope_dim must be >= 1, got ", kv_lora_rank,
                     " and ", rope_dim));
  }
  if (static_cast<int64_t>(kv_lora_rank) + rope_dim > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError("KvLayout MLA: kv_lora_rank + rope_dim overflows int32");
  }
  return Make(KvAttentionKind::kMla, n_layers, 1, kv_lora_rank + rope_dim, kv_lora_rank, rope_dim,
              elem_type, block_size);
}

}  // namespace kiln
