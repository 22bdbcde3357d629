// gemma3: Gemma 3 (text) as llama.cpp's converter writes and llama.cpp runs it: the shared
// decoder with the embeddings scaled by sqrt(n_embd), RMS-normalized Q and K heads, queries
// scaled by 1/sqrt(head_dim) (1/sqrt(n_embd/n_head) for the 27B shape) before attention, extra
// norms on the attention and feed-forward outputs, a GeGLU feed-forward, NEOX RoPE, a tied
// output head, and sliding-window layers interleaved with global ones: with
// `gemma3.attention.sliding_window` set, every layer but each `sliding_window_pattern`-th
// (default 6: layers 5, 11, ... are global) sees only the last `sliding_window` positions and
// rotates with `rope.freq_base_swa` (default 10000) instead of `rope.freq_base`.
// The norm weights are used as stored: the converter already folded Gemma's (1 + w).
#include <cmath>

#include "lib/gguf/gguf.h"
#include "lib/gguf/gguf_writer.h"
#include "lib/model/architecture.h"
#include "lib/model/decoder.h"

namespace kiln::arch {
namespace {

constexpr uint32_t kDefaultSwaPattern = 6;  // llama.cpp's for gemma3
constexpr float kDefaultSwaFreqBase = 10000.0f;

class Gemma3Architecture final : public DecoderArchitecture {
 public:
  std::string_view name() const override { return "gemma3"; }

  absl::StatusOr<ModelHparams> ReadHparams(const gguf::GgufFile& file) const override {
    KILN_ASSIGN_OR_RETURN(ModelHparams hp, ReadDecoderHparams(file, RopeMode::kNeox));
    const std::string p = hp.arch + ".";
    if (file.FindKey(p + "final_logit_softcapping") != nullptr) {
      KILN_ASSIGN_OR_RETURN(double cap, file.GetFloat(p + "final_logit_softcapping"));
      if (cap != 0.0) {
        return absl::UnimplementedError(
            StrCat("model: ", p, "final_logit_softcapping (", cap, ") is not supported"));
      }
    }
    if (file.FindKey(p + "attention.sliding_window") == nullptr) return hp;
    KILN_ASSIGN_OR_RETURN(uint64_t window, file.GetUint(p + "attention.sliding_window"));
    if (window == 0) return hp;  // llama.cpp: no sliding window
    if (window > (1u << 24)) {
      return absl::InvalidArgumentError(
          StrCat("model: ", p, "attention.sliding_window = ", window, " is too large"));
    }
    hp.sliding_window = static_cast<int64_t>(window);
    uint64_t pattern = kDefaultSwaPattern;
    if (file.FindKey(p + "attention.sliding_window_pattern") != nullptr) {
      auto n = file.GetUint(p + "attention.sliding_window_pattern");
      if (!n.ok()) {
        return absl::UnimplementedError(StrCat("model: ", p,
                                               "attention.sliding_window_pattern must be an "
                                               "integer (per-layer arrays are not supported)"));
      }
      pattern = *n;
    }
    // llama.cpp's set_swa_pattern: pattern 0 makes every layer sliding; otherwise layer l is
    // sliding unless l % pattern == pattern - 1.
    hp.swa_layers.resize(static_cast<size_t>(hp.n_layer));
    for (int64_t l = 0; l < hp.n_layer; ++l) {
      hp.swa_layers[static_cast<size_t>(l)] =
          pattern == 0 || static_cast<uint64_t>(l) % pattern < pattern - 1;
    }
    hp.rope_swa = hp.rope;
    hp.rope_swa.freq_base = kDefaultSwaFreqBase;
    hp.rope_swa.freq_scale = 1.0f;
    hp.rope_swa.scaling = RopeScaling::kNone;
    hp.rope_swa.freq_factors = nullptr;
    if (file.FindKey(p + "rope.freq_base_swa") != nullptr) {
      KILN_ASSIGN_OR_RETURN(double base, file.GetFloat(p + "rope.freq_base_swa"));
      if (!(base > 1.0)) {
        return absl::InvalidArgumentError(StrCat("model: ", p, "rope.freq_base_swa must be > 1"));
      }
      hp.rope_swa.freq_base = static_cast<float>(base);
    }
    return hp;
  }

  void WriteHparams(const ModelHparams& hp, gguf::GgufWriter* writer) const override {
    WriteDecoderHparams(hp, writer);
    const std::string p = hp.arch + ".";
    writer->SetUint32(p + "attention.key_length", static_cast<uint32_t>(hp.head_dim));
    writer->SetUint32(p + "attention.value_length", static_cast<uint32_t>(hp.head_dim));
    if (hp.sliding_window > 0) {
      writer->SetUint32(p + "attention.sliding_window", static_cast<uint32_t>(hp.sliding_window));
    }
  }

  std::vector<TensorSpec> Tensors(const ModelHparams& hp) const override {
    return DecoderTensors(hp, {.qk_norm = true, .post_norms = true});
  }

  DecoderGraph Graph(const ModelHparams& hp) const override {
    DecoderGraph graph;
    graph.ffn = FfnActivation::kGeGlu;
    graph.embd_scale = std::sqrt(static_cast<float>(hp.n_embd));
    // llama.cpp: 1/sqrt(n_embd / n_head) for the 62-layer 27B model, 1/sqrt(head_dim) otherwise.
    const int64_t attn_dim = hp.n_layer == 62 ? hp.n_embd / hp.n_head : hp.head_dim;
    graph.query_scale = 1.0f / std::sqrt(static_cast<float>(attn_dim));
    graph.qk_norm = true;
    graph.post_norms = true;
    return graph;
  }

  // Gemma 3's turns ("<start_of_turn>user\n...<end_of_turn>\n", the system prompt prepended to
  // the first user turn): what its Hugging Face template renders, for GGUFs that omit it.
  std::string_view default_chat_template() const override { return "gemma3"; }
};

}  // namespace

const Architecture& Gemma3() {
  static const Gemma3Architecture architecture;
  return architecture;
}

}  // namespace kiln::arch
