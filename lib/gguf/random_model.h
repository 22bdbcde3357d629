// Random-weight llama-architecture GGUF models of named shapes (the engine behind
// tools/kiln-mkmodel, and test fixtures). Keys and tensor names match llama.cpp's converter
// output for SmolLM2 (GGUF_FACTS.md §3, §6):
//   token_embd.weight                     [n_embd, n_vocab]   chosen type
//   blk.N.attn_norm.weight / ffn_norm     [n_embd]            f32, 1 + 0.02·N(0,1)
//   blk.N.attn_q.weight                   [n_embd, n_head·head_dim]
//   blk.N.attn_k.weight / attn_v.weight   [n_embd, n_head_kv·head_dim]
//   blk.N.attn_output.weight              [n_head·head_dim, n_embd]
//   blk.N.ffn_gate.weight / ffn_up.weight [n_embd, n_ff]
//   blk.N.ffn_down.weight                 [n_ff, n_embd]
//   output_norm.weight                    [n_embd]            f32
//   output.weight                         [n_embd, n_vocab]   only when the shape is untied
// (ggml order: ne[0] = row length = fan-in.) Matrices are N(0,1)/sqrt(fan_in), never all zero.
// A tensor whose row length is not a multiple of the type's block size falls back to q8_0 (or
// f16 when q8_0 does not fit either), as llama-quantize does; each fallback is reported through
// the `note` callback.
//
// Shapes:
//   tiny-llama-gqa|mha|mqa: n_embd 256, n_ff 512, 4 heads × 64, kv heads 2|4|1, 2 layers,
//                           context 512, untied output.weight, self-made byte-level BPE vocab;
//   smollm2-135m:           576/1536/9 heads/3 kv/30 layers/ctx 8192/vocab 49152, rope 1e5,
//                           tied (no output.weight), like SmolLM2-135M-Instruct.
// Tokenizer: with `vocab_from`, every tokenizer.* key of that file is copied and n_vocab is its
// token count; otherwise a small byte-level BPE vocabulary (tokenizer.ggml.model "gpt2", pre
// "default"): ids 0..2 = <|endoftext|>, <|im_start|>, <|im_end|> (control), 256 byte tokens in
// GPT-2's bytes_to_unicode spelling, then tokens of up to 300 merges learned from an embedded
// English text; a shape with a larger vocabulary is padded with "<|unused_N|>" tokens (type 5).
//
// Quantization uses the quant registry (lib/quant/quant.h, scalar reference level); a type with
// no registered quantizer gives FailedPrecondition naming the type. Deterministic for a seed.
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

namespace kiln::gguf {

struct LlamaShape {
  std::string name;
  uint32_t n_embd = 0;
  uint32_t n_ff = 0;
  uint32_t n_head = 0;
  uint32_t n_head_kv = 0;
  uint32_t n_layer = 0;
  uint32_t n_ctx = 0;
  uint32_t n_vocab = 0;  // 0: the vocabulary's own size
  float rope_freq_base = 10000.0f;
  float rms_eps = 1e-5f;
  bool tied_output = false;  // true: no output.weight (the head reuses token_embd)
  uint32_t head_dim() const { return n_embd / n_head; }
};

// The named shapes above; NotFound listing the valid names otherwise.
absl::StatusOr<LlamaShape> LlamaShapeByName(std::string_view name);
std::vector<std::string> LlamaShapeNames();

// "f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K", "q3_K", "q4_K", "q5_K",
// "q6_K" -> ggml type id; InvalidArgument naming the string otherwise.
absl::StatusOr<uint32_t> WeightTypeByName(std::string_view name);
// llama_ftype written as general.file_type for a model whose matrices are mostly `type`.
uint32_t FileTypeOf(uint32_t ggml_type);

struct TinyVocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> token_types;  // 1 normal, 3 control, 5 unused
  std::vector<std::string> merges;   // "left right", rank = index
};
// The self-made byte-level BPE vocabulary described above, padded to `min_size` tokens.
TinyVocab BuildTinyVocab(uint32_t min_size = 0);

struct RandomModelOptions {
  LlamaShape shape;
  uint32_t type = 0;  // ggml type of the matrices and token_embd
  uint64_t seed = 1;
  const GgufFile* vocab_from = nullptr;        // copy tokenizer.* from here when set
  std::function<void(std::string_view)> note;  // fallbacks and progress; may be empty
};

// Fills `writer` with the metadata and tensors of a random model.
absl::Status BuildRandomLlama(const RandomModelOptions& options, GgufWriter* writer);

}  // namespace kiln::gguf
