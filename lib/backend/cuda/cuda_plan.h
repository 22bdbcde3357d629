// Host-side planning for the CUDA backend's compute kernels: which path a matmul takes, the
// paged K/V view of a layer, the attention mask packed for one upload, and the split-K count.
// Plain functions of their inputs, tested against the CPU's equivalents on a machine without a
// device (tests/unit/cuda_plan_test.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "kernels/cuda/cuda_abi.h"
#include "lib/backend/attention_mask.h"
#include "lib/kv/kv_layout.h"
#include "lib/kv/kv_storage.h"

namespace kiln::cuda {

// Up to this many tokens a matmul runs as GEMV: one kernel call reads the (quantized) weight
// once for all of them, which is the decode roofline. Above it the cuBLASLt path pays: it first
// writes and re-reads an f16 copy of the weight (2 bytes per element, 3.5x a Q4_K weight's
// bytes), a cost the tensor cores amortize only over many tokens, while more GEMV calls would
// read the weight again per 8 tokens. Equal to the GEMV kernel's limit (kiln_cuda_matmul_caps).
inline constexpr int64_t kGemvMaxTokens = 8;

// What the module can do with one weight type (kiln_cuda_matmul_caps).
struct MatMulCaps {
  int32_t gemv_max_tokens = 0;  // 0: no GEMV kernel
  bool gemm = false;            // the f16 dequantizer and cuBLASLt read it
};

enum class MatMulPath {
  kCpu,   // no device kernel for the type or shape (or the weight is not on the device)
  kGemv,  // kiln_cuda_gemv, in calls of at most gemv_max_tokens tokens
  kGemm,  // kiln_cuda_dequantize_f16 into scratch, then kiln_cuda_gemm_f16
};

// The path of y = x . W^T for a weight of n_out x n_in with `caps`, n_tokens >= 1: GEMV up to
// kGemvMaxTokens tokens, else the GEMM when its shape rules allow (n_out and n_in multiples of
// 8), else GEMV in chunks, else the CPU.
MatMulPath ChooseMatMulPath(const MatMulCaps& caps, bool weight_on_device, int64_t n_out,
                            int64_t n_in, int64_t n_tokens);

// The kernels' view of `layer` of a pool placed as `placement` says (device addresses; never
// dereferenced here): GQA keys and values, or an MLA layer's latent rows as one head (a q8_0
// row's RoPE part as the f16 tail, kv_layout.h). The same addresses KvCache::KeyRow, ValueRow
// and LatentRow compute.
KilnCudaPagedKv PagedKvOf(const KvLayout& layout, const KvPlacement& placement, int32_t n_blocks,
                          int32_t layer);

// The longest K/V row the paged kernels read (KilnCudaPagedKv::head_dim, cuda_abi.h): a GQA
// head_dim, or an MLA row of kv_lora_rank + rope_dim (DeepSeek's 512 + 64 fits).
inline constexpr int32_t kMaxAttentionRowElems = 640;

// An AttentionMask's arrays back to back in one int32 buffer (one upload), with each array's
// offset; the last element is the kernels' error flag (0). Arrays a mask leaves empty
// (first_visible, the tree extras) get kAbsent and null pointers in BatchAt.
struct PackedMask {
  static constexpr size_t kAbsent = static_cast<size_t>(-1);
  std::vector<int32_t> data;
  int64_t n_tokens = 0;
  size_t seq = 0, kv_indptr = 0, kv_indices = 0, n_visible = 0, first_visible = kAbsent,
         extra_indptr = kAbsent, extra_positions = kAbsent, error = 0;
  int32_t max_visible = 0;  // the most rows one token sees (for ChooseSplits)
};
// Packs a mask that cpu::ValidateAttentionBatch accepted (mask.tables set), with the block table
// of layer group `group` (KvLayout: a sliding-window group's table has kNullBlock where released).
PackedMask PackMask(const AttentionMask& mask, int32_t group = 0);
// The batch descriptor over a copy of packed.data starting at `base` (device memory for the
// kernels, host memory in the tests).
KilnCudaAttentionBatch BatchAt(const PackedMask& packed, int32_t* base);

// Split-K count for n_rows (token, head) pairs whose longest visible range is max_visible rows:
// enough thread blocks to fill the device (about kSplitTargetBlocks) when the pairs alone do
// not, but at least kMinRowsPerSplit rows per split (below that the combine step costs more than
// the parallelism gains), within the kernel's 1..64.
// Every warp slot of an H100/H200 (132 SMs x 16 blocks of 4 warps): a split's warps walk their
// rows one at a time, each row a chain of dependent loads and reductions, so only many warps in
// flight keep HBM busy (with two waves, 264 blocks, GQA decode at 32k read 30 GB/s on an H200).
inline constexpr int64_t kSplitTargetBlocks = 132 * 16;
inline constexpr int32_t kMinRowsPerSplit = 64;
inline constexpr int32_t kMaxSplits = 64;
int32_t ChooseSplits(int64_t n_rows, int32_t max_visible);

// Device copies of host byte ranges (CudaBackend::UploadWeights: one per weight tensor), looked
// up by host address, so that a view of some of a tensor's bytes (an expert's rows, a tied head)
// finds its part of the tensor's copy. Addresses are never dereferenced here.
class DeviceCopies {
 public:
  // Records that device address `device` holds host bytes [host, host + bytes); ranges must not
  // overlap.
  void Add(const void* host, size_t bytes, void* device);
  // The device address of host bytes [host, host + bytes) when one recorded range holds them
  // all, else null.
  const void* Find(const void* host, size_t bytes) const;
  size_t bytes() const { return bytes_; }  // the recorded ranges' bytes

 private:
  struct Range {
    size_t bytes = 0;
    std::byte* device = nullptr;
  };
  std::map<uintptr_t, Range> ranges_;  // by the range's first host address
  size_t bytes_ = 0;
};

}  // namespace kiln::cuda
