// End-to-end CPU engine speed: prefill of a 512-token prompt and greedy decode at contexts 128
// and 1,024, on a real GGUF, through the internal API (Model, Engine). Also a
// memory read-bandwidth probe. bench/bench_decode.py drives this next to llama.cpp; see
// bench/README.md.
//
// Usage:
//   engine_bench [--model PATH] [--threads T] [--repeats R] [--decode N] [--tokens FILE]
//                [--json] [--mla-prefill absorbed|measured] [--llama-cpp-order] [--backend
//                cpu|cuda] [--decode4096] [--block-size B] [--kv-type f16|q8_0]
//                [--pool-breakdown]
//     --tokens: whitespace-separated prompt token ids (at least 1,024; default: ids derived from
//     a fixed seed). Decode continues each prompt greedily (argmax) for N tokens (default 64).
//     Prints, per metric, the median and min-max tokens/s over R repeats, the greedy tokens, the
//     bytes the roofline counts, and the process's peak RSS; --json prints one JSON object per
//     repeat instead (for the driver). --mla-prefill: EngineOptions::mla_prefill for MLA models
//     (default absorbed, the library's). --llama-cpp-order: the engine in llama.cpp's numeric
//     order (EngineOptions::llama_cpp_order; docs/numerics.md). --backend cuda: the engine on
//     CUDA device 0 (EngineOptions::backend; the backend it got is printed). --block-size: the
//     K/V cache's tokens per block (EngineOptions::block_size, default 16). --kv-type: the K/V
//     cache's element type (EngineOptions::kv_type, default f16). --pool-breakdown: where
//     decode128's wall time goes, per token, from the CPU thread pool's tracing (wall clock only;
//     ThreadPool::SetWaitTracing): pool jobs, the caller's time outside them, in its own ranges and
//     waiting for the workers' ranges after its own, the workers' ranges and their wake-up from a
//     job's publication (sums over the workers).
//   engine_bench --widths [--tree] [--model PATH] [--threads T] [--repeats R] [--context N]
//     The cost of a speculative verification pass: after an N-token prefill (default 256,
//     at most 1,000), one Forward of w = 1..9 causal tokens with logits for every row (then
//     truncated back), R x 20 times per width (the widths in turn within each round); prints the
//     median ms per pass and its ratio to w = 1 (the c(w) of docs/speculative.md), so kernel work
//     on multi-token passes can be judged in isolation, and the c(w) list that
//     tools/train/train_medusa.py --pass-costs takes. --tree: the pass of a Medusa tree instead
//     (the w - 1 extra tokens children of the first, tree-masked, with hidden states).
//   engine_bench --bandwidth [--threads T] [--repeats R]
//     Streams a 1 GiB buffer with T threads (each reads a contiguous 1/T of it with 256-bit
//     loads) R times; prints the median and min-max GB/s (1 GB = 1e9 bytes).
//
// Per repeat, the timed phases are:
//   prefill512: a fresh sequence, the prompt's first 512 tokens in one Forward, logits for the
//               last token only (tokens/s = 512 / time);
//   decode1024: the same sequence extended (untimed) to 1,024 tokens, then N greedy steps, one
//               token per Forward, argmax included (tokens/s = N / time);
//   decode128:  a fresh sequence of the first 128 prompt tokens (untimed), then N greedy steps;
//   decode4096 (with --decode4096; the prompt then needs 4,096 tokens): a fresh sequence of the
//               first 4,096 prompt tokens (untimed, in Forwards of 1,024), then N greedy steps.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "lib/backend/cpu/thread_pool.h"
#include "lib/engine/engine.h"
#include "lib/kv/kv_cache.h"
#include "lib/model/forward_batch.h"
#include "lib/model/model.h"

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
  const size_t n = v.size();
  s.median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  s.min = v.front();
  s.max = v.back();
  return s;
}

// VmHWM of this address space. (getrusage's ru_maxrss is not used: Linux carries it over
// exec from the parent that forked us, e.g. a Python driver holding llama.cpp models.)
long PeakRssKiB() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atol(line.c_str() + 6);
  }
  return -1;
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "engine_bench: %s\n", what.c_str());
  std::exit(1);
}

// The value named `v` among an option's choices; dies naming them all otherwise.
template <typename T>
T ParseChoice(const std::string& option, const std::string& v,
              std::initializer_list<std::pair<const char*, T>> choices) {
  std::string names;
  for (const auto& [name, value] : choices) {
    if (v == name) return value;
    names += names.empty() ? name : std::string(" or ") + name;
  }
  Die(option + " must be " + names + ", not " + v);
}

// ---- Bandwidth ----------------------------------------------------------------------------

// Sum of the buffer's 64-bit words in [begin, end), read with 256-bit loads (4 independent
// accumulators so the loop is load-bound, not add-latency-bound).
__attribute__((target("avx2"))) uint64_t StreamRead(const uint64_t* begin, const uint64_t* end) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  const uint64_t* p = begin;
  for (; p + 16 <= end; p += 16) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + 4)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + 8)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + 12)));
  }
  a0 = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), a0);
  uint64_t sum = lanes[0] + lanes[1] + lanes[2] + lanes[3];
  for (; p < end; ++p) sum += *p;
  return sum;
}

int RunBandwidth(int threads, int repeats, bool json) {
  constexpr size_t kBytes = size_t{1} << 30;
  const size_t n = kBytes / sizeof(uint64_t);
  std::unique_ptr<uint64_t, decltype(&std::free)> buf(
      static_cast<uint64_t*>(std::aligned_alloc(64, kBytes)), &std::free);
  if (!buf) Die("cannot allocate 1 GiB");
  // Touch every page (and give the words distinct values) before timing.
  for (size_t i = 0; i < n; ++i) buf.get()[i] = i;
  std::vector<double> gbs;
  uint64_t checksum = 0;
  for (int r = 0; r < repeats; ++r) {
    std::vector<uint64_t> sums(threads);
    const auto t0 = Clock::now();
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) {
      pool.emplace_back([&, t] {
        sums[t] = StreamRead(buf.get() + n * t / threads, buf.get() + n * (t + 1) / threads);
      });
    }
    sums[0] = StreamRead(buf.get(), buf.get() + n / threads);
    for (auto& th : pool) th.join();
    const auto t1 = Clock::now();
    for (uint64_t s : sums) checksum += s;
    gbs.push_back(kBytes / Seconds(t0, t1) / 1e9);
  }
  // n(n-1)/2 per pass: proves every word was read.
  const uint64_t expect = static_cast<uint64_t>(repeats) * (n * (n - 1) / 2);
  if (checksum != expect) Die("bandwidth checksum mismatch");
  const Stats s = Summarize(gbs);
  if (json) {
    std::printf("{\"bandwidth_gbs\": %.3f, \"min\": %.3f, \"max\": %.3f, \"threads\": %d}\n",
                s.median, s.min, s.max, threads);
  } else {
    std::printf("read bandwidth, %d thread(s), 1 GiB x %d: median %.2f GB/s (min %.2f, max %.2f)\n",
                threads, repeats, s.median, s.min, s.max);
  }
  return 0;
}

// ---- Engine -------------------------------------------------------------------------------

struct Bench {
  std::unique_ptr<kiln::Model> model;
  std::unique_ptr<kiln::Engine> engine;
  kiln::ForwardBatch batch;
  kiln::ForwardOutput out;

  void Check(const absl::Status& s, const char* what) {
    if (!s.ok()) Die(std::string(what) + ": " + std::string(s.message()));
  }
  // fn(KvCache&) under the engine's lock.
  template <typename Fn>
  auto Cache(Fn&& fn) {
    return engine->Locked([&](kiln::KvCache& cache, kiln::ForwardPass&) { return fn(cache); });
  }
  // Appends `tokens` to seq and runs `batch` (built by the caller for them).
  void Run(kiln::SeqId seq, std::span<const int32_t> tokens, const char* what) {
    Check(engine->Locked([&](kiln::KvCache& cache, kiln::ForwardPass& pass) -> absl::Status {
      KILN_RETURN_IF_ERROR(cache.AppendSlots(seq, tokens));
      return pass.Forward(batch, cache, &out);
    }),
          what);
  }

  // Appends tokens [begin, end) of `prompt` to `seq` as one Forward; logits for the last one.
  void Prefill(kiln::SeqId seq, const std::vector<int32_t>& prompt, int begin, int end) {
    batch.Clear();
    for (int i = begin; i < end; ++i) batch.Add(prompt[i], seq, i, i == end - 1);
    Run(seq, std::span(prompt).subspan(begin, end - begin), "Forward (prefill)");
  }

  int32_t Argmax() const {
    const float* row = out.LogitsRow(0);
    return static_cast<int32_t>(std::max_element(row, row + out.n_vocab) - row);
  }

  // n greedy steps after the sequence's current end (position `pos`); the tokens go to *gen.
  void Decode(kiln::SeqId seq, int pos, int n, std::vector<int32_t>* gen) {
    int32_t tok = Argmax();
    gen->clear();
    for (int i = 0; i < n; ++i) {
      gen->push_back(tok);
      batch.Clear();
      batch.Add(tok, seq, pos + i, true);
      Run(seq, std::span(&tok, 1), "Forward (decode)");
      tok = Argmax();
    }
  }
};

// See --widths in the header comment.
int RunWidths(Bench& e, const std::vector<int32_t>& prompt, int threads, int repeats, int context,
              bool tree) {
  constexpr int kMaxWidth = 9, kPassesPerRepeat = 20;
  const kiln::SeqId seq = e.Cache([](kiln::KvCache& c) { return c.CreateSequence(); });
  e.Prefill(seq, prompt, 0, context);
  std::printf(
      "verification pass cost after %d tokens, %d thread(s), logits for every row%s; widths "
      "interleaved within each of %d rounds\n",
      context, threads,
      tree ? ", the w - 1 extra tokens children of the first (tree mask) with hidden states" : "",
      repeats * kPassesPerRepeat);
  // ms[w - 1]: one sample per round. The widths take turns within a round, so a drift in the
  // machine's speed (a loaded neighbour) touches every width alike.
  std::vector<std::vector<double>> ms(kMaxWidth);
  for (int i = 0; i < repeats * kPassesPerRepeat; ++i) {
    for (int w = 1; w <= kMaxWidth; ++w) {
      std::span<const int32_t> tokens(prompt.data() + context, w);
      e.batch.Clear();
      e.batch.want_hidden = tree;
      for (int j = 0; j < w; ++j) {
        if (tree && j > 0) {
          // A depth-1 node of a Medusa tree: position after the root, its own cache slot.
          e.batch.Add(tokens[j], seq, context + 1, true, /*parent=*/0, /*cache_index=*/context + j);
        } else {
          e.batch.Add(tokens[j], seq, context + j, true);
        }
      }
      e.Check(e.engine->Locked([&](kiln::KvCache& cache, kiln::ForwardPass& pass) -> absl::Status {
        KILN_RETURN_IF_ERROR(cache.AppendSlots(seq, tokens));
        const auto t0 = Clock::now();
        absl::Status st = pass.Forward(e.batch, cache, &e.out);
        ms[w - 1].push_back(1e3 * Seconds(t0, Clock::now()));
        return st;
      }),
              "Forward (width)");
      e.Check(e.Cache([&](kiln::KvCache& c) { return c.Truncate(seq, context); }), "Truncate");
    }
  }
  const double one_token_ms = Summarize(ms[0]).median;
  std::string costs;
  for (int w = 1; w <= kMaxWidth; ++w) {
    const Stats s = Summarize(ms[w - 1]);
    std::printf("  w=%d  median %6.3f ms (min %.3f, max %.3f)  c(w) %.3f  per extra token %.3f\n",
                w, s.median, s.min, s.max, s.median / one_token_ms,
                w > 1 ? (s.median / one_token_ms - 1) / (w - 1) : 0.0);
    char buf[16];
    std::snprintf(buf, sizeof(buf), w > 1 ? ",%.3f" : "%.3f", s.median / one_token_ms);
    costs += buf;
  }
  // The measured curve, as tools/train/train_medusa.py --pass-costs takes it.
  std::printf("c(w) for w = 1..%d: %s\n", kMaxWidth, costs.c_str());
  return 0;
}

std::string JoinTokens(const std::vector<int32_t>& v) {
  std::string s;
  char buf[16];
  for (size_t i = 0; i < v.size(); ++i) {
    std::snprintf(buf, sizeof(buf), i ? ",%d" : "%d", v[i]);
    s += buf;
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path, tokens_path;
  int threads = 1, repeats = 5, n_decode = 64;
  int widths_context = 256;
  int block_size = kiln::EngineOptions().block_size;
  kiln::GgmlType kv_type = kiln::GgmlType::kF16;
  bool json = false, bandwidth = false, widths = false, widths_tree = false,
       llama_cpp_order = false, decode4096 = false, pool_breakdown = false;
  kiln::MlaPrefillMode mla_prefill = kiln::MlaPrefillMode::kAbsorbed;
  kiln::BackendKind backend = kiln::BackendKind::kCpu;
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
      repeats = std::atoi(next().c_str());
    } else if (a == "--decode") {
      n_decode = std::atoi(next().c_str());
    } else if (a == "--tokens") {
      tokens_path = next();
    } else if (a == "--json") {
      json = true;
    } else if (a == "--bandwidth") {
      bandwidth = true;
    } else if (a == "--widths") {
      widths = true;
    } else if (a == "--tree") {
      widths_tree = true;
    } else if (a == "--context") {
      widths_context = std::atoi(next().c_str());
    } else if (a == "--kv-type") {
      kv_type = ParseChoice<kiln::GgmlType>(
          a, next(), {{"f16", kiln::GgmlType::kF16}, {"q8_0", kiln::GgmlType::kQ8_0}});
    } else if (a == "--block-size") {
      block_size = std::atoi(next().c_str());
    } else if (a == "--decode4096") {
      decode4096 = true;
    } else if (a == "--pool-breakdown") {
      pool_breakdown = true;
    } else if (a == "--llama-cpp-order") {
      llama_cpp_order = true;
    } else if (a == "--backend") {
      backend = ParseChoice<kiln::BackendKind>(
          a, next(), {{"cpu", kiln::BackendKind::kCpu}, {"cuda", kiln::BackendKind::kCuda}});
    } else if (a == "--mla-prefill") {
      mla_prefill =
          ParseChoice<kiln::MlaPrefillMode>(a, next(),
                                            {{"absorbed", kiln::MlaPrefillMode::kAbsorbed},
                                             {"measured", kiln::MlaPrefillMode::kMeasured}});
    } else {
      Die("unknown argument " + a);
    }
  }
  if (threads < 1 || repeats < 1 || n_decode < 1) Die("threads, repeats, decode must be >= 1");
  if (widths_context < 1 || widths_context > 1000) Die("--context must be in [1, 1000]");
  if (bandwidth) return RunBandwidth(threads, repeats, json);

  if (model_path.empty()) {
    const char* dir = std::getenv("KILN_MODEL_DIR");
    model_path =
        std::string(dir && *dir ? dir : std::string(std::getenv("HOME")) + "/.cache/kiln") +
        "/SmolLM2-135M-Instruct.Q4_1.gguf";
  }
  constexpr int kPrefill = 512, kShortCtx = 128, kLongCtx = 1024, kLongerCtx = 4096;
  const int prompt_len = decode4096 ? kLongerCtx : kLongCtx;

  Bench e;
  kiln::ModelLoadOptions load;
  load.path = model_path;
  auto model = kiln::Model::Load(load);
  if (!model.ok()) Die("load " + model_path + ": " + std::string(model.status().message()));
  e.model = std::move(*model);
  // The timed runs measure the kernels on the prepared copies, not the load's background copying.
  e.model->WaitUntilPrepared();
  const kiln::ModelHparams& hp = e.model->hparams();

  std::vector<int32_t> prompt;
  if (!tokens_path.empty()) {
    std::ifstream in(tokens_path);
    if (!in) Die("cannot open " + tokens_path);
    for (int64_t t; in >> t;) {
      if (t < 0 || t >= hp.n_vocab) {
        Die("token " + std::to_string(t) + " at index " + std::to_string(prompt.size()) +
            " is outside the vocabulary");
      }
      prompt.push_back(static_cast<int32_t>(t));
    }
  } else {
    std::mt19937 rng(1);
    for (int i = 0; i < prompt_len; ++i) prompt.push_back(static_cast<int32_t>(rng() % hp.n_vocab));
  }
  if (prompt.size() < static_cast<size_t>(prompt_len)) {
    Die("need at least " + std::to_string(prompt_len) + " prompt tokens, got " +
        std::to_string(prompt.size()));
  }

  kiln::EngineOptions eo;
  // Room for the longest sequence (1,024 or 4,096 + decode).
  eo.n_ctx = prompt_len + n_decode;
  eo.prefix_caching = false;
  eo.n_threads = threads;
  eo.kv_type = kv_type;
  eo.block_size = block_size;
  eo.mla_prefill = mla_prefill;
  eo.llama_cpp_order = llama_cpp_order;
  eo.backend = backend;
  auto engine = kiln::Engine::Create(*e.model, eo);
  if (!engine.ok()) Die(std::string(engine.status().message()));
  e.engine = std::move(*engine);
  const size_t kv_bytes_per_token = e.engine->Counters().bytes_per_token;

  // Bytes a decode step must read: every weight except the embedding table (one row is
  // gathered), which is read in full only when it doubles as the output matrix.
  uint64_t weight_bytes = e.model->weight_bytes();
  if (!hp.tied_output) {
    const auto& te = e.model->token_embd();
    weight_bytes -= te.row_bytes() * te.n_out;
  }

  if (widths) return RunWidths(e, prompt, threads, repeats, widths_context, widths_tree);

  std::vector<double> prefill_tps, d128_tps, d1024_tps, d4096_tps;
  struct PoolBreakdown {  // --pool-breakdown, one per repeat
    double step_us, jobs, caller_outside_us, caller_range_us, caller_wait_us, worker_range_us,
        worker_wake_us;
  };
  std::vector<PoolBreakdown> breakdown;
  std::vector<int32_t> gen128, gen1024, gen4096;
  for (int r = 0; r < repeats; ++r) {
    // prefill512, then extend to 1024 and decode.
    kiln::SeqId seq = e.Cache([](kiln::KvCache& c) { return c.CreateSequence(); });
    auto t0 = Clock::now();
    e.Prefill(seq, prompt, 0, kPrefill);
    auto t1 = Clock::now();
    prefill_tps.push_back(kPrefill / Seconds(t0, t1));
    e.Prefill(seq, prompt, kPrefill, kLongCtx);
    t0 = Clock::now();
    e.Decode(seq, kLongCtx, n_decode, &gen1024);
    t1 = Clock::now();
    d1024_tps.push_back(n_decode / Seconds(t0, t1));
    if (decode4096) {  // the prompt's 4,096 tokens from scratch (untimed), then decode
      e.Check(e.Cache([&](kiln::KvCache& c) { return c.Free(seq); }), "Free");
      seq = e.Cache([](kiln::KvCache& c) { return c.CreateSequence(); });
      for (int p = 0; p < kLongerCtx; p += kLongCtx) e.Prefill(seq, prompt, p, p + kLongCtx);
      t0 = Clock::now();
      e.Decode(seq, kLongerCtx, n_decode, &gen4096);
      t1 = Clock::now();
      d4096_tps.push_back(n_decode / Seconds(t0, t1));
    }
    e.Check(e.Cache([&](kiln::KvCache& c) { return c.Free(seq); }), "Free");

    seq = e.Cache([](kiln::KvCache& c) { return c.CreateSequence(); });
    e.Prefill(seq, prompt, 0, kShortCtx);
    if (pool_breakdown) kiln::cpu::ThreadPool::SetWaitTracing(true, /*cpu_time=*/false);
    t0 = Clock::now();
    e.Decode(seq, kShortCtx, n_decode, &gen128);
    t1 = Clock::now();
    d128_tps.push_back(n_decode / Seconds(t0, t1));
    if (pool_breakdown) {
      kiln::cpu::ThreadPool::SetWaitTracing(false);
      const auto w = kiln::cpu::ThreadPool::TakeWaitStats();
      const double per_token_us = 1e6 / n_decode;
      breakdown.push_back(
          {1e6 * Seconds(t0, t1) / n_decode, static_cast<double>(w.jobs) / n_decode,
           w.caller_between_seconds * per_token_us, w.caller_range_seconds * per_token_us,
           w.caller_wait_seconds * per_token_us, w.worker_range_seconds * per_token_us,
           w.worker_wake_seconds * per_token_us});
    }
    e.Check(e.Cache([&](kiln::KvCache& c) { return c.Free(seq); }), "Free");

    if (json) {
      std::printf(
          "{\"repeat\": %d, \"threads\": %d, \"prefill512_tps\": %.3f, \"decode128_tps\": %.3f, "
          "\"decode1024_tps\": %.3f, %s\"n_decode\": %d, \"weight_bytes_per_token\": %llu, "
          "\"kv_bytes_per_position\": %zu, \"peak_rss_kib\": %ld, \"gen128\": [%s], "
          "\"gen1024\": [%s]}\n",
          r, threads, prefill_tps.back(), d128_tps.back(), d1024_tps.back(),
          decode4096 ? ("\"decode4096_tps\": " + std::to_string(d4096_tps.back()) + ", ").c_str()
                     : "",
          n_decode, static_cast<unsigned long long>(weight_bytes), kv_bytes_per_token, PeakRssKiB(),
          JoinTokens(gen128).c_str(), JoinTokens(gen1024).c_str());
      std::fflush(stdout);
    }
  }
  if (!json) {
    std::printf("%s, %d thread(s), %d repeats, %d decode steps\n",
                model_path.substr(model_path.rfind('/') + 1).c_str(), threads, repeats, n_decode);
    std::printf("  backend: %s\n", e.engine->BackendDescription().c_str());
    auto line = [](const char* name, const std::vector<double>& v) {
      const Stats s = Summarize(v);
      std::printf("  %-11s median %8.2f tok/s (min %.2f, max %.2f)\n", name, s.median, s.min,
                  s.max);
    };
    line("prefill512", prefill_tps);
    line("decode128", d128_tps);
    line("decode1024", d1024_tps);
    if (decode4096) line("decode4096", d4096_tps);
    std::printf("  weight bytes/token %.2f MB, KV bytes/position %.1f KB, peak RSS %.1f MiB\n",
                weight_bytes / 1e6, kv_bytes_per_token / 1e3, PeakRssKiB() / 1024.0);
    std::printf("  greedy@128: %s\n", JoinTokens(gen128).c_str());
    for (const PoolBreakdown& b : breakdown) {
      std::printf(
          "  decode128 pool, us/token: step %.1f | %.1f jobs | caller outside jobs %.1f, own "
          "ranges %.1f, waiting %.1f | workers' ranges %.1f, wake-up %.1f\n",
          b.step_us, b.jobs, b.caller_outside_us, b.caller_range_us, b.caller_wait_us,
          b.worker_range_us, b.worker_wake_us);
    }
  }
  return 0;
}
