// Paged GQA attention over kiln's block pool, for decode, causal prefill and tree-masked
// verification alike (the mask says which rows each token sees; paged_index.h walks it).
//
// Pass 1 (AttentionSplitKernel): one thread block per (token, head, split). Its 4 warps take the
// split's rows in turn; per row a warp forms q . k (lane l holds dims l, l + 32, ...; a shuffle
// sum), and keeps an online softmax (running max m, sum l, unnormalized output acc). The warps'
// states are merged in shared memory and written to the workspace as [m, l, acc[head_dim]]. Pass 2
// (AttentionCombineKernel): one thread block per (token, head) merges its splits and divides by the
// total sum. f32 throughout; K/V elements are decoded exactly as the CPU reads them.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math_constants.h>

#include <cstdint>

#include "kernels/cuda/cuda_abi.h"
#include "kernels/cuda/module_util.h"
#include "kernels/cuda/paged_index.h"
#include "kernels/cuda/quant_decode.cuh"

namespace kiln::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxHeadDim = 640;  // MLA rows: kv_lora_rank 512 + rope 64
constexpr int kMaxDimsPerLane = kMaxHeadDim / 32;
constexpr int kMaxSplits = 64;

// Element d of a K/V row of `type` (F32, F16, BF16, Q8_0); with tail_start > 0 the elements from
// tail_start on are f16 at byte tail_offset of the row (an MLA row of a q8_0 cache).
__device__ __forceinline__ float LoadKv(const uint8_t* row, const KilnCudaPagedKv& kv, int d) {
  if (kv.tail_start > 0 && d >= kv.tail_start) {
    return LoadHalf(row + kv.tail_offset_bytes + 2 * (d - kv.tail_start));
  }
  switch (kv.elem_type) {
    case kTypeF32:
      return reinterpret_cast<const float*>(row)[d];
    case kTypeF16:
      return LoadHalf(row + 2 * d);
    case kTypeBF16:
      return __uint_as_float(static_cast<uint32_t>(row[2 * d] | (row[2 * d + 1] << 8)) << 16);
    default:
      return Block<kTypeQ8_0>::Decode(row + (d / 32) * 34, d % 32);  // Q8_0
  }
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

struct SplitArgs {
  KilnCudaPagedKv kv;
  VisibleRows rows;
  BlockTables tables;
  const float* q;
  int32_t n_heads;
  int32_t n_splits;
  float scale;
  float* workspace;
  int32_t* error;
};

// grid: (n_tokens * n_heads, n_splits); block: 32 * kWarps threads;
// dynamic shared memory: (head_dim + kWarps * (head_dim + 2)) floats.
__global__ void AttentionSplitKernel(SplitArgs a) {
  extern __shared__ float smem[];
  const int hd = a.kv.head_dim;
  float* q_s = smem;              // [hd]
  float* warp_state = smem + hd;  // [kWarps][hd + 2]: m, l, acc
  const int64_t t = blockIdx.x / a.n_heads;
  const int h = static_cast<int>(blockIdx.x % a.n_heads);
  const int split = static_cast<int>(blockIdx.y);
  const int kv_head = h / (a.n_heads / a.kv.n_kv_heads);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  const float* q = a.q + (t * a.n_heads + h) * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) q_s[d] = q[d];
  __syncthreads();

  int32_t begin = 0, end = 0;
  SplitRange(VisibleCount(a.rows, static_cast<int32_t>(t)), a.n_splits, split, &begin, &end);
  const int32_t seq = a.rows.seq[t];
  const auto* k_base = static_cast<const uint8_t*>(a.kv.d_k_base);
  const auto* v_base = static_cast<const uint8_t*>(a.kv.d_v_base);
  const size_t head_offset = static_cast<size_t>(kv_head) * a.kv.head_stride_bytes;

  float m = -CUDART_INF_F, l = 0.0f;
  float acc[kMaxDimsPerLane] = {};
  for (int32_t i = begin + warp; i < end; i += kWarps) {
    int32_t block = -1, slot = -1;
    const int32_t pos = VisiblePosition(a.rows, static_cast<int32_t>(t), i);
    if (!LocatePosition(a.tables, seq, pos, &block, &slot)) {
      if (a.error != nullptr && lane == 0) atomicExch(a.error, 1);
      continue;
    }
    const size_t off =
        RowByteOffset(block, slot, a.kv.block_stride_bytes, head_offset, a.kv.row_bytes);
    const uint8_t* k_row = k_base + off;
    const uint8_t* v_row = v_base + off;
    float dot = 0.0f;
#pragma unroll
    for (int k = 0; k < kMaxDimsPerLane; ++k) {
      const int d = lane + 32 * k;
      if (d < hd) dot += q_s[d] * LoadKv(k_row, a.kv, d);
    }
    const float s = WarpSum(dot) * a.scale;
    const float m_new = fmaxf(m, s);
    const float correction = expf(m - m_new);  // m = -inf on the first row: 0
    const float p = expf(s - m_new);
    l = l * correction + p;
#pragma unroll
    for (int k = 0; k < kMaxDimsPerLane; ++k) {
      const int d = lane + 32 * k;
      if (d < hd) acc[k] = acc[k] * correction + p * LoadKv(v_row, a.kv, d);
    }
    m = m_new;
  }

  float* mine = warp_state + warp * (hd + 2);
  if (lane == 0) {
    mine[0] = m;
    mine[1] = l;
  }
#pragma unroll
  for (int k = 0; k < kMaxDimsPerLane; ++k) {
    const int d = lane + 32 * k;
    if (d < hd) mine[2 + d] = acc[k];
  }
  __syncthreads();

  // Merge the warps: weights exp(m_w - M); a warp without rows (m_w = -inf) weighs 0.
  float big = -CUDART_INF_F;
  for (int w = 0; w < kWarps; ++w) big = fmaxf(big, warp_state[w * (hd + 2)]);
  float* out = a.workspace + ((t * a.n_heads + h) * a.n_splits + split) * (hd + 2);
  if (threadIdx.x == 0) {
    float sum = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      const float mw = warp_state[w * (hd + 2)];
      if (mw != -CUDART_INF_F) sum += warp_state[w * (hd + 2) + 1] * expf(mw - big);
    }
    out[0] = big;
    out[1] = sum;
  }
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float v = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      const float mw = warp_state[w * (hd + 2)];
      if (mw != -CUDART_INF_F) v += warp_state[w * (hd + 2) + 2 + d] * expf(mw - big);
    }
    out[2 + d] = v;
  }
}

// grid: n_tokens * n_heads; block: 128 threads.
__global__ void AttentionCombineKernel(const float* workspace, int32_t n_splits, int32_t hd,
                                       float* out, int32_t* error) {
  const float* states = workspace + static_cast<int64_t>(blockIdx.x) * n_splits * (hd + 2);
  float big = -CUDART_INF_F;
  for (int s = 0; s < n_splits; ++s) big = fmaxf(big, states[s * (hd + 2)]);
  float total = 0.0f;
  for (int s = 0; s < n_splits; ++s) {
    const float ms = states[s * (hd + 2)];
    if (ms != -CUDART_INF_F) total += states[s * (hd + 2) + 1] * expf(ms - big);
  }
  if (total == 0.0f && threadIdx.x == 0 && error != nullptr) atomicExch(error, 1);
  const float inv = total > 0.0f ? 1.0f / total : 0.0f;  // a token that sees nothing: 0
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float v = 0.0f;
    for (int s = 0; s < n_splits; ++s) {
      const float ms = states[s * (hd + 2)];
      if (ms != -CUDART_INF_F) v += states[s * (hd + 2) + 2 + d] * expf(ms - big);
    }
    out[static_cast<int64_t>(blockIdx.x) * hd + d] = v * inv;
  }
}

}  // namespace
}  // namespace kiln::cuda

KILN_CUDA_EXPORT size_t kiln_cuda_paged_attention_workspace(int64_t n_tokens, int32_t n_heads,
                                                            int32_t n_splits, int32_t head_dim) {
  return kiln::cuda::AttentionWorkspaceFloats(n_tokens, n_heads, n_splits, head_dim);
}

namespace kiln::cuda {
namespace {

// Checks the arguments, then makes the stream's device current and enqueues both passes; `who`
// names the exported call in messages.
int EnqueuePagedAttention(const KilnCudaPagedKv* kv, const KilnCudaAttentionBatch* batch,
                          const float* d_q, int32_t n_heads, float scale, int32_t n_splits,
                          float* d_workspace, size_t workspace_floats, float* d_out,
                          kiln_cuda_stream stream, const char* who) {
  if (kv == nullptr || batch == nullptr || d_q == nullptr || d_out == nullptr ||
      d_workspace == nullptr || kv->d_k_base == nullptr || kv->d_v_base == nullptr) {
    return kiln_cuda::Fail(KILN_CUDA_INVALID_ARGUMENT, "%s: null pointer", who);
  }
  const int hd = kv->head_dim;
  if (hd < 1 || hd > kMaxHeadDim || kv->n_kv_heads < 1 || n_heads < kv->n_kv_heads ||
      n_heads % kv->n_kv_heads != 0 || kv->block_size < 1 || kv->n_blocks < 1 || n_splits < 1 ||
      n_splits > kMaxSplits || batch->n_tokens < 0 || batch->d_seq == nullptr ||
      batch->d_kv_indptr == nullptr || batch->d_kv_indices == nullptr ||
      batch->d_n_visible == nullptr ||
      (batch->d_extra_indptr != nullptr && batch->d_extra_positions == nullptr)) {
    return kiln_cuda::Fail(KILN_CUDA_INVALID_ARGUMENT,
                           "%s: bad shape (head_dim %d <= %d, n_heads %d a "
                           "multiple of n_kv_heads %d, block_size %d, n_blocks %d, n_splits %d "
                           "in 1..%d, n_tokens %lld) or a null mask array",
                           who, hd, kMaxHeadDim, n_heads, kv->n_kv_heads, kv->block_size,
                           kv->n_blocks, n_splits, kMaxSplits,
                           static_cast<long long>(batch->n_tokens));
  }
  const uint32_t type = kv->elem_type;
  if (type != kTypeF32 && type != kTypeF16 && type != kTypeBF16 && type != kTypeQ8_0) {
    return kiln_cuda::Fail(KILN_CUDA_UNSUPPORTED, "%s: K/V element type %u (F32, F16, BF16, Q8_0)",
                           who, type);
  }
  const int quantized_dims = kv->tail_start > 0 ? kv->tail_start : hd;
  if (kv->tail_start < 0 || kv->tail_start >= hd || kv->tail_offset_bytes < 0 ||
      (type == kTypeQ8_0 && quantized_dims % 32 != 0)) {
    return kiln_cuda::Fail(KILN_CUDA_INVALID_ARGUMENT,
                           "%s: tail_start %d outside [0, head_dim %d), or a Q8_0 row part of %d "
                           "elements (needs a multiple of 32)",
                           who, kv->tail_start, hd, quantized_dims);
  }
  const size_t needed = AttentionWorkspaceFloats(batch->n_tokens, n_heads, n_splits, hd);
  if (workspace_floats < needed) {
    return kiln_cuda::Fail(KILN_CUDA_INVALID_ARGUMENT, "%s: workspace of %zu floats, %zu needed",
                           who, workspace_floats, needed);
  }
  if (batch->n_tokens == 0) return KILN_CUDA_OK;
  const int64_t rows = batch->n_tokens * n_heads;
  if (rows > 0x7fffffff) {
    return kiln_cuda::Fail(KILN_CUDA_INVALID_ARGUMENT, "%s: n_tokens x n_heads %lld too large", who,
                           static_cast<long long>(rows));
  }
  if (const int rc = kiln_cuda::Enter(stream, who); rc != KILN_CUDA_OK) return rc;
  const cudaStream_t s = stream->stream;

  SplitArgs a;
  a.kv = *kv;
  a.rows = VisibleRows{batch->d_seq, batch->d_n_visible, batch->d_first_visible,
                       batch->d_extra_indptr, batch->d_extra_positions};
  a.tables = BlockTables{batch->d_kv_indptr, batch->d_kv_indices, kv->block_size, kv->n_blocks};
  a.q = d_q;
  a.n_heads = n_heads;
  a.n_splits = n_splits;
  a.scale = scale > 0.0f ? scale : 1.0f / sqrtf(static_cast<float>(hd));
  a.workspace = d_workspace;
  a.error = batch->d_error;
  const size_t smem = static_cast<size_t>(hd + kWarps * (hd + 2)) * sizeof(float);
  AttentionSplitKernel<<<dim3(static_cast<unsigned>(rows), static_cast<unsigned>(n_splits)),
                         32 * kWarps, smem, s>>>(a);
  KILN_CUDA_CHECK(cudaGetLastError());
  AttentionCombineKernel<<<static_cast<unsigned>(rows), 128, 0, s>>>(d_workspace, n_splits, hd,
                                                                     d_out, batch->d_error);
  return kiln_cuda::Check(cudaGetLastError(), who);
}

}  // namespace
}  // namespace kiln::cuda

KILN_CUDA_EXPORT int kiln_cuda_paged_attention(const KilnCudaPagedKv* kv,
                                               const KilnCudaAttentionBatch* batch,
                                               const float* d_q, int32_t n_heads, float scale,
                                               int32_t n_splits, float* d_workspace,
                                               size_t workspace_floats, float* d_out,
                                               kiln_cuda_stream stream) {
  return kiln::cuda::EnqueuePagedAttention(kv, batch, d_q, n_heads, scale, n_splits, d_workspace,
                                           workspace_floats, d_out, stream,
                                           "kiln_cuda_paged_attention");
}

// ---- MLA, absorbed ---------------------------------------------------------------------------
// The latent rows [c | rope(k_r)] act as one KV head whose key is the whole row and whose value is
// its first kv_lora_rank elements: q_abs = [W_UK_h^T q_nope | q_rope] goes through the paged
// kernels above, and out = W_UV_h (the first kv_lora_rank outputs).

namespace kiln::cuda {
namespace {

// grid: n_tokens * n_heads; block: 128. q_abs[t, h, j] over the row's `row` elements.
__global__ void MlaAbsorbKernel(const float* __restrict__ q, const float* __restrict__ w_uk,
                                int32_t n_heads, int32_t kvl, int32_t nope, int32_t row,
                                float* __restrict__ q_abs) {
  const int64_t th = blockIdx.x;
  const int32_t h = static_cast<int32_t>(th % n_heads);
  const int32_t rope = row - kvl;
  const float* q_th = q + th * (nope + rope);
  for (int32_t j = threadIdx.x; j < row; j += blockDim.x) {
    float v;
    if (j < kvl) {
      v = 0.0f;  // sum_n W_UK[h][n][j] q_nope[n]: neighbouring threads read neighbouring j
      for (int32_t n = 0; n < nope; ++n) {
        v += w_uk[(static_cast<int64_t>(h) * nope + n) * kvl + j] * q_th[n];
      }
    } else {
      v = q_th[nope + (j - kvl)];
    }
    q_abs[th * row + j] = v;
  }
}

// grid: n_tokens * n_heads; block: 128 (a warp per output). out[t, h, v] = W_UV[h][v] . o_lat.
__global__ void MlaUnabsorbKernel(const float* __restrict__ o_lat, const float* __restrict__ w_uv,
                                  int32_t n_heads, int32_t kvl, int32_t row, int32_t v_dim,
                                  float* __restrict__ out) {
  const int64_t th = blockIdx.x;
  const int32_t h = static_cast<int32_t>(th % n_heads);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
  for (int32_t v = warp; v < v_dim; v += n_warps) {
    const float* w = w_uv + (static_cast<int64_t>(h) * v_dim + v) * kvl;
    float sum = 0.0f;
    for (int32_t j = lane; j < kvl; j += 32) sum += w[j] * o_lat[th * row + j];
    sum = WarpSum(sum);
    if (lane == 0) out[th * v_dim + v] = sum;
  }
}

size_t MlaWorkspaceFloats(int64_t n_tokens, int32_t n_heads, int32_t n_splits, int32_t row) {
  return 2 * static_cast<size_t>(n_tokens) * static_cast<size_t>(n_heads) *
             static_cast<size_t>(row) +
         AttentionWorkspaceFloats(n_tokens, n_heads, n_splits, row);
}

}  // namespace
}  // namespace kiln::cuda

KILN_CUDA_EXPORT size_t kiln_cuda_mla_attention_workspace(int64_t n_tokens, int32_t n_heads,
                                                          int32_t n_splits, int32_t row_elems) {
  return kiln::cuda::MlaWorkspaceFloats(n_tokens, n_heads, n_splits, row_elems);
}

KILN_CUDA_EXPORT int kiln_cuda_mla_attention(
    const KilnCudaPagedKv* latent, const KilnCudaAttentionBatch* batch, const float* d_q,
    int32_t n_heads, const float* d_w_uk, const float* d_w_uv, int32_t kv_lora_rank,
    int32_t nope_dim, int32_t v_head_dim, float scale, int32_t n_splits, float* d_workspace,
    size_t workspace_floats, float* d_out, kiln_cuda_stream stream) {
  using namespace kiln::cuda;
  static const char* const kWho = "kiln_cuda_mla_attention";
  if (latent == nullptr || batch == nullptr || d_q == nullptr || d_w_uk == nullptr ||
      d_w_uv == nullptr || d_out == nullptr || d_workspace == nullptr) {
    return kiln_cuda::Fail(KILN_CUDA_INVALID_ARGUMENT, "%s: null pointer", kWho);
  }
  const int32_t row = latent->head_dim;
  if (latent->n_kv_heads != 1 || kv_lora_rank < 1 || kv_lora_rank >= row || nope_dim < 1 ||
      v_head_dim < 1 || n_heads < 1 || batch->n_tokens < 0 ||
      batch->n_tokens * n_heads > 0x7fffffff) {
    return kiln_cuda::Fail(KILN_CUDA_INVALID_ARGUMENT,
                           "%s: bad shape (one latent head, not %d; kv_lora_rank %d < row %d; "
                           "nope_dim %d, v_head_dim %d, n_heads %d >= 1)",
                           kWho, latent->n_kv_heads, kv_lora_rank, row, nope_dim, v_head_dim,
                           n_heads);
  }
  const size_t needed = MlaWorkspaceFloats(batch->n_tokens, n_heads, n_splits, row);
  if (n_splits < 1 || n_splits > kMaxSplits || workspace_floats < needed) {
    return kiln_cuda::Fail(KILN_CUDA_INVALID_ARGUMENT,
                           "%s: n_splits %d (1..%d), workspace of %zu floats, %zu needed", kWho,
                           n_splits, kMaxSplits, workspace_floats, needed);
  }
  if (const int rc = kiln_cuda::Enter(stream, kWho); rc != KILN_CUDA_OK) return rc;
  if (batch->n_tokens == 0) return KILN_CUDA_OK;
  const size_t per_call = static_cast<size_t>(batch->n_tokens) * n_heads * row;
  float* q_abs = d_workspace;
  float* o_lat = d_workspace + per_call;
  float* attention_ws = d_workspace + 2 * per_call;
  const unsigned blocks = static_cast<unsigned>(batch->n_tokens * n_heads);
  MlaAbsorbKernel<<<blocks, 128, 0, stream->stream>>>(d_q, d_w_uk, n_heads, kv_lora_rank, nope_dim,
                                                      row, q_abs);
  KILN_CUDA_CHECK(cudaGetLastError());
  // The score scale of the decompressed heads: 1 / sqrt(nope_dim + rope_dim).
  const float s =
      scale > 0.0f ? scale : 1.0f / sqrtf(static_cast<float>(nope_dim + row - kv_lora_rank));
  if (const int rc = EnqueuePagedAttention(latent, batch, q_abs, n_heads, s, n_splits, attention_ws,
                                           workspace_floats - 2 * per_call, o_lat, stream, kWho);
      rc != KILN_CUDA_OK) {
    return rc;
  }
  MlaUnabsorbKernel<<<blocks, 128, 0, stream->stream>>>(o_lat, d_w_uv, n_heads, kv_lora_rank, row,
                                                        v_head_dim, d_out);
  return kiln_cuda::Check(cudaGetLastError(), kWho);
}
