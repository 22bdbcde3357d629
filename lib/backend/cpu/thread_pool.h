// A fixed-size pool of worker threads for data-parallel CPU ops.
//
// ParallelFor(n_tasks, fn) splits the task indices [0, n_tasks) into n_threads contiguous
// ranges by a fixed rule (thread i gets [i*n/T, (i+1)*n/T)), runs fn(begin, end, i) for every
// non-empty range (range 0 on the calling thread) and returns when all are done. The split
// depends only on (n_tasks, n_threads), never on timing, so results are reproducible.
//
// Waiting: a worker spins (with pause) for `spin_us` after each job before sleeping on a futex,
// so back-to-back calls during decode cost a few microseconds. Sleepers announce themselves
// in a counter before the final re-check, and wakers only make the wake syscall when someone
// announced (both sides use sequentially consistent operations, so no wake-up is lost).
//
// Thread-safety: ParallelFor may be called from several threads; calls are serialized by a
// mutex. A ParallelFor issued from inside a task runs its ranges inline on that thread (same
// ranges and thread indices, one after another) instead of deadlocking.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace kiln::cpu {

// Physical cores available to this process: distinct thread-sibling sets among the CPUs in the
// affinity mask (/sys/devices/system/cpu/cpuN/topology/thread_siblings_list), falling back to
// sysconf(_SC_NPROCESSORS_ONLN). At least 1.
int PhysicalCoreCount();

class ThreadPool {
 public:
  // n_threads <= 0 means PhysicalCoreCount(). The calling thread counts as thread 0, so
  // n_threads - 1 workers are started.
  explicit ThreadPool(int n_threads = 0, int spin_us = 200);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int n_threads() const { return n_threads_; }

  // Range [begin, end) of tasks that thread `thread_idx` runs for n_tasks tasks.
  static void StaticRange(int64_t n_tasks, int n_threads, int thread_idx, int64_t* begin,
                          int64_t* end) {
    *begin = n_tasks * thread_idx / n_threads;
    *end = n_tasks * (thread_idx + 1) / n_threads;
  }

  // fn(int64_t task_begin, int64_t task_end, int thread_idx). Blocks until every range ran.
  template <typename Fn>
  void ParallelFor(int64_t n_tasks, Fn&& fn) {
    using F = std::remove_reference_t<Fn>;
    Run(
        n_tasks, [](void* ctx, int64_t b, int64_t e, int t) { (*static_cast<F*>(ctx))(b, e, t); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

 private:
  using TaskFn = void (*)(void* ctx, int64_t begin, int64_t end, int thread_idx);
  void Run(int64_t n_tasks, TaskFn fn, void* ctx);
  void WorkerLoop(int thread_idx);

  const int n_threads_;
  const int spin_us_;
  std::vector<std::thread> workers_;
  std::mutex call_mutex_;

  // The current job, published before `generation_` is bumped.
  TaskFn job_fn_ = nullptr;
  void* job_ctx_ = nullptr;
  int64_t job_tasks_ = 0;
  std::atomic<uint32_t> generation_{0};  // futex word: bumped once per job (and at shutdown)
  std::atomic<uint32_t> pending_{0};     // futex word: workers still running the current job
  std::atomic<int> sleeping_workers_{0};
  std::atomic<int> caller_sleeping_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace kiln::cpu
