// kiln-mkdraft IN.gguf OUT.gguf --layers K
// Writes a draft model made of the first K transformer blocks of IN (plus its embeddings, final
// norm, output head and all metadata, with block_count = K). See lib/spec/make_draft.h.
#include <charconv>
#include <cstdio>
#include <string>
#include <string_view>

#include "lib/spec/make_draft.h"

namespace {

int Usage() {
  std::fprintf(stderr,
               "usage: kiln-mkdraft IN.gguf OUT.gguf --layers K\n"
               "  keeps the first K transformer blocks of IN (1 <= K <= its block_count)\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string in, out;
  int64_t layers = -1;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--layers" || arg == "-k") {
      if (i + 1 >= argc) return Usage();
      const std::string_view v = argv[++i];
      const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), layers);
      if (ec != std::errc() || end != v.data() + v.size()) {
        std::fprintf(stderr, "kiln-mkdraft: --layers: '%s' is not an integer\n", argv[i]);
        return 2;
      }
    } else if (arg == "-h" || arg == "--help") {
      Usage();
      return 0;
    } else if (in.empty()) {
      in = arg;
    } else if (out.empty()) {
      out = arg;
    } else {
      return Usage();
    }
  }
  if (in.empty() || out.empty() || layers < 0) return Usage();
  kiln::spec::MakeDraftInfo info;
  const absl::Status st = kiln::spec::MakeDraftModel(in, out, layers, &info);
  if (!st.ok()) {
    std::fprintf(stderr, "kiln-mkdraft: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  std::fprintf(
      stderr, "kiln-mkdraft: %s: %lld of %lld layers, %lld tensors kept, %lld dropped, %.1f MiB\n",
      out.c_str(), static_cast<long long>(info.draft_layers),
      static_cast<long long>(info.target_layers), static_cast<long long>(info.tensors_kept),
      static_cast<long long>(info.tensors_dropped),
      static_cast<double>(info.bytes_kept) / (1024.0 * 1024.0));
  return 0;
}
