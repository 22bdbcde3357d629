// The weights MLA's absorbed attention (Backend::MlaAttention) needs besides the latent cache.
#pragma once

#include <cstdint>

namespace kiln {

// Per layer, f32, row-major. The cache holds c (kv_lora_rank) and rope(k_r) per token; a head's
// decompressed key is [W_UK_h c | rope(k_r)] and its value W_UV_h c.
struct MlaAttentionWeights {
  const float* w_uk = nullptr;  // [n_heads][nope_dim][kv_lora_rank]
  const float* w_uv = nullptr;  // [n_heads][v_head_dim][kv_lora_rank]
  int32_t kv_lora_rank = 0;
  int32_t nope_dim = 0;
  int32_t v_head_dim = 0;
};

}  // namespace kiln
