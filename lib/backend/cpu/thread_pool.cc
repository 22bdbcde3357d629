#include "lib/backend/cpu/thread_pool.h"

#include <chrono>

namespace kiln::cpu {

namespace {

// Set while a thread runs a task of some pool: nested ParallelFor calls then run inline.
thread_local bool t_inside_task = false;
// When this thread's last traced job ended (0: none yet since tracing began).
thread_local int64_t t_last_job_end_ns = 0;

// Pause-only polls before yielding starts (~5 us at ~40 ns a pause): long enough to cover the
// gap between back-to-back ops in decode (SmolLM2-135M at 2 threads: 98% of the gaps between
// ParallelFor calls are under 5 us), short enough that a pool thread sharing a core with the
// thread it waits for hands the core over quickly.
constexpr int kPauseOnlyPolls = 128;
// Pauses between yields once yielding.
constexpr int kPausesPerYield = 16;

// Polls done() until it is true or `spin_us` has passed (then returns false: the caller sleeps).
template <typename Done>
bool SpinUntil(Done done, int spin_us) {
  for (int i = 0; i < kPauseOnlyPolls; ++i) {
    if (done()) return true;
    platform::CpuRelax();
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us);
  for (;;) {
    for (int i = 0; i < kPausesPerYield; ++i) {
      if (done()) return true;
      platform::CpuRelax();
    }
    if (std::chrono::steady_clock::now() >= deadline) return done();
    std::this_thread::yield();
  }
}

// ThreadPool::WaitStats as nanoseconds, summed by every pool's threads while tracing is on.
std::atomic<bool> g_trace_waits{false}, g_trace_cpu_time{false};
// Bumped when tracing is switched on: a thread's t_last_job_end_ns from before is stale.
std::atomic<int64_t> g_trace_epoch{0};
thread_local int64_t t_trace_epoch = -1;
std::atomic<int64_t> g_jobs{0}, g_caller_waits{0}, g_caller_wait_ns{0}, g_max_caller_wait_ns{0};
std::atomic<int64_t> g_caller_range_ns{0}, g_caller_range_cpu_ns{0};
std::atomic<int64_t> g_worker_range_ns{0}, g_worker_range_cpu_ns{0};
std::atomic<int64_t> g_caller_between_ns{0}, g_worker_wake_ns{0}, g_worker_wakes{0};

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t ThreadCpuNs() { return static_cast<int64_t>(1e9 * platform::ThreadCpuSeconds()); }

}  // namespace

void ThreadPool::SetWaitTracing(bool on, bool cpu_time) {
  g_trace_cpu_time.store(cpu_time, std::memory_order_relaxed);
  if (on) g_trace_epoch.fetch_add(1, std::memory_order_relaxed);
  g_trace_waits.store(on, std::memory_order_relaxed);
}

ThreadPool::WaitStats ThreadPool::TakeWaitStats() {
  auto take = [](std::atomic<int64_t>& v) { return v.exchange(0, std::memory_order_relaxed); };
  auto seconds = [&](std::atomic<int64_t>& v) { return 1e-9 * static_cast<double>(take(v)); };
  WaitStats s;
  s.jobs = take(g_jobs);
  s.caller_waits = take(g_caller_waits);
  s.caller_wait_seconds = seconds(g_caller_wait_ns);
  s.max_caller_wait_seconds = seconds(g_max_caller_wait_ns);
  s.caller_range_seconds = seconds(g_caller_range_ns);
  s.caller_range_cpu_seconds = seconds(g_caller_range_cpu_ns);
  s.worker_range_seconds = seconds(g_worker_range_ns);
  s.worker_range_cpu_seconds = seconds(g_worker_range_cpu_ns);
  s.caller_between_seconds = seconds(g_caller_between_ns);
  s.worker_wake_seconds = seconds(g_worker_wake_ns);
  s.worker_wakes = take(g_worker_wakes);
  return s;
}

ThreadPool::ThreadPool(int n_threads, int spin_us, bool pin_workers)
    : n_threads_(n_threads > 0 ? n_threads : PhysicalCoreCount()),
      spin_us_(spin_us),
      pin_workers_(pin_workers),
      claimed_(new std::atomic<uint32_t>[n_threads_]) {
  for (int i = 0; i < n_threads_; ++i) claimed_[i].store(0, std::memory_order_relaxed);
  workers_.reserve(n_threads_ - 1);
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_seq_cst);
  generation_.fetch_add(1, std::memory_order_seq_cst);
  platform::WakeAll(&generation_);
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
  const bool trace = g_trace_waits.load(std::memory_order_relaxed);
  if (trace) {
    const int64_t epoch = g_trace_epoch.load(std::memory_order_relaxed);
    const int64_t now = NowNs();
    if (t_trace_epoch == epoch && t_last_job_end_ns != 0) {
      g_caller_between_ns.fetch_add(now - t_last_job_end_ns, std::memory_order_relaxed);
    }
    t_trace_epoch = epoch;
  }
  std::lock_guard<std::mutex> lock(call_mutex_);
  if (trace) published_ns_.store(NowNs(), std::memory_order_relaxed);
  job_fn_ = fn;
  job_ctx_ = ctx;
  job_tasks_ = n_tasks;
  pending_.store(n_threads_, std::memory_order_relaxed);
  const uint32_t generation = generation_.fetch_add(1, std::memory_order_seq_cst) + 1;
  if (sleeping_workers_.load(std::memory_order_seq_cst) > 0) platform::WakeAll(&generation_);

  // Range 0, then whatever the workers have not started (a worker the OS is not running).
  RunRanges(generation, 0);

  if (trace) g_jobs.fetch_add(1, std::memory_order_relaxed);
  const int64_t wait_start = trace && pending_.load(std::memory_order_acquire) != 0 ? NowNs() : 0;
  // Wait for the ranges that workers are still running: spin, then sleep on `pending_`.
  while (pending_.load(std::memory_order_acquire) != 0) {
    if (SpinUntil([this] { return pending_.load(std::memory_order_acquire) == 0; }, spin_us_)) {
      break;
    }
    caller_sleeping_.store(1, std::memory_order_seq_cst);
    const uint32_t p = pending_.load(std::memory_order_seq_cst);
    if (p != 0) platform::WaitWhileEqual(&pending_, p);
    caller_sleeping_.store(0, std::memory_order_relaxed);
  }
  if (wait_start != 0) {
    const int64_t waited = NowNs() - wait_start;
    g_caller_waits.fetch_add(1, std::memory_order_relaxed);
    g_caller_wait_ns.fetch_add(waited, std::memory_order_relaxed);
    int64_t longest = g_max_caller_wait_ns.load(std::memory_order_relaxed);
    while (waited > longest && !g_max_caller_wait_ns.compare_exchange_weak(longest, waited)) {
    }
  }
  if (trace) t_last_job_end_ns = NowNs();
}

void ThreadPool::RunRanges(uint32_t generation, int first_range) {
  for (int k = 0; k < n_threads_; ++k) {
    const int range = (first_range + k) % n_threads_;
    uint32_t expected = generation - 1;
    if (claimed_[range].load(std::memory_order_relaxed) != expected ||
        !claimed_[range].compare_exchange_strong(expected, generation, std::memory_order_acq_rel)) {
      continue;  // someone else runs it, or this job is over
    }
    int64_t b, e;
    StaticRange(job_tasks_, n_threads_, range, &b, &e);
    if (b < e) {
      const bool trace = g_trace_waits.load(std::memory_order_relaxed);
      const bool cpu_time = trace && g_trace_cpu_time.load(std::memory_order_relaxed);
      const int64_t start = trace ? NowNs() : 0, start_cpu = cpu_time ? ThreadCpuNs() : 0;
      t_inside_task = true;
      job_fn_(job_ctx_, b, e, range);
      t_inside_task = false;
      if (trace) {
        const bool caller = first_range == 0;
        (caller ? g_caller_range_ns : g_worker_range_ns)
            .fetch_add(NowNs() - start, std::memory_order_relaxed);
        if (cpu_time) {
          (caller ? g_caller_range_cpu_ns : g_worker_range_cpu_ns)
              .fetch_add(ThreadCpuNs() - start_cpu, std::memory_order_relaxed);
        }
      }
    }
    if (pending_.fetch_sub(1, std::memory_order_seq_cst) == 1 &&
        caller_sleeping_.load(std::memory_order_seq_cst)) {
      platform::WakeAll(&pending_);
    }
  }
}

void ThreadPool::WorkerLoop(int thread_idx) {
  // Where the OS refuses, the worker runs unpinned: placement is a speed matter only.
  if (pin_workers_) platform::PinThisThreadToCore(thread_idx);
  // The generation at construction (0), not a fresh load: a job published before this thread
  // first runs must not be mistaken for the starting state.
  uint32_t seen = 0;
  for (;;) {
    // Wait for a new generation: spin, then sleep.
    uint32_t g = generation_.load(std::memory_order_acquire);
    while (g == seen) {
      if (SpinUntil(
              [&] {
                g = generation_.load(std::memory_order_acquire);
                return g != seen;
              },
              spin_us_)) {
        break;
      }
      sleeping_workers_.fetch_add(1, std::memory_order_seq_cst);
      if (generation_.load(std::memory_order_seq_cst) == seen) {
        platform::WaitWhileEqual(&generation_, seen);
      }
      sleeping_workers_.fetch_sub(1, std::memory_order_relaxed);
      g = generation_.load(std::memory_order_acquire);
    }
    seen = g;
    if (stop_.load(std::memory_order_acquire)) return;
    if (g_trace_waits.load(std::memory_order_relaxed)) {
      // published_ns_ may already be a later job's (this worker missed one): a lower bound.
      g_worker_wake_ns.fetch_add(NowNs() - published_ns_.load(std::memory_order_relaxed),
                                 std::memory_order_relaxed);
      g_worker_wakes.fetch_add(1, std::memory_order_relaxed);
    }
    RunRanges(g, thread_idx);
  }
}

}  // namespace kiln::cpu
