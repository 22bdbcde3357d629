#include "lib/backend/backend_select.h"

#include "absl/strings/str_join.h"
#include "lib/backend/cuda/cuda_backend.h"

namespace kiln {
namespace {

BackendDecision Fallback(std::string reason) {
  return BackendDecision{false, StrCat("cuda requested, running on the CPU: ", reason)};
}

}  // namespace

BackendDecision DecideBackend(BackendKind kind, const CudaProbe& probe, size_t needed_bytes) {
  if (kind == BackendKind::kCpu) return BackendDecision{};
  if (probe.module == nullptr) {
    return Fallback(probe.why_not.empty() ? "no CUDA module or device" : probe.why_not);
  }
  if (probe.device < 0 || probe.device >= probe.module->n_devices) {
    return Fallback(StrCat("cuda_device ", probe.device, " does not exist (",
                           probe.module->n_devices,
                           probe.module->n_devices == 1 ? " device)" : " devices)"));
  }
  if (!probe.incomplete_ops.empty()) {
    return Fallback(StrCat("the CUDA backend cannot run this model's ",
                           absl::StrJoin(probe.incomplete_ops, "; ")));
  }
  if (probe.device_free_bytes < needed_bytes + kCudaHeadroomBytes) {
    return Fallback(StrCat("device ", probe.device, " has ", probe.device_free_bytes >> 20,
                           " MiB free, the model needs ", (needed_bytes + kCudaHeadroomBytes) >> 20,
                           " MiB (weights, K/V pool and ", kCudaHeadroomBytes >> 20,
                           " MiB of headroom)"));
  }
  return BackendDecision{true, ""};
}

CudaProbe ProbeCuda(int device, const KvLayout& layout) {
  CudaProbe probe;
  probe.device = device;
  probe.module = GetCudaModule(&probe.why_not);
  probe.incomplete_ops = cuda::CudaBackend::IncompleteOps(layout);
  if (probe.module != nullptr && device >= 0 && device < probe.module->n_devices) {
    size_t free_bytes = 0, total_bytes = 0;
    if (probe.module->mem_info(device, &free_bytes, &total_bytes) == KILN_CUDA_OK) {
      probe.device_free_bytes = free_bytes;
    }
  }
  return probe;
}

}  // namespace kiln
