// Finds and opens the optional CUDA backend module (libkiln_cuda.so) at run time. Without the
// module, a CUDA driver or a device, kiln runs on the CPU; the reason is kept for `kiln info`.
#pragma once

#include <string>
#include <string_view>

#include "kernels/cuda/cuda_abi.h"
#include "lib/common/status.h"

namespace kiln {

// The module's entry points (kernels/cuda/cuda_abi.h has what each does), all bound (never null)
// in a module GetCudaModule returns.
struct CudaModule {
  kiln_cuda_last_error_fn last_error = nullptr;
  // devices
  kiln_cuda_device_count_fn device_count = nullptr;
  kiln_cuda_device_info_fn device_info = nullptr;
  kiln_cuda_mem_info_fn mem_info = nullptr;
  // memory and streams
  kiln_cuda_stream_create_fn stream_create = nullptr;
  kiln_cuda_stream_destroy_fn stream_destroy = nullptr;
  kiln_cuda_stream_synchronize_fn stream_synchronize = nullptr;
  kiln_cuda_device_alloc_fn device_alloc = nullptr;
  kiln_cuda_device_free_fn device_free = nullptr;
  kiln_cuda_host_alloc_fn host_alloc = nullptr;
  kiln_cuda_host_free_fn host_free = nullptr;
  kiln_cuda_copy_h2d_async_fn copy_h2d_async = nullptr;
  kiln_cuda_copy_d2h_async_fn copy_d2h_async = nullptr;
  kiln_cuda_copy_d2d_async_fn copy_d2d_async = nullptr;
  kiln_cuda_memset_async_fn memset_async = nullptr;
  // elementwise ops
  kiln_cuda_rms_norm_fn rms_norm = nullptr;
  kiln_cuda_add_fn add = nullptr;
  kiln_cuda_add_row_bias_fn add_row_bias = nullptr;
  kiln_cuda_swiglu_fn swiglu = nullptr;
  kiln_cuda_geglu_fn geglu = nullptr;
  kiln_cuda_scale_fn scale = nullptr;
  kiln_cuda_rope_rotate_fn rope_rotate = nullptr;
  kiln_cuda_embedding_gather_fn embedding_gather = nullptr;
  kiln_cuda_embedding_row_bytes_fn embedding_row_bytes = nullptr;
  // kernels
  kiln_cuda_dequantize_fn dequantize = nullptr;
  // compute kernels
  kiln_cuda_matmul_caps_fn matmul_caps = nullptr;
  kiln_cuda_gemv_fn gemv = nullptr;
  kiln_cuda_dequantize_f16_fn dequantize_f16 = nullptr;
  kiln_cuda_gemm_context_create_fn gemm_context_create = nullptr;
  kiln_cuda_gemm_context_destroy_fn gemm_context_destroy = nullptr;
  kiln_cuda_gemm_f16_fn gemm_f16 = nullptr;
  kiln_cuda_paged_attention_workspace_fn paged_attention_workspace = nullptr;
  kiln_cuda_paged_attention_fn paged_attention = nullptr;
  kiln_cuda_mla_attention_workspace_fn mla_attention_workspace = nullptr;
  kiln_cuda_mla_attention_fn mla_attention = nullptr;
  kiln_cuda_sample_fn sample = nullptr;

  int n_devices = 0;

  // OkStatus for KILN_CUDA_OK, else the status of that code (OUT_OF_MEMORY: ResourceExhausted,
  // INVALID_ARGUMENT: InvalidArgument, UNSUPPORTED: Unimplemented, other: Internal) with the
  // message "<what>: <the module's last error on this thread>".
  absl::Status ToStatus(int rc, std::string_view what) const;
};

// The module when at least one device is usable, else nullptr with `*why_not` set. Searched in
// order: $KILN_CUDA_MODULE, beside the binary holding kiln's code, the build tree. Thread-safe;
// the work happens once per process.
const CudaModule* GetCudaModule(std::string* why_not);

// Opens the module at `path` and binds its entry points, without looking for a device (n_devices
// is left 0): GetCudaModule's first step, and what the tests use to reach the module's error
// paths on a machine without a device.
absl::StatusOr<CudaModule> OpenCudaModule(const std::string& path);

// The status a KILN_CUDA_* code maps to (CudaModule::ToStatus without the module's message).
absl::StatusCode CudaStatusCode(int rc);

}  // namespace kiln
