#include "lib/spec/eagle_strategy.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lib/backend/cpu/cpu_backend.h"
#include "lib/common/strings.h"
#include "lib/gguf/gguf_writer.h"

namespace kiln::spec {
namespace {

// EAGLE-1 heads and EAGLE-3 heads (fused target layers, own LM head): distinct architecture
// names, so that a kiln that knows only the first refuses the second instead of misreading it.
constexpr std::string_view kArch = "eagle";
constexpr std::string_view kArch3 = "eagle3";

// Weight of a new head pass in the moving average of its time (about the last 10 matter).
constexpr double kDraftStepEmaWeight = 0.1;
// Per step without the head's drafts, the share of the way back to calibration 1 (Accepted).
constexpr double kCalibrationRecovery = 0.05;

template <typename T>
void Grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

// Binds tensor `name` with ggml ne `ne` ({n_in, n_out} for a matrix, {n} for a vector). Vectors
// must be f32; matrices any type the GGUF reader knows (the backend's matmul reports the rest).
absl::StatusOr<WeightView> Bind(const gguf::GgufFile& file, const std::string& path,
                                std::string_view arch, std::string_view tensor,
                                std::vector<uint64_t> ne) {
  const std::string name = kiln::StrCat(arch, ".", tensor);
  const gguf::TensorInfo* t = file.FindTensor(name);
  if (t == nullptr) {
    return absl::DataLossError(kiln::StrCat(path, ": eagle head: tensor ", name, " missing"));
  }
  if (t->ne != ne) {
    return absl::DataLossError(kiln::StrCat(path, ": eagle head: tensor ", name, " has shape [",
                                            absl::StrJoin(t->ne, ", "), "], expected [",
                                            absl::StrJoin(ne, ", "), "]"));
  }
  const bool vector = ne.size() == 1;
  if (vector && t->type != static_cast<uint32_t>(GgmlType::kF32)) {
    return absl::DataLossError(kiln::StrCat(path, ": eagle head: tensor ", name, " has type ",
                                            t->type, " (vectors are f32)"));
  }
  if (!GgmlTypeInfoOf(t->type).has_value()) {
    return absl::DataLossError(
        kiln::StrCat(path, ": eagle head: tensor ", name, " has unknown type ", t->type));
  }
  if (t->type == static_cast<uint32_t>(GgmlType::kF32)) {
    const float* f = reinterpret_cast<const float*>(t->data);
    for (uint64_t i = 0; i < t->n_elements; ++i) {
      if (!std::isfinite(f[i])) {
        return absl::DataLossError(
            kiln::StrCat(path, ": eagle head: tensor ", name, " is not finite at ", i));
      }
    }
  }
  WeightView w;
  w.type = static_cast<GgmlType>(t->type);
  w.data = t->data;
  w.n_in = static_cast<int64_t>(ne[0]);
  w.n_out = vector ? 1 : static_cast<int64_t>(ne[1]);
  w.name = t->name;
  return w;
}

absl::Status AddF32(gguf::GgufWriter& w, std::string_view name, std::vector<uint64_t> ne,
                    const std::vector<float>& data) {
  return w.AddTensor(
      name, static_cast<uint32_t>(GgmlType::kF32), std::move(ne),
      std::span(reinterpret_cast<const uint8_t*>(data.data()), data.size() * sizeof(float)));
}

// log(sum(exp(row))), stable.
float LogSumExp(std::span<const float> row) {
  float m = -INFINITY;
  for (float x : row) m = std::max(m, x);
  double s = 0.0;
  for (float x : row) s += std::exp(static_cast<double>(x - m));
  return m + static_cast<float>(std::log(s));
}

int32_t MaxTopK(const EagleParams& p) { return p.top_k > 0 ? p.top_k : kEagleAutoMaxTopK; }
int32_t MaxDepth(const EagleParams& p) {
  return p.max_depth > 0 ? p.max_depth : kEagleAutoMaxDepth;
}

// The head's decoder layer: a llama block without biases.
DecoderLayer HeadLayer(const EagleHead& h) {
  DecoderLayer L;
  L.attn_norm = &h.attn_norm;
  L.wq = &h.wq;
  L.wk = &h.wk;
  L.wv = &h.wv;
  L.wo = &h.wo;
  L.ffn_norm = &h.ffn_norm;
  L.ffn_gate = &h.ffn_gate;
  L.ffn_up = &h.ffn_up;
  L.ffn_down = &h.ffn_down;
  return L;
}

}  // namespace

absl::StatusOr<std::unique_ptr<EagleHead>> LoadEagleHead(const std::string& path,
                                                         const Model& target) {
  auto head = std::make_unique<EagleHead>();
  KILN_ASSIGN_OR_RETURN(head->file, gguf::GgufFile::Open(path));
  const gguf::GgufFile& file = *head->file;
  absl::StatusOr<std::string_view> arch_or = file.GetString("general.architecture");
  if (!arch_or.ok() || (*arch_or != kArch && *arch_or != kArch3)) {
    return absl::InvalidArgumentError(
        kiln::StrCat(path, ": not an eagle head file (general.architecture is '",
                     arch_or.ok() ? *arch_or : "absent", "', expected 'eagle' or 'eagle3')"));
  }
  const std::string_view arch = *arch_or == kArch ? kArch : kArch3;
  const bool eagle3 = arch == kArch3;
  KILN_ASSIGN_OR_RETURN(head->target, ReadTargetFingerprint(file, arch));
  KILN_ASSIGN_OR_RETURN(const TargetFingerprint model_fp, FingerprintOf(target));
  KILN_RETURN_IF_ERROR(CheckTarget(head->target, model_fp, arch, path));
  const ModelHparams& hp = target.hparams();
  if (hp.n_head <= 0 || hp.n_head_kv <= 0 || hp.head_dim <= 0 || hp.n_ff <= 0 ||
      hp.n_head % hp.n_head_kv != 0) {
    return absl::InvalidArgumentError(kiln::StrCat(
        path, ": eagle heads need a target with GQA attention and a feed-forward (", hp.arch,
        " has n_head ", hp.n_head, ", n_head_kv ", hp.n_head_kv, ", n_ff ", hp.n_ff, ")"));
  }
  // The layer's shapes are the target's: each key must say so.
  const std::pair<const char*, int64_t> shapes[] = {{"embedding_length", hp.n_embd},
                                                    {"attention.head_count", hp.n_head},
                                                    {"attention.head_count_kv", hp.n_head_kv},
                                                    {"attention.key_length", hp.head_dim},
                                                    {"feed_forward_length", hp.n_ff}};
  for (const auto& [name, want] : shapes) {
    const std::string key = kiln::StrCat(arch, ".", name);
    absl::StatusOr<uint64_t> v = file.GetUint(key);
    if (!v.ok()) {
      return absl::DataLossError(
          kiln::StrCat(path, ": eagle head: key ", key, ": ", v.status().message()));
    }
    if (*v != static_cast<uint64_t>(want)) {
      return absl::DataLossError(
          kiln::StrCat(path, ": eagle head: ", key, " is ", *v, ", the target's is ", want));
    }
  }
  if (eagle3) {
    // The target layers whose outputs the head fuses: ascending, each a layer of the target.
    const std::string key = kiln::StrCat(arch, ".target.layers");
    absl::StatusOr<std::vector<int64_t>> layers = file.GetIntArray(key);
    if (!layers.ok() || layers->empty() || layers->size() > 8) {
      return absl::DataLossError(
          kiln::StrCat(path, ": eagle head: key ", key, " must list 1 to 8 target layers"));
    }
    for (size_t k = 0; k < layers->size(); ++k) {
      const int64_t l = (*layers)[k];
      if (l < 0 || l >= hp.n_layer || (k > 0 && l <= (*layers)[k - 1])) {
        return absl::DataLossError(kiln::StrCat(path, ": eagle head: ", key, "[", k, "] = ", l,
                                                " is not a layer of the target in [0, ", hp.n_layer,
                                                ") above the one before it"));
      }
      head->fused_layers.push_back(static_cast<int32_t>(l));
    }
  }
  head->n_embd = hp.n_embd;
  head->n_head = hp.n_head;
  head->n_head_kv = hp.n_head_kv;
  head->head_dim = hp.head_dim;
  head->n_ff = hp.n_ff;
  head->rms_eps = hp.rms_eps;  // the target's: the layer is one of its shape
  const uint64_t d = hp.n_embd, q_dim = hp.n_head * hp.head_dim,
                 kv_dim = hp.n_head_kv * hp.head_dim, ff = hp.n_ff;
  auto bind = [&](std::string_view name, std::vector<uint64_t> ne) {
    return Bind(file, path, arch, name, std::move(ne));
  };
  if (eagle3) {
    const uint64_t width = d * head->fused_layers.size();
    KILN_ASSIGN_OR_RETURN(head->fuse, bind("fuse.weight", {width, d}));
    KILN_ASSIGN_OR_RETURN(head->feature_norm, bind("feature_norm.weight", {d}));
    KILN_ASSIGN_OR_RETURN(head->output_norm, bind("output_norm.weight", {d}));
  }
  KILN_ASSIGN_OR_RETURN(head->fc, bind("fc.weight", {2 * d, d}));
  KILN_ASSIGN_OR_RETURN(head->fc_bias, bind("fc.bias", {d}));
  KILN_ASSIGN_OR_RETURN(head->attn_norm, bind("attn_norm.weight", {d}));
  KILN_ASSIGN_OR_RETURN(head->wq, bind("attn_q.weight", {d, q_dim}));
  KILN_ASSIGN_OR_RETURN(head->wk, bind("attn_k.weight", {d, kv_dim}));
  KILN_ASSIGN_OR_RETURN(head->wv, bind("attn_v.weight", {d, kv_dim}));
  KILN_ASSIGN_OR_RETURN(head->wo, bind("attn_output.weight", {q_dim, d}));
  KILN_ASSIGN_OR_RETURN(head->ffn_norm, bind("ffn_norm.weight", {d}));
  KILN_ASSIGN_OR_RETURN(head->ffn_gate, bind("ffn_gate.weight", {d, ff}));
  KILN_ASSIGN_OR_RETURN(head->ffn_up, bind("ffn_up.weight", {d, ff}));
  KILN_ASSIGN_OR_RETURN(head->ffn_down, bind("ffn_down.weight", {ff, d}));
  std::vector<int32_t> ids;
  KILN_ASSIGN_OR_RETURN(const gguf::TensorInfo* lm_head,
                        ReadReducedVocabulary(file, arch, path, model_fp, hp.n_embd, &ids));
  if (lm_head == nullptr && eagle3) {
    return absl::DataLossError(kiln::StrCat(path,
                                            ": eagle head: an eagle3 head needs its own LM "
                                            "head (eagle3.vocab.ids, eagle3.lm_head.weight)"));
  }
  if (lm_head != nullptr) {
    WeightView v;
    v.type = static_cast<GgmlType>(lm_head->type);
    v.data = lm_head->data;
    v.n_in = hp.n_embd;
    v.n_out = static_cast<int64_t>(ids.size());
    v.name = lm_head->name;
    KILN_ASSIGN_OR_RETURN(head->draft_vocab,
                          PrepareReducedLmHead(std::move(ids), v, lm_head->nbytes, hp.n_vocab,
                                               kiln::StrCat(path, ": eagle head")));
  }
  return head;
}

absl::Status WriteDerivedEagleHead(const Model& target, EagleHeadInit init, uint64_t seed,
                                   const std::string& path, std::span<const int32_t> draft_vocab,
                                   std::span<const int32_t> fused_layers) {
  const ModelHparams& hp = target.hparams();
  const bool eagle3 = !fused_layers.empty();
  const std::string_view arch = eagle3 ? kArch3 : kArch;
  if (eagle3 && draft_vocab.empty()) {
    return absl::InvalidArgumentError(
        "WriteDerivedEagleHead: an EAGLE-3 head needs a draft vocabulary (its own LM head)");
  }
  auto name = [&](std::string_view suffix) { return kiln::StrCat(arch, ".", suffix); };
  const uint64_t d = hp.n_embd, q_dim = hp.n_head * hp.head_dim,
                 kv_dim = hp.n_head_kv * hp.head_dim, ff = hp.n_ff;
  KILN_ASSIGN_OR_RETURN(const TargetFingerprint fp, FingerprintOf(target));
  gguf::GgufWriter w;
  w.SetString("general.architecture", arch);
  WriteTargetFingerprint(fp, arch, w);
  w.SetUint32(name("embedding_length"), static_cast<uint32_t>(d));
  w.SetUint32(name("attention.head_count"), static_cast<uint32_t>(hp.n_head));
  w.SetUint32(name("attention.head_count_kv"), static_cast<uint32_t>(hp.n_head_kv));
  w.SetUint32(name("attention.key_length"), static_cast<uint32_t>(hp.head_dim));
  w.SetUint32(name("feed_forward_length"), static_cast<uint32_t>(ff));
  if (eagle3) {
    w.SetArrayInt32(name("target.layers"),
                    std::vector<int32_t>(fused_layers.begin(), fused_layers.end()));
  }

  std::mt19937_64 gen(seed);
  auto random = [&](uint64_t n_in, uint64_t n_out) {
    std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(static_cast<float>(n_in)));
    std::vector<float> m(n_in * n_out);
    for (float& x : m) x = normal(gen);
    return m;
  };
  // fc rows: [embedding part (d) | feature part (d)] per output.
  std::vector<float> fc(2 * d * d, 0.0f);
  if (init == EagleHeadInit::kRandom) {
    fc = random(2 * d, d);
  } else {
    for (uint64_t o = 0; o < d; ++o) {
      fc[o * 2 * d + d + o] = 1.0f;                                     // feature
      if (init == EagleHeadInit::kLastLayer) fc[o * 2 * d + o] = 1.0f;  // embedding
    }
  }
  KILN_RETURN_IF_ERROR(AddF32(w, name("fc.weight"), {2 * d, d}, fc));
  KILN_RETURN_IF_ERROR(AddF32(w, name("fc.bias"), {d}, std::vector<float>(d, 0.0f)));
  if (eagle3) {
    // fuse: [layers x d -> d], the last listed layer's output passed through (random: kRandom);
    // the feature norm ones, the output norm the target's (what its LM head expects).
    const uint64_t width = d * fused_layers.size();
    std::vector<float> fuse(width * d, 0.0f);
    if (init == EagleHeadInit::kRandom) {
      fuse = random(width, d);
    } else {
      for (uint64_t o = 0; o < d; ++o) fuse[o * width + width - d + o] = 1.0f;
    }
    KILN_RETURN_IF_ERROR(AddF32(w, name("fuse.weight"), {width, d}, fuse));
    KILN_RETURN_IF_ERROR(AddF32(w, name("feature_norm.weight"), {d}, std::vector<float>(d, 1.0f)));
    const WeightView& out_norm = target.output_norm();
    KILN_RETURN_IF_ERROR(
        AddF32(w, name("output_norm.weight"), {d},
               std::vector<float>(out_norm.AsF32(), out_norm.AsF32() + static_cast<int64_t>(d))));
  }

  struct Matrix {
    const char* name;   // the head's tensor (after "<arch>.")
    const char* layer;  // the target layer's tensor it copies (kLastLayer)
    uint64_t n_in, n_out;
  };
  const Matrix matrices[] = {
      {"attn_q.weight", "attn_q.weight", d, q_dim},
      {"attn_k.weight", "attn_k.weight", d, kv_dim},
      {"attn_v.weight", "attn_v.weight", d, kv_dim},
      {"attn_output.weight", "attn_output.weight", q_dim, d},
      {"ffn_gate.weight", "ffn_gate.weight", d, ff},
      {"ffn_up.weight", "ffn_up.weight", d, ff},
      {"ffn_down.weight", "ffn_down.weight", ff, d},
  };
  const std::string last = kiln::StrCat("blk.", hp.n_layer - 1, ".");
  for (const Matrix& m : matrices) {
    if (init == EagleHeadInit::kLastLayer) {
      const WeightView* t = target.Tensor(kiln::StrCat(last, m.layer));
      if (t == nullptr || t->data == nullptr || t->n_in != static_cast<int64_t>(m.n_in) ||
          t->n_out != static_cast<int64_t>(m.n_out)) {
        return absl::InvalidArgumentError(kiln::StrCat("WriteDerivedEagleHead: the target has no ",
                                                       last, m.layer, " of shape [", m.n_in, ", ",
                                                       m.n_out, "] to copy"));
      }
      KILN_RETURN_IF_ERROR(
          w.AddTensor(name(m.name), static_cast<uint32_t>(t->type), {m.n_in, m.n_out},
                      std::span(static_cast<const uint8_t*>(t->data), t->row_bytes() * t->n_out)));
      continue;
    }
    std::vector<float> data = random(m.n_in, m.n_out);
    // The identity head's attention and feed-forward add nothing (their outputs are zero).
    const bool output = std::string_view(m.layer) == "attn_output.weight" ||
                        std::string_view(m.layer) == "ffn_down.weight";
    if (init == EagleHeadInit::kIdentity && output) std::fill(data.begin(), data.end(), 0.0f);
    KILN_RETURN_IF_ERROR(AddF32(w, name(m.name), {m.n_in, m.n_out}, data));
  }
  for (const char* norm : {"attn_norm.weight", "ffn_norm.weight"}) {
    std::vector<float> ones(d, 1.0f);
    if (init == EagleHeadInit::kLastLayer) {
      const WeightView* t = target.Tensor(kiln::StrCat(last, norm));
      if (t != nullptr && t->data != nullptr && t->type == GgmlType::kF32 &&
          t->n_in == static_cast<int64_t>(d)) {
        std::memcpy(ones.data(), t->data, d * sizeof(float));
      }
    }
    KILN_RETURN_IF_ERROR(AddF32(w, name(norm), {d}, ones));
  }
  if (!draft_vocab.empty()) {
    // The target's own LM-head rows for the ids, in its type.
    const WeightView& out = target.output();
    std::vector<uint8_t> rows;
    for (int32_t id : draft_vocab) {
      if (id < 0 || id >= out.n_out) {
        return absl::InvalidArgumentError(kiln::StrCat(
            "WriteDerivedEagleHead: draft vocabulary id ", id, " is outside [0, ", out.n_out, ")"));
      }
      rows.insert(rows.end(), out.Row(id), out.Row(id) + out.row_bytes());
    }
    KILN_RETURN_IF_ERROR(WriteReducedVocabulary(arch, draft_vocab, out.type, rows, hp.n_embd, w));
  }
  return w.WriteToFile(path);
}

EagleStrategy::EagleStrategy(std::shared_ptr<const EagleHead> head, const Model& target,
                             const EagleParams& params, std::unique_ptr<KvCache> cache)
    : head_(std::move(head)),
      target_(&target),
      params_(params),
      backend_(std::make_unique<cpu::CpuBackend>(params.n_threads)),
      layer_(HeadLayer(*head_)),
      block_(*backend_, DecoderGraph{},
             {head_->n_embd, head_->n_head, head_->n_head_kv, head_->head_dim, head_->n_ff,
              head_->rms_eps}),
      cache_(std::move(cache)) {
  seq_ = cache_->CreateSequence();
  if (params_.merge_ngram) {
    auto ngram = NgramStrategy::Create(NgramParams{});
    if (ngram.ok()) ngram_ = std::move(*ngram);  // the defaults are valid parameters
  }
}

absl::StatusOr<std::unique_ptr<EagleStrategy>> EagleStrategy::Load(const std::string& path,
                                                                   const Model& target,
                                                                   const EagleParams& params) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<EagleHead> head, LoadEagleHead(path, target));
  return Create(std::shared_ptr<const EagleHead>(std::move(head)), target, params);
}

absl::StatusOr<std::unique_ptr<EagleStrategy>> EagleStrategy::Create(
    std::shared_ptr<const EagleHead> head, const Model& target, const EagleParams& params) {
  if (params.top_k < 0 || params.top_k > 64 || params.max_depth < 0 || params.max_depth > 16 ||
      params.tree_tokens < 0 || params.max_tree_tokens < 1 || params.n_ctx < 16) {
    return absl::InvalidArgumentError(
        kiln::StrCat("EagleParams: top_k ", params.top_k, " (0..64), max_depth ", params.max_depth,
                     " (0..16), tree_tokens ", params.tree_tokens, " (>= 0), max_tree_tokens ",
                     params.max_tree_tokens, " (>= 1), n_ctx ", params.n_ctx, " (>= 16)"));
  }
  if (params.typical) KILN_RETURN_IF_ERROR(sample::CheckTypicalAcceptance(*params.typical));
  if (head == nullptr || head->n_embd != target.hparams().n_embd) {
    return absl::InvalidArgumentError("EagleStrategy: the head's hidden size is not the target's");
  }
  KILN_ASSIGN_OR_RETURN(KvLayout layout,
                        KvLayout::Gqa(1, static_cast<int32_t>(head->n_head_kv),
                                      static_cast<int32_t>(head->head_dim), GgmlType::kF32));
  // Room for n_ctx committed entries plus the largest tree's expanded nodes.
  const int32_t tree_nodes = MaxTopK(params) * MaxDepth(params);
  KvCacheOptions options;
  options.num_blocks = (params.n_ctx + tree_nodes) / layout.block_size() + 3;
  options.enable_prefix_caching = false;
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache, KvCache::Create(layout, options));
  return std::unique_ptr<EagleStrategy>(
      new EagleStrategy(std::move(head), target, params, std::move(cache)));
}

void EagleStrategy::Reset() {
  ResetHead();
  if (ngram_ != nullptr) ngram_->Reset();
}

void EagleStrategy::ResetHead() {
  cache_->Truncate(seq_, 0).IgnoreError();
  base_ = -1;
  committed_ = 0;
  committed_tokens_.clear();
  pending_.clear();
  root_context_len_ = -1;
}

int32_t EagleStrategy::head_cache_length() const { return cache_->Length(seq_).value_or(-1); }

absl::StatusOr<std::unique_ptr<Strategy>> EagleStrategy::Clone() const {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<EagleStrategy> c, Create(head_, *target_, params_));
  return std::unique_ptr<Strategy>(std::move(c));
}

void EagleStrategy::ObserveTargetFeatures(int32_t first_position, int32_t context_len,
                                          std::span<const float> features, int64_t n_embd) {
  const int64_t width = head_->feature_width();
  if (n_embd != width || features.empty() || features.size() % width != 0) {
    ResetHead();
    return;
  }
  const int32_t rows = static_cast<int32_t>(features.size() / width);
  const int32_t next = base_ + committed_ + static_cast<int32_t>(pending_.size() / width);
  if (base_ < 0 || first_position != next || first_position + rows + 1 != context_len) {
    ResetHead();  // not the continuation of what the head holds: start over from here
    base_ = first_position;
  }
  pending_.insert(pending_.end(), features.begin(), features.end());
}

absl::Status EagleStrategy::RunHead(std::span<const Row> rows, int32_t logits_from) {
  const auto start = std::chrono::steady_clock::now();
  const EagleHead& H = *head_;
  const int64_t n = static_cast<int64_t>(rows.size());
  const int64_t d = H.n_embd;
  Grow(in2_, n * 2 * d);
  Grow(g_, n * d);
  ids_.resize(n);
  positions_.resize(n);
  n_visible_.resize(n);
  slots_.resize(n);
  seq_index_.assign(n, 0);
  extra_indptr_.assign(1, 0);
  extra_positions_.clear();
  for (int64_t i = 0; i < n; ++i) {
    const Row& r = rows[i];
    ids_[i] = r.token;
    positions_[i] = r.pos;
    KILN_ASSIGN_OR_RETURN(slots_[i], cache_->SlotOf(seq_, r.cache_index));
    if (r.tree_node < 0) {
      n_visible_[i] = r.cache_index + 1;
    } else {
      // The committed entries, then the node's expanded ancestors and itself (increasing slots:
      // an ancestor is expanded before its descendants).
      n_visible_[i] = committed_;
      const size_t at = extra_positions_.size();
      for (int32_t a = r.tree_node; a >= 0; a = nodes_[a].parent) {
        extra_positions_.push_back(nodes_[a].cache_index);
      }
      std::reverse(extra_positions_.begin() + static_cast<std::ptrdiff_t>(at),
                   extra_positions_.end());
    }
    extra_indptr_.push_back(static_cast<int32_t>(extra_positions_.size()));
  }
  const SeqId seqs[1] = {seq_};
  KILN_RETURN_IF_ERROR(cache_->BuildTables(seqs, &tables_));
  // x = fc [embedding; feature] + b.                          in2: [n, 2 d]   x: [n, d] in g_
  KILN_RETURN_IF_ERROR(backend_->EmbeddingGather(target_->token_embd(), ids_, g_.data()));
  for (int64_t i = 0; i < n; ++i) {
    float* in = in2_.data() + i * 2 * d;
    std::memcpy(in, g_.data() + i * d, d * sizeof(float));
    std::memcpy(in + d, rows[i].feature, d * sizeof(float));
    // EAGLE-3 reads any feature (the target's fused one or its own g) through its norm.
    if (H.eagle3()) backend_->RmsNorm(in + d, H.feature_norm.AsF32(), 1, d, H.rms_eps, in + d);
  }
  KILN_RETURN_IF_ERROR(backend_->MatMul(H.fc, in2_.data(), n, g_.data()));
  backend_->AddRowBias(g_.data(), H.fc_bias.AsF32(), n, d);
  // The decoder layer (llama block) over the head's own cache turns x into g.     g: [n, d]
  KILN_RETURN_IF_ERROR(
      backend_->PrepareRope(target_->hparams().rope, static_cast<int32_t>(H.head_dim), positions_));
  AttentionMask mask;
  mask.seq = seq_index_;
  mask.tables = &tables_;
  mask.n_visible = n_visible_;
  mask.extra_indptr = extra_indptr_;
  mask.extra_positions = extra_positions_;
  KILN_RETURN_IF_ERROR(
      block_.Attention(layer_, *cache_, 0, mask, slots_, positions_, g_.data(), n));
  KILN_RETURN_IF_ERROR(block_.FeedForward(layer_, g_.data(), n));
  // Draft logits through the head's reduced LM head or the target's (EAGLE-1: no norm, g is in
  // the features' space; EAGLE-3: its own output norm).  logits: [n_logits, draft vocabulary]
  const WeightView& lm_head = DraftLmHead();
  const int64_t n_logits = n - logits_from;
  Grow(logits_, n_logits * lm_head.n_out);
  if (n_logits > 0) {
    const float* head_in = g_.data() + logits_from * d;
    if (H.eagle3()) {
      Grow(normed_, n_logits * d);
      backend_->RmsNorm(head_in, H.output_norm.AsF32(), n_logits, d, H.rms_eps, normed_.data());
      head_in = normed_.data();
    }
    KILN_RETURN_IF_ERROR(backend_->MatMul(lm_head, head_in, n_logits, logits_.data()));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  head_pass_seconds_ = head_pass_seconds_ > 0.0 ? (1.0 - kDraftStepEmaWeight) * head_pass_seconds_ +
                                                      kDraftStepEmaWeight * seconds
                                                : seconds;
  return absl::OkStatus();
}

const WeightView& EagleStrategy::DraftLmHead() const {
  return head_->draft_vocab ? head_->draft_vocab->view : target_->output();
}

int32_t EagleStrategy::next_top_k() const {
  if (params_.top_k > 0) return params_.top_k;
  return std::clamp(last_budget_, kEagleAutoMinTopK, kEagleAutoMaxTopK);
}

double EagleStrategy::DraftStepCost(const PassCostModel* cost) const {
  if (cost == nullptr || cost->pinned() || cost->OneTokenSeconds() <= 0.0 ||
      head_pass_seconds_ <= 0.0) {
    return kEaglePriorDraftStepCost;
  }
  return head_pass_seconds_ / cost->OneTokenSeconds();
}

void EagleStrategy::SortByLogp(std::vector<int32_t>* order) const {
  order->resize(nodes_.size());
  std::iota(order->begin(), order->end(), 0);
  std::stable_sort(order->begin(), order->end(),
                   [&](int32_t a, int32_t b) { return nodes_[a].logp > nodes_[b].logp; });
}

void EagleStrategy::Accepted(int32_t drafted, std::span<const int32_t> accepted) {
  if (drafted > 0 && last_expected_ > 0.0) {
    accepted_sum_ = (1.0 - kDraftStepEmaWeight) * accepted_sum_ +
                    kDraftStepEmaWeight * static_cast<double>(accepted.size());
    expected_sum_ =
        (1.0 - kDraftStepEmaWeight) * expected_sum_ + kDraftStepEmaWeight * last_expected_;
  } else {
    // A step without the head's drafts teaches nothing: drift back toward calibration 1, so that
    // a head whose low calibration stopped it drafting tries again.
    accepted_sum_ += kCalibrationRecovery * (expected_sum_ - accepted_sum_);
  }
  last_expected_ = 0.0;
}

double EagleStrategy::Calibration() const {
  if (expected_sum_ <= 0.0) return 1.0;
  return std::clamp(accepted_sum_ / expected_sum_, kMinCalibration, kMaxCalibration);
}

double EagleStrategy::RelativeCost(const PassCostModel* cost, int32_t width) {
  return cost != nullptr ? cost->RelativeCost(width)
                         : 1.0 + PassCostModel::kPriorBeta * (width - 1);
}

int32_t EagleStrategy::ChooseBudget(std::span<const int32_t> order, int32_t cap,
                                    const PassCostModel* cost, double* expected) const {
  // Expected accepted length of the n best nodes: the sum of their path probabilities, as
  // calibrated by what verification accepted.
  const int32_t limit = std::min<int32_t>(cap, static_cast<int32_t>(order.size()));
  const double calibration = Calibration();
  auto p = [&](int32_t k) {
    return std::min(1.0, calibration * std::exp(static_cast<double>(nodes_[order[k]].logp)));
  };
  *expected = 0.0;
  if (params_.tree_tokens > 0) {
    for (int32_t k = 0; k < limit; ++k) *expected += p(k);
    return limit;
  }
  double sum = 0.0, best = 1.0;
  int32_t budget = 0;
  for (int32_t k = 1; k <= limit; ++k) {
    sum += p(k - 1);
    const double value = (1.0 + sum) / RelativeCost(cost, k + 1);
    if (value > best * 1.02) {
      best = value;
      budget = k;
      *expected = sum;
    }
  }
  return budget;
}

absl::Status EagleStrategy::Propose(std::span<const int32_t> context, int32_t max_draft,
                                    const ProposeContext& ctx, DraftTree* out) {
  out->Clear();
  absl::Status st = ProposeTree(context, max_draft, ctx, out);
  // Whatever happened, the drafted entries leave the head's cache: it holds the committed ones.
  if (!cache_->Truncate(seq_, committed_).ok() || !st.ok()) {
    out->Clear();
    ResetHead();
    // A head that cannot run (its cache full) makes the step plain decoding, not an error.
    if (!absl::IsResourceExhausted(st)) return st;
  }
  return ngram_ != nullptr ? ngram_->MergeInto(context, max_draft, ctx, out) : absl::OkStatus();
}

absl::Status EagleStrategy::ProposeTree(std::span<const int32_t> context, int32_t max_draft,
                                        const ProposeContext& ctx, DraftTree* out) {
  const int64_t d = head_->n_embd;
  const int64_t n_vocab = DraftLmHead().n_out;  // the reduced vocabulary's size when there is one
  const int32_t len = static_cast<int32_t>(context.size());
  const int32_t n_pending = static_cast<int32_t>(pending_.size() / head_->feature_width());
  // A second proposal for the same context (a batched step planned again after its pass
  // failed, or a caller that proposes twice) reuses the root's output.
  const bool reuse =
      n_pending == 0 && base_ >= 0 && root_context_len_ == len && base_ + committed_ == len - 1;
  // The head must hold the context up to the root's feature (position len - 2).
  if (!reuse && (base_ < 0 || n_pending == 0 || base_ + committed_ + n_pending != len - 1)) {
    if (base_ >= 0 && base_ + committed_ + n_pending != len - 1) ResetHead();
    return absl::OkStatus();
  }
  for (int32_t j = 0; j < committed_; ++j) {
    if (committed_tokens_[j] != context[base_ + 1 + j]) {
      ResetHead();  // the text changed under the head
      return absl::OkStatus();
    }
  }
  if (committed_ + n_pending + MaxTopK(params_) * MaxDepth(params_) > params_.n_ctx) {
    ResetHead();  // beyond the head's capacity: plain decoding from here
    return absl::OkStatus();
  }

  // 1. The pending entries, causally; the last one's logits are the root children's.
  std::vector<Row> rows;
  std::vector<int32_t> ids;
  if (!reuse) {
    const float* features = pending_.data();  // [n_pending, n_embd]
    if (head_->eagle3()) {                    // f = fuse [h_low; h_mid; h_high]
      Grow(fused_, n_pending * d);
      KILN_RETURN_IF_ERROR(
          backend_->MatMul(head_->fuse, pending_.data(), n_pending, fused_.data()));
      features = fused_.data();
    }
    for (int32_t j = 0; j < n_pending; ++j) {
      const int32_t pos = base_ + committed_ + j;
      rows.push_back({context[pos + 1], features + j * d, pos, committed_ + j, -1});
      ids.push_back(context[pos + 1]);
    }
    KILN_RETURN_IF_ERROR(cache_->AppendSlots(seq_, ids));
    KILN_RETURN_IF_ERROR(RunHead(rows, n_pending - 1));
    committed_ += n_pending;
    committed_tokens_.insert(committed_tokens_.end(), ids.begin(), ids.end());
    KILN_RETURN_IF_ERROR(cache_->MarkComputed(seq_, committed_));
    pending_.clear();
    root_logits_.assign(logits_.begin(), logits_.begin() + n_vocab);
    root_g_.assign(g_.begin() + (n_pending - 1) * d, g_.begin() + n_pending * d);
    root_context_len_ = len;
  }
  features_.assign(root_g_.begin(), root_g_.end());  // row 0: the root's output

  // 2. EAGLE-2 expansion.
  const int32_t top_k = next_top_k();
  const std::vector<int32_t>* vocab = head_->draft_vocab ? &head_->draft_vocab->ids : nullptr;
  nodes_.clear();
  std::vector<int32_t> top;
  auto add_children = [&](std::span<const float> logits, int32_t parent, float parent_logp,
                          int32_t depth, int32_t feature_row) {
    const float lse = LogSumExp(logits);
    TopK(logits, top_k, &top);
    for (int32_t t : top) {
      const int32_t token = vocab != nullptr ? (*vocab)[t] : t;
      nodes_.push_back({token, parent, depth, parent_logp + (logits[t] - lse), -1, feature_row});
    }
  };
  add_children(root_logits_, -1, 0.0f, 1, 0);
  const int32_t cap = std::min<int32_t>(
      max_draft, params_.tree_tokens > 0 ? params_.tree_tokens : params_.max_tree_tokens);
  const double step_cost = DraftStepCost(ctx.cost);
  std::vector<int32_t> order;
  size_t frontier_begin = 0;
  std::vector<int32_t> frontier;
  int32_t depth = 1;
  for (; depth < MaxDepth(params_); ++depth) {
    frontier.resize(nodes_.size() - frontier_begin);
    std::iota(frontier.begin(), frontier.end(), static_cast<int32_t>(frontier_begin));
    std::stable_sort(frontier.begin(), frontier.end(),
                     [&](int32_t a, int32_t b) { return nodes_[a].logp > nodes_[b].logp; });
    if (static_cast<int32_t>(frontier.size()) > top_k) frontier.resize(top_k);
    if (params_.max_depth == 0) {
      // Automatic depth: expand only when the next depth could pay for its head pass. Its
      // children can add at most the frontier's path probability P to the expected tokens
      // (a child is never likelier than its parent), at the cheapest for one more verified node:
      // expand iff (1 + S + P) / (c(n + 2) + D + s) > (1 + S) / (c(n + 1) + D), with n, S the
      // budget and expected accepted tokens of the tree so far, D the head passes made this
      // step and s one more, both in one-token target passes (measured).
      double frontier_p = 0.0;
      for (int32_t f : frontier) frontier_p += std::exp(static_cast<double>(nodes_[f].logp));
      frontier_p *= Calibration();
      SortByLogp(&order);
      double expected = 0.0;
      const int32_t n = ChooseBudget(order, cap, ctx.cost, &expected);
      const double drafted = step_cost * depth;  // the root's pass and depth - 1 expansions
      const double stay = (1.0 + expected) / (RelativeCost(ctx.cost, n + 1) + drafted);
      const double grow =
          (1.0 + expected + frontier_p) / (RelativeCost(ctx.cost, n + 2) + drafted + step_cost);
      if (!(grow > stay)) break;
    }
    std::sort(frontier.begin(), frontier.end());  // expansion (slot) order = creation order
    rows.clear();
    ids.clear();
    const int32_t first_slot = committed_ + static_cast<int32_t>(features_.size() / d) - 1;
    for (size_t i = 0; i < frontier.size(); ++i) {
      Node& node = nodes_[frontier[i]];
      node.cache_index = first_slot + static_cast<int32_t>(i);
      ids.push_back(node.token);
    }
    KILN_RETURN_IF_ERROR(cache_->AppendSlots(seq_, ids));
    for (int32_t f : frontier) {
      const Node& node = nodes_[f];
      rows.push_back({node.token, features_.data() + node.feature_row * d, len - 2 + node.depth,
                      node.cache_index, f});
    }
    KILN_RETURN_IF_ERROR(RunHead(rows, 0));
    frontier_begin = nodes_.size();
    const int32_t first_row = static_cast<int32_t>(features_.size() / d);
    features_.insert(features_.end(), g_.begin(), g_.begin() + rows.size() * d);
    for (size_t i = 0; i < frontier.size(); ++i) {
      const Node parent = nodes_[frontier[i]];
      add_children(std::span<const float>(logits_).subspan(i * n_vocab, n_vocab), frontier[i],
                   parent.logp, parent.depth + 1, first_row + static_cast<int32_t>(i));
    }
  }

  last_depth_ = depth;

  // 3. Global rerank and the budget.
  SortByLogp(&order);
  double expected = 0.0;
  const int32_t budget = ChooseBudget(order, cap, ctx.cost, &expected);
  last_budget_ = budget;
  order.resize(budget);
  last_expected_ = 0.0;  // uncalibrated, what Accepted compares the accepted count with
  for (int32_t i : order) last_expected_ += std::exp(static_cast<double>(nodes_[i].logp));
  std::sort(order.begin(), order.end());  // creation order: parents first
  std::vector<int32_t> index_of(nodes_.size(), -1);
  out->deterministic = true;
  for (int32_t i : order) {
    const int32_t parent = nodes_[i].parent;
    if (parent >= 0 && index_of[parent] < 0) continue;  // cannot happen: logp never rises
    index_of[i] = out->Add(nodes_[i].token, parent < 0 ? -1 : index_of[parent]);
  }
  return absl::OkStatus();
}

}  // namespace kiln::spec
