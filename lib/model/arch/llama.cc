#include "lib/model/arch/llama.h"

#include <algorithm>
#include <cstring>

#include "lib/backend/cpu/dispatch.h"
#include "lib/common/half.h"

namespace kiln {
namespace {

// integer_order: multiply with the row-interleaved copy where the model has one (the default
// numeric mode); off, with the file's rows in vec_dot's (llama.cpp's) order.
cpu::WeightView ToCpu(const WeightView& w, bool integer_order = false) {
  cpu::WeightView v;
  v.type = w.type;
  v.data = w.data;
  v.n_in = w.n_in;
  v.n_out = w.n_out;
  if (integer_order) v.interleaved = w.interleaved;
  return v;
}

cpu::RopeConfig RopeConfigOf(const ModelHparams& hp) {
  const RopeParams& r = hp.rope;
  cpu::RopeConfig c;
  c.mode = r.type == RopeType::kNeox ? cpu::RopeMode::kNeox : cpu::RopeMode::kNorm;
  c.n_rot = r.n_rot;
  c.freq_base = r.freq_base;
  c.freq_scale = r.freq_scale;
  c.orig_ctx = r.n_ctx_orig;
  c.freq_factors = r.freq_factors.empty() ? nullptr : r.freq_factors.data();
  switch (r.scaling) {
    case RopeScaling::kNone:
      c.scaling = cpu::RopeScaling::kNone;
      break;
    case RopeScaling::kLinear:
      c.scaling = cpu::RopeScaling::kLinear;
      break;
    case RopeScaling::kLlama3:
      c.scaling = cpu::RopeScaling::kLlama3;
      break;
    case RopeScaling::kYarn:
      c.scaling = cpu::RopeScaling::kYarn;
      c.ext_factor = r.yarn_ext_factor;
      c.attn_factor = r.yarn_attn_factor;
      c.beta_fast = r.yarn_beta_fast;
      c.beta_slow = r.yarn_beta_slow;
      break;
  }
  return c;
}

// Stores one f32 row as the cache's element type.
void StoreRow(const cpu::OpKernels& k, const float* src, int64_t n, GgmlType type, std::byte* dst) {
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      break;
    case GgmlType::kF16:
      k.store_f16(src, n, reinterpret_cast<uint16_t*>(dst));
      break;
    case GgmlType::kBF16: {
      auto* d = reinterpret_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = Fp32ToBf16(src[i]);
      break;
    }
    default:
      break;  // KvLayout admits only the three types above
  }
}

template <typename T>
void Grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

}  // namespace

LlamaForward::LlamaForward(const Model& model, int n_threads)
    : model_(model), hp_(model.hparams()), pool_(n_threads), rope_(RopeConfigOf(model.hparams())) {}

absl::StatusOr<KvLayout> LlamaForward::CacheLayout(const ModelHparams& hp, GgmlType kv_type,
                                                   int32_t block_size) {
  return KvLayout::Gqa(static_cast<int32_t>(hp.n_layer), static_cast<int32_t>(hp.n_head_kv),
                       static_cast<int32_t>(hp.head_dim), kv_type, block_size);
}

absl::Status LlamaForward::Validate(const ForwardBatch& batch, const KvCache& cache) {
  const KvLayout& layout = cache.layout();
  if (layout.kind() != KvAttentionKind::kGqa || layout.n_layers() != hp_.n_layer ||
      layout.n_kv_heads() != hp_.n_head_kv || layout.head_dim() != hp_.head_dim) {
    return absl::InvalidArgumentError("forward: the KV cache layout does not match the model");
  }
  if (batch.tokens.empty()) return absl::InvalidArgumentError("forward: empty batch");
  for (int32_t layer : batch.hidden_layers) {
    if (layer < 0 || layer > hp_.n_layer) {
      return absl::InvalidArgumentError(
          StrCat("forward: hidden layer ", layer, " outside [0, ", hp_.n_layer, "]"));
    }
  }
  for (size_t i = 0; i < batch.tokens.size(); ++i) {
    const BatchToken& t = batch.tokens[i];
    if (t.token < 0 || t.token >= hp_.n_vocab) {
      return absl::InvalidArgumentError(
          StrCat("forward: token ", i, " has id ", t.token, " outside [0, ", hp_.n_vocab, ")"));
    }
    if (t.pos < 0)
      return absl::OutOfRangeError(StrCat("forward: token ", i, " has position ", t.pos));
    auto len = cache.Length(t.seq);
    if (!len.ok()) {
      return absl::InvalidArgumentError(StrCat("forward: token ", i, ": ", len.status().message()));
    }
    if (t.cache_index < 0 || t.cache_index >= *len) {
      return absl::OutOfRangeError(StrCat("forward: token ", i, " cache index ", t.cache_index,
                                          " outside its sequence's ", *len, " slots"));
    }
    if (t.parent >= 0) {
      if (t.parent >= static_cast<int32_t>(i) || batch.tokens[t.parent].seq != t.seq) {
        return absl::InvalidArgumentError(
            StrCat("forward: token ", i, " has parent ", t.parent,
                   ", which is not an earlier token of its sequence"));
      }
      if (batch.tokens[t.parent].cache_index >= t.cache_index) {
        return absl::InvalidArgumentError(
            StrCat("forward: tree token ", i, " must sit after its parent in the cache"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status LlamaForward::BuildAttention(const ForwardBatch& batch, KvCache& cache) {
  const size_t n = batch.tokens.size();
  seqs_.clear();
  token_seq_.resize(n);
  slots_.resize(n);
  positions_.resize(n);
  ids_.resize(n);
  n_visible_.resize(n);
  extra_indptr_.clear();
  extra_positions_.clear();
  bool any_tree = false;
  for (size_t i = 0; i < n; ++i) {
    const BatchToken& t = batch.tokens[i];
    auto it = std::find(seqs_.begin(), seqs_.end(), t.seq);
    token_seq_[i] = static_cast<int32_t>(it - seqs_.begin());
    if (it == seqs_.end()) seqs_.push_back(t.seq);
    KILN_ASSIGN_OR_RETURN(slots_[i], cache.SlotOf(t.seq, t.cache_index));
    positions_[i] = t.pos;
    ids_[i] = t.token;
    any_tree |= t.parent >= 0;
  }
  KILN_RETURN_IF_ERROR(cache.BuildTables(seqs_, &tables_));
  // Visibility: causal tokens see [0, cache_index]; a tree node sees up to its causal root plus
  // the cache slots of its tree ancestors and itself.
  if (any_tree) extra_indptr_.push_back(0);
  for (size_t i = 0; i < n; ++i) {
    const BatchToken& t = batch.tokens[i];
    if (t.parent < 0) {
      n_visible_[i] = t.cache_index + 1;
      if (any_tree) extra_indptr_.push_back(static_cast<int32_t>(extra_positions_.size()));
      continue;
    }
    const size_t first = extra_positions_.size();
    int32_t node = static_cast<int32_t>(i);
    while (batch.tokens[node].parent >= 0) {
      extra_positions_.push_back(batch.tokens[node].cache_index);
      node = batch.tokens[node].parent;
    }
    n_visible_[i] = batch.tokens[node].cache_index + 1;
    std::reverse(extra_positions_.begin() + first, extra_positions_.end());
    extra_indptr_.push_back(static_cast<int32_t>(extra_positions_.size()));
  }
  return absl::OkStatus();
}

void LlamaForward::WriteKv(KvCache& cache, int32_t layer, const float* k, const float* v) {
  const int64_t hd = hp_.head_dim, kv_dim = hp_.n_head_kv * hd;
  const GgmlType type = cache.layout().elem_type();
  const cpu::OpKernels& kernels = cpu::GetOpKernels(BestCpuLevel());
  for (size_t i = 0; i < slots_.size(); ++i) {
    for (int32_t h = 0; h < hp_.n_head_kv; ++h) {
      StoreRow(kernels, k + i * kv_dim + h * hd, hd, type, cache.KeyRow(slots_[i], layer, h));
      StoreRow(kernels, v + i * kv_dim + h * hd, hd, type, cache.ValueRow(slots_[i], layer, h));
    }
  }
}

absl::Status LlamaForward::Forward(const ForwardBatch& batch, KvCache& cache, ForwardOutput* out) {
  KILN_RETURN_IF_ERROR(Validate(batch, cache));
  KILN_RETURN_IF_ERROR(BuildAttention(batch, cache));
  const int64_t n = static_cast<int64_t>(batch.tokens.size());
  const int64_t d = hp_.n_embd, hd = hp_.head_dim, q_dim = hp_.n_head * hd,
                kv_dim = hp_.n_head_kv * hd, ff = hp_.n_ff;
  Grow(x_, n * d);
  Grow(h_, n * d);
  Grow(q_, n * q_dim);
  Grow(k_, n * kv_dim);
  Grow(v_, n * kv_dim);
  Grow(attn_, n * q_dim);
  Grow(proj_, n * d);
  Grow(gate_, n * ff);
  Grow(up_, n * ff);

  out->n_vocab = hp_.n_vocab;
  out->n_embd = d;
  out->logit_tokens.clear();
  out->hidden_tokens.clear();
  for (int64_t i = 0; i < n; ++i) {
    if (batch.tokens[i].want_logits) out->logit_tokens.push_back(static_cast<int32_t>(i));
    if (batch.tokens[i].want_hidden) out->hidden_tokens.push_back(static_cast<int32_t>(i));
  }
  const size_t n_hidden_layers = batch.hidden_layers.size();
  out->hidden.resize(out->hidden_tokens.size() * n_hidden_layers * d);
  auto save_hidden = [&](int32_t layer, const float* rows) {
    for (size_t li = 0; li < n_hidden_layers; ++li) {
      if (batch.hidden_layers[li] != layer) continue;
      for (size_t r = 0; r < out->hidden_tokens.size(); ++r) {
        std::memcpy(out->hidden.data() + (r * n_hidden_layers + li) * d,
                    rows + static_cast<size_t>(out->hidden_tokens[r]) * d, d * sizeof(float));
      }
    }
  };

  const KvLayout& layout = cache.layout();
  const std::byte* pool_base = cache.BlockData(0);
  cpu::PagedKvView kv;
  kv.block_size = layout.block_size();
  kv.n_kv_heads = static_cast<int32_t>(hp_.n_head_kv);
  kv.head_dim = static_cast<int32_t>(hd);
  kv.n_blocks = cache.NumBlocks();
  kv.k.type = kv.v.type = layout.elem_type();
  kv.k.block_stride_bytes = kv.v.block_stride_bytes = static_cast<int64_t>(layout.block_bytes());
  kv.k.head_stride_bytes = kv.v.head_stride_bytes = static_cast<int64_t>(layout.tile_bytes());

  cpu::AttentionBatch ab;
  ab.seq = token_seq_;
  ab.kv_indptr = tables_.indptr;
  ab.kv_indices = tables_.indices;
  ab.n_visible = std::span<const int32_t>(n_visible_.data(), n);
  ab.extra_indptr = extra_indptr_;
  ab.extra_positions = extra_positions_;

  KILN_RETURN_IF_ERROR(rope_table_.Build(rope_, static_cast<int32_t>(hd),
                                         std::span<const int32_t>(positions_.data(), n)));
  KILN_RETURN_IF_ERROR(cpu::EmbeddingGather(ToCpu(model_.token_embd()),
                                            std::span<const int32_t>(ids_.data(), n), x_.data()));
  float* x = x_.data();
  float* h = h_.data();
  // Matrices: the integer order on interleaved copies by default, vec_dot's in llama.cpp order.
  auto weight = [this](const WeightView& w) { return ToCpu(w, !llama_cpp_order_); };
  const cpu::AttentionOrder order = !llama_cpp_order_ ? cpu::AttentionOrder::kBatchInvariant
                                    : n >= 2          ? cpu::AttentionOrder::kLlamaCppPrompt
                                                      : cpu::AttentionOrder::kLlamaCppDecode;
  for (int32_t il = 0; il < hp_.n_layer; ++il) {
    const LayerWeights& L = model_.layers()[il];
    // Attention block.                                         x, h: [n, n_embd]
    cpu::RmsNorm(x, L.attn_norm.AsF32(), n, d, hp_.rms_eps, h);
    KILN_RETURN_IF_ERROR(
        cpu::MatMul(pool_, weight(L.wq), h, n, q_.data(), scratch_));  // [n, q_dim]
    KILN_RETURN_IF_ERROR(
        cpu::MatMul(pool_, weight(L.wk), h, n, k_.data(), scratch_));  // [n, kv_dim]
    KILN_RETURN_IF_ERROR(
        cpu::MatMul(pool_, weight(L.wv), h, n, v_.data(), scratch_));  // [n, kv_dim]
    rope_table_.Apply(q_.data(), hp_.n_head);
    rope_table_.Apply(k_.data(), hp_.n_head_kv);
    WriteKv(cache, il, k_.data(), v_.data());
    kv.k.base = pool_base + layout.KeyTileOffset(il, 0);
    kv.v.base = pool_base + layout.ValueTileOffset(il, 0);
    KILN_RETURN_IF_ERROR(cpu::PagedAttention(pool_, kv, ab, q_.data(),
                                             static_cast<int32_t>(hp_.n_head), attn_.data(), 0.0f,
                                             scratch_, order));  // [n, q_dim]
    KILN_RETURN_IF_ERROR(cpu::MatMul(pool_, weight(L.wo), attn_.data(), n, proj_.data(), scratch_));
    cpu::Add(x, proj_.data(), n * d, x);
    // Feed-forward block (SwiGLU).
    cpu::RmsNorm(x, L.ffn_norm.AsF32(), n, d, hp_.rms_eps, h);
    KILN_RETURN_IF_ERROR(cpu::MatMul(pool_, weight(L.ffn_gate), h, n, gate_.data(), scratch_));
    KILN_RETURN_IF_ERROR(cpu::MatMul(pool_, weight(L.ffn_up), h, n, up_.data(), scratch_));
    cpu::SwiGlu(gate_.data(), up_.data(), n * ff, gate_.data());  // [n, n_ff]
    KILN_RETURN_IF_ERROR(
        cpu::MatMul(pool_, weight(L.ffn_down), gate_.data(), n, proj_.data(), scratch_));
    cpu::Add(x, proj_.data(), n * d, x);
    save_hidden(il, x);
  }
  cpu::RmsNorm(x, model_.output_norm().AsF32(), n, d, hp_.rms_eps, h);
  save_hidden(static_cast<int32_t>(hp_.n_layer), h);
  out->logits.resize(out->logit_tokens.size() * hp_.n_vocab);
  if (!out->logit_tokens.empty()) {
    KILN_RETURN_IF_ERROR(cpu::MatMulRows(pool_, weight(model_.output()), h, n, out->logit_tokens,
                                         out->logits.data(), scratch_));  // [n_logits, n_vocab]
  }
  // Causal tokens are final; tree nodes stay provisional until the caller commits a path.
  for (size_t s = 0; s < seqs_.size(); ++s) {
    int32_t done = -1;
    for (int64_t i = 0; i < n; ++i) {
      if (token_seq_[i] == static_cast<int32_t>(s) && batch.tokens[i].parent < 0) {
        done = std::max(done, batch.tokens[i].cache_index + 1);
      }
    }
    KILN_ASSIGN_OR_RETURN(int32_t computed, cache.NumComputed(seqs_[s]));
    if (done > computed) KILN_RETURN_IF_ERROR(cache.MarkComputed(seqs_[s], done));
  }
  return absl::OkStatus();
}

}  // namespace kiln
