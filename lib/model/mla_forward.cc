#include "lib/model/mla_forward.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "lib/quant/quant.h"

namespace kiln {
namespace {

template <typename T>
void Grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

std::string Blk(int64_t layer, const char* tensor) { return StrCat("blk.", layer, ".", tensor); }

// All rows of `w` as f32: [w.n_out, w.n_in].
absl::StatusOr<std::vector<float>> DequantizeAll(const WeightView& w) {
  const QuantKernels* k = GetQuantKernels(w.type, CpuLevel::kScalar);
  if (k == nullptr || k->dequantize == nullptr) {
    return absl::UnimplementedError(
        StrCat("model: tensor '", w.name, "' has a type kiln cannot dequantize"));
  }
  std::vector<float> out(static_cast<size_t>(w.n_out * w.n_in));
  for (int64_t r = 0; r < w.n_out; ++r) k->dequantize(w.Row(r), out.data() + r * w.n_in, w.n_in);
  return out;
}

struct MlaLayer {
  const WeightView* attn_norm;  // [n_embd] f32
  const WeightView* wq_a;       // [n_embd -> q_lora_rank], null without q-LoRA
  const WeightView* q_a_norm;   // [q_lora_rank] f32, null without q-LoRA
  const WeightView* wq_b;       // [q_lora_rank -> n_head·qk_head_dim], null without q-LoRA
  const WeightView* wq;         // [n_embd -> n_head·qk_head_dim], null with q-LoRA
  const WeightView* wkv_a;      // [n_embd -> kv_lora_rank + rope_dim]
  const WeightView* kv_a_norm;  // [kv_lora_rank] f32
  const WeightView* wo;         // [n_head·v_head_dim -> n_embd]
  const WeightView* ffn_norm;   // [n_embd] f32
  const WeightView* ffn_gate;   // [n_embd -> n_ff]
  const WeightView* ffn_up;     // [n_embd -> n_ff]
  const WeightView* ffn_down;   // [n_ff -> n_embd]
  std::vector<float> w_uk;      // [n_head][nope_dim][kv_lora_rank]: k_nope_h = W_UK_h c
  std::vector<float> w_uv;      // [n_head][v_head_dim][kv_lora_rank]: v_h = W_UV_h c
};

class MlaForward final : public ForwardPass {
 public:
  MlaForward(const Model& model, Backend& backend, std::vector<MlaLayer> layers)
      : model_(model), hp_(model.hparams()), backend_(backend), layers_(std::move(layers)) {}

  absl::Status Forward(const ForwardBatch& batch, KvCache& cache, ForwardOutput* out) override;
  // Not split yet: Begin keeps the batch, RunLayers only counts, Finish runs the whole pass
  // (same bits; a budgeted step then takes the whole pass in its head unit).
  absl::Status Begin(const ForwardBatch& batch, KvCache& cache, ForwardOutput* out) override {
    split_ = {&batch, &cache, out};
    next_layer_ = 0;
    return Validate(batch, cache);
  }
  absl::Status RunLayers(int32_t until) override {
    if (split_.batch == nullptr) return absl::FailedPreconditionError("forward: no pass begun");
    next_layer_ = std::clamp(until, next_layer_, n_layers());
    return absl::OkStatus();
  }
  absl::Status Finish() override {
    if (split_.batch == nullptr) return absl::FailedPreconditionError("forward: no pass begun");
    const SplitPass pass = split_;
    split_ = {};
    return Forward(*pass.batch, *pass.cache, pass.out);
  }
  int32_t n_layers() const override { return static_cast<int32_t>(hp_.n_layer); }
  int32_t next_layer() const override { return next_layer_; }
  Backend& backend() override { return backend_; }

 private:
  absl::Status Validate(const ForwardBatch& batch, const KvCache& cache) const;
  // What each token sees: the first prefix_len_[i] cache indices of its sequence (through
  // seq_blocks_) and then its tree ancestors' and its own slots (CSR: extra_indptr_,
  // extra_slots_).
  absl::Status BuildVisibility(const ForwardBatch& batch, const KvCache& cache);
  // One layer's attention for every token: q [n, n_head, qk_head_dim] (rope parts rotated),
  // the cache's latent rows -> attn_ [n, n_head, v_head_dim].
  void Attend(const MlaLayer& L, int32_t layer, const KvCache& cache, int64_t n);

  const Model& model_;
  const ModelHparams& hp_;
  Backend& backend_;
  std::vector<MlaLayer> layers_;
  struct SplitPass {
    const ForwardBatch* batch = nullptr;
    KvCache* cache = nullptr;
    ForwardOutput* out = nullptr;
  } split_;
  int32_t next_layer_ = 0;

  std::vector<int32_t> positions_, ids_, prefix_len_, token_seq_, extra_indptr_;
  std::vector<KvSlot> slots_, extra_slots_;
  std::vector<SeqId> seqs_;                       // the batch's sequences, in first-seen order
  std::vector<std::vector<BlockId>> seq_blocks_;  // [seqs_] each one's block table
  std::vector<float> x_, h_, qa_, q_, kva_, latent_, kr_, qpe_, qabs_, rows_, scores_, olat_, attn_,
      proj_, gate_, up_;
};

absl::Status MlaForward::Validate(const ForwardBatch& batch, const KvCache& cache) const {
  const KvLayout& layout = cache.layout();
  if (layout.kind() != KvAttentionKind::kMla || layout.n_layers() != hp_.n_layer ||
      layout.kv_lora_rank() != hp_.mla.kv_lora_rank || layout.rope_dim() != hp_.mla.rope_dim) {
    return absl::InvalidArgumentError(
        "forward: the KV cache layout does not match the model (an MLA latent cache is needed)");
  }
  return CheckBatchTokens(batch, cache, hp_.n_vocab);
}

absl::Status MlaForward::BuildVisibility(const ForwardBatch& batch, const KvCache& cache) {
  const size_t n = batch.tokens.size();
  positions_.resize(n);
  ids_.resize(n);
  slots_.resize(n);
  prefix_len_.resize(n);
  token_seq_.resize(n);
  extra_indptr_.assign(1, 0);
  extra_slots_.clear();
  seqs_.clear();
  for (size_t i = 0; i < n; ++i) {
    const BatchToken& t = batch.tokens[i];
    positions_[i] = t.pos;
    ids_[i] = t.token;
    KILN_ASSIGN_OR_RETURN(slots_[i], cache.SlotOf(t.seq, t.cache_index));
    auto it = std::find(seqs_.begin(), seqs_.end(), t.seq);
    token_seq_[i] = static_cast<int32_t>(it - seqs_.begin());
    if (it == seqs_.end()) seqs_.push_back(t.seq);
    // The causal root's prefix (the token's own when causal), then the tree ancestors below it.
    int32_t root = static_cast<int32_t>(i);
    while (batch.tokens[root].parent >= 0) root = batch.tokens[root].parent;
    prefix_len_[i] = batch.tokens[root].cache_index + 1;
    const size_t first_extra = extra_slots_.size();
    for (int32_t a = static_cast<int32_t>(i); a != root; a = batch.tokens[a].parent) {
      extra_slots_.push_back(slots_[a]);
    }
    std::reverse(extra_slots_.begin() + static_cast<std::ptrdiff_t>(first_extra),
                 extra_slots_.end());  // ancestors in cache order, the token itself last
    extra_indptr_.push_back(static_cast<int32_t>(extra_slots_.size()));
  }
  seq_blocks_.resize(seqs_.size());
  for (size_t s = 0; s < seqs_.size(); ++s) {
    KILN_ASSIGN_OR_RETURN(std::span<const BlockId> table, cache.BlockTable(seqs_[s]));
    seq_blocks_[s].assign(table.begin(), table.end());
  }
  return absl::OkStatus();
}

void MlaForward::Attend(const MlaLayer& L, int32_t layer, const KvCache& cache, int64_t n) {
  const MlaHparams& m = hp_.mla;
  const int64_t n_head = hp_.n_head, kvl = m.kv_lora_rank, nope = m.nope_dim, rd = m.rope_dim,
                qk = m.qk_head_dim(), vd = m.v_head_dim, row = kvl + rd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(qk));
  const KvLayout& layout = cache.layout();
  const GgmlType et = layout.elem_type();
  Grow(qabs_, static_cast<size_t>(n_head * row));
  Grow(olat_, static_cast<size_t>(n_head * kvl));
  for (int64_t i = 0; i < n; ++i) {
    // Absorb W_UK into each head's query: q_abs = [W_UK_hᵀ q_nope | q_rope].
    for (int64_t h = 0; h < n_head; ++h) {
      const float* qh = q_.data() + (i * n_head + h) * qk;
      float* qa = qabs_.data() + h * row;
      std::fill(qa, qa + kvl, 0.0f);
      for (int64_t d = 0; d < nope; ++d) {
        const float* wrow = L.w_uk.data() + (h * nope + d) * kvl;
        for (int64_t r = 0; r < kvl; ++r) qa[r] += wrow[r] * qh[d];
      }
      std::memcpy(qa + kvl, qpe_.data() + (i * n_head + h) * rd, rd * sizeof(float));
    }
    // The visible latent rows, as f32.                     rows_: [n_vis, kvl + rd]
    const int32_t n_prefix = prefix_len_[i], extra_begin = extra_indptr_[i];
    const int32_t n_vis = n_prefix + extra_indptr_[i + 1] - extra_begin;
    const std::vector<BlockId>& blocks = seq_blocks_[token_seq_[i]];
    const int32_t bs = layout.block_size();
    Grow(rows_, static_cast<size_t>(n_vis * row));
    Grow(scores_, static_cast<size_t>(n_vis));
    for (int32_t j = 0; j < n_vis; ++j) {
      const KvSlot s = j < n_prefix ? KvSlot{blocks[j / bs], j % bs}
                                    : extra_slots_[extra_begin + (j - n_prefix)];
      const std::byte* src = cache.BlockData(s.block) + layout.LatentTileOffset(layer) +
                             static_cast<size_t>(s.offset) * layout.row_bytes();
      for (int64_t e = 0; e < row; ++e) {
        rows_[j * row + e] = LoadKvElement(et, src, static_cast<size_t>(e));
      }
    }
    for (int64_t h = 0; h < n_head; ++h) {
      const float* qa = qabs_.data() + h * row;
      float max_score = -std::numeric_limits<float>::infinity();
      for (int32_t j = 0; j < n_vis; ++j) {
        const float* lj = rows_.data() + j * row;
        float dot = 0.0f;
        for (int64_t e = 0; e < row; ++e) dot += qa[e] * lj[e];
        scores_[j] = dot * scale;
        max_score = std::max(max_score, scores_[j]);
      }
      float sum = 0.0f;
      for (int32_t j = 0; j < n_vis; ++j) {
        scores_[j] = std::exp(scores_[j] - max_score);
        sum += scores_[j];
      }
      float* ol = olat_.data() + h * kvl;
      std::fill(ol, ol + kvl, 0.0f);
      for (int32_t j = 0; j < n_vis; ++j) {
        const float p = scores_[j] / sum;
        const float* cj = rows_.data() + j * row;
        for (int64_t r = 0; r < kvl; ++r) ol[r] += p * cj[r];
      }
      // W_UV after the weighted sum: out_h = W_UV_h (Σ_j p_j c_j).
      float* oh = attn_.data() + (i * n_head + h) * vd;
      for (int64_t e = 0; e < vd; ++e) {
        const float* wrow = L.w_uv.data() + (h * vd + e) * kvl;
        float acc = 0.0f;
        for (int64_t r = 0; r < kvl; ++r) acc += wrow[r] * ol[r];
        oh[e] = acc;
      }
    }
  }
}

absl::Status MlaForward::Forward(const ForwardBatch& batch, KvCache& cache, ForwardOutput* out) {
  KILN_RETURN_IF_ERROR(Validate(batch, cache));
  KILN_RETURN_IF_ERROR(BuildVisibility(batch, cache));
  const MlaHparams& m = hp_.mla;
  const int64_t n = static_cast<int64_t>(batch.tokens.size());
  const int64_t d = hp_.n_embd, n_head = hp_.n_head, kvl = m.kv_lora_rank, rd = m.rope_dim,
                nope = m.nope_dim, qk = m.qk_head_dim(), row = kvl + rd, ff = hp_.n_ff;
  Grow(x_, n * d);
  Grow(h_, n * d);
  Grow(qa_, n * std::max<int64_t>(m.q_lora_rank, 1));
  Grow(q_, n * n_head * qk);
  Grow(kva_, n * row);
  Grow(latent_, n * row);
  Grow(kr_, n * rd);
  Grow(qpe_, n * n_head * rd);
  Grow(attn_, n * n_head * m.v_head_dim);
  Grow(proj_, n * d);
  Grow(gate_, n * ff);
  Grow(up_, n * ff);

  out->n_vocab = hp_.n_vocab;
  out->logit_tokens.clear();
  for (int64_t i = 0; i < n; ++i) {
    if (batch.tokens[i].want_logits) out->logit_tokens.push_back(static_cast<int32_t>(i));
  }
  const int64_t n_logits = static_cast<int64_t>(out->logit_tokens.size());
  const KvLayout& layout = cache.layout();

  KILN_RETURN_IF_ERROR(backend_.EmbeddingGather(
      model_.token_embd(), std::span<const int32_t>(ids_.data(), n), x_.data()));
  // Every layer rotates the same rope_dim-long parts at the same positions.
  KILN_RETURN_IF_ERROR(backend_.PrepareRope(hp_.rope, static_cast<int32_t>(rd),
                                            std::span<const int32_t>(positions_.data(), n)));
  float* x = x_.data();
  float* h = h_.data();
  for (int32_t il = 0; il < hp_.n_layer; ++il) {
    const MlaLayer& L = layers_[il];
    // Attention block.                                         x, h: [n, n_embd]
    backend_.RmsNorm(x, L.attn_norm->AsF32(), n, d, hp_.rms_eps, h);
    if (L.wq_a != nullptr) {
      KILN_RETURN_IF_ERROR(backend_.MatMul(*L.wq_a, h, n, qa_.data()));  // [n, q_lora_rank]
      backend_.RmsNorm(qa_.data(), L.q_a_norm->AsF32(), n, m.q_lora_rank, hp_.rms_eps, qa_.data());
      KILN_RETURN_IF_ERROR(backend_.MatMul(*L.wq_b, qa_.data(), n, q_.data()));  // [n, H·qk]
    } else {
      KILN_RETURN_IF_ERROR(backend_.MatMul(*L.wq, h, n, q_.data()));  // [n, H·qk]
    }
    KILN_RETURN_IF_ERROR(backend_.MatMul(*L.wkv_a, h, n, kva_.data()));  // [n, kvl + rd]
    for (int64_t i = 0; i < n; ++i) {
      // latent = [rmsnorm(c) · kv_a_norm | rope(kr)]
      backend_.RmsNorm(kva_.data() + i * row, L.kv_a_norm->AsF32(), 1, kvl, hp_.rms_eps,
                       latent_.data() + i * row);
      std::memcpy(kr_.data() + i * rd, kva_.data() + i * row + kvl, rd * sizeof(float));
      for (int64_t hh = 0; hh < n_head; ++hh) {
        std::memcpy(qpe_.data() + (i * n_head + hh) * rd, q_.data() + (i * n_head + hh) * qk + nope,
                    rd * sizeof(float));
      }
    }
    backend_.RotateRope(kr_.data(), 1);
    backend_.RotateRope(qpe_.data(), n_head);
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(latent_.data() + i * row + kvl, kr_.data() + i * rd, rd * sizeof(float));
      std::byte* dst = cache.BlockData(slots_[i].block) + layout.LatentTileOffset(il) +
                       static_cast<size_t>(slots_[i].offset) * layout.row_bytes();
      for (int64_t e = 0; e < row; ++e) {
        StoreKvElement(layout.elem_type(), dst, static_cast<size_t>(e), latent_[i * row + e]);
      }
    }
    Attend(L, il, cache, n);
    KILN_RETURN_IF_ERROR(backend_.MatMul(*L.wo, attn_.data(), n, proj_.data()));  // [n, n_embd]
    backend_.Add(x, proj_.data(), n * d, x);
    // The last layer's feed-forward runs only for the logit tokens (as the decoder's does).
    int64_t rows = n;
    if (il == hp_.n_layer - 1) {
      rows = n_logits;
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t src = out->logit_tokens[i];
        if (src != i) std::memcpy(x + i * d, x + src * d, d * sizeof(float));
      }
      if (rows == 0) break;
    }
    // Dense SwiGLU feed-forward.                            x, h: [rows, n_embd]
    backend_.RmsNorm(x, L.ffn_norm->AsF32(), rows, d, hp_.rms_eps, h);
    KILN_RETURN_IF_ERROR(backend_.MatMul(*L.ffn_gate, h, rows, gate_.data()));
    KILN_RETURN_IF_ERROR(backend_.MatMul(*L.ffn_up, h, rows, up_.data()));
    backend_.SwiGlu(gate_.data(), up_.data(), rows * ff, gate_.data());
    KILN_RETURN_IF_ERROR(backend_.MatMul(*L.ffn_down, gate_.data(), rows, proj_.data()));
    backend_.Add(x, proj_.data(), rows * d, x);
  }
  out->logits.resize(n_logits * hp_.n_vocab);
  if (n_logits > 0) {
    backend_.RmsNorm(x, model_.output_norm().AsF32(), n_logits, d, hp_.rms_eps, h);
    KILN_RETURN_IF_ERROR(backend_.MatMul(model_.output(), h, n_logits, out->logits.data()));
  }
  out->n_embd = batch.want_hidden ? d : 0;
  if (batch.want_hidden && n_logits > 0) {
    out->hidden.assign(h, h + n_logits * d);
  } else {
    out->hidden.clear();
  }
  // Causal tokens are final; tree nodes stay provisional until the caller commits a path.
  std::vector<SeqId> seqs;
  for (const BatchToken& t : batch.tokens) {
    if (std::find(seqs.begin(), seqs.end(), t.seq) == seqs.end()) seqs.push_back(t.seq);
  }
  for (SeqId s : seqs) {
    int32_t done = -1;
    for (const BatchToken& t : batch.tokens) {
      if (t.seq == s && t.parent < 0) done = std::max(done, t.cache_index + 1);
    }
    KILN_ASSIGN_OR_RETURN(int32_t computed, cache.NumComputed(s));
    if (done > computed) KILN_RETURN_IF_ERROR(cache.MarkComputed(s, done));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ForwardPass>> NewMlaForward(const Model& model, Backend& backend) {
  const ModelHparams& hp = model.hparams();
  const MlaHparams& m = hp.mla;
  if (hp.rope.scaling != RopeScaling::kNone) {
    return absl::UnimplementedError(
        "model: the deepseek2 forward pass does not support rope scaling (YaRN) yet");
  }
  if (m.n_layer_dense_lead < hp.n_layer) {
    return absl::UnimplementedError(
        "model: the deepseek2 forward pass does not support mixture-of-experts layers yet");
  }
  std::vector<MlaLayer> layers(static_cast<size_t>(hp.n_layer));
  auto required = [&](int64_t l, const char* name) -> absl::StatusOr<const WeightView*> {
    const WeightView* w = model.Tensor(Blk(l, name));
    if (w == nullptr) {
      return absl::InvalidArgumentError(StrCat("model: missing tensor '", Blk(l, name), "'"));
    }
    return w;
  };
  const int64_t n_head = hp.n_head, kvl = m.kv_lora_rank, nope = m.nope_dim, vd = m.v_head_dim;
  for (int64_t l = 0; l < hp.n_layer; ++l) {
    MlaLayer& L = layers[static_cast<size_t>(l)];
    KILN_ASSIGN_OR_RETURN(L.attn_norm, required(l, "attn_norm.weight"));
    L.wq_a = L.q_a_norm = L.wq_b = L.wq = nullptr;
    if (m.q_lora_rank > 0) {
      KILN_ASSIGN_OR_RETURN(L.wq_a, required(l, "attn_q_a.weight"));
      KILN_ASSIGN_OR_RETURN(L.q_a_norm, required(l, "attn_q_a_norm.weight"));
      KILN_ASSIGN_OR_RETURN(L.wq_b, required(l, "attn_q_b.weight"));
    } else {
      KILN_ASSIGN_OR_RETURN(L.wq, required(l, "attn_q.weight"));
    }
    KILN_ASSIGN_OR_RETURN(L.wkv_a, required(l, "attn_kv_a_mqa.weight"));
    KILN_ASSIGN_OR_RETURN(L.kv_a_norm, required(l, "attn_kv_a_norm.weight"));
    KILN_ASSIGN_OR_RETURN(L.wo, required(l, "attn_output.weight"));
    KILN_ASSIGN_OR_RETURN(L.ffn_norm, required(l, "ffn_norm.weight"));
    KILN_ASSIGN_OR_RETURN(L.ffn_gate, required(l, "ffn_gate.weight"));
    KILN_ASSIGN_OR_RETURN(L.ffn_up, required(l, "ffn_up.weight"));
    KILN_ASSIGN_OR_RETURN(L.ffn_down, required(l, "ffn_down.weight"));
    L.w_uk.resize(static_cast<size_t>(n_head * nope * kvl));
    L.w_uv.resize(static_cast<size_t>(n_head * vd * kvl));
    if (m.split_kv_b) {
      // attn_k_b: per head kv_lora_rank rows of nope_dim (W_UKᵀ); attn_v_b: per head v_head_dim
      // rows of kv_lora_rank (W_UV).
      KILN_ASSIGN_OR_RETURN(const WeightView* kb, required(l, "attn_k_b.weight"));
      KILN_ASSIGN_OR_RETURN(const WeightView* vb, required(l, "attn_v_b.weight"));
      KILN_ASSIGN_OR_RETURN(std::vector<float> k_b, DequantizeAll(*kb));
      KILN_ASSIGN_OR_RETURN(std::vector<float> v_b, DequantizeAll(*vb));
      for (int64_t hh = 0; hh < n_head; ++hh) {
        for (int64_t dd = 0; dd < nope; ++dd) {
          for (int64_t r = 0; r < kvl; ++r) {
            L.w_uk[(hh * nope + dd) * kvl + r] = k_b[(hh * kvl + r) * nope + dd];
          }
        }
      }
      L.w_uv = std::move(v_b);
    } else {
      // attn_kv_b: per head nope_dim key rows then v_head_dim value rows, each kv_lora_rank long.
      KILN_ASSIGN_OR_RETURN(const WeightView* kvb, required(l, "attn_kv_b.weight"));
      KILN_ASSIGN_OR_RETURN(std::vector<float> kv_b, DequantizeAll(*kvb));
      for (int64_t hh = 0; hh < n_head; ++hh) {
        const float* head = kv_b.data() + hh * (nope + vd) * kvl;
        std::copy(head, head + nope * kvl, L.w_uk.begin() + hh * nope * kvl);
        std::copy(head + nope * kvl, head + (nope + vd) * kvl, L.w_uv.begin() + hh * vd * kvl);
      }
    }
  }
  return std::unique_ptr<ForwardPass>(new MlaForward(model, backend, std::move(layers)));
}

}  // namespace kiln
