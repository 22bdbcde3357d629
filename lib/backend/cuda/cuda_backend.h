// The CUDA backend: the Backend interface over the libkiln_cuda.so module (cuda_loader.h).
//
// Memory: UploadWeights (the engine calls it for its model) uploads each weight once, in its file
// type (quantized types stay quantized), into memory the backend owns; an op finds a weight's
// device copy by the host address of its bytes (DeviceCopyOf), so a view of some of a tensor's
// rows (an expert, a tied head) finds its part. PrepareWeights (a model loaded for this backend)
// sets WeightView::device_data instead; its store owns that memory.
// NewKvStorage puts the K/V blocks in device memory (KvStorage::BlockData is then a device
// address); the block tables (KvCache's CSR tables) are the CPU's, unchanged.
//
// Activations: the Backend interface passes host pointers. This version copies each op's
// inputs to device scratch buffers, runs the kernel and copies the result back (correct, not
// fast); docs/cuda_backend.md has the plan for device-resident activations.
//
// Matmuls (MatMul, ExpertMatMul, MatMulRange): GEMV up to kGemvMaxTokens tokens, the cuBLASLt
//   GEMM (the weight dequantized to f16 into scratch per call) above (cuda_plan.h). A weight type
//   the module cannot read (kiln_cuda_matmul_caps) runs on an embedded CPU backend over the host
//   copy, which stays mapped. MatMulRange equals MatMul's columns bit for bit on the GEMV path;
//   on the GEMM path within the GEMM's rounding (cuBLASLt picks its algorithm per shape).
// Attention (GQA/MHA/MQA, causal, sliding-window and tree masks) and MlaAttention: the paged
//   kernels on the device K/V with the CPU's block tables; the mask is checked on the host with
//   the CPU's checks (the same errors) and uploaded with one copy. WriteLatent / ReadLatent
//   convert rows on the host with the CPU's code. MlaDecompressedAttention (inputs in host
//   memory) runs on the CPU.
// EmbeddingGather of a type the device cannot dequantize (the K-quants, ...): gathered on the
//   CPU from the host copy.
//
// Errors of the void ops (RmsNorm, Add, ...): the interface cannot return them, so the first one
// is kept and returned by the next status-returning op (and by TakeDeferredError), and the op's
// output is filled with NaN so that nothing downstream looks valid.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "lib/backend/backend.h"
#include "lib/backend/cpu/cpu_backend.h"
#include "lib/backend/cpu/ops.h"
#include "lib/backend/cuda/cuda_plan.h"
#include "lib/backend/cuda_loader.h"

namespace kiln::cuda {

class CudaBackend final : public Backend {
 public:
  // A backend on `device` of `module` (a stream, the GELU table uploaded). n_cpu_threads: the
  // embedded CPU backend's threads (for the ops that run there). Errors: the device's (as
  // CudaModule::ToStatus maps them), device out of range (InvalidArgument).
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const CudaModule& module, int device,
                                                             int n_cpu_threads);
  ~CudaBackend() override;

  // The ops a model with this K/V layout needs that the device cannot run (an attention row
  // longer than the kernels read); empty when every op runs. Backend selection does not pick
  // the CUDA backend for a model with any.
  static std::vector<std::string> IncompleteOps(const KvLayout& layout);

  // The first error of a void op since the last call, then OK.
  absl::Status TakeDeferredError();

  // Uploads every weight of `tensors` with more than one row (matrices, embedding tables; the
  // norm and bias vectors are uploaded per op) that has no device copy yet, of a type a device
  // kernel reads. Errors: the device's (out of memory names the tensor); the weights uploaded
  // before it stay usable.
  absl::Status UploadWeights(std::span<const WeightView> tensors);
  // The device copy of w's bytes: w.device_data, else the part of an uploaded tensor's copy that
  // holds them; null when neither exists.
  const void* DeviceCopyOf(const WeightView& w) const;

  std::string Describe() const override;
  absl::StatusOr<std::unique_ptr<WeightStore>> PrepareWeights(
      std::span<WeightView* const> matrices, bool release_file_pages) const override;
  absl::StatusOr<std::unique_ptr<KvStorage>> NewKvStorage(const KvLayout& layout,
                                                          int32_t n_blocks) override;
  void set_llama_cpp_order(bool on) override;
  bool llama_cpp_order() const override { return cpu_.llama_cpp_order(); }
  int n_threads() const override { return cpu_.n_threads(); }

  absl::Status MatMul(const WeightView& w, const float* x, int64_t n_tokens, float* y) override;
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
  absl::Status MlaAttention(const KvCache& cache, int32_t layer, const AttentionMask& mask,
                            const float* q, int32_t n_heads, const MlaAttentionWeights& w,
                            float* out, float scale) override;
  // The llama.cpp order's MLA attention runs on the CPU only: Unimplemented here.
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
  CudaBackend(const CudaModule& module, int device, int n_cpu_threads);

  // Device scratch buffer `slot` of at least `bytes` (grown, never shrunk; slots are reused by
  // every op, which synchronizes before returning).
  absl::StatusOr<void*> Scratch(int slot, size_t bytes);
  absl::Status Upload(void* dst, const void* src, size_t bytes);
  absl::Status Download(void* dst, const void* src, size_t bytes);
  absl::Status Sync(std::string_view what);
  // Keeps the first failure of a void op and fills its output (n floats) with NaN.
  void Defer(absl::Status status, float* out, int64_t n);
  // Uploads `inputs` (host pointer, float count) to scratch slots 0, 1, ..., runs launch(device
  // pointers: the inputs, then the output: slot 0 itself when in_place, else the next slot) and
  // downloads n_out floats of the output into out.
  template <typename Launch>
  absl::Status RunElementwise(std::string_view what,
                              std::initializer_list<std::pair<const float*, int64_t>> inputs,
                              bool in_place, float* out, int64_t n_out, Launch launch);
  // y[t, 0 .. n_out) (rows ldy floats apart) = x[t, :] . W^T for the weight of ggml `type` at
  // device address d_w (n_out rows of n_in), on `path` (GEMV or GEMM).
  absl::Status DeviceMatMul(MatMulPath path, const MatMulCaps& caps, GgmlType type, const void* d_w,
                            int64_t n_out, int64_t n_in, const float* x, int64_t n_tokens, float* y,
                            int64_t ldy);
  MatMulCaps CapsOf(GgmlType type) const;
  // Uploads the mask (with layer group `group`'s block table) and q, runs launch(batch, d_q,
  // n_splits, d_workspace, d_out) with workspace_floats(n_splits) floats of workspace, and
  // downloads out_floats of the output.
  template <typename Workspace, typename Launch>
  absl::Status RunAttention(std::string_view what, const AttentionMask& mask, int32_t group,
                            const float* q, int64_t q_floats, int32_t n_heads, float* out,
                            int64_t out_floats, Workspace workspace_floats, Launch launch);
  // The device copy of the host floats [p, p + n) (uploaded on first use, kept while the backend
  // lives): MLA's absorbed weights, which the model keeps alive and unchanged.
  absl::StatusOr<const float*> DeviceConstant(const float* p, size_t n);

  // Scratch slots: an op's inputs, output and workspace; the RoPE tables (kept from PrepareRope
  // to the batch's last RotateRope); an attention mask.
  static constexpr int kInSlot = 0, kOutSlot = 1, kWorkSlot = 2, kRopeCosSlot = 3, kRopeSinSlot = 4,
                       kMaskSlot = 5;

  const CudaModule& m_;
  int device_;
  kiln_cuda_stream stream_ = nullptr;
  cpu::CpuBackend cpu_;  // the ops without a device kernel (see the file comment)
  std::vector<std::pair<void*, size_t>> scratch_;
  void* gelu_table_ = nullptr;  // [65536] f16, cpu::GeluF16Table() uploaded
  // RoPE: the CPU's table (built by the same code, so the angles are the same bits), uploaded.
  cpu::RopeTable rope_host_;
  int64_t rope_n_tokens_ = 0;            // 0: no table prepared
  std::vector<std::byte> staging_;       // WriteKv's and WriteLatent's converted rows, ReadLatent's
  std::vector<float> range_staging_;     // MatMulRange's columns before they are placed in y
  KilnCudaGemmContext* gemm_ = nullptr;  // cuBLASLt handle and workspace
  std::vector<std::pair<const float*, void*>> constants_;  // DeviceConstant's copies
  DeviceCopies uploaded_;                                  // UploadWeights' copies, by host address
  std::unique_ptr<WeightStore> uploaded_store_;            // and their device memory
  absl::Status deferred_;
};

}  // namespace kiln::cuda
