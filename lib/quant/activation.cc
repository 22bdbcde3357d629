#include "lib/quant/activation.h"

#include <cmath>
#include <cstdlib>

#include "lib/quant/legacy_kernels.h"

namespace kiln {
namespace quant {

float QuantizeActivationBlockRef(const float* x, int8_t* q, int32_t* sum) {
  float amax = 0.0f;
  for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
  int32_t s = 0;
  for (int j = 0; j < kQK; ++j) {
    // nearbyint rounds half to even in the default rounding mode, like _mm256_round_ps.
    q[j] = static_cast<int8_t>(std::nearbyint(x[j] * id));
    s += q[j];
  }
  *sum = s;
  return d;
}

namespace {

using BlockFn = float (*)(const float* x, int8_t* q, int32_t* sum);

// The block kernel is a template argument: a direct call per block, not an indirect one.
template <BlockFn block>
void QuantizeRowQ8_0(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<BlockQ8_0*>(vy);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    int32_t sum;
    StoreHalf(y[i].d, block(x, y[i].qs, &sum));
  }
}

template <BlockFn block>
void QuantizeRowQ8_1(const float* x, void* vy, int64_t n) {
  auto* y = static_cast<BlockQ8_1*>(vy);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK) {
    int32_t sum;
    const float d = block(x, y[i].qs, &sum);
    StoreHalf(y[i].d, d);
    StoreHalf(y[i].s, d * static_cast<float>(sum));
  }
}

}  // namespace

void QuantizeActivationQ8_0Ref(const float* x, void* y, int64_t n) {
  QuantizeRowQ8_0<QuantizeActivationBlockRef>(x, y, n);
}
void QuantizeActivationQ8_1Ref(const float* x, void* y, int64_t n) {
  QuantizeRowQ8_1<QuantizeActivationBlockRef>(x, y, n);
}

}  // namespace quant

QuantizeRowFn ActivationQuantizer(GgmlType act_type, CpuLevel level) {
  const CpuLevel usable = std::min(level, BestCpuLevel());
  switch (act_type) {
    case GgmlType::kQ8_0:
      return usable == CpuLevel::kAvx512 ? quant::QuantizeActivationQ8_0Avx512
             : usable == CpuLevel::kAvx2 ? quant::QuantizeActivationQ8_0Avx2
                                         : quant::QuantizeActivationQ8_0Ref;
    case GgmlType::kQ8_1:
      return usable == CpuLevel::kAvx512 ? quant::QuantizeActivationQ8_1Avx512
             : usable == CpuLevel::kAvx2 ? quant::QuantizeActivationQ8_1Avx2
                                         : quant::QuantizeActivationQ8_1Ref;
    default: {
      const QuantKernels* k = GetQuantKernels(act_type, level);
      return k != nullptr ? k->quantize : nullptr;
    }
  }
}

}  // namespace kiln
