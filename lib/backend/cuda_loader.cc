#include "lib/backend/cuda_loader.h"

#include <cstdlib>
#include <filesystem>
#include <type_traits>
#include <vector>

#include "lib/common/platform.h"

namespace kiln {
namespace {

struct LoadResult {
  CudaModule module;
  bool ok = false;
  std::string why_not;
};

std::vector<std::string> CandidatePaths() {
  std::vector<std::string> paths;
  if (const char* env = std::getenv("KILN_CUDA_MODULE"); env && *env) paths.push_back(env);
  // Beside the library (or program) that holds this code.
  if (const std::string dir = platform::ThisModuleDirectory(); !dir.empty()) {
    paths.push_back(
        (std::filesystem::path(dir) / platform::SharedLibraryFileName("kiln_cuda")).string());
  }
#ifdef KILN_CUDA_BUILD_MODULE
  paths.push_back(KILN_CUDA_BUILD_MODULE);
#endif
  return paths;
}

absl::StatusOr<CudaModule> BindEntryPoints(const platform::SharedLibrary& library) {
  auto abi = reinterpret_cast<kiln_cuda_module_abi_fn>(library.Symbol("kiln_cuda_module_abi"));
  if (abi == nullptr || abi() != KILN_CUDA_MODULE_ABI) {
    return absl::FailedPreconditionError(
        StrCat("libkiln_cuda.so has an incompatible interface (ABI ", abi == nullptr ? -1 : abi(),
               ", kiln needs ", KILN_CUDA_MODULE_ABI, ")"));
  }
  // Every entry point is bound by its cuda_abi.h name; a missing one rejects the module.
  CudaModule m;
  std::string missing;
  auto bind = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(library.Symbol(name));
    if (fn == nullptr) missing += StrCat(missing.empty() ? "" : ", ", name);
  };
  bind(m.last_error, "kiln_cuda_last_error");
  bind(m.device_count, "kiln_cuda_device_count");
  bind(m.device_info, "kiln_cuda_device_info");
  bind(m.mem_info, "kiln_cuda_mem_info");
  bind(m.stream_create, "kiln_cuda_stream_create");
  bind(m.stream_destroy, "kiln_cuda_stream_destroy");
  bind(m.stream_synchronize, "kiln_cuda_stream_synchronize");
  bind(m.device_alloc, "kiln_cuda_device_alloc");
  bind(m.device_free, "kiln_cuda_device_free");
  bind(m.host_alloc, "kiln_cuda_host_alloc");
  bind(m.host_free, "kiln_cuda_host_free");
  bind(m.copy_h2d_async, "kiln_cuda_copy_h2d_async");
  bind(m.copy_d2h_async, "kiln_cuda_copy_d2h_async");
  bind(m.copy_d2d_async, "kiln_cuda_copy_d2d_async");
  bind(m.memset_async, "kiln_cuda_memset_async");
  bind(m.rms_norm, "kiln_cuda_rms_norm");
  bind(m.add, "kiln_cuda_add");
  bind(m.add_row_bias, "kiln_cuda_add_row_bias");
  bind(m.swiglu, "kiln_cuda_swiglu");
  bind(m.geglu, "kiln_cuda_geglu");
  bind(m.scale, "kiln_cuda_scale");
  bind(m.rope_rotate, "kiln_cuda_rope_rotate");
  bind(m.embedding_gather, "kiln_cuda_embedding_gather");
  bind(m.embedding_row_bytes, "kiln_cuda_embedding_row_bytes");
  bind(m.dequantize, "kiln_cuda_dequantize");
  bind(m.matmul_caps, "kiln_cuda_matmul_caps");
  bind(m.gemv, "kiln_cuda_gemv");
  bind(m.dequantize_f16, "kiln_cuda_dequantize_f16");
  bind(m.gemm_context_create, "kiln_cuda_gemm_context_create");
  bind(m.gemm_context_destroy, "kiln_cuda_gemm_context_destroy");
  bind(m.gemm_f16, "kiln_cuda_gemm_f16");
  bind(m.paged_attention_workspace, "kiln_cuda_paged_attention_workspace");
  bind(m.paged_attention, "kiln_cuda_paged_attention");
  bind(m.mla_attention_workspace, "kiln_cuda_mla_attention_workspace");
  bind(m.mla_attention, "kiln_cuda_mla_attention");
  bind(m.sample, "kiln_cuda_sample");
  if (!missing.empty()) {
    return absl::FailedPreconditionError(StrCat("libkiln_cuda.so lacks entry points: ", missing));
  }
  return m;
}

LoadResult Load() {
  LoadResult r;
  std::string errors;
  for (const std::string& path : CandidatePaths()) {
    if (!std::filesystem::exists(path)) continue;
    absl::StatusOr<CudaModule> opened = OpenCudaModule(path);
    if (opened.ok()) {
      r.module = *opened;
      errors.clear();
      break;
    }
    errors += StrCat(path, ": ", opened.status().message(), "; ");
  }
  if (r.module.device_count == nullptr) {
    r.why_not = errors.empty() ? "libkiln_cuda.so not built or not found" : errors;
    return r;
  }
  char err[256] = {0};
  const int n = r.module.device_count(err, sizeof err);
  if (n <= 0) {
    r.why_not = n < 0 ? std::string(err)
                      : StrCat("no CUDA device", err[0] ? " (" : "", err, err[0] ? ")" : "");
    return r;
  }
  r.module.n_devices = n;
  r.ok = true;
  return r;
}

}  // namespace

absl::StatusOr<CudaModule> OpenCudaModule(const std::string& path) {
  absl::StatusOr<platform::SharedLibrary> library = platform::SharedLibrary::Load(path);
  if (!library.ok()) return library.status();
  return BindEntryPoints(*library);
}

absl::StatusCode CudaStatusCode(int rc) {
  switch (rc) {
    case KILN_CUDA_OK:
      return absl::StatusCode::kOk;
    case KILN_CUDA_INVALID_ARGUMENT:
      return absl::StatusCode::kInvalidArgument;
    case KILN_CUDA_OUT_OF_MEMORY:
      return absl::StatusCode::kResourceExhausted;
    case KILN_CUDA_UNSUPPORTED:
      return absl::StatusCode::kUnimplemented;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::Status CudaModule::ToStatus(int rc, std::string_view what) const {
  if (rc == KILN_CUDA_OK) return absl::OkStatus();
  char message[512] = {0};
  if (last_error != nullptr) last_error(message, sizeof message);
  return absl::Status(CudaStatusCode(rc), StrCat(what, ": ", message[0] ? message : "CUDA error",
                                                 " (status ", rc, ")"));
}

const CudaModule* GetCudaModule(std::string* why_not) {
  static const LoadResult result = Load();
  if (!result.ok) {
    if (why_not) *why_not = result.why_not;
    return nullptr;
  }
  return &result.module;
}

}  // namespace kiln
