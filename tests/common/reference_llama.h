// A deliberately plain float64 llama forward pass, written independently of the engine, used by
// tests as the oracle for the engine's logits on tiny random models. It dequantizes every weight
// with the reference dequantizers and recomputes attention over the whole prefix per token.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lib/common/status.h"

namespace kiln::testing {

class ReferenceLlama {
 public:
  // Loads hyper-parameters and dequantized weights (float64) from a GGUF file. Only models
  // without rope scaling are supported (the tiny test models).
  // With `round_activations`, every matrix-vector product first rounds its input through the
  // weight type's activation format (quantize + dequantize with the scalar reference, e.g. Q8_0
  // for Q4_0 weights), as any engine that dots quantized weights with quantized activations
  // does; the product itself stays float64.
  static absl::StatusOr<ReferenceLlama> Load(const std::string& path,
                                             bool round_activations = false);

  // Logits [tokens.size(), n_vocab] for every position of one causal sequence starting at 0.
  std::vector<std::vector<double>> Forward(const std::vector<int32_t>& tokens) const;

  int64_t n_vocab() const { return n_vocab_; }

 private:
  struct Mat {
    std::vector<double> w;  // row-major [n_out, n_in]
    uint32_t type = 0;      // ggml type of the stored weight
    const double& operator[](size_t i) const { return w[i]; }
    size_t size() const { return w.size(); }
  };
  struct Layer {
    std::vector<double> attn_norm, ffn_norm;
    Mat wq, wk, wv, wo, gate, up, down;
  };
  std::vector<double> MatVec(const Mat& w, const std::vector<double>& x, int64_t n_out) const;

  bool round_activations_ = false;
  int64_t n_vocab_ = 0, n_embd_ = 0, n_layer_ = 0, n_head_ = 0, n_head_kv_ = 0, head_dim_ = 0,
          n_ff_ = 0, n_rot_ = 0;
  double eps_ = 1e-5, freq_base_ = 10000.0;
  Mat embd_, output_;
  std::vector<double> output_norm_;
  std::vector<Layer> layers_;
};

}  // namespace kiln::testing
