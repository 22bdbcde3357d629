#include "tests/common/reference_llama.h"

#include <cmath>
#include <type_traits>

#include "lib/gguf/gguf.h"
#include "lib/quant/quant.h"

namespace kiln::testing {
namespace {

// Dequantizes tensor `name` (rows of ne[0]) to float64 with the scalar reference dequantizer.
absl::StatusOr<std::vector<double>> DequantVec(const gguf::GgufFile& f, const std::string& name) {
  const gguf::TensorInfo* t = f.FindTensor(name);
  if (t == nullptr) return absl::NotFoundError("reference: missing " + name);
  const QuantKernels* k = GetQuantKernels(static_cast<GgmlType>(t->type), CpuLevel::kScalar);
  if (k == nullptr) return absl::UnimplementedError("reference: no dequantizer for " + name);
  const int64_t row = static_cast<int64_t>(t->ne[0]);
  const int64_t rows = static_cast<int64_t>(t->n_elements) / row;
  const size_t row_bytes = t->nbytes / rows;
  std::vector<float> tmp(row);
  std::vector<double> out(t->n_elements);
  for (int64_t r = 0; r < rows; ++r) {
    k->dequantize(t->data + r * row_bytes, tmp.data(), row);
    for (int64_t i = 0; i < row; ++i) out[r * row + i] = tmp[i];
  }
  return out;
}

template <typename M>
absl::StatusOr<M> Dequant(const gguf::GgufFile& f, const std::string& name) {
  KILN_ASSIGN_OR_RETURN(std::vector<double> v, DequantVec(f, name));
  if constexpr (std::is_same_v<M, std::vector<double>>) {
    return v;
  } else {
    M m;
    m.w = std::move(v);
    m.type = f.FindTensor(name)->type;
    return m;
  }
}

void RmsNorm(std::vector<double>& x, const std::vector<double>& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double scale = 1.0 / std::sqrt(ss / x.size() + eps);
  for (size_t i = 0; i < x.size(); ++i) x[i] = x[i] * scale * w[i];
}

}  // namespace

absl::StatusOr<ReferenceLlama> ReferenceLlama::Load(const std::string& path,
                                                    bool round_activations) {
  KILN_ASSIGN_OR_RETURN(auto file, gguf::GgufFile::Open(path));
  const gguf::GgufFile& f = *file;
  ReferenceLlama m;
  m.round_activations_ = round_activations;
  auto u = [&](const char* key) -> absl::StatusOr<int64_t> {
    KILN_ASSIGN_OR_RETURN(uint64_t v, f.GetUint(std::string("llama.") + key));
    return static_cast<int64_t>(v);
  };
  KILN_ASSIGN_OR_RETURN(m.n_embd_, u("embedding_length"));
  KILN_ASSIGN_OR_RETURN(m.n_layer_, u("block_count"));
  KILN_ASSIGN_OR_RETURN(m.n_head_, u("attention.head_count"));
  KILN_ASSIGN_OR_RETURN(m.n_head_kv_, u("attention.head_count_kv"));
  KILN_ASSIGN_OR_RETURN(m.n_ff_, u("feed_forward_length"));
  m.head_dim_ = m.n_embd_ / m.n_head_;
  m.n_rot_ = m.head_dim_;
  if (f.FindKey("llama.rope.dimension_count")) {
    KILN_ASSIGN_OR_RETURN(m.n_rot_, u("rope.dimension_count"));
  }
  if (f.FindKey("llama.rope.freq_base")) {
    KILN_ASSIGN_OR_RETURN(m.freq_base_, f.GetFloat("llama.rope.freq_base"));
  }
  if (f.FindKey("llama.attention.layer_norm_rms_epsilon")) {
    KILN_ASSIGN_OR_RETURN(m.eps_, f.GetFloat("llama.attention.layer_norm_rms_epsilon"));
  }
  KILN_ASSIGN_OR_RETURN(m.embd_, Dequant<Mat>(f, "token_embd.weight"));
  m.n_vocab_ = static_cast<int64_t>(m.embd_.size()) / m.n_embd_;
  KILN_ASSIGN_OR_RETURN(m.output_norm_, Dequant<std::vector<double>>(f, "output_norm.weight"));
  if (f.FindTensor("output.weight")) {
    KILN_ASSIGN_OR_RETURN(m.output_, Dequant<Mat>(f, "output.weight"));
  } else {
    m.output_ = m.embd_;
  }
  for (int64_t i = 0; i < m.n_layer_; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    Layer l;
    KILN_ASSIGN_OR_RETURN(l.attn_norm, Dequant<std::vector<double>>(f, p + "attn_norm.weight"));
    KILN_ASSIGN_OR_RETURN(l.ffn_norm, Dequant<std::vector<double>>(f, p + "ffn_norm.weight"));
    KILN_ASSIGN_OR_RETURN(l.wq, Dequant<Mat>(f, p + "attn_q.weight"));
    KILN_ASSIGN_OR_RETURN(l.wk, Dequant<Mat>(f, p + "attn_k.weight"));
    KILN_ASSIGN_OR_RETURN(l.wv, Dequant<Mat>(f, p + "attn_v.weight"));
    KILN_ASSIGN_OR_RETURN(l.wo, Dequant<Mat>(f, p + "attn_output.weight"));
    KILN_ASSIGN_OR_RETURN(l.gate, Dequant<Mat>(f, p + "ffn_gate.weight"));
    KILN_ASSIGN_OR_RETURN(l.up, Dequant<Mat>(f, p + "ffn_up.weight"));
    KILN_ASSIGN_OR_RETURN(l.down, Dequant<Mat>(f, p + "ffn_down.weight"));
    m.layers_.push_back(std::move(l));
  }
  return m;
}

std::vector<double> ReferenceLlama::MatVec(const Mat& w, const std::vector<double>& x_in,
                                           int64_t n_out) const {
  const int64_t n_in = static_cast<int64_t>(x_in.size());
  std::vector<double> x = x_in;
  if (round_activations_) {
    const QuantKernels* wk = GetQuantKernels(static_cast<GgmlType>(w.type), CpuLevel::kScalar);
    const QuantKernels* ak = GetQuantKernels(wk->vec_dot_type, CpuLevel::kScalar);
    if (ak->type != GgmlType::kF32) {
      std::vector<float> xf(x.begin(), x.end()), back(n_in);
      std::vector<uint8_t> q(n_in * 4 + 1024);
      ak->quantize(xf.data(), q.data(), n_in);
      ak->dequantize(q.data(), back.data(), n_in);
      x.assign(back.begin(), back.end());
    } else {
      for (double& v : x) v = static_cast<float>(v);
    }
  }
  std::vector<double> y(n_out, 0.0);
  for (int64_t o = 0; o < n_out; ++o) {
    double s = 0;
    for (int64_t i = 0; i < n_in; ++i) s += w[o * n_in + i] * x[i];
    y[o] = s;
  }
  return y;
}

std::vector<std::vector<double>> ReferenceLlama::Forward(const std::vector<int32_t>& tokens) const {
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t hd = head_dim_, kv_dim = n_head_kv_ * hd, group = n_head_ / n_head_kv_;
  // Per layer, per position: rotated keys and values [n, kv_dim].
  std::vector<std::vector<std::vector<double>>> keys(n_layer_), values(n_layer_);
  std::vector<std::vector<double>> logits;
  for (int64_t pos = 0; pos < n; ++pos) {
    std::vector<double> x(embd_.w.begin() + tokens[pos] * n_embd_,
                          embd_.w.begin() + (tokens[pos] + 1) * n_embd_);
    for (int64_t li = 0; li < n_layer_; ++li) {
      const Layer& l = layers_[li];
      std::vector<double> h = x;
      RmsNorm(h, l.attn_norm, eps_);
      std::vector<double> q = MatVec(l.wq, h, n_head_ * hd);
      std::vector<double> k = MatVec(l.wk, h, kv_dim);
      std::vector<double> v = MatVec(l.wv, h, kv_dim);
      // RoPE, NORM mode: pairs (2i, 2i+1) of the first n_rot dims of each head.
      auto rope = [&](std::vector<double>& t, int64_t heads) {
        for (int64_t hh = 0; hh < heads; ++hh) {
          for (int64_t i = 0; i < n_rot_; i += 2) {
            const double theta = pos * std::pow(freq_base_, -static_cast<double>(i) / n_rot_);
            const double c = std::cos(theta), s = std::sin(theta);
            double& a = t[hh * hd + i];
            double& b = t[hh * hd + i + 1];
            const double a0 = a, b0 = b;
            a = a0 * c - b0 * s;
            b = a0 * s + b0 * c;
          }
        }
      };
      rope(q, n_head_);
      rope(k, n_head_kv_);
      keys[li].push_back(k);
      values[li].push_back(v);
      std::vector<double> attn(n_head_ * hd, 0.0);
      for (int64_t hh = 0; hh < n_head_; ++hh) {
        const int64_t kvh = hh / group;
        std::vector<double> scores(pos + 1);
        double mx = -1e300;
        for (int64_t j = 0; j <= pos; ++j) {
          double s = 0;
          for (int64_t d = 0; d < hd; ++d) s += q[hh * hd + d] * keys[li][j][kvh * hd + d];
          scores[j] = s / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, scores[j]);
        }
        double sum = 0;
        for (double& s : scores) sum += (s = std::exp(s - mx));
        for (int64_t j = 0; j <= pos; ++j) {
          for (int64_t d = 0; d < hd; ++d) {
            attn[hh * hd + d] += scores[j] / sum * values[li][j][kvh * hd + d];
          }
        }
      }
      std::vector<double> o = MatVec(l.wo, attn, n_embd_);
      for (int64_t i = 0; i < n_embd_; ++i) x[i] += o[i];
      h = x;
      RmsNorm(h, l.ffn_norm, eps_);
      std::vector<double> g = MatVec(l.gate, h, n_ff_);
      std::vector<double> u = MatVec(l.up, h, n_ff_);
      for (int64_t i = 0; i < n_ff_; ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
      std::vector<double> dn = MatVec(l.down, g, n_embd_);
      for (int64_t i = 0; i < n_embd_; ++i) x[i] += dn[i];
    }
    RmsNorm(x, output_norm_, eps_);
    logits.push_back(MatVec(output_, x, n_vocab_));
  }
  return logits;
}

}  // namespace kiln::testing
