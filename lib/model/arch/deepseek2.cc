// deepseek2: DeepSeek-V2 / V2-Lite / V3 with Multi-head Latent Attention (MLA), as llama.cpp's
// converter writes them. Per layer and token x (after attn_norm):
//   q        = attn_q_b(rmsnorm(attn_q_a(x)) · attn_q_a_norm)      (q-LoRA; or attn_q(x))
//              → per head [nope_dim | rope_dim], the rope part rotated (NORM pairs)
//   [c | kr] = attn_kv_a_mqa(x): c the latent (kv_lora_rank), kr the one rotated key all heads
//              share (rope_dim); c = rmsnorm(c) · attn_kv_a_norm
//   per head h: k_h = [attn_k_b_h(c) | rope(kr)], v_h = attn_v_b_h(c)   (or attn_kv_b, split)
//   out      = attn_output(concat_h softmax(q_h·k_h · scale) v_h)
// The cache keeps only [c | rope(kr)] per token per layer (KvLayout::Mla). The feed-forward is
// SwiGLU for the first leading_dense_block_count layers; the others are mixture-of-experts
// (moe_ffn.h: routed experts, shared experts, softmax or sigmoid gating, expert groups).
//
// YaRN rope scaling (rope.scaling.type "yarn", factor s, original_context_length,
// yarn_log_multiplier g as the converter writes it, i.e. 0.1 · DeepSeek's mscale_all_dim) follows
// llama.cpp's deepseek2 arithmetic: with L = g / 0.1 and a = rope.scaling.attn_factor (default 1)
//   rope attn_factor  = a / (1 + 0.1 ln s)   when L != 0,   a   when L == 0
//   (the rotation multiplies cos/sin by attn_factor · (1 + 0.1 ln s), as ggml's rope_yarn does)
//   attention scale   = mscale² / sqrt(qk_head_dim),
//   mscale            = attn_factor · (1 + 0.1 ln s) · (1 + 0.1 · L · ln s).
//
// Not supported (refused with Unimplemented naming the key): attention temperature scaling, rope
// scaling other than YaRN, gating functions other than softmax and sigmoid, fused
// ffn_gate_up_exps.
#include <cmath>
#include <cstdlib>

#include "lib/gguf/gguf.h"
#include "lib/gguf/gguf_writer.h"
#include "lib/model/architecture.h"
#include "lib/model/mla_forward.h"
#include "lib/model/moe_ffn.h"

namespace kiln::arch {
namespace {

constexpr int64_t kMaxDim = 1 << 20;

absl::StatusOr<int64_t> ReadInt(const gguf::GgufFile& f, const std::string& key, int64_t min_value,
                                int64_t max_value) {
  KILN_ASSIGN_OR_RETURN(uint64_t v, f.GetUint(key));
  if (v < static_cast<uint64_t>(min_value) || v > static_cast<uint64_t>(max_value)) {
    return absl::InvalidArgumentError(
        StrCat("model: ", key, " = ", v, " is outside [", min_value, ", ", max_value, "]"));
  }
  return static_cast<int64_t>(v);
}

absl::StatusOr<int64_t> ReadOptionalInt(const gguf::GgufFile& f, const std::string& key,
                                        int64_t fallback, int64_t min_value, int64_t max_value) {
  if (f.FindKey(key) == nullptr) return fallback;
  return ReadInt(f, key, min_value, max_value);
}

absl::StatusOr<float> ReadOptionalFloat(const gguf::GgufFile& f, const std::string& key,
                                        float fallback) {
  if (f.FindKey(key) == nullptr) return fallback;
  KILN_ASSIGN_OR_RETURN(double v, f.GetFloat(key));
  if (!std::isfinite(v))
    return absl::InvalidArgumentError(StrCat("model: ", key, " is not finite"));
  return static_cast<float>(v);
}

class Deepseek2Architecture final : public Architecture {
 public:
  std::string_view name() const override { return "deepseek2"; }

  absl::StatusOr<ModelHparams> ReadHparams(const gguf::GgufFile& file) const override {
    ModelHparams hp;
    hp.arch = "deepseek2";
    if (auto name = file.GetString("general.name"); name.ok()) hp.name = std::string(*name);
    const std::string p = hp.arch + ".";
    KILN_ASSIGN_OR_RETURN(hp.n_layer, ReadInt(file, p + "block_count", 1, 4096));
    KILN_ASSIGN_OR_RETURN(hp.n_embd, ReadInt(file, p + "embedding_length", 1, kMaxDim));
    KILN_ASSIGN_OR_RETURN(hp.n_ff, ReadInt(file, p + "feed_forward_length", 1, 4 * kMaxDim));
    KILN_ASSIGN_OR_RETURN(hp.n_head, ReadInt(file, p + "attention.head_count", 1, 4096));
    KILN_ASSIGN_OR_RETURN(hp.n_ctx_train, ReadInt(file, p + "context_length", 1, 1 << 24));
    hp.n_head_kv = hp.n_head;  // after decompression every head has its own K and V
    KILN_ASSIGN_OR_RETURN(hp.rms_eps,
                          ReadOptionalFloat(file, p + "attention.layer_norm_rms_epsilon", 1e-6f));
    if (!(hp.rms_eps > 0.0f && hp.rms_eps < 1.0f)) {
      return absl::InvalidArgumentError(
          StrCat("model: ", p, "attention.layer_norm_rms_epsilon outside (0, 1)"));
    }
    KILN_ASSIGN_OR_RETURN(auto tokens, file.GetStringArray("tokenizer.ggml.tokens"));
    hp.n_vocab = static_cast<int64_t>(tokens.size());
    if (hp.n_vocab == 0) return absl::InvalidArgumentError("model: empty tokenizer.ggml.tokens");

    MlaHparams& mla = hp.mla;
    KILN_ASSIGN_OR_RETURN(mla.kv_lora_rank,
                          ReadInt(file, p + "attention.kv_lora_rank", 1, kMaxDim));
    KILN_ASSIGN_OR_RETURN(mla.q_lora_rank,
                          ReadOptionalInt(file, p + "attention.q_lora_rank", 0, 0, kMaxDim));
    KILN_ASSIGN_OR_RETURN(mla.rope_dim, ReadInt(file, p + "rope.dimension_count", 2, 4096));
    if (mla.rope_dim % 2 != 0) {
      return absl::InvalidArgumentError(
          StrCat("model: ", p, "rope.dimension_count = ", mla.rope_dim, " is odd"));
    }
    // Files converted for absorbed MLA carry the decompressed head sizes as *_length_mla (their
    // key_length/value_length describe the latent: kv_lora_rank + rope, kv_lora_rank) and split
    // attn_kv_b into attn_k_b and attn_v_b; older files carry the head sizes as key_length and
    // value_length and the combined attn_kv_b.
    mla.split_kv_b = file.FindKey(p + "attention.key_length_mla") != nullptr;
    const std::string k_key =
        p + (mla.split_kv_b ? "attention.key_length_mla" : "attention.key_length");
    const std::string v_key =
        p + (mla.split_kv_b ? "attention.value_length_mla" : "attention.value_length");
    KILN_ASSIGN_OR_RETURN(const int64_t qk_head_dim, ReadInt(file, k_key, 1, 4096));
    KILN_ASSIGN_OR_RETURN(mla.v_head_dim, ReadInt(file, v_key, 1, 4096));
    mla.nope_dim = qk_head_dim - mla.rope_dim;
    if (mla.nope_dim < 1) {
      return absl::InvalidArgumentError(StrCat("model: ", k_key, " = ", qk_head_dim,
                                               " leaves no unrotated part next to "
                                               "rope.dimension_count = ",
                                               mla.rope_dim));
    }
    hp.head_dim = qk_head_dim;
    KILN_ASSIGN_OR_RETURN(mla.n_layer_dense_lead,
                          ReadOptionalInt(file, p + "leading_dense_block_count", 0, 0, hp.n_layer));
    if (mla.n_layer_dense_lead < hp.n_layer) {
      KILN_ASSIGN_OR_RETURN(hp.moe, ReadMoeHparams(file, p, mla.n_layer_dense_lead));
    }
    if (file.FindKey(p + "attention.temperature_scale") != nullptr) {
      return absl::UnimplementedError(
          StrCat("model: ", p, "attention.temperature_scale is not supported for deepseek2"));
    }

    RopeConfig& r = hp.rope;
    r.mode = RopeMode::kNorm;
    r.n_rot = static_cast<int32_t>(mla.rope_dim);
    KILN_ASSIGN_OR_RETURN(r.freq_base, ReadOptionalFloat(file, p + "rope.freq_base", 10000.0f));
    if (!(r.freq_base > 1.0f)) {
      return absl::InvalidArgumentError(StrCat("model: ", p, "rope.freq_base must be > 1"));
    }
    r.orig_ctx = static_cast<int32_t>(hp.n_ctx_train);
    std::string scaling = "none";
    if (file.FindKey(p + "rope.scaling.type") != nullptr) {
      KILN_ASSIGN_OR_RETURN(std::string_view s, file.GetString(p + "rope.scaling.type"));
      scaling = std::string(s);
    }
    if (scaling == "yarn") {
      KILN_ASSIGN_OR_RETURN(const float factor,
                            ReadOptionalFloat(file, p + "rope.scaling.factor", 1.0f));
      if (!(factor >= 1.0f)) {
        return absl::InvalidArgumentError(StrCat("model: ", p, "rope.scaling.factor must be >= 1"));
      }
      KILN_ASSIGN_OR_RETURN(const int64_t orig_ctx,
                            ReadOptionalInt(file, p + "rope.scaling.original_context_length",
                                            hp.n_ctx_train, 1, 1 << 24));
      r.scaling = RopeScaling::kYarn;
      r.freq_scale = 1.0f / factor;
      r.orig_ctx = static_cast<int32_t>(orig_ctx);
      r.ext_factor = 1.0f;
      r.attn_factor = 1.0f;
      KILN_ASSIGN_OR_RETURN(r.beta_fast,
                            ReadOptionalFloat(file, p + "rope.scaling.yarn_beta_fast", 32.0f));
      KILN_ASSIGN_OR_RETURN(r.beta_slow,
                            ReadOptionalFloat(file, p + "rope.scaling.yarn_beta_slow", 1.0f));
      KILN_ASSIGN_OR_RETURN(mla.yarn_log_mul,
                            ReadOptionalFloat(file, p + "rope.scaling.yarn_log_multiplier", 0.0f));
      KILN_ASSIGN_OR_RETURN(const float attn_factor,
                            ReadOptionalFloat(file, p + "rope.scaling.attn_factor", 1.0f));
      if (!(attn_factor > 0.0f)) {
        return absl::InvalidArgumentError(
            StrCat("model: ", p, "rope.scaling.attn_factor must be > 0"));
      }
      // llama.cpp's arithmetic, in its float order (see the top of the file).
      const float s = 1.0f / r.freq_scale;
      const float log_mul = mla.yarn_log_mul / 0.1f;
      r.attn_factor = log_mul != 0.0f ? 1.0f : (s <= 1.0f ? 1.0f : 0.1f * std::log(s) + 1.0f);
      r.attn_factor *= 1.0f / (1.0f + 0.1f * std::log(s));
      r.attn_factor *= attn_factor;
      mla.attn_mscale =
          r.attn_factor * (1.0f + 0.1f * std::log(s)) * (1.0f + 0.1f * log_mul * std::log(s));
    } else if (scaling != "none") {
      return absl::UnimplementedError(StrCat("model: ", p, "rope.scaling.type = '", scaling,
                                             "' is not supported for deepseek2 (none, yarn)"));
    } else if (file.FindKey(p + "rope.scaling.attn_factor") != nullptr) {
      return absl::UnimplementedError(StrCat("model: ", p,
                                             "rope.scaling.attn_factor without YaRN scaling is "
                                             "not supported for deepseek2"));
    }
    hp.tied_output = file.FindTensor("output.weight") == nullptr;
    return hp;
  }

  void WriteHparams(const ModelHparams& hp, gguf::GgufWriter* w) const override {
    const std::string p = hp.arch + ".";
    const MlaHparams& mla = hp.mla;
    auto u32 = [](int64_t v) { return static_cast<uint32_t>(v); };
    w->SetUint32(p + "block_count", u32(hp.n_layer));
    w->SetUint32(p + "context_length", u32(hp.n_ctx_train));
    w->SetUint32(p + "embedding_length", u32(hp.n_embd));
    w->SetUint32(p + "feed_forward_length", u32(hp.n_ff));
    w->SetUint32(p + "attention.head_count", u32(hp.n_head));
    w->SetFloat32(p + "rope.freq_base", hp.rope.freq_base);
    w->SetFloat32(p + "attention.layer_norm_rms_epsilon", hp.rms_eps);
    w->SetUint32(p + "vocab_size", u32(hp.n_vocab));
    w->SetUint32(p + "rope.dimension_count", u32(mla.rope_dim));
    // llama.cpp reads q_lora_rank unless the block count is a V2-Lite one; 0 means no q-LoRA.
    w->SetUint32(p + "attention.q_lora_rank", u32(mla.q_lora_rank));
    w->SetUint32(p + "attention.kv_lora_rank", u32(mla.kv_lora_rank));
    if (mla.split_kv_b) {  // as the current converter writes it (see ReadHparams)
      w->SetUint32(p + "attention.head_count_kv", 1);
      w->SetUint32(p + "attention.key_length", u32(mla.kv_lora_rank + mla.rope_dim));
      w->SetUint32(p + "attention.value_length", u32(mla.kv_lora_rank));
      w->SetUint32(p + "attention.key_length_mla", u32(mla.qk_head_dim()));
      w->SetUint32(p + "attention.value_length_mla", u32(mla.v_head_dim));
    } else {
      w->SetUint32(p + "attention.head_count_kv", u32(hp.n_head));
      w->SetUint32(p + "attention.key_length", u32(mla.qk_head_dim()));
      w->SetUint32(p + "attention.value_length", u32(mla.v_head_dim));
    }
    w->SetUint32(p + "leading_dense_block_count", u32(mla.n_layer_dense_lead));
    if (hp.moe.n_expert > 0) {
      WriteMoeHparams(hp.moe, p, w);
    } else {
      // llama.cpp requires the expert keys even when every layer is dense.
      w->SetUint32(p + "expert_feed_forward_length", u32(hp.n_ff));
      w->SetUint32(p + "expert_shared_count", 0);
    }
    if (hp.rope.scaling == RopeScaling::kYarn) {
      w->SetString(p + "rope.scaling.type", "yarn");
      w->SetFloat32(p + "rope.scaling.factor", 1.0f / hp.rope.freq_scale);
      w->SetUint32(p + "rope.scaling.original_context_length", u32(hp.rope.orig_ctx));
      w->SetFloat32(p + "rope.scaling.yarn_log_multiplier", mla.yarn_log_mul);
    }
  }

  std::vector<TensorSpec> Tensors(const ModelHparams& hp) const override {
    const MlaHparams& mla = hp.mla;
    const int64_t n_embd = hp.n_embd, n_head = hp.n_head;
    std::vector<TensorSpec> t;
    t.push_back({"token_embd.weight", n_embd, hp.n_vocab, TensorRole::kEmbedding});
    t.push_back({"output_norm.weight", n_embd, 1, TensorRole::kVector});
    if (!hp.tied_output) t.push_back({"output.weight", n_embd, hp.n_vocab});
    for (int64_t l = 0; l < hp.n_layer; ++l) {
      const std::string b = StrCat("blk.", l, ".");
      t.push_back({b + "attn_norm.weight", n_embd, 1, TensorRole::kVector});
      if (mla.q_lora_rank > 0) {
        t.push_back({b + "attn_q_a.weight", n_embd, mla.q_lora_rank});
        t.push_back({b + "attn_q_a_norm.weight", mla.q_lora_rank, 1, TensorRole::kVector});
        t.push_back({b + "attn_q_b.weight", mla.q_lora_rank, n_head * mla.qk_head_dim()});
      } else {
        t.push_back({b + "attn_q.weight", n_embd, n_head * mla.qk_head_dim()});
      }
      t.push_back({b + "attn_kv_a_mqa.weight", n_embd, mla.kv_lora_rank + mla.rope_dim});
      t.push_back({b + "attn_kv_a_norm.weight", mla.kv_lora_rank, 1, TensorRole::kVector});
      if (mla.split_kv_b) {
        // Per head: W_UK maps an unrotated query part onto the latent (the absorbed direction),
        // W_UV the latent onto a value head.
        t.push_back({.name = b + "attn_k_b.weight",
                     .n_in = mla.nope_dim,
                     .n_out = mla.kv_lora_rank,
                     .n_mat = n_head});
        t.push_back({.name = b + "attn_v_b.weight",
                     .n_in = mla.kv_lora_rank,
                     .n_out = mla.v_head_dim,
                     .n_mat = n_head});
      } else {
        // Per head h, rows h·(nope + v) ..: its nope key rows, then its value rows.
        t.push_back(
            {b + "attn_kv_b.weight", mla.kv_lora_rank, n_head * (mla.nope_dim + mla.v_head_dim)});
      }
      t.push_back({b + "attn_output.weight", n_head * mla.v_head_dim, n_embd});
      t.push_back({b + "ffn_norm.weight", n_embd, 1, TensorRole::kVector});
      if (l >= mla.n_layer_dense_lead) {
        AppendMoeTensors(hp, l, &t);
        continue;
      }
      t.push_back({b + "ffn_gate.weight", n_embd, hp.n_ff});
      t.push_back({b + "ffn_up.weight", n_embd, hp.n_ff});
      t.push_back({b + "ffn_down.weight", hp.n_ff, n_embd});
    }
    return t;
  }

  absl::StatusOr<KvLayout> CacheLayout(const ModelHparams& hp, GgmlType kv_type,
                                       int32_t block_size) const override {
    return KvLayout::Mla(static_cast<int32_t>(hp.n_layer),
                         static_cast<int32_t>(hp.mla.kv_lora_rank),
                         static_cast<int32_t>(hp.mla.rope_dim), kv_type, block_size);
  }

  // llama.cpp runs a file with the combined attn_kv_b as ordinary multi-head attention over the
  // decompressed K and V (deepseek2.cpp's non-MLA branch), so the llama.cpp order caches those
  // (MlaMhaCacheLayout); a q8_0 cache keeps the latent rows and kiln's absorbed form, as with
  // split attn_k_b/attn_v_b (llama.cpp's quantized caches need its flash attention).
  absl::StatusOr<KvLayout> CacheLayoutForOrder(const ModelHparams& hp, GgmlType kv_type,
                                               int32_t block_size,
                                               bool llama_cpp_order) const override {
    if (llama_cpp_order && !hp.mla.split_kv_b && kv_type != GgmlType::kQ8_0) {
      return MlaMhaCacheLayout(hp, kv_type, block_size);
    }
    return CacheLayout(hp, kv_type, block_size);
  }

  absl::StatusOr<std::unique_ptr<ForwardPass>> NewForward(const Model& model,
                                                          Backend& backend) const override {
    return NewForwardWithOptions(model, backend, ForwardOptions{});
  }

  // Absorbed unless options.mla_prefill asks otherwise: the measured choice is faster for long
  // prompt chunks but gives up the bitwise chunking guarantees (docs/numerics.md).
  absl::StatusOr<std::unique_ptr<ForwardPass>> NewForwardWithOptions(
      const Model& model, Backend& backend, const ForwardOptions& options) const override {
    return NewMlaForward(model, backend, options.mla_prefill);
  }
};

}  // namespace

const Architecture& Deepseek2() {
  static const Deepseek2Architecture architecture;
  return architecture;
}

}  // namespace kiln::arch
