// ForwardBatch: what one forward pass computes (the input of ForwardPass::Forward, which the
// engine runs). A flat list of tokens from any number of sequences: prefill chunks, decode tokens
// and speculative trees of different sessions all go in one batch.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "lib/kv/kv_cache.h"

namespace kiln {

struct BatchToken {
  int32_t token = 0;
  SeqId seq = 0;
  // RoPE position (the token's position in its sequence's text). For a tree node: the root's
  // position + depth, i.e. where it will sit once committed.
  int32_t pos = 0;
  // Index of this token's K/V slot in its sequence (KvCache positions [0, Length)). The caller
  // has already made room with KvCache::AppendSlots. Equals pos for causal tokens.
  int32_t cache_index = 0;
  // -1: causal (attends to cache positions [0, cache_index]). >= 0: tree node whose parent is
  // batch token `parent` (an earlier token of the same sequence); it attends to the positions up
  // to and including its causal root plus its tree ancestors and itself.
  int32_t parent = -1;
  bool want_logits = false;
};

struct ForwardBatch {
  std::vector<BatchToken> tokens;
  // true: the pass also returns the final hidden state of every logits row (ForwardOutput::hidden)
  // for strategies that draft from the target's features (Medusa / EAGLE heads). Off by default:
  // most passes need only the logits.
  bool want_hidden = false;
  // Target layers (ascending, distinct, each < n_layer) whose outputs (the residual stream after
  // the layer) the pass returns for every logits row (ForwardOutput::layer_hidden), for heads
  // that fuse features from several depths (EAGLE-3). Empty by default.
  std::vector<int32_t> hidden_layers;

  void Clear() {
    tokens.clear();
    want_hidden = false;
    hidden_layers.clear();
  }
  // Adds `layers` to hidden_layers (a batch of several sessions asks for the union).
  void WantHiddenLayers(std::span<const int32_t> layers) {
    for (int32_t l : layers) {
      auto at = std::lower_bound(hidden_layers.begin(), hidden_layers.end(), l);
      if (at == hidden_layers.end() || *at != l) hidden_layers.insert(at, l);
    }
  }
  void Add(int32_t token, SeqId seq, int32_t pos, bool want_logits, int32_t parent = -1,
           int32_t cache_index = -1) {
    tokens.push_back({token, seq, pos, cache_index < 0 ? pos : cache_index, parent, want_logits});
  }
};

struct ForwardOutput {
  int64_t n_vocab = 0;
  std::vector<int32_t> logit_tokens;  // batch index of each logits row, in batch order
  std::vector<float> logits;          // [logit_tokens.size(), n_vocab]
  // When the batch asked (ForwardBatch::want_hidden): the target features, i.e. the final
  // hidden state after the output norm, exactly what the LM head multiplies, of every logits
  // row: [logit_tokens.size(), n_embd]. Otherwise empty (n_embd 0).
  int64_t n_embd = 0;
  std::vector<float> hidden;
  // When the batch asked for layers (ForwardBatch::hidden_layers, copied here): the residual
  // stream after each of them, of every logits row: [logit_tokens.size(), hidden_layers.size(),
  // layer_width], layer_width the model's n_embd. Otherwise empty.
  std::vector<int32_t> hidden_layers;
  int64_t layer_width = 0;
  std::vector<float> layer_hidden;

  const float* LogitsRow(size_t i) const { return logits.data() + i * n_vocab; }
  const float* HiddenRow(size_t i) const { return hidden.data() + i * n_embd; }
  bool has_hidden() const { return n_embd > 0 && !hidden.empty(); }
  // Row i's output of layer `layer`; null when the pass did not capture it.
  const float* LayerHiddenRow(size_t i, int32_t layer) const {
    auto at = std::lower_bound(hidden_layers.begin(), hidden_layers.end(), layer);
    if (at == hidden_layers.end() || *at != layer || layer_hidden.empty()) return nullptr;
    const size_t k = static_cast<size_t>(at - hidden_layers.begin());
    return layer_hidden.data() + (i * hidden_layers.size() + k) * layer_width;
  }

  // For forward passes. Begin: sizes layer_hidden for `n_logits` rows of `width` floats.
  void BeginLayerHidden(const ForwardBatch& batch, int64_t n_logits, int64_t width) {
    hidden_layers = batch.hidden_layers;
    layer_width = hidden_layers.empty() ? 0 : width;
    layer_hidden.resize(static_cast<size_t>(n_logits) * hidden_layers.size() * layer_width);
  }
  // After layer `layer` ran: copies its logits rows out of the residual stream x ([tokens,
  // width], or with `compacted` the logits rows first, as the last layer leaves them) when the
  // batch asked for that layer.
  void CaptureLayerHidden(int32_t layer, const float* x, bool compacted) {
    auto at = std::lower_bound(hidden_layers.begin(), hidden_layers.end(), layer);
    if (at == hidden_layers.end() || *at != layer) return;
    const size_t k = static_cast<size_t>(at - hidden_layers.begin());
    for (size_t i = 0; i < logit_tokens.size(); ++i) {
      const float* src = x + (compacted ? i : static_cast<size_t>(logit_tokens[i])) * layer_width;
      std::memcpy(layer_hidden.data() + (i * hidden_layers.size() + k) * layer_width, src,
                  static_cast<size_t>(layer_width) * sizeof(float));
    }
  }
};

}  // namespace kiln
