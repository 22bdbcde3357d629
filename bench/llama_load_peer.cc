// llama.cpp's side of bench/bench_load.py: model load time through llama.cpp's own C API
// (llama_model_load_from_file with its default parameters: mmap, CPU repacking where ggml does
// it), timed the way load_bench times kiln::Model::Load. Not part of kiln's build: the script
// compiles it against the llama.cpp that bench/build_llama_cpp.sh built.
// Usage: llama_load_peer MODEL [REPEATS]  (prints one line per load: "load_ms <ms>")
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "llama.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL [REPEATS]\n", argv[0]);
    return 2;
  }
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 1;
  llama_log_set([](ggml_log_level, const char*, void*) {}, nullptr);
  llama_backend_init();
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    llama_model* model = llama_model_load_from_file(argv[1], llama_model_default_params());
    const auto t1 = std::chrono::steady_clock::now();
    if (model == nullptr) {
      std::fprintf(stderr, "llama_load_peer: cannot load %s\n", argv[1]);
      return 1;
    }
    std::printf("load_ms %.3f\n", std::chrono::duration<double, std::milli>(t1 - t0).count());
    llama_model_free(model);
  }
  llama_backend_free();
  return 0;
}
