// Hyper-parameters of a model, read from GGUF metadata (keys `<arch>.*`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lib/backend/rope_config.h"
#include "lib/common/status.h"

namespace kiln {
namespace gguf {
class GgufFile;
class GgufWriter;
}  // namespace gguf

// Multi-head Latent Attention (deepseek2): the keys and values of every head are decompressed from
// one latent vector per token (kv_lora_rank elements, RMS-normalized) and share one rotated key
// of rope_dim elements; queries come from n_embd directly or through a low-rank q_lora_rank
// bottleneck. Per head: the query and key are [nope_dim | rope_dim], the value v_head_dim long.
struct MlaHparams {
  int64_t q_lora_rank = 0;  // 0: attn_q [n_embd -> n_head·(nope + rope)], no bottleneck
  int64_t kv_lora_rank = 0;
  int64_t nope_dim = 0;  // the unrotated part of each query/key head
  int64_t rope_dim = 0;  // the rotated part (ModelHparams::rope.n_rot)
  int64_t v_head_dim = 0;
  // attn_k_b [nope -> kv_lora_rank] × n_head and attn_v_b [kv_lora_rank -> v_head_dim] × n_head
  // (files with attention.key_length_mla); false: the older combined attn_kv_b.
  bool split_kv_b = true;
  int64_t n_layer_dense_lead = 0;  // the first layers with a dense feed-forward
  // YaRN's attention-factor multiplier (rope.scaling.yarn_log_multiplier, as the converter
  // writes it: 0.1 × DeepSeek's mscale_all_dim); 0 when absent.
  float yarn_log_mul = 0.0f;
  // The attention scale is attn_mscale² / sqrt(qk_head_dim): 1 without rope scaling, YaRN's
  // magnitude correction with it (llama.cpp's kq_scale for deepseek2; arch/deepseek2.cc).
  float attn_mscale = 1.0f;
  int64_t qk_head_dim() const { return nope_dim + rope_dim; }
};

// Mixture-of-experts feed-forward (deepseek2's layers from leading_dense_block_count on; the
// formulas are in moe_ffn.h). n_expert == 0: no MoE layers.
enum class MoeGating { kSoftmax, kSigmoid };  // expert_gating_func 1, 2
struct MoeHparams {
  int64_t n_expert = 0;         // expert_count
  int64_t n_expert_used = 0;    // expert_used_count: experts per token (top-k)
  int64_t n_expert_shared = 0;  // expert_shared_count: always-on experts (one fused SwiGLU)
  int64_t n_ff_exp = 0;         // expert_feed_forward_length: each expert's hidden size
  MoeGating gating = MoeGating::kSoftmax;
  // expert_group_count / expert_group_used_count: > 1 groups restricts the top-k to the
  // n_group_used groups with the largest sums of their two best (biased) scores.
  int64_t n_group = 0;
  int64_t n_group_used = 0;
  bool weights_norm = false;    // expert_weights_norm: the k weights divided by their sum
  float weights_scale = 1.0f;   // expert_weights_scale (0 in the file means 1)
  bool has_probs_bias = false;  // exp_probs_b.bias: a selection-only bias (DeepSeek-V3)
};

struct ModelHparams {
  std::string arch;  // general.architecture
  std::string name;  // general.name ("" if absent)
  int64_t n_vocab = 0;
  int64_t n_ctx_train = 0;
  int64_t n_embd = 0;
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;  // key/value length per head
  int64_t n_ff = 0;
  float rms_eps = 1e-5f;
  RopeConfig rope;           // freq_factors, when set, point into the model's file
  bool tied_output = false;  // no output.weight: logits use token_embd

  // Sliding-window attention (gemma3): a token at position p of a layer with swa_layers[l] set
  // sees only positions p - sliding_window + 1 .. p (llama.cpp's LLAMA_SWA_TYPE_STANDARD) and
  // rotates with rope_swa; the other layers are global (all positions, `rope`).
  int64_t sliding_window = 0;       // 0: every layer is global
  std::vector<uint8_t> swa_layers;  // [n_layer] when sliding_window > 0, else empty
  RopeConfig rope_swa;

  // Llama-4-style attention temperature (mistral3's attention.temperature_scale): > 0 scales the
  // queries of positions at or past rope.orig_ctx (DecoderGraph::attn_temperature_scale).
  float attn_temperature_scale = 0.0f;

  MlaHparams mla;  // deepseek2 only (kv_lora_rank > 0)
  MoeHparams moe;  // deepseek2 with mixture-of-experts layers (n_expert > 0)

  bool is_swa(int64_t layer) const {
    return sliding_window > 0 && swa_layers[static_cast<size_t>(layer)] != 0;
  }

  int64_t n_gqa() const { return n_head / n_head_kv; }
};

// Reads and validates the hyper-parameters of a decoder-only transformer from the keys
// `<general.architecture>.*` (block_count, embedding_length, attention.head_count, rope.*, ...)
// as llama.cpp's converters write them, rotating with `rope_mode`. Errors name the key.
absl::StatusOr<ModelHparams> ReadDecoderHparams(const gguf::GgufFile& file, RopeMode rope_mode);

// Writes the keys ReadDecoderHparams reads for hp (hp.arch names the prefix): the shape, the
// context, the RMS epsilon, rope.freq_base and rope.dimension_count (random-weight models; no
// rope scaling).
void WriteDecoderHparams(const ModelHparams& hp, gguf::GgufWriter* writer);

}  // namespace kiln
