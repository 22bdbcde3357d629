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

  // The cache layout the model's architecture needs (in the llama.cpp order when asked).
  static absl::StatusOr<KvLayout> CacheLayout(const ModelHparams& hp, GgmlType kv_type,
                                              int32_t block_size, bool llama_cpp_order = false);

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

// A cache whose layout has the model's sliding layers in groups of their own
// (KvLayout::WithSlidingGroups), so MarkComputed releases their blocks that leave every window:
// `blocks` blocks of `block_size` tokens shared by the groups. The null block's sliding-layer
// tiles are filled with NaN, so that a read through a released table entry shows in the logits.
std::unique_ptr<KvCache> MakeSlidingReleaseCache(const Model& model, GgmlType kv_type,
                                                 int32_t block_size, int32_t blocks);

// Runs the tokens of `tokens` not yet in the cache as one pass, then greedy-decodes n_new more
// one pass each, marking every pass computed. Returns each pass's last logits row, concatenated;
// `tokens` gets the decoded tokens. A failing step fails the test.
std::vector<float> GreedyDecode(CpuForward& fwd, KvCache& cache, SeqId seq,
                                std::vector<int32_t>& tokens, int n_new);

}  // namespace testing
}  // namespace kiln
