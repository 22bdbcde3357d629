// The CPU backend: the Backend interface over the ops of ops.h, with its own thread pool and
// scratch memory. Weights are prepared as row-interleaved copies for the integer-order matmuls
// (kiln's numeric order); K/V live in host memory.
#pragma once

#include <memory>
#include <string>

#include "lib/backend/backend.h"
#include "lib/backend/cpu/ops.h"
#include "lib/backend/cpu/thread_pool.h"

namespace kiln::cpu {

// Stores n floats as one K/V cache row of `type` (F32, F16, BF16, Q8_0) at dst, as WriteKv does;
// for other backends that convert on the host before copying to their memory.
void StoreKvRow(const float* src, int64_t n, GgmlType type, std::byte* dst);

// CpuBackend::PrepareWeights without a backend: row-interleaved copies of the matrices whose type
// has an interleaved form (QuantKernels::interleave: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0; at AVX-512
// Q4_K, Q5_K, Q6_K), in one allocation, written by a thread of the store's own after this returns
// (WeightView::copied_rows counts each matrix's rows written; WeightStore::WaitUntilPrepared). The
// mapped file's pages of those matrices are then read only in the llama.cpp order (or for an
// embedding row not yet copied), so they are released behind the copy when release_file_pages.
// Every matrix whose type has an in-place kernel is marked in_place: it serves until the copy is
// written, and for good where the memory for the copies could not be had.
absl::StatusOr<std::unique_ptr<WeightStore>> PrepareCpuWeights(
    std::span<WeightView* const> matrices, bool release_file_pages);

class CpuBackend final : public Backend {
 public:
  // n_threads <= 0: physical cores. One thread starts no worker, so a CpuBackend(1) is cheap.
  // pin_workers: each worker thread bound to a core of its own (ThreadPool).
  explicit CpuBackend(int n_threads, bool pin_workers = false);

  std::string Describe() const override;
  absl::StatusOr<std::unique_ptr<WeightStore>> PrepareWeights(
      std::span<WeightView* const> matrices, bool release_file_pages) const override;
  absl::StatusOr<std::unique_ptr<KvStorage>> NewKvStorage(const KvLayout& layout,
                                                          int32_t n_blocks) override;
  void set_llama_cpp_order(bool on) override { llama_cpp_order_ = on; }
  bool llama_cpp_order() const override { return llama_cpp_order_; }
  int n_threads() const override { return pool_.n_threads(); }

  absl::Status MatMul(const WeightView& w, const float* x, int64_t n_tokens, float* y) override;
  absl::Status MatMulEach(const float* x, int64_t n_tokens,
                          std::span<const MatMulTarget> targets) override;
  absl::Status ExpertMatMul(const WeightView& w, int64_t n_expert, int64_t expert, const float* x,
                            int64_t n_tokens, float* y) override;
  absl::Status MatMulRange(const WeightView& w, const float* x, int64_t n_tokens, int64_t row_begin,
                           int64_t row_end, float* y) override;
  absl::Status EmbeddingGather(const WeightView& table, std::span<const int32_t> tokens,
                               float* out) override;
  void RmsNorm(const float* x, const float* weight, int64_t n_rows, int64_t n, float eps,
               float* y) override;
  void Add(const float* a, const float* b, int64_t n, float* y) override;
  void AddRowBias(float* x, const float* bias, int64_t n_rows, int64_t n) override;
  void SwiGlu(const float* gate, const float* up, int64_t n, float* y) override;
  void GeGlu(const float* gate, const float* up, int64_t n, float* y) override;
  void Scale(float* x, int64_t n, float s) override;
  absl::Status PrepareRope(const RopeConfig& config, int32_t head_dim,
                           std::span<const int32_t> positions) override;
  void RotateRope(float* x, int64_t n_heads) override;
  absl::Status WriteKv(KvCache& cache, int32_t layer, std::span<const KvSlot> slots, const float* k,
                       const float* v) override;
  absl::Status Attention(const KvCache& cache, int32_t layer, const AttentionMask& mask,
                         const float* q, int32_t n_heads, float* out, float scale) override;
  absl::Status WriteLatent(KvCache& cache, int32_t layer, std::span<const KvSlot> slots,
                           const float* latent) override;
  bool ReadsMlaWeightRows() const override { return true; }
  absl::Status MlaAttention(const KvCache& cache, int32_t layer, const AttentionMask& mask,
                            const float* q, int32_t n_heads, const MlaAttentionWeights& w,
                            float* out, float scale) override;
  absl::Status MlaLatentAttention(const KvCache& cache, int32_t layer, const AttentionMask& mask,
                                  const float* q_abs, int32_t n_heads, float* out,
                                  float scale) override;
  absl::Status ReadLatent(const KvCache& cache, int32_t layer, std::span<const KvSlot> slots,
                          float* c, float* k_rope) override;
  absl::Status MlaDecompressedAttention(const float* q, std::span<const int32_t> n_visible,
                                        const float* k_nope, const float* k_rope, const float* v,
                                        int64_t n_ctx, int32_t n_heads, int32_t nope_dim,
                                        int32_t rope_dim, int32_t v_dim, float* out,
                                        float scale) override;
  void CopyKvSlot(KvCache& cache, KvSlot from, KvSlot to) override;

 private:
  // The view of `w` the current numeric order multiplies with (the interleaved copy is kiln's).
  WeightView ForOrder(const WeightView& w) const;

  ThreadPool pool_;
  Scratch scratch_;
  RopeTable rope_;
  bool llama_cpp_order_ = false;
};

// The kernels' view of a mask (the same spans): which cached rows and in-batch rows each token
// sees, for the layer's KV group `group` (KvLayout). The CUDA backend checks a mask with it before
// launching (ValidateAttentionBatch).
AttentionBatch AttentionBatchOf(const AttentionMask& mask, int32_t group = 0);

// One latent row of an MLA cache (`row`: its row_bytes in host memory) as f32: c [kv_lora_rank]
// and k_rope [rope_dim], exactly the values MlaAttention reads (ReadLatent's decoding, which the
// CUDA backend applies to rows it downloads).
absl::Status DecodeLatentRow(const KvLayout& layout, const std::byte* row, float* c, float* k_rope);

}  // namespace kiln::cpu
