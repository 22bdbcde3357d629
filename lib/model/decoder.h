// The decoder-only transformer most families share (llama, qwen2, mistral, ...): pre-norm
// blocks of GQA attention (optional Q/K/V/output biases) and a SwiGLU feed-forward, RMSNorm,
// RoPE, a tied or separate output head. Architecture files (arch/<name>.cc) describe how their
// family fills it in (keys, rotation, which biases exist) and reuse this forward pass.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "lib/model/architecture.h"
#include "lib/model/model.h"

namespace kiln {

// Whether a family's tensors include a group of biases.
enum class Presence { kAbsent, kOptional, kRequired };

struct DecoderTensorOptions {
  Presence qkv_bias = Presence::kAbsent;     // attn_q.bias, attn_k.bias, attn_v.bias
  Presence output_bias = Presence::kAbsent;  // attn_output.bias
};

// The tensor table of a decoder (names as llama.cpp's converters write them):
//   token_embd.weight [n_embd, n_vocab], output_norm.weight, output.weight (unless tied),
//   blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate, ffn_up,
//   ffn_down}.weight and the biases `options` asks for.
std::vector<TensorSpec> DecoderTensors(const ModelHparams& hp, const DecoderTensorOptions& options);

// The cache layout of GQA attention: K and V rows per KV head per layer.
absl::StatusOr<KvLayout> GqaCacheLayout(const ModelHparams& hp, GgmlType kv_type,
                                        int32_t block_size);

// The decoder's forward pass over `model`'s tensors (bound by name at construction; an optional
// bias the file lacks is skipped) on `backend`.
absl::StatusOr<std::unique_ptr<ForwardPass>> NewDecoderForward(const Model& model,
                                                               Backend& backend);

}  // namespace kiln
