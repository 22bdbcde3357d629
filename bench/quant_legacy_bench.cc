// Throughput of the float and legacy-quant kernels, per type and CPU level:
//   * vec_dot: GB/s of weight bytes streamed through vec_dot for 4096-long rows covering a weight
//     matrix of --mb megabytes (default 32; decode-like: every row read once per pass, the
//     activation row stays in L1);
//   * activation quantize (Q8_0, Q8_1): GB/s of f32 input and rows/s of 4096 elements.
// Usage: quant_legacy_bench [--mb N] [--passes N]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "lib/common/ggml_type.h"
#include "lib/quant/quant.h"

namespace kiln {
namespace {

constexpr int64_t kRowLen = 4096;

double Seconds() {
  using Clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

std::vector<float> RandomFloats(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = u(rng);
  return x;
}

size_t RowBytes(GgmlType t) {
  return GgmlRowBytes(*GgmlTypeInfoOf(static_cast<uint32_t>(t)), kRowLen);
}

// Baseline: plain 64-bit sum over the buffer (what the memory system gives a simple loop).
double ReadBandwidth(const std::vector<uint8_t>& buf, int passes) {
  double best = 1e30;
  volatile uint64_t sink = 0;
  for (int p = 0; p < passes; ++p) {
    const double t0 = Seconds();
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    const size_t words = buf.size() / 8;
    const auto* w = reinterpret_cast<const uint64_t*>(buf.data());
    for (size_t i = 0; i + 4 <= words; i += 4) {
      s0 += w[i];
      s1 += w[i + 1];
      s2 += w[i + 2];
      s3 += w[i + 3];
    }
    sink = sink + s0 + s1 + s2 + s3;
    best = std::min(best, Seconds() - t0);
  }
  return static_cast<double>(buf.size()) / best / 1e9;
}

double VecDotBandwidth(const QuantKernels& k, const QuantKernels& act, size_t matrix_bytes,
                       int passes) {
  const size_t row_bytes = RowBytes(k.type);
  const size_t rows = std::max<size_t>(1, matrix_bytes / row_bytes);
  std::vector<uint8_t> weights(rows * row_bytes);
  // 64 distinct quantized rows, tiled over the matrix.
  const size_t distinct = std::min<size_t>(64, rows);
  for (size_t r = 0; r < distinct; ++r) {
    const std::vector<float> x = RandomFloats(kRowLen, static_cast<uint32_t>(r + 1));
    k.quantize(x.data(), weights.data() + r * row_bytes, kRowLen);
  }
  for (size_t r = distinct; r < rows; ++r) {
    std::memcpy(weights.data() + r * row_bytes, weights.data() + (r % distinct) * row_bytes,
                row_bytes);
  }
  const std::vector<float> ax = RandomFloats(kRowLen, 999);
  std::vector<uint8_t> a(RowBytes(act.type));
  act.quantize(ax.data(), a.data(), kRowLen);

  double best = 1e30;
  volatile float sink = 0.0f;
  for (int p = 0; p < passes; ++p) {
    const double t0 = Seconds();
    float sum = 0.0f;
    for (size_t r = 0; r < rows; ++r)
      sum += k.vec_dot(kRowLen, weights.data() + r * row_bytes, a.data());
    sink = sink + sum;
    best = std::min(best, Seconds() - t0);
  }
  return static_cast<double>(weights.size()) / best / 1e9;
}

// Returns GB/s of f32 input; rows_per_s receives 4096-element rows per second.
double QuantizeThroughput(const QuantKernels& k, int passes, double* rows_per_s) {
  constexpr int kRows = 256;
  const std::vector<float> x = RandomFloats(kRowLen * kRows, 5);
  std::vector<uint8_t> y(RowBytes(k.type) * kRows);
  double best = 1e30;
  for (int p = 0; p < passes * 20; ++p) {
    const double t0 = Seconds();
    for (int r = 0; r < kRows; ++r) {
      k.quantize(x.data() + r * kRowLen, y.data() + r * RowBytes(k.type), kRowLen);
    }
    best = std::min(best, Seconds() - t0);
  }
  *rows_per_s = kRows / best;
  return static_cast<double>(x.size() * sizeof(float)) / best / 1e9;
}

int Main(int argc, char** argv) {
  size_t mb = 32;
  int passes = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--mb") == 0) mb = static_cast<size_t>(std::atoi(argv[i + 1]));
    if (std::strcmp(argv[i], "--passes") == 0) passes = std::atoi(argv[i + 1]);
  }
  if (mb == 0 || passes <= 0) {
    std::fprintf(stderr, "usage: quant_legacy_bench [--mb N>0] [--passes N>0]\n");
    return 2;
  }
  const size_t matrix_bytes = mb << 20;
  const int best_level = static_cast<int>(BestCpuLevel());
  std::printf("vec_dot: row length %lld, weight matrix %zu MB, best of %d passes\n",
              static_cast<long long>(kRowLen), mb, passes);
  std::vector<uint8_t> buf(matrix_bytes, 1);
  std::printf("baseline read (scalar uint64 sum over the matrix): %.1f GB/s\n\n",
              ReadBandwidth(buf, passes));
  buf.clear();
  buf.shrink_to_fit();

  std::printf("%-6s %-5s", "type", "act");
  for (int l = 0; l <= best_level; ++l) std::printf(" %9s", CpuLevelName(static_cast<CpuLevel>(l)));
  std::printf("   (GB/s of weights)\n");
  const GgmlType types[] = {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                            GgmlType::kQ8_0, GgmlType::kF16,  GgmlType::kBF16, GgmlType::kF32};
  for (GgmlType t : types) {
    const QuantKernels* k0 = GetQuantKernels(t, CpuLevel::kScalar);
    if (k0 == nullptr) continue;
    std::printf("%-6s %-5s", GgmlTypeName(static_cast<uint32_t>(t)).c_str(),
                GgmlTypeName(static_cast<uint32_t>(k0->vec_dot_type)).c_str());
    for (int l = 0; l <= best_level; ++l) {
      const CpuLevel level = static_cast<CpuLevel>(l);
      const QuantKernels* k = GetQuantKernels(t, level);
      const QuantKernels* act = GetQuantKernels(k->vec_dot_type, level);
      std::printf(" %9.1f", VecDotBandwidth(*k, *act, matrix_bytes, l == 0 ? 2 : passes));
      std::fflush(stdout);
    }
    std::printf("\n");
  }

  std::printf("\nactivation quantize, 4096-element rows: GB/s of f32 input (M rows/s)\n");
  for (GgmlType t : {GgmlType::kQ8_0, GgmlType::kQ8_1}) {
    std::printf("%-6s", GgmlTypeName(static_cast<uint32_t>(t)).c_str());
    for (int l = 0; l <= best_level; ++l) {
      double rows_per_s = 0.0;
      const double gbs =
          QuantizeThroughput(*GetQuantKernels(t, static_cast<CpuLevel>(l)), passes, &rows_per_s);
      std::printf("  %s %6.1f (%.2f)", CpuLevelName(static_cast<CpuLevel>(l)), gbs,
                  rows_per_s / 1e6);
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) { return kiln::Main(argc, argv); }
