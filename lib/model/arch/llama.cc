// llama: the Llama family as llama.cpp's converters write it (Llama 1-3, Mistral-style and
// SmolLM files all say "llama"): MHA / GQA / MQA, RoPE on adjacent pairs (NORM) with linear,
// YaRN or llama3 scaling, optional attention biases, tied or separate output head.
#include "lib/model/architecture.h"
#include "lib/model/decoder.h"

namespace kiln::arch {
namespace {

class LlamaArchitecture final : public Architecture {
 public:
  std::string_view name() const override { return "llama"; }
  absl::StatusOr<ModelHparams> ReadHparams(const gguf::GgufFile& file) const override {
    return ReadDecoderHparams(file, RopeMode::kNorm);
  }
  void WriteHparams(const ModelHparams& hp, gguf::GgufWriter* writer) const override {
    WriteDecoderHparams(hp, writer);
  }
  std::vector<TensorSpec> Tensors(const ModelHparams& hp) const override {
    return DecoderTensors(hp,
                          {.qkv_bias = Presence::kOptional, .output_bias = Presence::kOptional});
  }
  absl::StatusOr<KvLayout> CacheLayout(const ModelHparams& hp, GgmlType kv_type,
                                       int32_t block_size) const override {
    return GqaCacheLayout(hp, kv_type, block_size);
  }
  absl::StatusOr<std::unique_ptr<ForwardPass>> NewForward(const Model& model,
                                                          Backend& backend) const override {
    return NewDecoderForward(model, backend);
  }
};

}  // namespace

const Architecture& Llama() {
  static const LlamaArchitecture architecture;
  return architecture;
}

}  // namespace kiln::arch
