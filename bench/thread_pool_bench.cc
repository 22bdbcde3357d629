// ThreadPool under decode-like load, with and without host threads competing for the cores.
//
//   thread_pool_bench [--threads=2] [--work_us=20] [--gaps=0,5,20] [--busy=0,1] [--calls=2000]
//                     [--batches=7] [--spin_us=200]
//
// Each call is ParallelFor over `threads` ranges of fixed arithmetic worth --work_us on one
// core (calibrated at start; a fixed amount of work, not a time, so a range the OS stops
// running takes longer), preceded by --gap serial microseconds on the calling thread (the
// norms and adds between a decode step's matmuls). --busy host threads spin in this process,
// pinned nowhere. Prints microseconds per call, median (min-max) over --batches batches of
// --calls calls, next to two references: `ideal` (work + gap: every range in parallel) and
// `serial` (threads * work + gap: one thread does it all).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "lib/backend/cpu/thread_pool.h"

namespace {

using Clock = std::chrono::steady_clock;

// A dependent chain of multiply-adds: `iters` steps cost the same on any thread.
uint64_t Work(uint64_t iters, uint64_t seed) {
  uint64_t x = seed | 1;
  for (uint64_t i = 0; i < iters; ++i) x = x * 6364136223846793005ull + 1442695040888963407ull;
  return x;
}

// Iterations of Work per microsecond on this machine (best of a few tries, one thread).
double IterationsPerMicrosecond() {
  double best = 0;
  for (int t = 0; t < 5; ++t) {
    const uint64_t iters = 2000000;
    const auto t0 = Clock::now();
    volatile uint64_t sink = Work(iters, t);
    (void)sink;
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    best = std::max(best, iters / us);
  }
  return best;
}

std::vector<int> ParseList(const char* s) {
  std::vector<int> out;
  for (const char* p = s; *p;) {
    out.push_back(std::atoi(p));
    while (*p && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, work_us = 20, calls = 2000, batches = 7, spin_us = 200;
  std::vector<int> gaps = {0, 5, 20}, busy_counts = {0, 1};
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    if (std::strncmp(a, "--threads=", 10) == 0)
      threads = std::atoi(a + 10);
    else if (std::strncmp(a, "--work_us=", 10) == 0)
      work_us = std::atoi(a + 10);
    else if (std::strncmp(a, "--gaps=", 7) == 0)
      gaps = ParseList(a + 7);
    else if (std::strncmp(a, "--busy=", 7) == 0)
      busy_counts = ParseList(a + 7);
    else if (std::strncmp(a, "--calls=", 8) == 0)
      calls = std::atoi(a + 8);
    else if (std::strncmp(a, "--batches=", 10) == 0)
      batches = std::atoi(a + 10);
    else if (std::strncmp(a, "--spin_us=", 10) == 0)
      spin_us = std::atoi(a + 10);
    else {
      std::fprintf(stderr, "unknown argument %s (see the header of bench/thread_pool_bench.cc)\n",
                   a);
      return 2;
    }
  }
  if (threads < 1 || work_us < 0 || calls < 1 || batches < 1) {
    std::fprintf(stderr, "threads, calls and batches must be >= 1, work_us >= 0\n");
    return 2;
  }
  const double per_us = IterationsPerMicrosecond();
  std::printf(
      "thread_pool_bench: %d pool threads, %d us of work per range, %d calls x %d "
      "batches; %d physical cores\n",
      threads, work_us, calls, batches, kiln::cpu::PhysicalCoreCount());
  std::printf("%4s %6s %26s %8s %8s\n", "busy", "gap_us", "us/call median (min-max)", "ideal",
              "serial");

  kiln::cpu::ThreadPool pool(threads, spin_us);
  for (int n_busy : busy_counts) {
    std::atomic<bool> stop{false};
    std::vector<std::thread> busy;
    for (int b = 0; b < n_busy; ++b) {
      busy.emplace_back([&] {
        volatile uint64_t sink = 0;
        while (!stop.load(std::memory_order_relaxed)) sink = sink + 1;
      });
    }
    for (int gap_us : gaps) {
      const auto work_iters = static_cast<uint64_t>(work_us * per_us);
      const auto gap_iters = static_cast<uint64_t>(gap_us * per_us);
      std::vector<uint64_t> out(threads);
      std::vector<double> us_per_call;
      for (int b = 0; b < batches; ++b) {
        const auto t0 = Clock::now();
        for (int c = 0; c < calls; ++c) {
          out[0] += Work(gap_iters, c);
          pool.ParallelFor(threads, [&](int64_t begin, int64_t end, int range) {
            for (int64_t i = begin; i < end; ++i) out[i] += Work(work_iters, i + c);
          });
        }
        us_per_call.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() /
                              calls);
      }
      std::sort(us_per_call.begin(), us_per_call.end());
      std::printf("%4d %6d %10.1f (%.1f-%.1f) %8d %8d\n", n_busy, gap_us,
                  us_per_call[us_per_call.size() / 2], us_per_call.front(), us_per_call.back(),
                  work_us + gap_us, threads * work_us + gap_us);
      volatile uint64_t sink = out[0];  // keeps the work
      (void)sink;
    }
    stop.store(true);
    for (auto& t : busy) t.join();
  }
  return 0;
}
