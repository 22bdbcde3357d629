// The CPU backend's op set for the llama-family forward pass (namespace kiln::cpu).
//
// Activations are f32, row-major, with shapes written next to each parameter. Every op has a
// plain reference in ops_ref.h and a test comparing the two (tests/unit/cpu_ops_test.cc).
//
// Determinism and batch invariance (a hard requirement, relied on by speculative decoding and
// prefix caching): the value computed for one token never depends on how many other tokens are
// in the call, which ones, or the pool's thread count. MatMul computes every output as exactly
// one quant vec_dot of a weight row with that token's quantized activation row; PagedAttention
// runs one (token, kv head) pair on one thread with a fixed order over the context.
//
// Errors: ops with data-dependent indices (token ids, block tables, tree lists) or with shape
// preconditions return absl::Status naming the offending field and index; the simple
// element-wise ops have no failure modes and return void.
//
// `level` selects the SIMD path (clamped to what the CPU supports); tests pass lower levels.
//
// Thread-safety: ops are reentrant; a Scratch must not be shared by concurrent calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "lib/backend/attention_mask.h"
#include "lib/backend/cpu/thread_pool.h"
#include "lib/backend/mla_attention.h"
#include "lib/backend/rope_config.h"
#include "lib/backend/weight_view.h"
#include "lib/common/ggml_type.h"
#include "lib/common/status.h"
#include "lib/quant/quant.h"

namespace kiln::cpu {

// Reusable scratch memory: grows to the largest request and is then reused, so steady-state
// calls do not allocate. One per concurrent caller.
class Scratch {
 public:
  // At least `bytes` bytes, 64-byte aligned; contents undefined. Valid until the next call.
  void* Get(size_t bytes);

 private:
  struct FreeDeleter {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, FreeDeleter> buf_;
  size_t size_ = 0;
};

// One WeightView and one RopeConfig for the model and every backend (lib/backend/).
using kiln::RopeConfig;
using kiln::RopeMode;
using kiln::RopeScaling;
using kiln::WeightView;

// ---- Matrix multiply ----------------------------------------------------------------------

// y[t, o] = sum_i W[o, i] * x[t, i], computed as vec_dot(W row o, quantize(x row t)) (or the
// type's vec_dot_rows / vec_dot_tile, which give the same bits per output while sharing weight
// and activation loads across rows and tokens); quantize is ActivationQuantizer (activation.h).
//   x: [n_tokens, n_in]   y: [n_tokens, n_out]
// Errors: type without kernels at `level`, n_in not a multiple of the block size, null data,
// non-positive sizes. Work is split across output rows (never across the reduction).
absl::Status MatMul(ThreadPool& pool, const WeightView& w, const float* x, int64_t n_tokens,
                    float* y, Scratch& scratch, CpuLevel level = BestCpuLevel());

// Like MatMul for the selected rows of x only (final logits for the tokens that want them):
// y[r, o] = sum_i W[o, i] * x[rows[r], i].   x: [n_x_rows, n_in]   y: [rows.size(), n_out]
// Errors as MatMul, plus a row index outside [0, n_x_rows).
absl::Status MatMulRows(ThreadPool& pool, const WeightView& w, const float* x, int64_t n_x_rows,
                        std::span<const int32_t> rows, float* y, Scratch& scratch,
                        CpuLevel level = BestCpuLevel());

// MatMul's outputs for the weight rows [row_begin, row_end) only, bit for bit MatMul's (every
// output is the same one vec_dot): an output head split into parts over its vocabulary rows.
//   x: [n_tokens, n_in]   y: [n_tokens, n_out], columns [row_begin, row_end) written, the others
//   untouched. row_begin a multiple of kMatMulRowAlign (weight_view.h), row_end too or n_out.
// Errors as MatMul, plus bounds outside [0, n_out], reversed or not aligned (naming them).
absl::Status MatMulRange(ThreadPool& pool, const WeightView& w, const float* x, int64_t n_tokens,
                         int64_t row_begin, int64_t row_end, float* y, Scratch& scratch,
                         CpuLevel level = BestCpuLevel());
// MatMul of one input by several matrices (a layer's Q, K and V; its gate and up): each
// targets[i].y gets MatMul(*targets[i].w, x)'s bits. The input is quantized once for all the
// weights that take the same activation format, and the matrices' rows are split over the pool
// as one job (each thread takes MatMul's share of every matrix), so a decode step waits for the
// pool once instead of once per matrix.   x: [n_tokens, n_in]   targets[i].y: [n_tokens, n_out_i]
// Errors as MatMul, plus a null weight or weights whose n_in differ.
absl::Status MatMulEach(ThreadPool& pool, const float* x, int64_t n_tokens,
                        std::span<const MatMulTarget> targets, Scratch& scratch,
                        CpuLevel level = BestCpuLevel());
// MatMulRange's checks of n_tokens and the row range alone (the CUDA backend's range uses them).
absl::Status CheckMatMulRange(const WeightView& w, int64_t n_tokens, int64_t row_begin,
                              int64_t row_end);

// ---- Embedding ----------------------------------------------------------------------------

// out[t, :] = dequantize(table row tokens[t]).   table: ne {n_embd, n_vocab}; out: [n, n_embd]
// Errors: a token id outside [0, n_vocab) (names the index), unsupported type.
absl::Status EmbeddingGather(const WeightView& table, std::span<const int32_t> tokens, float* out,
                             CpuLevel level = BestCpuLevel());

// ---- Element-wise and row ops -------------------------------------------------------------

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight.   x, y: [n_rows, n]; weight: [n].
// y may alias x.
void RmsNorm(const float* x, const float* weight, int64_t n_rows, int64_t n, float eps, float* y,
             CpuLevel level = BestCpuLevel());

// y = silu(gate) * up, element-wise over n floats. y may alias gate or up.
void SwiGlu(const float* gate, const float* up, int64_t n, float* y,
            CpuLevel level = BestCpuLevel());

// y = gelu(gate) * up, element-wise over n floats, as ggml_vec_geglu_f32 (GGML_GELU_FP16):
//   g <= -10: 0;   g >= 10: g * up;   otherwise: f32(GeluF16Table()[f16 bits of g]) * up,
// the table holding f16(gelu(f32 of each f16)) with gelu(x) = 0.5x(1 + tanh(sqrt(2/pi) x
// (1 + 0.044715 x^2))) in ggml's float steps (GeluF32). y may alias gate or up. The same in
// both numeric orders (every element on its own), and the same bits at every level.
void GeGlu(const float* gate, const float* up, int64_t n, float* y,
           CpuLevel level = BestCpuLevel());
// ggml's float GELU (ggml_gelu_f32), the table's definition:
//   ((0.5f * x) * (1 + tanhf((sqrt(2/pi) * x) * fma(0.044715f * x, x, 1)))),
// with the one FMA GCC contracts in ggml's expression.
float GeluF32(float x);
// The 65536 f16 results by f16 input bits (built once, thread-safe), then one padding entry.
const uint16_t* GeluF16Table();

// x *= s over n floats (ggml_scale).
void Scale(float* x, int64_t n, float s, CpuLevel level = BestCpuLevel());

// y = a + b over n floats (residual add). y may alias a or b.
void Add(const float* a, const float* b, int64_t n, float* y, CpuLevel level = BestCpuLevel());

// x[r, :] = softmax(x[r, :] * scale) for each of n_rows rows of n floats (n >= 1).
void SoftmaxRows(float* x, int64_t n_rows, int64_t n, float scale = 1.0f,
                 CpuLevel level = BestCpuLevel());

// ---- RoPE ---------------------------------------------------------------------------------
//
// Formulas (ggml's rope_ext, with YaRN from Peng et al. 2023 and llama 3.1's frequency rule).
// For rotated pair index i in [0, n_rot/2) of a token at position p:
//   theta_extrap = p * freq_base^(-2i / n_rot) / ff[i]      ff = per-dimension factors or 1
//   theta_interp = freq_scale * theta_extrap
//   YaRN (ext_factor != 0):
//     corr_dim(b) = n_rot * ln(orig_ctx / (b * 2 pi)) / (2 ln(freq_base))
//     low = max(0, floor(corr_dim(beta_fast))), high = min(n_rot - 1, ceil(corr_dim(beta_slow)))
//     ramp = (1 - clamp((i - low) / max(0.001, high - low), 0, 1)) * ext_factor
//     theta = theta_interp * (1 - ramp) + theta_extrap * ramp
//     mscale = attn_factor * (1 + 0.1 ln(1 / freq_scale))
//   otherwise: theta = theta_interp, mscale = attn_factor
//   ext_factor and attn_factor apply to kYarn only (other modes use 0 and 1); freq_scale is 1
//   for kNone and kLlama3.
//   (x_a, x_b) <- (x_a cos(theta) - x_b sin(theta), x_a sin(theta) + x_b cos(theta)) * mscale
//     NORM (llama):  a = 2i, b = 2i + 1        NEOX: a = i, b = i + n_rot/2
//   Dimensions >= n_rot are left unchanged.
// llama3 rule (used when scaling == kLlama3 and no rope_freqs tensor is given), with
//   wavelen = 2 pi / base^(-2i/n_rot), lo_wl = orig_ctx / low_freq_factor,
//   hi_wl = orig_ctx / high_freq_factor:
//   ff[i] = 1 if wavelen < hi_wl; = factor if wavelen > lo_wl; otherwise
//   smooth = (orig_ctx / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor),
//   ff[i] = 1 / ((1 - smooth) / factor + smooth).
// The angles and rotations use ggml's float arithmetic step for step (theta_scale =
// powf(base, -2 / n_rot) multiplied up in float, cosf / sinf, FMAs where GCC contracts ggml's
// expressions), so the rotated values equal llama.cpp's bit for bit.

// Checks a config against head_dim (n_rot even, in range; finite positive base and scales).
absl::Status ValidateRopeConfig(const RopeConfig& config, int32_t head_dim);

// cos/sin of every rotated pair for each token of a batch; build once per batch, apply to Q and
// K of every layer. Not thread-safe to Build while another thread Applies.
class RopeTable {
 public:
  // positions: [n_tokens]. Errors: ValidateRopeConfig, negative position (names the index).
  absl::Status Build(const RopeConfig& config, int32_t head_dim,
                     std::span<const int32_t> positions);

  // x: [n_tokens, n_heads, head_dim] rotated in place (n_tokens as built).
  // Precondition: head_dim as built.
  void Apply(float* x, int64_t n_heads, CpuLevel level = BestCpuLevel()) const;

  int64_t n_tokens() const { return n_tokens_; }
  // The built table, for a device backend that rotates with the same angles: n_tokens * n_rot/2
  // cosines and sines, token-major.
  RopeMode mode() const { return mode_; }
  int32_t n_rot() const { return n_rot_; }
  int32_t head_dim() const { return head_dim_; }
  std::span<const float> cos_table() const { return cos_; }
  std::span<const float> sin_table() const { return sin_; }

 private:
  RopeMode mode_ = RopeMode::kNorm;
  int32_t n_rot_ = 0;
  int32_t head_dim_ = 0;
  int64_t n_tokens_ = 0;
  // cos_ = {c0, c1, ..}, sin_ = {s0, s1, ..}: n_rot / 2 per token (mscale folded in).
  std::vector<float> cos_, sin_;
};

// The per-pair factors ff[i] (n_rot/2) the config implies: freq_factors if given, the llama3
// rule for kLlama3, ones otherwise.
std::vector<double> RopeFreqFactors(const RopeConfig& config);

// ---- Paged attention ----------------------------------------------------------------------

// Where one of K or V lives for one layer. Physical block b's tile of kv head h is a row-major
// [block_size, head_dim] array of `type` (F32, F16, BF16, or Q8_0: each row head_dim / 32 blocks
// of ggml's block_q8_0, head_dim % 32 == 0) at
//   base + b * block_stride_bytes + h * head_stride_bytes.
struct KvTensorView {
  const void* base = nullptr;
  GgmlType type = GgmlType::kF32;
  int64_t block_stride_bytes = 0;
  int64_t head_stride_bytes = 0;
};

struct PagedKvView {
  KvTensorView k, v;
  int32_t block_size = 16;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t n_blocks = 0;  // physical blocks addressable from base (for index validation)
};

// What each query token sees. Token t belongs to sequence seq[t], whose logical context
// position j lives in physical block kv_indices[kv_indptr[seq[t]] + j / block_size] at row
// j % block_size. Token t attends to positions [f, n_visible[t]), f = first_visible[t] (0 when
// first_visible is empty), and, when extra_indptr is given, to
// extra_positions[extra_indptr[t] .. extra_indptr[t+1]) (strictly increasing, each
// >= n_visible[t]). Masks:
//   causal:  n_visible[t] = position of t + 1, no extras;
//   sliding window w: as causal with first_visible[t] = max(0, n_visible[t] - w);
//   tree:    n_visible[t] = committed prefix length, extras = the cache slots of t's ancestors
//            and of t itself (BuildTreeVisibility makes them from parent links).
// The K/V of the batch's own tokens must be in the cache before the call.
struct AttentionBatch {
  std::span<const int32_t> seq;                 // [n_tokens]
  std::span<const int32_t> kv_indptr;           // [n_seqs + 1], non-decreasing
  std::span<const int32_t> kv_indices;          // [kv_indptr[n_seqs]] physical block ids
  std::span<const int32_t> n_visible;           // [n_tokens]
  std::span<const int32_t> extra_indptr;        // [n_tokens + 1] or empty
  std::span<const int32_t> extra_positions;     // [extra_indptr[n_tokens]]
  std::span<const int32_t> first_visible = {};  // [n_tokens] or empty (all 0)
};

// out[t, h, :] = softmax(q[t, h, :] . K[j, h/G, :] * scale over visible j) . V[j, h/G, :]
//   q, out: [n_tokens, n_heads, head_dim], G = n_heads / n_kv_heads (GQA; 1 = MHA; n_heads = MQA)
// scale <= 0 means 1/sqrt(head_dim). Softmax as ggml's non-flash attention (soft_max_ext;
// op_kernels.h), with the visible rows numbered f, f + 1, ... in order (prefix, then extras) as
// ggml numbers a causal sequence's cache cells (f = first_visible[t]; ggml masks the cells
// before its window and keeps their numbers), so a tree node's
// output equals, bit for bit, that of the same tokens laid out as a causal chain. In the
// llama.cpp orders with an f16 cache, q and the softmax weights are rounded to f16 before their
// products (ggml's f16 path); kiln's order keeps them in f32. Tasks: in kiln's order, a chunk
// of up to 8 tokens of one sequence x a kv head (the rows all of the chunk's tokens see are
// handled in one call for the chunk's G x tokens heads), and a lone decode token with fewer kv
// heads than threads and at least 256 rows split by rows, then by columns; in the llama.cpp
// orders, a (token, kv head) pair (each K/V row read for the G query heads of its group). Errors:
// any index or count out of range (names field and index), a token that sees nothing, n_heads not a
// multiple of n_kv_heads, head_dim > 1024, KV type not F32/F16/BF16/Q8_0, a Q8_0 cache with
// head_dim not a multiple of 32. Q8_0 rows are read as the exact f32 values they hold (f16 scale x
// int8) and then follow the f32 path of each order; q stays f32 (llama.cpp's q8_0 cache needs its
// flash attention, which quantizes q to Q8_0 and runs an online softmax: not reproduced here, so
// the llama.cpp orders with a Q8_0 cache are not llama.cpp's bits). K . q and V . P have three
// orders:
//   kBatchInvariant (default): K . q in 16 lanes per (row, head), 16 rows' lanes summed at once
//     (kv_scores_rows); V . P as one FMA chain per output element over the visible rows in
//     index order (kv_accumulate_rows). The same for every token whatever its batch (each
//     score and chain is computed as for the token alone, whichever rows its chunk shares).
//   kLlamaCppDecode: ggml's: K . q as ggml_vec_dot_f16 / _f32, V . P in ggml_vec_dot_f32's 64
//     lanes, llama.cpp's order for a one-token batch.
//   kLlamaCppPrompt: tinyBLAS's 16 lanes, llama.cpp's order for a batch of two or more tokens
//     (and, for an f16 cache, tinyBLAS's 16-lane K . q too).
// The llama.cpp orders reproduce its bits (EngineOptions::llama_cpp_order).
enum class AttentionOrder { kBatchInvariant, kLlamaCppDecode, kLlamaCppPrompt };

// PagedAttention's argument checks alone (every error listed above, the same messages), for a
// backend that runs the attention elsewhere: the CUDA backend checks a batch on the host before
// its kernels read the device's copy of the same tables.
absl::Status ValidateAttentionBatch(const PagedKvView& kv, const AttentionBatch& b,
                                    int32_t n_heads);

absl::Status PagedAttention(ThreadPool& pool, const PagedKvView& kv, const AttentionBatch& batch,
                            const float* q, int32_t n_heads, float* out, float scale,
                            Scratch& scratch,
                            AttentionOrder order = AttentionOrder::kBatchInvariant,
                            CpuLevel level = BestCpuLevel());

// MLA's absorbed attention over a latent cache (Backend::MlaAttention). `kv` views the latent
// rows [c | rope(k_r)] (head_dim = kv_lora_rank + rope_dim) as one kv head with k = v; the batch
// is PagedAttention's (causal, sliding window, tree). Per token t and head h:
//   q_abs = [W_UK_hᵀ q[t, h, :nope_dim] | q[t, h, nope_dim:]]       (kv_accumulate_rows over
//   W_UK_h) p_j   = softmax_j(q_abs . row_j * scale)                          (kv_scores_rows,
//   softmax_exp) o     = Σ_j p_j c_j (kv_accumulate_rows) out[t, h, e] = W_UV_h[e, :] . o
//   (kv_scores_rows over W_UV_h) q: [n_tokens, n_heads, nope_dim + rope_dim]   out: [n_tokens,
//   n_heads, v_head_dim]
// scale <= 0: 1 / sqrt(nope_dim + rope_dim). Every value is one fixed chain per (token, head),
// so the result is the same for any batch, head grouping and thread count; tasks are (token,
// group of heads), the groups sized so that a one-token decode still fills the pool. A latent
// row is widened once per task for all the group's heads. Latent types: f32, f16, bf16, and
// q8_0 (KvLayout's q8_0 latent row: c as block_q8_0, then the RoPE part in f16; kv_lora_rank a
// multiple of 32): its score is (q_c . c) + (q_r . rope), each part through kv_scores_rows.
// Errors: PagedAttention's, plus weights missing or shapes that do not fit the rows.
absl::Status MlaPagedAttention(ThreadPool& pool, const PagedKvView& kv, const AttentionBatch& batch,
                               const MlaAttentionWeights& w, const float* q, int32_t n_heads,
                               float* out, float scale, Scratch& scratch,
                               CpuLevel level = BestCpuLevel());

// MLA's attention over the latent rows as llama.cpp's deepseek2 graph computes it (its absorbed
// form, flash attention off; Backend::MlaLatentAttention): the latent rows [c | rope(k_r)]
// (`kv` as for MlaPagedAttention; head_dim = kv_lora_rank + rope_dim) are one K head shared by
// every query head, and their first kv_lora_rank elements are V:
//   out[t, h, :] = softmax_j(q[t, h, :] . row_j * scale) . row_j[:kv_lora_rank]
//   q: [n_tokens, n_heads, head_dim] (the absorbed query W_UK_hᵀ q_nope, then rope(q_r))
//   out: [n_tokens, n_heads, kv_lora_rank] (the caller applies W_UV)
// Only the llama.cpp orders (PagedAttention's, with its GQA rules), f32, f16 or bf16 latents.
// scale <= 0: 1 / sqrt(head_dim). Errors: PagedAttention's, kBatchInvariant, a q8_0 latent
// (Unimplemented), kv_lora_rank outside [1, head_dim].
absl::Status MlaLatentAttentionLlamaCpp(ThreadPool& pool, const PagedKvView& kv,
                                        const AttentionBatch& batch, const float* q,
                                        int32_t n_heads, int32_t kv_lora_rank, float* out,
                                        float scale, Scratch& scratch, AttentionOrder order,
                                        CpuLevel level = BestCpuLevel());

// MLA's decompressed attention (Backend::MlaDecompressedAttention): one sequence's tokens over
// keys [k_nope[j, h, :] | k_rope[j, :]] and values v[j, h, :] in f32, rows [0, n_visible[t]).
struct MlaDecompressedKv {
  const float* k_nope = nullptr;  // [n_ctx, n_heads, nope_dim]
  const float* k_rope = nullptr;  // [n_ctx, rope_dim] (null when rope_dim is 0)
  const float* v = nullptr;       // [n_ctx, n_heads, v_dim]
  int64_t n_ctx = 0;
  int32_t n_heads = 0;
  int32_t nope_dim = 0;
  int32_t rope_dim = 0;
  int32_t v_dim = 0;
};

// Per token t and head h, in kiln's batch-invariant kernels:
//   s_j = (q_nope . k_nope[j, h]) + (q_rope . k_rope[j])        (kv_scores_rows, each part)
//   p   = softmax_j(s_j * scale) over j < n_visible[t]            (as MlaPagedAttention)
//   out[t, h, :] = Σ_j p_j v[j, h, :]                              (kv_accumulate_rows)
//   q: [n_tokens, n_heads, nope_dim + rope_dim]   out: [n_tokens, n_heads, v_dim]
// Each value is one fixed chain per (token, head), so a token's output is the same in any
// call and on any thread count. Tasks: (head, block of up to 8 tokens); a block scores the rows
// any of its tokens sees once and accumulates the rows all of them see in one call.
// scale <= 0: 1 / sqrt(nope_dim + rope_dim). Errors: null pointers, non-positive sizes, a
// negative rope_dim, n_visible[t] outside [1, n_ctx] (naming t).
absl::Status MlaDecompressedAttention(ThreadPool& pool, const MlaDecompressedKv& kv, const float* q,
                                      std::span<const int32_t> n_visible, float* out, float scale,
                                      Scratch& scratch, CpuLevel level = BestCpuLevel());

// The tree-visibility builder (lib/backend/attention_mask.h).
using kiln::BuildTreeVisibility;

}  // namespace kiln::cpu
