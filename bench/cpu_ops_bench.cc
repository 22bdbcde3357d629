// CPU backend op benchmark: matmul GB/s (decode) and GFLOP/s (prefill) per registered weight
// type, paged attention time per token, ThreadPool::ParallelFor overhead.
//
//   cpu_ops_bench [--types=q4_0,q4_1,...] [--min_ms=300] [--tile] [--attention] [--peak]
//                 [--stream]
//
// --tile runs only the matmul kernel comparison on the SmolLM2 shapes (K-quants: Gemma 3 270M's
// and a 4096 x 4096 one): old path (vec_dot_rows, or vec_dot per row) vs vec_dot_tile vs the
// integer order on interleaved rows (types with a tile kernel: q8_0, q4_0, q4_1, q5_0, q5_1, q4_K,
// q5_K, q6_K; --types filters them too). --attention runs only the
// paged-attention tables (f16, q8_0 and f32 caches at contexts 128, 1,024 and 4,096 on one
// layer; one decode step's kernels apart; f16 and q8_0 decode over a whole model's layers from
// memory). --peak prints
// only the int8 dot-product peak of 1 and 2 threads (also printed before the tile tables, whose
// last column is the default order's kernel as a share of the 1-thread peak). --stream prints only
// each type's one-token kernel streaming matrices from memory, on the file's rows and on the
// interleaved copy, against a plain read of the same bytes (BenchStream).
//
// Decode GB/s counts weight bytes streamed per token (the bandwidth-bound quantity); prefill
// GFLOP/s counts 2 * n_in * n_out * n_tokens. Each timing is the best of repeated runs lasting
// at least --min_ms in total.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/backend/cpu/dispatch.h"
#include "lib/backend/cpu/ops.h"
#include "lib/common/half.h"
#include "lib/common/platform.h"
#include "lib/quant/activation.h"

namespace kiln::cpu {
namespace {

double g_min_ms = 300.0;

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Seconds per call of fn: best batch average over batches run until min_ms has passed.
template <typename Fn>
double TimePerCall(Fn&& fn, int calls_per_batch = 1) {
  fn();  // warm up
  double best = 1e30, start = NowSeconds();
  do {
    const double t0 = NowSeconds();
    for (int i = 0; i < calls_per_batch; ++i) fn();
    best = std::min(best, (NowSeconds() - t0) / calls_per_batch);
  } while ((NowSeconds() - start) * 1e3 < g_min_ms);
  return best;
}

std::vector<float> RandomVector(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

void BenchThreadPool() {
  printf("\n== ThreadPool::ParallelFor overhead (empty tasks, one per thread)\n");
  for (int n_threads : {1, 2}) {
    ThreadPool pool(n_threads);
    volatile int sink = 0;
    const double s = TimePerCall(
        [&] { pool.ParallelFor(n_threads, [&](int64_t b, int64_t, int) { sink = sink + b; }); },
        10000);
    printf("threads %d: %.2f us per call\n", n_threads, s * 1e6);
  }
}

void BenchMatMul(const std::vector<GgmlType>& types) {
  struct Shape {
    int64_t n_in, n_out;
  };
  const Shape shapes[] = {{576, 1536}, {4096, 4096}};
  ThreadPool pool1(1), pool2(2);
  Scratch scratch;
  std::mt19937 rng(1);
  printf("\n== MatMul decode (1 token): GB/s of weights streamed; prefill (512 tokens): GFLOP/s\n");
  printf("%-6s %-10s %10s %10s %10s %12s %12s\n", "type", "n_in x out", "MiB", "dec 1T", "dec 2T",
         "pre 1T", "pre 2T");
  for (GgmlType type : types) {
    const QuantKernels* k = GetQuantKernels(type);
    const auto info = GgmlTypeInfoOf(static_cast<uint32_t>(type));
    for (const Shape& sh : shapes) {
      if (sh.n_in % info->block_size != 0) {
        printf("%-6s %4lldx%-5lld   (n_in not a multiple of the block size %u)\n",
               GgmlTypeName(static_cast<uint32_t>(type)).c_str(), static_cast<long long>(sh.n_in),
               static_cast<long long>(sh.n_out), info->block_size);
        continue;
      }
      const size_t row_bytes = GgmlRowBytes(*info, sh.n_in);
      std::vector<uint8_t> w(row_bytes * sh.n_out);
      const std::vector<float> row = RandomVector(sh.n_in, rng);
      for (int64_t o = 0; o < sh.n_out; ++o)
        k->quantize(row.data(), w.data() + o * row_bytes, sh.n_in);
      const WeightView wv{type, w.data(), sh.n_in, sh.n_out};
      const int64_t n_prefill = 512;
      const std::vector<float> x = RandomVector(sh.n_in * n_prefill, rng);
      std::vector<float> y(sh.n_out * n_prefill);
      double dec[2], pre[2];
      int idx = 0;
      for (ThreadPool* pool : {&pool1, &pool2}) {
        dec[idx] = TimePerCall([&] { (void)MatMul(*pool, wv, x.data(), 1, y.data(), scratch); });
        const double saved = g_min_ms;
        g_min_ms = 0;  // prefill calls are long: one timed run after the warm-up
        pre[idx] =
            TimePerCall([&] { (void)MatMul(*pool, wv, x.data(), n_prefill, y.data(), scratch); });
        g_min_ms = saved;
        ++idx;
      }
      const double bytes = static_cast<double>(w.size());
      const double flops = 2.0 * sh.n_in * sh.n_out * n_prefill;
      printf("%-6s %4lldx%-5lld %10.2f %10.1f %10.1f %12.1f %12.1f\n",
             GgmlTypeName(static_cast<uint32_t>(type)).c_str(), static_cast<long long>(sh.n_in),
             static_cast<long long>(sh.n_out), bytes / (1 << 20), bytes / dec[0] * 1e-9,
             bytes / dec[1] * 1e-9, flops / pre[0] * 1e-9, flops / pre[1] * 1e-9);
      fflush(stdout);
    }
  }
}

// CPU seconds per call of fn on this thread: best of at least 3 calls and of min_ms of calls.
template <typename Fn>
double CpuTimePerCall(Fn&& fn) {
  fn();  // warm up
  double best = 1e30;
  const double start = NowSeconds();
  for (int i = 0; i < 3 || (NowSeconds() - start) * 1e3 < g_min_ms; ++i) {
    const double t0 = platform::ThreadCpuSeconds();
    fn();
    best = std::min(best, platform::ThreadCpuSeconds() - t0);
  }
  return best;
}

// The int8 dot-product peak the integer matmuls could at best reach: 12 independent chains of
// the instructions a u8 x s8 block product costs, with operands in registers. AVX2:
// vpmaddubsw (32 u8 x s8 products, pairwise summed to s16), vpmaddwd by ones (to s32), vpaddd;
// AVX-512 VNNI: one vpdpbusd (64 products into s32). Returns int8 multiply-adds done.
__attribute__((target("avx2"))) int64_t Int8PeakLoopAvx2(int64_t iters, int32_t* sink) {
  __m256i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_epi32(i);
  const __m256i u = _mm256_set1_epi8(3), s8 = _mm256_set1_epi8(-2), ones = _mm256_set1_epi16(1);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < 12; ++i) {
      // The weights differ per chain in a real kernel; an asm barrier keeps s8 from being hoisted.
      __m256i w = s8;
      __asm__("" : "+x"(w));
      acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(_mm256_maddubs_epi16(u, w), ones));
    }
  }
  __m256i t = acc[0];
  for (int i = 1; i < 12; ++i) t = _mm256_add_epi32(t, acc[i]);
  *sink += _mm256_extract_epi32(t, 0);
  return iters * 12 * 32;
}
__attribute__((target("avx512f,avx512bw,avx512vnni"))) int64_t Int8PeakLoopAvx512(int64_t iters,
                                                                                  int32_t* sink) {
  __m512i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_epi32(i);
  const __m512i u = _mm512_set1_epi8(3), s8 = _mm512_set1_epi8(-2);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], u, s8);
  }
  __m512i t = acc[0];
  for (int i = 1; i < 12; ++i) t = _mm512_add_epi32(t, acc[i]);
  int32_t lanes[16];
  _mm512_storeu_si512(lanes, t);
  *sink += lanes[0];
  return iters * 12 * 64;
}

// The peak loop with one other instruction for every kEvery vpdpbusd, on chains of its own: what
// the prefill kernels' companions of the dot products (K-quant scale multiplies, minimums, the
// per-block float steps) cost the dot products, one thread. C::Apply(side, u) is the companion.
// Returns the int8 multiply-adds done.
template <int kEvery, typename C>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) int64_t Int8MixLoopAvx512(int64_t iters,
                                                                                 int32_t* sink) {
  constexpr int kDots = 48;  // a pass: 4 x the 12 chains
  __m512i acc[12], side[4];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_epi32(i);
  for (int i = 0; i < 4; ++i) side[i] = _mm512_set1_epi32(i + 1);
  const __m512i u = _mm512_set1_epi8(3), s8 = _mm512_set1_epi8(-2);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 48
    for (int k = 0; k < kDots; ++k) {
      acc[k % 12] = _mm512_dpbusd_epi32(acc[k % 12], u, s8);
      if (k % kEvery == kEvery - 1) {
        __m512i& x = side[(k / kEvery) % 4];
        x = C::Apply(x, u);
        __asm__("" : "+v"(x));  // each companion done as written, not combined with the next
      }
    }
  }
  __m512i t = acc[0];
  for (int i = 1; i < 12; ++i) t = _mm512_add_epi32(t, acc[i]);
  for (int i = 0; i < 4; ++i) t = _mm512_xor_si512(t, side[i]);
  int32_t lanes[16];
  _mm512_storeu_si512(lanes, t);
  *sink += lanes[0];
  return iters * kDots * 64;
}

#define KILN_MIX_COMPANION(Name, expr)                                                        \
  struct Name {                                                                               \
    __attribute__((target("avx512f,avx512vnni"), always_inline)) static inline __m512i Apply( \
        __m512i x, __m512i y) {                                                               \
      return expr;                                                                            \
    }                                                                                         \
  }
KILN_MIX_COMPANION(MixAdd, _mm512_add_epi32(x, y));
KILN_MIX_COMPANION(MixMulLo, _mm512_mullo_epi32(x, y));
KILN_MIX_COMPANION(MixDpwssd, _mm512_dpwssd_epi32(x, y, y));
KILN_MIX_COMPANION(MixCvt, _mm512_castps_si512(_mm512_maskz_cvtepi32_ps(0xFFFF, x)));
KILN_MIX_COMPANION(MixAddPs, _mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(x),
                                                               _mm512_castsi512_ps(y))));
KILN_MIX_COMPANION(MixMulPs, _mm512_castps_si512(_mm512_mul_ps(_mm512_castsi512_ps(x),
                                                               _mm512_castsi512_ps(y))));
KILN_MIX_COMPANION(MixFma, _mm512_castps_si512(_mm512_fmadd_ps(_mm512_castsi512_ps(x),
                                                               _mm512_castsi512_ps(y),
                                                               _mm512_castsi512_ps(y))));
#undef KILN_MIX_COMPANION

// G int8 multiply-adds per second of the peak loop on n_threads threads at once (wall time;
// best of 5 rounds of `iters` each), or 0 below AVX2.
double Int8PeakGmacs(int n_threads, int64_t iters) {
  const CpuLevel level = BestCpuLevel();
  if (level == CpuLevel::kScalar) return 0;
  auto loop = [&](int32_t* sink) {
    return level == CpuLevel::kAvx512 ? Int8PeakLoopAvx512(iters, sink)
                                      : Int8PeakLoopAvx2(iters, sink);
  };
  double best = 0;
  for (int round = 0; round < 5; ++round) {
    std::vector<int32_t> sinks(n_threads);
    std::vector<std::thread> threads;
    const double t0 = NowSeconds();
    for (int t = 1; t < n_threads; ++t) threads.emplace_back([&, t] { loop(&sinks[t]); });
    const int64_t macs = loop(&sinks[0]) * n_threads;
    for (std::thread& th : threads) th.join();
    best = std::max(best, macs / (NowSeconds() - t0) * 1e-9);
  }
  return best;
}

// The peak on 1 and 2 threads: the first is the 100% of the tile tables' "% of int8 peak"; the
// ratio is the most any compute-bound work (a prompt's matmuls) can gain from a second thread
// on this machine.
double PrintInt8Peak() {
  const double one = Int8PeakGmacs(1, 20'000'000), two = Int8PeakGmacs(2, 20'000'000);
  printf(
      "int8 dot-product peak (%s: %s, 12 chains): 1 thread %.1f G multiply-adds/s (%.1f "
      "GOP/s), 2 threads %.1f (%.2fx)\n",
      CpuLevelName(BestCpuLevel()),
      BestCpuLevel() == CpuLevel::kAvx512 ? "vpdpbusd" : "vpmaddubsw + vpmaddwd + vpaddd", one,
      2 * one, two, two / one);
  return one;
}

// The int8 peak with companions (Int8MixLoopAvx512), as a share of the plain peak: an
// instruction that takes s of the dot products' pipe slots costs 1 / (1 + s / N) at one per N.
template <typename C>
void PrintInt8MixRow(const char* name, double peak_gmacs) {
  auto share = [&](auto loop) {
    double best = 0;
    for (int round = 0; round < 5; ++round) {
      int32_t sink = 0;
      const double t0 = NowSeconds();
      const int64_t macs = loop(5'000'000, &sink);
      best = std::max(best, macs / (NowSeconds() - t0) * 1e-9);
    }
    return 100.0 * best / peak_gmacs;
  };
  printf("%-34s %7.0f%% %7.0f%% %7.0f%%\n", name, share(Int8MixLoopAvx512<4, C>),
         share(Int8MixLoopAvx512<8, C>), share(Int8MixLoopAvx512<16, C>));
}

void PrintInt8Mix(double peak_gmacs) {
  if (BestCpuLevel() != CpuLevel::kAvx512 || peak_gmacs <= 0) return;
  printf("\nvpdpbusd with one other instruction per N of them (1 thread, share of the peak)\n");
  printf("%-34s %8s %8s %8s\n", "companion", "N = 4", "N = 8", "N = 16");
  PrintInt8MixRow<MixAdd>("vpaddd (integer add)", peak_gmacs);
  PrintInt8MixRow<MixMulLo>("vpmulld (K-quant scale multiply)", peak_gmacs);
  PrintInt8MixRow<MixDpwssd>("vpdpwssd (K-quant minimums)", peak_gmacs);
  PrintInt8MixRow<MixCvt>("vcvtdq2ps (sums to float)", peak_gmacs);
  PrintInt8MixRow<MixAddPs>("vaddps (float add)", peak_gmacs);
  PrintInt8MixRow<MixMulPs>("vmulps (float scale)", peak_gmacs);
  PrintInt8MixRow<MixFma>("vfmadd231ps (float accumulate)", peak_gmacs);
}

// Matmul kernels of a type with vec_dot_tile (Q8_0, Q4_0, Q4_1, Q5_0) on the SmolLM2-135M shapes,
// one thread, activations pre-quantized: the pre-tile path (token by token: vec_dot per row for one
// Q8_0 token, vec_dot_rows over 16-row chunks otherwise, 32-token tiles, as MatMul did) against
// vec_dot_tile in MatMul's blocking (all rows per call, 64-token blocks), both in vec_dot's
// (llama.cpp's) order, and the integer order on interleaved rows (interleaved_tile, the default
// mode's kernel; Q4_1 and Q8_0) in the same blocking. GFLOP/s = 2 * n_in * n_out * tokens /
// thread CPU time (best of >= 3 calls; CPU time so that other jobs on the shared cores do not
// count). Weights of these shapes stay in L2/L3: kernel speed, not memory speed.
void BenchTile(GgmlType type, double peak_gmacs) {
  const QuantKernels* k = GetQuantKernels(type);
  const std::string name = GgmlTypeName(static_cast<uint32_t>(type));
  const QuantKernels* act = GetQuantKernels(k->vec_dot_type);
  printf(
      "\n== %s matmul kernels, 1 thread, level %s: GFLOP/s old (vec_dot / vec_dot_rows) vs "
      "tile (vec_dot_tile)\n",
      name.c_str(), CpuLevelName(BestCpuLevel()));
  if (k->vec_dot_tile == nullptr) {
    printf("(no vec_dot_tile for %s at this level: the tile columns time the old path)\n",
           name.c_str());
  }
  printf("%-8s %-6s %7s %12s %12s %8s %15s %12s %11s\n", "n_in", "n_out", "tokens", "old GFLOP/s",
         "tile GFLOP/s", "speedup", "integer GFLOP/s", "tile w GB/s", "% of peak");
  struct Shape {
    int64_t n_in, n_out;
  };
  // SmolLM2 shapes; K-quants (256-element super-blocks) take the row lengths that are multiples
  // of 256: SmolLM2's ffn_down, Gemma 3 270M's ffn_down and attn_output, and a 4096 x 4096
  // matrix that does not fit in the caches (decode streams it from memory).
  const bool k_quant = GgmlTypeInfoOf(static_cast<uint32_t>(type))->block_size == 256;
  const std::vector<Shape> shapes =
      k_quant ? std::vector<Shape>{{1536, 576}, {2048, 640}, {1024, 640}, {4096, 4096}}
              : std::vector<Shape>{{576, 576}, {576, 192}, {576, 1536}, {1536, 576}, {576, 49152}};
  std::mt19937 rng(7);
  for (const Shape& sh : shapes) {
    const size_t w_row = GgmlRowBytes(*GgmlTypeInfoOf(static_cast<uint32_t>(type)), sh.n_in);
    const size_t a_row =
        GgmlRowBytes(*GgmlTypeInfoOf(static_cast<uint32_t>(k->vec_dot_type)), sh.n_in);
    std::vector<uint8_t> w(w_row * sh.n_out);
    for (int64_t o = 0; o < sh.n_out; ++o) {
      const std::vector<float> row = RandomVector(sh.n_in, rng);
      k->quantize(row.data(), w.data() + o * w_row, sh.n_in);
    }
    std::vector<uint8_t> interleaved;
    if (k->interleaved_tile != nullptr) {
      const int64_t groups = (sh.n_out + quant::kInterleaveRows - 1) / quant::kInterleaveRows;
      interleaved.resize(groups * k->interleaved_group_bytes(sh.n_in) + 64);
    }
    // 64-byte aligned, as the model's copies are.
    uint8_t* il = interleaved.data() + (-reinterpret_cast<uintptr_t>(interleaved.data()) & 63);
    if (k->interleaved_tile != nullptr) k->interleave(w.data(), w_row, sh.n_in, sh.n_out, il);
    for (int64_t n_tok : {1, 2, 4, 8, 9, 16, 512}) {
      std::vector<uint8_t> a(a_row * n_tok);
      for (int64_t t = 0; t < n_tok; ++t) {
        const std::vector<float> x = RandomVector(sh.n_in, rng);
        act->quantize(x.data(), a.data() + t * a_row, sh.n_in);
      }
      std::vector<float> y(sh.n_out * n_tok);
      auto old_path = [&] {
        for (int64_t tb = 0; tb < n_tok; tb += 32) {
          const int64_t te = std::min(n_tok, tb + 32);
          for (int64_t rb = 0; rb < sh.n_out; rb += 16) {
            const int64_t re = std::min(sh.n_out, rb + 16);
            for (int64_t t = tb; t < te; ++t) {
              float* yt = y.data() + t * sh.n_out;
              if ((n_tok == 1 && type == GgmlType::kQ8_0) || k->vec_dot_rows == nullptr) {
                for (int64_t r = rb; r < re; ++r) {
                  yt[r] = k->vec_dot(sh.n_in, w.data() + r * w_row, a.data() + t * a_row);
                }
              } else {
                k->vec_dot_rows(sh.n_in, w.data() + rb * w_row, w_row, static_cast<int>(re - rb),
                                a.data() + t * a_row, yt + rb);
              }
            }
          }
        }
      };
      auto tile_path = [&] {
        if (k->vec_dot_tile == nullptr) return old_path();
        for (int64_t tb = 0; tb < n_tok; tb += 64) {
          const int64_t te = std::min(n_tok, tb + 64);
          k->vec_dot_tile(sh.n_in, w.data(), w_row, static_cast<int>(sh.n_out),
                          a.data() + tb * a_row, a_row, static_cast<int>(te - tb),
                          y.data() + tb * sh.n_out, sh.n_out);
        }
      };
      // What MatMul runs once the copy is written: the interleaved kernel on it, 64 tokens a
      // call.
      auto integer_path = [&] {
        for (int64_t tb = 0; tb < n_tok; tb += 64) {
          const int64_t te = std::min(n_tok, tb + 64);
          k->interleaved_tile(sh.n_in, il, static_cast<int>(sh.n_out), a.data() + tb * a_row, a_row,
                              static_cast<int>(te - tb), y.data() + tb * sh.n_out, sh.n_out);
        }
      };
      const double flops = 2.0 * sh.n_in * sh.n_out * n_tok;
      const double t_old = CpuTimePerCall(old_path), t_tile = CpuTimePerCall(tile_path);
      char integer[32] = "-";
      // The default order's kernel (interleaved rows where the type has it), against the peak.
      double best_gflops = flops / t_tile * 1e-9;
      if (k->interleaved_tile != nullptr) {
        best_gflops = flops / CpuTimePerCall(integer_path) * 1e-9;
        std::snprintf(integer, sizeof(integer), "%.1f", best_gflops);
      }
      printf("%-8lld %-6lld %7lld %12.1f %12.1f %7.2fx %15s %12.1f %10.0f%%\n",
             static_cast<long long>(sh.n_in), static_cast<long long>(sh.n_out),
             static_cast<long long>(n_tok), flops / t_old * 1e-9, flops / t_tile * 1e-9,
             t_old / t_tile, integer, static_cast<double>(w.size()) / t_tile * 1e-9,
             peak_gmacs > 0 ? 100.0 * best_gflops / (2 * peak_gmacs) : 0.0);
      fflush(stdout);
    }
  }
}

void BenchAttention(const char* name, int32_t n_heads, int32_t n_kv, int32_t d) {
  printf("\n== PagedAttention (%s layer: %d q heads, %d kv heads, head_dim %d, block 16)\n", name,
         n_heads, n_kv, d);
  printf("%-5s %8s %8s %14s %14s %16s\n", "kv", "context", "tokens", "us/token 1T", "us/token 2T",
         "GB/s KV read 1T");
  const int32_t bs = 16;
  std::mt19937 rng(2);
  ThreadPool pool1(1), pool2(2);
  Scratch scratch;
  for (GgmlType type : {GgmlType::kF16, GgmlType::kQ8_0, GgmlType::kF32}) {
    // Bytes per row: 2 or 4 per element; q8_0 34 per 32 elements.
    const size_t row_bytes =
        type == GgmlType::kQ8_0 ? d / 32 * 34 : d * (type == GgmlType::kF32 ? 4 : 2);
    for (int32_t ctx : {128, 1024, 4096}) {
      for (int32_t n_tokens : {1, 16}) {
        if (ctx == 4096 && n_tokens == 16) continue;
        // n_tokens decode tokens, each its own sequence of length ctx.
        const int32_t blocks_per_seq = ctx / bs, n_blocks = blocks_per_seq * n_tokens;
        const size_t tile = static_cast<size_t>(bs) * row_bytes;
        const size_t region = 2 * n_kv * tile;
        std::vector<uint8_t> cache(region * n_blocks);
        for (size_t i = 0; i < cache.size() / 2; ++i) {
          const uint16_t h = Fp32ToFp16(static_cast<float>(i % 97) / 97.0f - 0.5f);
          std::memcpy(cache.data() + 2 * i, &h, 2);  // any finite pattern is fine for f32 too
        }
        if (type == GgmlType::kQ8_0) {  // the cache is a list of 34-byte blocks: finite scales
          const uint16_t scale = Fp32ToFp16(0.01f);
          for (size_t b = 0; b < cache.size() / 34; ++b)
            std::memcpy(cache.data() + 34 * b, &scale, 2);
        }
        PagedKvView kv;
        kv.k = {cache.data(), type, static_cast<int64_t>(region), static_cast<int64_t>(tile)};
        kv.v = {cache.data() + n_kv * tile, type, static_cast<int64_t>(region),
                static_cast<int64_t>(tile)};
        kv.block_size = bs;
        kv.n_kv_heads = n_kv;
        kv.head_dim = d;
        kv.n_blocks = n_blocks;
        std::vector<int32_t> indptr = {0}, indices(n_blocks), seq(n_tokens), nv(n_tokens, ctx);
        for (int32_t i = 0; i < n_blocks; ++i) indices[i] = i;
        std::shuffle(indices.begin(), indices.end(), rng);
        for (int32_t t = 0; t < n_tokens; ++t) {
          seq[t] = t;
          indptr.push_back((t + 1) * blocks_per_seq);
        }
        const std::vector<float> q = RandomVector(static_cast<size_t>(n_tokens) * n_heads * d, rng);
        std::vector<float> out(q.size());
        const AttentionBatch batch{seq, indptr, indices, nv, {}, {}};
        double us[2];
        int idx = 0;
        for (ThreadPool* pool : {&pool1, &pool2}) {
          us[idx++] =
              TimePerCall([&] {
                (void)PagedAttention(*pool, kv, batch, q.data(), n_heads, out.data(), 0, scratch);
              }) *
              1e6 / n_tokens;
        }
        const double kv_bytes = 2.0 * ctx * n_kv * row_bytes;
        printf("%-5s %8d %8d %14.2f %14.2f %16.1f\n",
               GgmlTypeName(static_cast<uint32_t>(type)).c_str(), ctx, n_tokens, us[0], us[1],
               kv_bytes / (us[0] * 1e-6) * 1e-9);
        fflush(stdout);
      }
    }
  }
}

// One layer of each default test model (a decode token of Gemma 3 270M has one kv head).
void BenchAttentionShapes() {
  BenchAttention("SmolLM2-135M", 9, 3, 64);
  BenchAttention("Gemma 3 270M", 4, 1, 256);
}

void BenchSmallOps() {
  printf("\n== Row ops (one row, best level)\n");
  std::mt19937 rng(3);
  const std::vector<float> x = RandomVector(4096, rng), w = RandomVector(4096, rng);
  std::vector<float> y(4096);
  const double rms =
      TimePerCall([&] { RmsNorm(x.data(), w.data(), 1, 576, 1e-5f, y.data()); }, 1000);
  const double swi = TimePerCall([&] { SwiGlu(x.data(), w.data(), 1536, y.data()); }, 1000);
  RopeConfig rc;
  rc.n_rot = 64;
  RopeTable table;
  (void)table.Build(rc, 64, std::vector<int32_t>{123});
  std::vector<float> qk = RandomVector(12 * 64, rng);
  const double rope = TimePerCall([&] { table.Apply(qk.data(), 12); }, 1000);
  printf("RmsNorm 576: %.3f us   SwiGlu 1536: %.3f us   RoPE apply 12 heads x 64: %.3f us\n",
         rms * 1e6, swi * 1e6, rope * 1e6);
}

volatile long long g_sink;

// One core reading `bytes` at p (64-byte aligned) with 256-bit loads: the roofline the --stream
// kernels meet (engine_bench --bandwidth's probe, on one thread).
__attribute__((target("avx2"))) void ReadPass256(const uint8_t* p, size_t bytes) {
  __m256i acc = _mm256_setzero_si256();
  for (size_t off = 0; off + 128 <= bytes; off += 128) {
    for (int i = 0; i < 4; ++i) {
      acc = _mm256_add_epi64(acc, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + off) + i));
    }
  }
  alignas(32) long long lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc);
  g_sink = lanes[0] + lanes[3];
}

// --stream: a type's one-token kernel, 1 thread, over 40 matrices of 8192 x 2048 (llama-1b's
// ffn_down; 0.2-1.4 GB, so every byte comes from memory): on the file's rows as MatMul reads them
// in place, and on the interleaved copy where the CPU backend writes one; GB/s of weights against
// one core's plain read of the same buffer.
void BenchStream(GgmlType type) {
  const QuantKernels* k = GetQuantKernels(type);
  const QuantKernels* act = GetQuantKernels(k->vec_dot_type);
  // The types whose one token MatMul gives to a tile kernel.
  const VecDotTileFn in_place =
      k->in_place_tile ? k->in_place_tile : (k->tile_for_one_token ? k->vec_dot_tile : nullptr);
  if (act == nullptr || in_place == nullptr) return;
  constexpr int64_t kIn = 8192, kOut = 2048, kMatrices = 40;
  const auto info = *GgmlTypeInfoOf(static_cast<uint32_t>(type));
  const size_t w_row = GgmlRowBytes(info, kIn);
  const size_t a_row = GgmlRowBytes(*GgmlTypeInfoOf(static_cast<uint32_t>(k->vec_dot_type)), kIn);
  const size_t matrix = w_row * kOut, bytes = matrix * kMatrices;
  using Buffer = std::unique_ptr<uint8_t, platform::AlignedFreeDeleter>;
  Buffer rows(static_cast<uint8_t*>(platform::AlignedAllocLarge(bytes)));
  std::mt19937 rng(7);
  for (int64_t o = 0; o < kOut; ++o) {
    k->quantize(RandomVector(kIn, rng).data(), rows.get() + o * w_row, kIn);
  }
  for (int64_t m = 1; m < kMatrices; ++m) {
    std::memcpy(rows.get() + m * matrix, rows.get(), matrix);
  }
  Buffer copy;
  size_t copy_matrix = 0;
  if (k->interleave != nullptr) {
    copy_matrix = (kOut / quant::kInterleaveRows) * k->interleaved_group_bytes(kIn);
    copy.reset(static_cast<uint8_t*>(platform::AlignedAllocLarge(copy_matrix * kMatrices)));
    for (int64_t m = 0; m < kMatrices; ++m) {
      k->interleave(rows.get() + m * matrix, w_row, kIn, kOut, copy.get() + m * copy_matrix);
    }
  }
  std::vector<uint8_t> a(a_row);
  act->quantize(RandomVector(kIn, rng).data(), a.data(), kIn);
  std::vector<float> y(kOut);
  const double read = bytes / TimePerCall([&] { ReadPass256(rows.get(), bytes); }) * 1e-9;
  const double on_rows =
      bytes / TimePerCall([&] {
        for (int64_t m = 0; m < kMatrices; ++m) {
          in_place(kIn, rows.get() + m * matrix, w_row, kOut, a.data(), a_row, 1, y.data(), kOut);
        }
      }) *
      1e-9;
  double on_copy = 0.0;
  if (copy != nullptr) {
    on_copy = bytes / TimePerCall([&] {
                for (int64_t m = 0; m < kMatrices; ++m) {
                  k->interleaved_tile(kIn, copy.get() + m * copy_matrix, kOut, a.data(), a_row, 1,
                                      y.data(), kOut);
                }
              }) *
              1e-9;
  }
  auto cell = [&](double gbs) {
    return gbs > 0.0 ? absl::StrFormat("%5.1f (%3.0f%%)", gbs, 100.0 * gbs / read)
                     : std::string("       -    ");
  };
  printf("%-6s %8.0f MiB %13.1f %16s %16s\n", GgmlTypeName(static_cast<uint32_t>(type)).c_str(),
         bytes / 1048576.0, read, cell(on_rows).c_str(), cell(on_copy).c_str());
}

// --attention: one decode step's attention kernels on one kv head (K/V rows in L2), ns per
// visible row: the scores of a GQA group, their softmax, the V accumulation (what PagedAttention
// costs where memory is not the bound).
void BenchDecodeKernels(const char* name, int32_t group, int32_t d) {
  printf("\n== Decode attention kernels (%s: %d heads a kv head, head_dim %d), 1 thread, ns/row\n",
         name, group, d);
  printf("%-5s %8s %10s %10s %10s %10s\n", "kv", "rows", "scores", "softmax", "V", "total");
  const OpKernels& k = GetOpKernels(BestCpuLevel());
  constexpr int64_t kRows = 1024;
  std::mt19937 rng(5);
  for (GgmlType type : {GgmlType::kF16, GgmlType::kQ8_0}) {
    KvElem elem;
    (void)KvElemOf(type, &elem);
    const size_t row_bytes = type == GgmlType::kQ8_0 ? d / 32 * 34 : d * 2;
    std::vector<uint8_t> k_rows(kRows * row_bytes), v_rows(kRows * row_bytes);
    const QuantizeRowFn to_q8 = ActivationQuantizer(GgmlType::kQ8_0, BestCpuLevel());
    for (std::vector<uint8_t>* rows : {&k_rows, &v_rows}) {
      for (int64_t r = 0; r < kRows; ++r) {
        const std::vector<float> x = RandomVector(d, rng);
        uint8_t* row = rows->data() + r * row_bytes;
        if (type == GgmlType::kQ8_0) {
          to_q8(x.data(), row, d);
        } else {
          for (int32_t i = 0; i < d; ++i) {
            const uint16_t h = Fp32ToFp16(x[i]);
            std::memcpy(row + 2 * i, &h, 2);
          }
        }
      }
    }
    std::vector<const void*> k_list(kRows), v_list(kRows);
    for (int64_t r = 0; r < kRows; ++r) {
      k_list[r] = k_rows.data() + r * row_bytes;
      v_list[r] = v_rows.data() + r * row_bytes;
    }
    const std::vector<float> q = RandomVector(static_cast<size_t>(group) * d, rng);
    std::vector<uint8_t> q8(group * (d / 32) * 34);
    for (int32_t g = 0; g < group; ++g) to_q8(q.data() + g * d, q8.data() + g * (d / 32) * 34, d);
    std::vector<float> scores(group * kRows), p(group * kRows), out(group * d);
    const double scores_s = TimePerCall([&] {
      if (type == GgmlType::kQ8_0) {
        k.kv_scores_rows_q8_0(q8.data(), group, k_list.data(), kRows, d, scores.data(), kRows);
      } else {
        k.kv_scores_rows(q.data(), group, k_list.data(), kRows, elem, d, scores.data(), kRows);
      }
    });
    const double softmax_s = TimePerCall([&] {
      for (int32_t g = 0; g < group; ++g) {
        float* pg = p.data() + g * kRows;
        std::copy(scores.begin() + g * kRows, scores.begin() + (g + 1) * kRows, pg);
        k.scale(pg, 0.125f, kRows);
        const double sum = k.softmax_exp(pg, k.max(pg, kRows), kRows, pg);
        k.scale(pg, static_cast<float>(1.0 / sum), kRows);
      }
    });
    const double v_s = TimePerCall([&] {
      std::fill(out.begin(), out.end(), 0.0f);
      k.kv_accumulate_rows(out.data(), p.data(), kRows, group, v_list.data(), kRows, elem, d);
    });
    const double ns = 1e9 / kRows;
    printf("%-5s %8lld %10.2f %10.2f %10.2f %10.2f\n",
           GgmlTypeName(static_cast<uint32_t>(type)).c_str(), static_cast<long long>(kRows),
           scores_s * ns, softmax_s * ns, v_s * ns, (scores_s + softmax_s + v_s) * ns);
    fflush(stdout);
  }
}

// --attention: one decode token's attention over a whole model's layers, as the
// engine reads them: a tile-major pool (kv_storage.h) whose blocks were handed out in order, so
// each kv head's rows of a layer are one run of memory, and every layer's K/V together far beyond
// the caches. GB/s of K/V read against one core's plain read of the same pool.
void BenchAttentionFromMemory(const char* name, int32_t n_layers, int32_t n_heads, int32_t n_kv,
                              int32_t d) {
  printf(
      "\n== Decode attention from memory (%s: %d layers, %d q heads, %d kv heads, head_dim "
      "%d), 1 thread\n",
      name, n_layers, n_heads, n_kv, d);
  printf("%-5s %8s %10s %13s %14s %16s\n", "kv", "context", "pool MiB", "read GB/s", "ns/row",
         "GB/s (share)");
  constexpr int32_t kBlock = 16;
  ThreadPool pool(1);
  Scratch scratch;
  std::mt19937 rng(3);
  for (GgmlType type : {GgmlType::kF16, GgmlType::kQ8_0}) {
    const size_t row_bytes = type == GgmlType::kQ8_0 ? d / 32 * 34 : d * 2;
    const size_t tile = kBlock * row_bytes;
    for (int32_t ctx : {1024, 4096}) {
      const int32_t n_blocks = ctx / kBlock;
      const size_t head_run = n_blocks * tile;  // one tile index of every block
      // Several copies of the model's layers, so that together they are far beyond the L3 (a
      // decode step's weights evict the K/V between two steps).
      const int32_t copies = static_cast<int32_t>(std::max<size_t>(
          1, (size_t{512} << 20) / (static_cast<size_t>(n_layers) * 2 * n_kv * head_run)));
      const int32_t n_views = n_layers * copies;
      const size_t bytes = static_cast<size_t>(n_views) * 2 * n_kv * head_run;
      std::unique_ptr<uint8_t, platform::AlignedFreeDeleter> pool_bytes(
          static_cast<uint8_t*>(platform::AlignedAllocLarge(bytes)));
      uint8_t* base = pool_bytes.get();
      for (size_t i = 0; i < bytes / 2; ++i) {  // finite f16 values; q8_0 scales set below
        const uint16_t h = Fp32ToFp16(static_cast<float>(i % 97) / 97.0f - 0.5f);
        std::memcpy(base + 2 * i, &h, 2);
      }
      if (type == GgmlType::kQ8_0) {
        const uint16_t scale = Fp32ToFp16(0.01f);
        for (size_t b = 0; b < bytes / 34; ++b) std::memcpy(base + 34 * b, &scale, 2);
      }
      std::vector<int32_t> indptr = {0, n_blocks}, indices(n_blocks), seq = {0}, nv = {ctx};
      for (int32_t i = 0; i < n_blocks; ++i) indices[i] = i;
      const AttentionBatch batch{seq, indptr, indices, nv, {}, {}};
      const std::vector<float> q = RandomVector(static_cast<size_t>(n_heads) * d, rng);
      std::vector<float> out(q.size());
      auto layer_view = [&](int32_t layer) {
        PagedKvView kv;
        uint8_t* k = base + static_cast<size_t>(layer) * 2 * n_kv * head_run;
        kv.k = {k, type, static_cast<int64_t>(tile), static_cast<int64_t>(head_run)};
        kv.v = {k + n_kv * head_run, type, static_cast<int64_t>(tile),
                static_cast<int64_t>(head_run)};
        kv.block_size = kBlock;
        kv.n_kv_heads = n_kv;
        kv.head_dim = d;
        kv.n_blocks = n_blocks;
        return kv;
      };
      const double read = bytes / TimePerCall([&] { ReadPass256(base, bytes); }) * 1e-9;
      const double s = TimePerCall([&] {
        for (int32_t layer = 0; layer < n_views; ++layer) {
          (void)PagedAttention(pool, layer_view(layer), batch, q.data(), n_heads, out.data(), 0,
                               scratch);
        }
      });
      const double gbs = bytes / s * 1e-9;
      printf("%-5s %8d %10.1f %13.1f %14.2f %9.1f (%3.0f%%)\n",
             GgmlTypeName(static_cast<uint32_t>(type)).c_str(), ctx, bytes / 1048576.0, read,
             s * 1e9 / (static_cast<double>(n_views) * n_kv * ctx), gbs, 100.0 * gbs / read);
      fflush(stdout);
    }
  }
}

}  // namespace
}  // namespace kiln::cpu

int main(int argc, char** argv) {
  using namespace kiln;
  std::string type_filter;
  bool tile_only = false;       // --tile: only the matmul kernel comparison
  bool attention_only = false;  // --attention: only the paged-attention table
  bool peak_only = false;       // --peak: only the int8 dot-product peak
  bool stream_only = false;     // --stream: one-token kernels from memory
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--types=", 8) == 0)
      type_filter = absl::StrCat(",", argv[i] + 8, ",");
    if (std::strncmp(argv[i], "--min_ms=", 9) == 0) cpu::g_min_ms = std::atof(argv[i] + 9);
    if (std::strcmp(argv[i], "--tile") == 0) tile_only = true;
    if (std::strcmp(argv[i], "--attention") == 0) attention_only = true;
    if (std::strcmp(argv[i], "--peak") == 0) peak_only = true;
    if (std::strcmp(argv[i], "--stream") == 0) stream_only = true;
  }
  std::vector<GgmlType> types;
  for (int t = 0; t < static_cast<int>(GgmlType::kCount); ++t) {
    if (!GgmlTypeInfoOf(t) || GetQuantKernels(static_cast<GgmlType>(t)) == nullptr) continue;
    if (t == static_cast<int>(GgmlType::kQ8_1) || t == static_cast<int>(GgmlType::kQ8_K)) continue;
    if (!type_filter.empty() &&
        type_filter.find(absl::StrCat(",", GgmlTypeName(t), ",")) == std::string::npos) {
      continue;
    }
    types.push_back(static_cast<GgmlType>(t));
  }
  printf("kiln cpu_ops_bench: cpu level %s, %d physical cores\n", CpuLevelName(BestCpuLevel()),
         cpu::PhysicalCoreCount());
  if (attention_only) {
    cpu::BenchAttentionShapes();
    cpu::BenchDecodeKernels("SmolLM2-135M", 3, 64);
    cpu::BenchDecodeKernels("Gemma 3 270M", 4, 256);
    cpu::BenchAttentionFromMemory("SmolLM2-135M", 30, 9, 3, 64);
    cpu::BenchAttentionFromMemory("Gemma 3 270M", 18, 4, 1, 256);
    return 0;
  }
  if (stream_only) {
    if (BestCpuLevel() == CpuLevel::kScalar) {
      printf("--stream reads the buffers with AVX2 loads: this CPU has none\n");
      return 0;
    }
    printf("one token, 1 thread, from memory: GB/s of weights (share of the plain read)\n");
    printf("%-6s %12s %13s %16s %16s\n", "type", "weights", "read GB/s", "rows in place", "copy");
    for (GgmlType t : types) cpu::BenchStream(t);
    return 0;
  }
  if (peak_only) {
    cpu::PrintInt8Mix(cpu::PrintInt8Peak());
    return 0;
  }
  if (tile_only) {
    const double peak = cpu::PrintInt8Peak();
    for (GgmlType t : types) {
      const QuantKernels* k = GetQuantKernels(t);
      // (AVX2's Q4_1 and Q8_0 have only the integer-order kernel on interleaved rows.)
      if (k->vec_dot_tile != nullptr || k->vec_dot_rows != nullptr ||
          k->interleaved_tile != nullptr) {
        cpu::BenchTile(t, peak);
      }
    }
    return 0;
  }
  cpu::BenchThreadPool();
  cpu::BenchSmallOps();
  cpu::BenchAttentionShapes();
  cpu::BenchMatMul(types);
  const double peak = cpu::PrintInt8Peak();
  for (GgmlType t : types) {
    if (GetQuantKernels(t)->vec_dot_tile != nullptr) cpu::BenchTile(t, peak);
  }
  return 0;
}
