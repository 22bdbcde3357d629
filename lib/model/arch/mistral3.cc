// mistral3: the text decoder llama.cpp's converter writes as "mistral3" for Mistral-format
// models with Llama-4 attention scaling (Ministral 3 and later); older Mistral models (Mistral
// 7B, Nemo, Small 3.x) are written as "llama" and run by arch/llama.cc. The llama block with a
// head dimension of its own (attention.key_length, e.g. 128 with n_embd 5120 and 32 heads),
// RoPE on adjacent pairs (NORM), optional attention-output bias, and the queries of positions
// p >= rope.scaling.original_context_length multiplied by
// 1 + attention.temperature_scale * log(floor(p / original_context_length) + 1).
// Not supported (refused with Unimplemented naming the key or tensor): rope scaling (Ministral 3
// ships YaRN with yarn_log_multiplier), attention.scale, feed-forward biases, mixture of experts.
#include "lib/gguf/gguf.h"
#include "lib/gguf/gguf_writer.h"
#include "lib/model/architecture.h"
#include "lib/model/decoder.h"

namespace kiln::arch {
namespace {

class Mistral3Architecture final : public DecoderArchitecture {
 public:
  std::string_view name() const override { return "mistral3"; }

  absl::StatusOr<ModelHparams> ReadHparams(const gguf::GgufFile& file) const override {
    KILN_ASSIGN_OR_RETURN(ModelHparams hp, ReadDecoderHparams(file, RopeMode::kNorm));
    const std::string p = hp.arch + ".";
    if (hp.rope.scaling != RopeScaling::kNone) {
      return absl::UnimplementedError(
          StrCat("model: ", p, "rope.scaling.type: rope scaling is not supported for mistral3"));
    }
    for (const char* key : {"attention.scale", "expert_count"}) {
      if (file.FindKey(p + key) != nullptr) {
        return absl::UnimplementedError(StrCat("model: ", p, key, " is not supported"));
      }
    }
    for (const char* tensor : {"ffn_gate.bias", "ffn_up.bias", "ffn_down.bias"}) {
      if (file.FindTensor(StrCat("blk.0.", tensor)) != nullptr) {
        return absl::UnimplementedError(
            StrCat("model: mistral3 feed-forward biases (blk.0.", tensor, ") are not supported"));
      }
    }
    if (file.FindKey(p + "attention.temperature_scale") != nullptr) {
      KILN_ASSIGN_OR_RETURN(double scale, file.GetFloat(p + "attention.temperature_scale"));
      if (!(scale >= 0.0 && scale < 1e3)) {
        return absl::InvalidArgumentError(
            StrCat("model: ", p, "attention.temperature_scale = ", scale, " is out of range"));
      }
      hp.attn_temperature_scale = static_cast<float>(scale);
    }
    return hp;
  }

  void WriteHparams(const ModelHparams& hp, gguf::GgufWriter* writer) const override {
    WriteDecoderHparams(hp, writer);
    const std::string p = hp.arch + ".";
    writer->SetUint32(p + "attention.key_length", static_cast<uint32_t>(hp.head_dim));
    writer->SetUint32(p + "attention.value_length", static_cast<uint32_t>(hp.head_dim));
    if (hp.attn_temperature_scale > 0.0f) {
      writer->SetFloat32(p + "attention.temperature_scale", hp.attn_temperature_scale);
      writer->SetUint32(p + "rope.scaling.original_context_length",
                        static_cast<uint32_t>(hp.rope.orig_ctx));
    }
  }

  std::vector<TensorSpec> Tensors(const ModelHparams& hp) const override {
    return DecoderTensors(hp, {.output_bias = Presence::kOptional});
  }

  DecoderGraph Graph(const ModelHparams& hp) const override {
    DecoderGraph graph;
    graph.attn_temperature_scale = hp.attn_temperature_scale;
    graph.attn_temperature_floor = hp.rope.orig_ctx;
    return graph;
  }
};

}  // namespace

const Architecture& Mistral3() {
  static const Mistral3Architecture architecture;
  return architecture;
}

}  // namespace kiln::arch
