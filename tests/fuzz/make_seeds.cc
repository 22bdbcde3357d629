// kiln-fuzz-seeds OUT_DIR: writes the GGUF reader fuzzer's seed corpus (tests/fuzz/fuzz_seeds.h)
// into OUT_DIR, one file per seed, and prints each path with its size. tests/fuzz/run_fuzz.sh
// runs it before every fuzzing session. Exit status 0 on success, 1 on a write error, 2 on bad
// usage.
#include <cstdio>
#include <filesystem>
#include <string>

#include "tests/fuzz/fuzz_seeds.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: kiln-fuzz-seeds OUT_DIR\n");
    return 2;
  }
  const auto paths = kiln::fuzz::WriteFuzzSeeds(argv[1]);
  if (!paths.ok()) {
    std::fprintf(stderr, "kiln-fuzz-seeds: %s\n", std::string(paths.status().message()).c_str());
    return 1;
  }
  for (const std::string& p : *paths) {
    std::printf("%s: %ju bytes\n", p.c_str(),
                static_cast<uintmax_t>(std::filesystem::file_size(p)));
  }
  return 0;
}
