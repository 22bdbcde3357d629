// The decoder-only transformer most families share (llama, qwen2, gemma3, ...): pre-norm
// blocks of GQA attention (optional Q/K/V/output biases) and a gated feed-forward (SwiGLU or
// GeGLU), RMSNorm, RoPE, a tied or separate output head. Architecture files (arch/<name>.cc)
// describe how their family fills it in (keys, rotation, which biases and extra norms exist,
// DecoderGraph) and reuse this forward pass.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "lib/backend/backend.h"
#include "lib/model/architecture.h"
#include "lib/model/model.h"

namespace kiln {

// Whether a family's tensors include a group of biases.
enum class Presence { kAbsent, kOptional, kRequired };

struct DecoderTensorOptions {
  Presence qkv_bias = Presence::kAbsent;     // attn_q.bias, attn_k.bias, attn_v.bias
  Presence output_bias = Presence::kAbsent;  // attn_output.bias
  bool qk_norm = false;                      // attn_q_norm.weight, attn_k_norm.weight [head_dim]
  bool post_norms = false;  // post_attention_norm.weight, post_ffw_norm.weight [n_embd]
  // attn_qkv.weight [n_embd -> q_dim + 2 kv_dim] (rows: Q, then K, then V) instead of attn_q,
  // attn_k and attn_v (phi3).
  bool fused_qkv = false;
  // ffn_up.weight [n_embd -> 2 n_ff] (rows: gate, then up) and no ffn_gate (phi3).
  bool fused_gate_up = false;
};

// The tensor table of a decoder (names as llama.cpp's converters write them):
//   token_embd.weight [n_embd, n_vocab], output_norm.weight, output.weight (unless tied),
//   blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate, ffn_up,
//   ffn_down}.weight and the biases and norms `options` asks for.
std::vector<TensorSpec> DecoderTensors(const ModelHparams& hp, const DecoderTensorOptions& options);

// How a family's graph departs from the llama block (the defaults are llama's and qwen2's).
enum class FfnActivation {
  kSwiGlu,  // silu(gate) * up
  kGeGlu,   // gelu(gate) * up, GELU's tanh form as ggml tabulates it (Backend::GeGlu)
};
struct DecoderGraph {
  FfnActivation ffn = FfnActivation::kSwiGlu;
  // The gathered embeddings are multiplied by this (gemma: sqrt(n_embd)).
  float embd_scale = 1.0f;
  // > 0: the rotated queries are multiplied by this and attention does not scale again
  // (gemma's query_pre_attn_scalar); 0: attention scales by 1 / sqrt(head_dim).
  float query_scale = 0.0f;
  // Every Q and K head is RMS-normalized (attn_q_norm / attn_k_norm) before RoPE.
  bool qk_norm = false;
  // The attention and feed-forward outputs are RMS-normalized (post_attention_norm /
  // post_ffw_norm) before their residual adds.
  bool post_norms = false;
  // The projections are fused (DecoderTensorOptions::fused_qkv / fused_gate_up): one matmul,
  // whose output rows are then split, as llama.cpp multiplies them.
  bool fused_qkv = false;
  bool fused_gate_up = false;
  // Llama-4-style attention temperature (mistral3's attention.temperature_scale): > 0 multiplies
  // each rotated query at position p by 1 + attn_temperature_scale * log(floor(p /
  // attn_temperature_floor) + 1), which is 1 below the floor.
  float attn_temperature_scale = 0.0f;
  int64_t attn_temperature_floor = 0;
};

// One pre-norm decoder block's tensors (views into a model file or a draft head's file).
struct DecoderLayer {
  const WeightView* attn_norm = nullptr;  // [n_embd] f32
  const WeightView* wq = nullptr;         // [n_embd -> n_head * head_dim], null when fused
  const WeightView* wk = nullptr;         // [n_embd -> n_head_kv * head_dim], null when fused
  const WeightView* wv = nullptr;         // [n_embd -> n_head_kv * head_dim], null when fused
  const WeightView* wqkv = nullptr;       // [n_embd -> q_dim + 2 kv_dim] (DecoderGraph::fused_qkv)
  const WeightView* wo = nullptr;         // [n_head * head_dim -> n_embd]
  const WeightView* bq = nullptr;         // biases, null when the file has none
  const WeightView* bk = nullptr;
  const WeightView* bv = nullptr;
  const WeightView* bo = nullptr;
  const WeightView* ffn_norm = nullptr;  // [n_embd] f32
  const WeightView* ffn_gate = nullptr;  // [n_embd -> n_ff], null when fused into ffn_up
  const WeightView* ffn_up = nullptr;  // [n_embd -> n_ff], or [n_embd -> 2 n_ff] (gate rows first)
  const WeightView* ffn_down = nullptr;  // [n_ff -> n_embd]
  const WeightView* q_norm = nullptr;    // [head_dim] f32, or null (DecoderGraph::qk_norm)
  const WeightView* k_norm = nullptr;
  const WeightView* post_attn_norm = nullptr;  // [n_embd] f32, or null (DecoderGraph::post_norms)
  const WeightView* post_ffn_norm = nullptr;
};

struct DecoderBlockShape {
  int64_t n_embd, n_head, n_head_kv, head_dim, n_ff;
  float rms_eps;
};

// The arithmetic of one decoder block on `backend`, in place on the residual stream
// x: [n, n_embd], with its scratch (grown as needed, reused). The decoder's forward pass runs its
// layers through it, and so does a draft head with a decoder layer of its own (EAGLE).
class DecoderBlock {
 public:
  DecoderBlock(Backend& backend, const DecoderGraph& graph, const DecoderBlockShape& shape)
      : backend_(backend), graph_(graph), shape_(shape) {}

  // x += attention block: norm, Q/K/V (+ q/k norms), rotation (Backend::PrepareRope must have
  // been called for `positions`), the K/V rows written to `slots` of `layer`, attention under
  // `mask`, the output projection (+ post-norm).   slots, positions: [n]
  absl::Status Attention(const DecoderLayer& L, KvCache& cache, int32_t layer,
                         const AttentionMask& mask, std::span<const KvSlot> slots,
                         std::span<const int32_t> positions, float* x, int64_t n);
  // x += feed-forward block over the first `rows` rows of x (norm, gated activation, down
  // projection, post-norm).
  absl::Status FeedForward(const DecoderLayer& L, float* x, int64_t rows);

 private:
  // y = W x (+ bias)                                      x: [n, w.n_in]   y: [n, w.n_out]
  absl::Status Linear(const WeightView& w, const WeightView* bias, const float* x, int64_t n,
                      float* y);

  Backend& backend_;
  const DecoderGraph graph_;
  const DecoderBlockShape shape_;
  std::vector<float> h_, q_, k_, v_, attn_, proj_, gate_, up_;
  std::vector<float> fused_;  // [n, q_dim + 2 kv_dim] or [rows, 2 n_ff]: a fused matmul's output
};

// The cache layout of GQA attention: K and V rows per KV head per layer.
absl::StatusOr<KvLayout> GqaCacheLayout(const ModelHparams& hp, GgmlType kv_type,
                                        int32_t block_size);

// The decoder's forward pass over `model`'s tensors (bound by name at construction; an optional
// bias the file lacks is skipped) on `backend`. Layers the hyper-parameters mark sliding-window
// (ModelHparams::is_swa) attend to their window only and rotate with rope_swa.
//
// Sliding windows are measured in cache slots of the token's causal prefix: a causal token at
// cache index c sees slots max(0, c - window + 1) .. c; a tree node at depth k below its causal
// root (cache index r) sees the root's prefix from max(0, r + k - window + 1) plus its ancestors
// (a tree as deep as the window is an error). So slot i must hold position i + (pos - c), as
// every kiln sequence does.
absl::StatusOr<std::unique_ptr<ForwardPass>> NewDecoderForward(const Model& model, Backend& backend,
                                                               const DecoderGraph& graph = {});

// The Architecture of a family that runs this decoder: a GQA cache and the decoder's forward pass
// with the family's Graph. A family writes its own keys after WriteDecoderHparams's when it has
// more.
class DecoderArchitecture : public Architecture {
 public:
  void WriteHparams(const ModelHparams& hp, gguf::GgufWriter* writer) const override {
    WriteDecoderHparams(hp, writer);
  }
  absl::StatusOr<KvLayout> CacheLayout(const ModelHparams& hp, GgmlType kv_type,
                                       int32_t block_size) const final {
    return GqaCacheLayout(hp, kv_type, block_size);
  }
  absl::StatusOr<std::unique_ptr<ForwardPass>> NewForward(const Model& model,
                                                          Backend& backend) const final {
    return NewDecoderForward(model, backend, Graph(model.hparams()));
  }

 protected:
  // How the family's graph departs from the llama block (none by default).
  virtual DecoderGraph Graph(const ModelHparams& /*hp*/) const { return {}; }
};

}  // namespace kiln
