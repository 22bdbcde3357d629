// Shared pieces of the text-generation subcommands (generate, chat, perplexity): sampling and
// engine flags, and thin wrappers over the C API that report errors the `kiln` way.
#pragma once

#include <kiln/kiln.h>

#include <cstdint>
#include <string>
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
};

// If args[*i] is one of the shared flags, consumes it (and its value), stores it and returns 1;
// returns 0 when it is not a shared flag; -1 (after printing why) for a missing or bad value.
int ParseGenFlag(const std::vector<std::string>& args, size_t* i, GenFlags* flags);

// The help lines of the shared flags.
const char* GenFlagsHelp();

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
