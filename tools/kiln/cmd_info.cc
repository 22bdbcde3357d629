// kiln info MODEL: a summary of the model, then every metadata entry (long arrays shortened).
#include <cinttypes>
#include <cstdio>

#include "tools/kiln/commands.h"

namespace kiln_cli {

int RunInfo(const std::vector<std::string>& args) {
  if (args.size() != 1) {
    std::fprintf(stderr, "usage: kiln info MODEL\n");
    return 2;
  }
  kiln_model* model = LoadModelOrReport(args[0]);
  if (model == nullptr) return 1;
  kiln_model_info info;
  info.struct_size = sizeof info;
  kiln_status s = kiln_model_get_info(model, &info);
  if (s != KILN_OK) {
    kiln_model_destroy(model);
    return ReportError("info", s);
  }
  std::printf("model:        %s\n", args[0].c_str());
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
  std::printf("cpu kernels:  %s\n", kiln_cpu_info());
  std::printf("metadata:\n");
  const size_t n = kiln_model_meta_count(model);
  for (size_t i = 0; i < n; ++i) {
    const char* key = nullptr;
    const char* value = nullptr;
    if (kiln_model_meta_at(model, i, &key, &value) == KILN_OK) {
      std::printf("  %-40s %s\n", key, value);
    }
  }
  kiln_model_destroy(model);
  return 0;
}

}  // namespace kiln_cli
