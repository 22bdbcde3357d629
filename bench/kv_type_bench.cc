// Decode speed at a long context by K/V cache type (f16 against q8_0, or any list), on a real
// GGUF, through the internal API (Model, Engine).
//
//   kv_type_bench [--model PATH] [--threads T] [--repeats R] [--context N] [--decode N]
//                 [--types f16,q8_0]
//
// Per cache type: a fresh engine, a prompt of N random token ids (default 4,096) prefilled in
// chunks of 512 (untimed); then per repeat, for each type in turn, N greedy decode steps
// (default 32; one token per Forward, argmax included) timed, and the sequence truncated back to
// the prompt. Prints the
// median and min-max tokens/s over R repeats (default 5), the cache's K/V bytes per token, and
// the first decoded tokens (the types' greedy paths may part after a few steps).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "lib/engine/engine.h"
#include "lib/kv/kv_cache.h"
#include "lib/model/forward_batch.h"
#include "lib/model/model.h"

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "kv_type_bench: %s\n", what.c_str());
  std::exit(1);
}

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) Die(std::string(what) + ": " + std::string(s.message()));
}

struct Run {
  std::unique_ptr<kiln::Engine> engine;
  kiln::ForwardBatch batch;
  kiln::ForwardOutput out;

  // Appends tokens[begin, end) to seq at positions [begin, end) in one Forward; logits for the
  // last one.
  void Forward(kiln::SeqId seq, const std::vector<int32_t>& tokens, int begin, int end) {
    batch.Clear();
    for (int i = begin; i < end; ++i) batch.Add(tokens[i], seq, i, i == end - 1);
    Check(engine->Locked([&](kiln::KvCache& cache, kiln::ForwardPass& pass) -> absl::Status {
      KILN_RETURN_IF_ERROR(cache.AppendSlots(seq, std::span(tokens).subspan(begin, end - begin)));
      return pass.Forward(batch, cache, &out);
    }),
          "Forward");
  }
  int32_t Argmax() const {
    const float* row = out.LogitsRow(0);
    return static_cast<int32_t>(std::max_element(row, row + out.n_vocab) - row);
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::string model_path, types_arg = "f16,q8_0";
  int threads = 2, repeats = 5, context = 4096, n_decode = 32;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--model") {
      model_path = value();
    } else if (a == "--threads") {
      threads = std::atoi(value().c_str());
    } else if (a == "--repeats") {
      repeats = std::atoi(value().c_str());
    } else if (a == "--context") {
      context = std::atoi(value().c_str());
    } else if (a == "--decode") {
      n_decode = std::atoi(value().c_str());
    } else if (a == "--types") {
      types_arg = value();
    } else {
      Die("unknown argument " + a);
    }
  }
  if (threads < 1 || repeats < 1 || context < 1 || n_decode < 1) {
    Die("--threads, --repeats, --context and --decode must be positive");
  }
  if (model_path.empty()) {
    const char* dir = std::getenv("KILN_MODEL_DIR");
    model_path =
        std::string(dir && *dir ? dir : std::string(std::getenv("HOME")) + "/.cache/kiln") +
        "/SmolLM2-135M-Instruct.Q4_1.gguf";
  }
  std::vector<kiln::GgmlType> types;
  for (size_t p = 0; p <= types_arg.size();) {
    const size_t comma = std::min(types_arg.find(',', p), types_arg.size());
    const std::string name = types_arg.substr(p, comma - p);
    if (name == "f16") {
      types.push_back(kiln::GgmlType::kF16);
    } else if (name == "f32") {
      types.push_back(kiln::GgmlType::kF32);
    } else if (name == "bf16") {
      types.push_back(kiln::GgmlType::kBF16);
    } else if (name == "q8_0") {
      types.push_back(kiln::GgmlType::kQ8_0);
    } else {
      Die("--types: unknown type '" + name + "' (f16, f32, bf16, q8_0)");
    }
    p = comma + 1;
  }

  kiln::ModelLoadOptions load;
  load.path = model_path;
  auto model = kiln::Model::Load(load);
  if (!model.ok()) Die("load " + model_path + ": " + std::string(model.status().message()));
  std::vector<int32_t> prompt;
  std::mt19937 rng(1);
  for (int i = 0; i < context; ++i) {
    prompt.push_back(static_cast<int32_t>(rng() % (*model)->hparams().n_vocab));
  }
  std::printf("%s, %d thread(s), context %d, %d decode steps x %d repeats\n",
              model_path.substr(model_path.rfind('/') + 1).c_str(), threads, context, n_decode,
              repeats);

  // Every type's engine prefilled first, then the repeats alternate between the types, so a
  // change in the machine's load (other processes) falls on all of them alike.
  struct PerType {
    kiln::GgmlType type;
    Run run;
    kiln::SeqId seq = 0;
    int32_t after_prompt = 0;
    std::vector<double> tps;
    std::vector<int32_t> gen;
  };
  std::vector<PerType> runs(types.size());
  for (size_t k = 0; k < types.size(); ++k) {
    PerType& p = runs[k];
    p.type = types[k];
    kiln::EngineOptions eo;
    eo.n_ctx = context + n_decode + 16;
    eo.prefix_caching = false;
    eo.n_threads = threads;
    eo.kv_type = p.type;
    auto engine = kiln::Engine::Create(**model, eo);
    if (!engine.ok()) Die(std::string(engine.status().message()));
    p.run.engine = std::move(*engine);
    p.seq = p.run.engine->Locked(
        [](kiln::KvCache& c, kiln::ForwardPass&) { return c.CreateSequence(); });
    for (int b = 0; b < context; b += 512) {
      p.run.Forward(p.seq, prompt, b, std::min(context, b + 512));
    }
    p.after_prompt = p.run.Argmax();
  }
  for (int rep = 0; rep < repeats; ++rep) {
    for (PerType& p : runs) {
      std::vector<int32_t> tokens = prompt;
      tokens.push_back(p.after_prompt);
      const auto t0 = Clock::now();
      for (int i = 0; i < n_decode; ++i) {
        p.run.Forward(p.seq, tokens, context + i, context + i + 1);
        tokens.push_back(p.run.Argmax());
      }
      const auto t1 = Clock::now();
      p.tps.push_back(n_decode / std::chrono::duration<double>(t1 - t0).count());
      p.gen.assign(tokens.begin() + context, tokens.begin() + context + std::min(n_decode, 8));
      // Back to the prompt: the next repeat decodes the same steps again.
      Check(p.run.engine->Locked(
                [&](kiln::KvCache& c, kiln::ForwardPass&) { return c.Truncate(p.seq, context); }),
            "Truncate");
    }
  }
  for (PerType& p : runs) {
    std::sort(p.tps.begin(), p.tps.end());
    std::string first;
    for (int32_t t : p.gen) {
      if (!first.empty()) first.push_back(' ');
      first.append(std::to_string(t));
    }
    std::printf(
        "  %-5s decode@%d median %7.2f tok/s (min %.2f, max %.2f), K/V %zu bytes/token; "
        "greedy: %s\n",
        kiln::GgmlTypeName(static_cast<uint32_t>(p.type)).c_str(), context, p.tps[p.tps.size() / 2],
        p.tps.front(), p.tps.back(), p.run.engine->Counters().bytes_per_token, first.c_str());
  }
  return 0;
}
