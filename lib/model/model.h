// A loaded model: immutable after Load, thread-safe, shareable by any number of engines.
// Weights are views into the memory-mapped GGUF file (never dequantized as a whole); the
// backend's prepared copies (the CPU's interleaved rows) are made once at load and owned here.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "lib/backend/backend.h"
#include "lib/backend/weight_view.h"
#include "lib/common/status.h"
#include "lib/model/architecture.h"
#include "lib/model/hparams.h"

namespace kiln {
namespace gguf {
class GgufFile;
}
class Tokenizer;

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

struct ModelLoadOptions {
  std::string path;
  bool use_mmap = true;
  // Called with progress in [0, 1]; returning false cancels the load (absl::CancelledError).
  std::function<bool(float)> progress;
  std::function<void(LogLevel, std::string_view)> log;
  // The backend whose prepared weights the model keeps (Backend::PrepareWeights); nullptr: the
  // CPU backend's.
  const Backend* backend = nullptr;
};

class Model {
 public:
  // Errors: the file's (gguf.h), Unimplemented for an architecture kiln cannot run (naming it
  // and the supported ones) or a tensor type without kernels, InvalidArgument for a missing
  // tensor or a wrong shape (naming the tensor), Cancelled from the progress callback.
  static absl::StatusOr<std::unique_ptr<Model>> Load(const ModelLoadOptions& options);
  ~Model();

  // What a file needs that kiln lacks, as one message per problem (empty when kiln can run it):
  // an unknown architecture, invalid hyper-parameters, missing tensors, tensor types without
  // kernels. For `kiln info` on any valid GGUF.
  static std::vector<std::string> Unsupported(const gguf::GgufFile& file);

  const Architecture& architecture() const { return *arch_; }
  const ModelHparams& hparams() const { return hparams_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const gguf::GgufFile& file() const { return *file_; }
  // The model's Jinja chat template source; when the file has none, its architecture's default
  // family name (Architecture::default_chat_template: "gemma3"), or "".
  std::string_view chat_template() const { return chat_template_; }

  // A tensor of the architecture's table, or nullptr when the file omits an optional one.
  const WeightView* Tensor(std::string_view name) const;
  const WeightView& token_embd() const { return *Tensor("token_embd.weight"); }  // [n_vocab rows]
  const WeightView& output_norm() const { return *Tensor("output_norm.weight"); }
  // Every tensor of the architecture's table that the file holds, in the table's order.
  std::span<const WeightView> tensors() const { return tensors_; }
  // The output head: output.weight, or token_embd's rows when tied (with its own prepared copy).
  const WeightView& output() const { return output_; }

  uint64_t n_params() const { return n_params_; }
  uint64_t weight_bytes() const { return weight_bytes_; }  // bytes of all tensors
  // Bytes of the backend's prepared weight copies (WeightView::interleaved) the model holds.
  size_t interleaved_bytes() const { return prepared_ == nullptr ? 0 : prepared_->bytes(); }
  // Returns once the backend's prepared copies are all written (WeightStore::WaitUntilPrepared);
  // until then matmuls read the rows in place, with the same results.
  void WaitUntilPrepared() const {
    if (prepared_ != nullptr) prepared_->WaitUntilPrepared();
  }

 private:
  Model() = default;
  absl::Status BindTensors(const ModelLoadOptions& options);

  std::unique_ptr<gguf::GgufFile> file_;
  const Architecture* arch_ = nullptr;
  ModelHparams hparams_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::string chat_template_;
  std::vector<WeightView> tensors_;  // the architecture's table, in order (absent: data null)
  absl::flat_hash_map<std::string_view, size_t> index_;  // name -> tensors_ index
  WeightView output_;
  uint64_t n_params_ = 0;
  uint64_t weight_bytes_ = 0;
  std::unique_ptr<WeightStore> prepared_;
};

}  // namespace kiln
