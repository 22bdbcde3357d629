// RoPE tables and application (formulas in ops.h).
#include <algorithm>
#include <cmath>
#include <numbers>

#include "lib/backend/cpu/dispatch.h"
#include "lib/backend/cpu/ops.h"

namespace kiln::cpu {

absl::Status ValidateRopeConfig(const RopeConfig& c, int32_t head_dim) {
  if (c.n_rot < 2 || c.n_rot % 2 != 0 || c.n_rot > head_dim) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "RoPE: n_rot %d must be even and in [2, head_dim = %d]", c.n_rot, head_dim));
  }
  if (!(c.freq_base > 1.0f) || !std::isfinite(c.freq_base)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("RoPE: freq_base %g must be > 1", c.freq_base));
  }
  if ((c.scaling == RopeScaling::kLinear || c.scaling == RopeScaling::kYarn) &&
      !(c.freq_scale > 0.0f && std::isfinite(c.freq_scale))) {
    return absl::InvalidArgumentError(
        absl::StrFormat("RoPE: freq_scale %g must be positive", c.freq_scale));
  }
  if (c.scaling == RopeScaling::kLlama3 && c.freq_factors == nullptr) {
    if (!(c.llama3_factor > 0.0f) || c.orig_ctx <= 0 ||
        !(c.llama3_high_freq_factor > c.llama3_low_freq_factor) ||
        !(c.llama3_low_freq_factor > 0.0f)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "RoPE llama3: factor %g, low_freq_factor %g, high_freq_factor %g, orig_ctx %d "
          "(need factor > 0, 0 < low < high, orig_ctx > 0)",
          c.llama3_factor, c.llama3_low_freq_factor, c.llama3_high_freq_factor, c.orig_ctx));
    }
  }
  if (c.scaling == RopeScaling::kYarn &&
      (c.orig_ctx <= 0 || !(c.beta_fast > 0.0f) || !(c.beta_slow > 0.0f))) {
    return absl::InvalidArgumentError(
        absl::StrFormat("RoPE yarn: orig_ctx %d, beta_fast %g, beta_slow %g must be positive",
                        c.orig_ctx, c.beta_fast, c.beta_slow));
  }
  if (c.freq_factors != nullptr) {
    for (int32_t i = 0; i < c.n_rot / 2; ++i) {
      if (!(c.freq_factors[i] > 0.0f) || !std::isfinite(c.freq_factors[i])) {
        return absl::InvalidArgumentError(
            absl::StrFormat("RoPE: freq_factors[%d] = %g must be positive", i, c.freq_factors[i]));
      }
    }
  }
  return absl::OkStatus();
}

std::vector<double> RopeFreqFactors(const RopeConfig& c) {
  const int32_t half = c.n_rot / 2;
  std::vector<double> ff(half, 1.0);
  if (c.freq_factors != nullptr) {
    for (int32_t i = 0; i < half; ++i) ff[i] = c.freq_factors[i];
  } else if (c.scaling == RopeScaling::kLlama3) {
    const double lo_wl = c.orig_ctx / static_cast<double>(c.llama3_low_freq_factor);
    const double hi_wl = c.orig_ctx / static_cast<double>(c.llama3_high_freq_factor);
    for (int32_t i = 0; i < half; ++i) {
      const double inv_freq = std::pow(static_cast<double>(c.freq_base), -2.0 * i / c.n_rot);
      const double wavelen = 2.0 * std::numbers::pi / inv_freq;
      if (wavelen < hi_wl) {
        ff[i] = 1.0;
      } else if (wavelen > lo_wl) {
        ff[i] = c.llama3_factor;
      } else {
        const double smooth = (c.orig_ctx / wavelen - c.llama3_low_freq_factor) /
                              (c.llama3_high_freq_factor - c.llama3_low_freq_factor);
        ff[i] = 1.0 / ((1.0 - smooth) / c.llama3_factor + smooth);
      }
    }
  }
  return ff;
}

absl::Status RopeTable::Build(const RopeConfig& c, int32_t head_dim,
                              std::span<const int32_t> positions) {
  KILN_RETURN_IF_ERROR(ValidateRopeConfig(c, head_dim));
  for (size_t t = 0; t < positions.size(); ++t) {
    if (positions[t] < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("RoPE: positions[%d] = %d is negative", t, positions[t]));
    }
  }
  mode_ = c.mode;
  n_rot_ = c.n_rot;
  head_dim_ = head_dim;
  n_tokens_ = static_cast<int64_t>(positions.size());
  const int32_t half = c.n_rot / 2;

  // Float arithmetic in ggml's order (ggml_rope_cache_init / rope_yarn): the angle of pair i is
  // p * theta_scale^i accumulated by repeated float multiplication, then cosf / sinf. Matching
  // it bit for bit keeps kiln's activations identical to llama.cpp's (see activation.h).
  const bool yarn = c.scaling == RopeScaling::kYarn;
  const bool scaled = yarn || c.scaling == RopeScaling::kLinear;
  const float freq_scale = scaled ? c.freq_scale : 1.0f;
  const float ext_factor = yarn ? c.ext_factor : 0.0f;
  float mscale = yarn ? c.attn_factor : 1.0f;
  float corr_low = 0.0f, corr_high = 0.0f;
  if (ext_factor != 0.0f) {
    const float pi = static_cast<float>(std::numbers::pi);
    auto corr_dim = [&](float n_rotations) {
      return static_cast<float>(c.n_rot) *
             std::log(static_cast<float>(c.orig_ctx) / (n_rotations * 2.0f * pi)) /
             (2.0f * std::log(c.freq_base));
    };
    corr_low = std::max(0.0f, std::floor(corr_dim(c.beta_fast)));
    corr_high = std::min(static_cast<float>(c.n_rot - 1), std::ceil(corr_dim(c.beta_slow)));
    mscale *= std::fma(0.1f, std::log(1.0f / freq_scale), 1.0f);
  }
  const float theta_scale = std::pow(c.freq_base, -2.0f / static_cast<float>(c.n_rot));
  const std::vector<double> ff64 = RopeFreqFactors(c);
  std::vector<float> ff(ff64.begin(), ff64.end());

  cos_.resize(n_tokens_ * half);
  sin_.resize(n_tokens_ * half);
  for (int64_t t = 0; t < n_tokens_; ++t) {
    float* ct = cos_.data() + t * half;
    float* st = sin_.data() + t * half;
    float theta_base = static_cast<float>(positions[t]);
    for (int32_t i = 0; i < half; ++i) {
      const float theta_extrap = theta_base / ff[i];
      const float theta_interp = freq_scale * theta_extrap;
      float theta = theta_interp;
      if (ext_factor != 0.0f) {
        const float y = (static_cast<float>(i) - corr_low) / std::max(0.001f, corr_high - corr_low);
        const float ramp_mix = (1.0f - std::min(1.0f, std::max(0.0f, y))) * ext_factor;
        // ggml's theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix as GCC contracts it
        // (the first product fused: tiny-deepseek2-yarn's goldens are bitwise only so).
        theta = std::fma(theta_interp, 1.0f - ramp_mix, theta_extrap * ramp_mix);
      }
      ct[i] = std::cos(theta) * mscale;
      st[i] = std::sin(theta) * mscale;
      theta_base *= theta_scale;
    }
  }
  return absl::OkStatus();
}

void RopeTable::Apply(float* x, int64_t n_heads, CpuLevel level) const {
  // NORM pairs (2i, 2i + 1); NEOX pairs (i, i + n_rot / 2). See OpKernels::rope_pairs.
  const OpKernels& k = GetOpKernels(level);
  const int64_t half = n_rot_ / 2;
  const int64_t stride = mode_ == RopeMode::kNorm ? 1 : half;
  for (int64_t t = 0; t < n_tokens_; ++t) {
    const float* ct = cos_.data() + t * half;
    const float* st = sin_.data() + t * half;
    for (int64_t h = 0; h < n_heads; ++h) {
      k.rope_pairs(x + (t * n_heads + h) * head_dim_, ct, st, half, stride);  // [head_dim]
    }
  }
}

}  // namespace kiln::cpu
