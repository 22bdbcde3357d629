#include "lib/spec/medusa_strategy.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lib/backend/cpu/cpu_backend.h"
#include "lib/common/half.h"
#include "lib/common/strings.h"

namespace kiln::spec {
namespace {

constexpr std::string_view kArch = "medusa";

// sum_i a[i] b[i] in kLanes independent partial sums: a float reduction in one accumulator is a
// serial chain the compiler may not reorder (no vectorization); lanes it can put in SIMD
// registers. With one chain the heads' 576 x 576 mat-vec is a few percent of the default model's
// decoding step.
float Dot(const float* a, const float* b, int64_t n) {
  constexpr int64_t kLanes = 16;
  float lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) lanes[j] += a[i + j] * b[i + j];
  }
  float acc = 0.0f;
  for (; i < n; ++i) acc += a[i] * b[i];
  for (float x : lanes) acc += x;
  return acc;
}

// Reads tensor `name` with ne {n_in, n_out} of type f32 or f16 as f32.
absl::StatusOr<std::vector<float>> ReadF32(const gguf::GgufFile& file, const std::string& name,
                                           std::vector<uint64_t> ne) {
  const gguf::TensorInfo* t = file.FindTensor(name);
  if (t == nullptr)
    return absl::DataLossError(kiln::StrCat("medusa head: tensor ", name, " missing"));
  if (t->ne != ne) {
    return absl::DataLossError(kiln::StrCat("medusa head: tensor ", name, " has shape [",
                                            absl::StrJoin(t->ne, ", "), "], expected [",
                                            absl::StrJoin(ne, ", "), "]"));
  }
  std::vector<float> out(t->n_elements);
  if (t->type == static_cast<uint32_t>(GgmlType::kF32)) {
    std::memcpy(out.data(), t->data, out.size() * sizeof(float));
  } else if (t->type == static_cast<uint32_t>(GgmlType::kF16)) {
    for (size_t i = 0; i < out.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, t->data + 2 * i, 2);
      out[i] = Fp16ToFp32(h);
    }
  } else {
    return absl::DataLossError(
        kiln::StrCat("medusa head: tensor ", name, " has type ", t->type, " (f32 or f16 only)"));
  }
  for (float v : out) {
    if (!std::isfinite(v)) {
      return absl::DataLossError(kiln::StrCat("medusa head: tensor ", name, " is not finite"));
    }
  }
  return out;
}

// Format version 2's optional reduced vocabulary (draft_head.h), copied out of the file.
absl::Status ReadMedusaVocabulary(const gguf::GgufFile& file, const std::string& path,
                                  const TargetFingerprint& target, MedusaHead* head) {
  KILN_ASSIGN_OR_RETURN(
      const gguf::TensorInfo* t,
      ReadReducedVocabulary(file, kArch, path, target, head->n_embd, &head->vocab_ids));
  if (t == nullptr) return absl::OkStatus();
  head->lm_head_type = static_cast<GgmlType>(t->type);
  head->lm_head.assign(t->data, t->data + t->nbytes);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<MedusaHead> LoadMedusaHead(const std::string& path, const Model& target) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<gguf::GgufFile> file, gguf::GgufFile::Open(path));
  absl::StatusOr<std::string_view> arch = file->GetString("general.architecture");
  if (!arch.ok() || *arch != kArch) {
    return absl::InvalidArgumentError(
        kiln::StrCat(path, ": not a medusa head file (general.architecture is '",
                     arch.ok() ? *arch : "absent", "', expected 'medusa')"));
  }
  uint64_t version = 1;
  if (file->FindKey("medusa.format_version") != nullptr) {
    absl::StatusOr<uint64_t> v = file->GetUint("medusa.format_version");
    if (!v.ok()) {
      return absl::DataLossError(
          kiln::StrCat(path, ": key medusa.format_version: ", v.status().message()));
    }
    version = *v;
  }
  if (version < 1 || version > kMedusaFormatVersion) {
    return absl::InvalidArgumentError(kiln::StrCat(path, ": medusa head format version ", version,
                                                   "; this kiln reads 1 to ", kMedusaFormatVersion,
                                                   " (a newer kiln may read it)"));
  }
  MedusaHead head;
  KILN_ASSIGN_OR_RETURN(head.target, ReadTargetFingerprint(*file, kArch));
  KILN_ASSIGN_OR_RETURN(const TargetFingerprint model_fp, FingerprintOf(target));
  KILN_RETURN_IF_ERROR(CheckTarget(head.target, model_fp, kArch, path));
  absl::StatusOr<uint64_t> k = file->GetUint("medusa.head_count");
  absl::StatusOr<uint64_t> d = file->GetUint("medusa.embedding_length");
  if (!k.ok() || !d.ok() || *k < 1 || *k > 16 || *d != static_cast<uint64_t>(model_fp.n_embd)) {
    return absl::DataLossError(kiln::StrCat(
        path, ": medusa.head_count must be in [1, 16] and medusa.embedding_length the target's ",
        model_fp.n_embd));
  }
  head.n_heads = static_cast<int32_t>(*k);
  head.n_embd = static_cast<int64_t>(*d);
  const uint64_t n = head.n_embd;
  for (int32_t h = 0; h < head.n_heads; ++h) {
    KILN_ASSIGN_OR_RETURN(head.weights.emplace_back(),
                          ReadF32(*file, kiln::StrCat("medusa.", h, ".weight"), {n, n}));
    KILN_ASSIGN_OR_RETURN(head.biases.emplace_back(),
                          ReadF32(*file, kiln::StrCat("medusa.", h, ".bias"), {n}));
  }
  KILN_ASSIGN_OR_RETURN(head.tree, ReadStaticTree(*file, kArch, head.n_heads, kMedusaMaxRank));
  if (version >= 2) KILN_RETURN_IF_ERROR(ReadMedusaVocabulary(*file, path, model_fp, &head));
  return head;
}

absl::Status WriteMedusaHead(const MedusaHead& head, const std::string& path, bool f16) {
  gguf::GgufWriter w;
  w.SetString("general.architecture", kArch);
  w.SetUint32("medusa.format_version", kMedusaFormatVersion);
  w.SetUint32("medusa.head_count", static_cast<uint32_t>(head.n_heads));
  w.SetUint32("medusa.embedding_length", static_cast<uint32_t>(head.n_embd));
  WriteTargetFingerprint(head.target, kArch, w);
  WriteStaticTree(head.tree, kArch, w);
  const uint64_t n = head.n_embd;
  for (int32_t h = 0; h < head.n_heads; ++h) {
    const std::vector<float>& wt = head.weights[h];
    if (f16) {
      std::vector<uint8_t> bytes(wt.size() * 2);
      for (size_t i = 0; i < wt.size(); ++i) {
        const uint16_t x = Fp32ToFp16(wt[i]);
        std::memcpy(bytes.data() + 2 * i, &x, 2);
      }
      KILN_RETURN_IF_ERROR(w.AddTensor(kiln::StrCat("medusa.", h, ".weight"),
                                       static_cast<uint32_t>(GgmlType::kF16), {n, n},
                                       std::move(bytes)));
    } else {
      KILN_RETURN_IF_ERROR(w.AddTensor(
          kiln::StrCat("medusa.", h, ".weight"), static_cast<uint32_t>(GgmlType::kF32), {n, n},
          std::span(reinterpret_cast<const uint8_t*>(wt.data()), wt.size() * sizeof(float))));
    }
    const std::vector<float>& b = head.biases[h];
    KILN_RETURN_IF_ERROR(w.AddTensor(
        kiln::StrCat("medusa.", h, ".bias"), static_cast<uint32_t>(GgmlType::kF32), {n},
        std::span(reinterpret_cast<const uint8_t*>(b.data()), b.size() * sizeof(float))));
  }
  if (!head.vocab_ids.empty()) {
    KILN_RETURN_IF_ERROR(WriteReducedVocabulary(kArch, head.vocab_ids, head.lm_head_type,
                                                head.lm_head, head.n_embd, w));
  }
  return w.WriteToFile(path);
}

MedusaStrategy::MedusaStrategy(std::shared_ptr<const MedusaHead> head, const Model& target,
                               const MedusaParams& params,
                               std::shared_ptr<const ReducedLmHead> reduced)
    : head_(std::move(head)),
      target_(&target),
      params_(params),
      backend_(std::make_unique<cpu::CpuBackend>(params.n_threads)),
      reduced_(std::move(reduced)) {
  if (params_.merge_ngram) {
    auto ngram = NgramStrategy::Create(NgramParams{});
    if (ngram.ok()) ngram_ = std::move(*ngram);  // the defaults are valid parameters
  }
}

absl::StatusOr<std::unique_ptr<MedusaStrategy>> MedusaStrategy::Load(const std::string& path,
                                                                     const Model& target,
                                                                     const MedusaParams& params) {
  KILN_ASSIGN_OR_RETURN(MedusaHead head, LoadMedusaHead(path, target));
  return Create(std::make_shared<const MedusaHead>(std::move(head)), target, params);
}

absl::StatusOr<std::unique_ptr<MedusaStrategy>> MedusaStrategy::Create(
    std::shared_ptr<const MedusaHead> head, const Model& target, const MedusaParams& params) {
  if (params.max_draft < 0) {
    return absl::InvalidArgumentError(
        kiln::StrCat("MedusaParams.max_draft ", params.max_draft, " < 0"));
  }
  if (params.typical) KILN_RETURN_IF_ERROR(sample::CheckTypicalAcceptance(*params.typical));
  if (head == nullptr || head->n_embd != target.hparams().n_embd) {
    return absl::InvalidArgumentError("MedusaStrategy: the head's hidden size is not the target's");
  }
  std::shared_ptr<const ReducedLmHead> reduced;
  if (!head->vocab_ids.empty()) {
    WeightView v;
    v.type = head->lm_head_type;
    v.data = head->lm_head.data();
    v.n_in = head->n_embd;
    v.n_out = static_cast<int64_t>(head->vocab_ids.size());
    v.name = "medusa.lm_head.weight";
    KILN_ASSIGN_OR_RETURN(reduced,
                          PrepareReducedLmHead(head->vocab_ids, v, head->lm_head.size(),
                                               target.hparams().n_vocab, "MedusaStrategy"));
  }
  return std::unique_ptr<MedusaStrategy>(
      new MedusaStrategy(std::move(head), target, params, std::move(reduced)));
}

void MedusaStrategy::Reset() {
  feature_.clear();
  feature_context_len_ = -1;
  if (ngram_ != nullptr) ngram_->Reset();
}

absl::StatusOr<std::unique_ptr<Strategy>> MedusaStrategy::Clone() const {
  std::unique_ptr<MedusaStrategy> c(new MedusaStrategy(head_, *target_, params_, reduced_));
  c->feature_ = feature_;
  c->feature_context_len_ = feature_context_len_;
  return std::unique_ptr<Strategy>(std::move(c));
}

void MedusaStrategy::ObserveTargetFeatures(int32_t first_position, int32_t context_len,
                                           std::span<const float> features, int64_t n_embd) {
  if (n_embd != head_->n_embd || features.size() < static_cast<size_t>(n_embd)) {
    feature_.clear();
    feature_context_len_ = -1;
    return;
  }
  // The last row is the feature that predicted the new root (position context_len - 1).
  feature_.assign(features.end() - n_embd, features.end());
  feature_context_len_ = context_len;
}

absl::Status MedusaStrategy::Propose(std::span<const int32_t> context, int32_t max_draft,
                                     const ProposeContext& ctx, DraftTree* out) {
  out->Clear();
  KILN_RETURN_IF_ERROR(ProposeTree(context, max_draft, out));
  return ngram_ != nullptr ? ngram_->MergeInto(context, max_draft, ctx, out) : absl::OkStatus();
}

absl::Status MedusaStrategy::ProposeTree(std::span<const int32_t> context, int32_t max_draft,
                                         DraftTree* out) {
  if (feature_context_len_ != static_cast<int32_t>(context.size()) || feature_.empty()) {
    return absl::OkStatus();  // no feature for this context: a plain step gives one
  }
  const StaticTree& tree = head_->tree;
  int32_t n_nodes = std::min(max_draft, tree.size());
  if (params_.max_draft > 0) n_nodes = std::min(n_nodes, params_.max_draft);
  if (n_nodes <= 0) return absl::OkStatus();
  const int32_t depth = tree.MaxDepth(n_nodes);
  const int64_t d = head_->n_embd;
  const WeightView& lm_head = reduced_ ? reduced_->view : target_->output();
  const int64_t n_vocab = lm_head.n_out;  // the reduced vocabulary's size when there is one
  // z_k = h + SiLU(W_k h + b_k) for the heads the tree uses.            z: [depth, n_embd]
  z_.resize(depth * d);
  for (int32_t k = 0; k < depth; ++k) {
    const float* w = head_->weights[k].data();
    const float* b = head_->biases[k].data();
    float* z = z_.data() + k * d;
    for (int64_t o = 0; o < d; ++o) {
      const float pre = Dot(w + o * d, feature_.data(), d) + b[o];
      z[o] = feature_[o] + pre / (1.0f + std::exp(-pre));
    }
  }
  logits_.resize(depth * n_vocab);  // [depth, n_vocab]
  KILN_RETURN_IF_ERROR(backend_->MatMul(lm_head, z_.data(), depth, logits_.data()));
  // Candidates per depth: as many as the tree's highest rank there needs.
  std::vector<int32_t> need(depth, 0);
  for (int32_t i = 0; i < n_nodes; ++i) {
    need[tree.depths[i] - 1] = std::max(need[tree.depths[i] - 1], tree.ranks[i] + 1);
  }
  top_.resize(depth);
  for (int32_t k = 0; k < depth; ++k) {
    TopK(std::span(logits_).subspan(k * n_vocab, n_vocab), need[k], &top_[k]);
  }
  out->deterministic = true;
  for (int32_t i = 0; i < n_nodes; ++i) {
    const std::vector<int32_t>& top = top_[tree.depths[i] - 1];
    if (tree.ranks[i] >= static_cast<int32_t>(top.size())) break;  // vocabulary smaller than rank
    const int32_t token = top[tree.ranks[i]];
    out->Add(reduced_ ? reduced_->ids[token] : token, tree.parents[i]);
  }
  return absl::OkStatus();
}

}  // namespace kiln::spec
