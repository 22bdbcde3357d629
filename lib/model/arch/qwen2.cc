// qwen2: Qwen2 / Qwen2.5 as llama.cpp's converters write them: the llama decoder with biases on
// the Q, K and V projections (none on the output projection) and RoPE on the two halves of each
// head (NEOX).
#include "lib/model/architecture.h"
#include "lib/model/decoder.h"

namespace kiln::arch {
namespace {

class Qwen2Architecture final : public DecoderArchitecture {
 public:
  std::string_view name() const override { return "qwen2"; }
  absl::StatusOr<ModelHparams> ReadHparams(const gguf::GgufFile& file) const override {
    return ReadDecoderHparams(file, RopeMode::kNeox);
  }
  std::vector<TensorSpec> Tensors(const ModelHparams& hp) const override {
    return DecoderTensors(hp, {.qkv_bias = Presence::kRequired});
  }
};

}  // namespace

const Architecture& Qwen2() {
  static const Qwen2Architecture architecture;
  return architecture;
}

}  // namespace kiln::arch
