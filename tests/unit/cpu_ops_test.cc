// CPU backend ops (lib/backend/cpu/ops.h) against their plain references (ops_ref.h), plus the
// batch-invariance guarantees: thread pool, matmul, embedding, element-wise ops, RoPE (paged and
// MLA attention: cpu_attention_test). Tolerances are stated next to each comparison.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#ifdef __linux__
#include <sched.h>
#endif

#include "lib/backend/cpu/cpu_backend.h"
#include "lib/backend/cpu/dispatch.h"
#include "lib/backend/cpu/ops.h"
#include "lib/backend/cpu/ops_ref.h"
#include "lib/common/half.h"
#include "lib/quant/activation.h"
#include "tests/common/cpu_test_util.h"

namespace kiln::cpu {
namespace {

using kiln::testing::Levels;
using kiln::testing::RandomVector;

// Types kiln can compute with right now (the quant families land independently).
std::vector<GgmlType> RegisteredTypes() {
  std::vector<GgmlType> out;
  for (int t = 0; t < static_cast<int>(GgmlType::kCount); ++t) {
    const GgmlType type = static_cast<GgmlType>(t);
    if (!GgmlTypeInfoOf(t)) continue;
    if (GetQuantKernels(type) == nullptr) {
      printf("note: type %s has no CPU kernels yet; skipped\n", GgmlTypeName(t).c_str());
      continue;
    }
    out.push_back(type);
  }
  return out;
}

// A [n_out, n_in] weight matrix of `type` quantized from random floats.
std::vector<uint8_t> MakeWeights(GgmlType type, int64_t n_in, int64_t n_out, std::mt19937& rng) {
  const QuantKernels* k = GetQuantKernels(type);
  const size_t row_bytes = GgmlRowBytes(*GgmlTypeInfoOf(static_cast<uint32_t>(type)), n_in);
  std::vector<uint8_t> w(row_bytes * n_out);
  for (int64_t o = 0; o < n_out; ++o) {
    const std::vector<float> row = RandomVector(n_in, rng);
    k->quantize(row.data(), w.data() + o * row_bytes, n_in);
  }
  return w;
}

// ---- ThreadPool ---------------------------------------------------------------------------

TEST(ThreadPoolTest, PhysicalCoresPositive) {
  EXPECT_GE(PhysicalCoreCount(), 1);
  ThreadPool pool;
  EXPECT_EQ(pool.n_threads(), PhysicalCoreCount());
}

TEST(ThreadPoolTest, EveryTaskRunsOnceWithStaticRanges) {
  for (int n_threads : {1, 2, 3, 5}) {
    ThreadPool pool(n_threads);
    std::vector<int> hits;
    std::vector<int> owner;
    // More threads than cores oversubscribes this machine: fewer calls there.
    const int n_calls = n_threads <= PhysicalCoreCount() ? 3000 : 300;
    for (int call = 0; call < n_calls; ++call) {
      const int64_t n_tasks = call % 37;  // includes 0, 1 and fewer tasks than threads
      hits.assign(n_tasks, 0);
      owner.assign(n_tasks, -1);
      pool.ParallelFor(n_tasks, [&](int64_t b, int64_t e, int thread) {
        for (int64_t i = b; i < e; ++i) {
          ++hits[i];
          owner[i] = thread;
        }
      });
      for (int64_t i = 0; i < n_tasks; ++i) {
        ASSERT_EQ(hits[i], 1) << "call " << call << " task " << i;
        if (n_tasks > 1) {
          int64_t b, e;
          ThreadPool::StaticRange(n_tasks, n_threads, owner[i], &b, &e);
          ASSERT_TRUE(i >= b && i < e) << "task " << i << " ran on thread " << owner[i];
        }
      }
    }
  }
}

TEST(ThreadPoolTest, NestedCallRunsInline) {
  ThreadPool pool(2);
  std::vector<int> hits(8 * 10, 0);
  pool.ParallelFor(8, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) {
      pool.ParallelFor(10, [&](int64_t b2, int64_t e2, int) {
        for (int64_t j = b2; j < e2; ++j) ++hits[i * 10 + j];
      });
    }
  });
  for (int h : hits) EXPECT_EQ(h, 1);
}

// The wall-clock tracing (engine_bench --pool-breakdown): jobs counted, the caller's time between
// its jobs (here 2 ms sleeps) and inside its ranges (1 ms busy waits) accounted, every worker
// start counted; nothing while tracing is off.
TEST(ThreadPoolTest, WaitTracingAccountsTheCallersTime) {
  ThreadPool pool(2);
  auto busy_ms = [](double ms) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(ms / 1e3);
    while (std::chrono::steady_clock::now() < end) {
    }
  };
  auto jobs = [&](int n) {
    for (int i = 0; i < n; ++i) {
      if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      pool.ParallelFor(2, [&](int64_t, int64_t, int) { busy_ms(1.0); });
    }
  };
  ThreadPool::TakeWaitStats();
  jobs(3);  // untraced
  ThreadPool::WaitStats w = ThreadPool::TakeWaitStats();
  EXPECT_EQ(w.jobs, 0);
  EXPECT_EQ(w.worker_wakes, 0);
  EXPECT_EQ(w.caller_between_seconds, 0.0);
  ThreadPool::SetWaitTracing(true, /*cpu_time=*/false);
  jobs(5);
  ThreadPool::SetWaitTracing(false);
  w = ThreadPool::TakeWaitStats();
  EXPECT_EQ(w.jobs, 5);
  EXPECT_GE(w.caller_between_seconds, 4 * 2e-3);  // the 4 gaps between the 5 jobs
  EXPECT_GE(w.caller_range_seconds + w.worker_range_seconds, 5 * 2 * 1e-3);
  EXPECT_EQ(w.caller_range_cpu_seconds + w.worker_range_cpu_seconds, 0.0);  // cpu_time off
  EXPECT_GE(w.worker_wakes, 1);  // the worker starts most jobs (the caller may take its range)
  EXPECT_LE(w.worker_wakes, 5);
  EXPECT_GE(w.worker_wake_seconds, 0.0);
}

TEST(ThreadPoolTest, ConcurrentCallersAreSerialized) {
  ThreadPool pool(2);
  std::vector<int64_t> sums(4, 0);
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&, c] {
      for (int call = 0; call < 500; ++call) {
        std::vector<int64_t> part(2, 0);
        pool.ParallelFor(100, [&](int64_t b, int64_t e, int t) {
          for (int64_t i = b; i < e; ++i) part[t] += i;
        });
        sums[c] += part[0] + part[1];
      }
    });
  }
  for (auto& t : callers) t.join();
  for (int64_t s : sums) EXPECT_EQ(s, 500 * 4950);
}

// pin_workers: a worker runs bound to one CPU, another than the first allowed core's (which is
// left to the callers); the caller stays unpinned; results as without pinning.
TEST(ThreadPoolTest, PinnedWorkersRunOnOneCpuEach) {
#ifndef __linux__
  GTEST_SKIP() << "the affinity check reads Linux's sched_getaffinity";
#else
  cpu_set_t before;
  ASSERT_EQ(sched_getaffinity(0, sizeof(before), &before), 0);
  if (PhysicalCoreCount() < 2) GTEST_SKIP() << "one core: nothing to pin apart";
  const int first_allowed = [&] {
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (CPU_ISSET(cpu, &before)) return cpu;
    }
    return -1;
  }();
  ThreadPool pool(2, /*spin_us=*/200, /*pin_workers=*/true);
  EXPECT_TRUE(pool.pin_workers());
  const std::thread::id caller = std::this_thread::get_id();
  // Until the worker has run a range: the caller, in its own range, waits a while for it (a
  // caller done first would claim the worker's range too).
  std::atomic<int> worker_cpus{0}, worker_cpu{-1};
  int64_t total = 0;
  for (int call = 0; call < 100 && worker_cpus.load() == 0; ++call) {
    std::vector<int64_t> v(64, 0);
    pool.ParallelFor(64, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) v[i] = i;
      if (std::this_thread::get_id() == caller) {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
        while (worker_cpus.load() == 0 && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::yield();
        }
        return;
      }
      cpu_set_t mine;
      CPU_ZERO(&mine);
      if (sched_getaffinity(0, sizeof(mine), &mine) != 0) return;
      worker_cpus.store(CPU_COUNT(&mine));
      for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (CPU_ISSET(cpu, &mine)) worker_cpu.store(cpu);
      }
    });
    for (int64_t x : v) total += x;
  }
  ASSERT_GT(worker_cpus.load(), 0) << "the worker never ran a range";
  EXPECT_EQ(worker_cpus.load(), 1);
  EXPECT_NE(worker_cpu.load(), first_allowed);
  EXPECT_TRUE(CPU_ISSET(worker_cpu.load(), &before));
  EXPECT_EQ(total % (64 * 63 / 2), 0);
  cpu_set_t after;
  ASSERT_EQ(sched_getaffinity(0, sizeof(after), &after), 0);
  EXPECT_TRUE(CPU_EQUAL(&before, &after)) << "the caller's own affinity changed";
#endif
}

// Busy threads keep every core wanted, so pool threads are often not running when a job
// arrives and their ranges are run by whichever pool thread gets there first. Asserts the
// results and the range contract (every task once, in its static range; no two threads inside
// ranges with the same index at once), never how long it took.
TEST(ThreadPoolTest, CompletesUnderCompetingBusyThreads) {
  struct BusyThreads {  // one spinning thread per core until the test ends (also on failure)
    std::atomic<bool> stop{false};
    std::vector<std::thread> threads;
    BusyThreads() {
      for (int i = 0; i < PhysicalCoreCount(); ++i) {
        threads.emplace_back([this] {
          volatile uint64_t sink = 0;
          while (!stop.load(std::memory_order_relaxed)) sink = sink + 1;
        });
      }
    }
    ~BusyThreads() {
      stop.store(true);
      for (auto& t : threads) t.join();
    }
  } busy;
  for (int n_threads : {2, 3}) {
    ThreadPool pool(n_threads);
    std::vector<std::atomic<int>> in_range(n_threads);
    for (int call = 0; call < 400; ++call) {
      const int64_t n_tasks = 50 + call % 31;  // more tasks than threads
      std::vector<int64_t> value(n_tasks, 0);
      std::vector<int> owner(n_tasks, -1);
      std::atomic<int> overlaps{0};
      pool.ParallelFor(n_tasks, [&](int64_t b, int64_t e, int range) {
        if (in_range[range].fetch_add(1) != 0) overlaps.fetch_add(1);
        for (int64_t i = b; i < e; ++i) {
          int64_t v = i;
          for (int k = 0; k < 200; ++k) v = (v * 31 + k) % 1000003;  // some work per task
          value[i] += v + 1;
          owner[i] = range;
        }
        in_range[range].fetch_sub(1);
      });
      ASSERT_EQ(overlaps.load(), 0) << "two threads ran range indices at once, call " << call;
      for (int64_t i = 0; i < n_tasks; ++i) {
        int64_t want = i;
        for (int k = 0; k < 200; ++k) want = (want * 31 + k) % 1000003;
        ASSERT_EQ(value[i], want + 1)
            << "threads " << n_threads << " call " << call << " task " << i;
        int64_t b, e;
        ThreadPool::StaticRange(n_tasks, n_threads, owner[i], &b, &e);
        ASSERT_TRUE(i >= b && i < e) << "task " << i << " ran as range " << owner[i];
      }
    }
  }
}

// ---- MatMul -------------------------------------------------------------------------------

TEST(MatMulTest, EveryOutputIsOneVecDotAndMatchesReference) {
  std::mt19937 rng(1);
  const int64_t n_in = 512, n_out = 67, n_tokens = 7;  // n_out not a multiple of the tile
  ThreadPool pool(2);
  Scratch scratch;
  for (GgmlType type : RegisteredTypes()) {
    SCOPED_TRACE(GgmlTypeName(static_cast<uint32_t>(type)));
    const std::vector<uint8_t> w = MakeWeights(type, n_in, n_out, rng);
    const WeightView wv{type, w.data(), n_in, n_out};
    const std::vector<float> x = RandomVector(n_in * n_tokens, rng);
    for (CpuLevel level : Levels()) {
      SCOPED_TRACE(CpuLevelName(level));
      std::vector<float> y(n_tokens * n_out);
      ASSERT_TRUE(MatMul(pool, wv, x.data(), n_tokens, y.data(), scratch, level).ok());
      // Bitwise: y[t, o] == vec_dot(W row o, quantize(x row t)) at this level.
      const QuantKernels* k = GetQuantKernels(type, level);
      const size_t row_bytes = GgmlRowBytes(*GgmlTypeInfoOf(static_cast<uint32_t>(type)), n_in);
      for (int64_t t = 0; t < n_tokens; ++t) {
        std::vector<uint8_t> a;
        const void* act = x.data() + t * n_in;
        if (k->vec_dot_type != GgmlType::kF32) {
          const QuantKernels* ak = GetQuantKernels(k->vec_dot_type, level);
          ASSERT_NE(ak, nullptr);
          a.resize(GgmlRowBytes(*GgmlTypeInfoOf(static_cast<uint32_t>(k->vec_dot_type)), n_in));
          ak->quantize(x.data() + t * n_in, a.data(), n_in);
          act = a.data();
        }
        for (int64_t o = 0; o < n_out; ++o) {
          const float expect = k->vec_dot(n_in, w.data() + o * row_bytes, act);
          ASSERT_EQ(Fp32ToBits(y[t * n_out + o]), Fp32ToBits(expect)) << "t " << t << " o " << o;
        }
      }
      // Against the double-precision reference on dequantized operands: the only differences
      // are the kernel's float accumulation, so |diff| <= 1e-4 * sum |w_i a_i| + 1e-5.
      std::vector<float> yr(n_tokens * n_out);
      ASSERT_TRUE(ref::MatMul(wv, x.data(), n_tokens, yr.data(), true).ok());
      std::vector<float> wrow(n_in);
      for (int64_t o = 0; o < n_out; ++o) {
        GetQuantKernels(type)->dequantize(w.data() + o * row_bytes, wrow.data(), n_in);
        for (int64_t t = 0; t < n_tokens; ++t) {
          double mag = 0.0;
          for (int64_t i = 0; i < n_in; ++i) mag += std::fabs(wrow[i] * x[t * n_in + i]);
          ASSERT_NEAR(y[t * n_out + o], yr[t * n_out + o], 1e-4 * mag + 1e-5)
              << "t " << t << " o " << o;
        }
      }
    }
  }
}

TEST(MatMulTest, BatchAndThreadInvariant) {
  std::mt19937 rng(2);
  const int64_t n_in = 256, n_out = 300, n_batch = 7;
  ThreadPool pool1(1), pool2(2);
  Scratch scratch;
  for (GgmlType type : RegisteredTypes()) {
    SCOPED_TRACE(GgmlTypeName(static_cast<uint32_t>(type)));
    const std::vector<uint8_t> w = MakeWeights(type, n_in, n_out, rng);
    const WeightView wv{type, w.data(), n_in, n_out};
    const std::vector<float> x = RandomVector(n_in * n_batch, rng);
    std::vector<float> batch1(n_batch * n_out), batch2(n_batch * n_out);
    ASSERT_TRUE(MatMul(pool1, wv, x.data(), n_batch, batch1.data(), scratch).ok());
    ASSERT_TRUE(MatMul(pool2, wv, x.data(), n_batch, batch2.data(), scratch).ok());
    EXPECT_EQ(0, std::memcmp(batch1.data(), batch2.data(), batch1.size() * 4)) << "1 vs 2 threads";
    for (int64_t t = 0; t < n_batch; ++t) {
      std::vector<float> single(n_out);
      for (ThreadPool* pool : {&pool1, &pool2}) {
        ASSERT_TRUE(MatMul(*pool, wv, x.data() + t * n_in, 1, single.data(), scratch).ok());
        EXPECT_EQ(0, std::memcmp(single.data(), batch2.data() + t * n_out, n_out * 4))
            << "token " << t << " alone vs in the batch";
      }
    }
    // A different batch around token 3: its row must not change.
    std::vector<float> other = RandomVector(n_in * 3, rng);
    std::copy(x.begin() + 3 * n_in, x.begin() + 4 * n_in, other.begin() + n_in);
    std::vector<float> y3(3 * n_out);
    ASSERT_TRUE(MatMul(pool2, wv, other.data(), 3, y3.data(), scratch).ok());
    EXPECT_EQ(0, std::memcmp(y3.data() + n_out, batch2.data() + 3 * n_out, n_out * 4));
    // MatMulRows picks rows (logits for selected tokens only).
    const std::vector<int32_t> rows = {6, 0, 3};
    std::vector<float> yr(rows.size() * n_out);
    ASSERT_TRUE(MatMulRows(pool2, wv, x.data(), n_batch, rows, yr.data(), scratch).ok());
    for (size_t r = 0; r < rows.size(); ++r) {
      EXPECT_EQ(0, std::memcmp(yr.data() + r * n_out, batch2.data() + rows[r] * n_out, n_out * 4));
    }
  }
}

// Row ranges (an output head in parts): the outputs of each range are the whole matmul's, bit
// for bit, and the columns outside the range stay as they were. Every registered type, on the
// file layout and (through the CPU backend) on the interleaved copies of the prepared weights.
TEST(MatMulTest, RowRangesEqualTheWholeMatMulBitwise) {
  std::mt19937 rng(3);
  const int64_t n_in = 256, n_out = 300;  // the last range ends inside a tile
  // Ranges of 1, 2 and several tiles, then the partial last one.
  const std::vector<std::pair<int64_t, int64_t>> ranges = {
      {0, 16}, {16, 48}, {48, 48}, {48, 256}, {256, 300}};
  ThreadPool pool(2);
  Scratch scratch;
  cpu::CpuBackend backend(2);
  const float kUntouched = 7.5f;
  for (GgmlType type : RegisteredTypes()) {
    SCOPED_TRACE(GgmlTypeName(static_cast<uint32_t>(type)));
    const std::vector<uint8_t> w = MakeWeights(type, n_in, n_out, rng);
    WeightView prepared{type, w.data(), n_in, n_out};
    WeightView* const matrices[] = {&prepared};
    auto store = backend.PrepareWeights(matrices, /*release_file_pages=*/false);
    ASSERT_TRUE(store.ok()) << store.status();
    for (int64_t n_tokens : {1, 5}) {
      SCOPED_TRACE(n_tokens);
      const std::vector<float> x = RandomVector(n_in * n_tokens, rng);
      const WeightView file{type, w.data(), n_in, n_out};
      std::vector<float> whole(n_tokens * n_out), whole_prepared(n_tokens * n_out);
      ASSERT_TRUE(MatMul(pool, file, x.data(), n_tokens, whole.data(), scratch).ok());
      ASSERT_TRUE(backend.MatMul(prepared, x.data(), n_tokens, whole_prepared.data()).ok());
      std::vector<float> parts(n_tokens * n_out, kUntouched);
      std::vector<float> parts_prepared(n_tokens * n_out, kUntouched);
      for (const auto& [begin, end] : ranges) {
        ASSERT_TRUE(
            MatMulRange(pool, file, x.data(), n_tokens, begin, end, parts.data(), scratch).ok());
        ASSERT_TRUE(
            backend.MatMulRange(prepared, x.data(), n_tokens, begin, end, parts_prepared.data())
                .ok());
        for (int64_t t = 0; t < n_tokens; ++t) {  // later ranges not written yet
          for (int64_t o = end; o < n_out; ++o) {
            ASSERT_EQ(parts[t * n_out + o], kUntouched) << "t " << t << " o " << o;
            ASSERT_EQ(parts_prepared[t * n_out + o], kUntouched) << "t " << t << " o " << o;
          }
        }
      }
      EXPECT_EQ(0, std::memcmp(parts.data(), whole.data(), whole.size() * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(parts_prepared.data(), whole_prepared.data(),
                               whole.size() * sizeof(float)));
    }
  }
}

// One input by several matrices as one job (a layer's Q, K and V; gate and up): each output has
// MatMul's bits. Every registered type beside Q8_0 (another activation format, except for Q8_0
// itself) and f32 (the f32 copy of one token's input), on the file's rows and on the prepared
// copies, at 1 to 3 threads, for one token, a few and more than a token block.
TEST(MatMulTest, EachEqualsOneMatMulPerWeight) {
  std::mt19937 rng(11);
  const int64_t n_in = 256;
  const int64_t n_outs[] = {300, 48, 16};  // more rows than threads, and fewer chunks
  ThreadPool pools[] = {ThreadPool(1), ThreadPool(2), ThreadPool(3)};
  Scratch scratch;
  CpuBackend backend(2);
  for (GgmlType type : RegisteredTypes()) {
    SCOPED_TRACE(GgmlTypeName(static_cast<uint32_t>(type)));
    const GgmlType types[] = {type, GgmlType::kQ8_0, GgmlType::kF32};
    std::vector<std::vector<uint8_t>> w;
    std::vector<WeightView> file, prepared;
    for (int i = 0; i < 3; ++i) {
      w.push_back(MakeWeights(types[i], n_in, n_outs[i], rng));
      file.push_back(WeightView{types[i], w[i].data(), n_in, n_outs[i]});
    }
    prepared = file;
    std::vector<WeightView*> matrices;
    for (WeightView& v : prepared) matrices.push_back(&v);
    auto store = backend.PrepareWeights(matrices, /*release_file_pages=*/false);
    ASSERT_TRUE(store.ok()) << store.status();
    (*store)->WaitUntilPrepared();
    for (int64_t n_tokens : {1, 5, 70}) {
      SCOPED_TRACE(n_tokens);
      const std::vector<float> x = RandomVector(n_in * n_tokens, rng);
      for (const std::vector<WeightView>* views : {&file, &prepared}) {
        std::vector<std::vector<float>> one(3), each(3);
        std::vector<MatMulTarget> targets;
        for (int i = 0; i < 3; ++i) {
          one[i].resize(n_tokens * n_outs[i]);
          each[i].assign(n_tokens * n_outs[i], 7.5f);
          targets.push_back({&(*views)[i], each[i].data()});
          ASSERT_TRUE(backend.MatMul((*views)[i], x.data(), n_tokens, one[i].data()).ok());
        }
        auto expect_same = [&](const char* what) {
          for (int i = 0; i < 3; ++i) {
            EXPECT_EQ(0, std::memcmp(one[i].data(), each[i].data(), one[i].size() * 4))
                << what << ", matrix " << i;
            std::fill(each[i].begin(), each[i].end(), 7.5f);
          }
        };
        ASSERT_TRUE(backend.MatMulEach(x.data(), n_tokens, targets).ok());
        expect_same("backend");
        for (ThreadPool& pool : pools) {
          ASSERT_TRUE(MatMulEach(pool, x.data(), n_tokens, targets, scratch).ok());
          expect_same((std::to_string(pool.n_threads()) + " threads").c_str());
        }
      }
    }
  }
}

TEST(MatMulTest, EachErrors) {
  ThreadPool pool(2);
  Scratch scratch;
  CpuBackend backend(2);
  std::vector<float> w(64 * 4, 0.5f), x(64, 1.0f), y(8);
  const WeightView a{GgmlType::kF32, w.data(), 64, 4}, b{GgmlType::kF32, w.data(), 32, 8};
  const MatMulTarget differ[] = {{&a, y.data()}, {&b, y.data()}};
  absl::Status s = MatMulEach(pool, x.data(), 1, differ, scratch);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("one input must fit every weight"), std::string::npos) << s;
  EXPECT_EQ(backend.MatMulEach(x.data(), 1, differ).code(), absl::StatusCode::kInvalidArgument);
  const MatMulTarget null_weight[] = {{&a, y.data()}, {nullptr, y.data()}};
  s = MatMulEach(pool, x.data(), 1, null_weight, scratch);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("weight is null"), std::string::npos) << s;
  const MatMulTarget null_out[] = {{&a, nullptr}};
  EXPECT_EQ(MatMulEach(pool, x.data(), 1, null_out, scratch).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MatMulEach(pool, x.data(), -1, null_out, scratch).code(),
            absl::StatusCode::kInvalidArgument);
  const WeightView iq{GgmlType::kIQ2_XXS, w.data(), 64, 1};
  const MatMulTarget no_kernels[] = {{&a, y.data()}, {&iq, y.data()}};
  s = MatMulEach(pool, x.data(), 1, no_kernels, scratch);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
}

// The copies are written in the background: the matmuls run at once on the rows and give the same
// bits before, while and after the copies are written; a store destroyed while writing stops its
// writer first (ASan, TSan). Q4_1 (the integer order's x16 copy) and, where the level copies it
// (AVX-512), Q6_K (the K-quants' quads).
TEST(MatMulTest, BackgroundCopiesGiveTheSameBits) {
  std::mt19937 rng(8);
  const int64_t n_in = 2048, n_out = 1000;  // 1.1-1.7 MB each; the last group partial
  const bool k_quant_copy = GetQuantKernels(GgmlType::kQ6_K)->interleave != nullptr;
  std::vector<std::vector<uint8_t>> weights;
  std::vector<WeightView> views;
  for (int i = 0; i < 8; ++i) {
    const GgmlType type = i % 2 == 1 && k_quant_copy ? GgmlType::kQ6_K : GgmlType::kQ4_1;
    weights.push_back(MakeWeights(type, n_in, n_out, rng));
    views.push_back(WeightView{type, weights.back().data(), n_in, n_out});
  }
  std::vector<WeightView*> matrices;
  for (WeightView& v : views) matrices.push_back(&v);
  CpuBackend backend(2);
  const std::vector<float> x = RandomVector(n_in * 9, rng);
  auto run_all = [&](int64_t n_tokens) {
    std::vector<float> y(views.size() * n_tokens * n_out);
    for (size_t i = 0; i < views.size(); ++i) {
      EXPECT_TRUE(
          backend.MatMul(views[i], x.data(), n_tokens, y.data() + i * n_tokens * n_out).ok());
    }
    return y;
  };
  auto store = PrepareCpuWeights(matrices, /*release_file_pages=*/false);
  ASSERT_TRUE(store.ok()) << store.status();
  for (const WeightView& v : views) {
    ASSERT_NE(v.interleaved, nullptr);
    ASSERT_NE(v.copied_rows, nullptr);
    ASSERT_TRUE(v.in_place);
  }
  const std::vector<float> early1 = run_all(1), early9 = run_all(9);
  (*store)->WaitUntilPrepared();
  for (const WeightView& v : views) EXPECT_EQ(v.InterleavedRows(), n_out);
  const std::vector<float> late1 = run_all(1), late9 = run_all(9);
  EXPECT_EQ(0, std::memcmp(early1.data(), late1.data(), late1.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(early9.data(), late9.data(), late9.size() * sizeof(float)));
  // The copy's rows, as the file's (an embedding lookup reads them).
  for (int i : {0, 1}) {
    std::vector<float> from_copy(n_in), from_file(n_in);
    const int32_t token = static_cast<int32_t>(n_out - 1);
    ASSERT_TRUE(backend.EmbeddingGather(views[i], {&token, 1}, from_copy.data()).ok());
    ASSERT_TRUE(backend
                    .EmbeddingGather(WeightView{views[i].type, weights[i].data(), n_in, n_out},
                                     {&token, 1}, from_file.data())
                    .ok());
    EXPECT_EQ(0, std::memcmp(from_copy.data(), from_file.data(), n_in * sizeof(float)));
  }
  for (int i = 0; i < 3; ++i) {  // destroyed while (most likely) still writing
    auto again = PrepareCpuWeights(matrices, false);
    ASSERT_TRUE(again.ok());
  }
}

// A copy still being written needs the in-place kernel for its other rows: a view without it is
// refused with a message, not computed in another order.
TEST(MatMulTest, PartlyCopiedWithoutInPlaceIsAnError) {
  std::mt19937 rng(9);
  const int64_t n_in = 64, n_out = 48;
  const std::vector<uint8_t> w = MakeWeights(GgmlType::kQ4_1, n_in, n_out, rng);
  WeightView v{GgmlType::kQ4_1, w.data(), n_in, n_out};
  WeightView* const matrices[] = {&v};
  auto store = PrepareCpuWeights(matrices, /*release_file_pages=*/false);
  ASSERT_TRUE(store.ok()) << store.status();
  (*store)->WaitUntilPrepared();
  const std::atomic<int64_t> first_group{16};
  v.copied_rows = &first_group;
  v.in_place = false;
  ThreadPool pool(1);
  Scratch scratch;
  const std::vector<float> x = RandomVector(n_in, rng);
  std::vector<float> y(n_out);
  const absl::Status s = MatMul(pool, v, x.data(), 1, y.data(), scratch);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_NE(s.message().find("partly copied"), std::string_view::npos) << s.message();
}

TEST(MatMulTest, RowRangeErrors) {
  ThreadPool pool(1);
  Scratch scratch;
  std::vector<float> w(64 * 40, 0.5f), x(64, 1.0f), y(40);
  const WeightView wv{GgmlType::kF32, w.data(), 64, 40};
  absl::Status s = MatMulRange(pool, wv, x.data(), 1, 8, 32, y.data(), scratch);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("[8, 32)"), std::string::npos) << s;
  s = MatMulRange(pool, wv, x.data(), 1, 16, 24, y.data(), scratch);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("multiples of 16"), std::string::npos) << s;
  s = MatMulRange(pool, wv, x.data(), 1, 32, 48, y.data(), scratch);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(s.message().find("40 weight rows"), std::string::npos) << s;
  s = MatMulRange(pool, wv, x.data(), 1, 32, 16, y.data(), scratch);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  if (GetQuantKernels(GgmlType::kF32) != nullptr) {  // a range ending on the last row
    EXPECT_TRUE(MatMulRange(pool, wv, x.data(), 1, 32, 40, y.data(), scratch).ok());
  }
}

TEST(MatMulTest, Errors) {
  ThreadPool pool(1);
  Scratch scratch;
  std::vector<float> w(64 * 4, 0.5f), x(64 * 2, 1.0f), y(8);
  if (GetQuantKernels(GgmlType::kF32) != nullptr) {
    const WeightView wv{GgmlType::kF32, w.data(), 64, 4};
    const std::vector<int32_t> bad_rows = {0, 2};
    const absl::Status s = MatMulRows(pool, wv, x.data(), 2, bad_rows, y.data(), scratch);
    EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
    EXPECT_NE(s.message().find("rows[1]"), std::string::npos) << s;
  }
  EXPECT_FALSE(
      MatMul(pool, WeightView{GgmlType::kF32, nullptr, 64, 4}, x.data(), 1, y.data(), scratch)
          .ok());
  EXPECT_FALSE(
      MatMul(pool, WeightView{GgmlType::kIQ2_XXS, w.data(), 256, 1}, x.data(), 1, y.data(), scratch)
          .ok());
  if (GetQuantKernels(GgmlType::kQ4_0) != nullptr) {
    const absl::Status s =
        MatMul(pool, WeightView{GgmlType::kQ4_0, w.data(), 48, 2}, x.data(), 1, y.data(), scratch);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("n_in 48"), std::string::npos) << s;
  }
}

// ---- Embedding ----------------------------------------------------------------------------

TEST(EmbeddingTest, MatchesReferenceExactly) {
  std::mt19937 rng(3);
  const int64_t n_embd = 256, n_vocab = 11;
  const std::vector<int32_t> tokens = {3, 0, 10, 3};
  for (GgmlType type : RegisteredTypes()) {
    SCOPED_TRACE(GgmlTypeName(static_cast<uint32_t>(type)));
    const std::vector<uint8_t> table = MakeWeights(type, n_embd, n_vocab, rng);
    const WeightView tv{type, table.data(), n_embd, n_vocab};
    std::vector<float> out(tokens.size() * n_embd), expect(out.size());
    ASSERT_TRUE(EmbeddingGather(tv, tokens, out.data()).ok());
    ASSERT_TRUE(ref::EmbeddingGather(tv, tokens, expect.data()).ok());
    EXPECT_EQ(0, std::memcmp(out.data(), expect.data(), out.size() * 4));  // dequantize is exact
    const std::vector<int32_t> bad = {1, 11};
    const absl::Status s = EmbeddingGather(tv, bad, out.data());
    EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
    EXPECT_NE(s.message().find("tokens[1] = 11"), std::string::npos) << s;
  }
}

// A table with an interleaved copy (a tied embedding) is read from the copy, row for row the same
// values: with the table's own bytes overwritten after the copy was made, every row (37: two
// whole groups of 16 and a partial one) still gives the reference's values of the original.
TEST(EmbeddingTest, ReadsRowsFromTheInterleavedCopy) {
  std::mt19937 rng(4);
  const int64_t n_vocab = 37;
  std::vector<int32_t> tokens(n_vocab);
  for (int32_t t = 0; t < n_vocab; ++t) tokens[t] = (t * 7) % n_vocab;
  // Types that get a copy (the K-quants' copy: their AVX-512 kernels').
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ8_0,
                        GgmlType::kQ4_K, GgmlType::kQ6_K}) {
    SCOPED_TRACE(GgmlTypeName(static_cast<uint32_t>(type)));
    const QuantKernels* k = GetQuantKernels(type);
    if (k->interleave == nullptr) continue;
    const int64_t n_embd =
        GgmlTypeInfoOf(static_cast<uint32_t>(type))->block_size == 256 ? 512 : 96;
    std::vector<uint8_t> table = MakeWeights(type, n_embd, n_vocab, rng);
    WeightView tv{type, table.data(), n_embd, n_vocab};
    std::vector<float> expect(tokens.size() * n_embd), out(expect.size());
    ASSERT_TRUE(ref::EmbeddingGather(tv, tokens, expect.data()).ok());
    const int64_t groups = (n_vocab + quant::kInterleaveRows - 1) / quant::kInterleaveRows;
    std::vector<uint8_t> copy(groups * k->interleaved_group_bytes(n_embd));
    k->interleave(table.data(), table.size() / n_vocab, n_embd, n_vocab, copy.data());
    std::fill(table.begin(), table.end(), uint8_t{0x5A});  // what the copy let go
    tv.interleaved = copy.data();
    ASSERT_TRUE(EmbeddingGather(tv, tokens, out.data()).ok());
    EXPECT_EQ(0, std::memcmp(out.data(), expect.data(), out.size() * 4));
  }
}

// ---- Element-wise -------------------------------------------------------------------------

TEST(ElementwiseTest, RmsNormMatchesReference) {
  std::mt19937 rng(4);
  for (int64_t n : {576, 37, 4096}) {
    const std::vector<float> x = RandomVector(3 * n, rng, -3, 3), w = RandomVector(n, rng);
    std::vector<float> expect(3 * n);
    ref::RmsNorm(x.data(), w.data(), 3, n, 1e-5f, expect.data());
    for (CpuLevel level : Levels()) {
      std::vector<float> y(3 * n);
      RmsNorm(x.data(), w.data(), 3, n, 1e-5f, y.data(), level);
      for (int64_t i = 0; i < 3 * n; ++i) {
        // f32 sum of squares: relative error ~1e-6.
        ASSERT_NEAR(y[i], expect[i], 2e-6f * std::fabs(expect[i]) + 1e-7f)
            << CpuLevelName(level) << " n " << n << " i " << i;
      }
      std::vector<float> inplace = x;  // aliasing allowed
      RmsNorm(inplace.data(), w.data(), 3, n, 1e-5f, inplace.data(), level);
      EXPECT_EQ(0, std::memcmp(inplace.data(), y.data(), y.size() * 4));
    }
  }
}

// Rows at once (independent sum chains) give each row the bits it gets alone.
TEST(ElementwiseTest, RmsNormRowsEqualOneRowAtATime) {
  std::mt19937 rng(14);
  const int64_t n = 576;
  const std::vector<float> x = RandomVector(11 * n, rng, -3, 3), w = RandomVector(n, rng);
  for (CpuLevel level : Levels()) {
    const OpKernels& k = GetOpKernels(level);
    std::vector<float> alone(11 * n);
    for (int64_t r = 0; r < 11; ++r)
      k.rms_norm(x.data() + r * n, w.data(), 1, n, 1e-5f, alone.data() + r * n);
    for (int64_t rows : {2, 8, 9, 11}) {
      std::vector<float> together(rows * n);
      k.rms_norm(x.data(), w.data(), rows, n, 1e-5f, together.data());
      EXPECT_EQ(0, std::memcmp(together.data(), alone.data(), together.size() * 4))
          << CpuLevelName(level) << " rows " << rows;
    }
  }
}

// store_f16 at every level equals Fp32ToFp16 bit for bit, specials included.
TEST(ElementwiseTest, StoreF16EqualsTheDefinition) {
  std::mt19937 rng(15);
  std::vector<float> x = RandomVector(1000, rng, -70000.0f, 70000.0f);
  const std::vector<float> small = RandomVector(200, rng, -1e-4f, 1e-4f);
  x.insert(x.end(), small.begin(), small.end());
  for (uint32_t bits :
       {0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00001u, 0x7F800001u, 0x7FBFFFFFu, 0x00000001u,
        0x80000001u, 0x00000000u, 0x80000000u, 0x477FEFFFu, 0x477FF000u, 0x38800000u, 0x387FFFFFu,
        0x33000000u, 0x33000001u, 0x32FFFFFFu, 0x3F801000u, 0x3F803000u}) {
    float f;
    std::memcpy(&f, &bits, 4);
    x.push_back(f);
  }
  std::vector<uint16_t> expect(x.size());
  for (size_t i = 0; i < x.size(); ++i) expect[i] = Fp32ToFp16(x[i]);
  for (CpuLevel level : Levels()) {
    for (size_t n : {x.size(), size_t{13}}) {  // 13: a masked tail
      std::vector<uint16_t> y(n, 0xABCD);
      GetOpKernels(level).store_f16(x.data() + x.size() - n, static_cast<int64_t>(n), y.data());
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(y[i], expect[x.size() - n + i]) << CpuLevelName(level) << " i " << i;
      }
    }
  }
}

// rope_pairs at every level equals the scalar definition bit for bit, both pair layouts,
// whole and partial vectors.
TEST(RopeTest, PairsKernelEqualsTheDefinitionAtEveryLevel) {
  std::mt19937 rng(16);
  for (int64_t n_pairs : {32, 5, 13, 24}) {
    const std::vector<float> c = RandomVector(n_pairs, rng), s = RandomVector(n_pairs, rng);
    const std::vector<float> x = RandomVector(2 * n_pairs + 3, rng, -2, 2);
    for (int64_t stride : {int64_t{1}, n_pairs}) {
      std::vector<float> expect = x;
      GetOpKernels(CpuLevel::kScalar)
          .rope_pairs(expect.data(), c.data(), s.data(), n_pairs, stride);
      for (CpuLevel level : Levels()) {
        std::vector<float> y = x;
        GetOpKernels(level).rope_pairs(y.data(), c.data(), s.data(), n_pairs, stride);
        EXPECT_EQ(0, std::memcmp(y.data(), expect.data(), y.size() * 4))
            << CpuLevelName(level) << " pairs " << n_pairs << " stride " << stride;
      }
    }
  }
}

TEST(ElementwiseTest, SwiGluAddSoftmaxMatchReference) {
  std::mt19937 rng(5);
  for (int64_t n : {1536, 13}) {
    std::vector<float> gate = RandomVector(n, rng, -30, 30), up = RandomVector(n, rng, -2, 2);
    gate[0] = -90.0f;  // exp(90) overflows: silu must still give ~0
    std::vector<float> expect(n), sum_expect(n);
    ref::SwiGlu(gate.data(), up.data(), n, expect.data());
    ref::Add(gate.data(), up.data(), n, sum_expect.data());
    std::vector<float> logits = RandomVector(n, rng, -20, 20), soft_expect = logits;
    ref::SoftmaxRows(soft_expect.data(), 1, n, 0.7f);
    for (CpuLevel level : Levels()) {
      SCOPED_TRACE(CpuLevelName(level));
      std::vector<float> y(n);
      SwiGlu(gate.data(), up.data(), n, y.data(), level);
      for (int64_t i = 0; i < n; ++i) {
        // polynomial exp: relative error < 1e-6.
        ASSERT_NEAR(y[i], expect[i], 1e-6f * std::fabs(expect[i]) + 1e-30f) << "i " << i;
      }
      Add(gate.data(), up.data(), n, y.data(), level);
      EXPECT_EQ(0, std::memcmp(y.data(), sum_expect.data(), n * 4));
      std::vector<float> soft = logits;
      SoftmaxRows(soft.data(), 1, n, 0.7f, level);
      for (int64_t i = 0; i < n; ++i) {
        // f32 logits * scale (|x| <= 14: ulp ~1e-6 in the exponent) and an f32 sum over n:
        // relative error <= 5e-6.
        ASSERT_NEAR(soft[i], soft_expect[i], 5e-6f * soft_expect[i] + 1e-9f) << "i " << i;
      }
    }
  }
}

// GeGLU: ggml's f16-table GELU (ops.h). The table's float GELU against the tanh formula in
// double, the thresholds at +-10 exactly, every element equal to its table entry times up, and
// the whole op against the double reference within the table's f16 roundings. (ggml's own
// table and expression: e2e_gemma3_test's bitwise greedy logits.)
TEST(ElementwiseTest, GeGluFollowsGgmlsF16Table) {
  for (float x : {-9.5f, -3.0f, -0.7f, 0.0f, 0.3f, 1.0f, 2.5f, 9.0f}) {
    const double g = x;
    const double want =
        0.5 * g * (1.0 + std::tanh(0.7978845608028654 * g * (1.0 + 0.044715 * g * g)));
    // Float steps, tanhf within an ulp or two: absolute 4e-7 |x| (1 + tanh cancels for x < 0).
    EXPECT_NEAR(GeluF32(x), want, 4e-7 * std::fabs(g) + 1e-12) << x;
  }
  const uint16_t* table = GeluF16Table();
  EXPECT_EQ(table[Fp32ToFp16(0.0f)], Fp32ToFp16(0.0f));
  EXPECT_EQ(table[Fp32ToFp16(1.0f)], Fp32ToFp16(GeluF32(1.0f)));

  std::mt19937 rng(6);
  const int64_t n = 4099;
  std::vector<float> gate = RandomVector(n, rng, -12, 12), up = RandomVector(n, rng, -2, 2);
  gate[0] = -10.0f;  // <= -10: exactly 0
  gate[1] = 10.0f;   // >= 10: gate * up exactly
  gate[2] = 10.25f;
  gate[3] = -9.99f;  // just inside: through the table
  std::vector<float> y(n), expect(n);
  GeGlu(gate.data(), up.data(), n, y.data());
  ref::GeGlu(gate.data(), up.data(), n, expect.data());
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[1], 10.0f * up[1]);
  EXPECT_EQ(y[2], 10.25f * up[2]);
  for (int64_t i = 3; i < n; ++i) {
    // f16 input (|gelu'| <= 1.13 times 2^-11 |g|) and f16 output (2^-11 |gelu|).
    ASSERT_NEAR(y[i], expect[i], 1e-3f * (std::fabs(gate[i]) + 1.0f) * std::fabs(up[i]))
        << "i " << i << " gate " << gate[i];
    if (gate[i] > -10.0f && gate[i] < 10.0f) {
      ASSERT_EQ(y[i], Fp16ToFp32(table[Fp32ToFp16(gate[i])]) * up[i]) << "i " << i;
    }
  }
  // y may alias gate.
  std::vector<float> in_place = gate;
  GeGlu(in_place.data(), up.data(), n, in_place.data());
  EXPECT_EQ(0, std::memcmp(in_place.data(), y.data(), n * 4));
}

// Every level's GeGLU gives the scalar definition's bits: random gates over the table's range
// and past +-10, every f16 value and the f16 rounding boundaries, the thresholds and their
// neighbours, subnormals, -0, infinities and NaNs (a NaN in a SIMD chunk), at lengths with every
// SIMD tail; in place too.
TEST(ElementwiseTest, GeGluSameBitsAtEveryLevel) {
  std::mt19937 rng(16);
  const float specials[] = {-10.0f,
                            std::nextafter(-10.0f, 0.0f),
                            10.0f,
                            std::nextafter(10.0f, 0.0f),
                            -0.0f,
                            0.0f,
                            1.0f + 1.0f / 2048,  // an f16 rounding tie (to even)
                            1.0f + 3.0f / 2048,  // a tie rounding up
                            6e-8f,               // f16 subnormal range
                            -3e-5f,
                            1e-30f,  // below f16's smallest subnormal
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::quiet_NaN()};
  // Every f16 value as a gate, and the floats either side of each midpoint between neighbouring
  // f16 values and on it (the rounding boundaries of the table index).
  std::vector<float> sweep;
  for (uint32_t h = 0; h < (1u << 16); ++h) {
    const float f = Fp16ToFp32(static_cast<uint16_t>(h));
    sweep.push_back(f);
    const float next = Fp16ToFp32(static_cast<uint16_t>(h + 1));
    if (std::isfinite(f) && std::isfinite(next) && (h & 0x7FFF) < 0x7BFF) {
      const float mid = f + (next - f) / 2;
      sweep.insert(sweep.end(), {std::nextafter(mid, f), mid, std::nextafter(mid, next)});
    }
  }
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{15}, int64_t{16}, int64_t{17},
                    int64_t{40}, int64_t{2048 + 5}, static_cast<int64_t>(sweep.size())}) {
    std::vector<float> gate = RandomVector(n, rng, -12, 12), up = RandomVector(n, rng, -2, 2);
    if (n == static_cast<int64_t>(sweep.size())) gate = sweep;
    for (int64_t i = 0; i < n; i += 3) {
      gate[i] = specials[(i / 3) % std::size(specials)];
    }
    std::vector<float> expect(n);
    GeGlu(gate.data(), up.data(), n, expect.data(), CpuLevel::kScalar);
    for (CpuLevel level : Levels()) {
      SCOPED_TRACE(CpuLevelName(level));
      std::vector<float> y(n, 5.0f);
      GeGlu(gate.data(), up.data(), n, y.data(), level);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(0, std::memcmp(&y[i], &expect[i], 4))
            << "n " << n << " i " << i << " gate " << gate[i] << ": " << y[i] << " vs "
            << expect[i];
      }
      std::vector<float> in_place = up;
      GeGlu(gate.data(), in_place.data(), n, in_place.data(), level);
      ASSERT_EQ(0, std::memcmp(in_place.data(), expect.data(), n * 4)) << "n " << n;
    }
  }
}

// swiglu and softmax_exp use ggml_v_expf's polynomial (ExpGgml): the same bits at every level,
// over exp arguments from saturation (|n| > 192) through subnormal results to overflow, specials
// (signed zeros, infinities, NaN), every tail length, and softmax_exp's chunked double sum. A NaN
// argument gives a NaN, whose sign may differ between levels (which FMA operand's NaN
// propagates).
TEST(ElementwiseTest, SwiGluAndSoftmaxExpSameBitsAtEveryLevel) {
  auto same = [](float a, float b) {
    return std::isnan(a) ? std::isnan(b) : std::memcmp(&a, &b, sizeof a) == 0;
  };
  std::vector<float> args;
  for (float x = -140.0f; x <= 140.0f; x += 1.0f / 64) args.push_back(x);
  for (float x : {-1e30f, 1e30f, -200.0f, 200.0f, -133.2f, 133.2f, -103.97f, -87.34f, 88.73f, -0.0f,
                  0.0f, 1e-30f, -1e-30f}) {
    args.push_back(x);
    args.push_back(std::nextafter(x, 0.0f));
  }
  for (float x : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN()}) {
    args.push_back(x);
  }
  std::mt19937 rng(21);
  std::vector<float> up = RandomVector(static_cast<int64_t>(args.size()), rng, -2, 2);
  const OpKernels& scalar = GetOpKernels(CpuLevel::kScalar);
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{15}, int64_t{16}, int64_t{17},
                    int64_t{40}, static_cast<int64_t>(args.size())}) {
    // A window of the arguments that moves with n, so short lengths see different values.
    const float* x = args.data() + (args.size() - static_cast<size_t>(n)) * (n % 5) / 5;
    const float* u = up.data() + (x - args.data());
    std::vector<float> swiglu_want(n), exp_want(n);
    scalar.swiglu(x, u, n, swiglu_want.data());
    const double sum_want = scalar.softmax_exp(x, 0.5f, n, exp_want.data());
    for (CpuLevel level : Levels()) {
      SCOPED_TRACE(CpuLevelName(level));
      const OpKernels& k = GetOpKernels(level);
      std::vector<float> y(n, 5.0f);
      k.swiglu(x, u, n, y.data());
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_TRUE(same(y[i], swiglu_want[i]))
            << "swiglu n " << n << " gate " << x[i] << ": " << y[i] << " vs " << swiglu_want[i];
      }
      std::fill(y.begin(), y.end(), 5.0f);
      const double sum = k.softmax_exp(x, 0.5f, n, y.data());
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_TRUE(same(y[i], exp_want[i]))
            << "softmax_exp n " << n << " x " << x[i] << ": " << y[i] << " vs " << exp_want[i];
      }
      EXPECT_TRUE(std::isnan(sum) ? std::isnan(sum_want)
                                  : std::memcmp(&sum, &sum_want, sizeof sum) == 0)
          << "n " << n << ": " << sum << " vs " << sum_want;
    }
  }
}

TEST(ElementwiseTest, ScaleMultipliesEveryElementAtEveryLevel) {
  std::mt19937 rng(7);
  for (int64_t n : {1, 17, 640}) {
    const std::vector<float> x = RandomVector(n, rng, -100, 100);
    for (CpuLevel level : Levels()) {
      std::vector<float> y = x;
      Scale(y.data(), n, 25.298221f, level);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], x[i] * 25.298221f) << i;
    }
  }
}

// ---- RoPE ---------------------------------------------------------------------------------

std::vector<RopeConfig> RopeConfigs(const float* rope_freqs) {
  std::vector<RopeConfig> out;
  for (RopeMode mode : {RopeMode::kNorm, RopeMode::kNeox}) {
    for (int32_t n_rot : {64, 32, 20}) {
      RopeConfig c;
      c.mode = mode;
      c.n_rot = n_rot;
      out.push_back(c);  // none
      c.scaling = RopeScaling::kLinear;
      c.freq_scale = 0.25f;
      out.push_back(c);
      c.scaling = RopeScaling::kLlama3;
      c.freq_base = 500000.0f;
      c.orig_ctx = 64;  // small so the positions below cross every llama3 regime
      out.push_back(c);
      c.freq_factors = rope_freqs;
      out.push_back(c);
      c.freq_factors = nullptr;
      c.scaling = RopeScaling::kYarn;
      c.freq_base = 10000.0f;
      c.freq_scale = 0.125f;
      c.orig_ctx = 512;
      c.ext_factor = 1.0f;
      c.attn_factor = 1.1f;
      out.push_back(c);
    }
  }
  return out;
}

TEST(RopeTest, TableMatchesReferenceForAllModes) {
  std::mt19937 rng(6);
  const int32_t head_dim = 64, n_heads = 3;
  const std::vector<int32_t> positions = {0, 1, 7, 100, 4095, 30000};
  std::vector<float> rope_freqs(32);
  for (size_t i = 0; i < rope_freqs.size(); ++i) rope_freqs[i] = 1.0f + 0.25f * i;
  const std::vector<float> x =
      RandomVector(positions.size() * n_heads * head_dim, rng, -2.0f, 2.0f);
  int idx = 0;
  for (const RopeConfig& c : RopeConfigs(rope_freqs.data())) {
    SCOPED_TRACE(::testing::Message()
                 << "config #" << idx++ << " n_rot " << c.n_rot << " scaling "
                 << static_cast<int>(c.scaling) << " mode " << static_cast<int>(c.mode));
    std::vector<float> expect = x;
    ASSERT_TRUE(ref::Rope(c, head_dim, positions, n_heads, expect.data()).ok());
    RopeTable table;
    ASSERT_TRUE(table.Build(c, head_dim, positions).ok());
    for (CpuLevel level : Levels()) {
      std::vector<float> y = x;
      table.Apply(y.data(), n_heads, level);
      for (size_t i = 0; i < y.size(); ++i) {
        // cos/sin rounded to f32 once, then f32 arithmetic: |diff| <= 2e-6 * scale. YaRN mixes
        // the angles in float (ggml's recipe; the reference mixes in double): a few ulps of an
        // angle up to the position, times |x| <= 2.
        const float pos = static_cast<float>(positions[i / (n_heads * head_dim)]);
        const float tol = c.scaling == RopeScaling::kYarn ? 3e-6f + 8.0f * pos * 0x1p-24f : 3e-6f;
        ASSERT_NEAR(y[i], expect[i], tol) << CpuLevelName(level) << " i " << i;
        if (static_cast<int32_t>(i % head_dim) >= c.n_rot) {
          ASSERT_EQ(y[i], x[i]);  // tail kept
        }
      }
    }
  }
}

TEST(RopeTest, NormAndNeoxPairsFollowTheFormula) {
  const std::vector<int32_t> pos = {3};
  RopeConfig c;
  c.n_rot = 4;
  const float one[4] = {1, 0, 0, 1};
  const double a0 = 3.0, a1 = 3.0 * std::pow(10000.0, -0.5);  // angles of pairs 0 and 1
  RopeTable table;
  ASSERT_TRUE(table.Build(c, 4, pos).ok());
  std::vector<float> x(one, one + 4);
  table.Apply(x.data(), 1);
  // NORM: pairs (0,1) and (2,3).
  EXPECT_NEAR(x[0], std::cos(a0), 1e-6);
  EXPECT_NEAR(x[1], std::sin(a0), 1e-6);
  EXPECT_NEAR(x[2], -std::sin(a1), 1e-6);
  EXPECT_NEAR(x[3], std::cos(a1), 1e-6);
  c.mode = RopeMode::kNeox;  // pairs (0,2) and (1,3)
  ASSERT_TRUE(table.Build(c, 4, pos).ok());
  x.assign(one, one + 4);
  table.Apply(x.data(), 1);
  EXPECT_NEAR(x[0], std::cos(a0), 1e-6);
  EXPECT_NEAR(x[2], std::sin(a0), 1e-6);
  EXPECT_NEAR(x[1], -std::sin(a1), 1e-6);
  EXPECT_NEAR(x[3], std::cos(a1), 1e-6);
}

TEST(RopeTest, ScalingRules) {
  // Linear: position 8 at freq_scale 1/4 rotates like position 2 unscaled.
  std::mt19937 rng(7);
  const std::vector<float> x = RandomVector(64, rng);
  RopeConfig none;
  none.n_rot = 64;
  RopeConfig linear = none;
  linear.scaling = RopeScaling::kLinear;
  linear.freq_scale = 0.25f;
  RopeTable t1, t2;
  ASSERT_TRUE(t1.Build(none, 64, std::vector<int32_t>{2}).ok());
  ASSERT_TRUE(t2.Build(linear, 64, std::vector<int32_t>{8}).ok());
  std::vector<float> y1 = x, y2 = x;
  t1.Apply(y1.data(), 1);
  t2.Apply(y2.data(), 1);
  for (int i = 0; i < 64; ++i) EXPECT_NEAR(y1[i], y2[i], 1e-6) << i;

  // llama3 (llama 3.1 defaults): high frequencies keep factor 1, low ones get `factor`, the
  // band between follows 1 / ((1 - smooth) / factor + smooth).
  RopeConfig l3;
  l3.n_rot = 128;
  l3.freq_base = 500000.0f;
  l3.scaling = RopeScaling::kLlama3;
  const std::vector<double> ff = RopeFreqFactors(l3);
  ASSERT_EQ(ff.size(), 64u);
  EXPECT_EQ(ff[0], 1.0);
  EXPECT_EQ(ff[63], 8.0);
  int n_mid = 0;
  for (int i = 0; i < 64; ++i) {
    const double wavelen = 2 * M_PI / std::pow(500000.0, -2.0 * i / 128);
    if (wavelen >= 8192 / 4.0 && wavelen <= 8192 / 1.0) {
      ++n_mid;
      const double smooth = (8192 / wavelen - 1) / (4 - 1);
      EXPECT_NEAR(ff[i], 1 / ((1 - smooth) / 8 + smooth), 1e-12);
      EXPECT_GT(ff[i], 1.0);
      EXPECT_LT(ff[i], 8.0);
    }
  }
  EXPECT_GT(n_mid, 0);

  // YaRN: with ext_factor 0 it is linear scaling times attn_factor; with ext_factor 1 the
  // lowest pairs (below corr_low) use the unscaled angle and the highest the interpolated one,
  // all times mscale = attn_factor * (1 + 0.1 ln(1/freq_scale)).
  RopeConfig yarn;
  yarn.n_rot = 64;
  yarn.scaling = RopeScaling::kYarn;
  yarn.freq_scale = 0.25f;
  yarn.orig_ctx = 4096;
  yarn.ext_factor = 0.0f;
  RopeTable ty;
  ASSERT_TRUE(ty.Build(yarn, 64, std::vector<int32_t>{8}).ok());
  std::vector<float> y3 = x;
  ty.Apply(y3.data(), 1);
  for (int i = 0; i < 64; ++i) EXPECT_NEAR(y3[i], y2[i], 1e-6) << i;
  yarn.ext_factor = 1.0f;
  const int32_t p = 1000;
  ASSERT_TRUE(ty.Build(yarn, 64, std::vector<int32_t>{p}).ok());
  const double low = std::floor(64 * std::log(4096 / (32 * 2 * M_PI)) / (2 * std::log(10000.0)));
  const double high = std::ceil(64 * std::log(4096 / (1 * 2 * M_PI)) / (2 * std::log(10000.0)));
  ASSERT_GT(low, 0);
  ASSERT_LT(high, 31);
  const double mscale = 1 + 0.1 * std::log(4.0);
  std::vector<float> unit(64, 0.0f);
  for (int i = 0; i < 32; ++i) unit[2 * i] = 1.0f;  // (1, 0) in every pair: gives (cos, sin)
  ty.Apply(unit.data(), 1);
  const double theta0 = p * 1.0;                                    // pair 0: extrapolated
  const double theta31 = 0.25 * p * std::pow(10000.0, -62.0 / 64);  // pair 31: interpolated
  EXPECT_NEAR(unit[0], std::cos(theta0) * mscale, 2e-6);
  EXPECT_NEAR(unit[1], std::sin(theta0) * mscale, 2e-6);
  EXPECT_NEAR(unit[62], std::cos(theta31) * mscale, 2e-6);
  EXPECT_NEAR(unit[63], std::sin(theta31) * mscale, 2e-6);
}

TEST(RopeTest, RejectsBadConfig) {
  RopeConfig c;
  c.n_rot = 7;
  RopeTable t;
  absl::Status s = t.Build(c, 64, std::vector<int32_t>{0});
  EXPECT_NE(s.message().find("n_rot 7"), std::string::npos) << s;
  c.n_rot = 128;
  EXPECT_FALSE(t.Build(c, 64, std::vector<int32_t>{0}).ok());
  c.n_rot = 64;
  s = t.Build(c, 64, std::vector<int32_t>{0, -1});
  EXPECT_NE(s.message().find("positions[1]"), std::string::npos) << s;
}

}  // namespace
}  // namespace kiln::cpu
