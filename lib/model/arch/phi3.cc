// phi3: Phi-3 / Phi-3.5 / Phi-4 (dense) as llama.cpp's converters write them: the llama block
// with Q, K and V in one fused matrix (attn_qkv: rows Q, then K, then V), the gate and up
// projections fused into ffn_up ([n_embd -> 2 n_ff], gate rows first; SwiGLU), RoPE on the two
// halves of each head (NEOX), the queries scaled by 1/sqrt(head_dim) before attention (which
// then does not scale), and a separate or tied output head.
// `phi3.attention.sliding_window` is read by no one: llama.cpp disables Phi's sliding window
// (every layer attends to the whole context), and so does kiln, to give the same logits.
// LongRoPE (the 128k models' rope_factors_long / rope_factors_short) is not supported: such a
// file is refused with Unimplemented naming the tensor.
#include <cmath>

#include "lib/gguf/gguf.h"
#include "lib/gguf/gguf_writer.h"
#include "lib/model/architecture.h"
#include "lib/model/decoder.h"

namespace kiln::arch {
namespace {

class Phi3Architecture final : public DecoderArchitecture {
 public:
  std::string_view name() const override { return "phi3"; }

  absl::StatusOr<ModelHparams> ReadHparams(const gguf::GgufFile& file) const override {
    for (const char* tensor : {"rope_factors_long.weight", "rope_factors_short.weight"}) {
      if (file.FindTensor(tensor) != nullptr) {
        return absl::UnimplementedError(
            StrCat("model: phi3 LongRoPE (", tensor, ") is not supported"));
      }
    }
    KILN_ASSIGN_OR_RETURN(ModelHparams hp, ReadDecoderHparams(file, RopeMode::kNeox));
    if (hp.n_head * hp.head_dim != hp.n_embd) {
      return absl::InvalidArgumentError(
          StrCat("model: phi3 needs attention.head_count × head_dim = embedding_length (",
                 hp.n_head, " × ", hp.head_dim, " != ", hp.n_embd, ")"));
    }
    return hp;
  }

  void WriteHparams(const ModelHparams& hp, gguf::GgufWriter* writer) const override {
    WriteDecoderHparams(hp, writer);
    if (hp.sliding_window > 0) {  // as the converter writes it; ignored when read (see above)
      writer->SetUint32(hp.arch + ".attention.sliding_window",
                        static_cast<uint32_t>(hp.sliding_window));
    }
  }

  std::vector<TensorSpec> Tensors(const ModelHparams& hp) const override {
    return DecoderTensors(hp, {.fused_qkv = true, .fused_gate_up = true});
  }

  DecoderGraph Graph(const ModelHparams& hp) const override {
    DecoderGraph graph;
    graph.query_scale = 1.0f / std::sqrt(static_cast<float>(hp.head_dim));
    graph.fused_qkv = true;
    graph.fused_gate_up = true;
    return graph;
  }
};

}  // namespace

const Architecture& Phi3() {
  static const Phi3Architecture architecture;
  return architecture;
}

}  // namespace kiln::arch
