// Random-weight GGUF models of named shapes, for any registered architecture (the engine behind
// tools/kiln-mkmodel, and test fixtures). What depends on the family comes from its
// Architecture (lib/model/architecture.h), so a file loads exactly as the loader expects it:
//   - the `<arch>.*` hyper-parameter keys: Architecture::WriteHparams;
//   - the tensors, names, shapes and file order: Architecture::Tensors (optional tensors such as
//     llama's biases are not written; tensors the family requires, such as qwen2's Q/K/V
//     biases, are). Values, drawn in table order:
//       embeddings and matrices  N(0,1)/sqrt(fan_in) (ne[0] = row length = fan-in), in the
//                                chosen type;
//       vectors named *.bias     0.5·N(0,1), f32 (large enough that a bias dropped or added in
//                                the wrong place changes the greedy tokens);
//       other vectors (norms)    1 + 0.02·N(0,1), f32.
// The generator itself writes general.* (architecture, type, name, file_type,
// quantization_version) and the tokenizer.
// A matrix whose row length is not a multiple of the type's block size falls back to q8_0 (or
// f16 when q8_0 does not fit either), as llama-quantize does; each fallback is reported through
// the `note` callback.
//
// Shapes (RandomModelShapeNames):
//   tiny-llama-gqa|mha|mqa: llama, n_embd 256, n_ff 512, 4 heads × 64, kv heads 2|4|1, 2 layers,
//                           context 512, rope base 1e4, untied output.weight, self-made vocab;
//   smollm2-135m:           llama, 576/1536/9 heads/3 kv/30 layers/ctx 8192/vocab 49152, rope
//                           1e5, tied (no output.weight), like SmolLM2-135M-Instruct;
//   tiny-qwen2:             qwen2 (Q/K/V biases, NEOX RoPE), n_embd 256, n_ff 512, 4 heads × 64,
//                           2 kv heads, 2 layers, context 512, rope base 1e6, rms eps 1e-6, tied
//                           output like the small Qwen2 models, self-made vocab;
//   tiny-qwen2-untied:      tiny-qwen2 with its own output.weight;
//   tiny-qwen3:             qwen3 (Q/K norms, NEOX RoPE), n_embd 256, n_ff 512, 4 heads × 128
//                           (head_dim larger than n_embd / n_head, as in Qwen3), 2 kv heads, 2
//                           layers, context 512, rope base 1e6, rms eps 1e-6, tied output;
//   tiny-llama3:            llama with Llama 3.1's RoPE scaling (rope_freqs.weight from factor 8,
//                           low/high frequency factors 1/4, original context 8192; rope base
//                           5e5) and pre-tokenizer "llama-bpe" with a BOS token, n_embd 256, n_ff
//                           512, 4 heads × 64, 2 kv heads, 2 layers, context 512, untied;
//   tiny-phi:               phi3 (fused attn_qkv, fused gate+up ffn_up, NEOX RoPE, queries
//                           scaled before attention), n_embd 256, n_ff 512, 4 heads × 64, 2 kv
//                           heads, 2 layers, context 512, untied, and an
//                           attention.sliding_window of 16 that llama.cpp ignores for phi3
//                           (not "tiny-phi3": llama.cpp gives a model whose general.name says
//                           "phi3" Phi-3's token attributes, which needs Phi-3's vocabulary);
//   tiny-mistral3:          mistral3 (the llama block, attention temperature scaling with
//                           attention.temperature_scale 0.5 above rope.scaling.
//                           original_context_length 8), n_embd 256, n_ff 512, 4 heads × 128, 2
//                           kv heads, 2 layers, context 512, rope base 1e6, untied;
//   tiny-deepseek2:         deepseek2 (MLA): n_embd 256, n_ff 512, 4 heads, q_lora_rank 128,
//                           kv_lora_rank 64, query/key heads 32 unrotated + 16 rotated (NORM),
//                           value heads 32, separate attn_k_b/attn_v_b, 2 dense layers,
//                           context 512, untied;
//   tiny-deepseek2-lite:    tiny-deepseek2 without q-LoRA (attn_q), like DeepSeek-V2-Lite;
//   tiny-deepseek2-kvb:     tiny-deepseek2 with the older combined attn_kv_b;
//   tiny-deepseek2-moe:     tiny-deepseek2 with 3 layers, the last 2 mixture-of-experts: 8
//                           experts of n_ff 64 in 4 groups (the best 2 groups selectable), top-2,
//                           1 shared expert, sigmoid gating with exp_probs_b, weights normalized
//                           and scaled by 2.5 (DeepSeek-V3's routing); the router stays f32;
//   tiny-deepseek2-moe-softmax: the same layers with DeepSeek-V2-Lite's routing: softmax gating,
//                           top-3 of 8 experts, no groups, no bias, weights neither normalized
//                           nor scaled, 2 shared experts;
//   tiny-deepseek2-yarn:    tiny-deepseek2 with YaRN: factor 40, original context 64,
//                           yarn_log_multiplier 0.0707 (DeepSeek-V2's mscale_all_dim 0.707).
//   deepseek2-bench:        DeepSeek-V2-Lite's attention at a smaller width, for benchmarks
//                           (bench/bench_deepseek2.py; ~350 MB at q8_0): n_embd 1024, 8 layers
//                           (the first dense, n_ff 2816), 16 heads of 128 unrotated + 64 rotated,
//                           value heads 128, kv_lora_rank 512, no q-LoRA; MoE: 16 experts of
//                           n_ff 704, top-4 by softmax, 2 shared experts; context 4096, no YaRN.
//   llama-1b:               TinyLlama-1.1B's shape, for decode benchmarks where caches cannot hide
//                           the weight stream (about 1.2 GB at q8_0, 0.6 GB at q4_K; every
//                           matrix width a multiple of 256, so the K-quants need no fallback):
//                           llama, n_embd 2048, n_ff 5632, 32 heads × 64, 4 kv heads, 22 layers,
//                           context 2048, vocab 32000, rope base 1e4, untied;
// Other shapes (e.g. a gemma3 one with a sliding window) can be passed to BuildRandomModel as a
// RandomModelShape directly.
// Tokenizer: with `vocab_from`, every tokenizer.* key of that file is copied and n_vocab is its
// token count; otherwise a small byte-level BPE vocabulary (tokenizer.ggml.model "gpt2", pre
// "default"): ids 0..2 = <|endoftext|>, <|im_start|>, <|im_end|> (control), 256 byte tokens in
// GPT-2's bytes_to_unicode spelling, then tokens of up to 300 merges learned from an embedded
// English text (the shape may name another pre-tokenizer and add BOS); a shape with a larger
// vocabulary is padded with "<|unused_N|>" tokens (type 5).
//
// Quantization uses the quant registry (lib/quant/quant.h, scalar reference level); a type with
// no registered quantizer gives FailedPrecondition naming the type. Deterministic for a seed:
// the same shape, type and seed give the same bytes on every platform.
// Thread-safety: the functions are reentrant.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "lib/gguf/gguf.h"
#include "lib/gguf/gguf_writer.h"

namespace kiln {

struct RandomModelShape {
  std::string name;
  std::string arch = "llama";  // general.architecture: a registered Architecture
  uint32_t n_embd = 0;
  uint32_t n_ff = 0;
  uint32_t n_head = 0;
  uint32_t n_head_kv = 0;
  uint32_t n_layer = 0;
  uint32_t n_ctx = 0;
  uint32_t n_vocab = 0;  // 0: the vocabulary's own size
  float rope_freq_base = 10000.0f;
  float rms_eps = 1e-5f;
  bool tied_output = false;     // true: no output.weight (the head reuses token_embd)
  uint32_t sliding_window = 0;  // gemma3: the window of its sliding-window layers (0: none)
  uint32_t n_head_dim = 0;      // the key/value length per head; 0: n_embd / n_head
  // Llama 3.1's RoPE scaling: > 0 writes rope_freqs.weight as llama.cpp's converter derives it
  // from this factor, low/high frequency factors 1 and 4 and an original context of 8192.
  float llama3_rope_factor = 0.0f;
  std::string tokenizer_pre = "default";  // the self-made vocabulary's tokenizer.ggml.pre
  bool add_bos = false;                   // its tokenizer.ggml.add_bos_token (BOS id 1)
  // mistral3: attention.temperature_scale and rope.scaling.original_context_length (0: none).
  float attn_temperature_scale = 0.0f;
  uint32_t rope_orig_ctx = 0;
  // deepseek2 (MLA, when kv_lora_rank > 0): n_head_dim is the query/key head (nope + rope).
  uint32_t kv_lora_rank = 0;
  uint32_t q_lora_rank = 0;  // 0: attn_q without the low-rank bottleneck
  uint32_t mla_rope_dim = 0;
  uint32_t mla_v_head_dim = 0;
  bool mla_combined_kv_b = false;  // the older attn_kv_b instead of attn_k_b + attn_v_b
  // deepseek2 mixture of experts (n_expert > 0): the layers from mla_dense_layers on (MoeHparams).
  uint32_t mla_dense_layers = 0;
  uint32_t n_expert = 0;
  uint32_t n_expert_used = 0;
  uint32_t n_expert_shared = 0;
  uint32_t n_ff_exp = 0;
  bool moe_sigmoid = false;     // expert_gating_func sigmoid (else softmax)
  bool moe_probs_bias = false;  // exp_probs_b.bias (written as a bias: 0.5·N(0,1))
  uint32_t n_expert_group = 0;
  uint32_t n_expert_group_used = 0;
  bool moe_weights_norm = false;
  float moe_weights_scale = 1.0f;
  // deepseek2 YaRN (yarn_factor > 0): rope.scaling.type yarn with this factor, rope_orig_ctx as
  // original_context_length and rope.scaling.yarn_log_multiplier yarn_log_mul.
  float yarn_factor = 0.0f;
  float yarn_log_mul = 0.0f;
  uint32_t head_dim() const { return n_head_dim != 0 ? n_head_dim : n_embd / n_head; }
};

// The named shapes above; NotFound listing the valid names otherwise.
absl::StatusOr<RandomModelShape> RandomModelShapeByName(std::string_view name);
std::vector<std::string> RandomModelShapeNames();

struct TinyVocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> token_types;  // 1 normal, 3 control, 5 unused
  std::vector<std::string> merges;   // "left right", rank = index
};
// The self-made byte-level BPE vocabulary described above, padded to `min_size` tokens.
TinyVocab BuildTinyVocab(uint32_t min_size = 0);

struct RandomModelOptions {
  RandomModelShape shape;
  uint32_t type = 0;  // ggml type of the matrices and token_embd
  uint64_t seed = 1;
  const gguf::GgufFile* vocab_from = nullptr;  // copy tokenizer.* from here when set
  std::function<void(std::string_view)> note;  // fallbacks and progress; may be empty
};

// Fills `writer` with the metadata and tensors of a random model. InvalidArgument for an
// inconsistent shape, an unregistered architecture (naming the registered ones) or an unknown
// type id; FailedPrecondition for a type without a quantizer.
absl::Status BuildRandomModel(const RandomModelOptions& options, gguf::GgufWriter* writer);

}  // namespace kiln
