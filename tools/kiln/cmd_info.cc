// kiln info MODEL: for a model kiln can run, a summary; for any valid GGUF, every metadata entry
// (long arrays shortened) and, when kiln cannot run it, what is missing; then the backends.
#include <cinttypes>
#include <cstdio>

#include "tools/kiln/commands.h"

namespace kiln_cli {
namespace {

void PrintSummary(const kiln_model_info& info) {
  std::printf("name:         %s\n", info.name);
  std::printf("architecture: %s\n", info.architecture);
  std::printf("parameters:   %" PRId64 " (%.1f M)\n", info.n_params, info.n_params / 1e6);
  std::printf("weights:      %" PRId64 " bytes (%.1f MiB)\n", info.size_bytes,
              info.size_bytes / 1048576.0);
  std::printf("layers:       %d\n", info.n_layer);
  std::printf("embedding:    %d\n", info.n_embd);
  std::printf("heads:        %d (kv %d, head dim %d)\n", info.n_head, info.n_head_kv,
              info.head_dim);
  std::printf("ffn:          %d\n", info.n_ff);
  std::printf("context:      %d (training)\n", info.n_ctx_train);
  std::printf("vocabulary:   %d (bos %d, eos %d, eot %d)\n", info.n_vocab, info.token_bos,
              info.token_eos, info.token_eot);
}

}  // namespace

int RunInfo(const std::vector<std::string>& args) {
  if (args.size() != 1) {
    std::fprintf(stderr, "usage: kiln info MODEL\n");
    return 2;
  }
  kiln_gguf* gguf = nullptr;
  kiln_status s = kiln_gguf_open(args[0].c_str(), &gguf);
  if (s != KILN_OK) return ReportError("info", s);
  std::printf("model:        %s\n", args[0].c_str());
  const std::string unsupported = kiln_gguf_unsupported(gguf);
  if (unsupported.empty()) {
    kiln_model* model = LoadModelOrReport(args[0]);
    if (model == nullptr) {
      kiln_gguf_destroy(gguf);
      return 1;
    }
    kiln_model_info info;
    info.struct_size = sizeof info;
    s = kiln_model_get_info(model, &info);
    if (s == KILN_OK) PrintSummary(info);  // info's strings belong to the model
    kiln_model_destroy(model);
    if (s != KILN_OK) {
      kiln_gguf_destroy(gguf);
      return ReportError("info", s);
    }
  } else {
    std::printf("runnable:     no; kiln lacks:\n");
    size_t begin = 0;
    while (begin < unsupported.size()) {
      const size_t end = unsupported.find('\n', begin);
      std::printf("  - %s\n", unsupported.substr(begin, end - begin).c_str());
      begin = end + 1;
    }
  }
  std::printf("cpu kernels:  %s\n", kiln_cpu_info());
  std::printf("metadata:\n");
  const size_t n = kiln_gguf_meta_count(gguf);
  for (size_t i = 0; i < n; ++i) {
    const char* key = nullptr;
    const char* value = nullptr;
    if (kiln_gguf_meta_at(gguf, i, &key, &value) == KILN_OK) {
      std::printf("  %-40s %s\n", key, value);
    }
  }
  kiln_gguf_destroy(gguf);
  std::printf("backends:\n");
  const std::string backends = kiln_backends();
  size_t begin = 0;
  while (begin < backends.size()) {
    const size_t end = backends.find('\n', begin);
    std::printf("  %s\n", backends.substr(begin, end - begin).c_str());
    begin = end + 1;
  }
  return 0;
}

}  // namespace kiln_cli
