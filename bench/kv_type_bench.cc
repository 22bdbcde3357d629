// Decode speed at a long context by K/V cache type (f16 against q8_0, or any list), on a real
// GGUF, through the internal API (Model, Engine).
//
//   kv_type_bench [--model PATH] [--threads T] [--repeats R] [--context N] [--decode N]
//                 [--types f16,q8_0]
//   kv_type_bench --rounding-error [--model PATH] [--context N]
//
// Per cache type: a fresh engine, a prompt of N random token ids (default 4,096) prefilled in
// chunks of 512 (untimed); then per repeat, for each type in turn, N greedy decode steps
// (default 32; one token per Forward, argmax included) timed, and the sequence truncated back to
// the prompt. Prints the
// median and min-max tokens/s over R repeats (default 5), the cache's K/V bytes per token, and
// the first decoded tokens (the types' greedy paths may part after a few steps).
//
// --rounding-error: what storing the model's real K/V in each candidate type costs in accuracy.
// The prompt's K and V rows are computed into an f32 cache, then each row is rounded through f16,
// bf16, q8_0 (the library's quantizer) and fp8 e4m3 (emulated below: OCP e4m3fn, 3 mantissa bits,
// largest 448, with an f32 scale per row or per 16-row tile of one head, as a cache would store
// it), and the relative RMS error sqrt(sum (r - x)^2 / sum x^2) over all of K and all of V is
// printed with each type's bytes per element.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "lib/engine/engine.h"
#include "lib/kv/kv_cache.h"
#include "lib/model/forward_batch.h"
#include "lib/model/model.h"
#include "lib/quant/quant.h"

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

// x rounded to fp8 e4m3 (OCP e4m3fn: exponent bias 7, 3 mantissa bits, subnormals below 2^-6,
// saturated at 448), round to nearest even.
float RoundE4m3(float x) {
  const float a = std::fabs(x);
  if (a == 0.0f || std::isnan(a)) return x;
  int e = 0;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1): the leading bit is 2^(e - 1)
  const float step = std::ldexp(1.0f, std::max(e - 1, -6) - 3);
  return std::copysign(std::min(std::nearbyint(a / step) * step, 448.0f), x);
}

// One candidate storage type: its bytes per element (scales included) and a row round trip.
struct Candidate {
  const char* name;
  double bytes_per_elem;
  // rows [n_rows][n] in place (n_rows rows of one head: a tile shares a scale).
  std::function<void(float* rows, int n_rows, int n)> round;
};

void RoundWithKernels(kiln::GgmlType type, float* rows, int n_rows, int n) {
  const kiln::QuantKernels* k = kiln::GetQuantKernels(type);
  if (k == nullptr) Die("no kernels for a K/V candidate type");
  std::vector<std::byte> packed(static_cast<size_t>(n) * 4 + 64);
  for (int r = 0; r < n_rows; ++r) {
    k->quantize(rows + static_cast<size_t>(r) * n, packed.data(), n);
    k->dequantize(packed.data(), rows + static_cast<size_t>(r) * n, n);
  }
}

// e4m3 with one f32 scale (amax / 448) per group of `rows_per_scale` rows.
void RoundE4m3Scaled(float* rows, int n_rows, int n, int rows_per_scale) {
  for (int r0 = 0; r0 < n_rows; r0 += rows_per_scale) {
    float* begin = rows + static_cast<size_t>(r0) * n;
    float* end = rows + static_cast<size_t>(std::min(n_rows, r0 + rows_per_scale)) * n;
    float amax = 0.0f;
    for (float* v = begin; v < end; ++v) amax = std::max(amax, std::fabs(*v));
    const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
    for (float* v = begin; v < end; ++v) *v = RoundE4m3(*v / scale) * scale;
  }
}

// The model at model_path (exits on failure) and `context` token ids from a fixed seed.
std::unique_ptr<kiln::Model> LoadWithPrompt(const std::string& model_path, int context,
                                            std::vector<int32_t>* prompt) {
  kiln::ModelLoadOptions load;
  load.path = model_path;
  auto model = kiln::Model::Load(load);
  if (!model.ok()) Die("load " + model_path + ": " + std::string(model.status().message()));
  (*model)->WaitUntilPrepared();  // timed runs on the prepared copies (engine_bench.cc)
  std::mt19937 rng(1);
  for (int i = 0; i < context; ++i) {
    prompt->push_back(static_cast<int32_t>(rng() % (*model)->hparams().n_vocab));
  }
  return std::move(*model);
}

int RoundingError(const std::string& model_path, int context) {
  std::vector<int32_t> prompt;
  const std::unique_ptr<kiln::Model> model = LoadWithPrompt(model_path, context, &prompt);
  kiln::EngineOptions eo;
  eo.n_ctx = context + 16;
  eo.prefix_caching = false;
  eo.kv_type = kiln::GgmlType::kF32;
  auto engine = kiln::Engine::Create(*model, eo);
  if (!engine.ok()) Die(std::string(engine.status().message()));
  Run run;
  run.engine = std::move(*engine);
  const kiln::SeqId seq =
      run.engine->Locked([](kiln::KvCache& c, kiln::ForwardPass&) { return c.CreateSequence(); });
  for (int b = 0; b < context; b += 512) run.Forward(seq, prompt, b, std::min(context, b + 512));

  const int tile_rows = 16;
  const std::vector<Candidate> candidates = {
      {"f16", 2.0, [](float* x, int r, int n) { RoundWithKernels(kiln::GgmlType::kF16, x, r, n); }},
      {"bf16", 2.0,
       [](float* x, int r, int n) { RoundWithKernels(kiln::GgmlType::kBF16, x, r, n); }},
      {"q8_0", 34.0 / 32.0,
       [](float* x, int r, int n) { RoundWithKernels(kiln::GgmlType::kQ8_0, x, r, n); }},
      {"e4m3/row", 0.0, [](float* x, int r, int n) { RoundE4m3Scaled(x, r, n, 1); }},
      {"e4m3/tile", 0.0, [&](float* x, int r, int n) { RoundE4m3Scaled(x, r, n, tile_rows); }},
  };
  // Per candidate and K/V: sums of squared errors and of squared values.
  std::vector<std::array<double, 4>> sums(candidates.size(), {0, 0, 0, 0});
  int head_dim = 0;
  run.engine->Locked([&](kiln::KvCache& cache, kiln::ForwardPass&) {
    const kiln::KvLayout& layout = cache.layout();
    head_dim = layout.head_dim();
    std::vector<float> x(static_cast<size_t>(tile_rows) * head_dim), r(x.size());
    for (int32_t layer = 0; layer < layout.n_layers(); ++layer) {
      for (int32_t head = 0; head < layout.n_kv_heads(); ++head) {
        for (int kv = 0; kv < 2; ++kv) {
          for (int p0 = 0; p0 + tile_rows <= context; p0 += tile_rows) {
            for (int i = 0; i < tile_rows; ++i) {
              const kiln::KvSlot slot = *cache.SlotOf(seq, p0 + i);
              const std::byte* row =
                  kv == 0 ? cache.KeyRow(slot, layer, head) : cache.ValueRow(slot, layer, head);
              std::memcpy(&x[static_cast<size_t>(i) * head_dim], row, head_dim * sizeof(float));
            }
            for (size_t c = 0; c < candidates.size(); ++c) {
              r = x;
              candidates[c].round(r.data(), tile_rows, head_dim);
              for (size_t j = 0; j < x.size(); ++j) {
                sums[c][2 * kv] += (static_cast<double>(r[j]) - x[j]) * (r[j] - x[j]);
                sums[c][2 * kv + 1] += static_cast<double>(x[j]) * x[j];
              }
            }
          }
        }
      }
    }
    return 0;
  });
  std::printf("%s, K/V of %d random-token positions (f32 cache), head_dim %d\n",
              model_path.substr(model_path.rfind('/') + 1).c_str(), context, head_dim);
  std::printf("  %-10s %14s %12s %12s\n", "type", "bytes/elem", "K rel. RMS", "V rel. RMS");
  for (size_t c = 0; c < candidates.size(); ++c) {
    double bytes = candidates[c].bytes_per_elem;
    if (bytes == 0.0) {  // e4m3: one byte plus its share of an f32 scale
      bytes = 1.0 + 4.0 / (head_dim * (c + 1 == candidates.size() ? tile_rows : 1));
    }
    std::printf("  %-10s %14.4f %12.3e %12.3e\n", candidates[c].name, bytes,
                std::sqrt(sums[c][0] / sums[c][1]), std::sqrt(sums[c][2] / sums[c][3]));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path, types_arg = "f16,q8_0";
  int threads = 2, repeats = 5, context = 4096, n_decode = 32;
  bool rounding_error = false;
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
    } else if (a == "--rounding-error") {
      rounding_error = true;
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
  if (rounding_error) return RoundingError(model_path, context);
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

  std::vector<int32_t> prompt;
  const std::unique_ptr<kiln::Model> model = LoadWithPrompt(model_path, context, &prompt);
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
    auto engine = kiln::Engine::Create(*model, eo);
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
