// Plain reference versions of the CPU ops (ops.h): straightforward loops in double, written
// independently of the fast paths (no kernel tables, no tiling, no paging). Tests compare the
// fast ops against these; they are slow and single-threaded.
#pragma once

#include <cstdint>
#include <span>

#include "lib/backend/cpu/ops.h"

namespace kiln::cpu::ref {

// y[t, o] = sum_i dequant(W)[o, i] * a[t, i] in double, where a is x after a round trip
// through the weight's activation type when `quantize_activations` (so it matches what the
// fast path multiplies), or x itself otherwise.   x: [n_tokens, n_in]   y: [n_tokens, n_out]
absl::Status MatMul(const WeightView& w, const float* x, int64_t n_tokens, float* y,
                    bool quantize_activations);

// out[t, :] = dequantize(table row tokens[t]) with the scalar kernels.
absl::Status EmbeddingGather(const WeightView& table, std::span<const int32_t> tokens, float* out);

void RmsNorm(const float* x, const float* weight, int64_t n_rows, int64_t n, float eps, float* y);
void SwiGlu(const float* gate, const float* up, int64_t n, float* y);
// gelu(gate) * up with GELU's tanh form in double (no f16 table).
void GeGlu(const float* gate, const float* up, int64_t n, float* y);
void Add(const float* a, const float* b, int64_t n, float* y);
void SoftmaxRows(float* x, int64_t n_rows, int64_t n, float scale);

// x: [n_tokens, n_heads, head_dim] rotated in place, each angle evaluated from the formulas in
// ops.h in double (no tables).
absl::Status Rope(const RopeConfig& config, int32_t head_dim, std::span<const int32_t> positions,
                  int64_t n_heads, float* x);

// Attention of one token over a contiguous (unpaged) f32 cache of one sequence.
//   q: [n_heads, d]   k, v: [n_ctx, n_kv_heads, d]   out: [n_heads, d]
// The token sees the context positions listed in `visible` (any order). Softmax in double.
// round_to_f16: the f16-cache rule of ops.h (q and the softmax weights rounded to f16).
void Attention(const float* q, int32_t n_heads, int32_t n_kv_heads, int32_t d, const float* k,
               const float* v, std::span<const int32_t> visible, float scale, float* out,
               bool round_to_f16 = false);

// MLA attention of one token over a contiguous (unpaged) f32 latent cache of one sequence, in the
// decompressed form (no absorption), in double: head h's keys [W_UK_h c_j | r_j] and values
// W_UV_h c_j are built for every visible row, then plain softmax attention.
//   q: [n_heads, nope_dim + rope_dim]   latent: [n_ctx, kv_lora_rank + rope_dim] rows [c_j | r_j]
//   out: [n_heads, v_head_dim]
void MlaAttention(const float* q, int32_t n_heads, const MlaAttentionWeights& w, int32_t rope_dim,
                  const float* latent, std::span<const int32_t> visible, float scale, float* out);

}  // namespace kiln::cpu::ref
