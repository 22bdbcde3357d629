// Scheduler: the engine's continuous batching. Every session with a request in flight (an append
// to compute, a generation) is a ScheduledTask; each Step packs the work of all of them into one
// ForwardBatch and runs one forward pass:
//   1. decode first: every task with one pending token (a decode step, or a speculative step: the
//      root plus its whole draft tree) in admission order, oldest first;
//   2. then prefill chunks (at most EngineOptions::prefill_chunk tokens of one task) of the tasks
//      with several pending tokens, round robin (the task served first moves on every step), until
//      the step's token budget (EngineOptions::step_tokens) is spent, the first one with at least
//      a small chunk even when decoding used the budget up (Sarathi-Serve's chunked prefill: a
//      long prompt never stalls the decoders for more than one chunk, and new sessions start).
//      A new task whose prompt starts with a full block another task computes in this step waits
//      for the next step, where it attaches that block from the prefix cache instead of
//      computing it twice (it waits only while the other task computes its prefix: no
//      starvation).
// With EngineOptions::llama_cpp_order a step runs one task's work only: llama.cpp's bits depend
// on the batch (docs/numerics.md), so a batched step would change them.
//
// Cache full (a task's slots do not fit): the task preempts the youngest task admitted after it
// that holds K/V and is not in this step's batch yet (preemption by recompute: its blocks are
// released, its tokens stay and are computed again later, bit for bit the same since the kernels
// are batch invariant; full blocks it had computed stay in the prefix cache). When there is none,
// the oldest task fails with ResourceExhausted (nothing it changed stays) and younger ones wait
// for a later step. Only tasks are preempted: a session without a request in flight keeps its
// blocks until it is rewound or destroyed.
//
// A time budget (Step's `seconds`, StepWithin): a pass is split into units of about a layer's
// work: planning + embeddings with the first layer, each further layer, each part of the output
// head (ForwardPass::head_unit_rows of its vocabulary rows, a layer's weight bytes: the head of
// a 49152-token vocabulary is eight layers' worth), then the finish (marking tokens computed and
// the tasks' Finish: sampling). The step predicts each unit's cost (running averages of measured
// times keyed by the pass's token count, times a high quantile of how far units of the kind
// stray above them; see Spread), runs the units that fit and returns; the next step
// continues the same pass where it stopped (ForwardPass::Begin / RunLayers / RunHead / Finish,
// the bits of an unsplit pass). A unit always runs whole, so a budgeted pass takes only as many
// tokens as its first unit is predicted to fit the call's whole budget with (decode tokens
// always; prompt chunks shrink): a layer over a 128-token prompt chunk alone is longer than a
// frame's 2 ms. StepWithin keeps a small share of its budget back (kCallReserve) for its own
// work outside the units. Between those calls the engine mutex is free: sessions may be
// created, submitted, polled, cancelled and destroyed. Removing a task whose tokens are in the
// suspended pass first runs the pass's remaining layers on the removing thread (so that no later
// layer writes K/V into blocks its session frees); the tasks' results wait for the next step.
// Steps without a time budget (blocking calls, the worker) finish a suspended pass and run
// whole passes.
//
// Who steps: any thread. Step runs one step; RunUntil is the loop of a blocking call (it steps
// while no other thread does, else waits for that thread's step); a worker thread (StartWorker)
// steps while there is work. One step at a time per engine; the step holds the engine mutex
// while it plans, runs the forward pass and hands each task its logits (sampling and stop rules
// run there, on the stepping thread). Tasks' Deliver (user callbacks) runs after that, outside
// the engine mutex, still on the stepping thread and before the next step.
//
// Thread-safety: Submit, Remove, Wake, Step, RunUntil and the worker calls are thread-safe.
// A ScheduledTask's methods are called on the stepping thread with the engine mutex held
// (Deliver without it; Fail also from Remove, on the removing thread, when the suspended pass it
// finishes fails).
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "lib/common/status.h"
#include "lib/kv/kv_cache.h"
#include "lib/model/architecture.h"
#include "lib/model/forward_batch.h"

namespace kiln {

class Engine;

// What one task sees of a step after the forward pass.
struct StepRows {
  const ForwardOutput* out = nullptr;
  int32_t batch_begin = 0;  // the task's tokens are batch [batch_begin, batch_end)
  int32_t batch_end = 0;
  size_t row_begin = 0;          // its logits rows are out->LogitsRow(row_begin + i), in order
  double forward_seconds = 0.0;  // the shared pass's time
};

// One request in flight (implemented by Session).
class ScheduledTask {
 public:
  virtual ~ScheduledTask() = default;

  // True while the task waits for its owner (a blocking generate passing a step's tokens to its
  // callback); a held task is skipped and never preempted. Read on the stepping thread.
  bool held() const { return held_.load(std::memory_order_acquire); }
  // True once the task has ended (result recorded); the scheduler drops it after the step.
  virtual bool finished() const = 0;
  // True when its next step is a decode step (one pending token, or ready to sample).
  virtual bool decoding() const = 0;
  // The sequence whose K/V it computes (for preemption: whether it holds any).
  virtual SeqId seq() const = 0;

  // Appends this step's tokens to the end of `batch` (their slots made in `cache`), at most
  // `budget` tokens (a decode step always gets at least 1), and returns how many it added.
  // 0: nothing to compute this step (it may have finished, or be held). It may finish or hold
  // itself here without a forward pass (a stop, a cancel, sampling from logits it already has).
  // ResourceExhausted: the cache is full and nothing changed (the scheduler may preempt
  // another task and ask again); other errors end the task (it records them itself).
  virtual absl::StatusOr<int32_t> Plan(KvCache& cache, int32_t budget, ForwardBatch& batch) = 0;
  // After the forward pass: consumes this step's logits.
  virtual void Finish(KvCache& cache, ForwardPass& pass, const StepRows& rows) = 0;
  // The step's forward pass failed (or the task could not be placed): drop what Plan made and
  // end with `status` (when a Plan had added tokens, they are removed first).
  virtual void Fail(KvCache& cache, const absl::Status& status, bool planned) = 0;
  // Releases every K/V block of the task's sequence; its tokens are computed again later.
  virtual void Preempt(KvCache& cache) = 0;
  // When the task's sequence is empty and its next Plan attaches cached prefix blocks: the tokens
  // it offers the prefix cache (a prompt without its last token); empty otherwise.
  virtual std::span<const int32_t> AttachableTokens(const KvCache& cache) const {
    (void)cache;
    return {};
  }
  // Runs after the step, outside the engine mutex (user callbacks of non-blocking requests).
  virtual void Deliver() {}

 private:
  friend class Scheduler;
  std::atomic<bool> held_{false};  // set and cleared through Scheduler::Hold / Release
};

struct StepStats {
  int32_t tokens = 0;        // batch tokens of the passes completed (0: none)
  int32_t passes = 0;        // forward passes completed
  int32_t units = 0;         // units run (a pass's layers, head parts and finish)
  int32_t worked = 0;        // steps that ran units (began, continued or finished a pass)
  bool suspended = false;    // a pass is begun and not finished (the next step continues it)
  bool out_of_time = false;  // stopped before a unit predicted not to fit the time budget
  int32_t tasks = 0;         // tasks in the last pass begun
  int32_t finished = 0;      // tasks that ended in this step
  int32_t active = 0;        // tasks still in flight after the step
  bool progress = false;     // something ran or ended (false: every task waits for its owner)
};

// Cumulative counts of a scheduler (for tests and benches).
struct SchedulerCounters {
  int64_t steps = 0;                // forward passes run
  int64_t tokens = 0;               // batch tokens they computed
  int64_t batched_steps = 0;        // passes holding the work of two or more tasks
  int32_t max_step_tasks = 0;       // most tasks in one pass
  int64_t preemptions = 0;          // tasks whose K/V were released to make room
  int64_t cache_full_failures = 0;  // tasks ended with ResourceExhausted
  // Steps a prefill task waited because another task computed a block of its prefix in them.
  int64_t prefix_deferrals = 0;
  int64_t split_steps = 0;  // passes spread over two or more Step calls
  int64_t units = 0;        // units run (layers, head parts and finishes)
  int64_t head_units = 0;   // of them, parts of an output head
  // Units run with a prediction of their cost, and the predicted and measured seconds of those.
  int64_t predicted_units = 0;
  double predicted_seconds = 0.0;
  double actual_seconds = 0.0;
};

// The pieces a budgeted step runs a pass in.
enum class UnitKind : uint8_t {
  kBegin,   // planning, Begin (checks, mask, embeddings)
  kLayer,   // one layer
  kHead,    // one part of the output head (ForwardPass::head_unit_rows rows)
  kFinish,  // the rest of the head, the pass's Finish, the tasks' Finish (sampling) and Deliver
};
inline constexpr int kUnitKinds = 4;

// One timed piece of a step, for benches that look where a budgeted frame's time goes
// (Scheduler::TraceUnits).
struct UnitRecord {
  UnitKind kind = UnitKind::kLayer;
  bool first = false;        // the first unit of a call that must progress
  bool forced = false;       // ran without being predicted to fit (a call must progress)
  int32_t tokens = 0;        // the pass's batch tokens
  double predicted = -1.0;   // seconds (< 0: nothing measured yet)
  double start = 0.0;        // steady_clock seconds at its start
  double seconds = 0.0;      // wall time, from the end of the piece before it in the call
  double cpu_seconds = 0.0;  // the stepping thread's CPU time in it
};

class Scheduler {
 public:
  Scheduler(Engine& engine, int32_t step_tokens, bool one_task_per_step);
  ~Scheduler();  // stops the worker; every task must have been removed
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a task (any thread); it joins at the next step. Wakes the worker.
  void Submit(ScheduledTask* task);
  // Takes a task out (finished or not): after it returns no step touches the task. Waits for a
  // step in progress, except on the stepping thread itself (from a Deliver callback), where
  // the step's Deliver skips the removed task.
  void Remove(ScheduledTask* task);
  // Wakes the worker and blocked callers (after a cancel, or a held task released).
  void Wake();
  // Releases a held task (its owner has delivered its tokens).
  void Release(ScheduledTask* task);
  // Marks a task held (by the task itself, in Plan or Finish).
  void Hold(ScheduledTask* task);

  // One step with `budget` tokens (<= 0: the engine's step_tokens). `seconds` <= 0: continues a
  // suspended pass, or plans and runs a new one, to its end. `seconds` > 0: runs the units of
  // the pass predicted to end within `seconds` and suspends it there; `must_progress` runs at
  // least one unit (when there is work) even when none is predicted to fit.
  StepStats Step(int32_t budget = 0, double seconds = 0.0, bool must_progress = true);
  // Steps while tasks are in flight and the next unit is predicted to end within `seconds` of
  // the call (at least one unit runs when there is work): kiln_cache_step. `seconds` <= 0: one
  // Step. Returns the sums over its steps.
  StepStats StepWithin(int32_t budget, double seconds);
  // Steps (or waits for other threads' steps) until done() is true; done is checked after every
  // step and wake. Returns FailedPrecondition when called from a Deliver callback (the stepping
  // thread would wait for itself).
  absl::Status RunUntil(const std::function<bool()>& done);

  // A library-owned thread that steps while any task is in flight. Start when running is a no-op.
  void StartWorker();
  void StopWorker();
  bool worker_running() const {
    std::lock_guard<std::mutex> control(worker_mu_);
    return worker_.joinable();
  }
  int32_t active_tasks() const { return n_active_.load(std::memory_order_acquire); }
  SchedulerCounters Counters() const;
  // Appends a UnitRecord for every unit that steps run from now on to `*sink` (nullptr: stop);
  // the caller reads it between steps. Costs two clock reads per unit while on.
  void TraceUnits(std::vector<UnitRecord>* sink);

  // True on a thread inside a Step (also during its Deliver callbacks).
  static bool InStep();

 private:
  // Step with the time of the whole call (`frame_seconds`: StepWithin's budget, or `seconds`),
  // which bounds the tokens of a pass begun in it (TokensWithin).
  StepStats StepTimed(int32_t budget, double seconds, bool must_progress, double frame_seconds);
  // With step_mu_ held.
  StepStats StepLocked(int32_t budget, double seconds, bool must_progress, double frame_seconds);
  // Plans a new pass into batch_ and planned_ (engine mutex held); false when no task added
  // tokens.
  bool PlanLocked(KvCache& cache, int32_t budget, StepStats& stats);
  void WorkerLoop();

  // A unit's predicted time: the running mean time of its kind for the pass's CostKey, times
  // its kind's spread, a high quantile of how far units stray above their means (measured /
  // mean) over the last Spread::kWindow units of the kind. A budgeted call runs a unit only
  // when it fits the rest of the budget by that prediction, so the quantile bounds how often a
  // call overruns (a mean with a deviation did so in ~3% of frames: unit times are skewed, a
  // layer sometimes takes twice its mean). The first unit of a call has a spread of its own:
  // after the host's frame, caches are cold and the pool's threads asleep.
  class Spread {
   public:
    static constexpr size_t kWindow = 256;
    void Add(double ratio);
    double quantile() const { return quantile_; }

   private:
    std::array<float, kWindow> window_{};
    size_t n_ = 0;  // ratios added (the window holds the last min(n_, kWindow))
    // Before the first measurements: a margin of half the mean, about what a busy machine
    // needs (it settles within the first frames).
    double quantile_ = 1.5;
  };
  struct UnitCost {
    double mean[kUnitKinds] = {-1.0, -1.0, -1.0, -1.0};  // seconds; < 0: not measured yet
  };
  static int32_t CostKey(int32_t tokens);
  // The running mean time of a unit over `tokens` (from the nearest measured key, scaled up
  // when it is smaller); < 0 when nothing was measured.
  double MeanCost(UnitKind kind, int32_t tokens) const;
  // MeanCost times the spread of the kind (of a call's `first` unit, or of a later one).
  double Predict(UnitKind kind, int32_t tokens, bool first) const;
  void Record(UnitKind kind, int32_t tokens, double seconds, bool first);
  // The most tokens, up to `budget`, whose first unit (planning + embeddings + a layer) is
  // predicted to end within `seconds` as the first unit of a call, halving from `budget`; at
  // least 1 (before any unit was measured: kFirstPassTokens). A unit always runs whole, so a prompt
  // chunk whose layer is longer than a frame's budget would overrun every frame that runs it.
  int32_t TokensWithin(int32_t budget, double seconds) const;
  // At most the tokens a pass planned now with `budget` takes (PlanLocked's rules, before it
  // runs): the decoding tasks' tokens, and a prompt chunk's when a task waits to prefill.
  int32_t PassTokensAtMost(int32_t budget);

  Engine& engine_;
  const int32_t step_tokens_;
  const bool one_task_per_step_;

  std::mutex step_mu_;  // one step at a time; taken before the engine mutex
  // Under the engine mutex (touched only inside steps and Remove):
  std::vector<ScheduledTask*> tasks_;  // admission order, oldest first
  size_t round_robin_ = 0;             // the prefill task served first in the next step
  ForwardBatch batch_;
  ForwardOutput out_;
  struct Planned {
    ScheduledTask* task;
    int32_t begin, end;
  };
  std::vector<Planned> planned_;
  std::vector<ScheduledTask*> deliver_;  // tasks of the last step, for Deliver
  SchedulerCounters counters_;
  // The suspended pass (planned_, batch_ and out_ stay as planned until its tasks finish).
  bool suspended_ = false;
  bool head_done_ = false;        // every unit ran (Remove may do that); the tasks' Finish is next
  int32_t pass_tokens_ = 0;       // its batch tokens
  int32_t pass_calls_ = 0;        // Step calls that ran its units
  double pass_seconds_ = 0.0;     // time of its units so far
  int32_t last_pass_tokens_ = 0;  // the last pass begun (0: none yet)
  int32_t last_decode_tokens_ = 0;  // of them, decode tokens (a decode step's, draft trees)
  std::vector<std::pair<int32_t, UnitCost>> unit_costs_;  // sorted by key
  Spread spreads_[kUnitKinds][2];                         // [kind][a call's first unit]
  std::vector<UnitRecord>* trace_ = nullptr;              // TraceUnits

  // queue_mu_ guards incoming_, step_count_, n_held_ waits, stop_.
  std::mutex queue_mu_;
  std::condition_variable cv_;
  std::vector<ScheduledTask*> incoming_;
  uint64_t step_count_ = 0;
  uint64_t wake_count_ = 0;
  int32_t n_held_ = 0;
  std::atomic<int32_t> n_active_{0};
  bool stop_ = false;
  // worker_mu_ serializes StartWorker and StopWorker from any threads (two stoppers must not both
  // join worker_, nor a starter test joinable() while a stopper joins); taken before queue_mu_.
  mutable std::mutex worker_mu_;
  std::thread worker_;
};

}  // namespace kiln
