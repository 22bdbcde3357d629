#include "lib/engine/scheduler.h"

#include <algorithm>
#include <chrono>
#include <climits>

#include "absl/strings/str_cat.h"
#include "lib/engine/engine.h"

namespace kiln {
namespace {

thread_local bool t_in_step = false;

// How long a step waits for the owners of held tasks (blocking generates passing their tokens to
// their callbacks) before it runs without them: long enough for a woken thread to run a short
// callback, short enough that a slow callback costs the other sessions little.
constexpr auto kHeldWait = std::chrono::milliseconds(2);

// The prefill tokens a step gives the first prefilling session even when the decoding sessions
// already use the whole budget.
constexpr int32_t kMinPrefill = 32;

}  // namespace

bool Scheduler::InStep() { return t_in_step; }

Scheduler::Scheduler(Engine& engine, int32_t step_tokens, bool one_task_per_step)
    : engine_(engine), step_tokens_(step_tokens), one_task_per_step_(one_task_per_step) {}

Scheduler::~Scheduler() { StopWorker(); }

void Scheduler::Submit(ScheduledTask* task) {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    incoming_.push_back(task);
    n_active_.fetch_add(1, std::memory_order_acq_rel);
    ++wake_count_;
  }
  cv_.notify_all();
}

void Scheduler::Wake() {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    ++wake_count_;
  }
  cv_.notify_all();
}

void Scheduler::Hold(ScheduledTask* task) {
  if (task->held_.exchange(true, std::memory_order_acq_rel)) return;
  std::lock_guard<std::mutex> lock(queue_mu_);
  ++n_held_;
}

void Scheduler::Release(ScheduledTask* task) {
  if (!task->held_.exchange(false, std::memory_order_acq_rel)) return;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    --n_held_;
    ++wake_count_;
  }
  cv_.notify_all();
}

void Scheduler::Remove(ScheduledTask* task) {
  Release(task);
  std::unique_lock<std::mutex> step_lock(step_mu_, std::defer_lock);
  if (!t_in_step) step_lock.lock();
  engine_.Locked([&](KvCache&, ForwardPass&) {
    std::lock_guard<std::mutex> lock(queue_mu_);
    auto drop = [&](std::vector<ScheduledTask*>& v) {
      const size_t before = v.size();
      v.erase(std::remove(v.begin(), v.end(), task), v.end());
      return static_cast<int32_t>(before - v.size());
    };
    const int32_t removed = drop(tasks_) + drop(incoming_);
    n_active_.fetch_sub(removed, std::memory_order_acq_rel);
    for (ScheduledTask*& t : deliver_) {
      if (t == task) t = nullptr;
    }
    for (Planned& p : planned_) {
      if (p.task == task) p.task = nullptr;
    }
    return 0;
  });
}

SchedulerCounters Scheduler::Counters() const {
  return engine_.Locked([&](KvCache&, ForwardPass&) { return counters_; });
}

StepStats Scheduler::Step(int32_t budget) {
  StepStats stats;
  {
    std::lock_guard<std::mutex> step_lock(step_mu_);
    t_in_step = true;
    stats = StepLocked(budget);
    t_in_step = false;
  }
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    ++step_count_;
  }
  cv_.notify_all();
  return stats;
}

StepStats Scheduler::StepLocked(int32_t budget) {
  if (budget <= 0) budget = step_tokens_;
  {
    // Give the owners of held tasks a moment to pass on their tokens, so that they join this
    // step instead of every other one.
    std::unique_lock<std::mutex> lock(queue_mu_);
    if (n_held_ > 0) cv_.wait_for(lock, kHeldWait, [&] { return n_held_ == 0 || stop_; });
  }
  StepStats stats;
  engine_.Locked([&](KvCache& cache, ForwardPass& pass) {
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      tasks_.insert(tasks_.end(), incoming_.begin(), incoming_.end());
      incoming_.clear();
    }
    batch_.Clear();
    planned_.clear();
    int32_t used = 0;
    auto is_planned = [&](const ScheduledTask* t) {
      return std::any_of(planned_.begin(), planned_.end(),
                         [&](const Planned& p) { return p.task == t; });
    };
    auto runnable = [&](const ScheduledTask* t) {
      return !t->finished() && !t->held() && !is_planned(t);
    };
    // The oldest task not finished: it never waits for blocks (it preempts or fails), so every
    // step makes progress.
    auto oldest = [&]() -> const ScheduledTask* {
      for (const ScheduledTask* t : tasks_) {
        if (!t->finished()) return t;
      }
      return nullptr;
    };
    // Plans one task; returns false when it waits for blocks.
    auto place = [&](ScheduledTask* t, int32_t allowance) {
      while (true) {
        const int32_t begin = static_cast<int32_t>(batch_.tokens.size());
        absl::StatusOr<int32_t> added = t->Plan(cache, allowance, batch_);
        if (added.ok()) {
          if (*added > 0) planned_.push_back({t, begin, begin + *added});
          used += *added;
          return true;
        }
        if (!absl::IsResourceExhausted(added.status())) return true;  // the task ended
        // Cache full: preempt the youngest task after this one that holds K/V.
        ScheduledTask* victim = nullptr;
        for (auto it = tasks_.rbegin(); it != tasks_.rend() && *it != t; ++it) {
          if (!runnable(*it)) continue;
          auto len = cache.Length((*it)->seq());
          if (len.ok() && *len > 0) {
            victim = *it;
            break;
          }
        }
        if (victim != nullptr) {
          victim->Preempt(cache);
          ++counters_.preemptions;
          continue;
        }
        if (t == oldest()) {
          ++counters_.cache_full_failures;
          t->Fail(cache,
                  absl::ResourceExhaustedError(absl::StrCat(
                      "the KV cache is full (", added.status().message(),
                      ") and no other request in flight can be preempted; free or rewind a "
                      "session and retry")),
                  /*planned=*/false);
          return true;
        }
        return false;  // waits: an older task will preempt it or finish
      }
    };
    const size_t n = tasks_.size();
    if (one_task_per_step_) {
      // One task's work per pass, round robin over every task.
      for (size_t k = 0; k < n && planned_.empty(); ++k) {
        ScheduledTask* t = tasks_[(round_robin_ + k) % n];
        if (!runnable(t)) continue;
        place(t, budget);
        if (!planned_.empty()) round_robin_ = (round_robin_ + k + 1) % n;
      }
    } else {
      // 1. Decode steps, oldest first. The budget never cuts a draft tree: a session's draft
      // lengths, and with them its sampled tokens, must not depend on what else runs.
      for (size_t i = 0; i < n; ++i) {
        ScheduledTask* t = tasks_[i];
        if (runnable(t) && t->decoding()) place(t, INT32_MAX);
      }
      // 2. Prefill chunks, round robin, within the budget; the first prefill task gets at least
      // kMinPrefill tokens so that new sessions start even when decoding fills the budget.
      bool first = true;
      for (size_t k = 0; k < n && (first || used < budget); ++k) {
        ScheduledTask* t = tasks_[(round_robin_ + k) % n];
        if (!runnable(t) || t->decoding()) continue;
        place(t, first ? std::max(budget - used, std::min(budget, kMinPrefill)) : budget - used);
        first = false;
      }
      if (n > 0) round_robin_ = (round_robin_ + 1) % n;
    }
    stats.tokens = static_cast<int32_t>(batch_.tokens.size());
    stats.tasks = static_cast<int32_t>(planned_.size());
    if (!batch_.tokens.empty()) {
      ++counters_.steps;
      counters_.tokens += stats.tokens;
      if (stats.tasks >= 2) ++counters_.batched_steps;
      counters_.max_step_tasks = std::max(counters_.max_step_tasks, stats.tasks);
      const auto start = std::chrono::steady_clock::now();
      absl::Status st = pass.Forward(batch_, cache, &out_);
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (!st.ok()) {
        for (const Planned& p : planned_) p.task->Fail(cache, st, /*planned=*/true);
      } else {
        // Logits rows come in batch order, one per token that wanted them.
        size_t row = 0;
        int32_t next = 0;
        for (const Planned& p : planned_) {
          for (; next < p.begin; ++next) row += batch_.tokens[next].want_logits ? 1 : 0;
          StepRows rows{&out_, p.begin, p.end, row, seconds};
          p.task->Finish(cache, pass, rows);
        }
      }
    }
    // Drop the tasks that ended; every task of the step gets its Deliver.
    deliver_.assign(tasks_.begin(), tasks_.end());
    const size_t before = tasks_.size();
    tasks_.erase(std::remove_if(tasks_.begin(), tasks_.end(),
                                [](const ScheduledTask* t) { return t->finished(); }),
                 tasks_.end());
    stats.finished = static_cast<int32_t>(before - tasks_.size());
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      n_active_.store(static_cast<int32_t>(tasks_.size() + incoming_.size()),
                      std::memory_order_release);
      stats.active = n_active_.load(std::memory_order_relaxed);
    }
    planned_.clear();
    return 0;
  });
  stats.progress = stats.tokens > 0 || stats.finished > 0;
  for (size_t i = 0; i < deliver_.size(); ++i) {
    if (deliver_[i] != nullptr) deliver_[i]->Deliver();
  }
  deliver_.clear();
  return stats;
}

absl::Status Scheduler::RunUntil(const std::function<bool()>& done) {
  if (t_in_step) {
    return absl::FailedPreconditionError(
        "a blocking call on a session of this cache was made from a callback of the cache's "
        "own step (it would wait for itself)");
  }
  while (!done()) {
    uint64_t seen_step, seen_wake;
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      seen_step = step_count_;
      seen_wake = wake_count_;
    }
    if (step_mu_.try_lock()) {
      t_in_step = true;
      const StepStats stats = StepLocked(0);
      t_in_step = false;
      step_mu_.unlock();
      {
        std::lock_guard<std::mutex> lock(queue_mu_);
        ++step_count_;
        seen_step = step_count_;
      }
      cv_.notify_all();
      if (stats.progress || done()) continue;
    }
    // Another thread is stepping, or nothing could run (every task waits for its owner): wait
    // for the next step or wake. The timeout only guards against a missed wake.
    std::unique_lock<std::mutex> lock(queue_mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(5),
                 [&] { return step_count_ != seen_step || wake_count_ != seen_wake; });
  }
  return absl::OkStatus();
}

void Scheduler::StartWorker() {
  std::lock_guard<std::mutex> control(worker_mu_);
  if (worker_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    stop_ = false;
  }
  worker_ = std::thread([this] { WorkerLoop(); });
}

void Scheduler::StopWorker() {
  std::lock_guard<std::mutex> control(worker_mu_);
  if (!worker_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
  std::lock_guard<std::mutex> lock(queue_mu_);
  stop_ = false;
}

void Scheduler::WorkerLoop() {
  while (true) {
    uint64_t seen_wake;
    {
      std::unique_lock<std::mutex> lock(queue_mu_);
      cv_.wait(lock, [&] { return stop_ || n_active_.load(std::memory_order_acquire) > 0; });
      if (stop_) return;
      seen_wake = wake_count_;
    }
    const StepStats stats = Step();
    if (!stats.progress) {
      // Every task waits for its owner: sleep until one is released, submitted or cancelled.
      std::unique_lock<std::mutex> lock(queue_mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(20),
                   [&] { return stop_ || wake_count_ != seen_wake; });
    }
  }
}

}  // namespace kiln
