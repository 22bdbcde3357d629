// The CUDA backend: the Backend interface over the libkiln_cuda.so module (cuda_loader.h).
//
// Memory: PrepareWeights uploads each matrix once, in its file type (quantized types stay
// quantized) and sets WeightView::device_data; the DeviceWeights store owns that memory.
// NewKvStorage puts the K/V blocks in device memory (KvStorage::BlockData is then a device
// address); the block tables (KvCache's CSR tables) are the CPU's, unchanged.
//
// Activations: the Backend interface passes host pointers. This first version copies each op's
// inputs to device scratch buffers, runs the kernel and copies the result back (correct, not
// fast); docs/cuda_backend.md has the plan for device-resident activations.
//
// Ops without a device kernel in the module yet:
//   MatMul, ExpertMatMul, MatMulRange, MlaDecompressedAttention: run on an embedded CPU backend
//     (their inputs are host memory and the weights' host copies stay mapped), so results are
//     correct, at CPU speed.
//   Attention, MlaAttention, WriteLatent, ReadLatent: Unimplemented (their K/V are in device
//     memory, which the CPU cannot read); IncompleteOps() lists them, and backend selection
//     does not pick an incomplete CUDA backend for a model.
//   EmbeddingGather of a type the device cannot dequantize (the K-quants, ...): gathered on the
//     CPU from the host copy.
//
// Errors of the void ops (RmsNorm, Add, ...): the interface cannot return them, so the first one
// is kept and returned by the next status-returning op (and by TakeDeferredError), and the op's
// output is filled with NaN so that nothing downstream looks valid.
#pragma once

#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lib/backend/backend.h"
#include "lib/backend/cpu/cpu_backend.h"
#include "lib/backend/cpu/ops.h"
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

  // The ops that return Unimplemented on this backend ("Attention, MlaAttention, ..."); empty
  // when every op runs.
  static std::vector<std::string> IncompleteOps();

  // The first error of a void op since the last call, then OK.
  absl::Status TakeDeferredError();

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

  // Scratch slots of the RoPE tables (kept from PrepareRope to the batch's last RotateRope),
  // past the element-wise ops' slots 0 to 2.
  static constexpr int kRopeCosSlot = 3, kRopeSinSlot = 4;

  const CudaModule& m_;
  int device_;
  kiln_cuda_stream stream_ = nullptr;
  cpu::CpuBackend cpu_;  // the ops without a device kernel (see the file comment)
  std::vector<std::pair<void*, size_t>> scratch_;
  void* gelu_table_ = nullptr;  // [65536] f16, cpu::GeluF16Table() uploaded
  // RoPE: the CPU's table (built by the same code, so the angles are the same bits), uploaded.
  cpu::RopeTable rope_host_;
  int64_t rope_n_tokens_ = 0;       // 0: no table prepared
  std::vector<std::byte> staging_;  // WriteKv's converted rows
  absl::Status deferred_;
};

}  // namespace kiln::cuda
