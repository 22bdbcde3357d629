#include "lib/kv/kv_layout.h"

#include <algorithm>
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
  layout.layers_per_group_ = n_layers;
  layout.block_bytes_ = RoundUpToAlignment(layout.block_data_bytes());
  return layout;
}

absl::StatusOr<KvLayout> KvLayout::WithSlidingGroups(std::span<const uint8_t> sliding,
                                                     int32_t window) const {
  if (kind_ != KvAttentionKind::kGqa || n_groups() != 1) {
    return absl::InvalidArgumentError(
        "KvLayout::WithSlidingGroups: needs a GQA layout without groups");
  }
  if (sliding.size() != static_cast<size_t>(n_layers_) || window < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KvLayout::WithSlidingGroups: ", sliding.size(), " layer flags for ", n_layers_,
        " layers, window ", window, " (needs one flag a layer, window >= 1)"));
  }
  int32_t n_sliding = 0;
  for (uint8_t s : sliding) n_sliding += s != 0 ? 1 : 0;
  const int32_t n_global = n_layers_ - n_sliding;
  if (n_global == 0 || n_sliding == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KvLayout::WithSlidingGroups: ", n_sliding, " of ", n_layers_,
        " layers are sliding; sliding groups need at least one global and one sliding layer"));
  }
  // Equal blocks for every group: as many layers per group as the smaller kind has (no block
  // half empty), widened until the groups fit in kMaxGroups.
  auto groups_of = [](int32_t layers, int32_t per_group) {
    return (layers + per_group - 1) / per_group;
  };
  int32_t per_group = std::min(n_global, n_sliding);
  while (groups_of(n_global, per_group) + groups_of(n_sliding, per_group) > kMaxGroups) {
    ++per_group;
  }
  KvLayout g = *this;
  g.sliding_window_ = window;
  g.layers_per_group_ = per_group;
  g.first_sliding_group_ = groups_of(n_global, per_group);
  g.group_sliding_.assign(static_cast<size_t>(g.first_sliding_group_), 0);
  g.group_sliding_.resize(
      static_cast<size_t>(g.first_sliding_group_ + groups_of(n_sliding, per_group)), 1);
  int32_t seen[2] = {0, 0};  // global, sliding layers so far
  for (uint8_t s : sliding) {
    const int32_t kind = s != 0 ? 1 : 0;
    const int32_t index = seen[kind]++;
    g.layer_group_.push_back(
        static_cast<uint8_t>((kind == 1 ? g.first_sliding_group_ : 0) + index / per_group));
    g.layer_in_group_.push_back(index % per_group);
  }
  g.block_bytes_ = RoundUpToAlignment(g.block_data_bytes());
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
