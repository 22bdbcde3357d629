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
