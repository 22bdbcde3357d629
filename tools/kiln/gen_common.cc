#include "tools/kiln/gen_common.h"

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "tools/kiln/commands.h"

namespace kiln_cli {

bool TakeFlagValue(const std::vector<std::string>& args, size_t* i, std::string* value) {
  if (*i + 1 >= args.size()) {
    std::fprintf(stderr, "kiln: %s needs a value\n", args[*i].c_str());
    return false;
  }
  *value = args[++*i];
  return true;
}

bool BadFlagValue(std::string_view flag, std::string_view value, std::string_view allowed) {
  std::fprintf(stderr, "kiln: bad value '%.*s' for %.*s", static_cast<int>(value.size()),
               value.data(), static_cast<int>(flag.size()), flag.data());
  if (!allowed.empty()) {
    std::fprintf(stderr, " (%.*s)", static_cast<int>(allowed.size()), allowed.data());
  }
  std::fprintf(stderr, "\n");
  return false;
}

bool ParseIntFlag(std::string_view flag, const std::string& value, long long lo, long long hi,
                  long long* out, std::string_view allowed) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || errno != 0 || v < lo || v > hi) {
    return BadFlagValue(flag, value, allowed);
  }
  *out = v;
  return true;
}

bool ParseFloatFlag(std::string_view flag, const std::string& value, float* out) {
  char* end = nullptr;
  const float v = std::strtof(value.c_str(), &end);
  if (value.empty() || *end != '\0' || v != v) return BadFlagValue(flag, value);
  *out = v;
  return true;
}

int ParseGenFlag(const std::vector<std::string>& args, size_t* i, GenFlags* flags) {
  const std::string& a = args[*i];
  if (a == "--llama-cpp-order") {
    flags->llama_cpp_order = true;
    return 1;
  }
  if (a == "--swa-full") {
    flags->swa_full = true;
    return 1;
  }
  static const char* kWithValue[] = {"-m",     "--model",      "-n",           "--n-predict",
                                     "--temp", "--top-k",      "--top-p",      "--min-p",
                                     "--seed", "--threads",    "-t",           "--ctx",
                                     "-c",     "--cache-type", "--mla-prefill"};
  bool known = false;
  for (const char* f : kWithValue) known |= a == f;
  if (!known) return 0;
  std::string v;
  if (!TakeFlagValue(args, i, &v)) return -1;
  long long n = 0;
  bool ok = true;
  if (a == "-m" || a == "--model") {
    flags->model_path = v;
  } else if (a == "-n" || a == "--n-predict") {
    if ((ok = ParseIntFlag(a, v, 0, 1 << 30, &n))) flags->n_predict = static_cast<int32_t>(n);
  } else if (a == "--temp") {
    ok = ParseFloatFlag(a, v, &flags->temp);
  } else if (a == "--top-k") {
    if ((ok = ParseIntFlag(a, v, 0, 1 << 30, &n))) flags->top_k = static_cast<int32_t>(n);
  } else if (a == "--top-p") {
    ok = ParseFloatFlag(a, v, &flags->top_p);
  } else if (a == "--min-p") {
    ok = ParseFloatFlag(a, v, &flags->min_p);
  } else if (a == "--seed") {
    if ((ok = ParseIntFlag(a, v, 0, INT64_MAX, &n))) {
      flags->seed = static_cast<uint64_t>(n);
      flags->seed_set = true;
    }
  } else if (a == "--threads" || a == "-t") {
    if ((ok = ParseIntFlag(a, v, 0, 1024, &n))) flags->threads = static_cast<int32_t>(n);
  } else if (a == "--ctx" || a == "-c") {
    if ((ok = ParseIntFlag(a, v, 0, 1 << 24, &n))) flags->ctx = static_cast<int32_t>(n);
  } else if (a == "--cache-type") {
    static const struct {
      const char* name;
      kiln_kv_type type;
    } kTypes[] = {
        {"f16", KILN_KV_F16}, {"f32", KILN_KV_F32}, {"bf16", KILN_KV_BF16}, {"q8_0", KILN_KV_Q8_0}};
    ok = false;
    for (const auto& t : kTypes) {
      if (v == t.name) {
        flags->cache_type = t.type;
        ok = true;
      }
    }
    if (!ok) BadFlagValue(a, v, "f16, f32, bf16 or q8_0");
  } else if (a == "--mla-prefill") {
    ok = true;
    if (v == "absorbed") {
      flags->mla_prefill = KILN_MLA_PREFILL_ABSORBED;
    } else if (v == "measured") {
      flags->mla_prefill = KILN_MLA_PREFILL_MEASURED;
    } else {
      ok = BadFlagValue(a, v, "absorbed or measured");
    }
  }
  return ok ? 1 : -1;
}

std::string GenFlagsHelp(const GenFlags& defaults, std::string_view n_predict_what) {
  char buf[2048];
  std::snprintf(buf, sizeof buf,
                "  -m, --model MODEL   GGUF model file (required)\n"
                "  -n, --n-predict N   most tokens %.*s (default %d)\n"
                "  --temp T            temperature; 0 = greedy (default %g)\n"
                "  --top-k K           (default %d; 0 = off)\n"
                "  --top-p P           (default %g; 1 = off)\n"
                "  --min-p P           (default %g; 0 = off)\n"
                "  --seed S            sampling seed (default: from the clock)\n"
                "  -t, --threads N     compute threads (default: physical cores)\n"
                "  -c, --ctx N         context size in tokens (default %d; 0 = the model's)\n"
                "  --cache-type T      K/V cache element type: f16 (default), f32, bf16 or q8_0\n"
                "  --llama-cpp-order   compute exactly like llama.cpp (same greedy output and\n"
                "                      logits); default: batch-invariant results\n"
                "  --mla-prefill M     MLA models' prompt attention: absorbed (default; logits\n"
                "                      independent of prompt chunking) or measured (long chunks\n"
                "                      decompressed: faster, last bits depend on chunking)\n"
                "  --swa-full          sliding-window models (gemma3): keep every layer's K/V\n"
                "                      (default: the sliding layers' only inside the window)\n",
                static_cast<int>(n_predict_what.size()), n_predict_what.data(), defaults.n_predict,
                defaults.temp, defaults.top_k, defaults.top_p, defaults.min_p, defaults.ctx);
  return buf;
}

bool MakeCacheAndSampler(kiln_model* model, const GenFlags& flags, kiln_cache** cache,
                         kiln_sampler** sampler) {
  kiln_cache_params cp;
  kiln_cache_params_init(&cp, sizeof cp);
  cp.n_threads = flags.threads;
  cp.n_ctx = flags.ctx;
  cp.llama_cpp_order = flags.llama_cpp_order ? 1 : 0;
  cp.kv_type = flags.cache_type;
  cp.mla_prefill = flags.mla_prefill;
  cp.swa_full = flags.swa_full ? 1 : 0;
  kiln_status s = kiln_cache_create(model, &cp, cache);
  if (s != KILN_OK) {
    ReportError("creating the cache", s);
    return false;
  }
  kiln_sampler_params sp;
  kiln_sampler_params_init(&sp, sizeof sp);
  sp.temperature = flags.temp;
  sp.top_k = flags.top_k;
  sp.top_p = flags.top_p;
  sp.min_p = flags.min_p;
  sp.seed =
      flags.seed_set
          ? flags.seed
          : static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  s = kiln_sampler_create(&sp, sampler);
  if (s != KILN_OK) {
    ReportError("creating the sampler", s);
    kiln_cache_destroy(*cache);
    *cache = nullptr;
    return false;
  }
  return true;
}

bool Tokenize(kiln_model* model, const std::string& text, uint32_t flags,
              std::vector<int32_t>* out) {
  size_t n = 0;
  kiln_status s = kiln_tokenize(model, text.data(), text.size(), flags, nullptr, 0, &n);
  out->assign(n, 0);
  if (s == KILN_ERR_BUFFER_TOO_SMALL) {
    s = kiln_tokenize(model, text.data(), text.size(), flags, out->data(), out->size(), &n);
  }
  if (s != KILN_OK) {
    ReportError("tokenize", s);
    return false;
  }
  out->resize(n);
  return true;
}

bool RenderChat(kiln_model* model, const std::vector<kiln_chat_message>& messages,
                bool add_generation_prompt, std::string* out) {
  size_t len = 0;
  kiln_status s = kiln_chat_apply_template(model, nullptr, messages.data(), messages.size(),
                                           add_generation_prompt ? 1 : 0, nullptr, 0, &len);
  if (s == KILN_ERR_BUFFER_TOO_SMALL) {
    out->assign(len, '\0');
    s = kiln_chat_apply_template(model, nullptr, messages.data(), messages.size(),
                                 add_generation_prompt ? 1 : 0, out->data(), out->size(), &len);
  }
  if (s != KILN_OK) {
    ReportError("applying the chat template", s);
    return false;
  }
  out->resize(len);
  return true;
}

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

const char* StopReasonName(kiln_stop_reason reason) {
  switch (reason) {
    case KILN_STOP_EOG:
      return "end of generation";
    case KILN_STOP_MAX_TOKENS:
      return "max tokens";
    case KILN_STOP_STRING:
      return "stop string";
    case KILN_STOP_CALLBACK:
      return "callback";
    case KILN_STOP_CANCELLED:
      return "cancelled";
    case KILN_STOP_CONTEXT_FULL:
      return "context full";
  }
  return "unknown";
}

}  // namespace kiln_cli
