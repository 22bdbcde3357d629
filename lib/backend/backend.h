// Backend: the op set a model's forward pass runs on, plus the memory it needs (prepared weights,
// K/V storage). Model code (lib/model/arch/, lib/model/decoder.cc) and the speculative commit
// call only this interface; the CPU backend (cpu/cpu_backend.h) implements it, the CUDA module
// will (cuda_loader.h finds it today; BackendInfo reports it).
//
// Shapes are row-major f32 activations unless said otherwise. Every op returns a status naming
// the bad field; none aborts.
//
// Numeric order: kiln's own (batch invariant: a token's outputs never depend on the rest of its
// batch or on the thread count) by default, or llama.cpp's (set_llama_cpp_order: its arithmetic
// bit for bit, batch-dependent like llama.cpp itself); see docs/numerics.md.
//
// Thread-safety: one backend instance serves one engine; calls are serialized by the engine.
// PrepareWeights is const and may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "lib/backend/attention_mask.h"
#include "lib/backend/mla_attention.h"
#include "lib/backend/rope_config.h"
#include "lib/backend/weight_view.h"
#include "lib/common/status.h"
#include "lib/kv/kv_cache.h"

namespace kiln {

// Memory a backend keeps for a model's weights (the CPU's row-interleaved copies; a device's
// uploaded copies). Owned by the Model, so every engine on that model shares it.
class WeightStore {
 public:
  virtual ~WeightStore() = default;
  virtual size_t bytes() const = 0;
  // Returns once every prepared form is complete: a backend may finish them in the background
  // after PrepareWeights returns (the CPU's copies, read in place meanwhile).
  virtual void WaitUntilPrepared() const {}
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu (avx512, 2 threads)", for logs and `kiln info`.
  virtual std::string Describe() const = 0;

  // Prepares `matrices` for this backend's matmul kernels (sets WeightView::interleaved where the
  // backend has a prepared form) and returns the memory holding them. When release_file_pages,
  // the mapped file's pages of prepared matrices may be dropped from memory (re-read on demand).
  virtual absl::StatusOr<std::unique_ptr<WeightStore>> PrepareWeights(
      std::span<WeightView* const> matrices, bool release_file_pages) const = 0;

  // Storage for a cache of n_blocks blocks of `layout` (KvCacheOptions::storage).
  virtual absl::StatusOr<std::unique_ptr<KvStorage>> NewKvStorage(const KvLayout& layout,
                                                                  int32_t n_blocks) = 0;

  virtual void set_llama_cpp_order(bool on) = 0;
  virtual bool llama_cpp_order() const = 0;
  virtual int n_threads() const = 0;

  // ---- ops -----------------------------------------------------------------------------------
  // y[t, o] = W[o, :] . x[t, :]             x: [n_tokens, w.n_in]   y: [n_tokens, w.n_out]
  virtual absl::Status MatMul(const WeightView& w, const float* x, int64_t n_tokens, float* y) = 0;
  // MatMul of one input by several matrices (a layer's Q, K and V; its gate and up):
  // targets[i].y gets MatMul(*targets[i].w, x)'s bits; every weight takes n_in inputs. A backend
  // may prepare the input once and run the matrices as one job; this default runs MatMul on each.
  virtual absl::Status MatMulEach(const float* x, int64_t n_tokens,
                                  std::span<const MatMulTarget> targets) {
    KILN_RETURN_IF_ERROR(CheckMatMulTargets(targets));
    for (const MatMulTarget& t : targets) KILN_RETURN_IF_ERROR(MatMul(*t.w, x, n_tokens, t.y));
    return absl::OkStatus();
  }
  // MatMul with expert `expert` of a stack of n_expert matrices (a 3-D GGUF tensor bound with
  // w.n_out = n_expert · rows): y[t, o] = W[expert · rows + o, :] . x[t, :], the other experts'
  // rows never read.                 x: [n_tokens, w.n_in]   y: [n_tokens, rows]
  virtual absl::Status ExpertMatMul(const WeightView& w, int64_t n_expert, int64_t expert,
                                    const float* x, int64_t n_tokens, float* y) = 0;
  // MatMul's outputs o in [row_begin, row_end) only, bit for bit MatMul's; y's other columns
  // are left as they were (an output head computed in parts of its vocabulary).
  //   x: [n_tokens, w.n_in]   y: [n_tokens, w.n_out]
  // row_begin is a multiple of kMatMulRowAlign, row_end too or w.n_out (else InvalidArgument;
  // outside [0, w.n_out] or reversed: OutOfRange). The llama.cpp order multiplies whole
  // matrices only (FailedPrecondition for a part): its arithmetic depends on the row count.
  virtual absl::Status MatMulRange(const WeightView& w, const float* x, int64_t n_tokens,
                                   int64_t row_begin, int64_t row_end, float* y) = 0;
  // out[t, :] = row tokens[t] of table.      out: [tokens.size(), table.n_in]
  virtual absl::Status EmbeddingGather(const WeightView& table, std::span<const int32_t> tokens,
                                       float* out) = 0;
  // y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight.   x, y: [n_rows, n] (may alias)
  virtual void RmsNorm(const float* x, const float* weight, int64_t n_rows, int64_t n, float eps,
                       float* y) = 0;
  // y = a + b over n floats (may alias).
  virtual void Add(const float* a, const float* b, int64_t n, float* y) = 0;
  // x[r, :] += bias for each of n_rows rows of n floats.
  virtual void AddRowBias(float* x, const float* bias, int64_t n_rows, int64_t n) = 0;
  // y = silu(gate) * up over n floats (y may alias either).
  virtual void SwiGlu(const float* gate, const float* up, int64_t n, float* y) = 0;
  // y = gelu(gate) * up over n floats (y may alias either), GELU's tanh form as ggml evaluates
  // it (through its f16 table; cpu::GeGlu has the rule).
  virtual void GeGlu(const float* gate, const float* up, int64_t n, float* y) = 0;
  // x *= s over n floats.
  virtual void Scale(float* x, int64_t n, float s) = 0;
  // Prepares the rotation of a batch (positions: [n_tokens]); RotateRope then rotates
  // x: [n_tokens, n_heads, head_dim] in place.
  virtual absl::Status PrepareRope(const RopeConfig& config, int32_t head_dim,
                                   std::span<const int32_t> positions) = 0;
  virtual void RotateRope(float* x, int64_t n_heads) = 0;

  // Writes the K and V rows of each token into its slot of `layer` (in the cache's element type).
  //   k, v: [slots.size(), n_kv_heads, head_dim]
  virtual absl::Status WriteKv(KvCache& cache, int32_t layer, std::span<const KvSlot> slots,
                               const float* k, const float* v) = 0;
  // out[t, h, :] = softmax(q[t, h, :] . K[j, h / G, :] * scale over visible j) . V[j, h / G, :]
  //   q, out: [n_tokens, n_heads, head_dim]; scale <= 0: 1 / sqrt(head_dim)
  virtual absl::Status Attention(const KvCache& cache, int32_t layer, const AttentionMask& mask,
                                 const float* q, int32_t n_heads, float* out, float scale) = 0;
  // Writes each token's latent row [c | rope(k_r)] into its slot of `layer` of an MLA cache (the
  // cache's element type; a q8_0 cache quantizes c and keeps rope(k_r) in f16).
  //   latent: [slots.size(), kv_lora_rank + rope_dim]
  virtual absl::Status WriteLatent(KvCache& cache, int32_t layer, std::span<const KvSlot> slots,
                                   const float* latent) = 0;
  // MLA (multi-head latent attention) over an MLA cache's latent rows [c | rope(k_r)] of `layer`,
  // absorbed: per head q_abs = [W_UK_hᵀ q_nope | q_rope], p = softmax(q_abs . row_j * scale over
  // visible j), out = W_UV_h (Σ_j p_j c_j).
  //   q: [n_tokens, n_heads, nope_dim + rope_dim] (rope part rotated)   out: [n_tokens, n_heads,
  //   v_head_dim]; scale <= 0: 1 / sqrt(nope_dim + rope_dim). The batch's latent rows must be in
  //   the cache before the call. Batch invariant in either numeric order (the llama.cpp order uses
  //   MlaLatentAttention).
  virtual absl::Status MlaAttention(const KvCache& cache, int32_t layer, const AttentionMask& mask,
                                    const float* q, int32_t n_heads, const MlaAttentionWeights& w,
                                    float* out, float scale) = 0;
  // Whether MlaAttention reads the weights as the file's rows (MlaAttentionWeights::uk_rows,
  // uv_rows) instead of f32 arrays, so a forward pass need not keep f32 copies of them.
  virtual bool ReadsMlaWeightRows() const { return false; }
  // MLA in the llama.cpp order, as llama.cpp's deepseek2 graph computes it: the caller absorbs
  // the query (q_abs = [W_UK_hᵀ q_nope | rope(q_r)], its own matmul) and applies W_UV to the
  // result; this is the attention between, the latent rows as one K head shared by all heads
  // whose first kv_lora_rank elements are V:
  //   out[t, h, :] = softmax_j(q_abs[t, h, :] . row_j * scale) . c_j
  //   q_abs: [n_tokens, n_heads, kv_lora_rank + rope_dim]   out: [n_tokens, n_heads, kv_lora_rank]
  // Only while llama_cpp_order() is on (FailedPrecondition otherwise); not on a q8_0 latent cache.
  virtual absl::Status MlaLatentAttention(const KvCache& cache, int32_t layer,
                                          const AttentionMask& mask, const float* q_abs,
                                          int32_t n_heads, float* out, float scale) = 0;
  // Reads back the latent rows of `slots` of `layer` as f32: c (the first kv_lora_rank elements)
  // and rope(k_r), exactly the values MlaAttention reads (a q8_0 c as scale x int8).
  //   c: [slots.size(), kv_lora_rank]   k_rope: [slots.size(), rope_dim]
  virtual absl::Status ReadLatent(const KvCache& cache, int32_t layer,
                                  std::span<const KvSlot> slots, float* c, float* k_rope) = 0;
  // Ordinary causal attention of one sequence's tokens over its decompressed MLA keys and values
  // (MLA's prefill form; MlaAttention is the absorbed one). Context row j of head h has the key
  // [k_nope[j, h, :] | k_rope[j, :]] (the RoPE key shared by the heads) and the value v[j, h, :];
  // token t sees rows [0, n_visible[t]):
  //   out[t, h, :] = softmax_j(q[t, h, :] . key_j,h * scale) . v[j, h, :]
  //   q: [n_tokens, n_heads, nope_dim + rope_dim] (rope part rotated)
  //   k_nope: [n_ctx, n_heads, nope_dim]   k_rope: [n_ctx, rope_dim]   v: [n_ctx, n_heads, v_dim]
  //   n_visible: [n_tokens], each in [1, n_ctx]   out: [n_tokens, n_heads, v_dim]
  // Every output is one fixed chain per (token, head): a token's result does not depend on the
  // other tokens of the call or the thread count. scale <= 0: 1 / sqrt(nope_dim + rope_dim).
  virtual absl::Status MlaDecompressedAttention(const float* q, std::span<const int32_t> n_visible,
                                                const float* k_nope, const float* k_rope,
                                                const float* v, int64_t n_ctx, int32_t n_heads,
                                                int32_t nope_dim, int32_t rope_dim, int32_t v_dim,
                                                float* out, float scale) = 0;
  // Copies every layer's K/V rows of slot `from` into slot `to` (speculative commits).
  virtual void CopyKvSlot(KvCache& cache, KvSlot from, KvSlot to) = 0;
};

// The backends this process can use, for `kiln info` and logs: "cpu: avx512 (...)", and the CUDA
// device or why there is none.
std::string DescribeBackends();

}  // namespace kiln
