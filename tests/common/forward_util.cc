#include "tests/common/forward_util.h"

namespace kiln {

CpuForward::CpuForward(const Model& model, int n_threads)
    : backend_(n_threads), pass_(model.architecture().NewForward(model, backend_)) {}

absl::StatusOr<KvLayout> CpuForward::CacheLayout(const ModelHparams& hp, GgmlType kv_type,
                                                 int32_t block_size) {
  const Architecture* arch = FindArchitecture(hp.arch);
  if (arch == nullptr) return absl::NotFoundError(StrCat("no architecture ", hp.arch));
  return arch->CacheLayout(hp, kv_type, block_size);
}

absl::Status CpuForward::Forward(const ForwardBatch& batch, KvCache& cache, ForwardOutput* out) {
  if (!pass_.ok()) return pass_.status();
  return (*pass_)->Forward(batch, cache, out);
}

}  // namespace kiln
