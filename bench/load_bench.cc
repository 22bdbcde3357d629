// Model load time for a GGUF (default: the default model): open + validate + tokenizer build +
// weight binding and preparation (the interleaved copies), repeated; prints median and min-max.
// A second line times each load until its prepared copies are all written (the CPU backend
// writes the nibble types' copies in the background after Load returns; matmuls read the rows
// in place meanwhile).
// Usage: load_bench [MODEL] [REPEATS] [mmap|read|both]   (default: 20 loads, both ways)
// bench/bench_load.py runs it one load per process beside llama.cpp's llama_load_peer.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "lib/model/model.h"

int main(int argc, char** argv) {
  std::string path;
  if (argc > 1 && argv[1][0] != '\0') {
    path = argv[1];
  } else {
    const char* dir = std::getenv("KILN_MODEL_DIR");
    path = std::string(dir && *dir ? dir : std::string(std::getenv("HOME")) + "/.cache/kiln") +
           "/SmolLM2-135M-Instruct.Q4_1.gguf";
  }
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 20;
  const std::string mode = argc > 3 ? argv[3] : "both";
  if (repeats < 1 || (mode != "mmap" && mode != "read" && mode != "both")) {
    std::fprintf(stderr, "usage: load_bench [MODEL] [REPEATS >= 1] [mmap|read|both]\n");
    return 2;
  }
  for (bool mmap : {true, false}) {
    if (mode != "both" && mmap != (mode == "mmap")) continue;
    std::vector<double> ms, prepared_ms;
    for (int i = 0; i < repeats; ++i) {
      kiln::ModelLoadOptions options;
      options.path = path;
      options.use_mmap = mmap;
      const auto t0 = std::chrono::steady_clock::now();
      auto model = kiln::Model::Load(options);
      const auto t1 = std::chrono::steady_clock::now();
      if (!model.ok()) {
        std::fprintf(stderr, "load failed: %s\n", std::string(model.status().message()).c_str());
        return 1;
      }
      (*model)->WaitUntilPrepared();
      const auto t2 = std::chrono::steady_clock::now();
      ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      prepared_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t0).count());
    }
    const std::string name = path.substr(path.rfind('/') + 1);
    for (auto [what, v] : {std::pair{"load", &ms}, {"prepared", &prepared_ms}}) {
      std::sort(v->begin(), v->end());
      std::printf("%-8s %-28s mmap=%d: median %.2f ms (min %.2f, max %.2f) over %d loads\n", what,
                  name.c_str(), mmap, (*v)[v->size() / 2], v->front(), v->back(), repeats);
    }
  }
  return 0;
}
