// RoPE tables and application (formulas in ops.h).
#include <algorithm>
#include <cmath>

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
      const double wavelen = 2.0 * M_PI / inv_freq;
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

  const bool yarn = c.scaling == RopeScaling::kYarn;
  const bool scaled = yarn || c.scaling == RopeScaling::kLinear;
  const double freq_scale = scaled ? c.freq_scale : 1.0;
  const double ext_factor = yarn ? c.ext_factor : 0.0;
  double mscale = yarn ? c.attn_factor : 1.0;
  double corr_low = 0.0, corr_high = 0.0;
  if (yarn && ext_factor != 0.0) {
    const double base = c.freq_base;
    auto corr_dim = [&](double n_rotations) {
      return c.n_rot * std::log(c.orig_ctx / (n_rotations * 2.0 * M_PI)) / (2.0 * std::log(base));
    };
    corr_low = std::max(0.0, std::floor(corr_dim(c.beta_fast)));
    corr_high = std::min(c.n_rot - 1.0, std::ceil(corr_dim(c.beta_slow)));
    mscale *= 1.0 + 0.1 * std::log(1.0 / freq_scale);
  }

  const std::vector<double> ff = RopeFreqFactors(c);
  // Per pair: inverse frequency and the YaRN mix weight of the extrapolated angle.
  std::vector<double> inv_freq(half), ramp(half, 0.0);
  for (int32_t i = 0; i < half; ++i) {
    inv_freq[i] = std::pow(static_cast<double>(c.freq_base), -2.0 * i / c.n_rot) / ff[i];
    if (ext_factor != 0.0) {
      const double y = (i - corr_low) / std::max(0.001, corr_high - corr_low);
      ramp[i] = (1.0 - std::min(1.0, std::max(0.0, y))) * ext_factor;
    }
  }

  const int64_t per_token = mode_ == RopeMode::kNorm ? n_rot_ : half;
  cos_.resize(n_tokens_ * per_token);
  sin_.resize(n_tokens_ * per_token);
  for (int64_t t = 0; t < n_tokens_; ++t) {
    float* ct = cos_.data() + t * per_token;
    float* st = sin_.data() + t * per_token;
    for (int32_t i = 0; i < half; ++i) {
      const double theta_extrap = positions[t] * inv_freq[i];
      const double theta_interp = freq_scale * theta_extrap;
      const double theta = theta_interp * (1.0 - ramp[i]) + theta_extrap * ramp[i];
      const float cv = static_cast<float>(std::cos(theta) * mscale);
      const float sv = static_cast<float>(std::sin(theta) * mscale);
      if (mode_ == RopeMode::kNorm) {
        ct[2 * i] = ct[2 * i + 1] = cv;
        st[2 * i] = -sv;
        st[2 * i + 1] = sv;
      } else {
        ct[i] = cv;
        st[i] = sv;
      }
    }
  }
  return absl::OkStatus();
}

void RopeTable::Apply(float* x, int64_t n_heads, CpuLevel level) const {
  const OpKernels& k = GetOpKernels(level);
  const int64_t half = n_rot_ / 2;
  for (int64_t t = 0; t < n_tokens_; ++t) {
    for (int64_t h = 0; h < n_heads; ++h) {
      float* xh = x + (t * n_heads + h) * head_dim_;  // [head_dim]
      if (mode_ == RopeMode::kNorm) {
        k.rope_pairs(xh, cos_.data() + t * n_rot_, sin_.data() + t * n_rot_, n_rot_);
      } else {
        k.rope_halves(xh, cos_.data() + t * half, sin_.data() + t * half, half);
      }
    }
  }
}

}  // namespace kiln::cpu
