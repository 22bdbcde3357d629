// Token sampling on the device, so that a decode step sends back token ids, not logits. One
// thread block per row of logits: top-k selection by k block-wide arg-max passes (pass j finds the
// best token ranking after pass j-1's, in the sampler's (logit desc, id asc) order, skipping -inf
// and NaN), then one thread runs the rest of the chain on the <= k candidates
// (sample_chain.h). O(k * vocab / threads) per row: fine for the default top_k = 40.
#include <cuda_runtime.h>
#include <math_constants.h>

#include <cstdint>

#include "kernels/cuda/cuda_abi.h"
#include "kernels/cuda/module_util.h"
#include "kernels/cuda/sample_chain.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxCandidates = 1024;

// The better of two (logit, id) pairs; id -1 is "none" and loses to everything.
__device__ __forceinline__ void KeepBetter(float& logit, int32_t& id, float other_logit,
                                           int32_t other_id) {
  if (other_id >= 0 && (id < 0 || RanksBefore(other_logit, other_id, logit, id))) {
    logit = other_logit;
    id = other_id;
  }
}

// grid: n_rows; block: kThreads.
__global__ void SampleKernel(const float* __restrict__ logits, int64_t vocab,
                             const KilnCudaSamplingParams* __restrict__ params,
                             const double* __restrict__ uniforms, int32_t* __restrict__ out) {
  __shared__ float cand_logit[kMaxCandidates];
  __shared__ int32_t cand_id[kMaxCandidates];
  __shared__ double scratch[kMaxCandidates];
  __shared__ float warp_logit[kThreads / 32];
  __shared__ int32_t warp_id[kThreads / 32];
  __shared__ int32_t n_found;
  const int64_t row = blockIdx.x;
  const float* x = logits + row * vocab;
  const KilnCudaSamplingParams p = params[row];
  const int32_t k = p.temperature <= 0.0f ? 1 : p.top_k;  // the host checked 1 <= top_k <= max
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (threadIdx.x == 0) n_found = 0;
  __syncthreads();
  for (int32_t j = 0; j < k; ++j) {
    const float prev_logit = j > 0 ? cand_logit[j - 1] : CUDART_INF_F;
    const int32_t prev_id = j > 0 ? cand_id[j - 1] : -1;
    float best_logit = -CUDART_INF_F;
    int32_t best_id = -1;
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      const float l = x[i];
      if (!(l > -CUDART_INF_F)) continue;  // -inf (banned) and NaN are never candidates
      const int32_t id = static_cast<int32_t>(i);
      if (j > 0 && !RanksBefore(prev_logit, prev_id, l, id)) continue;  // already taken
      KeepBetter(best_logit, best_id, l, id);
    }
    for (int o = 16; o > 0; o /= 2) {
      const float ol = __shfl_xor_sync(0xffffffffu, best_logit, o);
      const int32_t oi = __shfl_xor_sync(0xffffffffu, best_id, o);
      KeepBetter(best_logit, best_id, ol, oi);
    }
    if (lane == 0) {
      warp_logit[warp] = best_logit;
      warp_id[warp] = best_id;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float l = -CUDART_INF_F;
      int32_t id = -1;
      for (int w = 0; w < kThreads / 32; ++w) KeepBetter(l, id, warp_logit[w], warp_id[w]);
      cand_logit[j] = l;
      cand_id[j] = id;
      if (id >= 0) n_found = j + 1;
    }
    __syncthreads();
    if (n_found <= j) break;  // no finite logit left: the candidates are all found
  }
  if (threadIdx.x == 0) {
    out[row] = SampleSortedCandidates(cand_logit, cand_id, n_found, p.top_p, p.min_p, p.temperature,
                                      uniforms[row], scratch);
  }
}

}  // namespace
}  // namespace kiln::cuda

KILN_CUDA_EXPORT int kiln_cuda_sample(const float* d_logits, int64_t n_rows, int64_t vocab,
                                      const KilnCudaSamplingParams* d_params,
                                      const KilnCudaSamplingParams* params,
                                      const double* d_uniforms, int32_t* d_tokens,
                                      kiln_cuda_stream stream) {
  using namespace kiln::cuda;
  if (d_logits == nullptr || d_params == nullptr || params == nullptr || d_uniforms == nullptr ||
      d_tokens == nullptr || n_rows < 0 || n_rows > 0x7fffffff || vocab < 1 || vocab > 0x7fffffff) {
    return kiln_cuda::Fail(KILN_CUDA_INVALID_ARGUMENT,
                           "kiln_cuda_sample: null pointer or shape out of range (%lld rows, "
                           "vocab %lld)",
                           static_cast<long long>(n_rows), static_cast<long long>(vocab));
  }
  for (int64_t r = 0; r < n_rows; ++r) {
    const KilnCudaSamplingParams& p = params[r];
    if (p.temperature <= 0.0f) continue;  // greedy needs no top-k
    if (p.top_k < 1 || p.top_k > kMaxCandidates || p.top_k >= vocab) {
      return kiln_cuda::Fail(KILN_CUDA_UNSUPPORTED,
                             "kiln_cuda_sample: row %lld: top_k %d (the device sampler needs "
                             "1 <= top_k <= %d and top_k < vocab)",
                             static_cast<long long>(r), p.top_k, kMaxCandidates);
    }
    if (!(p.top_p == p.top_p) || !(p.min_p == p.min_p)) {
      return kiln_cuda::Fail(KILN_CUDA_INVALID_ARGUMENT,
                             "kiln_cuda_sample: row %lld: NaN top_p or min_p",
                             static_cast<long long>(r));
    }
  }
  if (const int rc = kiln_cuda::Enter(stream, "kiln_cuda_sample"); rc != KILN_CUDA_OK) return rc;
  if (n_rows == 0) return KILN_CUDA_OK;
  SampleKernel<<<static_cast<unsigned>(n_rows), kThreads, 0, stream->stream>>>(
      d_logits, vocab, d_params, d_uniforms, d_tokens);
  return kiln_cuda::Check(cudaGetLastError(), "kiln_cuda_sample: launch");
}
