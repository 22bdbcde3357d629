// llama: the Llama family as llama.cpp's converters write it (Llama 1-3, Mistral-style and
// SmolLM files all say "llama"): MHA / GQA / MQA, RoPE on adjacent pairs (NORM) with linear,
// YaRN or llama3 scaling, optional attention biases, tied or separate output head.
#include "lib/model/architecture.h"
#include "lib/model/decoder.h"

namespace kiln::arch {
namespace {

class LlamaArchitecture final : public DecoderArchitecture {
 public:
  std::string_view name() const override { return "llama"; }
  absl::StatusOr<ModelHparams> ReadHparams(const gguf::GgufFile& file) const override {
    return ReadDecoderHparams(file, RopeMode::kNorm);
  }
  std::vector<TensorSpec> Tensors(const ModelHparams& hp) const override {
    return DecoderTensors(hp,
                          {.qkv_bias = Presence::kOptional, .output_bias = Presence::kOptional});
  }
};

}  // namespace

const Architecture& Llama() {
  static const LlamaArchitecture architecture;
  return architecture;
}

}  // namespace kiln::arch
