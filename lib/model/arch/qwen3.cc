// qwen3: Qwen3 (dense) as llama.cpp's converters write it: the llama decoder with every Q and K
// head RMS-normalized (attn_q_norm / attn_k_norm, [head_dim]) before RoPE on the two halves of
// each head (NEOX), no biases, a head dimension of its own (attention.key_length, e.g. 128 with
// n_embd 1024 and 16 heads), and a tied or separate output head.
#include "lib/gguf/gguf_writer.h"
#include "lib/model/architecture.h"
#include "lib/model/decoder.h"

namespace kiln::arch {
namespace {

class Qwen3Architecture final : public DecoderArchitecture {
 public:
  std::string_view name() const override { return "qwen3"; }
  absl::StatusOr<ModelHparams> ReadHparams(const gguf::GgufFile& file) const override {
    return ReadDecoderHparams(file, RopeMode::kNeox);
  }
  void WriteHparams(const ModelHparams& hp, gguf::GgufWriter* writer) const override {
    WriteDecoderHparams(hp, writer);
    const std::string p = hp.arch + ".";
    writer->SetUint32(p + "attention.key_length", static_cast<uint32_t>(hp.head_dim));
    writer->SetUint32(p + "attention.value_length", static_cast<uint32_t>(hp.head_dim));
  }
  std::vector<TensorSpec> Tensors(const ModelHparams& hp) const override {
    return DecoderTensors(hp, {.qk_norm = true});
  }
  DecoderGraph Graph(const ModelHparams& /*hp*/) const override {
    return DecoderGraph{.qk_norm = true};
  }
};

}  // namespace

const Architecture& Qwen3() {
  static const Qwen3Architecture architecture;
  return architecture;
}

}  // namespace kiln::arch
