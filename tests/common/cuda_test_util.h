// Helpers shared by the CUDA module tests (cuda_ops_test, cuda_kernels_test).
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

#include "lib/backend/cuda_loader.h"

namespace kiln::testing {

// A module file the build names, or the environment variable `env_name` when set:
// scripts/cuda_check.sh --prebuilt runs the tests away from the directory they were built in.
inline std::string ModulePath(const char* env_name, const char* built) {
  const char* env = std::getenv(env_name);
  return env != nullptr && *env ? env : built;
}

// The module this test was built with (KILN_CUDA_MODULE overrides), bound without a device
// (nullopt with the reason: built without CUDA, or the module cannot be opened).
inline std::optional<CudaModule> BuiltModule(std::string* why) {
#ifdef KILN_CUDA_TEST_MODULE
  absl::StatusOr<CudaModule> m =
      OpenCudaModule(ModulePath("KILN_CUDA_MODULE", KILN_CUDA_TEST_MODULE));
  if (!m.ok()) {
    *why = std::string(m.status().message());
    return std::nullopt;
  }
  return *m;
#else
  *why = "kiln was built without CUDA (KILN_CUDA=OFF or no toolkit)";
  return std::nullopt;
#endif
}

// The module's message for its last failed call.
inline std::string LastError(const CudaModule& m) {
  char msg[512] = {0};
  m.last_error(msg, sizeof msg);
  return msg;
}

}  // namespace kiln::testing
