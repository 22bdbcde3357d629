// Mixture-of-experts feed-forward (deepseek2's layers from leading_dense_block_count on), with
// llama.cpp's semantics (build_moe_ffn with SiLU experts and deepseek2's shared experts). Per
// token x (after ffn_norm):
//   logits = ffn_gate_inp x                                          [n_expert]
//   p      = softmax(logits) or sigmoid(logits)                      (expert_gating_func)
//   s      = p + exp_probs_b                                         (selection only, optional)
//   groups (expert_group_count > 1): the experts form n_group consecutive groups; a group scores
//           the sum of its two largest s; only the n_group_used best groups stay selectable
//   E      = the n_expert_used selectable experts of largest s, best first (ties: lower id)
//   w_e    = p_e (unbiased); divided by Σ_E p (clamped to >= 2^-14) when expert_weights_norm;
//            times expert_weights_scale
//   y      = Σ_{e in E, best first} w_e · down_e(silu(gate_e x) · up_e x)
//            + down_sh(silu(gate_sh x) · up_sh x)                    (the shared experts, fused)
// Tensors per MoE layer (ggml ne order): ffn_gate_inp {n_embd, n_expert};
// ffn_gate_exps, ffn_up_exps {n_embd, n_ff_exp, n_expert}; ffn_down_exps {n_ff_exp, n_embd,
// n_expert}; ffn_gate_shexp, ffn_up_shexp {n_embd, n_ff_exp·n_shared}; ffn_down_shexp
// {n_ff_exp·n_shared, n_embd}; exp_probs_b.bias {n_expert} (f32) when MoeHparams::has_probs_bias.
//
// Only the selected experts run: the batch's rows are grouped by expert and each expert's rows go
// through Backend::ExpertMatMul together. A token's result does not depend on the rest of its
// batch (each matmul output depends only on its weight row and activation row).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lib/backend/backend.h"
#include "lib/common/status.h"
#include "lib/gguf/gguf.h"
#include "lib/gguf/gguf_writer.h"
#include "lib/model/architecture.h"
#include "lib/model/hparams.h"

namespace kiln {

class Model;

// Reads the MoE keys `<prefix>expert_*` (prefix "deepseek2.") for a model with MoE layers, whose
// first MoE layer is `first_moe_layer` (exp_probs_b.bias there decides has_probs_bias).
// InvalidArgument naming the key for a missing or inconsistent one (used count above the expert
// count, groups that do not divide the experts, ...), Unimplemented for gating functions other
// than softmax and sigmoid.
absl::StatusOr<MoeHparams> ReadMoeHparams(const gguf::GgufFile& file, const std::string& prefix,
                                          int64_t first_moe_layer);
// Writes the keys ReadMoeHparams reads.
void WriteMoeHparams(const MoeHparams& moe, const std::string& prefix, gguf::GgufWriter* writer);
// Appends layer `layer`'s MoE tensors (the table above) to `tensors`.
void AppendMoeTensors(const ModelHparams& hp, int64_t layer, std::vector<TensorSpec>* tensors);

// Routing of `rows` tokens: logits [rows, n_expert] -> experts, weights [rows, n_expert_used]
// (best first), as described above. probs_bias: [n_expert] or null.
void RouteExperts(const MoeHparams& moe, const float* logits, const float* probs_bias, int64_t rows,
                  int32_t* experts, float* weights);

// The MoE layers of one model, bound to its tensors, with the scratch of one forward pass.
class MoeFeedForward {
 public:
  // Binds every layer l >= first_moe_layer (InvalidArgument naming a missing tensor).
  static absl::StatusOr<MoeFeedForward> Bind(const Model& model, int64_t first_moe_layer);

  // out[r, :] = y for h[r, :], r < rows, of layer `layer`.   h, out: [rows, n_embd]
  absl::Status Forward(Backend& backend, int64_t layer, const float* h, int64_t rows, float* out);

 private:
  struct Layer {
    const WeightView* gate_inp = nullptr;
    const WeightView* probs_bias = nullptr;  // null without exp_probs_b
    const WeightView *gate_exps = nullptr, *up_exps = nullptr, *down_exps = nullptr;
    const WeightView *gate_shexp = nullptr, *up_shexp = nullptr, *down_shexp = nullptr;
  };
  MoeHparams moe_;
  int64_t n_embd_ = 0;
  int64_t first_layer_ = 0;
  std::vector<Layer> layers_;  // [n_layer - first_moe_layer]
  std::vector<float> logits_, weights_, rows_in_, gate_, up_, rows_out_, expert_out_;
  std::vector<int32_t> experts_, order_, count_;
};

}  // namespace kiln
