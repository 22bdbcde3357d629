#include "lib/model/hparams.h"

#include "lib/gguf/gguf.h"
#include "lib/gguf/gguf_writer.h"

namespace kiln {
namespace {

absl::StatusOr<int64_t> PositiveInt(const gguf::GgufFile& f, const std::string& key,
                                    int64_t max_value) {
  KILN_ASSIGN_OR_RETURN(uint64_t v, f.GetUint(key));
  if (v == 0 || v > static_cast<uint64_t>(max_value)) {
    return absl::InvalidArgumentError(
        kiln::StrCat("model: ", key, " = ", v, " is outside [1, ", max_value, "]"));
  }
  return static_cast<int64_t>(v);
}

// Optional key: the default when absent, its error when present but malformed.
template <typename T, typename Getter>
absl::StatusOr<T> Optional(const gguf::GgufFile& f, const std::string& key, T fallback,
                           Getter get) {
  if (f.FindKey(key) == nullptr) return fallback;
  auto v = get(key);
  if (!v.ok()) return v.status();
  return static_cast<T>(*v);
}

}  // namespace

absl::StatusOr<ModelHparams> ReadDecoderHparams(const gguf::GgufFile& f, RopeMode rope_mode) {
  ModelHparams hp;
  KILN_ASSIGN_OR_RETURN(std::string_view arch, f.GetString("general.architecture"));
  hp.arch = std::string(arch);
  if (auto name = f.GetString("general.name"); name.ok()) hp.name = std::string(*name);
  const std::string p = hp.arch + ".";
  constexpr int64_t kMaxDim = 1 << 20;
  KILN_ASSIGN_OR_RETURN(hp.n_layer, PositiveInt(f, p + "block_count", 4096));
  KILN_ASSIGN_OR_RETURN(hp.n_embd, PositiveInt(f, p + "embedding_length", kMaxDim));
  KILN_ASSIGN_OR_RETURN(hp.n_ff, PositiveInt(f, p + "feed_forward_length", kMaxDim * 4));
  KILN_ASSIGN_OR_RETURN(hp.n_head, PositiveInt(f, p + "attention.head_count", 4096));
  hp.n_head_kv = hp.n_head;
  if (f.FindKey(p + "attention.head_count_kv")) {
    KILN_ASSIGN_OR_RETURN(hp.n_head_kv, PositiveInt(f, p + "attention.head_count_kv", 4096));
  }
  if (hp.n_head % hp.n_head_kv != 0) {
    return absl::InvalidArgumentError(kiln::StrCat("model: attention.head_count ", hp.n_head,
                                                   " is not a multiple of head_count_kv ",
                                                   hp.n_head_kv));
  }
  KILN_ASSIGN_OR_RETURN(hp.n_ctx_train, PositiveInt(f, p + "context_length", 1 << 24));
  hp.head_dim = hp.n_embd / hp.n_head;
  if (f.FindKey(p + "attention.key_length")) {
    KILN_ASSIGN_OR_RETURN(hp.head_dim, PositiveInt(f, p + "attention.key_length", 4096));
    KILN_ASSIGN_OR_RETURN(int64_t v_len, PositiveInt(f, p + "attention.value_length", 4096));
    if (v_len != hp.head_dim) {
      return absl::UnimplementedError("model: key_length != value_length is not supported");
    }
  } else if (hp.n_embd % hp.n_head != 0) {
    return absl::InvalidArgumentError("model: embedding_length is not a multiple of head_count");
  }
  if (hp.head_dim % 2 != 0) return absl::InvalidArgumentError("model: odd head dimension");
  auto get_float = [&](const std::string& k) { return f.GetFloat(k); };
  auto get_uint = [&](const std::string& k) { return f.GetUint(k); };
  KILN_ASSIGN_OR_RETURN(
      hp.rms_eps, Optional<float>(f, p + "attention.layer_norm_rms_epsilon", 1e-5f, get_float));
  if (!(hp.rms_eps > 0.0f && hp.rms_eps < 1.0f)) {
    return absl::InvalidArgumentError("model: layer_norm_rms_epsilon outside (0, 1)");
  }
  // The vocabulary size is authoritative from the token list; llama.vocab_size is optional.
  KILN_ASSIGN_OR_RETURN(auto tokens, f.GetStringArray("tokenizer.ggml.tokens"));
  hp.n_vocab = static_cast<int64_t>(tokens.size());
  if (hp.n_vocab == 0) return absl::InvalidArgumentError("model: empty tokenizer.ggml.tokens");

  RopeConfig& r = hp.rope;
  r.mode = rope_mode;
  KILN_ASSIGN_OR_RETURN(int64_t n_rot,
                        Optional<int64_t>(f, p + "rope.dimension_count", hp.head_dim, get_uint));
  if (n_rot <= 0 || n_rot > hp.head_dim || n_rot % 2 != 0) {
    return absl::InvalidArgumentError(
        kiln::StrCat("model: rope.dimension_count ", n_rot, " invalid for head_dim ", hp.head_dim));
  }
  r.n_rot = static_cast<int32_t>(n_rot);
  KILN_ASSIGN_OR_RETURN(r.freq_base, Optional<float>(f, p + "rope.freq_base", 10000.0f, get_float));
  if (!(r.freq_base > 1.0f)) return absl::InvalidArgumentError("model: rope.freq_base must be > 1");
  r.orig_ctx = static_cast<int32_t>(hp.n_ctx_train);
  float factor = 1.0f;
  if (f.FindKey(p + "rope.scaling.factor")) {
    KILN_ASSIGN_OR_RETURN(double v, f.GetFloat(p + "rope.scaling.factor"));
    factor = static_cast<float>(v);
  } else if (f.FindKey(p + "rope.scale_linear")) {
    KILN_ASSIGN_OR_RETURN(double v, f.GetFloat(p + "rope.scale_linear"));
    factor = static_cast<float>(v);
  }
  std::string scaling = factor != 1.0f ? "linear" : "none";
  if (f.FindKey(p + "rope.scaling.type")) {
    KILN_ASSIGN_OR_RETURN(std::string_view s, f.GetString(p + "rope.scaling.type"));
    scaling = std::string(s);
  }
  if (f.FindKey(p + "rope.scaling.original_context_length")) {
    KILN_ASSIGN_OR_RETURN(uint64_t v, f.GetUint(p + "rope.scaling.original_context_length"));
    r.orig_ctx = static_cast<int32_t>(v);
  }
  if (!(factor > 0.0f)) return absl::InvalidArgumentError("model: rope.scaling.factor must be > 0");
  if (scaling == "none") {
    r.scaling = RopeScaling::kNone;
  } else if (scaling == "linear") {
    r.scaling = RopeScaling::kLinear;
    r.freq_scale = 1.0f / factor;
  } else if (scaling == "yarn") {
    r.scaling = RopeScaling::kYarn;
    r.freq_scale = 1.0f / factor;
    r.ext_factor = 1.0f;
    r.attn_factor = 1.0f;
    KILN_ASSIGN_OR_RETURN(r.beta_fast,
                          Optional<float>(f, p + "rope.scaling.yarn_beta_fast", 32.0f, get_float));
    KILN_ASSIGN_OR_RETURN(r.beta_slow,
                          Optional<float>(f, p + "rope.scaling.yarn_beta_slow", 1.0f, get_float));
  } else {
    return absl::UnimplementedError(kiln::StrCat("model: rope scaling '", scaling, "'"));
  }
  // llama3-style scaling ships its per-dimension divisors as a tensor.
  if (const gguf::TensorInfo* t = f.FindTensor("rope_freqs.weight")) {
    if (t->type != 0 || t->n_elements != static_cast<uint64_t>(r.n_rot / 2)) {
      return absl::InvalidArgumentError("model: rope_freqs.weight must be f32 of n_rot/2 values");
    }
    r.freq_factors = reinterpret_cast<const float*>(t->data);
    r.scaling = RopeScaling::kLlama3;
  }
  hp.tied_output = f.FindTensor("output.weight") == nullptr;
  return hp;
}

void WriteDecoderHparams(const ModelHparams& hp, gguf::GgufWriter* w) {
  const std::string p = hp.arch + ".";
  auto u32 = [](int64_t v) { return static_cast<uint32_t>(v); };
  w->SetUint32(p + "block_count", u32(hp.n_layer));
  w->SetUint32(p + "context_length", u32(hp.n_ctx_train));
  w->SetUint32(p + "embedding_length", u32(hp.n_embd));
  w->SetUint32(p + "feed_forward_length", u32(hp.n_ff));
  w->SetUint32(p + "attention.head_count", u32(hp.n_head));
  w->SetUint32(p + "attention.head_count_kv", u32(hp.n_head_kv));
  w->SetFloat32(p + "rope.freq_base", hp.rope.freq_base);
  w->SetFloat32(p + "attention.layer_norm_rms_epsilon", hp.rms_eps);
  w->SetUint32(p + "vocab_size", u32(hp.n_vocab));
  w->SetUint32(p + "rope.dimension_count", u32(hp.rope.n_rot));
}

}  // namespace kiln
