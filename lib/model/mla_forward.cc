#include "lib/model/mla_forward.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "lib/model/moe_ffn.h"
#include "lib/quant/quant.h"

namespace kiln {
namespace {

template <typename T>
void Grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

// ChooseDecompressed's calibration: seconds per multiply-add of each kernel relative to the
// absorbed attention's, measured with `bench/mla_prefill_bench --threads 1 --cpu-time` on
// kiln-mkmodel's deepseek2-bench (kv_lora_rank 512, 16 heads of 128 + 64, values 128; q8_0
// weights, f16 latent cache; process CPU ms of one Forward of NEW tokens after CTX cached ones,
// so a loaded machine's time-sharing does not count; AVX-512, the float tile kernels):
//     CTX  NEW  absorbed  decompressed      CTX  NEW  absorbed  decompressed
//       0   16      80.0          54.8      512    1      24.6         355.9
//       0  128     473.4         286.8      512   32     272.4         436.4
//       0  512    2822.1        1617.7      512  128    1092.8         823.1
// Least squares, with a common 15.7 ms + 1.95 ms per token outside attention: the absorbed form
// 0.067 ns per multiply-add, the f32 decompression matmuls 0.037 ns (the tile kernels of
// kernels/cpu/float_avx512.cc, ~27 G/s with the reads of the latents), the dense attention
// 0.053 ns. A fresh chunk is then always cheaper decompressed (decompressing a row costs about
// half of what absorbing a query does); after 512 cached tokens it is cheaper from about 70 new
// tokens on, so there the 128-token minimum below decides.
constexpr double kDecompressCost = 0.54;
constexpr double kDenseAttentionCost = 0.8;
// Chunks shorter than this stay absorbed. Measured above, they gain at most ~0.15 s of CPU a chunk;
// and absorbed they keep the decode steps' form, so that a short prompt computed after a
// prefix-cache hit, in chunks, or cold gives the same bits (a form switch changes the last bits,
// not tokens).
constexpr int64_t kMinDecompressedChunk = 128;
// The most memory one sequence's decompressed context may take; longer contexts stay absorbed.
constexpr double kMaxDecompressedBytes = 512.0 * 1024 * 1024;

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

// Types a backend widens to f32 as it reads them without changing a value (Q8_0: f16 scale x
// int8, exact in f32), so their rows can stand in for f32 copies (MlaAttentionWeights).
bool WidensExactly(GgmlType type) {
  return type == GgmlType::kF32 || type == GgmlType::kF16 || type == GgmlType::kBF16 ||
         type == GgmlType::kQ8_0;
}

}  // namespace

// Whether a causal chunk of n_new tokens of one sequence, the last of which sees n_ctx cache
// rows, runs decompressed. Costs in multiply-adds per head, weighted by what each form's kernels
// take per multiply-add on a CPU (kDecompressCost, kDenseAttentionCost: measured, below):
//   absorbed:     n_new · (kvl · (nope + vd)  +  n̄ · (row + kvl))       q_abs, W_UV, scores, Σ p c
//   decompressed: n_ctx · kvl · (nope + vd) · kDecompressCost  +  n_new · n̄ · (qk + vd) · kDense
// with n̄ = n_ctx - (n_new - 1) / 2 the rows a chunk's token sees on average. The decompressed
// K and V (f32, [n_ctx, n_head, nope + vd]) must also fit kMaxDecompressedBytes, and the chunk
// be at least kMinDecompressedChunk tokens.
bool ChooseDecompressed(const ModelHparams& hp, int64_t n_new, int64_t n_ctx) {
  if (n_new < kMinDecompressedChunk) return false;
  const MlaHparams& m = hp.mla;
  const double kvl = static_cast<double>(m.kv_lora_rank), nope = static_cast<double>(m.nope_dim),
               vd = static_cast<double>(m.v_head_dim), rd = static_cast<double>(m.rope_dim);
  const double row = kvl + rd, qk = nope + rd;
  const double bytes =
      static_cast<double>(n_ctx) * static_cast<double>(hp.n_head) * (nope + vd) * sizeof(float) +
      static_cast<double>(n_ctx) * row * sizeof(float);
  if (bytes > kMaxDecompressedBytes) return false;
  const double n = static_cast<double>(n_new);
  const double mean_rows = static_cast<double>(n_ctx) - (n - 1) / 2;
  const double absorbed = n * (kvl * (nope + vd) + mean_rows * (row + kvl));
  const double decompressed = static_cast<double>(n_ctx) * kvl * (nope + vd) * kDecompressCost +
                              n * mean_rows * (qk + vd) * kDenseAttentionCost;
  return decompressed < absorbed;
}

namespace {

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
  const WeightView* ffn_gate;   // [n_embd -> n_ff]; null in a mixture-of-experts layer
  const WeightView* ffn_up;     // [n_embd -> n_ff]; null in a mixture-of-experts layer
  const WeightView* ffn_down;   // [n_ff -> n_embd]; null in a mixture-of-experts layer
  const WeightView* k_b;   // attn_k_b: per head kv_lora_rank rows of nope_dim; null (attn_kv_b)
  const WeightView* v_b;   // attn_v_b: per head v_head_dim rows of kv_lora_rank; null (attn_kv_b)
  const WeightView* kv_b;  // attn_kv_b: per head nope_dim + v_head_dim rows; null (attn_k_b)
  // The absorbed attention's weights: the file's rows when the backend reads them
  // (Backend::ReadsMlaWeightRows) and their type widens exactly, else f32 copies; the f32 copies
  // also for the decompressed prefill's matmuls (MlaPrefillMode::kMeasured).
  std::vector<float> w_uk;  // [n_head][nope_dim][kv_lora_rank]: k_nope_h = W_UK_h c
  std::vector<float> w_uv;  // [n_head][v_head_dim][kv_lora_rank]: v_h = W_UV_h c
  std::vector<const void*> uk_rows, uv_rows;  // MlaAttentionWeights' row lists; empty: f32
  MlaAttentionWeights absorb;  // what MlaAttention reads: the row lists if any, else the copies
};

class MlaForward final : public ForwardPass {
 public:
  MlaForward(const Model& model, Backend& backend, std::vector<MlaLayer> layers,
             std::optional<MoeFeedForward> moe, MlaPrefillMode mode)
      : model_(model),
        hp_(model.hparams()),
        backend_(backend),
        layers_(std::move(layers)),
        moe_(std::move(moe)),
        mode_(mode) {}

  absl::Status Forward(const ForwardBatch& batch, KvCache& cache, ForwardOutput* out) override;
  // Not split yet: Begin keeps the batch, RunLayers only counts, RunHead has no rows, Finish
  // runs the whole pass (same bits; a budgeted step then takes the whole pass in its last unit).
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
  absl::Status RunHead(int64_t until) override {
    (void)until;  // the head is not split: head_rows() is 0
    if (split_.batch == nullptr) return absl::FailedPreconditionError("forward: no pass begun");
    if (next_layer_ < n_layers()) {
      return absl::FailedPreconditionError("forward: RunHead before every layer ran");
    }
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
  int64_t head_rows() const override { return 0; }
  int64_t next_head_row() const override { return 0; }
  int64_t head_unit_rows() const override { return kMatMulRowAlign; }
  Backend& backend() override { return backend_; }

 private:
  absl::Status Validate(const ForwardBatch& batch, const KvCache& cache) const;
  // What each token sees (mask_): the first n_visible_[i] cache positions of its sequence and
  // then its tree ancestors' and its own positions (CSR: extra_indptr_, extra_positions_).
  absl::Status BuildVisibility(const ForwardBatch& batch, const KvCache& cache);
  // Chooses each sequence's attention form (PlanAttention's rule) and builds the absorbed
  // tokens' mask (abs_mask_) and the decompressed sequences' context slots.
  absl::Status PlanAttention(const ForwardBatch& batch, const KvCache& cache);
  // One layer's attention of the whole batch: q_ [n, n_head, qk] -> attn_ [n, n_head, v_head_dim].
  absl::Status RunAttention(const KvCache& cache, int32_t il, float scale);
  // The same in the llama.cpp order, as its deepseek2 graph computes it (split attn_k_b/attn_v_b).
  absl::Status RunAttentionLlamaCpp(const KvCache& cache, int32_t il, float scale);
  // Whether `layout` is MlaMhaCacheLayout's (a combined attn_kv_b file in the llama.cpp order).
  bool IsMhaCache(const KvLayout& layout) const;
  // Writes one layer's decompressed K and V from latent_ and runs multi-head attention over them,
  // as llama.cpp's deepseek2 graph does for a combined attn_kv_b.
  absl::Status RunMhaAttention(KvCache& cache, int32_t il, float scale);

  const Model& model_;
  const ModelHparams& hp_;
  Backend& backend_;
  std::vector<MlaLayer> layers_;
  std::optional<MoeFeedForward> moe_;  // the layers from n_layer_dense_lead on, if any
  MlaPrefillMode mode_;
  struct SplitPass {
    const ForwardBatch* batch = nullptr;
    KvCache* cache = nullptr;
    ForwardOutput* out = nullptr;
  } split_;
  int32_t next_layer_ = 0;

  std::vector<int32_t> positions_, ids_, n_visible_, token_seq_, extra_indptr_, extra_positions_;
  std::vector<KvSlot> slots_;
  std::vector<SeqId> seqs_;  // the batch's sequences, in first-seen order
  KvTables tables_;          // [seqs_] their block tables
  AttentionMask mask_;
  // The absorbed tokens (indices into the batch) and their mask; all of the batch when no
  // sequence runs decompressed (abs_all_).
  bool abs_all_ = true;
  std::vector<int32_t> abs_tokens_, abs_seq_, abs_visible_, abs_extra_indptr_, abs_extra_positions_;
  AttentionMask abs_mask_;
  // A sequence that runs decompressed: its batch tokens, what each sees, its context's slots.
  struct DecompressedSeq {
    std::vector<int32_t> tokens;
    std::vector<int32_t> n_visible;
    std::vector<KvSlot> context;  // cache positions [0, n_ctx)
  };
  std::vector<DecompressedSeq> decompressed_;
  std::vector<float> ctx_c_, ctx_kr_, ctx_k_, ctx_v_, seq_q_, seq_out_, abs_q_, abs_out_;
  std::vector<float> head_in_, head_out_;      // one head's rows of the llama.cpp order's matmuls
  std::vector<float> mha_kv_, mha_k_, mha_v_;  // RunMhaAttention's [n, n_head, ...] rows
  std::vector<float> x_, h_, qa_, q_, kva_, latent_, kr_, qpe_, attn_, proj_, gate_, up_;
};

bool MlaForward::IsMhaCache(const KvLayout& layout) const {
  auto mha = MlaMhaCacheLayout(hp_, layout.elem_type(), layout.block_size());
  return !hp_.mla.split_kv_b && backend_.llama_cpp_order() && mha.ok() &&
         layout.kind() == KvAttentionKind::kGqa && layout.n_groups() == 1 &&
         layout.n_layers() == mha->n_layers() && layout.n_kv_heads() == mha->n_kv_heads() &&
         layout.head_dim() == mha->head_dim();
}

absl::Status MlaForward::Validate(const ForwardBatch& batch, const KvCache& cache) const {
  const KvLayout& layout = cache.layout();
  if (IsMhaCache(layout)) return CheckBatchTokens(batch, cache, hp_.n_vocab);
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
  n_visible_.resize(n);
  token_seq_.resize(n);
  extra_indptr_.assign(1, 0);
  extra_positions_.clear();
  seqs_.clear();
  bool tree = false;
  for (size_t i = 0; i < n; ++i) {
    const BatchToken& t = batch.tokens[i];
    positions_[i] = t.pos;
    ids_[i] = t.token;
    KILN_ASSIGN_OR_RETURN(slots_[i], cache.SlotOf(t.seq, t.cache_index));
    auto it = std::find(seqs_.begin(), seqs_.end(), t.seq);
    token_seq_[i] = static_cast<int32_t>(it - seqs_.begin());
    if (it == seqs_.end()) seqs_.push_back(t.seq);
    // The causal root's prefix (the token's own when causal), then the cache positions of the
    // tree ancestors below it and of the token itself, increasing.
    int32_t root = static_cast<int32_t>(i);
    while (batch.tokens[root].parent >= 0) root = batch.tokens[root].parent;
    n_visible_[i] = batch.tokens[root].cache_index + 1;
    const size_t first_extra = extra_positions_.size();
    for (int32_t a = static_cast<int32_t>(i); a != root; a = batch.tokens[a].parent) {
      extra_positions_.push_back(batch.tokens[a].cache_index);
      tree = true;
    }
    std::sort(extra_positions_.begin() + static_cast<std::ptrdiff_t>(first_extra),
              extra_positions_.end());
    extra_indptr_.push_back(static_cast<int32_t>(extra_positions_.size()));
  }
  if (!tree) extra_indptr_.clear();
  KILN_RETURN_IF_ERROR(cache.BuildTables(seqs_, &tables_));
  mask_ = AttentionMask{};
  mask_.seq = std::span<const int32_t>(token_seq_.data(), n);
  mask_.tables = &tables_;
  mask_.n_visible = std::span<const int32_t>(n_visible_.data(), n);
  mask_.extra_indptr = extra_indptr_;
  mask_.extra_positions = extra_positions_;
  return absl::OkStatus();
}

absl::Status MlaForward::PlanAttention(const ForwardBatch& batch, const KvCache& cache) {
  const int64_t n = static_cast<int64_t>(batch.tokens.size());
  decompressed_.clear();
  abs_tokens_.clear();
  // Per sequence: its tokens, whether any is a tree node, the rows its last token sees. The
  // choice depends only on the sequence's own chunk, never on the rest of the batch.
  std::vector<std::vector<int32_t>> by_seq(seqs_.size());
  std::vector<char> has_tree(seqs_.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    by_seq[token_seq_[i]].push_back(static_cast<int32_t>(i));
    if (batch.tokens[i].parent >= 0) has_tree[token_seq_[i]] = 1;
  }
  std::vector<char> decompress(seqs_.size(), 0);
  for (size_t s = 0; s < seqs_.size(); ++s) {
    if (has_tree[s] || mode_ == MlaPrefillMode::kAbsorbed || backend_.llama_cpp_order()) continue;
    int32_t n_ctx = 0;
    for (int32_t i : by_seq[s]) n_ctx = std::max(n_ctx, n_visible_[i]);
    const int64_t n_new = static_cast<int64_t>(by_seq[s].size());
    if (mode_ == MlaPrefillMode::kMeasured && !ChooseDecompressed(hp_, n_new, n_ctx)) continue;
    decompress[s] = 1;
    DecompressedSeq& d = decompressed_.emplace_back();
    d.tokens = by_seq[s];
    for (int32_t i : d.tokens) d.n_visible.push_back(n_visible_[i]);
    d.context.resize(static_cast<size_t>(n_ctx));
    for (int32_t j = 0; j < n_ctx; ++j) {
      KILN_ASSIGN_OR_RETURN(d.context[j], cache.SlotOf(seqs_[s], j));
    }
  }
  abs_all_ = decompressed_.empty();
  if (abs_all_) return absl::OkStatus();
  // The absorbed tokens' own mask (the same block tables; tree extras carried over).
  abs_seq_.clear();
  abs_visible_.clear();
  abs_extra_positions_.clear();
  abs_extra_indptr_.assign(1, 0);
  const bool tree = !extra_indptr_.empty();
  for (int64_t i = 0; i < n; ++i) {
    if (decompress[token_seq_[i]]) continue;
    abs_tokens_.push_back(static_cast<int32_t>(i));
    abs_seq_.push_back(token_seq_[i]);
    abs_visible_.push_back(n_visible_[i]);
    if (tree) {
      abs_extra_positions_.insert(abs_extra_positions_.end(),
                                  extra_positions_.begin() + extra_indptr_[i],
                                  extra_positions_.begin() + extra_indptr_[i + 1]);
      abs_extra_indptr_.push_back(static_cast<int32_t>(abs_extra_positions_.size()));
    }
  }
  if (!tree) abs_extra_indptr_.clear();
  abs_mask_ = AttentionMask{};
  abs_mask_.seq = abs_seq_;
  abs_mask_.tables = &tables_;
  abs_mask_.n_visible = abs_visible_;
  abs_mask_.extra_indptr = abs_extra_indptr_;
  abs_mask_.extra_positions = abs_extra_positions_;
  return absl::OkStatus();
}

absl::Status MlaForward::RunAttention(const KvCache& cache, int32_t il, float scale) {
  const MlaHparams& m = hp_.mla;
  const MlaLayer& L = layers_[il];
  const int64_t n_head = hp_.n_head, kvl = m.kv_lora_rank, rd = m.rope_dim, nope = m.nope_dim,
                vd = m.v_head_dim, qk = m.qk_head_dim();
  const MlaAttentionWeights& absorb = L.absorb;
  // llama.cpp's graph needs split attn_k_b/attn_v_b, and a float cache (its q8_0 cache needs its
  // flash attention): otherwise the llama.cpp order takes kiln's absorbed form, as it does on a
  // backend without the llama.cpp order's MLA attention (CUDA: that order is the CPU's only).
  if (backend_.llama_cpp_order() && L.k_b != nullptr &&
      cache.layout().elem_type() != GgmlType::kQ8_0) {
    const absl::Status status = RunAttentionLlamaCpp(cache, il, scale);
    if (!absl::IsUnimplemented(status)) return status;
  }
  if (abs_all_) {
    return backend_.MlaAttention(cache, il, mask_, q_.data(), static_cast<int32_t>(n_head), absorb,
                                 attn_.data(), scale);
  }
  // Absorbed: the other sequences' tokens (tree nodes, decode steps, short chunks), gathered.
  const int64_t n_abs = static_cast<int64_t>(abs_tokens_.size());
  if (n_abs > 0) {
    Grow(abs_q_, n_abs * n_head * qk);
    Grow(abs_out_, n_abs * n_head * vd);
    for (int64_t a = 0; a < n_abs; ++a) {
      std::memcpy(abs_q_.data() + a * n_head * qk, q_.data() + abs_tokens_[a] * n_head * qk,
                  n_head * qk * sizeof(float));
    }
    KILN_RETURN_IF_ERROR(backend_.MlaAttention(cache, il, abs_mask_, abs_q_.data(),
                                               static_cast<int32_t>(n_head), absorb,
                                               abs_out_.data(), scale));
    for (int64_t a = 0; a < n_abs; ++a) {
      std::memcpy(attn_.data() + abs_tokens_[a] * n_head * vd, abs_out_.data() + a * n_head * vd,
                  n_head * vd * sizeof(float));
    }
  }
  // Decompressed: per sequence, K_nope = C W_UKᵀ and V = C W_UV over its whole context (two
  // matmuls over the f32 per-head products), then ordinary causal attention.
  WeightView w_uk, w_uv;  // [n_head · nope, kvl], [n_head · vd, kvl]
  w_uk.type = w_uv.type = GgmlType::kF32;
  w_uk.data = L.w_uk.data();
  w_uv.data = L.w_uv.data();
  w_uk.n_in = w_uv.n_in = kvl;
  w_uk.n_out = n_head * nope;
  w_uv.n_out = n_head * vd;
  for (const DecompressedSeq& d : decompressed_) {
    const int64_t n_ctx = static_cast<int64_t>(d.context.size());
    const int64_t n_s = static_cast<int64_t>(d.tokens.size());
    Grow(ctx_c_, n_ctx * kvl);
    Grow(ctx_kr_, n_ctx * std::max<int64_t>(rd, 1));
    Grow(ctx_k_, n_ctx * n_head * nope);
    Grow(ctx_v_, n_ctx * n_head * vd);
    Grow(seq_q_, n_s * n_head * qk);
    Grow(seq_out_, n_s * n_head * vd);
    KILN_RETURN_IF_ERROR(backend_.ReadLatent(cache, il, d.context, ctx_c_.data(), ctx_kr_.data()));
    const MatMulTarget k_v[] = {{&w_uk, ctx_k_.data()}, {&w_uv, ctx_v_.data()}};
    KILN_RETURN_IF_ERROR(backend_.MatMulEach(ctx_c_.data(), n_ctx, k_v));
    for (int64_t a = 0; a < n_s; ++a) {
      std::memcpy(seq_q_.data() + a * n_head * qk, q_.data() + d.tokens[a] * n_head * qk,
                  n_head * qk * sizeof(float));
    }
    KILN_RETURN_IF_ERROR(backend_.MlaDecompressedAttention(
        seq_q_.data(), d.n_visible, ctx_k_.data(), ctx_kr_.data(), ctx_v_.data(), n_ctx,
        static_cast<int32_t>(n_head), static_cast<int32_t>(nope), static_cast<int32_t>(rd),
        static_cast<int32_t>(vd), seq_out_.data(), scale));
    for (int64_t a = 0; a < n_s; ++a) {
      std::memcpy(attn_.data() + d.tokens[a] * n_head * vd, seq_out_.data() + a * n_head * vd,
                  n_head * vd * sizeof(float));
    }
  }
  return absl::OkStatus();
}

// llama.cpp's deepseek2 graph for a combined attn_kv_b (flash attention off): kv = attn_kv_b c for
// every token (one matmul in the llama.cpp order), K_h = [k_nope_h | rope(kr)] and V_h = v_h
// stored in the cache, then the attention of a GQA model with n_head KV heads. The padding past
// qk_head_dim (K, q) or v_head_dim (V) is zeros, so each score and each output element is the
// same sum as without it; the output's padding is dropped.
absl::Status MlaForward::RunMhaAttention(KvCache& cache, int32_t il, float scale) {
  const MlaHparams& m = hp_.mla;
  const MlaLayer& L = layers_[il];
  const int64_t n = static_cast<int64_t>(positions_.size()), n_head = hp_.n_head,
                kvl = m.kv_lora_rank, rd = m.rope_dim, nope = m.nope_dim, vd = m.v_head_dim,
                qk = m.qk_head_dim(), row = kvl + rd, hd = cache.layout().head_dim();
  Grow(head_in_, n * kvl);
  Grow(mha_kv_, n * n_head * (nope + vd));
  Grow(abs_q_, n * n_head * hd);
  Grow(abs_out_, n * n_head * hd);
  mha_k_.assign(static_cast<size_t>(n * n_head * hd), 0.0f);
  mha_v_.assign(static_cast<size_t>(n * n_head * hd), 0.0f);
  for (int64_t t = 0; t < n; ++t) {
    std::memcpy(head_in_.data() + t * kvl, latent_.data() + t * row, kvl * sizeof(float));
  }
  KILN_RETURN_IF_ERROR(backend_.MatMul(*L.kv_b, head_in_.data(), n, mha_kv_.data()));
  std::fill(abs_q_.begin(), abs_q_.begin() + n * n_head * hd, 0.0f);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < n_head; ++h) {
      const float* kv = mha_kv_.data() + (t * n_head + h) * (nope + vd);
      float* k = mha_k_.data() + (t * n_head + h) * hd;
      std::memcpy(k, kv, nope * sizeof(float));
      std::memcpy(k + nope, kr_.data() + t * rd, rd * sizeof(float));
      std::memcpy(mha_v_.data() + (t * n_head + h) * hd, kv + nope, vd * sizeof(float));
      std::memcpy(abs_q_.data() + (t * n_head + h) * hd, q_.data() + (t * n_head + h) * qk,
                  qk * sizeof(float));
    }
  }
  KILN_RETURN_IF_ERROR(backend_.WriteKv(cache, il, std::span<const KvSlot>(slots_.data(), n),
                                        mha_k_.data(), mha_v_.data()));
  KILN_RETURN_IF_ERROR(backend_.Attention(cache, il, mask_, abs_q_.data(),
                                          static_cast<int32_t>(n_head), abs_out_.data(), scale));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < n_head; ++h) {
      std::memcpy(attn_.data() + (t * n_head + h) * vd, abs_out_.data() + (t * n_head + h) * hd,
                  vd * sizeof(float));
    }
  }
  return absl::OkStatus();
}

// llama.cpp's absorbed deepseek2 graph (flash attention off), op for op. Per head h, q_abs =
// attn_k_b_h q_nope is a matmul of its own (llama.cpp's rules: 8-bit activations for q8_0 weights,
// f16 for f16; f32 weights always as ggml_vec_dot_f32, since ggml's permuted q_nope is not
// contiguous, so one token at a time here); then the latent attention (Backend::MlaLatentAttention:
// the cache's rows as one K head, their c part as V); then attn_v_b_h times the latent sum.
absl::Status MlaForward::RunAttentionLlamaCpp(const KvCache& cache, int32_t il, float scale) {
  const MlaHparams& m = hp_.mla;
  const MlaLayer& L = layers_[il];
  const int64_t n = static_cast<int64_t>(positions_.size()), n_head = hp_.n_head,
                kvl = m.kv_lora_rank, rd = m.rope_dim, nope = m.nope_dim, vd = m.v_head_dim,
                qk = m.qk_head_dim(), row = kvl + rd;
  Grow(head_in_, n * std::max(nope, kvl));
  Grow(head_out_, n * std::max(kvl, vd));
  Grow(abs_q_, n * n_head * row);
  Grow(abs_out_, n * n_head * kvl);
  for (int64_t h = 0; h < n_head; ++h) {  // q_abs[t, h] = [attn_k_b_h q_nope[t, h] | rope(q_r)]
    const WeightView k_b = L.k_b->Rows(h * kvl, kvl);  // head h's rows of the 3-D weight
    for (int64_t t = 0; t < n; ++t) {
      std::memcpy(head_in_.data() + t * nope, q_.data() + (t * n_head + h) * qk,
                  nope * sizeof(float));
    }
    if (k_b.type == GgmlType::kF32) {
      for (int64_t t = 0; t < n; ++t) {
        KILN_RETURN_IF_ERROR(
            backend_.MatMul(k_b, head_in_.data() + t * nope, 1, head_out_.data() + t * kvl));
      }
    } else {
      KILN_RETURN_IF_ERROR(backend_.MatMul(k_b, head_in_.data(), n, head_out_.data()));
    }
    for (int64_t t = 0; t < n; ++t) {
      float* qa = abs_q_.data() + (t * n_head + h) * row;
      std::memcpy(qa, head_out_.data() + t * kvl, kvl * sizeof(float));
      std::memcpy(qa + kvl, q_.data() + (t * n_head + h) * qk + nope, rd * sizeof(float));
    }
  }
  KILN_RETURN_IF_ERROR(backend_.MlaLatentAttention(
      cache, il, mask_, abs_q_.data(), static_cast<int32_t>(n_head), abs_out_.data(), scale));
  for (int64_t h = 0; h < n_head; ++h) {  // attn[t, h] = attn_v_b_h latent[t, h]
    const WeightView v_b = L.v_b->Rows(h * vd, vd);
    for (int64_t t = 0; t < n; ++t) {
      std::memcpy(head_in_.data() + t * kvl, abs_out_.data() + (t * n_head + h) * kvl,
                  kvl * sizeof(float));
    }
    KILN_RETURN_IF_ERROR(backend_.MatMul(v_b, head_in_.data(), n, head_out_.data()));
    for (int64_t t = 0; t < n; ++t) {
      std::memcpy(attn_.data() + (t * n_head + h) * vd, head_out_.data() + t * vd,
                  vd * sizeof(float));
    }
  }
  return absl::OkStatus();
}

absl::Status MlaForward::Forward(const ForwardBatch& batch, KvCache& cache, ForwardOutput* out) {
  KILN_RETURN_IF_ERROR(Validate(batch, cache));
  KILN_RETURN_IF_ERROR(BuildVisibility(batch, cache));
  const bool mha_cache = IsMhaCache(cache.layout());
  if (!mha_cache) KILN_RETURN_IF_ERROR(PlanAttention(batch, cache));
  const MlaHparams& m = hp_.mla;
  const int64_t n = static_cast<int64_t>(batch.tokens.size());
  const int64_t d = hp_.n_embd, n_head = hp_.n_head, kvl = m.kv_lora_rank, rd = m.rope_dim,
                nope = m.nope_dim, qk = m.qk_head_dim(), row = kvl + rd, ff = hp_.n_ff;
  const float scale = m.attn_mscale * m.attn_mscale / std::sqrt(static_cast<float>(qk));
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
  out->BeginLayerHidden(batch, n_logits, d);

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
    // The query's first matrix (wq_a: [n, q_lora_rank]; or wq: [n, H·qk]) and wkv_a ([n, kvl +
    // rd]) take h alike.
    const MatMulTarget from_h[] = {
        L.wq_a != nullptr ? MatMulTarget{L.wq_a, qa_.data()} : MatMulTarget{L.wq, q_.data()},
        {L.wkv_a, kva_.data()}};
    KILN_RETURN_IF_ERROR(backend_.MatMulEach(h, n, from_h));
    if (L.wq_a != nullptr) {
      backend_.RmsNorm(qa_.data(), L.q_a_norm->AsF32(), n, m.q_lora_rank, hp_.rms_eps, qa_.data());
      KILN_RETURN_IF_ERROR(backend_.MatMul(*L.wq_b, qa_.data(), n, q_.data()));  // [n, H·qk]
    }
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
      for (int64_t hh = 0; hh < n_head; ++hh) {
        std::memcpy(q_.data() + (i * n_head + hh) * qk + nope, qpe_.data() + (i * n_head + hh) * rd,
                    rd * sizeof(float));
      }
      std::memcpy(latent_.data() + i * row + kvl, kr_.data() + i * rd, rd * sizeof(float));
    }
    if (mha_cache) {  // attn_: [n, n_head, v_head_dim]
      KILN_RETURN_IF_ERROR(RunMhaAttention(cache, il, scale));
    } else {
      KILN_RETURN_IF_ERROR(backend_.WriteLatent(
          cache, il, std::span<const KvSlot>(slots_.data(), n), latent_.data()));
      // Attention over the latent rows, absorbed or decompressed.
      KILN_RETURN_IF_ERROR(RunAttention(cache, il, scale));
    }
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
    backend_.RmsNorm(x, L.ffn_norm->AsF32(), rows, d, hp_.rms_eps, h);
    if (il >= m.n_layer_dense_lead) {  // mixture of experts           x, h: [rows, n_embd]
      KILN_RETURN_IF_ERROR(moe_->Forward(backend_, il, h, rows, proj_.data()));
      backend_.Add(x, proj_.data(), rows * d, x);
      out->CaptureLayerHidden(il, x, /*compacted=*/il == hp_.n_layer - 1);
      continue;
    }
    // Dense SwiGLU feed-forward.                            x, h: [rows, n_embd]
    const MatMulTarget gate_up[] = {{L.ffn_gate, gate_.data()}, {L.ffn_up, up_.data()}};
    KILN_RETURN_IF_ERROR(backend_.MatMulEach(h, rows, gate_up));
    backend_.SwiGlu(gate_.data(), up_.data(), rows * ff, gate_.data());
    KILN_RETURN_IF_ERROR(backend_.MatMul(*L.ffn_down, gate_.data(), rows, proj_.data()));
    backend_.Add(x, proj_.data(), rows * d, x);
    out->CaptureLayerHidden(il, x, /*compacted=*/il == hp_.n_layer - 1);
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

absl::StatusOr<KvLayout> MlaMhaCacheLayout(const ModelHparams& hp, GgmlType kv_type,
                                           int32_t block_size) {
  const MlaHparams& m = hp.mla;
  return KvLayout::Gqa(static_cast<int32_t>(hp.n_layer), static_cast<int32_t>(hp.n_head),
                       static_cast<int32_t>(std::max(m.qk_head_dim(), m.v_head_dim)), kv_type,
                       block_size);
}

absl::StatusOr<std::unique_ptr<ForwardPass>> NewMlaForward(const Model& model, Backend& backend,
                                                           MlaPrefillMode mode) {
  const ModelHparams& hp = model.hparams();
  const MlaHparams& m = hp.mla;
  if (hp.rope.scaling != RopeScaling::kNone && hp.rope.scaling != RopeScaling::kYarn) {
    return absl::UnimplementedError(
        "model: the deepseek2 forward pass supports YaRN rope scaling only");
  }
  std::optional<MoeFeedForward> moe;
  if (m.n_layer_dense_lead < hp.n_layer) {
    KILN_ASSIGN_OR_RETURN(moe, MoeFeedForward::Bind(model, m.n_layer_dense_lead));
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
    L.ffn_gate = L.ffn_up = L.ffn_down = nullptr;
    if (l < m.n_layer_dense_lead) {
      KILN_ASSIGN_OR_RETURN(L.ffn_gate, required(l, "ffn_gate.weight"));
      KILN_ASSIGN_OR_RETURN(L.ffn_up, required(l, "ffn_up.weight"));
      KILN_ASSIGN_OR_RETURN(L.ffn_down, required(l, "ffn_down.weight"));
    }
    L.k_b = L.v_b = L.kv_b = nullptr;
    if (m.split_kv_b) {
      KILN_ASSIGN_OR_RETURN(L.k_b, required(l, "attn_k_b.weight"));
      KILN_ASSIGN_OR_RETURN(L.v_b, required(l, "attn_v_b.weight"));
    } else {
      KILN_ASSIGN_OR_RETURN(L.kv_b, required(l, "attn_kv_b.weight"));
    }
    // The file's rows serve the absorbed attention as they are when the backend reads them.
    L.absorb = {nullptr, nullptr, static_cast<int32_t>(kvl), static_cast<int32_t>(nope),
                static_cast<int32_t>(vd)};
    const GgmlType rows_type = m.split_kv_b ? L.k_b->type : L.kv_b->type;
    if (backend.ReadsMlaWeightRows() && WidensExactly(rows_type) &&
        (!m.split_kv_b || L.v_b->type == rows_type)) {
      L.absorb.rows_type = rows_type;
      if (m.split_kv_b) {
        // attn_k_b: per head kv_lora_rank rows of nope_dim (W_UKᵀ); attn_v_b: per head
        // v_head_dim rows of kv_lora_rank (W_UV).
        L.absorb.uk_transposed = true;
        for (int64_t r = 0; r < n_head * kvl; ++r) L.uk_rows.push_back(L.k_b->Row(r));
        for (int64_t r = 0; r < n_head * vd; ++r) L.uv_rows.push_back(L.v_b->Row(r));
      } else {
        // attn_kv_b: per head nope_dim key rows then v_head_dim value rows.
        for (int64_t hh = 0; hh < n_head; ++hh) {
          for (int64_t r = 0; r < nope; ++r) L.uk_rows.push_back(L.kv_b->Row(hh * (nope + vd) + r));
          for (int64_t r = 0; r < vd; ++r) {
            L.uv_rows.push_back(L.kv_b->Row(hh * (nope + vd) + nope + r));
          }
        }
      }
      L.absorb.uk_rows = L.uk_rows.data();
      L.absorb.uv_rows = L.uv_rows.data();
      // The decompressed prefill's matmuls still need the f32 copies.
      if (mode == MlaPrefillMode::kAbsorbed) continue;
    }
    L.w_uk.resize(static_cast<size_t>(n_head * nope * kvl));
    L.w_uv.resize(static_cast<size_t>(n_head * vd * kvl));
    if (m.split_kv_b) {
      KILN_ASSIGN_OR_RETURN(std::vector<float> k_b, DequantizeAll(*L.k_b));
      KILN_ASSIGN_OR_RETURN(std::vector<float> v_b, DequantizeAll(*L.v_b));
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
      KILN_ASSIGN_OR_RETURN(std::vector<float> kv_b, DequantizeAll(*L.kv_b));
      for (int64_t hh = 0; hh < n_head; ++hh) {
        const float* head = kv_b.data() + hh * (nope + vd) * kvl;
        std::copy(head, head + nope * kvl, L.w_uk.begin() + hh * nope * kvl);
        std::copy(head + nope * kvl, head + (nope + vd) * kvl, L.w_uv.begin() + hh * vd * kvl);
      }
    }
    if (L.uk_rows.empty()) {
      L.absorb.w_uk = L.w_uk.data();
      L.absorb.w_uv = L.w_uv.data();
    }
  }
  return std::unique_ptr<ForwardPass>(
      new MlaForward(model, backend, std::move(layers), std::move(moe), mode));
}

}  // namespace kiln
