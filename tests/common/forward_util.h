// A model's forward pass on a CPU backend of its own, for the tests that exercise the forward
// pass itself below the engine (batch invariance, llama.cpp goldens, malformed batches).
#pragma once

#include <memory>

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

}  // namespace kiln
