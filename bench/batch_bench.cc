// Continuous batching on one cache: aggregate greedy decode tokens/s with N = 1, 2, 4, 8, 16 and
// 32 sessions generating at once, and the time to first token of a new session while 8 others
// decode, through the internal API (Session::Submit + Scheduler::Step from one host thread).
//
// Usage:
//   batch_bench [--model PATH] [--threads T] [--repeats R] [--prompt P] [--decode G]
//               [--sessions 1,2,4,8,16,32] [--ttft-prompt L]
//     Each session gets its own P-token prompt (ids from a fixed seed; default 32) and decodes G
//     tokens (default 64) greedily, end-of-generation tokens banned so every session runs to G.
//     Decode rate: the steps after every session has its first token, until all are done;
//     tokens generated in those steps / their time. Prints the median and min-max over R
//     repeats (default 3) and the ratio to N = 1.
//     TTFT: 8 sessions decoding, then a new session submits an L-token prompt (default 128);
//     the time until its first generated token, stepping as the others keep decoding; median
//     and min-max of R x 3 trials, next to the same prompt's TTFT on an idle cache.
//   batch_bench --game [--frames F] [--budget-ms B] [--npcs K] [--step-tokens S] ...
//     A game loop: 60 frames per second for F frames (default 600), K NPC sessions (default 4)
//     always generating (a finished one submits again), each frame steps the cache with a B ms
//     budget (default 2) as kiln_cache_step does (the units of a pass predicted to fit, at
//     least one when there is work), then sleeps to the next frame. Prints the time spent stepping
//     per frame (p50, p99, max) and the stepping thread's CPU time in it (on a loaded machine
//     the cost without the OS's other processes; all of it with --threads 1), the tokens
//     generated per second, and how many frames went over the budget (of them, how many ran a
//     single unit: the one a step runs even when none is predicted to fit). --step-tokens: the
//     scheduler's tokens per step (EngineOptions). --trace: where the time goes, per unit kind
//     (wall and thread CPU time, measured against predicted, a frame's first unit against the
//     later ones), in the frames over budget (KILN_GAME_TRACE=1 also prints each of them), and
//     in the thread pool (how long the stepping thread waited for workers' ranges, and the
//     workers' wall minus CPU time in them: the time the OS did not run them).
//   --pin-threads (any mode): the engine's worker threads bound to cores of their own
//     (kiln_cache_params.pin_threads).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "lib/backend/cpu/thread_pool.h"
#include "lib/common/platform.h"
#include "lib/engine/engine.h"
#include "lib/model/model.h"
#include "lib/quant/quant.h"
#include "lib/session/session.h"
#include "lib/tokenizer/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct Stats {
  double median = 0, min = 0, max = 0;
};

Stats Summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  Stats s;
  if (v.empty()) return s;
  s.min = v.front();
  s.max = v.back();
  s.median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  return s;
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "batch_bench: %s\n", what.c_str());
  std::exit(1);
}

template <typename T>
T Check(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) Die(std::string(what) + ": " + std::string(v.status().message()));
  return std::move(*v);
}

void Check(const absl::Status& st, const char* what) {
  if (!st.ok()) Die(std::string(what) + ": " + std::string(st.message()));
}

struct Bench {
  kiln::Model* model = nullptr;
  kiln::Engine* engine = nullptr;
  kiln::sample::SamplerParams greedy;
  int prompt_len = 32;
  int decode = 64;
  uint32_t next_seed = 1;

  std::vector<int32_t> Prompt(int len) {
    std::mt19937 rng(next_seed++);
    const int64_t n_vocab = model->hparams().n_vocab;
    std::vector<int32_t> t(len);
    for (int32_t& x : t) x = static_cast<int32_t>(1000 + rng() % (n_vocab - 1000));
    return t;
  }

  std::unique_ptr<kiln::Session> Submit(int prompt, int max_tokens) {
    auto s = Check(kiln::Session::Create(*engine, greedy, 1), "Session::Create");
    kiln::SubmitOptions options;
    options.prompt = Prompt(prompt);
    options.generate.max_tokens = max_tokens;
    Check(s->Submit(options), "Submit");
    return s;
  }

  static int32_t Generated(kiln::Session& s) {
    kiln::PollResult poll;
    Check(s.Poll(0, 0, &poll), "Poll");
    if (poll.done && !poll.status.ok()) Die("request failed: " + poll.status.ToString());
    return poll.n_tokens;
  }

  // Aggregate decode tokens/s of n sessions decoding at once.
  double DecodeRate(int n) {
    std::vector<std::unique_ptr<kiln::Session>> sessions;
    for (int i = 0; i < n; ++i) sessions.push_back(Submit(prompt_len, decode));
    kiln::Scheduler& scheduler = engine->scheduler();
    // Prefill until every session has its first token.
    auto all_started = [&] {
      for (auto& s : sessions) {
        if (Generated(*s) < 1) return false;
      }
      return true;
    };
    while (!all_started()) scheduler.Step();
    int64_t before = 0;
    for (auto& s : sessions) before += Generated(*s);
    const Clock::time_point start = Clock::now();
    while (scheduler.active_tasks() > 0) scheduler.Step();
    const Clock::time_point end = Clock::now();
    int64_t after = 0;
    for (auto& s : sessions) after += Generated(*s);
    return static_cast<double>(after - before) / Seconds(start, end);
  }

  // Seconds from a new session's submit to its first generated token, while `busy` others
  // decode (0: an idle cache).
  double Ttft(int busy, int prompt) {
    std::vector<std::unique_ptr<kiln::Session>> sessions;
    kiln::Scheduler& scheduler = engine->scheduler();
    for (int i = 0; i < busy; ++i) sessions.push_back(Submit(prompt_len, 1 << 20));
    // Let them reach steady decoding.
    for (int k = 0; k < 40 && busy > 0; ++k) scheduler.Step();
    const Clock::time_point start = Clock::now();
    auto fresh = Submit(prompt, 1);
    while (Generated(*fresh) < 1) scheduler.Step();
    const double t = Seconds(start, Clock::now());
    for (auto& s : sessions) s->Cancel();
    while (scheduler.active_tasks() > 0) scheduler.Step();
    return t;
  }
};

// --trace: where the frames' time goes, from the scheduler's unit records.
class FrameTrace {
 public:
  explicit FrameTrace(double budget_ms) : budget_ms_(budget_ms) {}

  // One frame: its step's wall time and the records of its units (consumed).
  void Frame(int frame, double step_ms, std::vector<kiln::UnitRecord>& records, bool verbose) {
    double in_units_ms = 0, cpu_ms = 0;
    for (size_t i = 0; i < records.size(); ++i) {
      const kiln::UnitRecord& r = records[i];
      KindStats& k = kinds_[static_cast<int>(r.kind)];
      const double ms = 1e3 * r.seconds;
      in_units_ms += ms;
      cpu_ms += 1e3 * r.cpu_seconds;
      k.ms.push_back(ms);
      k.cpu_ms.push_back(1e3 * r.cpu_seconds);
      if (r.predicted >= 0) {
        k.over_prediction_ms.push_back(ms - 1e3 * r.predicted);
        // The first unit of a frame (cold caches, threads waking) against the later ones.
        (r.first ? k.first_ratio : k.later_ratio).push_back(r.seconds / r.predicted);
      }
    }
    outside_ms_.push_back(step_ms - in_units_ms);
    if (step_ms <= budget_ms_) {
      records.clear();
      return;
    }
    // An over-budget frame: how much over, and which piece overran its prediction most.
    OverBudget o;
    o.excess_ms = step_ms - budget_ms_;
    o.outside_ms = step_ms - in_units_ms;
    o.descheduled_ms = std::max(0.0, in_units_ms - cpu_ms);
    double worst = -1e9;
    for (const kiln::UnitRecord& r : records) {
      const double over = r.predicted >= 0 ? 1e3 * (r.seconds - r.predicted) : 1e3 * r.seconds;
      if (r.forced) o.forced_ms += 1e3 * r.seconds;
      if (over > worst) {
        worst = over;
        o.worst_kind = r.kind;
        o.worst_over_ms = over;
      }
    }
    over_.push_back(o);
    if (verbose) {
      std::printf("frame %d: %.3f ms (units %.3f, CPU %.3f):", frame, step_ms, in_units_ms, cpu_ms);
      for (const kiln::UnitRecord& r : records) {
        std::printf(" %s%s %.3f/%.3f", KindName(r.kind), r.forced ? "!" : "", 1e3 * r.seconds,
                    1e3 * r.predicted);
      }
      std::printf("\n");
    }
    records.clear();
  }

  // One frame's thread pool waits (ThreadPool::TakeWaitStats over its step): is a frame's wall
  // time over its CPU time a caller waiting for a worker's range, and was that worker descheduled?
  void PoolWaits(double step_ms, double cpu_ms, const kiln::cpu::ThreadPool::WaitStats& w) {
    PoolFrame f;
    f.gap_ms = step_ms - cpu_ms;
    f.wait_ms = 1e3 * w.caller_wait_seconds;
    f.max_wait_ms = 1e3 * w.max_caller_wait_seconds;
    f.worker_desched_ms = 1e3 * (w.worker_range_seconds - w.worker_range_cpu_seconds);
    f.caller_desched_ms = 1e3 * (w.caller_range_seconds - w.caller_range_cpu_seconds);
    f.waits = w.caller_waits;
    f.jobs = w.jobs;
    (step_ms > budget_ms_ ? pool_over_ : pool_within_).push_back(f);
  }

  void Print() const {
    auto pct = [](std::vector<double> v, double p) {
      if (v.empty()) return 0.0;
      std::sort(v.begin(), v.end());
      return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
    };
    auto mean = [](const std::vector<double>& v) {
      double sum = 0;
      for (double x : v) sum += x;
      return v.empty() ? 0.0 : sum / v.size();
    };
    std::printf(
        "trace: per unit kind, ms (wall p50/p99, thread CPU p50/p99; measured minus "
        "predicted p50/p99; measured/predicted mean as a frame's first unit, later)\n");
    for (int i = 0; i < kKinds; ++i) {
      const KindStats& k = kinds_[i];
      if (k.ms.empty()) continue;
      std::printf(
          "  %-7s %5zu: %.3f/%.3f, CPU %.3f/%.3f; over %+.3f/%+.3f; ratio first %.2f (%zu), "
          "later %.2f (%zu)\n",
          KindName(static_cast<kiln::UnitKind>(i)), k.ms.size(), pct(k.ms, 0.5), pct(k.ms, 0.99),
          pct(k.cpu_ms, 0.5), pct(k.cpu_ms, 0.99), pct(k.over_prediction_ms, 0.5),
          pct(k.over_prediction_ms, 0.99), mean(k.first_ratio), k.first_ratio.size(),
          mean(k.later_ratio), k.later_ratio.size());
    }
    std::printf("  step time outside the units per frame: p50 %.3f, p99 %.3f ms\n",
                pct(outside_ms_, 0.5), pct(outside_ms_, 0.99));
    auto print_pool = [&](const char* what, const std::vector<PoolFrame>& v) {
      if (v.empty()) return;
      double gap = 0, wait = 0, max_wait = 0, worker = 0, caller = 0, waits = 0, jobs = 0;
      for (const PoolFrame& f : v) {
        gap += f.gap_ms;
        wait += f.wait_ms;
        max_wait += f.max_wait_ms;
        worker += f.worker_desched_ms;
        caller += f.caller_desched_ms;
        waits += static_cast<double>(f.waits);
        jobs += static_cast<double>(f.jobs);
      }
      const double n = static_cast<double>(v.size());
      std::printf(
          "  pool, %s frames (%zu), means per frame: wall minus CPU %.3f ms; caller waited for "
          "workers %.3f ms in %.0f of %.0f jobs (longest wait %.3f); ranges' wall minus CPU: "
          "workers %.3f, caller %.3f\n",
          what, v.size(), gap / n, wait / n, waits / n, jobs / n, max_wait / n, worker / n,
          caller / n);
    };
    print_pool("within-budget", pool_within_);
    print_pool("over-budget", pool_over_);
    if (over_.empty()) return;
    std::vector<double> excess, outside, forced, desched;
    int worst[kKinds] = {};
    for (const OverBudget& o : over_) {
      excess.push_back(o.excess_ms);
      outside.push_back(o.outside_ms);
      forced.push_back(o.forced_ms);
      desched.push_back(o.descheduled_ms);
      ++worst[static_cast<int>(o.worst_kind)];
    }
    std::printf(
        "  over-budget frames (%zu), means: excess %.3f ms, outside units %.3f, "
        "forced units %.3f, units' wall minus CPU %.3f; most overrun unit:",
        over_.size(), mean(excess), mean(outside), mean(forced), mean(desched));
    for (int i = 0; i < kKinds; ++i) {
      if (worst[i] > 0) {
        std::printf(" %s %d", KindName(static_cast<kiln::UnitKind>(i)), worst[i]);
      }
    }
    std::printf("\n");
  }

 private:
  static constexpr int kKinds = 4;
  static const char* KindName(kiln::UnitKind kind) {
    static const char* const kNames[kKinds] = {"begin", "layer", "head", "finish"};
    return kNames[static_cast<int>(kind)];
  }
  struct KindStats {
    std::vector<double> ms, cpu_ms, over_prediction_ms, first_ratio, later_ratio;
  };
  struct OverBudget {
    double excess_ms = 0, outside_ms = 0, forced_ms = 0, descheduled_ms = 0;
    kiln::UnitKind worst_kind = kiln::UnitKind::kLayer;
    double worst_over_ms = 0;
  };
  struct PoolFrame {
    double gap_ms = 0, wait_ms = 0, max_wait_ms = 0, worker_desched_ms = 0, caller_desched_ms = 0;
    int64_t waits = 0, jobs = 0;
  };
  double budget_ms_;
  std::vector<PoolFrame> pool_within_, pool_over_;
  KindStats kinds_[kKinds];
  std::vector<double> outside_ms_;
  std::vector<OverBudget> over_;
};

// The game loop of --game (see the header comment).
void GameLoop(Bench& b, int frames, double budget_ms, int npcs, bool trace) {
  kiln::Scheduler& scheduler = b.engine->scheduler();
  std::vector<kiln::UnitRecord> records;
  FrameTrace frame_trace(budget_ms);
  const bool verbose = std::getenv("KILN_GAME_TRACE") != nullptr;
  if (trace) {
    scheduler.TraceUnits(&records);
    kiln::cpu::ThreadPool::SetWaitTracing(true);
  }
  std::vector<std::unique_ptr<kiln::Session>> sessions;
  for (int i = 0; i < npcs; ++i) sessions.push_back(b.Submit(b.prompt_len, b.decode));
  const auto frame = std::chrono::microseconds(16667);
  std::vector<double> step_ms, step_cpu_ms;
  std::vector<double> kept_core_ms;  // the steps during which the OS did not preempt this thread
  int over_budget = 0, over_budget_single_unit = 0, preempted = 0, over_budget_preempted = 0;
  int64_t tokens = 0;
  const Clock::time_point begin = Clock::now();
  Clock::time_point next_frame = begin;
  for (int f = 0; f < frames; ++f) {
    const long switches_start = kiln::platform::InvoluntaryContextSwitches();
    const Clock::time_point start = Clock::now();
    const double cpu_start = kiln::platform::ThreadCpuSeconds();
    // kiln_cache_step's call: the units of passes predicted to fit the budget.
    kiln::StepStats st;
    if (scheduler.active_tasks() > 0) st = scheduler.StepWithin(0, budget_ms / 1e3);
    step_ms.push_back(1e3 * Seconds(start, Clock::now()));
    step_cpu_ms.push_back(1e3 * (kiln::platform::ThreadCpuSeconds() - cpu_start));
    const bool lost_core = kiln::platform::InvoluntaryContextSwitches() != switches_start;
    if (lost_core) {
      ++preempted;
    } else {
      kept_core_ms.push_back(step_ms.back());
    }
    if (step_ms.back() > budget_ms) {
      ++over_budget;
      if (st.units == 1) ++over_budget_single_unit;
      if (lost_core) ++over_budget_preempted;
    }
    if (trace) {
      frame_trace.Frame(f, step_ms.back(), records, verbose);
      frame_trace.PoolWaits(step_ms.back(), step_cpu_ms.back(),
                            kiln::cpu::ThreadPool::TakeWaitStats());
    }
    for (auto& s : sessions) {
      kiln::PollResult poll;
      Check(s->Poll(0, 0, &poll), "Poll");
      if (!poll.done) continue;
      if (!poll.status.ok()) Die("request failed: " + poll.status.ToString());
      tokens += poll.n_tokens;
      s = b.Submit(b.prompt_len, b.decode);  // the NPC says something new
    }
    next_frame += frame;
    std::this_thread::sleep_until(next_frame);
  }
  const double seconds = Seconds(begin, Clock::now());
  for (auto& s : sessions) {
    kiln::PollResult poll;
    Check(s->Poll(0, 0, &poll), "Poll");
    tokens += poll.n_tokens;
    s->Cancel();
  }
  scheduler.TraceUnits(nullptr);
  kiln::cpu::ThreadPool::SetWaitTracing(false);
  while (scheduler.active_tasks() > 0) scheduler.Step();
  std::sort(step_ms.begin(), step_ms.end());
  std::sort(step_cpu_ms.begin(), step_cpu_ms.end());
  std::sort(kept_core_ms.begin(), kept_core_ms.end());
  auto pct_of = [](const std::vector<double>& v, double p) {
    return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
  };
  auto pct = [&](double p) { return pct_of(step_ms, p); };
  std::printf("game loop: %d frames at 60 fps, %d NPCs, step budget %.1f ms\n", frames, npcs,
              budget_ms);
  std::printf(
      "time in step per frame: p50 %.2f ms, p95 %.2f ms, p99 %.2f ms, max %.2f ms; %.1f tokens/s\n",
      pct(0.5), pct(0.95), pct(0.99), step_ms.back(), tokens / seconds);
  std::printf("stepping thread's CPU time per frame: p50 %.2f ms, p99 %.2f ms, max %.2f ms\n",
              pct_of(step_cpu_ms, 0.5), pct_of(step_cpu_ms, 0.99), step_cpu_ms.back());
  std::printf(
      "frames over budget: %d (%.1f%%), of them running a single unit: %d, with the stepping "
      "thread preempted by the OS: %d\n",
      over_budget, 100.0 * over_budget / frames, over_budget_single_unit, over_budget_preempted);
  if (!kept_core_ms.empty()) {
    std::printf(
        "frames whose stepping thread kept its core (%d of %d): time in step p50 %.2f ms, p99 "
        "%.2f ms, max %.2f ms\n",
        frames - preempted, frames, pct_of(kept_core_ms, 0.5), pct_of(kept_core_ms, 0.99),
        kept_core_ms.back());
  }
  const kiln::SchedulerCounters c = scheduler.Counters();
  const double n_units = static_cast<double>(std::max<int64_t>(1, c.predicted_units));
  std::printf(
      "passes %lld (split over several frames: %lld), units %lld; per predicted unit: "
      "predicted %.3f ms, measured %.3f ms\n",
      static_cast<long long>(c.steps), static_cast<long long>(c.split_steps),
      static_cast<long long>(c.units), 1e3 * c.predicted_seconds / n_units,
      1e3 * c.actual_seconds / n_units);
  if (trace) frame_trace.Print();
}

std::vector<int> ParseList(const std::string& s) {
  std::vector<int> v;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) v.push_back(std::atoi(item.c_str()));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path;
  if (const char* dir = std::getenv("KILN_MODEL_DIR"); dir && *dir) {
    model_path = std::string(dir) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  } else {
    const char* home = std::getenv("HOME");
    model_path = std::string(home ? home : "") + "/.cache/kiln/SmolLM2-135M-Instruct.Q4_1.gguf";
  }
  int threads = 2, repeats = 3, ttft_prompt = 128, frames = 600, npcs = 4, step_tokens = 0;
  bool game = false, trace = false, pin_threads = false;
  double budget_ms = 2.0;
  std::vector<int> counts = {1, 2, 4, 8, 16, 32};
  Bench b;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) Die("missing value after " + a);
      return argv[++i];
    };
    if (a == "--model") {
      model_path = next();
    } else if (a == "--threads") {
      threads = std::atoi(next().c_str());
    } else if (a == "--repeats") {
      repeats = std::max(1, std::atoi(next().c_str()));
    } else if (a == "--prompt") {
      b.prompt_len = std::max(1, std::atoi(next().c_str()));
    } else if (a == "--decode") {
      b.decode = std::max(2, std::atoi(next().c_str()));
    } else if (a == "--sessions") {
      counts = ParseList(next());
    } else if (a == "--game") {
      game = true;
    } else if (a == "--trace") {
      trace = true;
    } else if (a == "--pin-threads") {
      pin_threads = true;
    } else if (a == "--frames") {
      frames = std::max(1, std::atoi(next().c_str()));
    } else if (a == "--budget-ms") {
      budget_ms = std::atof(next().c_str());
    } else if (a == "--npcs") {
      npcs = std::max(1, std::atoi(next().c_str()));
    } else if (a == "--step-tokens") {
      step_tokens = std::max(1, std::atoi(next().c_str()));
    } else if (a == "--ttft-prompt") {
      ttft_prompt = std::max(1, std::atoi(next().c_str()));
    } else {
      Die("unknown argument " + a);
    }
  }
  kiln::ModelLoadOptions load;
  load.path = model_path;
  auto model = Check(kiln::Model::Load(load), "Model::Load");
  model->WaitUntilPrepared();  // timed runs on the prepared copies (engine_bench.cc)
  kiln::EngineOptions options;
  options.n_threads = threads;
  options.pin_threads = pin_threads;
  options.n_ctx = 8192;  // the pool: room for 32 sessions of prompt + decode tokens
  if (step_tokens > 0) options.step_tokens = step_tokens;
  auto engine = Check(kiln::Engine::Create(*model, options), "Engine::Create");
  b.model = model.get();
  b.engine = engine.get();
  b.greedy.temperature = 0.0f;
  const kiln::Tokenizer& tok = model->tokenizer();
  for (int32_t t = 0; t < tok.n_vocab(); ++t) {
    if (tok.IsEndOfGeneration(t)) b.greedy.logit_bias.push_back({t, -INFINITY});
  }
  std::printf("batch_bench: %s, %d threads, prompt %d, decode %d, %d repeats, %s\n",
              model_path.c_str(), threads, b.prompt_len, b.decode, repeats,
              engine->BackendDescription().c_str());
  if (game) {
    GameLoop(b, frames, budget_ms, npcs, trace);
    return 0;
  }
  std::printf("%-9s %12s %19s %10s %9s\n", "sessions", "tok/s median", "min-max", "per sess",
              "x N=1");
  double base = 0;
  for (int n : counts) {
    std::vector<double> rates;
    for (int r = 0; r < repeats; ++r) rates.push_back(b.DecodeRate(n));
    const Stats s = Summarize(rates);
    if (n == counts.front()) base = s.median;
    std::printf("%-9d %12.1f %9.1f-%-9.1f %10.1f %9.2f\n", n, s.median, s.min, s.max, s.median / n,
                base > 0 ? s.median / base : 0.0);
    std::fflush(stdout);
  }
  std::vector<double> idle, busy;
  for (int r = 0; r < 3 * repeats; ++r) {
    idle.push_back(b.Ttft(0, ttft_prompt));
    busy.push_back(b.Ttft(8, ttft_prompt));
  }
  const Stats si = Summarize(idle), sb = Summarize(busy);
  std::printf("ttft %d-token prompt, idle cache:       %7.1f ms (%.1f-%.1f)\n", ttft_prompt,
              1e3 * si.median, 1e3 * si.min, 1e3 * si.max);
  std::printf("ttft %d-token prompt, 8 sessions decoding: %7.1f ms (%.1f-%.1f)\n", ttft_prompt,
              1e3 * sb.median, 1e3 * sb.min, 1e3 * sb.max);
  return 0;
}
