#include "tests/common/test_util.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

namespace kiln::testing {

std::string DefaultModelPath() {
  std::string dir;
  if (const char* env = std::getenv("KILN_MODEL_DIR"); env && *env) {
    dir = env;
  } else if (const char* home = std::getenv("HOME"); home && *home) {
    dir = std::string(home) + "/.cache/kiln";
  }
  std::string path = dir + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) {
    ADD_FAILURE() << "default model missing at " << path << "; run scripts/fetch_model.sh";
    return "";
  }
  return path;
}

std::string Gemma3ModelPath() {
  std::string dir;
  if (const char* env = std::getenv("KILN_MODEL_DIR"); env && *env) {
    dir = env;
  } else if (const char* home = std::getenv("HOME"); home && *home) {
    dir = std::string(home) + "/.cache/kiln";
  }
  std::string path = dir + "/gemma-3-270m-q4_k_m.gguf";
  if (!std::filesystem::exists(path)) {
    ADD_FAILURE() << "Gemma 3 270M missing at " << path << "; run scripts/fetch_gemma3.sh";
    return "";
  }
  return path;
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
