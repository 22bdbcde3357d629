#include "lib/backend/cuda_loader.h"

#include <cstdlib>
#include <filesystem>
#include <optional>
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

LoadResult Load() {
  LoadResult r;
  std::optional<platform::SharedLibrary> library;
  std::string errors;
  for (const std::string& path : CandidatePaths()) {
    if (!std::filesystem::exists(path)) continue;
    absl::StatusOr<platform::SharedLibrary> loaded = platform::SharedLibrary::Load(path);
    if (loaded.ok()) {
      library = *loaded;
      break;
    }
    errors += std::string(loaded.status().message()) + "; ";
  }
  if (!library) {
    r.why_not = errors.empty() ? "libkiln_cuda.so not built or not found" : errors;
    return r;
  }
  auto abi = reinterpret_cast<kiln_cuda_module_abi_fn>(library->Symbol("kiln_cuda_module_abi"));
  r.module.device_count =
      reinterpret_cast<kiln_cuda_device_count_fn>(library->Symbol("kiln_cuda_device_count"));
  r.module.device_info =
      reinterpret_cast<kiln_cuda_device_info_fn>(library->Symbol("kiln_cuda_device_info"));
  r.module.dequantize =
      reinterpret_cast<kiln_cuda_dequantize_fn>(library->Symbol("kiln_cuda_dequantize"));
  if (!abi || abi() != KILN_CUDA_MODULE_ABI || !r.module.device_count || !r.module.device_info ||
      !r.module.dequantize) {
    r.why_not = "libkiln_cuda.so has an incompatible interface";
    return r;
  }
  char err[256] = {0};
  const int n = r.module.device_count(err, sizeof err);
  if (n <= 0) {
    r.why_not = n < 0 ? std::string(err) : "no CUDA device";
    return r;
  }
  r.module.n_devices = n;
  r.ok = true;
  return r;
}

}  // namespace

const CudaModule* GetCudaModule(std::string* why_not) {
  static const LoadResult result = Load();
  if (!result.ok) {
    if (why_not) *why_not = result.why_not;
    return nullptr;
  }
  return &result.module;
}

}  // namespace kiln
