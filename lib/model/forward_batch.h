// ForwardBatch: what one forward pass computes (the input of ForwardPass::Forward, which the
// engine runs). A flat list of tokens from any number of sequences: prefill chunks, decode tokens
// and speculative trees of different sessions all go in one batch.
#pragma once

#include <cstdint>
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

  void Clear() {
    tokens.clear();
    want_hidden = false;
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

  const float* LogitsRow(size_t i) const { return logits.data() + i * n_vocab; }
  const float* HiddenRow(size_t i) const { return hidden.data() + i * n_embd; }
  bool has_hidden() const { return n_embd > 0 && !hidden.empty(); }
};

}  // namespace kiln
