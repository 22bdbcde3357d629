// The float tile kernels (QuantKernels::vec_dot_tile of F32 / F16 / BF16 weights x F32 activations,
// kernels/cpu/float_avx2.cc and float_avx512.cc) against vec_dot per (row, token) pair (what
// MatMul ran on float weights before them) and against the CPU's f32 FMA peak, on one thread.
// Times are the thread's CPU time, so a loaded machine's time-sharing does not count (its
// shared caches still do).
//
// Shape: MLA's decompression matmul on deepseek2-bench (K = C W_UKᵀ: n_in = kv_lora_rank 512,
// n_out = 16 heads x 128 = 2048, tokens = context rows, in MatMul's blocks of 64).
//
// Usage: float_tile_bench [--rows 2048] [--n 512] [--tokens 64] [--min_ms 300]
//            [--offset F]  (rows start F floats past a 64-byte boundary; default 0)
#include <immintrin.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "lib/common/half.h"
#include "lib/common/platform.h"
#include "lib/quant/quant.h"

namespace {

// Seconds of thread CPU time per call of fn (repeated for at least min_s; the best of 3 runs).
template <typename Fn>
double TimeIt(Fn&& fn, double min_s) {
  double best = 1e30;
  for (int run = 0; run < 3; ++run) {
    int calls = 0;
    const double t0 = kiln::platform::ThreadCpuSeconds();
    double t = t0;
    do {
      fn();
      ++calls;
      t = kiln::platform::ThreadCpuSeconds();
    } while (t - t0 < min_s / 3);
    best = std::min(best, (t - t0) / calls);
  }
  return best;
}

// f32 multiply-adds per second of 12 independent 16-lane FMA chains (AVX-512) or 12 8-lane ones
// (AVX2): the core's FMA peak, as the tiles could at best reach it.
__attribute__((target("avx512f"))) float PeakLoopAvx512(int64_t iters) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512 m = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-3f);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], m, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, acc[i]);
  float out[16];
  _mm512_storeu_ps(out, s);
  return out[0];
}
__attribute__((target("avx2,fma"))) float PeakLoopAvx2(int64_t iters) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  const __m256 m = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-3f);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], m, b);
  }
  __m256 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0];
}

}  // namespace

int main(int argc, char** argv) {
  int64_t rows = 2048, n = 512, tokens = 64, offset = 0;
  double min_s = 0.3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const double v = std::atof(argv[i + 1]);
    if (a == "--rows") {
      rows = static_cast<int64_t>(v);
    } else if (a == "--n") {
      n = static_cast<int64_t>(v);
    } else if (a == "--tokens") {
      tokens = static_cast<int64_t>(v);
    } else if (a == "--offset") {
      offset = static_cast<int64_t>(v);
    } else if (a == "--min_ms") {
      min_s = v / 1000;
    } else {
      std::fprintf(stderr, "float_tile_bench: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  if (rows < 1 || n < 1 || tokens < 1 || tokens > 1024 || offset < 0 || offset > 15) {
    std::fprintf(stderr,
                 "float_tile_bench: rows, n >= 1, tokens in [1, 1024], offset in [0, 15]\n");
    return 2;
  }
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  // 64-byte aligned rows when n % 16 == 0 (what a 512-bit load wants); --offset shifts them.
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  auto aligned = [](int64_t count) {
    return std::unique_ptr<float[], Free>(static_cast<float*>(
        std::aligned_alloc(64, ((static_cast<size_t>(count) * 4 + 64) / 64 + 1) * 64)));
  };
  auto w32_mem = aligned(rows * n + 16), a_mem = aligned(tokens * n + 16);
  std::span<float> w32(w32_mem.get() + offset, rows * n), a(a_mem.get() + offset, tokens * n);
  std::vector<float> out(rows * tokens);
  for (float& v : w32) v = dist(rng);
  for (float& v : a) v = dist(rng);
  std::vector<uint16_t> w16(w32.size()), wbf16(w32.size());
  for (size_t i = 0; i < w32.size(); ++i) {
    w16[i] = kiln::Fp32ToFp16(w32[i]);
    wbf16[i] = kiln::Fp32ToBf16(w32[i]);
  }
  const double macs = static_cast<double>(rows) * static_cast<double>(n) * tokens;
  std::printf(
      "float tiles: %lld rows x %lld tokens, n %lld; one thread, thread CPU time, best of 3\n",
      static_cast<long long>(rows), static_cast<long long>(tokens), static_cast<long long>(n));
  const kiln::CpuLevel best = kiln::BestCpuLevel();
  {
    volatile int64_t iters_v = 1 << 20;  // opaque: the loop is not hoisted out of TimeIt
    const int64_t iters = iters_v;
    const bool avx512 = best == kiln::CpuLevel::kAvx512;
    volatile float sink = 0;
    const double s = TimeIt(
        [&] { sink = sink + (avx512 ? PeakLoopAvx512(iters_v) : PeakLoopAvx2(iters_v)); }, min_s);
    std::printf("%-7s f32 FMA peak (12 independent chains): %7.1f G multiply-adds/s\n",
                avx512 ? "avx512" : "avx2", 12.0 * (avx512 ? 16 : 8) * iters / s / 1e9);
  }
  std::printf("%-7s %-4s %22s %22s %8s\n", "level", "type", "vec_dot per pair GMAC/s",
              "tile GMAC/s", "speedup");
  for (kiln::CpuLevel level :
       {kiln::CpuLevel::kScalar, kiln::CpuLevel::kAvx2, kiln::CpuLevel::kAvx512}) {
    if (static_cast<int>(level) > static_cast<int>(best)) continue;
    for (kiln::GgmlType type :
         {kiln::GgmlType::kF32, kiln::GgmlType::kF16, kiln::GgmlType::kBF16}) {
      const kiln::QuantKernels* k = kiln::GetQuantKernels(type, level);
      if (k == nullptr || k->vec_dot_tile == nullptr) continue;
      const bool f32 = type == kiln::GgmlType::kF32;
      const void* w = f32                            ? static_cast<const void*>(w32.data())
                      : type == kiln::GgmlType::kF16 ? w16.data()
                                                     : wbf16.data();
      const size_t w_stride = static_cast<size_t>(n) * (f32 ? 4 : 2);
      const size_t a_stride = static_cast<size_t>(n) * 4;
      // As MatMul calls it: blocks of 16 weight rows, each over all tokens.
      const double pairs = TimeIt(
          [&] {
            for (int64_t t = 0; t < tokens; ++t) {
              for (int64_t r = 0; r < rows; ++r) {
                out[t * rows + r] =
                    k->vec_dot(n, static_cast<const uint8_t*>(w) + r * w_stride, a.data() + t * n);
              }
            }
          },
          min_s);
      const double tile = TimeIt(
          [&] {
            k->vec_dot_tile(n, w, w_stride, static_cast<int>(rows), a.data(), a_stride,
                            static_cast<int>(tokens), out.data(), static_cast<size_t>(rows));
          },
          min_s);
      std::printf("%-7s %-4s %22.2f %22.2f %7.1fx\n", kiln::CpuLevelName(level),
                  kiln::GgmlTypeName(static_cast<uint32_t>(type)).c_str(), macs / pairs / 1e9,
                  macs / tile / 1e9, pairs / tile);
    }
  }
  return 0;
}
