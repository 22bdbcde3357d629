// Architecture: everything kiln knows about one model family (`general.architecture`), behind one
// interface, and the registry that finds it. Adding a family is one file under arch/ plus one
// line in architecture.cc (docs/architecture.md walks through it).
//
// An architecture provides:
//   - its hyper-parameters, read from the GGUF keys (and written back for kiln-mkmodel);
//   - the tensor table: the one place tensor names and shapes are written; the loader binds it
//     and kiln-mkmodel writes random models from it;
//   - the cache layout its attention needs (GQA rows per KV head, or MLA latent rows);
//   - its forward pass on a Backend.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lib/backend/backend.h"
#include "lib/common/ggml_type.h"
#include "lib/common/status.h"
#include "lib/kv/kv_cache.h"
#include "lib/model/forward_batch.h"
#include "lib/model/hparams.h"

namespace kiln {
namespace gguf {
class GgufFile;
class GgufWriter;
}  // namespace gguf
class Model;

// Which attention form an MLA model's (deepseek2's) causal tokens take; other families ignore it.
// Tree nodes and the llama.cpp numeric order always run absorbed.
enum class MlaPrefillMode {
  // Every token absorbed (W_UK folded into the query, W_UV into the output): a token's bits never
  // depend on its prompt's chunking or batch. The default.
  kAbsorbed,
  // By the sequence's own chunk and context sizes (ChooseDecompressed in mla_forward.h): long
  // prompt chunks decompressed, faster, but a token's last bits then depend on its chunking.
  kMeasured,
  // Every causal sequence decompressed, a one-token decode step too (tests and benchmarks).
  kDecompressed,
};

// Engine-level choices a forward pass is built with (EngineOptions carries them).
struct ForwardOptions {
  MlaPrefillMode mla_prefill = MlaPrefillMode::kAbsorbed;
};

enum class TensorRole {
  kEmbedding,  // gathered by row (any type with kernels), never multiplied in kiln's order
  kMatrix,     // multiplied (any type with kernels); prepared by the backend
  kVector,     // norm weights and biases: f32 only
};

// One entry of the tensor table: a tensor named `name` with ggml shape {n_in, n_out} (n_out = 1
// for vectors), or {n_in, n_out, n_mat} for a stack of n_mat matrices (one per head or expert),
// which binds as one matrix of n_out·n_mat rows (matrix m is rows m·n_out .. (m + 1)·n_out - 1).
struct TensorSpec {
  std::string name;
  int64_t n_in = 0;
  int64_t n_out = 1;
  TensorRole role = TensorRole::kMatrix;
  bool optional = false;  // the file may omit it (the forward pass then does without)
  int64_t n_mat = 1;
};

// A model's forward pass on one backend: scratch memory and the per-batch state.
class ForwardPass {
 public:
  virtual ~ForwardPass() = default;

  // Runs the batch. Preconditions checked (InvalidArgument/OutOfRange naming the token index):
  // token ids in range, sequences present in `cache` with cache_index < Length, tree parents
  // earlier in the batch and of the same sequence, pos >= 0, the cache's layout the model's.
  // Writes each token's K/V into its slot and marks causal tokens computed in the cache. Logits
  // of the tokens that asked go to `out`.
  //
  // Batch invariance (kiln's numeric order): each token's outputs are bitwise identical whatever
  // else is in the batch and whatever the thread count.
  //
  // Not thread-safe: one Forward at a time per object (the engine serializes them).
  virtual absl::Status Forward(const ForwardBatch& batch, KvCache& cache, ForwardOutput* out) = 0;

  // The same pass spread over several calls (a host that spends a few milliseconds per frame):
  // Begin checks and prepares the batch (Forward's checks and errors) and gathers the
  // embeddings, RunLayers(until) runs layers [next_layer(), until), RunHead(until) (after every
  // layer) computes the output head's logits of the vocabulary rows [next_head_row(), until),
  // and Finish runs the rest of the head and marks tokens computed as Forward does. Forward is
  // Begin + RunLayers(n_layers()) + Finish on a state of its own, and the bits are Forward's
  // whatever the split.
  //
  // Between the calls the caller may run Forward (other sequences) and change the cache, except
  // the batch's sequences: their slots and blocks must stay as Begin saw them. `batch`, `cache`
  // and `out` must outlive the split pass. Begin abandons a split pass in progress.
  virtual absl::Status Begin(const ForwardBatch& batch, KvCache& cache, ForwardOutput* out) = 0;
  virtual absl::Status RunLayers(int32_t until) = 0;
  // `until` is clamped to head_rows(); below it, it must be a multiple of kMatMulRowAlign
  // (InvalidArgument). FailedPrecondition before every layer ran.
  virtual absl::Status RunHead(int64_t until) = 0;
  virtual absl::Status Finish() = 0;
  virtual int32_t n_layers() const = 0;
  // The first layer RunLayers runs next (n_layers(): the head is next).
  virtual int32_t next_layer() const = 0;
  // The split pass's head in rows (after Begin): its vocabulary, or 0 when Finish runs the head
  // whole (no token wants logits; the llama.cpp order, whose matmuls are whole; a pass that does
  // not split its head).
  virtual int64_t head_rows() const = 0;
  // The first head row RunHead computes next (head_rows(): only Finish is left).
  virtual int64_t next_head_row() const = 0;
  // Head rows whose weights weigh about as much as one layer's (a multiple of kMatMulRowAlign):
  // what a budgeted step runs as one unit. The head of a large vocabulary is many layers' worth
  // of weights, too long for one unit of a frame's budget.
  virtual int64_t head_unit_rows() const = 0;

  virtual Backend& backend() = 0;
};

// The batch preconditions every ForwardPass checks (those listed at Forward, but the layout):
// non-empty, token ids in [0, n_vocab), pos >= 0, sequences present in `cache` with
// cache_index < Length, tree parents earlier in the batch, of the same sequence and before
// their children in the cache, hidden_layers ascending layers of the cache's layout.
// InvalidArgument / OutOfRange naming the token index (or the hidden layer).
absl::Status CheckBatchTokens(const ForwardBatch& batch, const KvCache& cache, int64_t n_vocab);

class Architecture {
 public:
  virtual ~Architecture() = default;

  // The `general.architecture` value this serves ("llama").
  virtual std::string_view name() const = 0;

  // Reads and validates the hyper-parameters; errors name the key.
  virtual absl::StatusOr<ModelHparams> ReadHparams(const gguf::GgufFile& file) const = 0;
  // Writes the keys ReadHparams reads (random-weight models).
  virtual void WriteHparams(const ModelHparams& hp, gguf::GgufWriter* writer) const = 0;

  // Every tensor the forward pass reads, in file order.
  virtual std::vector<TensorSpec> Tensors(const ModelHparams& hp) const = 0;

  // The cache layout for K/V elements of `kv_type`.
  virtual absl::StatusOr<KvLayout> CacheLayout(const ModelHparams& hp, GgmlType kv_type,
                                               int32_t block_size) const = 0;
  // The same for a kernel order (what the engine calls): CacheLayout's, unless the family's
  // llama.cpp graph keeps its K/V in another form in that order.
  virtual absl::StatusOr<KvLayout> CacheLayoutForOrder(const ModelHparams& hp, GgmlType kv_type,
                                                       int32_t block_size,
                                                       bool llama_cpp_order) const {
    (void)llama_cpp_order;
    return CacheLayout(hp, kv_type, block_size);
  }

  // A forward pass of `model` on `backend` (both must outlive it).
  virtual absl::StatusOr<std::unique_ptr<ForwardPass>> NewForward(const Model& model,
                                                                  Backend& backend) const = 0;
  // The same with the engine's options (what the engine calls); families without such choices
  // keep this default, NewForward.
  virtual absl::StatusOr<std::unique_ptr<ForwardPass>> NewForwardWithOptions(
      const Model& model, Backend& backend, const ForwardOptions& options) const {
    (void)options;
    return NewForward(model, backend);
  }

  // The chat template (a family name ParseChatTemplate accepts) for files of this family that
  // carry none in tokenizer.chat_template; "" when there is no family default.
  virtual std::string_view default_chat_template() const { return ""; }
};

// The architecture registered for `name`, or nullptr.
const Architecture* FindArchitecture(std::string_view name);
// Every registered name, in registry order ("llama, qwen2" in messages).
std::vector<std::string_view> ArchitectureNames();

}  // namespace kiln
