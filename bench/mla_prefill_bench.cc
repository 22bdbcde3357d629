// MLA prefill: absorbed vs decompressed attention (lib/model/mla_forward.h), for the crossover
// rule ChooseDecompressed encodes.
//
// For each point (context already cached, new tokens) it times one Forward of the new tokens of
// one sequence in each form (MlaPrefillMode::kAbsorbed, kDecompressed; alternating which goes
// first), rewinding the sequence between runs, and prints the medians, their ratio and what the
// rule (kMeasured) would take.
//
// Usage: mla_prefill_bench --model DEEPSEEK2.gguf [--threads N] [--repeats R] [--cpu-time]
//            [--points CTX:NEW,CTX:NEW,...]   (default: a grid up to 1,024 tokens)
// --cpu-time: the process's CPU time instead of wall time (with --threads 1, what one Forward
// computes, independent of how a loaded machine shares its cores; the cost rule's fit).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "lib/backend/cpu/cpu_backend.h"
#include "lib/kv/kv_cache.h"
#include "lib/model/architecture.h"
#include "lib/model/forward_batch.h"
#include "lib/model/mla_forward.h"
#include "lib/model/model.h"

namespace {

using Clock = std::chrono::steady_clock;
bool g_cpu_time = false;  // --cpu-time

double ProcessCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "mla_prefill_bench: %s\n", msg.c_str());
  std::exit(1);
}

void Check(const absl::Status& st, const char* what) {
  if (!st.ok()) Die(std::string(what) + ": " + std::string(st.message()));
}

// Runs tokens[from, to) of `seq` (already appended) in one batch, logits for the last only.
double TimeForward(kiln::ForwardPass& pass, kiln::KvCache& cache, kiln::SeqId seq,
                   const std::vector<int32_t>& tokens, int32_t from, int32_t to) {
  kiln::ForwardBatch batch;
  for (int32_t i = from; i < to; ++i) batch.Add(tokens[i], seq, i, i + 1 == to);
  kiln::ForwardOutput out;
  const auto t0 = Clock::now();
  const double cpu0 = ProcessCpuSeconds();
  Check(pass.Forward(batch, cache, &out), "forward");
  if (g_cpu_time) return ProcessCpuSeconds() - cpu0;
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path;
  int threads = 1, repeats = 3;
  std::vector<std::pair<int32_t, int32_t>> points;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) Die("missing value after " + a);
      return argv[++i];
    };
    if (a == "--model") {
      model_path = next();
    } else if (a == "--cpu-time") {
      g_cpu_time = true;
    } else if (a == "--threads") {
      threads = std::atoi(next().c_str());
    } else if (a == "--repeats") {
      repeats = std::atoi(next().c_str());
    } else if (a == "--points") {
      const std::string list = next();
      size_t at = 0;
      while (at < list.size()) {
        const size_t comma = std::min(list.find(',', at), list.size());
        const std::string item = list.substr(at, comma - at);
        const size_t colon = item.find(':');
        if (colon == std::string::npos) Die("a point is CTX:NEW, got '" + item + "'");
        points.emplace_back(std::atoi(item.substr(0, colon).c_str()),
                            std::atoi(item.substr(colon + 1).c_str()));
        at = comma + 1;
      }
    } else {
      Die("unknown argument " + a);
    }
  }
  if (model_path.empty()) Die("--model is required");
  if (repeats < 1 || threads < 1) Die("--threads and --repeats must be >= 1");
  if (points.empty()) {
    for (int32_t n_new : {16, 32, 64, 128, 256, 512}) points.emplace_back(0, n_new);
    for (int32_t n_new : {16, 32, 64, 128, 256}) points.emplace_back(512, n_new);
  }
  kiln::ModelLoadOptions load;
  load.path = model_path;
  auto model = kiln::Model::Load(load);
  if (!model.ok()) Die("load " + model_path + ": " + std::string(model.status().message()));
  (*model)->WaitUntilPrepared();  // timed runs on the prepared copies (engine_bench.cc)
  const kiln::ModelHparams& hp = (*model)->hparams();
  if (hp.arch != "deepseek2") Die("the model is not a deepseek2 (MLA) model");
  int32_t max_len = 0;
  for (const auto& [ctx, n_new] : points) {
    if (ctx < 0 || n_new < 1) Die("a point needs CTX >= 0 and NEW >= 1");
    max_len = std::max(max_len, ctx + n_new);
  }
  auto layout = (*model)->architecture().CacheLayout(hp, kiln::GgmlType::kF16, 16);
  Check(layout.status(), "cache layout");
  auto cache = kiln::KvCache::Create(*layout, {.num_blocks = max_len / 16 + 4});
  Check(cache.status(), "cache");
  kiln::cpu::CpuBackend backend(threads);
  auto absorbed = kiln::NewMlaForward(**model, backend, kiln::MlaPrefillMode::kAbsorbed);
  auto decompressed = kiln::NewMlaForward(**model, backend, kiln::MlaPrefillMode::kDecompressed);
  Check(absorbed.status(), "absorbed pass");
  Check(decompressed.status(), "decompressed pass");
  std::vector<int32_t> tokens;
  std::mt19937 rng(1);
  for (int32_t i = 0; i < max_len; ++i) tokens.push_back(static_cast<int32_t>(rng() % hp.n_vocab));

  std::printf("%s, %d thread(s), %d repeats, f16 latent cache (median %s ms of one Forward)\n",
              model_path.c_str(), threads, repeats, g_cpu_time ? "process CPU" : "wall");
  std::printf("%6s %6s %12s %14s %8s %6s\n", "ctx", "new", "absorbed", "decompressed", "a/d",
              "rule");
  for (const auto& [ctx, n_new] : points) {
    const kiln::SeqId seq = (*cache)->CreateSequence();
    Check((*cache)->AppendSlots(seq, std::span(tokens.data(), ctx + n_new)), "append");
    if (ctx > 0) TimeForward(**absorbed, **cache, seq, tokens, 0, ctx);  // the cached context
    std::vector<double> a, d;
    for (int r = 0; r < repeats; ++r) {
      for (int side = 0; side < 2; ++side) {
        const bool run_absorbed = (side == 0) == (r % 2 == 0);
        kiln::ForwardPass& pass = run_absorbed ? **absorbed : **decompressed;
        (run_absorbed ? a : d).push_back(TimeForward(pass, **cache, seq, tokens, ctx, ctx + n_new));
      }
    }
    Check((*cache)->Free(seq), "free");
    std::sort(a.begin(), a.end());
    std::sort(d.begin(), d.end());
    const double ma = a[a.size() / 2] * 1e3, md = d[d.size() / 2] * 1e3;
    const bool rule = kiln::ChooseDecompressed(hp, n_new, ctx + n_new);
    std::printf("%6d %6d %12.1f %14.1f %8.2f %6s\n", ctx, n_new, ma, md, ma / md,
                rule ? "dec" : "abs");
    std::fflush(stdout);
  }
  return 0;
}
