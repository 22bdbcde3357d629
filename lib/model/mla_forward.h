// The forward pass of Multi-head Latent Attention models (deepseek2; arch/deepseek2.cc has the
// tensors and formulas) on a latent paged cache (KvLayout::Mla: one row [c | rope(kr)] of
// kv_lora_rank + rope_dim elements per token per layer).
//
// Attention runs absorbed for every token: W_UK is folded into each head's query
// (q_abs = W_UKᵀ q_nope, kv_lora_rank long) and W_UV applied to the attention-weighted latent,
// so keys and values are never decompressed:
//   score_j = (q_abs · c_j + q_rope · kr_j) · scale,  out_h = W_UV_h Σ_j softmax(score)_j c_j.
// This equals the decompressed form (k_j = [W_UK c_j | kr_j], v_j = W_UV c_j) up to float
// rounding. The per-head W_UK/W_UV products run in f32 over the dequantized attn_k_b/attn_v_b
// (or attn_kv_b) rows; the projections use the backend's matmuls.
//
// Visibility is the decoder's: causal tokens see cache indices [0, cache_index]; a tree node sees
// its causal root's prefix plus its tree ancestors and itself.
#pragma once

#include <memory>

#include "lib/model/architecture.h"
#include "lib/model/model.h"

namespace kiln {

// Unimplemented for rope scaling other than YaRN. Layers from n_layer_dense_lead on run their
// feed-forward as mixture-of-experts (moe_ffn.h).
absl::StatusOr<std::unique_ptr<ForwardPass>> NewMlaForward(const Model& model, Backend& backend);

}  // namespace kiln
