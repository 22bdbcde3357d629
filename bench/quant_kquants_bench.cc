// K-quant kernel throughput: GB/s of weight bytes streamed through vec_dot (one activation row
// against every row of a ~32 MB weight matrix of 4096-long rows, the decode-time matvec shape),
// per type and CPU level; and Q8_K quantize throughput (activation rows of 4096 floats).
//
//   quant_kquants_bench [--reps N] [--matrix-mb M]   (default 32 MB; a small M measures the
//                                                    kernels with weights in cache)
//
// Single thread. Weight bytes are random codes with finite f16 scales (kernel speed does not
// depend on the values). Best of N repetitions (default 5) is reported.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "lib/common/half.h"
#include "lib/quant/quant.h"

namespace {

using kiln::CpuLevel;
using kiln::GgmlType;

constexpr int64_t kRowLen = 4096;

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Offsets of the f16 scale fields in each block type (see lib/quant/kquants.h).
std::vector<size_t> F16Fields(GgmlType t) {
  switch (t) {
    case GgmlType::kQ2_K:
      return {80, 82};
    case GgmlType::kQ3_K:
      return {108};
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
      return {0, 2};
    case GgmlType::kQ6_K:
      return {208};
    default:
      return {};
  }
}

volatile float g_sink;

}  // namespace

int main(int argc, char** argv) {
  int reps = 5;
  size_t matrix_bytes = size_t{32} << 20;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (std::string(argv[i]) == "--matrix-mb" && i + 1 < argc) {
      matrix_bytes = static_cast<size_t>(std::max(1, std::atoi(argv[++i]))) << 20;
    } else {
      std::fprintf(stderr, "usage: %s [--reps N] [--matrix-mb M]\n", argv[0]);
      return 2;
    }
  }
  const GgmlType types[] = {GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K,
                            GgmlType::kQ6_K};
  const int best_level = static_cast<int>(kiln::BestCpuLevel());
  std::mt19937 rng(42);

  // One activation row, quantized to Q8_K.
  std::vector<float> x(kRowLen);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x) v = normal(rng);
  const auto q8_info = *kiln::GgmlTypeInfoOf(static_cast<uint32_t>(GgmlType::kQ8_K));
  std::vector<uint8_t> act(kiln::GgmlRowBytes(q8_info, kRowLen));
  kiln::GetQuantKernels(GgmlType::kQ8_K, CpuLevel::kScalar)
      ->quantize(x.data(), act.data(), kRowLen);

  std::printf(
      "vec_dot: one Q8_K row x ~%zu MB of %lld-long weight rows, single thread, best of %d\n",
      matrix_bytes >> 20, static_cast<long long>(kRowLen), reps);
  std::printf("%-6s %-7s %8s %10s %10s\n", "type", "level", "rows", "ms/matrix", "GB/s");
  for (GgmlType t : types) {
    const auto info = *kiln::GgmlTypeInfoOf(static_cast<uint32_t>(t));
    const size_t row_bytes = kiln::GgmlRowBytes(info, kRowLen);
    const size_t rows = matrix_bytes / row_bytes;
    std::vector<uint8_t> w(rows * row_bytes);
    for (size_t i = 0; i < w.size(); i += 4) {
      const uint32_t r = static_cast<uint32_t>(rng());
      std::memcpy(&w[i], &r, std::min<size_t>(4, w.size() - i));
    }
    std::uniform_real_distribution<float> scale(0.001f, 0.1f);
    for (size_t b = 0; b < w.size(); b += info.type_size) {
      for (size_t off : F16Fields(t)) {
        const uint16_t h = kiln::Fp32ToFp16(scale(rng));
        std::memcpy(&w[b + off], &h, 2);
      }
    }
    for (int l = 0; l <= best_level; ++l) {
      const auto level = static_cast<CpuLevel>(l);
      const kiln::QuantKernels* k = kiln::GetQuantKernels(t, level);
      if (k == nullptr) continue;
      double best = 1e30;
      float sum = 0.0f;
      for (int rep = 0; rep < reps; ++rep) {
        const double t0 = Seconds();
        for (size_t r = 0; r < rows; ++r)
          sum += k->vec_dot(kRowLen, w.data() + r * row_bytes, act.data());
        best = std::min(best, Seconds() - t0);
      }
      g_sink = sum;
      std::printf("%-6s %-7s %8zu %10.2f %10.2f\n",
                  kiln::GgmlTypeName(static_cast<uint32_t>(t)).c_str(), kiln::CpuLevelName(level),
                  rows, best * 1e3, static_cast<double>(w.size()) / best / 1e9);
    }
  }

  // Q8_K quantize: 1024 activation rows of 4096 floats (16 MB of input).
  constexpr int kActRows = 1024;
  std::vector<float> xs(kActRows * kRowLen);
  for (float& v : xs) v = normal(rng);
  std::vector<uint8_t> out(kActRows * act.size());
  std::printf("\nQ8_K quantize: %d rows x %lld floats, single thread, best of %d\n", kActRows,
              static_cast<long long>(kRowLen), reps);
  std::printf("%-7s %12s %14s\n", "level", "ns/row", "GB/s (f32 in)");
  for (int l = 0; l <= best_level; ++l) {
    const auto level = static_cast<CpuLevel>(l);
    const kiln::QuantKernels* k = kiln::GetQuantKernels(GgmlType::kQ8_K, level);
    if (k == nullptr) continue;
    double best = 1e30;
    for (int rep = 0; rep < reps; ++rep) {
      const double t0 = Seconds();
      for (int r = 0; r < kActRows; ++r) {
        k->quantize(xs.data() + static_cast<size_t>(r) * kRowLen, out.data() + r * act.size(),
                    kRowLen);
      }
      best = std::min(best, Seconds() - t0);
    }
    std::printf("%-7s %12.1f %14.2f\n", kiln::CpuLevelName(level), best / kActRows * 1e9,
                static_cast<double>(xs.size() * sizeof(float)) / best / 1e9);
  }
  return 0;
}
