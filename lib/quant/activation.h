// The quantizers MatMul applies to f32 activations before a quantized dot product.
//
// Q8_0 and Q8_1 activations are rounded the way ggml's CPU backend rounds them on x86
// (quantize_row_q8_0 / quantize_row_q8_1 in its AVX2 form), not like ggml's reference
// quantizers, which kiln's weight quantizers (QuantKernels::quantize) reproduce:
//   per block of 32: amax = max |x|;  d = amax / 127;  id = amax != 0 ? 127 / amax : 0
//   q[j] = round-half-to-even(x[j] * id)          (reference: roundf(x * (1 / d)))
//   Q8_1 only: s = f16(d * float(sum_j q[j]))
//   d and s are stored as f16.
// On a small quantized model an activation that rounds the other way moves the logits visibly
// (they are chaotic in the last bit), so matching llama.cpp token for token needs these exact
// rules. Every CPU level gives the same bytes.
//
// Other activation types (Q8_K, F32) use the type's QuantKernels::quantize.
// Thread-safe, pure.
#pragma once

#include "lib/common/ggml_type.h"
#include "lib/quant/quant.h"

namespace kiln {

// The activation quantizer of `act_type` at `level`, or nullptr when the type has none.
QuantizeRowFn ActivationQuantizer(GgmlType act_type, CpuLevel level);

namespace quant {
// Row quantizers: scalar here (lib/quant/activation.cc); AVX2 and AVX-512 in kernels/cpu/legacy.h.
void QuantizeActivationQ8_0Ref(const float* x, void* y, int64_t n);
void QuantizeActivationQ8_1Ref(const float* x, void* y, int64_t n);
// One block of 32: writes q, sets *sum = Σ q, returns d (unrounded).
float QuantizeActivationBlockRef(const float* x, int8_t* q, int32_t* sum);
}  // namespace quant

}  // namespace kiln
