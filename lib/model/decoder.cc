#include "lib/model/decoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kiln {
namespace {

template <typename T>
void Grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

std::string Blk(int64_t layer, const char* tensor) { return StrCat("blk.", layer, ".", tensor); }

// One pass's batch state, kept from Begin to Finish.
struct PassState {
  const ForwardBatch* batch = nullptr;
  KvCache* cache = nullptr;
  ForwardOutput* out = nullptr;
  int64_t n = 0;         // batch tokens
  int64_t n_logits = 0;  // tokens that want logits
  int32_t next_layer = 0;
  bool begun = false;
  // The output head, over the vocabulary's rows: [0, next_head_row) are computed. head_rows is
  // what RunHead may split (0: Finish runs the head whole).
  int64_t head_rows = 0;
  int64_t next_head_row = 0;
  bool head_normed = false;        // head_in holds the normed rows
  std::vector<float> head_in;      // [n_logits, n_embd] the final norm of the logit tokens' rows
  std::vector<SeqId> seqs;         // unique sequences in batch order
  std::vector<int32_t> token_seq;  // [n_tokens] index into seqs
  std::vector<KvSlot> slots;       // [n_tokens] where each token's K/V go
  std::vector<int32_t> positions, ids, n_visible, first_visible, extra_indptr, extra_positions;
  std::vector<int32_t> tree_nodes, tree_parent, tree_slot, tree_indptr;
  KvTables tables;
  std::vector<float> x;  // [n_tokens, n_embd] the residual stream
};

class DecoderForward final : public ForwardPass {
 public:
  DecoderForward(const Model& model, Backend& backend, std::vector<DecoderLayer> layers,
                 const DecoderGraph& graph)
      : model_(model),
        hp_(model.hparams()),
        backend_(backend),
        layers_(std::move(layers)),
        graph_(graph),
        block_(backend, graph,
               {hp_.n_embd, hp_.n_head, hp_.n_head_kv, hp_.head_dim, hp_.n_ff, hp_.rms_eps}),
        head_unit_rows_(HeadUnitRows()) {}

  absl::Status Forward(const ForwardBatch& batch, KvCache& cache, ForwardOutput* out) override {
    absl::Status st = BeginState(whole_, batch, cache, out);
    if (st.ok()) st = RunLayersState(whole_, static_cast<int32_t>(hp_.n_layer));
    if (st.ok()) st = FinishState(whole_);
    return st;
  }
  absl::Status Begin(const ForwardBatch& batch, KvCache& cache, ForwardOutput* out) override {
    return BeginState(split_, batch, cache, out);
  }
  absl::Status RunLayers(int32_t until) override { return RunLayersState(split_, until); }
  absl::Status RunHead(int64_t until) override { return RunHeadState(split_, until); }
  absl::Status Finish() override { return FinishState(split_); }
  int32_t n_layers() const override { return static_cast<int32_t>(hp_.n_layer); }
  int32_t next_layer() const override { return split_.next_layer; }
  int64_t head_rows() const override { return split_.head_rows; }
  int64_t next_head_row() const override { return split_.next_head_row; }
  int64_t head_unit_rows() const override { return head_unit_rows_; }
  Backend& backend() override { return backend_; }

 private:
  absl::Status Validate(const ForwardBatch& batch, const KvCache& cache) const;
  absl::Status BuildMask(PassState& s);
  absl::Status BeginState(PassState& s, const ForwardBatch& batch, KvCache& cache,
                          ForwardOutput* out);
  absl::Status RunLayersState(PassState& s, int32_t until);
  absl::Status RunHeadState(PassState& s, int64_t until);
  // Computes the logits of the head rows [s.next_head_row, end).
  absl::Status HeadRows(PassState& s, int64_t end);
  absl::Status FinishState(PassState& s);
  int64_t HeadUnitRows() const;

  const Model& model_;
  const ModelHparams& hp_;
  Backend& backend_;
  std::vector<DecoderLayer> layers_;
  const DecoderGraph graph_;
  DecoderBlock block_;  // the layers' arithmetic and its scratch (shared by both pass states)
  const int64_t head_unit_rows_;

  // Forward's state and the split pass's (so that a Forward may run between the split pass's
  // calls); both reused across calls (they grow, never shrink).
  PassState whole_, split_;
};

absl::Status DecoderForward::Validate(const ForwardBatch& batch, const KvCache& cache) const {
  const KvLayout& layout = cache.layout();
  if (layout.kind() != KvAttentionKind::kGqa || layout.n_layers() != hp_.n_layer ||
      layout.n_kv_heads() != hp_.n_head_kv || layout.head_dim() != hp_.head_dim) {
    return absl::InvalidArgumentError("forward: the KV cache layout does not match the model");
  }
  // Sliding groups must hold exactly the model's sliding layers, with its window.
  if (layout.n_groups() > 1) {
    bool match = layout.sliding_window() == hp_.sliding_window;
    for (int32_t l = 0; match && l < layout.n_layers(); ++l) {
      match = layout.group_is_sliding(layout.layer_group(l)) == hp_.is_swa(l);
    }
    if (!match) {
      return absl::InvalidArgumentError(
          "forward: the KV cache's sliding-window group does not match the model's layers");
    }
  }
  return CheckBatchTokens(batch, cache, hp_.n_vocab);
}

// Visibility: causal tokens see [0, cache_index]; a tree node sees up to its causal root plus
// the cache slots of its tree ancestors and itself (BuildTreeVisibility, over the tree
// nodes alone: a node whose parent is causal hangs off that root's prefix).
absl::Status DecoderForward::BuildMask(PassState& s) {
  const ForwardBatch& batch = *s.batch;
  KvCache& cache = *s.cache;
  const size_t n = batch.tokens.size();
  s.seqs.clear();
  s.token_seq.resize(n);
  s.slots.resize(n);
  s.positions.resize(n);
  s.ids.resize(n);
  s.n_visible.resize(n);
  const int64_t window = hp_.sliding_window;
  s.first_visible.assign(window > 0 ? n : 0, 0);
  s.extra_indptr.clear();
  s.extra_positions.clear();
  s.tree_nodes.clear();
  s.tree_parent.clear();
  s.tree_slot.clear();
  s.tree_indptr.clear();
  for (size_t i = 0; i < n; ++i) {
    const BatchToken& t = batch.tokens[i];
    auto it = std::find(s.seqs.begin(), s.seqs.end(), t.seq);
    s.token_seq[i] = static_cast<int32_t>(it - s.seqs.begin());
    if (it == s.seqs.end()) s.seqs.push_back(t.seq);
    KILN_ASSIGN_OR_RETURN(s.slots[i], cache.SlotOf(t.seq, t.cache_index));
    s.positions[i] = t.pos;
    s.ids[i] = t.token;
    if (t.parent < 0) {
      s.n_visible[i] = t.cache_index + 1;
      if (window > 0) s.first_visible[i] = std::max<int64_t>(0, t.cache_index - window + 1);
      continue;
    }
    int32_t root = t.parent;
    while (batch.tokens[root].parent >= 0) root = batch.tokens[root].parent;
    s.n_visible[i] = batch.tokens[root].cache_index + 1;
    if (window > 0) {
      const int64_t depth = t.pos - batch.tokens[root].pos;
      if (depth >= window) {
        return absl::InvalidArgumentError(
            StrCat("forward: tree token ", i, " is ", depth,
                   " positions below its root, beyond the sliding window of ", window));
      }
      s.first_visible[i] =
          std::max<int64_t>(0, batch.tokens[root].cache_index + depth - window + 1);
    }
    const BatchToken& parent = batch.tokens[t.parent];
    int32_t tree_parent = -1;
    if (parent.parent >= 0) {
      tree_parent = static_cast<int32_t>(
          std::find(s.tree_nodes.begin(), s.tree_nodes.end(), t.parent) - s.tree_nodes.begin());
    }
    s.tree_nodes.push_back(static_cast<int32_t>(i));
    s.tree_parent.push_back(tree_parent);
    s.tree_slot.push_back(t.cache_index);
  }
  KILN_RETURN_IF_ERROR(cache.BuildTables(s.seqs, &s.tables));
  if (s.tree_nodes.empty()) return absl::OkStatus();
  KILN_RETURN_IF_ERROR(
      BuildTreeVisibility(s.tree_parent, s.tree_slot, s.tree_indptr, s.extra_positions));
  s.extra_indptr.push_back(0);
  size_t next_node = 0;
  for (size_t i = 0; i < n; ++i) {
    const bool is_node =
        next_node < s.tree_nodes.size() && s.tree_nodes[next_node] == static_cast<int32_t>(i);
    s.extra_indptr.push_back(is_node ? s.tree_indptr[++next_node] : s.extra_indptr.back());
  }
  return absl::OkStatus();
}

absl::Status DecoderForward::BeginState(PassState& s, const ForwardBatch& batch, KvCache& cache,
                                        ForwardOutput* out) {
  s.begun = false;
  KILN_RETURN_IF_ERROR(Validate(batch, cache));
  s.batch = &batch;
  s.cache = &cache;
  s.out = out;
  KILN_RETURN_IF_ERROR(BuildMask(s));
  const int64_t n = static_cast<int64_t>(batch.tokens.size());
  const int64_t d = hp_.n_embd;
  s.n = n;
  s.next_layer = 0;
  Grow(s.x, n * d);
  out->n_vocab = hp_.n_vocab;
  out->logit_tokens.clear();
  for (int64_t i = 0; i < n; ++i) {
    if (batch.tokens[i].want_logits) out->logit_tokens.push_back(static_cast<int32_t>(i));
  }
  s.n_logits = static_cast<int64_t>(out->logit_tokens.size());
  out->logits.resize(s.n_logits * hp_.n_vocab);
  out->BeginLayerHidden(batch, s.n_logits, d);
  // llama.cpp's matmuls depend on the row count: that order multiplies the head whole.
  s.head_rows = s.n_logits > 0 && !backend_.llama_cpp_order() ? hp_.n_vocab : 0;
  s.next_head_row = 0;
  s.head_normed = false;
  KILN_RETURN_IF_ERROR(backend_.EmbeddingGather(
      model_.token_embd(), std::span<const int32_t>(s.ids.data(), n), s.x.data()));
  if (graph_.embd_scale != 1.0f) backend_.Scale(s.x.data(), n * d, graph_.embd_scale);
  s.begun = true;
  return absl::OkStatus();
}

absl::Status DecoderForward::RunLayersState(PassState& s, int32_t until) {
  if (!s.begun) return absl::FailedPreconditionError("forward: RunLayers without a Begin");
  until = std::min<int32_t>(until, static_cast<int32_t>(hp_.n_layer));
  const int64_t n = s.n;
  const int64_t d = hp_.n_embd;
  KvCache& cache = *s.cache;
  const ForwardOutput& out = *s.out;
  AttentionMask mask;
  mask.seq = std::span<const int32_t>(s.token_seq.data(), n);
  mask.tables = &s.tables;
  mask.n_visible = std::span<const int32_t>(s.n_visible.data(), n);
  mask.extra_indptr = s.extra_indptr;
  mask.extra_positions = s.extra_positions;
  const std::span<const KvSlot> slots(s.slots.data(), n);
  const std::span<const int32_t> positions(s.positions.data(), n);

  // Sliding-window layers see [first_visible, n_visible) of their prefix (plus tree extras).
  AttentionMask swa_mask = mask;
  swa_mask.first_visible = std::span<const int32_t>(s.first_visible.data(), s.first_visible.size());

  float* x = s.x.data();
  // The rotation PrepareRope last built in this call (the backend's rotation state is shared
  // with passes run between two calls of a split pass, so each call prepares its own).
  const RopeConfig* prepared_rope = nullptr;
  for (; s.next_layer < until; ++s.next_layer) {
    const int32_t il = s.next_layer;
    const DecoderLayer& L = layers_[il];
    const bool swa = hp_.is_swa(il);
    const RopeConfig& rope = swa ? hp_.rope_swa : hp_.rope;
    if (&rope != prepared_rope) {
      KILN_RETURN_IF_ERROR(
          backend_.PrepareRope(rope, static_cast<int32_t>(hp_.head_dim), positions));
      prepared_rope = &rope;
    }
    KILN_RETURN_IF_ERROR(
        block_.Attention(L, cache, il, swa ? swa_mask : mask, slots, positions, x, n));
    // The last layer's feed-forward block runs only for the tokens whose logits are wanted, as
    // llama.cpp's graph does (inp_out_ids): no one reads the others' outputs, and llama.cpp's
    // F32/F16 matmuls sum in an order that depends on the rows they get. Those tokens' rows move
    // to the front of x (logit_tokens ascend, so no row is overwritten before it is read).
    int64_t rows = n;
    if (il == hp_.n_layer - 1) {
      rows = s.n_logits;
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t src = out.logit_tokens[i];
        if (src != i) std::memcpy(x + i * d, x + src * d, d * sizeof(float));
      }
      if (rows == 0) continue;
    }
    KILN_RETURN_IF_ERROR(block_.FeedForward(L, x, rows));
    s.out->CaptureLayerHidden(il, x, /*compacted=*/il == hp_.n_layer - 1);
  }
  return absl::OkStatus();
}

// Rows of the head whose weights are as many bytes as one layer's matrices (decoding streams
// the weights from memory, so bytes measure the time), the vocabulary then cut into parts of
// equal size, in whole tiles of kMatMulRowAlign rows.
int64_t DecoderForward::HeadUnitRows() const {
  size_t layer_bytes = 0;
  if (!layers_.empty()) {
    const DecoderLayer& L = layers_[0];
    for (const WeightView* w : {L.wq, L.wk, L.wv, L.wqkv, L.wo, L.ffn_gate, L.ffn_up, L.ffn_down}) {
      if (w != nullptr) layer_bytes += w->row_bytes() * static_cast<size_t>(w->n_out);
    }
  }
  const size_t row_bytes = std::max<size_t>(1, model_.output().row_bytes());
  const int64_t vocab = std::max<int64_t>(1, hp_.n_vocab);
  const int64_t rows = std::max<int64_t>(1, static_cast<int64_t>(layer_bytes / row_bytes));
  const int64_t parts = (vocab + rows - 1) / rows;
  const int64_t even = (vocab + parts - 1) / parts;
  return (even + kMatMulRowAlign - 1) / kMatMulRowAlign * kMatMulRowAlign;
}

absl::Status DecoderForward::HeadRows(PassState& s, int64_t end) {
  if (s.n_logits > 0 && end > s.next_head_row) {  // x: [n_logits, n_embd], the logit tokens' rows
    const int64_t d = hp_.n_embd;
    if (!s.head_normed) {
      Grow(s.head_in, s.n_logits * d);
      backend_.RmsNorm(s.x.data(), model_.output_norm().AsF32(), s.n_logits, d, hp_.rms_eps,
                       s.head_in.data());
      s.head_normed = true;
    }
    const WeightView& w = model_.output();
    float* logits = s.out->logits.data();  // [n_logits, n_vocab]
    if (s.next_head_row == 0 && end == w.n_out) {
      KILN_RETURN_IF_ERROR(backend_.MatMul(w, s.head_in.data(), s.n_logits, logits));
    } else {
      KILN_RETURN_IF_ERROR(
          backend_.MatMulRange(w, s.head_in.data(), s.n_logits, s.next_head_row, end, logits));
    }
  }
  s.next_head_row = end;
  return absl::OkStatus();
}

absl::Status DecoderForward::RunHeadState(PassState& s, int64_t until) {
  if (!s.begun || s.next_layer != hp_.n_layer) {
    return absl::FailedPreconditionError("forward: RunHead before every layer ran");
  }
  until = std::min(until, s.head_rows);
  if (until <= s.next_head_row) return absl::OkStatus();
  if (until < s.head_rows && until % kMatMulRowAlign != 0) {
    return absl::InvalidArgumentError(StrCat("forward: RunHead(", until, ") is not a multiple of ",
                                             kMatMulRowAlign, " below the head's ", s.head_rows,
                                             " rows"));
  }
  return HeadRows(s, until);
}

absl::Status DecoderForward::FinishState(PassState& s) {
  if (!s.begun || s.next_layer != hp_.n_layer) {
    return absl::FailedPreconditionError("forward: Finish before every layer ran");
  }
  s.begun = false;  // whatever follows, this pass is over
  const int64_t n = s.n;
  KvCache& cache = *s.cache;
  KILN_RETURN_IF_ERROR(HeadRows(s, hp_.n_vocab));
  // The features (head_in: the normed rows the head read) only when asked: most passes skip the
  // copy.
  ForwardOutput* out = s.out;
  const int64_t d = hp_.n_embd;
  out->n_embd = s.batch->want_hidden ? d : 0;
  if (s.batch->want_hidden && s.n_logits > 0) {
    out->hidden.assign(s.head_in.begin(), s.head_in.begin() + s.n_logits * d);
  } else {
    out->hidden.clear();
  }
  // Causal tokens are final; tree nodes stay provisional until the caller commits a path.
  const ForwardBatch& batch = *s.batch;
  for (size_t q = 0; q < s.seqs.size(); ++q) {
    int32_t done = -1;
    for (int64_t i = 0; i < n; ++i) {
      if (s.token_seq[i] == static_cast<int32_t>(q) && batch.tokens[i].parent < 0) {
        done = std::max(done, batch.tokens[i].cache_index + 1);
      }
    }
    KILN_ASSIGN_OR_RETURN(int32_t computed, cache.NumComputed(s.seqs[q]));
    if (done > computed) KILN_RETURN_IF_ERROR(cache.MarkComputed(s.seqs[q], done));
  }
  return absl::OkStatus();
}

void AddBiases(std::vector<TensorSpec>& t, int64_t layer, Presence presence,
               std::initializer_list<std::pair<const char*, int64_t>> biases) {
  if (presence == Presence::kAbsent) return;
  for (const auto& [name, size] : biases) {
    t.push_back({Blk(layer, name), size, 1, TensorRole::kVector, presence == Presence::kOptional});
  }
}

}  // namespace

absl::Status DecoderBlock::Linear(const WeightView& w, const WeightView* bias, const float* x,
                                  int64_t n, float* y) {
  KILN_RETURN_IF_ERROR(backend_.MatMul(w, x, n, y));
  if (bias != nullptr) backend_.AddRowBias(y, bias->AsF32(), n, w.n_out);
  return absl::OkStatus();
}

absl::Status DecoderBlock::Attention(const DecoderLayer& L, KvCache& cache, int32_t layer,
                                     const AttentionMask& mask, std::span<const KvSlot> slots,
                                     std::span<const int32_t> positions, float* x, int64_t n) {
  const int64_t d = shape_.n_embd, hd = shape_.head_dim, q_dim = shape_.n_head * hd,
                kv_dim = shape_.n_head_kv * hd;
  const float eps = shape_.rms_eps;
  Grow(h_, n * d);
  Grow(q_, n * q_dim);
  Grow(k_, n * kv_dim);
  Grow(v_, n * kv_dim);
  Grow(attn_, n * q_dim);
  Grow(proj_, n * d);
  float* h = h_.data();
  backend_.RmsNorm(x, L.attn_norm->AsF32(), n, d, eps, h);  // x, h: [n, n_embd]
  if (L.wqkv != nullptr) {
    const int64_t qkv_dim = q_dim + 2 * kv_dim;
    Grow(fused_, n * qkv_dim);
    KILN_RETURN_IF_ERROR(backend_.MatMul(*L.wqkv, h, n, fused_.data()));  // [n, qkv_dim]
    for (int64_t i = 0; i < n; ++i) {
      const float* row = fused_.data() + i * qkv_dim;
      std::memcpy(q_.data() + i * q_dim, row, q_dim * sizeof(float));
      std::memcpy(k_.data() + i * kv_dim, row + q_dim, kv_dim * sizeof(float));
      std::memcpy(v_.data() + i * kv_dim, row + q_dim + kv_dim, kv_dim * sizeof(float));
    }
  } else {
    const MatMulTarget qkv[] = {{L.wq, q_.data()},   // [n, q_dim]
                                {L.wk, k_.data()},   // [n, kv_dim]
                                {L.wv, v_.data()}};  // [n, kv_dim]
    KILN_RETURN_IF_ERROR(backend_.MatMulEach(h, n, qkv));
    if (L.bq != nullptr) backend_.AddRowBias(q_.data(), L.bq->AsF32(), n, q_dim);
    if (L.bk != nullptr) backend_.AddRowBias(k_.data(), L.bk->AsF32(), n, kv_dim);
    if (L.bv != nullptr) backend_.AddRowBias(v_.data(), L.bv->AsF32(), n, kv_dim);
  }
  if (graph_.qk_norm) {  // each head's row of head_dim
    backend_.RmsNorm(q_.data(), L.q_norm->AsF32(), n * shape_.n_head, hd, eps, q_.data());
    backend_.RmsNorm(k_.data(), L.k_norm->AsF32(), n * shape_.n_head_kv, hd, eps, k_.data());
  }
  backend_.RotateRope(q_.data(), shape_.n_head);
  backend_.RotateRope(k_.data(), shape_.n_head_kv);
  if (graph_.query_scale > 0.0f) backend_.Scale(q_.data(), n * q_dim, graph_.query_scale);
  if (graph_.attn_temperature_scale > 0.0f) {
    for (int64_t i = 0; i < n; ++i) {
      // llama.cpp's llm_graph_input_attn_temp: a float position, the log in double.
      const float pos = static_cast<float>(positions[i]);
      const float floor_scale = static_cast<float>(graph_.attn_temperature_floor);
      const float scale = static_cast<float>(
          std::log(std::floor(pos / floor_scale) + 1.0) * graph_.attn_temperature_scale + 1.0);
      if (scale != 1.0f) backend_.Scale(q_.data() + i * q_dim, q_dim, scale);
    }
  }
  KILN_RETURN_IF_ERROR(backend_.WriteKv(cache, layer, slots, k_.data(), v_.data()));
  KILN_RETURN_IF_ERROR(backend_.Attention(cache, layer, mask, q_.data(),
                                          static_cast<int32_t>(shape_.n_head), attn_.data(),
                                          graph_.query_scale > 0.0f ? 1.0f : 0.0f));
  KILN_RETURN_IF_ERROR(Linear(*L.wo, L.bo, attn_.data(), n, proj_.data()));  // [n, n_embd]
  if (graph_.post_norms) {
    backend_.RmsNorm(proj_.data(), L.post_attn_norm->AsF32(), n, d, eps, proj_.data());
  }
  backend_.Add(x, proj_.data(), n * d, x);
  return absl::OkStatus();
}

absl::Status DecoderBlock::FeedForward(const DecoderLayer& L, float* x, int64_t rows) {
  const int64_t d = shape_.n_embd, ff = shape_.n_ff;
  const float eps = shape_.rms_eps;
  Grow(h_, rows * d);
  Grow(gate_, rows * ff);
  Grow(up_, rows * ff);
  Grow(proj_, rows * d);
  float* h = h_.data();
  backend_.RmsNorm(x, L.ffn_norm->AsF32(), rows, d, eps, h);  // x, h: [rows, n_embd]
  if (L.ffn_gate == nullptr) {  // fused: each output row is [gate (n_ff), up (n_ff)]
    Grow(fused_, rows * 2 * ff);
    KILN_RETURN_IF_ERROR(backend_.MatMul(*L.ffn_up, h, rows, fused_.data()));
    for (int64_t i = 0; i < rows; ++i) {
      const float* row = fused_.data() + i * 2 * ff;
      std::memcpy(gate_.data() + i * ff, row, ff * sizeof(float));
      std::memcpy(up_.data() + i * ff, row + ff, ff * sizeof(float));
    }
  } else {
    const MatMulTarget gate_up[] = {{L.ffn_gate, gate_.data()}, {L.ffn_up, up_.data()}};
    KILN_RETURN_IF_ERROR(backend_.MatMulEach(h, rows, gate_up));  // [rows, n_ff] each
  }
  if (graph_.ffn == FfnActivation::kGeGlu) {
    backend_.GeGlu(gate_.data(), up_.data(), rows * ff, gate_.data());  // [rows, n_ff]
  } else {
    backend_.SwiGlu(gate_.data(), up_.data(), rows * ff, gate_.data());  // [rows, n_ff]
  }
  KILN_RETURN_IF_ERROR(backend_.MatMul(*L.ffn_down, gate_.data(), rows, proj_.data()));
  if (graph_.post_norms) {
    backend_.RmsNorm(proj_.data(), L.post_ffn_norm->AsF32(), rows, d, eps, proj_.data());
  }
  backend_.Add(x, proj_.data(), rows * d, x);
  return absl::OkStatus();
}

std::vector<TensorSpec> DecoderTensors(const ModelHparams& hp,
                                       const DecoderTensorOptions& options) {
  const int64_t d = hp.n_embd, q_dim = hp.n_head * hp.head_dim, kv_dim = hp.n_head_kv * hp.head_dim;
  std::vector<TensorSpec> t;
  t.push_back({"token_embd.weight", d, hp.n_vocab, TensorRole::kEmbedding});
  for (int64_t l = 0; l < hp.n_layer; ++l) {
    t.push_back({Blk(l, "attn_norm.weight"), d, 1, TensorRole::kVector});
    if (options.fused_qkv) {
      t.push_back({Blk(l, "attn_qkv.weight"), d, q_dim + 2 * kv_dim, TensorRole::kMatrix});
    } else {
      t.push_back({Blk(l, "attn_q.weight"), d, q_dim, TensorRole::kMatrix});
      t.push_back({Blk(l, "attn_k.weight"), d, kv_dim, TensorRole::kMatrix});
      t.push_back({Blk(l, "attn_v.weight"), d, kv_dim, TensorRole::kMatrix});
    }
    AddBiases(t, l, options.qkv_bias,
              {{"attn_q.bias", q_dim}, {"attn_k.bias", kv_dim}, {"attn_v.bias", kv_dim}});
    if (options.qk_norm) {
      t.push_back({Blk(l, "attn_q_norm.weight"), hp.head_dim, 1, TensorRole::kVector});
      t.push_back({Blk(l, "attn_k_norm.weight"), hp.head_dim, 1, TensorRole::kVector});
    }
    t.push_back({Blk(l, "attn_output.weight"), q_dim, d, TensorRole::kMatrix});
    AddBiases(t, l, options.output_bias, {{"attn_output.bias", d}});
    if (options.post_norms) {
      t.push_back({Blk(l, "post_attention_norm.weight"), d, 1, TensorRole::kVector});
    }
    t.push_back({Blk(l, "ffn_norm.weight"), d, 1, TensorRole::kVector});
    if (options.fused_gate_up) {
      t.push_back({Blk(l, "ffn_up.weight"), d, 2 * hp.n_ff, TensorRole::kMatrix});
    } else {
      t.push_back({Blk(l, "ffn_gate.weight"), d, hp.n_ff, TensorRole::kMatrix});
      t.push_back({Blk(l, "ffn_up.weight"), d, hp.n_ff, TensorRole::kMatrix});
    }
    t.push_back({Blk(l, "ffn_down.weight"), hp.n_ff, d, TensorRole::kMatrix});
    if (options.post_norms) {
      t.push_back({Blk(l, "post_ffw_norm.weight"), d, 1, TensorRole::kVector});
    }
  }
  t.push_back({"output_norm.weight", d, 1, TensorRole::kVector});
  if (!hp.tied_output) t.push_back({"output.weight", d, hp.n_vocab, TensorRole::kMatrix});
  return t;
}

absl::StatusOr<KvLayout> GqaCacheLayout(const ModelHparams& hp, GgmlType kv_type,
                                        int32_t block_size) {
  return KvLayout::Gqa(static_cast<int32_t>(hp.n_layer), static_cast<int32_t>(hp.n_head_kv),
                       static_cast<int32_t>(hp.head_dim), kv_type, block_size);
}

absl::StatusOr<std::unique_ptr<ForwardPass>> NewDecoderForward(const Model& model, Backend& backend,
                                                               const DecoderGraph& graph) {
  if (model.hparams().sliding_window > 0 &&
      model.hparams().swa_layers.size() != static_cast<size_t>(model.hparams().n_layer)) {
    return absl::InvalidArgumentError("model: sliding-window layer flags do not match n_layer");
  }
  if (graph.attn_temperature_scale > 0.0f && graph.attn_temperature_floor <= 0) {
    return absl::InvalidArgumentError("model: attention temperature scaling needs a floor > 0");
  }
  const ModelHparams& hp = model.hparams();
  std::vector<DecoderLayer> layers(hp.n_layer);
  auto required = [&](int64_t l, const char* name) -> absl::StatusOr<const WeightView*> {
    const WeightView* w = model.Tensor(Blk(l, name));
    if (w == nullptr) {
      return absl::InvalidArgumentError(StrCat("model: missing tensor '", Blk(l, name), "'"));
    }
    return w;
  };
  for (int64_t l = 0; l < hp.n_layer; ++l) {
    DecoderLayer& L = layers[l];
    KILN_ASSIGN_OR_RETURN(L.attn_norm, required(l, "attn_norm.weight"));
    if (graph.fused_qkv) {
      KILN_ASSIGN_OR_RETURN(L.wqkv, required(l, "attn_qkv.weight"));
    } else {
      KILN_ASSIGN_OR_RETURN(L.wq, required(l, "attn_q.weight"));
      KILN_ASSIGN_OR_RETURN(L.wk, required(l, "attn_k.weight"));
      KILN_ASSIGN_OR_RETURN(L.wv, required(l, "attn_v.weight"));
    }
    KILN_ASSIGN_OR_RETURN(L.wo, required(l, "attn_output.weight"));
    L.bq = model.Tensor(Blk(l, "attn_q.bias"));
    L.bk = model.Tensor(Blk(l, "attn_k.bias"));
    L.bv = model.Tensor(Blk(l, "attn_v.bias"));
    L.bo = model.Tensor(Blk(l, "attn_output.bias"));
    KILN_ASSIGN_OR_RETURN(L.ffn_norm, required(l, "ffn_norm.weight"));
    if (!graph.fused_gate_up) {
      KILN_ASSIGN_OR_RETURN(L.ffn_gate, required(l, "ffn_gate.weight"));
    }
    KILN_ASSIGN_OR_RETURN(L.ffn_up, required(l, "ffn_up.weight"));
    KILN_ASSIGN_OR_RETURN(L.ffn_down, required(l, "ffn_down.weight"));
    if (graph.qk_norm) {
      KILN_ASSIGN_OR_RETURN(L.q_norm, required(l, "attn_q_norm.weight"));
      KILN_ASSIGN_OR_RETURN(L.k_norm, required(l, "attn_k_norm.weight"));
    }
    if (graph.post_norms) {
      KILN_ASSIGN_OR_RETURN(L.post_attn_norm, required(l, "post_attention_norm.weight"));
      KILN_ASSIGN_OR_RETURN(L.post_ffn_norm, required(l, "post_ffw_norm.weight"));
    }
  }
  return std::unique_ptr<ForwardPass>(new DecoderForward(model, backend, std::move(layers), graph));
}

}  // namespace kiln
