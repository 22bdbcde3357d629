// A loaded model: immutable after Load, thread-safe, shareable by any number of sessions.
// Weights are views into the memory-mapped GGUF file (never dequantized as a whole).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lib/common/ggml_type.h"
#include "lib/common/status.h"
#include "lib/model/hparams.h"
#include "lib/quant/quant.h"

namespace kiln {
namespace gguf {
class GgufFile;
}
class Tokenizer;

// A 2-D weight [n_out rows, n_in elements per row] (GGUF ne = {n_in, n_out}), rows contiguous.
struct WeightView {
  std::string_view name;
  const uint8_t* data = nullptr;
  GgmlType type = GgmlType::kF32;
  int64_t n_in = 0;   // ne[0]
  int64_t n_out = 0;  // ne[1] (1 for vectors)
  size_t row_bytes = 0;
  const QuantKernels* kernels = nullptr;  // never null for a loaded weight
  // Row-interleaved copy for the integer-order kernels (lib/quant/interleave.h), owned by the
  // model; null when the type has none on this CPU (and for vectors and embeddings).
  const uint8_t* interleaved = nullptr;

  const uint8_t* Row(int64_t r) const { return data + static_cast<size_t>(r) * row_bytes; }
  const float* AsF32() const { return reinterpret_cast<const float*>(data); }  // f32 vectors
};

struct LayerWeights {
  WeightView attn_norm;  // [n_embd] f32
  WeightView wq;         // [n_head * head_dim, n_embd]
  WeightView wk;         // [n_head_kv * head_dim, n_embd]
  WeightView wv;         // [n_head_kv * head_dim, n_embd]
  WeightView wo;         // [n_embd, n_head * head_dim]
  WeightView ffn_norm;   // [n_embd] f32
  WeightView ffn_gate;   // [n_ff, n_embd]
  WeightView ffn_up;     // [n_ff, n_embd]
  WeightView ffn_down;   // [n_embd, n_ff]
};

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

struct ModelLoadOptions {
  std::string path;
  bool use_mmap = true;
  // Called with progress in [0, 1]; returning false cancels the load (absl::CancelledError).
  std::function<bool(float)> progress;
  std::function<void(LogLevel, std::string_view)> log;
};

class Model {
 public:
  static absl::StatusOr<std::unique_ptr<Model>> Load(const ModelLoadOptions& options);
  ~Model();

  const ModelHparams& hparams() const { return hparams_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const gguf::GgufFile& file() const { return *file_; }
  // The model's Jinja chat template source, "" when the file has none.
  std::string_view chat_template() const { return chat_template_; }

  const WeightView& token_embd() const { return token_embd_; }  // [n_vocab, n_embd]
  const WeightView& output_norm() const { return output_norm_; }
  const WeightView& output() const { return output_; }  // token_embd when tied
  const std::vector<LayerWeights>& layers() const { return layers_; }

  uint64_t n_params() const { return n_params_; }
  uint64_t weight_bytes() const { return weight_bytes_; }  // bytes of all tensors
  // Bytes of the row-interleaved weight copies (WeightView::interleaved) the model holds.
  size_t interleaved_bytes() const { return interleaved_bytes_; }

 private:
  Model() = default;
  absl::Status BindWeights(const ModelLoadOptions& options);
  absl::Status InterleaveWeights();

  struct FreeDeleter {
    void operator()(void* p) const { std::free(p); }
  };

  std::unique_ptr<gguf::GgufFile> file_;
  ModelHparams hparams_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::string chat_template_;
  WeightView token_embd_, output_norm_, output_;
  std::vector<LayerWeights> layers_;
  uint64_t n_params_ = 0;
  uint64_t weight_bytes_ = 0;
  std::unique_ptr<uint8_t, FreeDeleter> interleaved_;  // every WeightView::interleaved copy
  size_t interleaved_bytes_ = 0;
};

}  // namespace kiln
