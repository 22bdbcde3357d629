// Helpers shared by the tests: where the default model and test data live.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lib/gguf/gguf_writer.h"
#include "lib/model/model.h"

// A sanitizer build (ASan+UBSan or TSan), detected in each test's own translation unit, which that
// build compiles with its flags.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define KILN_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(undefined_behavior_sanitizer) || \
    __has_feature(thread_sanitizer)
#define KILN_TEST_SANITIZED 1
#endif
#endif
#ifndef KILN_TEST_SANITIZED
#define KILN_TEST_SANITIZED 0
#endif

namespace kiln::testing {

// True under sanitizers or with KILN_QUICK=1: the real-model tests (end to end, speculative) then
// run a documented subset, the same paths over fewer prompts and tokens; the release build runs
// them whole.
inline bool QuickMode() {
  const char* env = std::getenv("KILN_QUICK");
  return KILN_TEST_SANITIZED || (env != nullptr && std::string(env) == "1");
}

// Path of the default model (SmolLM2-135M-Instruct Q4_1), fetched by scripts/fetch_model.sh into
// $KILN_MODEL_DIR (default ~/.cache/kiln). Fails the calling test (ADD_FAILURE) and returns ""
// when it is missing: the README's test command fetches it first, so absence is a setup bug.
std::string DefaultModelPath();
// Gemma 3 270M Q4_K_M in the same directory (scripts/fetch_gemma3.sh); "" with a test failure
// when missing.
std::string Gemma3ModelPath();

// Absolute path of a file in the source tree, e.g. SourcePath("tests/data/x.txt").
std::string SourcePath(const std::string& relative);

// A fresh empty directory for the calling test, removed with its contents when the process
// exits normally.
std::string TempDir();

// Writes the kiln-mkmodel shape `shape_name` at f32 into TempDir() (once per process), then
// copies it without the tensor `drop_tensor` and the key `drop_key` ("" for none), letting `edit`
// add or replace keys and tensors; returns the copy's path (bad-file tests of the
// architectures). Failures are test failures.
std::string WriteEditedModel(const std::string& shape_name, const std::string& drop_tensor = "",
                             const std::string& drop_key = "",
                             const std::function<void(gguf::GgufWriter&)>& edit = nullptr);

// Writes the kiln-mkmodel shape `shape_name` with `type_name` weights (e.g. "q8_0") and weight
// seed `seed` to TempDir()/file_name and loads it; nullptr, with a test failure, when a step fails.
std::unique_ptr<Model> LoadRandomModel(const std::string& shape_name, const std::string& type_name,
                                       uint64_t seed, const std::string& file_name);

// `n` token ids uniform in [lo, hi) ([0, n_vocab) for the second form), the same for the same
// seed (std::mt19937).
std::vector<int32_t> RandomTokens(int n, int64_t lo, int64_t hi, uint32_t seed);
std::vector<int32_t> RandomTokens(int n, int64_t n_vocab, uint32_t seed);

}  // namespace kiln::testing
