// The weights MLA's absorbed attention (Backend::MlaAttention) needs besides the latent cache.
#pragma once

#include <cstdint>

#include "lib/common/ggml_type.h"

namespace kiln {

// Per layer. The cache holds c (kv_lora_rank) and rope(k_r) per token; a head's decompressed key
// is [W_UK_h c | rope(k_r)] and its value W_UV_h c. The weights come as f32 arrays (w_uk, w_uv:
// every backend) or, for a backend whose ReadsMlaWeightRows() is true (the CPU), as the model
// file's own rows (uk_rows, uv_rows; w_uk and w_uv null), which it widens to f32 as it reads
// them: the same values as the f32 arrays (F32, F16, BF16 and Q8_0 widen exactly), a quarter of
// the bytes for Q8_0.
struct MlaAttentionWeights {
  const float* w_uk = nullptr;  // [n_heads][nope_dim][kv_lora_rank], row-major
  const float* w_uv = nullptr;  // [n_heads][v_head_dim][kv_lora_rank], row-major
  int32_t kv_lora_rank = 0;
  int32_t nope_dim = 0;
  int32_t v_head_dim = 0;
  // The file's rows, each of rows_type (F32, F16, BF16 or Q8_0):
  GgmlType rows_type = GgmlType::kF32;
  // uk_transposed false: [n_heads * nope_dim] rows of kv_lora_rank (W_UK_h's rows, as a combined
  // attn_kv_b holds them); true: [n_heads * kv_lora_rank] rows of nope_dim (attn_k_b: W_UK_hᵀ).
  const void* const* uk_rows = nullptr;
  bool uk_transposed = false;
  const void* const* uv_rows = nullptr;  // [n_heads * v_head_dim] rows of kv_lora_rank
};

}  // namespace kiln
