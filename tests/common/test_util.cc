#include "tests/common/test_util.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

namespace kiln::testing {

namespace {

// `file` in the model cache ($KILN_MODEL_DIR, default ~/.cache/kiln), or "" with a test failure
// naming `what` and the script that fetches it.
std::string CachedModelPath(const char* file, const char* what, const char* fetch_script) {
  std::string dir;
  if (const char* env = std::getenv("KILN_MODEL_DIR"); env && *env) {
    dir = env;
  } else if (const char* home = std::getenv("HOME"); home && *home) {
    dir = std::string(home) + "/.cache/kiln";
  }
  std::string path = dir + "/" + file;
  if (!std::filesystem::exists(path)) {
    ADD_FAILURE() << what << " missing at " << path << "; run " << fetch_script;
    return "";
  }
  return path;
}

}  // namespace

std::string DefaultModelPath() {
  return CachedModelPath("SmolLM2-135M-Instruct.Q4_1.gguf", "default model",
                         "scripts/fetch_model.sh");
}

std::string Gemma3ModelPath() {
  return CachedModelPath("gemma-3-270m-q4_k_m.gguf", "Gemma 3 270M", "scripts/fetch_gemma3.sh");
}

std::string SourcePath(const std::string& relative) {
  return std::string(KILN_SOURCE_DIR) + "/" + relative;
}

std::string TempDir() {
  std::string base = std::filesystem::temp_directory_path() / "kiln-test-XXXXXX";
  if (mkdtemp(base.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp failed";
    return "/tmp";
  }
  return base;
}

}  // namespace kiln::testing
