// A model's forward pass on a CPU backend of its own, for the tests that exercise the forward
// pass itself below the engine (batch invariance, llama.cpp goldens, malformed batches).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "lib/backend/cpu/cpu_backend.h"
#include "lib/model/architecture.h"
#include "lib/model/model.h"

namespace kiln {

class CpuForward {
 public:
  // n_threads <= 0: physical cores. The model must outlive this object.
  CpuForward(const Model& model, int n_threads);

  // The cache layout the model's architecture needs.
  static absl::StatusOr<KvLayout> CacheLayout(const ModelHparams& hp, GgmlType kv_type,
                                              int32_t block_size);

  absl::Status Forward(const ForwardBatch& batch, KvCache& cache, ForwardOutput* out);
  void set_llama_cpp_order(bool on) { backend_.set_llama_cpp_order(on); }

 private:
  cpu::CpuBackend backend_;
  absl::StatusOr<std::unique_ptr<ForwardPass>> pass_;
};

namespace testing {

// A cache of `blocks` blocks of 16 tokens with KV entries of kv_type; a failure fails the test.
std::unique_ptr<KvCache> MakeCache(const Model& model, GgmlType kv_type, int32_t blocks = 64);

// Prefills `tokens` [start, n) as one sequence in chunks of `chunk`; returns the logits of all
// of them, [n - start][n_vocab]. A failing step fails the test.
std::vector<float> Prefill(CpuForward& fwd, KvCache& cache, SeqId seq,
                           const std::vector<int32_t>& tokens, int chunk, int start = 0);

}  // namespace testing
}  // namespace kiln
