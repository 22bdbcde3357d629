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
#define KILN_CUDA_MODULE_ABI 3

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
}
