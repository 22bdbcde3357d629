// Saved session states (Session::SaveState / LoadState): time and size of saving and restoring a
// session of N tokens (default 1,000) on the default model, K/V stored and tokens only.
//
//   state_bench [--model PATH] [--tokens N] [--repeats R] [--threads T]
//
// The session holds the first N tokens of docs/kv_cache.md (repeated if shorter), prefilled.
// Each figure is measured R times (default 7) and printed as median [min - max]:
//   save (K/V)                SaveState with the K/V: copy out of the cache, serialize, CRC
//   restore (K/V)             LoadState of it into a new session: parse, CRC, checks, copy in
//   save / restore file (K/V) the same through SaveStateToFile (written, fsync'ed, renamed) and
//                             LoadStateFromFile (mapped)
//   save (tokens)             SaveState without K/V
//   restore (tokens, cached)  its LoadState on the same cache: the prefix cache holds the
//                             blocks, so it attaches them and recomputes only the tail
//   restore (tokens, cold)    its LoadState on a cache without prefix caching: a full prefill
// Before timing, one restore of each kind is checked: a greedy continuation of 16 tokens equals
// the original session's.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "lib/model/model.h"
#include "lib/session/session.h"
#include "lib/tokenizer/tokenizer.h"

namespace kiln {
namespace {

using Clock = std::chrono::steady_clock;

struct Stat {
  double median, min, max;
};

Stat Summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back()};
}

void Print(const char* what, const std::vector<double>& ms) {
  const Stat s = Summarize(ms);
  std::printf("  %-28s %9.2f ms  [%.2f - %.2f]\n", what, s.median, s.min, s.max);
}

template <typename T>
T Check(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) {
    std::fprintf(stderr, "state_bench: %s: %s\n", what, v.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(v);
}
void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "state_bench: %s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

sample::SamplerParams Greedy() {
  sample::SamplerParams p;
  p.temperature = 0.0f;
  return p;
}

std::vector<int32_t> Continuation(Session& s, int32_t n) {
  GenerateOptions options;
  options.max_tokens = n;
  Check(s.Generate(options).status(), "generate");
  return s.tokens();
}

int Main(int argc, char** argv) {
  std::string model_path;
  if (const char* home = std::getenv("HOME")) {
    model_path = std::string(home) + "/.cache/kiln/SmolLM2-135M-Instruct.Q4_1.gguf";
  }
  int32_t n_tokens = 1000;
  int repeats = 7;
  int threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--model") {
      model_path = argv[i + 1];
    } else if (flag == "--tokens") {
      n_tokens = std::atoi(argv[i + 1]);
    } else if (flag == "--repeats") {
      repeats = std::max(1, std::atoi(argv[i + 1]));
    } else if (flag == "--threads") {
      threads = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr,
                   "usage: state_bench [--model PATH] [--tokens N] [--repeats R] "
                   "[--threads T]\n");
      return 2;
    }
  }
  ModelLoadOptions load;
  load.path = model_path;
  auto model = Check(Model::Load(load), "loading the model");
  model->WaitUntilPrepared();  // timed runs on the prepared copies (engine_bench.cc)

  std::ifstream text_file(std::string(KILN_BENCH_SOURCE_DIR) + "/docs/kv_cache.md");
  std::stringstream text;
  text << text_file.rdbuf();
  std::vector<int32_t> text_ids =
      Check(model->tokenizer().Encode(text.str(), false, false), "tokenizing");
  if (text_ids.empty()) text_ids.push_back(1);
  std::vector<int32_t> prompt;
  while (static_cast<int32_t>(prompt.size()) < n_tokens) {
    prompt.insert(prompt.end(), text_ids.begin(), text_ids.end());
  }
  prompt.resize(n_tokens);

  EngineOptions options;
  options.n_ctx = n_tokens + 64;
  options.n_threads = threads;
  // Room for four sessions of n_ctx: the saved one, a fork of it and a restored one live at once.
  const size_t block_bytes =
      Check(Engine::Create(*model, options), "engine")->Counters().block_bytes;
  options.pool_bytes = block_bytes * (4 * static_cast<size_t>(options.n_ctx / 16 + 1) + 1);
  auto engine = Check(Engine::Create(*model, options), "engine");
  EngineOptions cold_options = options;
  cold_options.prefix_caching = false;
  auto cold_engine = Check(Engine::Create(*model, cold_options), "engine without prefix caching");

  auto session = Check(Session::Create(*engine, Greedy(), 1), "session");
  Check(session->AppendTokens(prompt), "prefill");
  SaveStateOptions tokens_only;
  tokens_only.kv = false;
  const std::string kv_state = Check(session->SaveState(), "save");
  const std::string small_state = Check(session->SaveState(tokens_only), "save tokens only");
  const std::string path = "/tmp/kiln-state-bench.state";

  // Correctness first: every kind of restore continues as the original.
  {
    auto fork = Check(session->Fork(), "fork");
    const std::vector<int32_t> expected = Continuation(*fork, 16);
    auto check = [&](Engine& e, const std::string& state, const char* what) {
      auto s = Check(Session::Create(e, Greedy(), 1), "session");
      Check(s->LoadState(state), what);
      if (Continuation(*s, 16) != expected) {
        std::fprintf(stderr, "state_bench: %s: the continuation differs\n", what);
        std::exit(1);
      }
    };
    check(*engine, kv_state, "restore (K/V)");
    check(*engine, small_state, "restore (tokens, cached)");
    check(*cold_engine, small_state, "restore (tokens, cold)");
  }

  std::vector<double> save_kv, restore_kv, save_file, restore_file, save_tokens, restore_cached,
      restore_cold;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = Clock::now();
    const std::string s1 = Check(session->SaveState(), "save");
    save_kv.push_back(MsSince(t0));
    {
      auto target = Check(Session::Create(*engine, Greedy(), 1), "session");
      t0 = Clock::now();
      Check(target->LoadState(s1), "restore");
      restore_kv.push_back(MsSince(t0));
    }
    t0 = Clock::now();
    Check(session->SaveStateToFile(path), "save file");
    save_file.push_back(MsSince(t0));
    {
      auto target = Check(Session::Create(*engine, Greedy(), 1), "session");
      t0 = Clock::now();
      Check(target->LoadStateFromFile(path), "restore file");
      restore_file.push_back(MsSince(t0));
    }
    t0 = Clock::now();
    const std::string s2 = Check(session->SaveState(tokens_only), "save tokens");
    save_tokens.push_back(MsSince(t0));
    {
      auto target = Check(Session::Create(*engine, Greedy(), 1), "session");
      t0 = Clock::now();
      Check(target->LoadState(s2), "restore tokens");
      restore_cached.push_back(MsSince(t0));
    }
    {
      auto target = Check(Session::Create(*cold_engine, Greedy(), 1), "session");
      t0 = Clock::now();
      Check(target->LoadState(s2), "restore tokens cold");
      restore_cold.push_back(MsSince(t0));
    }
  }
  std::remove(path.c_str());

  const size_t kv_per_token = engine->Counters().bytes_per_token;
  std::printf("state_bench: %s, %d tokens, %d threads, %d repeats, f16 K/V (%zu bytes/token)\n",
              model_path.c_str(), n_tokens, threads, repeats, kv_per_token);
  std::printf("  state size, K/V stored        %10zu bytes (%.1f MiB; K/V alone %zu)\n",
              kv_state.size(), static_cast<double>(kv_state.size()) / (1 << 20),
              kv_per_token * static_cast<size_t>(n_tokens));
  std::printf("  state size, tokens only       %10zu bytes\n", small_state.size());
  Print("save (K/V)", save_kv);
  Print("restore (K/V)", restore_kv);
  Print("save file (K/V, fsync)", save_file);
  Print("restore file (K/V)", restore_file);
  Print("save (tokens)", save_tokens);
  Print("restore (tokens, cached)", restore_cached);
  Print("restore (tokens, cold)", restore_cold);
  return 0;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) { return kiln::Main(argc, argv); }
