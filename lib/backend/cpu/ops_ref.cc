#include "lib/backend/cpu/ops_ref.h"

#include <cmath>
#include <numbers>
#include <vector>

#include "lib/common/half.h"

namespace kiln::cpu::ref {

absl::Status MatMul(const WeightView& w, const float* x, int64_t n_tokens, float* y,
                    bool quantize_activations) {
  const QuantKernels* k = GetQuantKernels(w.type, CpuLevel::kScalar);
  const auto info = GgmlTypeInfoOf(static_cast<uint32_t>(w.type));
  if (k == nullptr || !info) return absl::UnimplementedError("ref::MatMul: unsupported type");
  const size_t row_bytes = GgmlRowBytes(*info, w.n_in);
  std::vector<float> a(w.n_in), wrow(w.n_in);
  std::vector<uint8_t> qbuf;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* xt = x + t * w.n_in;
    a.assign(xt, xt + w.n_in);
    if (quantize_activations && k->vec_dot_type != GgmlType::kF32) {
      const QuantKernels* ak = GetQuantKernels(k->vec_dot_type, CpuLevel::kScalar);
      const auto ainfo = GgmlTypeInfoOf(static_cast<uint32_t>(k->vec_dot_type));
      if (ak == nullptr || !ainfo) {
        return absl::UnimplementedError("ref::MatMul: activation type has no kernels");
      }
      qbuf.resize(GgmlRowBytes(*ainfo, w.n_in));
      ak->quantize(xt, qbuf.data(), w.n_in);
      ak->dequantize(qbuf.data(), a.data(), w.n_in);
    }
    for (int64_t o = 0; o < w.n_out; ++o) {
      k->dequantize(static_cast<const uint8_t*>(w.data) + o * row_bytes, wrow.data(), w.n_in);
      double s = 0.0;
      for (int64_t i = 0; i < w.n_in; ++i) s += static_cast<double>(wrow[i]) * a[i];
      y[t * w.n_out + o] = static_cast<float>(s);
    }
  }
  return absl::OkStatus();
}

absl::Status EmbeddingGather(const WeightView& table, std::span<const int32_t> tokens, float* out) {
  const QuantKernels* k = GetQuantKernels(table.type, CpuLevel::kScalar);
  const auto info = GgmlTypeInfoOf(static_cast<uint32_t>(table.type));
  if (k == nullptr || !info) return absl::UnimplementedError("ref::EmbeddingGather: type");
  const size_t row_bytes = GgmlRowBytes(*info, table.n_in);
  for (size_t t = 0; t < tokens.size(); ++t) {
    if (tokens[t] < 0 || tokens[t] >= table.n_out) {
      return absl::OutOfRangeError("ref::EmbeddingGather: token id");
    }
    k->dequantize(static_cast<const uint8_t*>(table.data) + tokens[t] * row_bytes,
                  out + t * table.n_in, table.n_in);
  }
  return absl::OkStatus();
}

void RmsNorm(const float* x, const float* weight, int64_t n_rows, int64_t n, float eps, float* y) {
  for (int64_t r = 0; r < n_rows; ++r) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[r * n + i]) * x[r * n + i];
    const double inv = 1.0 / std::sqrt(ss / n + eps);
    for (int64_t i = 0; i < n; ++i)
      y[r * n + i] = static_cast<float>(x[r * n + i] * inv * weight[i]);
  }
}

void SwiGlu(const float* gate, const float* up, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    y[i] = static_cast<float>(g / (1.0 + std::exp(-g)) * up[i]);
  }
}

void GeGlu(const float* gate, const float* up, int64_t n, float* y) {
  const double kSqrt2OverPi = 0.79788456080286535587989211986876;
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    const double gelu = 0.5 * g * (1.0 + std::tanh(kSqrt2OverPi * g * (1.0 + 0.044715 * g * g)));
    y[i] = static_cast<float>(gelu * up[i]);
  }
}

void Add(const float* a, const float* b, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

void SoftmaxRows(float* x, int64_t n_rows, int64_t n, float scale) {
  std::vector<double> e(n);
  for (int64_t r = 0; r < n_rows; ++r) {
    float* row = x + r * n;
    double mx = -INFINITY, sum = 0.0;
    for (int64_t i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(row[i]) * scale);
    for (int64_t i = 0; i < n; ++i)
      sum += e[i] = std::exp(static_cast<double>(row[i]) * scale - mx);
    for (int64_t i = 0; i < n; ++i) row[i] = static_cast<float>(e[i] / sum);
  }
}

absl::Status Rope(const RopeConfig& c, int32_t head_dim, std::span<const int32_t> positions,
                  int64_t n_heads, float* x) {
  KILN_RETURN_IF_ERROR(ValidateRopeConfig(c, head_dim));
  const std::vector<double> ff = RopeFreqFactors(c);
  const bool yarn = c.scaling == RopeScaling::kYarn;
  const double fs =
      (yarn || c.scaling == RopeScaling::kLinear) ? static_cast<double>(c.freq_scale) : 1.0;
  const double ext = yarn ? c.ext_factor : 0.0;
  double mscale = yarn ? c.attn_factor : 1.0;
  double low = 0.0, high = 0.0;
  if (ext != 0.0) {
    const double two_ln_base = 2.0 * std::log(static_cast<double>(c.freq_base));
    low = std::floor(c.n_rot * std::log(c.orig_ctx / (c.beta_fast * 2.0 * std::numbers::pi)) /
                     two_ln_base);
    high = std::ceil(c.n_rot * std::log(c.orig_ctx / (c.beta_slow * 2.0 * std::numbers::pi)) /
                     two_ln_base);
    low = std::max(0.0, low);
    high = std::min(c.n_rot - 1.0, high);
    mscale *= 1.0 + 0.1 * std::log(1.0 / fs);
  }
  const int32_t half = c.n_rot / 2;
  // The angle follows ggml's float recipe (theta_scale = powf(base, -2 / n_rot), multiplied up
  // in float per pair), which kiln adopts to match llama.cpp; its error against the exact
  // p * base^(-2i / n_rot) grows with p (about p * i * 2^-24). The rest is computed in double.
  const float theta_scale = std::pow(c.freq_base, -2.0f / static_cast<float>(c.n_rot));
  for (size_t t = 0; t < positions.size(); ++t) {
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * head_dim;
      float theta_base = static_cast<float>(positions[t]);
      for (int32_t i = 0; i < half; ++i, theta_base *= theta_scale) {
        const float extrap_f = theta_base / static_cast<float>(ff[i]);
        const double extrap = extrap_f;
        double theta = static_cast<float>(static_cast<float>(fs) * extrap_f);
        if (ext != 0.0) {
          const double y = (i - low) / std::max(0.001, high - low);
          const double mix = (1.0 - std::min(1.0, std::max(0.0, y))) * ext;
          theta = theta * (1.0 - mix) + extrap * mix;
        }
        const int32_t a = c.mode == RopeMode::kNorm ? 2 * i : i;
        const int32_t b = c.mode == RopeMode::kNorm ? 2 * i + 1 : i + half;
        const double xa = v[a], xb = v[b];
        v[a] = static_cast<float>((xa * std::cos(theta) - xb * std::sin(theta)) * mscale);
        v[b] = static_cast<float>((xa * std::sin(theta) + xb * std::cos(theta)) * mscale);
      }
    }
  }
  return absl::OkStatus();
}

void Attention(const float* q, int32_t n_heads, int32_t n_kv_heads, int32_t d, const float* k,
               const float* v, std::span<const int32_t> visible, float scale, float* out,
               bool round_to_f16) {
  auto round = [&](double x) {
    return round_to_f16 ? static_cast<double>(Fp16ToFp32(Fp32ToFp16(static_cast<float>(x)))) : x;
  };
  const int32_t group = n_heads / n_kv_heads;
  std::vector<double> s(visible.size());
  for (int32_t h = 0; h < n_heads; ++h) {
    const int32_t kvh = h / group;
    double mx = -INFINITY;
    for (size_t j = 0; j < visible.size(); ++j) {
      const float* kr = k + (static_cast<int64_t>(visible[j]) * n_kv_heads + kvh) * d;
      double dot = 0.0;
      for (int32_t i = 0; i < d; ++i) dot += round(q[h * d + i]) * kr[i];
      s[j] = dot * scale;
      mx = std::max(mx, s[j]);
    }
    double sum = 0.0;
    for (double& e : s) sum += e = std::exp(e - mx);
    for (double& e : s) e = round(e / sum);
    for (int32_t i = 0; i < d; ++i) {
      double o = 0.0;
      for (size_t j = 0; j < visible.size(); ++j) {
        o += s[j] * v[(static_cast<int64_t>(visible[j]) * n_kv_heads + kvh) * d + i];
      }
      out[h * d + i] = static_cast<float>(o);
    }
  }
}

void MlaAttention(const float* q, int32_t n_heads, const MlaAttentionWeights& w, int32_t rope_dim,
                  const float* latent, std::span<const int32_t> visible, float scale, float* out) {
  const int64_t kvl = w.kv_lora_rank, nope = w.nope_dim, vd = w.v_head_dim, rd = rope_dim;
  const int64_t row = kvl + rd, qk = nope + rd;
  const size_t n = visible.size();
  std::vector<double> s(n), value(n * vd);
  for (int64_t h = 0; h < n_heads; ++h) {
    const float* uk = w.w_uk + h * nope * kvl;  // [nope, kvl]
    const float* uv = w.w_uv + h * vd * kvl;    // [vd, kvl]
    double mx = -INFINITY;
    for (size_t j = 0; j < n; ++j) {
      const float* c = latent + static_cast<int64_t>(visible[j]) * row;
      double dot = 0.0;
      for (int64_t d = 0; d < nope; ++d) {
        double key = 0.0;  // (W_UK_h c)[d]
        for (int64_t r = 0; r < kvl; ++r) key += double{uk[d * kvl + r]} * c[r];
        dot += double{q[h * qk + d]} * key;
      }
      for (int64_t d = 0; d < rd; ++d) dot += double{q[h * qk + nope + d]} * c[kvl + d];
      for (int64_t e = 0; e < vd; ++e) {
        double v = 0.0;  // (W_UV_h c)[e]
        for (int64_t r = 0; r < kvl; ++r) v += double{uv[e * kvl + r]} * c[r];
        value[j * vd + e] = v;
      }
      s[j] = dot * scale;
      mx = std::max(mx, s[j]);
    }
    double sum = 0.0;
    for (double& e : s) sum += e = std::exp(e - mx);
    for (int64_t e = 0; e < vd; ++e) {
      double o = 0.0;
      for (size_t j = 0; j < n; ++j) o += s[j] / sum * value[j * vd + e];
      out[h * vd + e] = static_cast<float>(o);
    }
  }
}

}  // namespace kiln::cpu::ref
