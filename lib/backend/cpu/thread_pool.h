// A fixed-size pool of worker threads for data-parallel CPU ops.
//
// ParallelFor(n_tasks, fn) splits the task indices [0, n_tasks) into n_threads contiguous
// ranges by a fixed rule (range i is [i*n/T, (i+1)*n/T)), runs fn(begin, end, i) once for every
// non-empty range and returns when all are done. The split depends only on (n_tasks, n_threads),
// never on timing, so results are reproducible. `i` names the range, and no two threads run
// ranges with the same `i` at once: fn may index per-thread scratch with it.
//
// Who runs a range: thread i (the caller is thread 0) claims range i first, then any range
// nobody has claimed yet. So when a host thread competes for a core and a worker is not running
// when a job arrives, the caller (or another worker) runs that worker's range instead of
// waiting a whole scheduler time slice for it; uncontended, every thread runs its own range.
//
// Waiting: a worker waits for the next job, and the caller for the workers' last ranges, by
// spinning (with pause) for a few microseconds, then spinning with sched-yield (so a thread
// that wants this core, such as a pool thread the OS put on the same core, gets it) until
// `spin_us` has passed, then sleeping on a futex. Sleepers announce themselves in a counter
// before the final re-check, and wakers only make the wake syscall when someone announced (both
// sides use sequentially consistent operations, so no wake-up is lost).
//
// Pinning (pin_workers): worker i binds itself to the i-th physical core of the process's allowed
// CPUs (platform::PinThisThreadToCore), leaving the first to the calling threads, which stay where
// the OS puts them. Without it a woken worker can land on the core of the thread that woke it and
// take turns with it there (a game loop whose pool sleeps between frames: the stepping thread
// lost its core in 55-65% of frames on a 2-core VM; pinned, 3-10%).
//
// Thread-safety: ParallelFor may be called from several threads; calls are serialized by a
// mutex. A ParallelFor issued from inside a task runs its ranges inline on that thread (same
// ranges and indices, one after another) instead of deadlocking.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "lib/common/platform.h"

namespace kiln::cpu {

// Physical cores available to this process (lib/common/platform.h). At least 1.
using ::kiln::platform::PhysicalCoreCount;

class ThreadPool {
 public:
  // n_threads <= 0 means PhysicalCoreCount(). The calling thread counts as thread 0, so
  // n_threads - 1 workers are started.
  explicit ThreadPool(int n_threads = 0, int spin_us = 200, bool pin_workers = false);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int n_threads() const { return n_threads_; }
  bool pin_workers() const { return pin_workers_; }

  // The tasks [begin, end) of range `range_idx` when n_tasks tasks are split n_threads ways.
  static void StaticRange(int64_t n_tasks, int n_threads, int range_idx, int64_t* begin,
                          int64_t* end) {
    *begin = n_tasks * range_idx / n_threads;
    *end = n_tasks * (range_idx + 1) / n_threads;
  }

  // Where the threads of the process's pools spend the jobs' time, for benches that compare a
  // step's wall time with its CPU time (the gap: a caller waiting for a worker's range, a
  // worker the OS stopped inside its range, or the caller stopped itself). Summed over every
  // pool while tracing is on.
  struct WaitStats {
    int64_t jobs = 0;                // jobs run by the threads of several pool threads
    int64_t caller_waits = 0;        // of them, jobs whose caller waited for a worker's range
    double caller_wait_seconds = 0;  // wall time callers waited for those ranges
    double max_caller_wait_seconds = 0;
    double caller_range_seconds = 0;  // wall time of the ranges callers ran
    double caller_range_cpu_seconds = 0;
    double worker_range_seconds = 0;  // wall time of the ranges workers ran
    double worker_range_cpu_seconds = 0;
    // Wall time a calling thread spent between the end of one of its jobs and the start of its
    // next: the work outside the pool (a decode step's norms, quantization, sampling).
    double caller_between_seconds = 0;
    // Wall time from a job's publication until a worker began its ranges, summed over workers.
    double worker_wake_seconds = 0;
    int64_t worker_wakes = 0;
  };
  // Tracing costs a few clock reads per job and range, plus (cpu_time) two reads of the thread's
  // CPU time per range, which are system calls; off by default.
  static void SetWaitTracing(bool on, bool cpu_time = true);
  // The sums since the last call (resets them).
  static WaitStats TakeWaitStats();

  // fn(int64_t task_begin, int64_t task_end, int range_idx). Blocks until every range ran.
  template <typename Fn>
  void ParallelFor(int64_t n_tasks, Fn&& fn) {
    using F = std::remove_reference_t<Fn>;
    Run(
        n_tasks, [](void* ctx, int64_t b, int64_t e, int t) { (*static_cast<F*>(ctx))(b, e, t); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

 private:
  using TaskFn = void (*)(void* ctx, int64_t begin, int64_t end, int range_idx);
  void Run(int64_t n_tasks, TaskFn fn, void* ctx);
  void WorkerLoop(int thread_idx);
  // Claims and runs unclaimed ranges of job `generation`, starting at `first_range`.
  void RunRanges(uint32_t generation, int first_range);

  const int n_threads_;
  const int spin_us_;
  const bool pin_workers_;
  std::vector<std::thread> workers_;
  std::mutex call_mutex_;

  // The current job, published before `generation_` is bumped; read only by a thread that
  // claimed one of its ranges (the job cannot end, and be replaced, before that range is done).
  TaskFn job_fn_ = nullptr;
  void* job_ctx_ = nullptr;
  int64_t job_tasks_ = 0;
  std::atomic<uint32_t> generation_{0};   // futex word: bumped once per job (and at shutdown)
  std::atomic<int64_t> published_ns_{0};  // when the current job was published (tracing only)
  std::atomic<uint32_t> pending_{0};      // futex word: ranges of the current job not yet done
  // claimed_[i] is the generation of the last job whose range i was claimed. Every range of
  // job g-1 was claimed before job g began, so range i of job g is claimed by the one
  // compare-exchange from g-1 to g; a late thread still holding an older g fails it (unless
  // it slept through 2^32 jobs between reading g and trying).
  std::unique_ptr<std::atomic<uint32_t>[]> claimed_;
  std::atomic<int> sleeping_workers_{0};
  std::atomic<int> caller_sleeping_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace kiln::cpu
