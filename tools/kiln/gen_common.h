// Shared pieces of the text-generation subcommands (generate, chat, perplexity): flag parsing
// (the sampling and engine flags, plus the value helpers every subcommand flag goes through),
// and thin wrappers over the C API that report errors the `kiln` way.
//
// Flag errors, printed to stderr by the functions below and identical in every subcommand:
//   kiln: FLAG needs a value
//   kiln: bad value 'VALUE' for FLAG            (optionally followed by " (WHAT IS ALLOWED)")
// Not thread-safe (they print); the CLI is single-threaded.
#pragma once

#include <kiln/kiln.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln_cli {

// Flags common to generate and chat (defaults like llama.cpp's).
struct GenFlags {
  std::string model_path;
  int32_t n_predict = 128;
  float temp = 0.8f;
  int32_t top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  uint64_t seed = 0;
  bool seed_set = false;  // without --seed: a time-based seed
  int32_t threads = 0;    // 0: physical cores
  int32_t ctx = 4096;
  bool llama_cpp_order = false;           // --llama-cpp-order: llama.cpp's exact arithmetic
  kiln_kv_type cache_type = KILN_KV_F16;  // --cache-type f16|f32|bf16|q8_0
  kiln_mla_prefill mla_prefill = KILN_MLA_PREFILL_ABSORBED;  // --mla-prefill absorbed|measured
  bool swa_full = false;                                     // --swa-full
};

// If args[*i] is one of the shared flags, consumes it (and its value), stores it and returns 1;
// returns 0 when it is not a shared flag; -1 (after printing why) for a missing or bad value.
// Values: -n/--n-predict and --top-k integers in [0, 2^30]; --temp, --top-p, --min-p floats
// (not NaN); --seed an integer in [0, 2^63 - 1]; -t/--threads in [0, 1024]; -c/--ctx in
// [0, 2^24]; --cache-type one of f16, f32, bf16, q8_0; --mla-prefill absorbed or measured.
int ParseGenFlag(const std::vector<std::string>& args, size_t* i, GenFlags* flags);

// The help lines of the shared flags, with the defaults taken from `defaults` (a command's
// GenFlags before parsing). The -n line reads "most tokens <n_predict_what> (default N)", e.g.
// "to generate" or "per answer".
std::string GenFlagsHelp(const GenFlags& defaults, std::string_view n_predict_what);

// --- value helpers for a subcommand's own flags (same messages as the shared flags)

// The value following the flag at args[*i]: advances *i past it and returns true, or prints
// "kiln: FLAG needs a value" and returns false when the flag is the last argument.
bool TakeFlagValue(const std::vector<std::string>& args, size_t* i, std::string* value);

// Prints "kiln: bad value 'VALUE' for FLAG", plus " (ALLOWED)" when `allowed` is not empty;
// returns false.
bool BadFlagValue(std::string_view flag, std::string_view value, std::string_view allowed = {});

// A whole-string decimal integer in [lo, hi] into *out; otherwise BadFlagValue(flag, value,
// allowed) and false (*out untouched).
bool ParseIntFlag(std::string_view flag, const std::string& value, long long lo, long long hi,
                  long long* out, std::string_view allowed = {});

// A whole-string float (strtof syntax, not NaN) into *out; otherwise BadFlagValue and false.
bool ParseFloatFlag(std::string_view flag, const std::string& value, float* out);

// Creates the cache (engine) and sampler from the flags; reports and returns false on failure.
bool MakeCacheAndSampler(kiln_model* model, const GenFlags& flags, kiln_cache** cache,
                         kiln_sampler** sampler);

// Tokenizes with the two-call convention; reports and returns false on failure.
bool Tokenize(kiln_model* model, const std::string& text, uint32_t flags,
              std::vector<int32_t>* out);

// Renders a conversation with the model's chat template; reports and returns false on failure.
bool RenderChat(kiln_model* model, const std::vector<kiln_chat_message>& messages,
                bool add_generation_prompt, std::string* out);

// Seconds since an arbitrary fixed point (steady clock).
double NowSeconds();

const char* StopReasonName(kiln_stop_reason reason);

}  // namespace kiln_cli
