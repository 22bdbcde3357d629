// The C interface between libkiln.so (lib/backend/cuda_loader.cc) and the libkiln_cuda.so module.
// Plain C types only: the two sides are built by different compilers. The loader binds every
// function below by its name (the typedef's name without `_fn`); a module missing one, or with
// another KILN_CUDA_MODULE_ABI, is rejected and kiln runs on the CPU.
#pragma once

#include <stddef.h>
#include <stdint.h>

// 2: memory and streams (device buffers, pinned host buffers, async copies, memset, streams,
//    memory info) and the per-thread error message.
// 3: elementwise ops (RMSNorm, Add, AddRowBias, SwiGLU, GeGLU, Scale, RoPE, embedding gather).
// 4: kiln_cuda_matmul_caps (which weight types the GEMV and GEMM paths read, and GEMV's token
//    limit), so the backend routes a matmul without its own copy of the kernels' type list.
#define KILN_CUDA_MODULE_ABI 4

extern "C" {

// ---- status codes ------------------------------------------------------------------------------
// Every entry of the "memory and streams" section (and every later one) returns one of these; on
// anything but KILN_CUDA_OK it also records a message naming the call and the cause, which
// kiln_cuda_last_error returns. No entry aborts the process.
enum {
  KILN_CUDA_OK = 0,
  KILN_CUDA_INVALID_ARGUMENT = -1,  // a null pointer, a negative size, an unknown type, ...
  KILN_CUDA_OUT_OF_MEMORY = -2,     // device or pinned host memory exhausted
  KILN_CUDA_DEVICE_ERROR = -3,      // any other CUDA runtime error (the message has its name)
  KILN_CUDA_UNSUPPORTED = -4,       // valid request this module has no kernel for
};

// The message of the calling thread's last failed call into the module, copied NUL-terminated
// into msg (truncated to msg_cap - 1 bytes); "" when no call has failed on this thread. The
// message is per thread (two engines on two threads do not overwrite each other's) and stays
// until the thread's next failure. Returns the full message length.
typedef size_t (*kiln_cuda_last_error_fn)(char* msg, size_t msg_cap);

// ---- devices -----------------------------------------------------------------------------------
// Returns KILN_CUDA_MODULE_ABI; the loader rejects a module with another value.
typedef int (*kiln_cuda_module_abi_fn)(void);
// Number of usable devices (0 when the driver reports none); writes a message on error (<0).
typedef int (*kiln_cuda_device_count_fn)(char* err, size_t err_cap);
// Name and memory of device `index`. Returns 0 on success.
typedef int (*kiln_cuda_device_info_fn)(int index, char* name, size_t name_cap, size_t* total_mem);
// Free and total memory of device `device` now (cudaMemGetInfo), in bytes.
typedef int (*kiln_cuda_mem_info_fn)(int device, size_t* free_bytes, size_t* total_bytes);

// ---- memory and streams ------------------------------------------------------------------------
// Device pointers are plain `void*` addresses in the device's memory: never dereferenced on the
// host. A stream belongs to the device it was created on; every call taking a stream makes that
// device current on the calling thread first, so a backend may be driven from any thread.
typedef struct kiln_cuda_stream_s* kiln_cuda_stream;

// *out = a new non-blocking stream on `device`.
typedef int (*kiln_cuda_stream_create_fn)(int device, kiln_cuda_stream* out);
// Waits for the stream's work, then destroys it. Null: no-op.
typedef int (*kiln_cuda_stream_destroy_fn)(kiln_cuda_stream stream);
// Blocks until all work queued on `stream` has finished; reports the first error of that work
// (a failed kernel or copy) as KILN_CUDA_DEVICE_ERROR.
typedef int (*kiln_cuda_stream_synchronize_fn)(kiln_cuda_stream stream);

// *out = `bytes` of device memory on `device` (at least 256-byte aligned). bytes == 0 gives
// *out = nullptr and KILN_CUDA_OK.
typedef int (*kiln_cuda_device_alloc_fn)(int device, size_t bytes, void** out);
// Frees device memory from kiln_cuda_device_alloc (synchronizes with the device). Null: no-op.
typedef int (*kiln_cuda_device_free_fn)(void* ptr);
// *out = `bytes` of page-locked host memory (what makes the async copies truly asynchronous).
typedef int (*kiln_cuda_host_alloc_fn)(size_t bytes, void** out);
typedef int (*kiln_cuda_host_free_fn)(void* ptr);

// Queue a copy of `bytes` on `stream`: host -> device, device -> host, device -> device. The
// host buffer must stay valid (and, for h2d, unchanged) until the stream is synchronized; with
// pageable (not kiln_cuda_host_alloc) memory the runtime may finish the copy before returning.
typedef int (*kiln_cuda_copy_h2d_async_fn)(void* dst_device, const void* src_host, size_t bytes,
                                           kiln_cuda_stream stream);
typedef int (*kiln_cuda_copy_d2h_async_fn)(void* dst_host, const void* src_device, size_t bytes,
                                           kiln_cuda_stream stream);
typedef int (*kiln_cuda_copy_d2d_async_fn)(void* dst_device, const void* src_device, size_t bytes,
                                           kiln_cuda_stream stream);
// Queue setting `bytes` of device memory to the byte `value` on `stream`.
typedef int (*kiln_cuda_memset_async_fn)(void* dst_device, int value, size_t bytes,
                                         kiln_cuda_stream stream);

// ---- elementwise ops ---------------------------------------------------------------------------
// The Backend's element-wise and row ops on device memory (every pointer a device address), queued
// on `stream`. Shapes and formulas as lib/backend/backend.h states them; n == 0 queues nothing.
// The arguments are checked on the host (INVALID_ARGUMENT); a kernel's own failure shows at the
// stream's next synchronize.
//   y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight      x, y: [n_rows, n]; may alias
typedef int (*kiln_cuda_rms_norm_fn)(const float* x, const float* weight, int64_t n_rows, int64_t n,
                                     float eps, float* y, kiln_cuda_stream stream);
//   y = a + b                                                      may alias
typedef int (*kiln_cuda_add_fn)(const float* a, const float* b, int64_t n, float* y,
                                kiln_cuda_stream stream);
//   x[r, :] += bias                                                x: [n_rows, n]
typedef int (*kiln_cuda_add_row_bias_fn)(float* x, const float* bias, int64_t n_rows, int64_t n,
                                         kiln_cuda_stream stream);
//   y = silu(gate) * up                                            may alias
typedef int (*kiln_cuda_swiglu_fn)(const float* gate, const float* up, int64_t n, float* y,
                                   kiln_cuda_stream stream);
//   y = gelu(gate) * up with ggml's f16 GELU table (gelu_f16_table: [65536] f16 bits by the f16
//   bits of the input; the CPU backend's table, uploaded by the caller)
typedef int (*kiln_cuda_geglu_fn)(const float* gate, const float* up, int64_t n,
                                  const uint16_t* gelu_f16_table, float* y,
                                  kiln_cuda_stream stream);
//   x *= s
typedef int (*kiln_cuda_scale_fn)(float* x, int64_t n, float s, kiln_cuda_stream stream);
//   Rotates x: [n_tokens, n_heads, head_dim] in place by the angles of cos_table, sin_table:
//   [n_tokens, n_rot / 2] (the CPU's RopeTable, uploaded). neox: pairs (i, i + n_rot / 2), else
//   (2i, 2i + 1).
typedef int (*kiln_cuda_rope_rotate_fn)(float* x, int64_t n_tokens, int64_t n_heads,
                                        int32_t head_dim, int32_t n_rot, int32_t neox,
                                        const float* cos_table, const float* sin_table,
                                        kiln_cuda_stream stream);
//   out[t, :] = row tokens[t] of table (n_in elements of ggml type `type` per row: F32, F16, BF16,
//   Q4_0, Q4_1, Q8_0; others UNSUPPORTED), dequantized.   out: [n_tokens, n_in]. The caller checks
//   the token ids (the kernel cannot report one).
typedef int (*kiln_cuda_embedding_gather_fn)(uint32_t type, const void* table, int64_t n_in,
                                             const int32_t* tokens, int64_t n_tokens, float* out,
                                             kiln_cuda_stream stream);
//   Bytes of one table row of `type` (UNSUPPORTED for a type the gather cannot read).
typedef int (*kiln_cuda_embedding_row_bytes_fn)(uint32_t type, int64_t n_in, int64_t* out);

// ---- kernels -----------------------------------------------------------------------------------
// Dequantizes `n_rows` rows of `n_cols` elements of ggml type `type` from host memory into host
// floats using the device (a round trip used by the op tests). Returns 0 on success.
typedef int (*kiln_cuda_dequantize_fn)(uint32_t type, const void* src, size_t src_bytes,
                                       int64_t n_rows, int64_t n_cols, float* dst);

// --- Compute kernels (kernels/cuda/gemv.cu, gemm.cu, paged_attention.cu) ------------------------
// Every pointer named d_* is DEVICE memory on the stream's device. The calls only enqueue work
// on `stream`: KILN_CUDA_OK when it was launched; INVALID_ARGUMENT (nothing launched) for a bad
// shape or pointer, UNSUPPORTED for a type without a kernel, DEVICE_ERROR for a failed launch,
// each with its message. Types are ggml type ids (lib/common/ggml_type.h).

// y[t, o] = sum_i W[o, i] * x[t, i] for small n_tokens (decode), W quantized as `type` (F16,
// Q4_1, Q5_0, Q8_0, Q4_K, Q6_K), rows of n_in elements stored back to back (ggml blocks).
//   d_w: [n_out, n_in] (n_in a multiple of the type's block)  d_x: [n_tokens, n_in] f32
//   d_y: [n_tokens, n_out] f32; f32 activations, f32 accumulation. n_tokens in [1, 8].
typedef int (*kiln_cuda_gemv_fn)(uint32_t type, const void* d_w, int64_t n_out, int64_t n_in,
                                 const float* d_x, int64_t n_tokens, float* d_y,
                                 kiln_cuda_stream stream);

// What the module can multiply a weight of ggml `type` with: *gemv_max_tokens = the most tokens one
// kiln_cuda_gemv call takes (0: no GEMV kernel for the type), *gemm = 1 when
// kiln_cuda_dequantize_f16 reads the type (the cuBLASLt path), else 0. An unknown type is not an
// error (both 0); a null output pointer is INVALID_ARGUMENT. Needs no device.
typedef int (*kiln_cuda_matmul_caps_fn)(uint32_t type, int32_t* gemv_max_tokens, int32_t* gemm);

// Dequantizes W (`type` as for gemv) into f16: d_out [n_rows, n_cols].
typedef int (*kiln_cuda_dequantize_f16_fn)(uint32_t type, const void* d_w, int64_t n_rows,
                                           int64_t n_cols, void* d_out_f16,
                                           kiln_cuda_stream stream);

// cuBLASLt GEMM for prefill and wide verification: y = x . W^T with W in f16, f32 accumulation.
// The context owns the cuBLASLt handle, a workspace and the f16 copy of x (grown as needed);
// one context per stream of `device`, not shared between threads.
typedef struct KilnCudaGemmContext KilnCudaGemmContext;
typedef int (*kiln_cuda_gemm_context_create_fn)(int device, size_t workspace_bytes,
                                                KilnCudaGemmContext** out);
typedef void (*kiln_cuda_gemm_context_destroy_fn)(KilnCudaGemmContext* ctx);
//   d_w_f16: [n_out, n_in] f16 (kiln_cuda_dequantize_f16 of the weight, cached by the caller)
//   d_x: [n_tokens, n_in] f32   d_y: [n_tokens, n_out] f32. n_in, n_out multiples of 8.
typedef int (*kiln_cuda_gemm_f16_fn)(KilnCudaGemmContext* ctx, const void* d_w_f16, int64_t n_out,
                                     int64_t n_in, const float* d_x, int64_t n_tokens, float* d_y,
                                     kiln_cuda_stream stream);

// Paged K/V of one layer (kv_layout.h): row (block, slot) of kv head h starts at
//   k_base + block * block_stride_bytes + h * head_stride_bytes + slot * row_bytes
// (likewise v_base); elements of elem_type F32, F16, BF16 or Q8_0 (a multiple of 32 of them),
// except that with tail_start > 0 the elements [tail_start, head_dim) are f16 starting at byte
// tail_offset_bytes of the row (the RoPE key of an MLA row in a q8_0 cache; kv_layout.h).
typedef struct KilnCudaPagedKv {
  const void* d_k_base;
  const void* d_v_base;
  int64_t block_stride_bytes;
  int64_t head_stride_bytes;
  int64_t row_bytes;
  int32_t n_blocks;
  int32_t block_size;
  int32_t n_kv_heads;
  int32_t head_dim;  // <= 640
  uint32_t elem_type;
  int32_t tail_start;  // 0: the whole row is elem_type
  int64_t tail_offset_bytes;
} KilnCudaPagedKv;

// The batch's mask in kiln's flat form (attention_mask.h), all arrays in device memory.
typedef struct KilnCudaAttentionBatch {
  int64_t n_tokens;
  const int32_t* d_seq;              // [n_tokens]
  const int32_t* d_kv_indptr;        // [n_seqs + 1]
  const int32_t* d_kv_indices;       // [kv_indptr[n_seqs]]
  const int32_t* d_n_visible;        // [n_tokens]
  const int32_t* d_first_visible;    // [n_tokens] or null (0)
  const int32_t* d_extra_indptr;     // [n_tokens + 1] or null (no tree extras)
  const int32_t* d_extra_positions;  // [extra_indptr[n_tokens]]
  // Set to 1 (never cleared) when a token names a position outside its table or a block outside
  // the pool (that row is skipped) or sees nothing (its output is 0). May be null.
  int32_t* d_error;
} KilnCudaAttentionBatch;

// Floats of workspace kiln_cuda_paged_attention needs.
typedef size_t (*kiln_cuda_paged_attention_workspace_fn)(int64_t n_tokens, int32_t n_heads,
                                                         int32_t n_splits, int32_t head_dim);
// out[t, h, :] = softmax_j(q[t, h, :] . K[j, h / G, :] * scale) . V[j, h / G, :] over token t's
// visible rows j, G = n_heads / n_kv_heads, scale <= 0: 1 / sqrt(head_dim). Decode, causal
// prefill and tree-masked verification are the same call with different masks. Each token's rows
// are cut into n_splits (1..64) ranges computed in parallel and combined (split-K).
//   d_q, d_out: [n_tokens, n_heads, head_dim] f32   d_workspace: the floats above
typedef int (*kiln_cuda_paged_attention_fn)(const KilnCudaPagedKv* kv,
                                            const KilnCudaAttentionBatch* batch, const float* d_q,
                                            int32_t n_heads, float scale, int32_t n_splits,
                                            float* d_workspace, size_t workspace_floats,
                                            float* d_out, kiln_cuda_stream stream);

// MLA absorbed attention (Backend::MlaAttention) over one layer's latent rows [c | rope(k_r)]:
// `latent` describes them as one KV head (n_kv_heads 1, head_dim = kv_lora_rank + rope_dim,
// d_k_base = d_v_base = the layer's latent tile; a q8_0 cache sets tail_start = kv_lora_rank and
// tail_offset_bytes to the RoPE part's offset). Per head: q_abs = [W_UK_h^T q_nope | q_rope],
// p = softmax(q_abs . row_j * scale), out = W_UV_h (sum_j p_j c_j).
//   d_q: [n_tokens, n_heads, nope_dim + rope_dim]   d_out: [n_tokens, n_heads, v_head_dim]
//   d_w_uk: [n_heads][nope_dim][kv_lora_rank] f32   d_w_uv: [n_heads][v_head_dim][kv_lora_rank]
//   scale <= 0: 1 / sqrt(nope_dim + rope_dim); d_workspace: the floats below.
typedef size_t (*kiln_cuda_mla_attention_workspace_fn)(int64_t n_tokens, int32_t n_heads,
                                                       int32_t n_splits, int32_t row_elems);
typedef int (*kiln_cuda_mla_attention_fn)(const KilnCudaPagedKv* latent,
                                          const KilnCudaAttentionBatch* batch, const float* d_q,
                                          int32_t n_heads, const float* d_w_uk, const float* d_w_uv,
                                          int32_t kv_lora_rank, int32_t nope_dim,
                                          int32_t v_head_dim, float scale, int32_t n_splits,
                                          float* d_workspace, size_t workspace_floats, float* d_out,
                                          kiln_cuda_stream stream);

// Sampling on the device (kernels/cuda/sample.cu): kiln's chain (lib/sample/sampler.h) without
// bias, penalties and typical-p, which the caller applies first or leaves to the CPU.
typedef struct KilnCudaSamplingParams {
  int32_t top_k;      // 1..1024 and < vocab (the device sampler always truncates to top-k)
  float top_p;        // >= 1: off
  float min_p;        // <= 0: off
  float temperature;  // <= 0: greedy (arg max, ties to the lower id; top_k unused)
} KilnCudaSamplingParams;
// d_tokens[r] = the token drawn from row r of d_logits [n_rows, vocab] with d_params[r] and the
// uniform d_uniforms[r] in [0, 1) (the session's generator, drawn on the host: the same token as
// Sampler::SampleWithUniform on the CPU's distribution). params: the same [n_rows] on the host,
// checked before launching. -1 for a row without a finite logit.
typedef int (*kiln_cuda_sample_fn)(const float* d_logits, int64_t n_rows, int64_t vocab,
                                   const KilnCudaSamplingParams* d_params,
                                   const KilnCudaSamplingParams* params, const double* d_uniforms,
                                   int32_t* d_tokens, kiln_cuda_stream stream);
}
