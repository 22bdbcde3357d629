// The llama-family forward pass (MHA, GQA, MQA; tied or separate output; RoPE NORM with linear,
// llama3 and YaRN scaling) on the CPU backend, reading and writing K/V through the paged cache.
#pragma once

#include <memory>
#include <vector>

#include "lib/backend/cpu/ops.h"
#include "lib/backend/cpu/thread_pool.h"
#include "lib/common/status.h"
#include "lib/engine/forward_batch.h"
#include "lib/kv/kv_cache.h"
#include "lib/model/model.h"

namespace kiln {

class LlamaForward {
 public:
  // n_threads <= 0: physical cores. The model must outlive this object.
  LlamaForward(const Model& model, int n_threads);

  // The cache layout this model needs for `kv_type` (f32, f16 or bf16).
  static absl::StatusOr<KvLayout> CacheLayout(const ModelHparams& hp, GgmlType kv_type,
                                              int32_t block_size);

  // Runs the batch. Preconditions checked (InvalidArgument/OutOfRange naming the token index):
  // token ids in range, sequences present in `cache` with cache_index < Length, tree parents
  // earlier in the batch and of the same sequence, pos >= 0. Writes each token's K/V into its
  // slot, and marks causal tokens computed in the cache. Logits and hidden states of the tokens
  // that asked go to `out`.
  //
  // Batch invariance: each token's outputs are bitwise identical whatever else is in the batch
  // and whatever the thread count (the ops guarantee it per output element).
  //
  // Not thread-safe: one Forward at a time per object (it owns scratch memory and the pool).
  absl::Status Forward(const ForwardBatch& batch, KvCache& cache, ForwardOutput* out);

  int n_threads() const { return pool_.n_threads(); }

  // Reproduce llama.cpp's CPU arithmetic exactly: the matmuls in vec_dot's order on the file's
  // rows, attention in ggml's order including its one batch-dependent step
  // (cpu::AttentionOrder: batches of two or more tokens use llama.cpp's prompt order), so a
  // prompt evaluated in one batch gives llama.cpp's bits. Off by default: kiln's order
  // (integer-order matmuls on the model's interleaved weights, cpu::AttentionOrder::
  // kBatchInvariant), faster and batch invariant; the two differ in the last bits
  // (docs/numerics.md).
  void set_llama_cpp_order(bool on) { llama_cpp_order_ = on; }
  bool llama_cpp_order() const { return llama_cpp_order_; }

 private:
  absl::Status Validate(const ForwardBatch& batch, const KvCache& cache);
  absl::Status BuildAttention(const ForwardBatch& batch, KvCache& cache);
  void WriteKv(KvCache& cache, int32_t layer, const float* k, const float* v);

  const Model& model_;
  const ModelHparams& hp_;
  cpu::ThreadPool pool_;
  cpu::Scratch scratch_;
  cpu::RopeConfig rope_;
  bool llama_cpp_order_ = false;

  // Per-batch state, reused across calls (grows, never shrinks).
  std::vector<SeqId> seqs_;         // unique sequences in batch order
  std::vector<int32_t> token_seq_;  // [n_tokens] index into seqs_
  std::vector<KvSlot> slots_;       // [n_tokens] where each token's K/V go
  std::vector<int32_t> positions_, ids_, n_visible_, extra_indptr_, extra_positions_;
  KvTables tables_;
  cpu::RopeTable rope_table_;
  std::vector<float> x_, h_, q_, k_, v_, attn_, proj_, gate_, up_;
};

}  // namespace kiln
