#include "lib/backend/backend.h"

#include "lib/backend/cuda/cuda_backend.h"
#include "lib/backend/cuda_loader.h"
#include "lib/common/cpu_features.h"
#include "lib/quant/quant.h"

namespace kiln {

absl::Status CheckMatMulTargets(std::span<const MatMulTarget> targets) {
  for (const MatMulTarget& t : targets) {
    if (t.w == nullptr) return absl::InvalidArgumentError("MatMulEach: a target's weight is null");
    if (t.w->n_in != targets[0].w->n_in) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "MatMulEach: %s takes %d inputs, %s %d: one input must fit every weight",
          std::string(t.w->name), t.w->n_in, std::string(targets[0].w->name), targets[0].w->n_in));
    }
  }
  return absl::OkStatus();
}

std::string DescribeBackends() {
  std::string out = StrCat("cpu: ", CpuLevelName(BestCpuLevel()),
                           " kernels (CPU features: ", GetCpuFeatures().ToString(), ")\n");
  std::string why_not;
  const CudaModule* cuda = GetCudaModule(&why_not);
  if (cuda == nullptr) {
    out += StrCat("cuda: none (", why_not, ")\n");
    return out;
  }
  // What a cache asking for CUDA gets (backend_select.h), so `kiln info` answers "why the CPU?".
  const std::string use =
      StrCat("caches with backend cuda run here when their K/V rows have at most ",
             cuda::kMaxAttentionRowElems, " elements and the device has room");
  for (int d = 0; d < cuda->n_devices; ++d) {
    char name[256] = {0};
    size_t total = 0, free_bytes = 0;
    if (cuda->device_info(d, name, sizeof name, &total) == 0) {
      if (cuda->mem_info(d, &free_bytes, &total) != KILN_CUDA_OK) free_bytes = 0;
      out += StrCat("cuda: device ", d, ": ", name, ", ", total >> 20, " MiB (", free_bytes >> 20,
                    " MiB free; module loaded; ", use, ")\n");
    }
  }
  return out;
}

}  // namespace kiln
