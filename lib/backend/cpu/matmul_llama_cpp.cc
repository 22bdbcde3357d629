#include "lib/backend/cpu/matmul_llama_cpp.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_format.h"
#include "lib/backend/cpu/dispatch.h"
#include "lib/common/half.h"
#include "lib/quant/activation.h"

namespace kiln::cpu {
namespace {

constexpr int64_t kQ8Block = 32;                // elements per Q8_0 block
constexpr size_t kQ8BlockBytes = 2 + kQ8Block;  // f16 d, 32 x int8
constexpr int64_t kRowsPerTask = 16;            // weight rows per parallel task

float LoadF16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return Fp16ToFp32(h);
}

// ggml_vec_dot_q8_0_q8_0 (AVX2 form) of one weight row and one quantized activation row.
float DotQ8_0(int64_t n_in, const uint8_t* w, const uint8_t* a) {
  float acc[8] = {};
  for (int64_t b = 0; b < n_in / kQ8Block; ++b) {
    const uint8_t* wb = w + b * kQ8BlockBytes;
    const uint8_t* ab = a + b * kQ8BlockBytes;
    const float s = LoadF16(wb) * LoadF16(ab);
    const auto* qw = reinterpret_cast<const int8_t*>(wb + 2);
    const auto* qa = reinterpret_cast<const int8_t*>(ab + 2);
    int16_t prod[kQ8Block];  // |qw * qa| <= 128 * 128: the products vectorize as 16-bit lanes
    for (int j = 0; j < kQ8Block; ++j) prod[j] = static_cast<int16_t>(qw[j] * qa[j]);
    for (int l = 0; l < 8; ++l) {
      const int32_t p = int32_t{prod[4 * l]} + prod[4 * l + 1] + prod[4 * l + 2] + prod[4 * l + 3];
      acc[l] = std::fma(s, static_cast<float>(p), acc[l]);
    }
  }
  return ((acc[4] + acc[0]) + (acc[6] + acc[2])) + ((acc[5] + acc[1]) + (acc[7] + acc[3]));
}

}  // namespace

bool HasLlamaCppMatMul(GgmlType type) {
  return type == GgmlType::kF32 || type == GgmlType::kF16 || type == GgmlType::kQ8_0;
}

absl::Status MatMulLlamaCpp(ThreadPool& pool, const WeightView& w, const float* x,
                            const int32_t* rows, int64_t n_rows, float* y, Scratch& scratch) {
  if (!HasLlamaCppMatMul(w.type)) {
    return absl::UnimplementedError(absl::StrFormat("MatMulLlamaCpp: weight type %s",
                                                    GgmlTypeName(static_cast<uint32_t>(w.type))));
  }
  if (w.data == nullptr || x == nullptr || y == nullptr) {
    return absl::InvalidArgumentError("MatMulLlamaCpp: null weight, x or y");
  }
  if (w.n_in <= 0 || w.n_out <= 0 || n_rows < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("MatMulLlamaCpp: shape {%d, %d} with %d rows", w.n_in, w.n_out, n_rows));
  }
  if (w.type == GgmlType::kQ8_0 && w.n_in % kQ8Block != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("MatMulLlamaCpp: n_in %d is not a multiple of 32", w.n_in));
  }
  if (n_rows == 0) return absl::OkStatus();
  const int64_t n_in = w.n_in, n_out = w.n_out;
  auto x_row = [&](int64_t r) { return x + (rows ? rows[r] : r) * n_in; };
  const size_t w_row_bytes = w.row_bytes();
  const auto* wdata = static_cast<const uint8_t*>(w.data);
  const int64_t n_tasks = (n_out + kRowsPerTask - 1) / kRowsPerTask;

  if (w.type == GgmlType::kQ8_0) {
    // Activations: one Q8_0 row per token, quantized as ggml does.
    const size_t act_row_bytes = static_cast<size_t>(n_in / kQ8Block) * kQ8BlockBytes;
    auto* act = static_cast<uint8_t*>(scratch.Get(n_rows * act_row_bytes));
    if (act == nullptr) return absl::ResourceExhaustedError("MatMulLlamaCpp: scratch");
    const QuantizeRowFn quantize = ActivationQuantizer(GgmlType::kQ8_0, BestCpuLevel());
    if (quantize == nullptr) return absl::InternalError("MatMulLlamaCpp: no Q8_0 quantizer");
    for (int64_t r = 0; r < n_rows; ++r) quantize(x_row(r), act + r * act_row_bytes, n_in);
    pool.ParallelFor(n_tasks, [&](int64_t t0, int64_t t1, int) {
      for (int64_t o = t0 * kRowsPerTask; o < std::min(n_out, t1 * kRowsPerTask); ++o) {
        for (int64_t r = 0; r < n_rows; ++r) {
          y[r * n_out + o] = DotQ8_0(n_in, wdata + o * w_row_bytes, act + r * act_row_bytes);
        }
      }
    });
    return absl::OkStatus();
  }

  // F32 / F16: activations as f32 rows (rounded to f16 for F16 weights), then the attention
  // kernels' K . q dot (kernels.h kv_scores: the same two lane orders) with the weight rows as K
  // rows and the tokens as query heads: scores[t * n_out + o] = W[o, :] . act[t, :].
  const bool tiny_blas = n_rows >= 2 && n_out % 4 == 0 && n_in % 16 == 0;
  const int64_t n_lanes = tiny_blas ? kAttnLanesTinyBlas : kAttnLanes;
  auto* act = static_cast<float*>(scratch.Get(n_rows * n_in * sizeof(float)));
  if (act == nullptr) return absl::ResourceExhaustedError("MatMulLlamaCpp: scratch");
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x_row(r);
    float* ar = act + r * n_in;
    for (int64_t i = 0; i < n_in; ++i) {
      ar[i] = w.type == GgmlType::kF16 ? Fp16ToFp32(Fp32ToFp16(xr[i])) : xr[i];
    }
  }
  // The SIMD levels' kv_scores need whole lane steps; the scalar one takes any length.
  const OpKernels& best = GetOpKernels(BestCpuLevel());
  const auto kv_scores = n_in % (tiny_blas ? 16 : 64) == 0
                             ? best.kv_scores
                             : GetOpKernels(CpuLevel::kScalar).kv_scores;
  const KvElem elem = w.type == GgmlType::kF16 ? KvElem::kF16 : KvElem::kF32;
  pool.ParallelFor(n_tasks, [&](int64_t t0, int64_t t1, int) {
    const int64_t o0 = t0 * kRowsPerTask, o1 = std::min(n_out, t1 * kRowsPerTask);
    kv_scores(act, n_rows, wdata + o0 * w_row_bytes, o1 - o0, elem, n_in, n_lanes, y + o0, n_out);
  });
  return absl::OkStatus();
}

}  // namespace kiln::cpu
