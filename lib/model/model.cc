#include "lib/model/model.h"

#include <sys/mman.h>
#include <unistd.h>

#include "lib/gguf/gguf.h"
#include "lib/tokenizer/tokenizer.h"

namespace kiln {
namespace {

// Binds tensor `name` with the expected shape {n_in, n_out} (n_out = 1 for vectors).
absl::StatusOr<WeightView> Bind(const gguf::GgufFile& f, const std::string& name, int64_t n_in,
                                int64_t n_out, bool f32_only) {
  const gguf::TensorInfo* t = f.FindTensor(name);
  if (t == nullptr)
    return absl::InvalidArgumentError(kiln::StrCat("model: missing tensor '", name, "'"));
  const uint64_t ne1 = t->ne.size() > 1 ? t->ne[1] : 1;
  bool shape_ok = t->ne.size() <= 2 && t->ne[0] == static_cast<uint64_t>(n_in) &&
                  ne1 == static_cast<uint64_t>(n_out);
  if (!shape_ok) {
    std::string got;
    for (uint64_t d : t->ne) got += (got.empty() ? "" : ", ") + std::to_string(d);
    return absl::InvalidArgumentError(absl::StrFormat(
        "model: tensor '%s' has shape {%s}, expected {%d, %d}", name, got, n_in, n_out));
  }
  if (f32_only && t->type != static_cast<uint32_t>(GgmlType::kF32)) {
    return absl::UnimplementedError(
        kiln::StrCat("model: tensor '", name, "' must be f32, is ", GgmlTypeName(t->type)));
  }
  WeightView w;
  w.name = t->name;
  w.data = t->data;
  w.type = static_cast<GgmlType>(t->type);
  w.n_in = n_in;
  w.n_out = n_out;
  w.row_bytes = static_cast<size_t>(t->nbytes / ne1);
  w.kernels = GetQuantKernels(w.type);
  if (w.kernels == nullptr) {
    return absl::UnimplementedError(kiln::StrCat("model: tensor '", name, "' has type ",
                                                 GgmlTypeName(t->type),
                                                 ", which kiln cannot compute with"));
  }
  return w;
}

}  // namespace

Model::~Model() = default;

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const ModelLoadOptions& options) {
  std::unique_ptr<Model> m(new Model());
  gguf::GgufFile::Options open_options;
  open_options.use_mmap = options.use_mmap;
  KILN_ASSIGN_OR_RETURN(m->file_, gguf::GgufFile::Open(options.path, open_options));
  if (options.progress && !options.progress(0.1f))
    return absl::CancelledError("model load cancelled");
  KILN_ASSIGN_OR_RETURN(std::string_view arch, m->file_->GetString("general.architecture"));
  if (arch != "llama") {
    return absl::UnimplementedError(
        kiln::StrCat("model: architecture '", arch, "' is not supported (supported: llama)"));
  }
  KILN_ASSIGN_OR_RETURN(m->hparams_, ReadLlamaHparams(*m->file_));
  KILN_ASSIGN_OR_RETURN(m->tokenizer_, Tokenizer::FromGguf(*m->file_));
  if (m->file_->FindKey("tokenizer.chat_template")) {
    KILN_ASSIGN_OR_RETURN(std::string_view tmpl, m->file_->GetString("tokenizer.chat_template"));
    m->chat_template_ = std::string(tmpl);
  }
  if (options.progress && !options.progress(0.3f))
    return absl::CancelledError("model load cancelled");
  KILN_RETURN_IF_ERROR(m->BindWeights(options));
  KILN_RETURN_IF_ERROR(m->InterleaveWeights());
  for (const gguf::TensorInfo& t : m->file_->tensors()) {
    m->n_params_ += t.n_elements;
    m->weight_bytes_ += t.nbytes;
  }
  if (options.log) {
    options.log(LogLevel::kInfo,
                absl::StrFormat(
                    "loaded %s: %d layers, %d embd, %d params, %d bytes (+%d bytes interleaved)",
                    options.path, m->hparams_.n_layer, m->hparams_.n_embd, m->n_params_,
                    m->weight_bytes_, m->interleaved_bytes_));
  }
  if (options.progress && !options.progress(1.0f))
    return absl::CancelledError("model load cancelled");
  return m;
}

absl::Status Model::BindWeights(const ModelLoadOptions& options) {
  const ModelHparams& hp = hparams_;
  const gguf::GgufFile& f = *file_;
  const int64_t q_dim = hp.n_head * hp.head_dim;
  const int64_t kv_dim = hp.n_head_kv * hp.head_dim;
  KILN_ASSIGN_OR_RETURN(token_embd_, Bind(f, "token_embd.weight", hp.n_embd, hp.n_vocab, false));
  KILN_ASSIGN_OR_RETURN(output_norm_, Bind(f, "output_norm.weight", hp.n_embd, 1, true));
  if (hp.tied_output) {
    output_ = token_embd_;
  } else {
    KILN_ASSIGN_OR_RETURN(output_, Bind(f, "output.weight", hp.n_embd, hp.n_vocab, false));
  }
  layers_.resize(hp.n_layer);
  for (int64_t i = 0; i < hp.n_layer; ++i) {
    const std::string p = kiln::StrCat("blk.", i, ".");
    LayerWeights& l = layers_[i];
    KILN_ASSIGN_OR_RETURN(l.attn_norm, Bind(f, p + "attn_norm.weight", hp.n_embd, 1, true));
    KILN_ASSIGN_OR_RETURN(l.wq, Bind(f, p + "attn_q.weight", hp.n_embd, q_dim, false));
    KILN_ASSIGN_OR_RETURN(l.wk, Bind(f, p + "attn_k.weight", hp.n_embd, kv_dim, false));
    KILN_ASSIGN_OR_RETURN(l.wv, Bind(f, p + "attn_v.weight", hp.n_embd, kv_dim, false));
    KILN_ASSIGN_OR_RETURN(l.wo, Bind(f, p + "attn_output.weight", q_dim, hp.n_embd, false));
    KILN_ASSIGN_OR_RETURN(l.ffn_norm, Bind(f, p + "ffn_norm.weight", hp.n_embd, 1, true));
    KILN_ASSIGN_OR_RETURN(l.ffn_gate, Bind(f, p + "ffn_gate.weight", hp.n_embd, hp.n_ff, false));
    KILN_ASSIGN_OR_RETURN(l.ffn_up, Bind(f, p + "ffn_up.weight", hp.n_embd, hp.n_ff, false));
    KILN_ASSIGN_OR_RETURN(l.ffn_down, Bind(f, p + "ffn_down.weight", hp.n_ff, hp.n_embd, false));
    if (options.progress &&
        !options.progress(0.3f + 0.7f * static_cast<float>(i + 1) / hp.n_layer)) {
      return absl::CancelledError("model load cancelled");
    }
  }
  return absl::OkStatus();
}

// Row-interleaved copies of the matrices whose type has an integer-order kernel on this CPU: what
// the default numeric mode multiplies with (LlamaForward; llama_cpp_order keeps the file's rows).
// One allocation; the mapped file's pages of those matrices are then read only in that mode.
absl::Status Model::InterleaveWeights() {
  std::vector<WeightView*> matrices;
  for (LayerWeights& l : layers_) {
    for (WeightView* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_gate, &l.ffn_up, &l.ffn_down}) {
      matrices.push_back(w);
    }
  }
  matrices.push_back(&output_);  // token_embd_ itself is only gathered from
  constexpr size_t kAlign = 64;
  auto bytes_of = [](const WeightView& w) -> size_t {
    if (w.kernels->interleave == nullptr) return 0;
    const int64_t groups = (w.n_out + quant::kInterleaveRows - 1) / quant::kInterleaveRows;
    const size_t bytes = groups * w.kernels->interleaved_group_bytes(w.n_in);
    return (bytes + kAlign - 1) / kAlign * kAlign;
  };
  size_t total = 0;
  for (const WeightView* w : matrices) total += bytes_of(*w);
  if (total == 0) return absl::OkStatus();
  interleaved_.reset(static_cast<uint8_t*>(std::aligned_alloc(kAlign, total)));
  if (interleaved_ == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("model: cannot allocate %d bytes for the interleaved weights", total));
  }
  interleaved_bytes_ = total;
  uint8_t* next = interleaved_.get();
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  for (WeightView* w : matrices) {
    const size_t bytes = bytes_of(*w);
    if (bytes == 0) continue;
    w->kernels->interleave(w->data, w->row_bytes, w->n_in, w->n_out, next);
    w->interleaved = next;
    next += bytes;
    if (file_->mapped()) {
      // Packing read the file's copy; drop its pages from this process (the default mode never
      // reads them again; the llama.cpp order or an embedding lookup re-reads them from the page
      // cache), so the copy does not double the model's resident memory.
      const auto begin = reinterpret_cast<uintptr_t>(w->data);
      const uintptr_t first = (begin + page - 1) / page * page;
      const uintptr_t last = (begin + w->row_bytes * w->n_out) / page * page;
      if (last > first) {
        madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);  // advice only
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace kiln
