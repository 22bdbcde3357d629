// kiln-quantize: requantizes every weight matrix of a GGUF model to another type.
//
//   kiln-quantize IN.gguf OUT.gguf --type
//   q8_0|q4_0|q4_1|q5_0|q5_1|q2_K|q3_K|q4_K|q5_K|q6_K|f16|bf16|f32
//                 [--keep-output-type] [--verbose]
//
// Rules (which tensors, row-length fallbacks, metadata): lib/quant/requantize.h. OUT is written
// atomically (temp file + rename). Exit status: 0 on success, 2 on a usage error, 1 on any other
// failure (message on stderr).
//
// Example (the Q8_0 copy of the default model that the benchmarks run):
//   kiln-quantize ~/.cache/kiln/SmolLM2-135M-Instruct.Q4_1.gguf
//                 ~/.cache/kiln/SmolLM2-135M-Instruct.Q8_0.gguf --type q8_0   (one line)
#include <chrono>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "lib/gguf/file_type.h"
#include "lib/quant/requantize.h"

namespace {

constexpr const char* kUsage =
    "usage: kiln-quantize IN.gguf OUT.gguf --type "
    "q8_0|q4_0|q4_1|q5_0|q5_1|q2_K|q3_K|q4_K|q5_K|q6_K|f16|bf16|f32\n"
    "                     [--keep-output-type] [--verbose]\n";

int Usage(const std::string& why) {
  std::fprintf(stderr, "kiln-quantize: %s\n%s", why.c_str(), kUsage);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> paths;
  std::string type_name;
  bool keep_output = false, verbose = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (arg == "--type") {
      if (i + 1 >= argc) return Usage("missing value after --type");
      type_name = argv[++i];
    } else if (arg == "--keep-output-type") {
      keep_output = true;
    } else if (arg == "--verbose") {
      verbose = true;
    } else if (arg.starts_with("-")) {
      return Usage("unknown option " + std::string(arg));
    } else {
      paths.emplace_back(arg);
    }
  }
  if (paths.size() != 2) return Usage("expected IN.gguf and OUT.gguf");
  if (type_name.empty()) return Usage("--type is required");
  auto type = kiln::gguf::WeightTypeByName(type_name);
  if (!type.ok()) return Usage(std::string(type.status().message()));

  kiln::RequantizeOptions options;
  options.target = static_cast<kiln::GgmlType>(*type);
  options.keep_output_type = keep_output;
  if (verbose) {
    options.log = [](std::string_view line) {
      std::fprintf(stderr, "%.*s\n", static_cast<int>(line.size()), line.data());
    };
  }
  kiln::RequantizeStats stats;
  const auto start = std::chrono::steady_clock::now();
  const absl::Status status = kiln::RequantizeFile(paths[0], paths[1], options, &stats);
  if (!status.ok()) {
    std::fprintf(stderr, "kiln-quantize: %s\n", std::string(status.ToString()).c_str());
    return 1;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "%s -> %s (%s): %d tensors requantized (%d by row-length fallback), %d copied; %.1f MiB -> "
      "%.1f MiB in %.1f s\n",
      paths[0].c_str(), paths[1].c_str(), type_name.c_str(), stats.tensors_requantized,
      stats.tensors_fell_back, stats.tensors_copied, stats.bytes_in / 1048576.0,
      stats.bytes_out / 1048576.0, seconds);
  return 0;
}
