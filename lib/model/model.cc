#include "lib/model/model.h"

#include "lib/backend/cpu/cpu_backend.h"
#include "lib/gguf/gguf.h"
#include "lib/quant/quant.h"
#include "lib/tokenizer/tokenizer.h"

namespace kiln {
namespace {

// Binds tensor `spec.name` checking its shape and type; nullopt-like empty view (data null) for
// an optional tensor the file lacks.
absl::StatusOr<WeightView> Bind(const gguf::GgufFile& f, const TensorSpec& spec) {
  const gguf::TensorInfo* t = f.FindTensor(spec.name);
  if (t == nullptr) {
    if (spec.optional) return WeightView{};
    return absl::InvalidArgumentError(kiln::StrCat("model: missing tensor '", spec.name, "'"));
  }
  const uint64_t ne1 = t->ne.size() > 1 ? t->ne[1] : 1;
  const uint64_t ne2 = t->ne.size() > 2 ? t->ne[2] : 1;
  const bool shape_ok = t->ne.size() <= 3 && t->ne[0] == static_cast<uint64_t>(spec.n_in) &&
                        ne1 == static_cast<uint64_t>(spec.n_out) &&
                        ne2 == static_cast<uint64_t>(spec.n_mat);
  if (!shape_ok) {
    std::string got;
    for (uint64_t d : t->ne) got += (got.empty() ? "" : ", ") + std::to_string(d);
    const std::string stack = spec.n_mat > 1 ? absl::StrFormat(", %d", spec.n_mat) : "";
    return absl::InvalidArgumentError(
        absl::StrFormat("model: tensor '%s' has shape {%s}, expected {%d, %d%s}", spec.name, got,
                        spec.n_in, spec.n_out, stack));
  }
  if (spec.role == TensorRole::kVector && t->type != static_cast<uint32_t>(GgmlType::kF32)) {
    return absl::UnimplementedError(
        kiln::StrCat("model: tensor '", spec.name, "' must be f32, is ", GgmlTypeName(t->type)));
  }
  WeightView w;
  w.name = t->name;
  w.data = t->data;
  w.type = static_cast<GgmlType>(t->type);
  w.n_in = spec.n_in;
  w.n_out = spec.n_out * spec.n_mat;
  if (GetQuantKernels(w.type) == nullptr) {
    return absl::UnimplementedError(kiln::StrCat("model: tensor '", spec.name, "' has type ",
                                                 GgmlTypeName(t->type),
                                                 ", which kiln cannot compute with"));
  }
  return w;
}

std::string SupportedList() {
  std::string names;
  for (std::string_view n : ArchitectureNames())
    names += (names.empty() ? "" : ", ") + std::string(n);
  return names;
}

absl::StatusOr<const Architecture*> ArchitectureOf(const gguf::GgufFile& f) {
  KILN_ASSIGN_OR_RETURN(std::string_view name, f.GetString("general.architecture"));
  const Architecture* arch = FindArchitecture(name);
  if (arch == nullptr) {
    return absl::UnimplementedError(kiln::StrCat(
        "model: architecture '", name, "' is not supported (supported: ", SupportedList(), ")"));
  }
  return arch;
}

}  // namespace

Model::~Model() = default;

const WeightView* Model::Tensor(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::vector<std::string> Model::Unsupported(const gguf::GgufFile& f) {
  auto arch = ArchitectureOf(f);
  if (!arch.ok()) return {std::string(arch.status().message())};
  auto hp = (*arch)->ReadHparams(f);
  if (!hp.ok()) return {std::string(hp.status().message())};
  std::vector<std::string> problems;
  for (const TensorSpec& spec : (*arch)->Tensors(*hp)) {
    auto w = Bind(f, spec);
    if (!w.ok()) problems.emplace_back(w.status().message());
  }
  return problems;
}

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const ModelLoadOptions& options) {
  std::unique_ptr<Model> m(new Model());
  gguf::GgufFile::Options open_options;
  open_options.use_mmap = options.use_mmap;
  KILN_ASSIGN_OR_RETURN(m->file_, gguf::GgufFile::Open(options.path, open_options));
  if (options.progress && !options.progress(0.1f))
    return absl::CancelledError("model load cancelled");
  KILN_ASSIGN_OR_RETURN(m->arch_, ArchitectureOf(*m->file_));
  KILN_ASSIGN_OR_RETURN(m->hparams_, m->arch_->ReadHparams(*m->file_));
  KILN_ASSIGN_OR_RETURN(m->tokenizer_, Tokenizer::FromGguf(*m->file_));
  if (m->file_->FindKey("tokenizer.chat_template")) {
    KILN_ASSIGN_OR_RETURN(std::string_view tmpl, m->file_->GetString("tokenizer.chat_template"));
    m->chat_template_ = std::string(tmpl);
  } else {
    m->chat_template_ = std::string(m->arch_->default_chat_template());
  }
  if (options.progress && !options.progress(0.3f))
    return absl::CancelledError("model load cancelled");
  KILN_RETURN_IF_ERROR(m->BindTensors(options));
  for (const gguf::TensorInfo& t : m->file_->tensors()) {
    m->n_params_ += t.n_elements;
    m->weight_bytes_ += t.nbytes;
  }
  if (options.log) {
    options.log(LogLevel::kInfo,
                absl::StrFormat(
                    "loaded %s (%s): %d layers, %d embd, %d params, %d bytes (+%d bytes prepared)",
                    options.path, m->hparams_.arch, m->hparams_.n_layer, m->hparams_.n_embd,
                    m->n_params_, m->weight_bytes_, m->interleaved_bytes()));
  }
  if (options.progress && !options.progress(1.0f))
    return absl::CancelledError("model load cancelled");
  return m;
}

absl::Status Model::BindTensors(const ModelLoadOptions& options) {
  const std::vector<TensorSpec> table = arch_->Tensors(hparams_);
  tensors_.reserve(table.size());
  std::vector<TensorRole> roles;
  for (size_t i = 0; i < table.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(WeightView w, Bind(*file_, table[i]));
    if (w.data != nullptr) {
      index_[w.name] = tensors_.size();
      tensors_.push_back(w);
      roles.push_back(table[i].role);
    }
    if (options.progress && !options.progress(0.3f + 0.5f * static_cast<float>(i + 1) /
                                                         static_cast<float>(table.size()))) {
      return absl::CancelledError("model load cancelled");
    }
  }
  const WeightView* head = Tensor("output.weight");
  const WeightView* embd = Tensor("token_embd.weight");
  if (head == nullptr && embd == nullptr) {
    return absl::InvalidArgumentError("model: neither output.weight nor token_embd.weight");
  }
  output_ = head != nullptr ? *head : *embd;
  // The backend prepares the matrices it multiplies with (the tied head as a matrix too).
  std::vector<WeightView*> matrices;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (roles[i] == TensorRole::kMatrix && &tensors_[i] != head) matrices.push_back(&tensors_[i]);
  }
  matrices.push_back(&output_);
  const bool mapped = file_->mapped();
  if (options.backend != nullptr) {
    KILN_ASSIGN_OR_RETURN(prepared_, options.backend->PrepareWeights(matrices, mapped));
  } else {
    KILN_ASSIGN_OR_RETURN(prepared_, cpu::PrepareCpuWeights(matrices, mapped));
  }
  // A tied head's copy also serves the embedding lookups (EmbeddingGather reads rows from it),
  // so the file pages it let go are not mapped again row by row.
  if (head == nullptr) {
    for (WeightView& t : tensors_) {
      if (&t == embd) {
        t.interleaved = output_.interleaved;
        t.copied_rows = output_.copied_rows;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace kiln
