// The forward pass of Multi-head Latent Attention models (deepseek2; arch/deepseek2.cc has the
// tensors and formulas) on a latent paged cache (KvLayout::Mla: one row [c | rope(kr)] of
// kv_lora_rank + rope_dim elements per token per layer).
//
// Decode steps run absorbed: W_UK is folded into each head's query (q_abs = W_UKᵀ q_nope,
// kv_lora_rank long) and W_UV applied to the attention-weighted latent, so keys and values are
// never decompressed:
//   score_j = (q_abs · c_j + q_rope · kr_j) · scale,  out_h = W_UV_h Σ_j softmax(score)_j c_j.
// With MlaPrefillMode::kMeasured (EngineOptions::mla_prefill; kiln_cache_params.mla_prefill) a long
// prompt chunk runs decompressed instead (ChooseDecompressed: by that sequence's own chunk and
// context sizes, measured): its context's latents are read back, K_nope = C W_UKᵀ and V = C W_UV
// computed by two matmuls over all its rows, then ordinary causal attention
// (Backend::MlaDecompressedAttention). The two forms agree up to float rounding; each is
// batch invariant on its own (a token's bits do not depend on the rest of the batch or the thread
// count), but a token's bits depend on which form its chunk took, so on MLA models a prompt's
// chunking or a prefix-cache hit can change the last bits of its logits once a chunk reaches the
// rule's minimum (docs/numerics.md). The per-head W_UK/W_UV products run in f32 over the
// dequantized attn_k_b/attn_v_b (or attn_kv_b) rows; the projections use the backend's matmuls.
//
// In the llama.cpp order, a file with the combined attn_kv_b runs as llama.cpp runs it: ordinary
// multi-head attention over K = [W_UK_h c | rope(kr)] and V = W_UV_h c, computed per token by one
// matmul with attn_kv_b and cached decompressed (MlaMhaCacheLayout; the engine asks the
// architecture for the layout of its order).
//
// Visibility is the decoder's: causal tokens see cache indices [0, cache_index]; a tree node sees
// its causal root's prefix plus its tree ancestors and itself.
#pragma once

#include <memory>

#include "lib/model/architecture.h"
#include "lib/model/model.h"

namespace kiln {

// MlaPrefillMode (which form a sequence's causal tokens take) is in architecture.h: the engine
// options carry it.

// kMeasured's rule: whether a causal chunk of n_new tokens of one sequence, whose last token sees
// n_ctx cache rows (the chunk's own included), runs decompressed. It depends on that sequence's
// chunk alone, never on the rest of the batch (mla_forward.cc has the measured figures).
bool ChooseDecompressed(const ModelHparams& hp, int64_t n_new, int64_t n_ctx);

// The llama.cpp order's cache for files with the combined attn_kv_b: a GQA layout of n_head KV
// heads of max(qk_head_dim, v_head_dim) elements (K = [k_nope | k_rope], V = v, each zero-padded).
absl::StatusOr<KvLayout> MlaMhaCacheLayout(const ModelHparams& hp, GgmlType kv_type,
                                           int32_t block_size);

// Unimplemented for rope scaling other than YaRN. Layers from n_layer_dense_lead on run their
// feed-forward as mixture-of-experts (moe_ffn.h). The default keeps every bitwise guarantee of
// docs/numerics.md; kMeasured trades the chunking ones for speed on long prompts.
absl::StatusOr<std::unique_ptr<ForwardPass>> NewMlaForward(
    const Model& model, Backend& backend, MlaPrefillMode mode = MlaPrefillMode::kAbsorbed);

}  // namespace kiln
