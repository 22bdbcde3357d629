#include "lib/backend/cpu/cpu_backend.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "lib/backend/cpu/dispatch.h"
#include "lib/backend/cpu/matmul_llama_cpp.h"
#include "lib/common/half.h"
#include "lib/common/platform.h"
#include "lib/quant/activation.h"
#include "lib/quant/interleave.h"

namespace kiln::cpu {
namespace {

// One slice of a matrix's interleaved copy: rows [row, row + rows) (whole groups of 16).
struct CopySlice {
  const WeightView* w;
  int64_t row, rows;
  uint8_t* dst;                  // the matrix's copy
  std::atomic<int64_t>* copied;  // the matrix's rows written
};

// Writes a slice of the copy, then lets the file's pages of it go.
void WriteSlice(const CopySlice& s, bool release_file_pages) {
  const QuantKernels* k = GetQuantKernels(s.w->type);
  const uint8_t* src = static_cast<const uint8_t*>(s.w->data) + s.row * s.w->row_bytes();
  k->interleave(src, s.w->row_bytes(), s.w->n_in, s.rows,
                s.dst + s.row / quant::kInterleaveRows * k->interleaved_group_bytes(s.w->n_in));
  s.copied->store(s.row + s.rows, std::memory_order_release);
  // After the rows are published: a matmul reading them in place from here on reads the copy.
  if (release_file_pages) platform::ReleaseMappedPages(src, s.rows * s.w->row_bytes());
}

// A model's interleaved copies in one allocation, the thread that writes them after load, each
// matrix's count of rows written, and a wait for the last one.
class InterleavedWeights final : public WeightStore {
 public:
  InterleavedWeights(uint8_t* data, size_t bytes) : data_(data), bytes_(bytes) {}
  ~InterleavedWeights() override {
    stop_.store(true, std::memory_order_relaxed);
    if (writer_.joinable()) writer_.join();
    platform::AlignedFree(data_);
  }
  size_t bytes() const override { return bytes_; }
  void WaitUntilPrepared() const override {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return done_; });
  }

  // Writes `slices` on a thread of its own, in order, each matrix's counter (n_matrices of
  // them, made here) counting its rows written.
  std::atomic<int64_t>* MakeCounters(size_t n_matrices) {
    counters_ = std::make_unique<std::atomic<int64_t>[]>(n_matrices);
    for (size_t i = 0; i < n_matrices; ++i) counters_[i].store(0, std::memory_order_relaxed);
    return counters_.get();
  }
  void WriteInBackground(std::vector<CopySlice> slices, bool release_file_pages) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = false;
    }
    writer_ = std::thread([this, slices = std::move(slices), release_file_pages] {
      for (const CopySlice& s : slices) {
        if (stop_.load(std::memory_order_relaxed)) break;
        WriteSlice(s, release_file_pages);
      }
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
      done_cv_.notify_all();
    });
  }

 private:
  uint8_t* data_;
  size_t bytes_;
  std::unique_ptr<std::atomic<int64_t>[]> counters_;
  std::thread writer_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  mutable std::condition_variable done_cv_;
  bool done_ = true;
};

// Stores one f32 row as the cache's element type.
void StoreRow(const OpKernels& k, const float* src, int64_t n, GgmlType type, std::byte* dst) {
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
    case GgmlType::kQ8_0:
      // ggml's CPU quantize_row_q8_0 rounding (what llama.cpp stores in a q8_0 cache); n % 32 == 0
      // (KvLayout).
      ActivationQuantizer(GgmlType::kQ8_0, BestCpuLevel())(src, dst, n);
      break;
    default:
      break;  // KvLayout admits only the four types above
  }
}

}  // namespace

AttentionBatch AttentionBatchOf(const AttentionMask& mask, int32_t group) {
  AttentionBatch ab;
  ab.seq = mask.seq;
  ab.kv_indptr = mask.tables->indptr;
  ab.kv_indices = mask.tables->indices_of(group);
  ab.n_visible = mask.n_visible;
  ab.first_visible = mask.first_visible;
  ab.extra_indptr = mask.extra_indptr;
  ab.extra_positions = mask.extra_positions;
  return ab;
}

namespace {

// The paged kernels' view of one layer of `cache` whose K and V tiles of kv head 0 start (in
// block 0) at k_base and v_base: heads one tile stride apart, blocks one block stride apart
// (the storage's KvPlacement).
PagedKvView CacheView(const KvCache& cache, int32_t n_kv_heads, int32_t head_dim,
                      const std::byte* k_base, const std::byte* v_base) {
  const KvLayout& layout = cache.layout();
  PagedKvView kv;
  kv.block_size = layout.block_size();
  kv.n_kv_heads = n_kv_heads;
  kv.head_dim = head_dim;
  kv.n_blocks = cache.NumBlocks();
  kv.k.type = kv.v.type = layout.elem_type();
  kv.k.block_stride_bytes = kv.v.block_stride_bytes =
      static_cast<int64_t>(cache.placement().block_stride);
  kv.k.head_stride_bytes = kv.v.head_stride_bytes =
      static_cast<int64_t>(cache.placement().tile_stride);
  kv.k.base = k_base;
  kv.v.base = v_base;
  return kv;
}

// The latent rows of an MLA cache's `layer` as one kv head whose K is the whole row and V its
// first kv_lora_rank elements.
PagedKvView LatentView(const KvCache& cache, int32_t layer) {
  const std::byte* latent = cache.LatentPtr(kNullBlock, layer);
  return CacheView(cache, 1, static_cast<int32_t>(cache.layout().row_elems()), latent, latent);
}

}  // namespace

absl::Status DecodeLatentRow(const KvLayout& layout, const std::byte* row, float* c,
                             float* k_rope) {
  // The exact decoders (f16/bf16 widening, q8_0 as f16 scale x int8).
  const QuantKernels* c_type = GetQuantKernels(layout.elem_type(), CpuLevel::kScalar);
  const QuantKernels* r_type = GetQuantKernels(layout.rope_elem_type(), CpuLevel::kScalar);
  if (c_type == nullptr || c_type->dequantize == nullptr || r_type == nullptr ||
      r_type->dequantize == nullptr) {
    return absl::UnimplementedError("ReadLatent: the latent cache's element type has no decoder");
  }
  const int64_t kvl = layout.kv_lora_rank(), rd = layout.row_elems() - kvl;
  c_type->dequantize(row, c, kvl);
  if (rd > 0) r_type->dequantize(row + layout.rope_offset_bytes(), k_rope, rd);
  return absl::OkStatus();
}

CpuBackend::CpuBackend(int n_threads, bool pin_workers)
    : pool_(n_threads, /*spin_us=*/200, pin_workers) {}

std::string CpuBackend::Describe() const {
  const bool pinned = pool_.pin_workers() && pool_.n_threads() > 1;
  return absl::StrCat("cpu (", CpuLevelName(BestCpuLevel()), ", ", pool_.n_threads(),
                      pool_.n_threads() == 1 ? " thread" : " threads",
                      pinned ? ", workers pinned)" : ")");
}

void StoreKvRow(const float* src, int64_t n, GgmlType type, std::byte* dst) {
  StoreRow(GetOpKernels(BestCpuLevel()), src, n, type, dst);
}

absl::StatusOr<std::unique_ptr<WeightStore>> PrepareCpuWeights(
    std::span<WeightView* const> matrices, bool release_file_pages) {
  constexpr size_t kAlign = 64;
  auto bytes_of = [](const WeightView& w) -> size_t {
    const QuantKernels* k = GetQuantKernels(w.type);
    if (k == nullptr || k->interleave == nullptr) return 0;
    const int64_t groups = (w.n_out + quant::kInterleaveRows - 1) / quant::kInterleaveRows;
    const size_t bytes = groups * k->interleaved_group_bytes(w.n_in);
    return (bytes + kAlign - 1) / kAlign * kAlign;
  };
  size_t total = 0;
  for (WeightView* w : matrices) {
    const QuantKernels* k = GetQuantKernels(w->type);
    w->in_place = k != nullptr && k->in_place_tile != nullptr;
    total += bytes_of(*w);
  }
  // Without the memory for the copies the rows are read in place for good (the same bits).
  auto* data = total == 0 ? nullptr : static_cast<uint8_t*>(platform::AlignedAllocLarge(total));
  if (data == nullptr) return std::unique_ptr<WeightStore>(new InterleavedWeights(nullptr, 0));
  auto store = std::make_unique<InterleavedWeights>(data, total);
  std::atomic<int64_t>* counters = store->MakeCounters(matrices.size());
  // Slices of the file (whole groups of 16 rows), each slice's file pages released as soon as it
  // is copied: the peak holds one slice twice (4 MiB), not a whole matrix (a tied 262,144-row
  // embedding is 170 MB).
  constexpr int64_t kSliceBytes = int64_t{4} << 20;
  std::vector<CopySlice> slices;
  uint8_t* next = data;
  for (size_t i = 0; i < matrices.size(); ++i) {
    WeightView* w = matrices[i];
    const size_t bytes = bytes_of(*w);
    if (bytes == 0) continue;
    const int64_t slice_rows =
        std::max<int64_t>(1, kSliceBytes / (w->row_bytes() * quant::kInterleaveRows)) *
        quant::kInterleaveRows;
    for (int64_t row = 0; row < w->n_out; row += slice_rows) {
      slices.push_back({w, row, std::min(slice_rows, w->n_out - row), next, &counters[i]});
    }
    w->interleaved = next;
    w->copied_rows = &counters[i];
    next += bytes;
  }
  // Load returns now; the matmuls read the rows in place until their copied rows serve (the same
  // bits either way), so a model is ready as soon as its file is mapped.
  store->WriteInBackground(std::move(slices), release_file_pages);
  return std::unique_ptr<WeightStore>(std::move(store));
}

absl::StatusOr<std::unique_ptr<WeightStore>> CpuBackend::PrepareWeights(
    std::span<WeightView* const> matrices, bool release_file_pages) const {
  return PrepareCpuWeights(matrices, release_file_pages);
}

absl::StatusOr<std::unique_ptr<KvStorage>> CpuBackend::NewKvStorage(const KvLayout& layout,
                                                                    int32_t n_blocks) {
  return NewHostKvStorage(layout, n_blocks);
}

WeightView CpuBackend::ForOrder(const WeightView& w) const {
  WeightView v = w;
  if (llama_cpp_order_) {
    v.interleaved = nullptr;
    v.in_place = false;
  }
  return v;
}

absl::Status CpuBackend::MatMul(const WeightView& w, const float* x, int64_t n_tokens, float* y) {
  if (llama_cpp_order_ && HasLlamaCppMatMul(w.type)) {
    return MatMulLlamaCpp(pool_, w, x, nullptr, n_tokens, y, scratch_);
  }
  return cpu::MatMul(pool_, ForOrder(w), x, n_tokens, y, scratch_);
}

absl::Status CpuBackend::MatMulEach(const float* x, int64_t n_tokens,
                                    std::span<const MatMulTarget> targets) {
  // The llama.cpp order's matmuls stay one at a time (each splits its rows as ggml does).
  if (llama_cpp_order_) return Backend::MatMulEach(x, n_tokens, targets);
  return cpu::MatMulEach(pool_, x, n_tokens, targets, scratch_);
}

// The expert's rows as a matrix of their own. Its interleaved copy is the stack's groups from
// row expert · rows on when the experts start on group boundaries (rows a multiple of 16);
// otherwise it multiplies its rows from the file (the same results up to float rounding).
absl::Status CpuBackend::ExpertMatMul(const WeightView& w, int64_t n_expert, int64_t expert,
                                      const float* x, int64_t n_tokens, float* y) {
  if (n_expert < 1 || w.n_out % n_expert != 0 || expert < 0 || expert >= n_expert) {
    return absl::InvalidArgumentError(
        absl::StrFormat("ExpertMatMul: expert %d of %d does not fit %s (%d rows)", expert, n_expert,
                        w.name, w.n_out));
  }
  const int64_t rows = w.n_out / n_expert;
  WeightView e = w.Rows(expert * rows, rows);
  if (w.InterleavedRows() == w.n_out && rows % quant::kInterleaveRows == 0) {
    const size_t group_bytes = GetQuantKernels(w.type)->interleaved_group_bytes(w.n_in);
    e.interleaved = static_cast<const uint8_t*>(w.interleaved) +
                    static_cast<size_t>(expert * rows / quant::kInterleaveRows) * group_bytes;
  }
  if (llama_cpp_order_ && (w.type == GgmlType::kF32 || w.type == GgmlType::kF16)) {
    // ggml's mul_mat_id has no tinyBLAS path: float experts take ggml_vec_dot per token.
    for (int64_t t = 0; t < n_tokens; ++t) {
      KILN_RETURN_IF_ERROR(MatMul(e, x + t * w.n_in, 1, y + t * rows));
    }
    return absl::OkStatus();
  }
  return MatMul(e, x, n_tokens, y);
}

absl::Status CpuBackend::MatMulRange(const WeightView& w, const float* x, int64_t n_tokens,
                                     int64_t row_begin, int64_t row_end, float* y) {
  if (llama_cpp_order_ && HasLlamaCppMatMul(w.type)) {
    if (row_begin == 0 && row_end == w.n_out) return MatMul(w, x, n_tokens, y);
    return absl::FailedPreconditionError(absl::StrFormat(
        "MatMulRange: rows [%d, %d) of %d: the llama.cpp order multiplies whole matrices only",
        row_begin, row_end, w.n_out));
  }
  return cpu::MatMulRange(pool_, ForOrder(w), x, n_tokens, row_begin, row_end, y, scratch_);
}

absl::Status CpuBackend::EmbeddingGather(const WeightView& table, std::span<const int32_t> tokens,
                                         float* out) {
  // Both orders: a row read from the interleaved copy is the file's row, byte for byte.
  return cpu::EmbeddingGather(table, tokens, out);
}

namespace {

// A prompt's element-wise ops are worth splitting over the pool (512 tokens of SwiGlu took 2.5%
// of a 2-thread prefill on one thread while the other waited); a decode step's are not (a
// ParallelFor costs about as much as 1,536 elements of SwiGlu).
constexpr int64_t kParallelMinElements = int64_t{1} << 16;

// fn(begin, end) over [0, n) in slices of 4,096 elements (16 KiB of floats) split over the
// pool, or in one call when n is small. Every op passed here is element-wise (op_kernels.h:
// each element's bits do not depend on where a call starts), so the split changes no result.
template <typename Fn>
void SplitElements(ThreadPool& pool, int64_t n, Fn&& fn) {
  constexpr int64_t kSlice = 4096;
  if (n < kParallelMinElements || pool.n_threads() == 1) return fn(int64_t{0}, n);
  pool.ParallelFor((n + kSlice - 1) / kSlice,
                   [&](int64_t s0, int64_t s1, int) { fn(s0 * kSlice, std::min(n, s1 * kSlice)); });
}

}  // namespace

void CpuBackend::RmsNorm(const float* x, const float* weight, int64_t n_rows, int64_t n, float eps,
                         float* y) {
  if (n_rows * n < kParallelMinElements || pool_.n_threads() == 1) {
    return cpu::RmsNorm(x, weight, n_rows, n, eps, y);
  }
  pool_.ParallelFor(n_rows, [&](int64_t r0, int64_t r1, int) {  // rows are independent
    cpu::RmsNorm(x + r0 * n, weight, r1 - r0, n, eps, y + r0 * n);
  });
}

void CpuBackend::Add(const float* a, const float* b, int64_t n, float* y) {
  SplitElements(pool_, n,
                [&](int64_t i0, int64_t i1) { cpu::Add(a + i0, b + i0, i1 - i0, y + i0); });
}

void CpuBackend::AddRowBias(float* x, const float* bias, int64_t n_rows, int64_t n) {
  for (int64_t r = 0; r < n_rows; ++r) cpu::Add(x + r * n, bias, n, x + r * n);
}

void CpuBackend::SwiGlu(const float* gate, const float* up, int64_t n, float* y) {
  SplitElements(pool_, n,
                [&](int64_t i0, int64_t i1) { cpu::SwiGlu(gate + i0, up + i0, i1 - i0, y + i0); });
}

void CpuBackend::GeGlu(const float* gate, const float* up, int64_t n, float* y) {
  SplitElements(pool_, n,
                [&](int64_t i0, int64_t i1) { cpu::GeGlu(gate + i0, up + i0, i1 - i0, y + i0); });
}

void CpuBackend::Scale(float* x, int64_t n, float s) { cpu::Scale(x, n, s); }

absl::Status CpuBackend::PrepareRope(const RopeConfig& config, int32_t head_dim,
                                     std::span<const int32_t> positions) {
  return rope_.Build(config, head_dim, positions);
}

void CpuBackend::RotateRope(float* x, int64_t n_heads) { rope_.Apply(x, n_heads); }

absl::Status CpuBackend::WriteKv(KvCache& cache, int32_t layer, std::span<const KvSlot> slots,
                                 const float* k, const float* v) {
  const KvLayout& layout = cache.layout();
  if (layout.kind() != KvAttentionKind::kGqa || layer < 0 || layer >= layout.n_layers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("WriteKv: layer ", layer, " of a cache that is not a GQA cache of it"));
  }
  const int64_t hd = layout.head_dim(), n_kv = layout.n_kv_heads(), kv_dim = n_kv * hd;
  const GgmlType type = layout.elem_type();
  const OpKernels& kernels = GetOpKernels(BestCpuLevel());
  for (size_t i = 0; i < slots.size(); ++i) {
    for (int32_t h = 0; h < n_kv; ++h) {
      StoreRow(kernels, k + i * kv_dim + h * hd, hd, type, cache.KeyRow(slots[i], layer, h));
      StoreRow(kernels, v + i * kv_dim + h * hd, hd, type, cache.ValueRow(slots[i], layer, h));
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::Attention(const KvCache& cache, int32_t layer, const AttentionMask& mask,
                                   const float* q, int32_t n_heads, float* out, float scale) {
  const KvLayout& layout = cache.layout();
  if (mask.tables == nullptr) return absl::InvalidArgumentError("Attention: no block tables");
  if (layout.kind() != KvAttentionKind::kGqa || layer < 0 || layer >= layout.n_layers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Attention: layer ", layer, " of a cache that is not a GQA cache of it"));
  }
  // The layer's rows live in its group's blocks (KvLayout): that group's table.
  const int32_t group = layout.layer_group(layer);
  const PagedKvView kv =
      CacheView(cache, layout.n_kv_heads(), layout.head_dim(), cache.KeyPtr(kNullBlock, layer, 0),
                cache.ValuePtr(kNullBlock, layer, 0));
  const AttentionBatch ab = AttentionBatchOf(mask, group);
  // llama.cpp's order changes with the batch: one token decodes, two or more are a prompt.
  const AttentionOrder order = !llama_cpp_order_      ? AttentionOrder::kBatchInvariant
                               : mask.seq.size() >= 2 ? AttentionOrder::kLlamaCppPrompt
                                                      : AttentionOrder::kLlamaCppDecode;
  return PagedAttention(pool_, kv, ab, q, n_heads, out, scale, scratch_, order);
}

absl::Status CpuBackend::WriteLatent(KvCache& cache, int32_t layer, std::span<const KvSlot> slots,
                                     const float* latent) {
  const KvLayout& layout = cache.layout();
  if (layout.kind() != KvAttentionKind::kMla || layer < 0 || layer >= layout.n_layers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("WriteLatent: layer ", layer, " of a cache that is not an MLA cache of it"));
  }
  const int64_t kvl = layout.kv_lora_rank(), row = layout.row_elems();
  const OpKernels& kernels = GetOpKernels(BestCpuLevel());
  for (size_t i = 0; i < slots.size(); ++i) {
    std::byte* dst = cache.LatentRow(slots[i], layer);
    StoreRow(kernels, latent + i * row, kvl, layout.elem_type(), dst);
    StoreRow(kernels, latent + i * row + kvl, row - kvl, layout.rope_elem_type(),
             dst + layout.rope_offset_bytes());
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::MlaAttention(const KvCache& cache, int32_t layer,
                                      const AttentionMask& mask, const float* q, int32_t n_heads,
                                      const MlaAttentionWeights& w, float* out, float scale) {
  const KvLayout& layout = cache.layout();
  if (layout.kind() != KvAttentionKind::kMla || layer < 0 || layer >= layout.n_layers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("MlaAttention: layer ", layer, " of a cache that is not an MLA cache of it"));
  }
  if (mask.tables == nullptr) return absl::InvalidArgumentError("MlaAttention: no block tables");
  if (w.kv_lora_rank != layout.kv_lora_rank()) {
    return absl::InvalidArgumentError(absl::StrCat("MlaAttention: kv_lora_rank ", w.kv_lora_rank,
                                                   " differs from the cache's ",
                                                   layout.kv_lora_rank()));
  }
  return MlaPagedAttention(pool_, LatentView(cache, layer), AttentionBatchOf(mask), w, q, n_heads,
                           out, scale, scratch_);
}

absl::Status CpuBackend::MlaLatentAttention(const KvCache& cache, int32_t layer,
                                            const AttentionMask& mask, const float* q_abs,
                                            int32_t n_heads, float* out, float scale) {
  const KvLayout& layout = cache.layout();
  if (layout.kind() != KvAttentionKind::kMla || layer < 0 || layer >= layout.n_layers()) {
    return absl::InvalidArgumentError(absl::StrCat("MlaLatentAttention: layer ", layer,
                                                   " of a cache that is not an MLA cache of it"));
  }
  if (mask.tables == nullptr) {
    return absl::InvalidArgumentError("MlaLatentAttention: no block tables");
  }
  if (!llama_cpp_order_) {
    return absl::FailedPreconditionError("MlaLatentAttention: only in the llama.cpp order");
  }
  const AttentionOrder order =
      mask.seq.size() >= 2 ? AttentionOrder::kLlamaCppPrompt : AttentionOrder::kLlamaCppDecode;
  return MlaLatentAttentionLlamaCpp(pool_, LatentView(cache, layer), AttentionBatchOf(mask), q_abs,
                                    n_heads, static_cast<int32_t>(layout.kv_lora_rank()), out,
                                    scale, scratch_, order);
}

absl::Status CpuBackend::ReadLatent(const KvCache& cache, int32_t layer,
                                    std::span<const KvSlot> slots, float* c, float* k_rope) {
  const KvLayout& layout = cache.layout();
  if (layout.kind() != KvAttentionKind::kMla || layer < 0 || layer >= layout.n_layers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReadLatent: layer ", layer, " of a cache that is not an MLA cache of it"));
  }
  if (slots.empty()) return absl::OkStatus();
  if (c == nullptr || k_rope == nullptr) {
    return absl::InvalidArgumentError("ReadLatent: c or k_rope is null");
  }
  const int64_t kvl = layout.kv_lora_rank(), rd = layout.row_elems() - kvl;
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i].block < 0 || slots[i].block >= cache.NumBlocks() || slots[i].offset < 0 ||
        slots[i].offset >= layout.block_size()) {
      return absl::OutOfRangeError(absl::StrCat("ReadLatent: slots[", i, "] (block ",
                                                slots[i].block, ", row ", slots[i].offset,
                                                ") is outside the cache"));
    }
    KILN_RETURN_IF_ERROR(
        DecodeLatentRow(layout, cache.LatentRow(slots[i], layer), c + i * kvl, k_rope + i * rd));
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::MlaDecompressedAttention(const float* q,
                                                  std::span<const int32_t> n_visible,
                                                  const float* k_nope, const float* k_rope,
                                                  const float* v, int64_t n_ctx, int32_t n_heads,
                                                  int32_t nope_dim, int32_t rope_dim, int32_t v_dim,
                                                  float* out, float scale) {
  MlaDecompressedKv kv;
  kv.k_nope = k_nope;
  kv.k_rope = k_rope;
  kv.v = v;
  kv.n_ctx = n_ctx;
  kv.n_heads = n_heads;
  kv.nope_dim = nope_dim;
  kv.rope_dim = rope_dim;
  kv.v_dim = v_dim;
  return cpu::MlaDecompressedAttention(pool_, kv, q, n_visible, out, scale, scratch_);
}

void CpuBackend::CopyKvSlot(KvCache& cache, KvSlot from, KvSlot to) {
  const KvLayout& layout = cache.layout();
  const size_t row_bytes = layout.row_bytes();
  for (int32_t layer = 0; layer < layout.n_layers(); ++layer) {
    if (layout.kind() == KvAttentionKind::kMla) {
      std::memcpy(cache.LatentRow(to, layer), cache.LatentRow(from, layer), row_bytes);
      continue;
    }
    for (int32_t h = 0; h < layout.n_kv_heads(); ++h) {
      std::memcpy(cache.KeyRow(to, layer, h), cache.KeyRow(from, layer, h), row_bytes);
      std::memcpy(cache.ValueRow(to, layer, h), cache.ValueRow(from, layer, h), row_bytes);
    }
  }
}

}  // namespace kiln::cpu
