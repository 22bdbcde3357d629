// Scalar references of the K-quant types (Q2_K .. Q6_K weights, Q8_K activations) and their
// reference weight quantizers. Internal to lib/quant; the engine reaches these through
// GetQuantKernels() (quant.h). Block layouts, the dot-product contract (which every level's
// kernels follow bit for bit) and the SIMD kernels: kernels/cpu/kquants.h (included here).
#pragma once

#include <cstdint>

#include "kernels/cpu/kquants.h"

namespace kiln::kquants {

// --- Scalar reference kernels (lib/quant/kquants.cc). Contract of quant.h: n % 256 == 0.

// Q8_K quantizer, ggml's rule: max = the first element of largest |x| (signed); iscale =
// -127/max; qs = min(127, NearestInt(iscale*x)); d = 1/iscale; bsums = group sums.
// Deviations, only where ggml's output is undefined: a block whose iscale is not finite
// (all-zero block, or |max| < 127/FLT_MAX) is stored as all zeros with d = 0; a NaN element
// quantizes to 0.
void QuantizeRowQ8KScalar(const float* x, void* y, int64_t n);
void DequantizeRowQ8KScalar(const void* x, float* y, int64_t n);

void DequantizeRowQ2KScalar(const void* x, float* y, int64_t n);
void DequantizeRowQ3KScalar(const void* x, float* y, int64_t n);
void DequantizeRowQ4KScalar(const void* x, float* y, int64_t n);
void DequantizeRowQ5KScalar(const void* x, float* y, int64_t n);
void DequantizeRowQ6KScalar(const void* x, float* y, int64_t n);

// Integer formulas per super-block (a = activation qs, bs = a.bsums, g = 16-element group,
// j = 32-element sub-block):
//  Q2_K: isum = sum_g (sc_g&15) * sum_{e in g} q2_e*a_e;  msum = sum_g (sc_g>>4) * bs_g
//  Q3_K: isum = sum_g s_g * (sum_{e in g} u_e*a_e - 4*bs_g), u = q3+4 in 0..7, s_g = scale-32
//  Q4_K: isum = sum_j sc_j * sum_{e in j} q4_e*a_e;  msum = sum_j m_j * (bs_2j + bs_2j+1)
//  Q5_K: as Q4_K with q5
//  Q6_K: isum = sum_g scales_g * (sum_{e in g} q6_e*a_e - 32*bs_g), q6 in 0..63
float VecDotQ2KScalar(int64_t n, const void* w, const void* a);
float VecDotQ3KScalar(int64_t n, const void* w, const void* a);
float VecDotQ4KScalar(int64_t n, const void* w, const void* a);
float VecDotQ5KScalar(int64_t n, const void* w, const void* a);
float VecDotQ6KScalar(int64_t n, const void* w, const void* a);
// Q8_K x Q8_K (registered so the Q8_K entry is complete): isum = sum_e w_e*a_e,
// d = w.d * a.d, dmin = 0.
float VecDotQ8KScalar(int64_t n, const void* w, const void* a);

// --- Reference weight quantizers (lib/quant/kquants_quantize.cc); see the comment there for
// how they differ from ggml's make_qkx/make_qx searches. Deterministic; finite inputs.
void QuantizeRowQ2KRef(const float* x, void* y, int64_t n);
void QuantizeRowQ3KRef(const float* x, void* y, int64_t n);
void QuantizeRowQ4KRef(const float* x, void* y, int64_t n);
void QuantizeRowQ5KRef(const float* x, void* y, int64_t n);
void QuantizeRowQ6KRef(const float* x, void* y, int64_t n);

}  // namespace kiln::kquants
