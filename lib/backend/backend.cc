#include "lib/backend/backend.h"

#include "lib/backend/cuda_loader.h"
#include "lib/common/cpu_features.h"
#include "lib/quant/quant.h"

namespace kiln {

std::string DescribeBackends() {
  std::string out = StrCat("cpu: ", CpuLevelName(BestCpuLevel()),
                           " kernels (CPU features: ", GetCpuFeatures().ToString(), ")\n");
  std::string why_not;
  const CudaModule* cuda = GetCudaModule(&why_not);
  if (cuda == nullptr) {
    out += StrCat("cuda: none (", why_not, ")\n");
    return out;
  }
  for (int d = 0; d < cuda->n_devices; ++d) {
    char name[256] = {0};
    size_t total = 0;
    if (cuda->device_info(d, name, sizeof name, &total) == 0) {
      out += StrCat("cuda: device ", d, ": ", name, ", ", total >> 20,
                    " MiB (module loaded; the forward pass runs on the CPU backend)\n");
    }
  }
  return out;
}

}  // namespace kiln
