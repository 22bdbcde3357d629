#include "lib/backend/cpu/thread_pool.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <fstream>
#include <set>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KILN_CPU_RELAX() _mm_pause()
#else
#define KILN_CPU_RELAX() ((void)0)
#endif

namespace kiln::cpu {

int PhysicalCoreCount() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    std::set<std::string> sibling_sets;
    int n_cpus = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (!CPU_ISSET(cpu, &set)) continue;
      ++n_cpus;
      std::ifstream f("/sys/devices/system/cpu/cpu" + std::to_string(cpu) +
                      "/topology/thread_siblings_list");
      std::string line;
      if (f && std::getline(f, line)) {
        sibling_sets.insert(line);
      } else {
        sibling_sets.insert("cpu" + std::to_string(cpu));  // unknown topology: count it alone
      }
    }
    if (!sibling_sets.empty()) return static_cast<int>(sibling_sets.size());
    if (n_cpus > 0) return n_cpus;
  }
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

namespace {

// Sleeps while *word == expected (returns at once if it already differs, or spuriously).
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, nullptr,
          nullptr, 0);
}
void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
          nullptr, 0);
}

// Set while a thread runs a task of some pool: nested ParallelFor calls then run inline.
thread_local bool t_inside_task = false;
}  // namespace

ThreadPool::ThreadPool(int n_threads, int spin_us)
    : n_threads_(n_threads > 0 ? n_threads : PhysicalCoreCount()), spin_us_(spin_us) {
  workers_.reserve(n_threads_ - 1);
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_seq_cst);
  generation_.fetch_add(1, std::memory_order_seq_cst);
  FutexWakeAll(&generation_);
  for (auto& w : workers_) w.join();
}

void ThreadPool::Run(int64_t n_tasks, TaskFn fn, void* ctx) {
  if (n_tasks <= 0) return;
  if (n_threads_ == 1 || n_tasks == 1 || t_inside_task) {
    // Same ranges and indices as the parallel path, one after another on this thread.
    const int n_ranges = n_tasks == 1 ? 1 : n_threads_;
    const bool was_inside = t_inside_task;
    t_inside_task = true;
    for (int t = 0; t < n_ranges; ++t) {
      int64_t b, e;
      StaticRange(n_tasks, n_ranges == 1 ? 1 : n_threads_, t, &b, &e);
      if (b < e) fn(ctx, b, e, t);
    }
    t_inside_task = was_inside;
    return;
  }
  std::lock_guard<std::mutex> lock(call_mutex_);
  job_fn_ = fn;
  job_ctx_ = ctx;
  job_tasks_ = n_tasks;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_seq_cst);
  if (sleeping_workers_.load(std::memory_order_seq_cst) > 0) FutexWakeAll(&generation_);

  int64_t b, e;
  StaticRange(n_tasks, n_threads_, 0, &b, &e);
  t_inside_task = true;
  if (b < e) fn(ctx, b, e, 0);
  t_inside_task = false;

  // Wait for the workers: spin first, then sleep on `pending_`.
  const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us_);
  int spins = 0;
  for (;;) {
    if (pending_.load(std::memory_order_acquire) == 0) break;
    if (++spins < 64 || std::chrono::steady_clock::now() < spin_until) {
      if (spins >= 64) spins = 0;
      KILN_CPU_RELAX();
      continue;
    }
    caller_sleeping_.store(1, std::memory_order_seq_cst);
    const uint32_t p = pending_.load(std::memory_order_seq_cst);
    if (p != 0) FutexWait(&pending_, p);
    caller_sleeping_.store(0, std::memory_order_relaxed);
  }
}

void ThreadPool::WorkerLoop(int thread_idx) {
  // The generation at construction (0), not a fresh load: a job published before this thread
  // first runs must not be mistaken for the starting state.
  uint32_t seen = 0;
  for (;;) {
    // Wait for a new generation: spin, then sleep.
    const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us_);
    int spins = 0;
    uint32_t g;
    for (;;) {
      g = generation_.load(std::memory_order_acquire);
      if (g != seen) break;
      if (++spins < 64 || std::chrono::steady_clock::now() < spin_until) {
        if (spins >= 64) spins = 0;
        KILN_CPU_RELAX();
        continue;
      }
      sleeping_workers_.fetch_add(1, std::memory_order_seq_cst);
      if (generation_.load(std::memory_order_seq_cst) == seen) FutexWait(&generation_, seen);
      sleeping_workers_.fetch_sub(1, std::memory_order_relaxed);
    }
    seen = g;
    if (stop_.load(std::memory_order_acquire)) return;

    int64_t b, e;
    StaticRange(job_tasks_, n_threads_, thread_idx, &b, &e);
    if (b < e) {
      t_inside_task = true;
      job_fn_(job_ctx_, b, e, thread_idx);
      t_inside_task = false;
    }
    if (pending_.fetch_sub(1, std::memory_order_seq_cst) == 1 &&
        caller_sleeping_.load(std::memory_order_seq_cst)) {
      FutexWakeAll(&pending_);
    }
  }
}

}  // namespace kiln::cpu
