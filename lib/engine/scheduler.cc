#include "lib/engine/scheduler.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <climits>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "lib/common/platform.h"
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
// The tokens of a budgeted call's pass before any layer was measured: few enough that a layer
// over them fits a frame's budget on slow CPUs too (a 32-token layer of the default model takes
// 5-7 ms on a 2-core AVX2 machine, 4 tokens well under 1 ms). Later passes grow from what it
// measured (MeanCost scales a smaller key's cost up linearly: a cautious guess).
constexpr int32_t kFirstPassTokens = 4;

// The weight of a new measurement in a unit's running mean cost.
constexpr double kCostAlpha = 0.25;
// The quantile of measured / mean a unit's prediction covers (Scheduler::Spread): a call ends
// past its budget only when its last unit strays further, about one frame in a hundred at most.
constexpr double kSpreadQuantile = 0.99;
// The share of a budgeted call's time (StepWithin) kept back from its units: for the call's own
// work outside them (10-35 us of a 2 ms budget in batch_bench --game --trace) and a last unit
// straying beyond its spread. Measured (batch_bench --game, 2 ms, 3 runs each at 1 and 2
// threads): p99 1.96-2.05 ms without it, 1.88-1.96 with 3%, 1.87-1.94 with 5%.
constexpr double kCallReserve = 0.03;
// The largest spread: beyond it a unit's overrun comes from the OS running other processes in
// the middle of it (a descheduled unit takes 5-10 times its mean at load average 25), which no
// prediction avoids; following it there cut tokens/s by half with frames still over budget.
constexpr double kMaxSpread = 2.0;
// The spread's quantile is recomputed every this many measurements.
constexpr size_t kSpreadRefresh = 16;

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double ClockSeconds(Clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

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
  engine_.Locked([&](KvCache& cache, ForwardPass& pass) {
    const bool in_pass = std::any_of(planned_.begin(), planned_.end(),
                                     [&](const Planned& p) { return p.task == task; });
    if (suspended_ && !head_done_ && in_pass) {
      // Its session frees its blocks next: run the rest of the pass now, so that no layer
      // writes K/V there later (nor Finish marks them computed). The tasks' Finish waits for the
      // next step.
      absl::Status st = pass.RunLayers(pass.n_layers());
      if (st.ok()) st = pass.Finish();
      if (st.ok()) {
        head_done_ = true;
      } else {
        for (const Planned& p : planned_) {
          if (p.task != nullptr) p.task->Fail(cache, st, /*planned=*/true);
        }
        planned_.clear();
        suspended_ = false;
      }
    }
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

void Scheduler::TraceUnits(std::vector<UnitRecord>* sink) {
  std::lock_guard<std::mutex> step_lock(step_mu_);
  trace_ = sink;
}

SchedulerCounters Scheduler::Counters() const {
  return engine_.Locked([&](KvCache&, ForwardPass&) { return counters_; });
}

StepStats Scheduler::Step(int32_t budget, double seconds, bool must_progress) {
  return StepTimed(budget, seconds, must_progress, seconds);
}

StepStats Scheduler::StepTimed(int32_t budget, double seconds, bool must_progress,
                               double frame_seconds) {
  StepStats stats;
  {
    std::lock_guard<std::mutex> step_lock(step_mu_);
    t_in_step = true;
    stats = StepLocked(budget, seconds, must_progress, frame_seconds);
    t_in_step = false;
  }
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    ++step_count_;
  }
  cv_.notify_all();
  return stats;
}

StepStats Scheduler::StepWithin(int32_t budget, double seconds) {
  if (seconds <= 0.0) return Step(budget);
  seconds *= 1.0 - kCallReserve;
  const Clock::time_point start = Clock::now();
  StepStats total;
  bool first = true;
  while (active_tasks() > 0) {
    const double left = seconds - SecondsSince(start);
    if (left <= 0.0) break;
    const StepStats s = StepTimed(budget, left, /*must_progress=*/first, seconds);
    first = false;
    total.tokens += s.tokens;
    total.passes += s.passes;
    total.units += s.units;
    total.worked += s.worked;
    total.tasks = s.tasks;
    total.finished += s.finished;
    total.active = s.active;
    total.suspended = s.suspended;
    total.out_of_time = s.out_of_time;
    total.progress = total.progress || s.progress;
    if (!s.progress || s.out_of_time) break;
  }
  return total;
}

int32_t Scheduler::CostKey(int32_t tokens) {
  // Exact up to 64 tokens (decode batches: a unit's cost there is mostly reading the weights),
  // powers of two above (prefill: cost grows with the tokens).
  if (tokens <= 64) return tokens;
  return static_cast<int32_t>(std::bit_ceil(static_cast<uint32_t>(tokens)));
}

void Scheduler::Spread::Add(double ratio) {
  window_[n_ % kWindow] = static_cast<float>(ratio);
  ++n_;
  if (n_ % kSpreadRefresh != 0) return;
  const size_t n = std::min(n_, kWindow);
  std::array<float, kWindow> sorted = window_;
  const size_t index =
      std::min(n - 1, static_cast<size_t>(std::ceil(kSpreadQuantile * static_cast<double>(n))) - 1);
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(index),
                   sorted.begin() + static_cast<std::ptrdiff_t>(n));
  quantile_ = std::min<double>(sorted[index], kMaxSpread);
}

double Scheduler::MeanCost(UnitKind kind, int32_t tokens) const {
  const int32_t key = CostKey(tokens);
  const int k_index = static_cast<int>(kind);
  double best = -1.0;
  double best_distance = 0.0;
  for (const auto& [k, cost] : unit_costs_) {
    const double mean = cost.mean[k_index];
    if (mean < 0.0) continue;
    if (k == key) return mean;
    const double distance = std::abs(std::log(static_cast<double>(k) / key));
    if (best < 0.0 || distance < best_distance) {
      best = mean * std::max(1.0, static_cast<double>(key) / k);
      best_distance = distance;
    }
  }
  return best;
}

double Scheduler::Predict(UnitKind kind, int32_t tokens, bool first) const {
  const double mean = MeanCost(kind, tokens);
  if (mean < 0.0) return mean;
  return mean * spreads_[static_cast<int>(kind)][first ? 1 : 0].quantile();
}

void Scheduler::Record(UnitKind kind, int32_t tokens, double seconds, bool first) {
  const double predicted_mean = MeanCost(kind, tokens);
  if (predicted_mean > 0.0) {
    spreads_[static_cast<int>(kind)][first ? 1 : 0].Add(seconds / predicted_mean);
  }
  const int32_t key = CostKey(tokens);
  auto it = std::lower_bound(unit_costs_.begin(), unit_costs_.end(), key,
                             [](const auto& entry, int32_t k) { return entry.first < k; });
  if (it == unit_costs_.end() || it->first != key) it = unit_costs_.insert(it, {key, UnitCost{}});
  double& mean = it->second.mean[static_cast<int>(kind)];
  mean = mean < 0.0 ? seconds : mean + kCostAlpha * (seconds - mean);
}

int32_t Scheduler::PassTokensAtMost(int32_t budget) {
  int32_t decoding = 0;
  bool prefill = false;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    prefill = !incoming_.empty();
  }
  for (const ScheduledTask* t : tasks_) {
    if (t->finished() || t->held()) continue;
    if (t->decoding()) {
      ++decoding;
    } else {
      prefill = true;
    }
  }
  // A decoding task adds one token, or its draft tree (as many as last time, at most).
  decoding = std::max(decoding, last_decode_tokens_);
  // PlanLocked: the first prompt chunk gets what decoding left of the budget, and at least
  // kMinPrefill of it.
  return prefill ? std::max(budget, decoding + std::min(budget, kMinPrefill))
                 : std::max(decoding, 1);
}

int32_t Scheduler::TokensWithin(int32_t budget, double seconds) const {
  // Nothing measured yet: a small pass first, to measure.
  if (MeanCost(UnitKind::kLayer, budget) < 0.0) return std::min(budget, kFirstPassTokens);
  int32_t tokens = budget;
  while (tokens > 1) {
    const double first_unit = std::max(0.0, Predict(UnitKind::kBegin, tokens, true)) +
                              std::max(0.0, Predict(UnitKind::kLayer, tokens, true));
    if (first_unit <= seconds) break;
    tokens /= 2;
  }
  return std::max(tokens, 1);
}

StepStats Scheduler::StepLocked(int32_t budget, double seconds, bool must_progress,
                                double frame_seconds) {
  const Clock::time_point call_start = Clock::now();
  const double call_cpu = trace_ != nullptr ? platform::ThreadCpuSeconds() : 0.0;
  // Appends a trace record of a piece that began at `start` (with `cpu` thread CPU seconds).
  auto trace = [&](UnitKind kind, bool first, bool forced, double predicted,
                   Clock::time_point start, double cpu) {
    if (trace_ == nullptr) return;
    trace_->push_back({kind, first, forced, pass_tokens_, predicted, ClockSeconds(start),
                       SecondsSince(start), platform::ThreadCpuSeconds() - cpu});
  };
  const bool timed = seconds > 0.0;
  // The next unit is the first of a budgeted call that must progress (its spread is its own).
  bool first = timed && must_progress;
  if (budget <= 0) budget = step_tokens_;
  if (!timed && !suspended_) {
    // Give the owners of held tasks a moment to pass on their tokens, so that they join this
    // step instead of every other one.
    std::unique_lock<std::mutex> lock(queue_mu_);
    if (n_held_ > 0) cv_.wait_for(lock, kHeldWait, [&] { return n_held_ == 0 || stop_; });
  }
  StepStats stats;
  bool completed = false;  // no pass is left suspended: drop finished tasks, deliver
  // A unit's time runs from the end of the piece before it in this call (the call's start for
  // the first), so the scheduler's own work between units is part of what it predicts.
  Clock::time_point mark = call_start;
  double mark_cpu = call_cpu;
  // The finish unit ran in this call: it is recorded after the tasks' Deliver, whose time
  // (and the dropping of finished tasks) it includes.
  bool finish_ran = false;
  bool finish_first = false;
  bool finish_forced = false;
  double finish_predicted = -1.0;
  Clock::time_point finish_start;
  double finish_cpu = 0.0;
  engine_.Locked([&](KvCache& cache, ForwardPass& pass) {
    bool begun_now = false;
    if (!suspended_) {
      // Decode tokens join whatever this allows; prompt chunks get what is left of it.
      if (timed) budget = TokensWithin(budget, frame_seconds);
      if (timed && !must_progress) {
        // Planning changes the tasks (slots, sampling): only begin a pass whose first unit is
        // expected to fit. A prompt chunk sized for a whole frame does not fit the rest of
        // one: the pass waits for the next call, where it comes first.
        const int32_t tokens = PassTokensAtMost(budget);
        const double first_unit =
            Predict(UnitKind::kBegin, tokens, false) + Predict(UnitKind::kLayer, tokens, false);
        if (last_pass_tokens_ > 0 && first_unit > seconds - SecondsSince(call_start)) {
          stats.out_of_time = true;
          return 0;
        }
      }
      if (!PlanLocked(cache, budget, stats)) {
        completed = true;
      } else {
        begun_now = true;
        absl::Status st = pass.Begin(batch_, cache, &out_);
        if (!st.ok()) {
          for (const Planned& p : planned_) p.task->Fail(cache, st, /*planned=*/true);
          completed = true;
        } else {
          suspended_ = true;
          head_done_ = false;
          pass_tokens_ = last_pass_tokens_ = static_cast<int32_t>(batch_.tokens.size());
          pass_calls_ = 0;
          pass_seconds_ = 0.0;
          const double begin_seconds = SecondsSince(call_start);
          trace(UnitKind::kBegin, first, must_progress,
                trace_ != nullptr ? Predict(UnitKind::kBegin, pass_tokens_, first) : -1.0,
                call_start, call_cpu);
          Record(UnitKind::kBegin, pass_tokens_, begin_seconds, first);
          pass_seconds_ += begin_seconds;
          mark = call_start + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(begin_seconds));
          if (trace_ != nullptr) mark_cpu = platform::ThreadCpuSeconds();
        }
      }
    }
    if (suspended_) {
      ++pass_calls_;
      const int32_t n_layers = pass.n_layers();
      // The first unit of a call always runs when it must progress, and the first layer of a
      // pass begun in this call (it was predicted before planning).
      bool forced = must_progress || begun_now || !timed;
      // The tasks' Finish (sampling) right after the pass's Finish, timed with it.
      bool tasks_finished = false;
      auto finish_tasks = [&] {
        // Logits rows come in batch order, one per token that wanted them.
        size_t row = 0;
        int32_t next = 0;
        for (const Planned& p : planned_) {
          for (; next < p.begin; ++next) row += batch_.tokens[next].want_logits ? 1 : 0;
          if (p.task == nullptr) continue;  // removed while the pass was suspended
          StepRows rows{&out_, p.begin, p.end, row, pass_seconds_};
          p.task->Finish(cache, pass, rows);
        }
        tasks_finished = true;
      };
      absl::Status st;
      while (!head_done_) {
        // The next unit: a layer, a part of the output head, or the finish.
        const bool layer = pass.next_layer() < n_layers;
        const bool head_part = !layer && pass.next_head_row() < pass.head_rows();
        const bool finish = !layer && !head_part;
        const UnitKind kind = layer       ? UnitKind::kLayer
                              : head_part ? UnitKind::kHead
                                          : UnitKind::kFinish;
        const double predicted = Predict(kind, pass_tokens_, first);
        if (timed && !forced && predicted > seconds - SecondsSince(call_start)) {
          stats.out_of_time = true;
          break;
        }
        const bool ran_forced = forced && timed;
        const bool ran_first = first;
        forced = !timed;
        first = false;
        const Clock::time_point unit_start = Clock::now();
        if (layer) {
          st = pass.RunLayers(pass.next_layer() + 1);
        } else if (head_part) {
          st = pass.RunHead(pass.next_head_row() + pass.head_unit_rows());
        } else {
          st = pass.Finish();
          if (st.ok()) {
            pass_seconds_ += SecondsSince(unit_start);
            finish_tasks();
          }
        }
        if (!finish) pass_seconds_ += SecondsSince(unit_start);
        ++stats.units;
        ++counters_.units;
        if (head_part) ++counters_.head_units;
        if (!st.ok()) break;
        if (finish) {
          head_done_ = true;
          finish_ran = true;
          finish_first = ran_first;
          finish_forced = ran_forced;
          finish_predicted = predicted;
          finish_start = mark;
          finish_cpu = mark_cpu;
          break;
        }
        const double actual = SecondsSince(mark);
        if (predicted >= 0.0) {
          ++counters_.predicted_units;
          counters_.predicted_seconds += predicted;
          counters_.actual_seconds += actual;
        }
        trace(kind, ran_first, ran_forced, predicted, mark, mark_cpu);
        Record(kind, pass_tokens_, actual, ran_first);
        mark += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(actual));
        if (trace_ != nullptr) mark_cpu = platform::ThreadCpuSeconds();
      }
      if (!st.ok()) {
        for (const Planned& p : planned_) {
          if (p.task != nullptr) p.task->Fail(cache, st, /*planned=*/true);
        }
        suspended_ = false;
        completed = true;
      } else if (head_done_) {
        if (!tasks_finished) finish_tasks();  // Remove ran the head
        if (pass_calls_ > 1) ++counters_.split_steps;
        suspended_ = false;
        completed = true;
        stats.passes = 1;
        stats.tokens = pass_tokens_;
      }
    }
    stats.suspended = suspended_;
    if (!completed) return 0;
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
  stats.worked = stats.units > 0 || stats.passes > 0 ? 1 : 0;
  if (!completed) {
    stats.active = n_active_.load(std::memory_order_acquire);
    stats.progress = stats.units > 0;
    return stats;
  }
  stats.progress = stats.units > 0 || stats.passes > 0 || stats.finished > 0;
  for (size_t i = 0; i < deliver_.size(); ++i) {
    if (deliver_[i] != nullptr) deliver_[i]->Deliver();
  }
  deliver_.clear();
  if (finish_ran) {
    // Unit costs are the stepping thread's (step_mu_ held); the counters are read under the
    // engine mutex.
    const double actual = SecondsSince(finish_start);
    trace(UnitKind::kFinish, finish_first, finish_forced, finish_predicted, finish_start,
          finish_cpu);
    Record(UnitKind::kFinish, pass_tokens_, actual, finish_first);
    if (finish_predicted >= 0.0) {
      engine_.Locked([&](KvCache&, ForwardPass&) {
        ++counters_.predicted_units;
        counters_.predicted_seconds += finish_predicted;
        counters_.actual_seconds += actual;
        return 0;
      });
    }
  }
  return stats;
}

// Plans the next pass into batch_ and planned_; false when no task added tokens.
bool Scheduler::PlanLocked(KvCache& cache, int32_t budget, StepStats& stats) {
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
    last_decode_tokens_ = used;
    // A new task whose prompt starts with a full block that a task planned in this step
    // completes: next step it attaches the block instead.
    auto shares_block_in_flight = [&](const ScheduledTask* t) {
      const std::span<const int32_t> want = t->AttachableTokens(cache);
      const int32_t bs = cache.block_size();
      if (static_cast<int32_t>(want.size()) < bs) return false;
      for (const Planned& p : planned_) {
        // The causal cache indices [first, end) p computes in this step.
        int32_t first = INT32_MAX, end = 0;
        for (int32_t i = p.begin; i < p.end; ++i) {
          const BatchToken& b = batch_.tokens[i];
          if (b.parent >= 0) continue;
          first = std::min(first, b.cache_index);
          end = std::max(end, b.cache_index + 1);
        }
        // The first block that completes in this step ends at first_end; want must cover it.
        const int32_t first_end = (first / bs + 1) * bs;
        if (end <= first || first_end > std::min<int32_t>(end, want.size())) continue;
        auto tokens = cache.Tokens(p.task->seq());
        if (tokens.ok() && std::equal(want.begin(), want.begin() + first_end, tokens->begin())) {
          return true;
        }
      }
      return false;
    };
    // 2. Prefill chunks, round robin, within the budget; the first prefill task gets at least
    // kMinPrefill tokens so that new sessions start even when decoding fills the budget.
    bool first = true;
    for (size_t k = 0; k < n && (first || used < budget); ++k) {
      ScheduledTask* t = tasks_[(round_robin_ + k) % n];
      if (!runnable(t) || t->decoding()) continue;
      if (shares_block_in_flight(t)) {
        ++counters_.prefix_deferrals;
        continue;
      }
      place(t, first ? std::max(budget - used, std::min(budget, kMinPrefill)) : budget - used);
      first = false;
    }
    if (n > 0) round_robin_ = (round_robin_ + 1) % n;
  }
  stats.tasks = static_cast<int32_t>(planned_.size());
  if (batch_.tokens.empty()) return false;
  ++counters_.steps;
  counters_.tokens += static_cast<int64_t>(batch_.tokens.size());
  if (stats.tasks >= 2) ++counters_.batched_steps;
  counters_.max_step_tasks = std::max(counters_.max_step_tasks, stats.tasks);
  return true;
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
      const StepStats stats = StepLocked(0, 0.0, true, 0.0);
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
