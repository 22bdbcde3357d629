// Hyper-parameters of a model, read from GGUF metadata (keys `<arch>.*`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lib/common/status.h"

namespace kiln {
namespace gguf {
class GgufFile;
}

enum class RopeType { kNorm, kNeox };  // NORM: rotate pairs (2i, 2i+1); NEOX: pairs (i, i + d/2)
enum class RopeScaling { kNone, kLinear, kYarn, kLlama3 };

struct RopeParams {
  RopeType type = RopeType::kNorm;
  int n_rot = 0;  // leading dims of each head that are rotated
  float freq_base = 10000.0f;
  RopeScaling scaling = RopeScaling::kNone;
  float freq_scale = 1.0f;  // 1 / scaling factor (linear, YaRN)
  int n_ctx_orig = 0;       // training context before extension (YaRN, llama3)
  // YaRN
  float yarn_ext_factor = 0.0f;
  float yarn_attn_factor = 1.0f;
  float yarn_beta_fast = 32.0f;
  float yarn_beta_slow = 1.0f;
  // llama3: per-dimension frequency divisors from the `rope_freqs.weight` tensor (n_rot / 2).
  std::vector<float> freq_factors;
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
  RopeParams rope;
  bool tied_output = false;  // no output.weight: logits use token_embd

  int64_t n_gqa() const { return n_head / n_head_kv; }
};

// Reads and validates the llama-family hyper-parameters (every architecture that uses the llama
// graph: llama, mistral, smollm-style files all say "llama"). Errors name the key.
absl::StatusOr<ModelHparams> ReadLlamaHparams(const gguf::GgufFile& file);

}  // namespace kiln
