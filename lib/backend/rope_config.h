// RopeConfig: how a model rotates its queries and keys (the one RoPE description: the model's
// hyper-parameters hold it, every backend's RoPE op reads it). Formulas: lib/backend/cpu/ops.h.
#pragma once

#include <cstdint>

namespace kiln {

enum class RopeMode { kNorm, kNeox };  // NORM: pairs (2i, 2i + 1); NEOX: pairs (i, i + n_rot / 2)
enum class RopeScaling { kNone, kLinear, kLlama3, kYarn };

struct RopeConfig {
  RopeMode mode = RopeMode::kNorm;
  int32_t n_rot = 0;  // rotated dims: even, 2 <= n_rot <= head_dim
  float freq_base = 10000.0f;
  RopeScaling scaling = RopeScaling::kNone;
  // kLinear and kYarn: 1 / scaling factor (ignored for kNone / kLlama3).
  float freq_scale = 1.0f;
  // Optional per-dimension divisors of theta ("rope_freqs" tensor), n_rot/2 entries; used with
  // any scaling (takes precedence over the kLlama3 rule). Points into the model's mapped file
  // (or caller memory), which must outlive every use of the config.
  const float* freq_factors = nullptr;
  // kLlama3 rule parameters.
  float llama3_factor = 8.0f;
  float llama3_low_freq_factor = 1.0f;
  float llama3_high_freq_factor = 4.0f;
  // kLlama3 and kYarn: the original training context.
  int32_t orig_ctx = 8192;
  // kYarn parameters.
  float ext_factor = 1.0f;
  float attn_factor = 1.0f;
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
};

}  // namespace kiln
