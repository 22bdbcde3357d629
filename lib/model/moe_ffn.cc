#include "lib/model/moe_ffn.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "lib/backend/cpu/dispatch.h"
#include "lib/model/model.h"

namespace kiln {
namespace {

constexpr int64_t kMaxExperts = 1024;             // llama.cpp's LLAMA_MAX_EXPERTS
constexpr float kMinWeightSum = 6.103515625e-5f;  // 2^-14, llama.cpp's clamp of the weight sum

absl::StatusOr<int64_t> ReadCount(const gguf::GgufFile& f, const std::string& key,
                                  int64_t min_value, int64_t max_value) {
  KILN_ASSIGN_OR_RETURN(uint64_t v, f.GetUint(key));
  if (v < static_cast<uint64_t>(min_value) || v > static_cast<uint64_t>(max_value)) {
    return absl::InvalidArgumentError(
        StrCat("model: ", key, " = ", v, " is outside [", min_value, ", ", max_value, "]"));
  }
  return static_cast<int64_t>(v);
}

std::string Blk(int64_t layer, const char* name) { return StrCat("blk.", layer, ".", name); }

}  // namespace

absl::StatusOr<MoeHparams> ReadMoeHparams(const gguf::GgufFile& f, const std::string& p,
                                          int64_t first_moe_layer) {
  MoeHparams moe;
  KILN_ASSIGN_OR_RETURN(moe.n_expert, ReadCount(f, p + "expert_count", 1, kMaxExperts));
  KILN_ASSIGN_OR_RETURN(moe.n_expert_used, ReadCount(f, p + "expert_used_count", 1, moe.n_expert));
  // llama.cpp always builds the shared expert of a deepseek2 MoE layer.
  KILN_ASSIGN_OR_RETURN(moe.n_expert_shared,
                        ReadCount(f, p + "expert_shared_count", 1, kMaxExperts));
  KILN_ASSIGN_OR_RETURN(moe.n_ff_exp, ReadCount(f, p + "expert_feed_forward_length", 1, 1 << 22));
  int64_t gating = 0;  // absent or 0: softmax, as llama.cpp reads DeepSeek-V2 files without it
  if (f.FindKey(p + "expert_gating_func") != nullptr) {
    KILN_ASSIGN_OR_RETURN(gating, ReadCount(f, p + "expert_gating_func", 0, 4));
  }
  if (gating == 0 || gating == 1) {
    moe.gating = MoeGating::kSoftmax;
  } else if (gating == 2) {
    moe.gating = MoeGating::kSigmoid;
  } else {
    return absl::UnimplementedError(StrCat("model: ", p, "expert_gating_func = ", gating,
                                           " is not supported (1 softmax, 2 sigmoid)"));
  }
  if (f.FindKey(p + "expert_group_count") != nullptr) {
    KILN_ASSIGN_OR_RETURN(moe.n_group, ReadCount(f, p + "expert_group_count", 0, moe.n_expert - 1));
  }
  if (moe.n_group > 1) {
    if (moe.n_expert % moe.n_group != 0 || moe.n_expert / moe.n_group < 2) {
      return absl::InvalidArgumentError(StrCat("model: ", p, "expert_group_count = ", moe.n_group,
                                               " must divide ", p, "expert_count = ", moe.n_expert,
                                               " into groups of at least 2 experts"));
    }
    KILN_ASSIGN_OR_RETURN(moe.n_group_used,
                          ReadCount(f, p + "expert_group_used_count", 1, moe.n_group - 1));
    if (moe.n_group_used * (moe.n_expert / moe.n_group) < moe.n_expert_used) {
      return absl::InvalidArgumentError(
          StrCat("model: ", p, "expert_group_used_count = ", moe.n_group_used,
                 " groups hold fewer experts than ", p, "expert_used_count = ", moe.n_expert_used));
    }
  }
  if (f.FindKey(p + "expert_weights_norm") != nullptr) {
    KILN_ASSIGN_OR_RETURN(moe.weights_norm, f.GetBool(p + "expert_weights_norm"));
  }
  if (f.FindKey(p + "expert_weights_scale") != nullptr) {
    KILN_ASSIGN_OR_RETURN(const double scale, f.GetFloat(p + "expert_weights_scale"));
    if (!std::isfinite(scale) || scale < 0) {
      return absl::InvalidArgumentError(
          StrCat("model: ", p, "expert_weights_scale = ", scale, " is not a finite value >= 0"));
    }
    moe.weights_scale = scale == 0 ? 1.0f : static_cast<float>(scale);  // 0: unscaled
  }
  if (f.FindTensor(Blk(first_moe_layer, "ffn_gate_up_exps.weight")) != nullptr) {
    return absl::UnimplementedError(StrCat("model: the fused ",
                                           Blk(first_moe_layer, "ffn_gate_up_exps.weight"),
                                           " is not supported (separate gate and up experts)"));
  }
  moe.has_probs_bias = f.FindTensor(Blk(first_moe_layer, "exp_probs_b.bias")) != nullptr;
  return moe;
}

void WriteMoeHparams(const MoeHparams& moe, const std::string& p, gguf::GgufWriter* w) {
  auto u32 = [](int64_t v) { return static_cast<uint32_t>(v); };
  w->SetUint32(p + "expert_count", u32(moe.n_expert));
  w->SetUint32(p + "expert_used_count", u32(moe.n_expert_used));
  w->SetUint32(p + "expert_shared_count", u32(moe.n_expert_shared));
  w->SetUint32(p + "expert_feed_forward_length", u32(moe.n_ff_exp));
  w->SetUint32(p + "expert_gating_func", moe.gating == MoeGating::kSigmoid ? 2 : 1);
  if (moe.n_group > 1) {
    w->SetUint32(p + "expert_group_count", u32(moe.n_group));
    w->SetUint32(p + "expert_group_used_count", u32(moe.n_group_used));
  }
  w->SetBool(p + "expert_weights_norm", moe.weights_norm);
  w->SetFloat32(p + "expert_weights_scale", moe.weights_scale);
}

void AppendMoeTensors(const ModelHparams& hp, int64_t l, std::vector<TensorSpec>* t) {
  const MoeHparams& m = hp.moe;
  const int64_t d = hp.n_embd, shared_ff = m.n_ff_exp * m.n_expert_shared;
  t->push_back({Blk(l, "ffn_gate_inp.weight"), d, m.n_expert});
  if (m.has_probs_bias) {
    t->push_back({Blk(l, "exp_probs_b.bias"), m.n_expert, 1, TensorRole::kVector});
  }
  t->push_back({.name = Blk(l, "ffn_gate_exps.weight"),
                .n_in = d,
                .n_out = m.n_ff_exp,
                .n_mat = m.n_expert});
  t->push_back(
      {.name = Blk(l, "ffn_up_exps.weight"), .n_in = d, .n_out = m.n_ff_exp, .n_mat = m.n_expert});
  t->push_back({.name = Blk(l, "ffn_down_exps.weight"),
                .n_in = m.n_ff_exp,
                .n_out = d,
                .n_mat = m.n_expert});
  t->push_back({Blk(l, "ffn_gate_shexp.weight"), d, shared_ff});
  t->push_back({Blk(l, "ffn_up_shexp.weight"), d, shared_ff});
  t->push_back({Blk(l, "ffn_down_shexp.weight"), shared_ff, d});
}

void RouteExperts(const MoeHparams& m, const float* logits, const float* probs_bias, int64_t rows,
                  int32_t* experts, float* weights) {
  const int64_t n = m.n_expert, k = m.n_expert_used;
  std::vector<float> probs(static_cast<size_t>(n)), select(static_cast<size_t>(n));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  const bool grouped = m.n_group > 1;
  const int64_t per_group = grouped ? n / m.n_group : n;
  std::vector<float> group_score(static_cast<size_t>(grouped ? m.n_group : 0));
  std::vector<int32_t> group_ids(group_score.size());
  // ggml_soft_max's arithmetic (ggml_vec_soft_max_f32 of the AVX-512 build: ggml_v_expf's
  // polynomial on whole chunks of 16, each chunk's sum added to a double, then libm's expf on the
  // last n % 16 added one by one; one multiply by the inverse). The chunks are the op kernels of
  // the llama.cpp order's attention softmax, the same bits at every SIMD level (op_kernels.h).
  const cpu::OpKernels& ops = cpu::GetOpKernels(BestCpuLevel());
  const int64_t n_chunked = n - n % 16;
  for (int64_t r = 0; r < rows; ++r) {
    const float* z = logits + r * n;
    if (m.gating == MoeGating::kSoftmax) {
      const float mx = ops.max(z, n);
      double sum = ops.softmax_exp(z, mx, n_chunked, probs.data());
      for (int64_t e = n_chunked; e < n; ++e) sum += (probs[e] = std::exp(z[e] - mx));
      ops.scale(probs.data(), static_cast<float>(1.0 / sum), n);
    } else {  // ggml_vec_sigmoid_f32: libm's expf
      for (int64_t e = 0; e < n; ++e) probs[e] = 1.0f / (1.0f + std::exp(-z[e]));
    }
    for (int64_t e = 0; e < n; ++e) select[e] = probs[e] + (probs_bias ? probs_bias[e] : 0.0f);
    auto better = [&](int32_t a, int32_t b) {
      return select[a] > select[b] || (select[a] == select[b] && a < b);
    };
    if (grouped) {
      // A group's score: the sum of its two best selection scores; the other groups are masked.
      for (int64_t g = 0; g < m.n_group; ++g) {
        float best = -std::numeric_limits<float>::infinity(), second = best;
        for (int64_t e = g * per_group; e < (g + 1) * per_group; ++e) {
          if (select[e] > best) {
            second = best;
            best = select[e];
          } else if (select[e] > second) {
            second = select[e];
          }
        }
        group_score[g] = best + second;
      }
      std::iota(group_ids.begin(), group_ids.end(), 0);
      std::partial_sort(group_ids.begin(), group_ids.begin() + m.n_group_used, group_ids.end(),
                        [&](int32_t a, int32_t b) {
                          return group_score[a] > group_score[b] ||
                                 (group_score[a] == group_score[b] && a < b);
                        });
      std::vector<bool> kept(static_cast<size_t>(m.n_group), false);
      for (int64_t g = 0; g < m.n_group_used; ++g) kept[group_ids[g]] = true;
      for (int64_t e = 0; e < n; ++e) {
        if (!kept[e / per_group]) select[e] = -std::numeric_limits<float>::infinity();
      }
    }
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), better);
    double sum = 0.0;  // ggml_sum_rows adds in double
    for (int64_t j = 0; j < k; ++j) {
      experts[r * k + j] = ids[j];
      weights[r * k + j] = probs[ids[j]];
      sum += probs[ids[j]];
    }
    for (int64_t j = 0; j < k; ++j) {
      float& w = weights[r * k + j];
      if (m.weights_norm) w /= std::max(static_cast<float>(sum), kMinWeightSum);
      if (m.weights_scale != 1.0f) w *= m.weights_scale;
    }
  }
}

absl::StatusOr<MoeFeedForward> MoeFeedForward::Bind(const Model& model, int64_t first_moe_layer) {
  const ModelHparams& hp = model.hparams();
  MoeFeedForward f;
  f.moe_ = hp.moe;
  f.n_embd_ = hp.n_embd;
  f.first_layer_ = first_moe_layer;
  auto required = [&](int64_t l, const char* name) -> absl::StatusOr<const WeightView*> {
    const WeightView* w = model.Tensor(Blk(l, name));
    if (w == nullptr) {
      return absl::InvalidArgumentError(StrCat("model: missing tensor '", Blk(l, name), "'"));
    }
    return w;
  };
  for (int64_t l = first_moe_layer; l < hp.n_layer; ++l) {
    Layer L;
    KILN_ASSIGN_OR_RETURN(L.gate_inp, required(l, "ffn_gate_inp.weight"));
    if (hp.moe.has_probs_bias) {
      KILN_ASSIGN_OR_RETURN(L.probs_bias, required(l, "exp_probs_b.bias"));
    }
    KILN_ASSIGN_OR_RETURN(L.gate_exps, required(l, "ffn_gate_exps.weight"));
    KILN_ASSIGN_OR_RETURN(L.up_exps, required(l, "ffn_up_exps.weight"));
    KILN_ASSIGN_OR_RETURN(L.down_exps, required(l, "ffn_down_exps.weight"));
    KILN_ASSIGN_OR_RETURN(L.gate_shexp, required(l, "ffn_gate_shexp.weight"));
    KILN_ASSIGN_OR_RETURN(L.up_shexp, required(l, "ffn_up_shexp.weight"));
    KILN_ASSIGN_OR_RETURN(L.down_shexp, required(l, "ffn_down_shexp.weight"));
    f.layers_.push_back(L);
  }
  return f;
}

absl::Status MoeFeedForward::Forward(Backend& backend, int64_t layer, const float* h, int64_t rows,
                                     float* out) {
  if (layer < first_layer_ || layer - first_layer_ >= static_cast<int64_t>(layers_.size())) {
    return absl::InvalidArgumentError(StrCat("moe: layer ", layer, " has no experts"));
  }
  const Layer& L = layers_[static_cast<size_t>(layer - first_layer_)];
  const int64_t n_exp = moe_.n_expert, k = moe_.n_expert_used, d = n_embd_, ff = moe_.n_ff_exp,
                shared_ff = ff * moe_.n_expert_shared;
  auto grow = [](auto& v, int64_t size) {
    if (static_cast<int64_t>(v.size()) < size) v.resize(static_cast<size_t>(size));
  };
  grow(logits_, rows * n_exp);
  grow(weights_, rows * k);
  grow(experts_, rows * k);
  grow(expert_out_, rows * k * d);  // [rows, k, d]: each selected expert's weighted output
  // Router.                                                    logits: [rows, n_expert]
  KILN_RETURN_IF_ERROR(backend.MatMul(*L.gate_inp, h, rows, logits_.data()));
  RouteExperts(moe_, logits_.data(), L.probs_bias ? L.probs_bias->AsF32() : nullptr, rows,
               experts_.data(), weights_.data());
  // Group the (token, slot) pairs by expert (counting sort, token order within an expert).
  count_.assign(static_cast<size_t>(n_exp + 1), 0);
  for (int64_t i = 0; i < rows * k; ++i) ++count_[experts_[i] + 1];
  std::partial_sum(count_.begin(), count_.end(), count_.begin());
  grow(order_, rows * k);
  {
    std::vector<int32_t> next(count_.begin(), count_.end() - 1);
    for (int64_t i = 0; i < rows * k; ++i) order_[next[experts_[i]]++] = static_cast<int32_t>(i);
  }
  for (int64_t e = 0; e < n_exp; ++e) {
    const int32_t begin = count_[e], n = count_[e + 1] - begin;
    if (n == 0) continue;  // experts no token chose are never read
    grow(rows_in_, n * d);
    grow(gate_, n * ff);
    grow(up_, n * ff);
    grow(rows_out_, n * d);
    for (int32_t j = 0; j < n; ++j) {
      const int64_t token = order_[begin + j] / k;
      std::memcpy(rows_in_.data() + j * d, h + token * d, d * sizeof(float));
    }
    KILN_RETURN_IF_ERROR(
        backend.ExpertMatMul(*L.gate_exps, n_exp, e, rows_in_.data(), n, gate_.data()));
    KILN_RETURN_IF_ERROR(
        backend.ExpertMatMul(*L.up_exps, n_exp, e, rows_in_.data(), n, up_.data()));
    backend.SwiGlu(gate_.data(), up_.data(), n * ff, gate_.data());
    KILN_RETURN_IF_ERROR(
        backend.ExpertMatMul(*L.down_exps, n_exp, e, gate_.data(), n, rows_out_.data()));
    for (int32_t j = 0; j < n; ++j) {
      const int32_t pair = order_[begin + j];
      float* dst = expert_out_.data() + static_cast<int64_t>(pair) * d;
      std::memcpy(dst, rows_out_.data() + j * d, d * sizeof(float));
      backend.Scale(dst, d, weights_[pair]);
    }
  }
  // The experts' sum, best first, then the shared experts.            out: [rows, d]
  for (int64_t r = 0; r < rows; ++r) {
    float* o = out + r * d;
    std::memcpy(o, expert_out_.data() + r * k * d, d * sizeof(float));
    for (int64_t j = 1; j < k; ++j) backend.Add(o, expert_out_.data() + (r * k + j) * d, d, o);
  }
  grow(gate_, rows * shared_ff);
  grow(up_, rows * shared_ff);
  grow(rows_out_, rows * d);
  const MatMulTarget gate_up[] = {{L.gate_shexp, gate_.data()}, {L.up_shexp, up_.data()}};
  KILN_RETURN_IF_ERROR(backend.MatMulEach(h, rows, gate_up));
  backend.SwiGlu(gate_.data(), up_.data(), rows * shared_ff, gate_.data());
  KILN_RETURN_IF_ERROR(backend.MatMul(*L.down_shexp, gate_.data(), rows, rows_out_.data()));
  backend.Add(out, rows_out_.data(), rows * d, out);
  return absl::OkStatus();
}

}  // namespace kiln
