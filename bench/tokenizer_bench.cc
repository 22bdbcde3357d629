// Tokenizer throughput: encodes a multi-megabyte text with the default model's tokenizer and
// prints MB/s and tokens/s per repetition. bench/tokenizer_bench.py runs it side by side with
// llama.cpp (llama-cpp-python) on the same text file.
//
//   tokenizer_bench [--model PATH] [--text FILE | --write-text FILE] [--reps N] [--mb N]
//                   [--dump-ids FILE]   (the ids of the last repetition, int32 little-endian)
//
// Without --text the text is built deterministically: the files of /usr/share/common-licenses
// and the kiln sources under lib/ (both sorted by path), concatenated and repeated until --mb
// MiB (default 5), cut at a UTF-8 character boundary. --write-text writes that text and exits.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "lib/gguf/gguf.h"
#include "lib/tokenizer/tokenizer.h"

namespace {

std::string ReadFile(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string BuildText(size_t target_bytes) {
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  // The repository's lib/, located from this file's path (CMake compiles it by absolute path).
  const std::string lib_dir =
      (std::filesystem::path(__FILE__).parent_path().parent_path() / "lib").string();
  for (const std::string& dir : {std::string("/usr/share/common-licenses"), lib_dir}) {
    for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
         !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
      if (!it->is_regular_file()) continue;
      const std::string ext = it->path().extension().string();
      if (dir.find("licenses") != std::string::npos || ext == ".cc" || ext == ".h") {
        files.push_back(it->path());
      }
    }
  }
  std::sort(files.begin(), files.end());
  std::string corpus;
  for (const auto& f : files) corpus += ReadFile(f);
  if (corpus.empty()) corpus = "The quick brown fox jumps over the lazy dog 1234.\n";
  std::string text;
  text.reserve(target_bytes + corpus.size());
  while (text.size() < target_bytes) text += corpus;
  size_t cut = target_bytes;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  text.resize(cut);
  return text;
}

std::string DefaultModel() {
  const char* dir = std::getenv("KILN_MODEL_DIR");
  std::string base =
      dir && *dir ? dir
                  : std::string(std::getenv("HOME") ? std::getenv("HOME") : "") + "/.cache/kiln";
  return base + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = DefaultModel(), text_path, write_path, dump_path;
  int reps = 5;
  double mb = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--model") {
      model = next();
    } else if (a == "--text") {
      text_path = next();
    } else if (a == "--write-text") {
      write_path = next();
    } else if (a == "--dump-ids") {
      dump_path = next();
    } else if (a == "--reps") {
      reps = std::max(1, std::atoi(next().c_str()));
    } else if (a == "--mb") {
      mb = std::atof(next().c_str());
    } else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  std::string text =
      text_path.empty() ? BuildText(static_cast<size_t>(mb * 1024 * 1024)) : ReadFile(text_path);
  if (!write_path.empty()) {
    std::ofstream(write_path, std::ios::binary) << text;
    std::printf("wrote %zu bytes to %s\n", text.size(), write_path.c_str());
    return 0;
  }
  auto file = kiln::gguf::GgufFile::Open(model);
  if (!file.ok()) {
    std::fprintf(stderr, "%s\n", file.status().ToString().c_str());
    return 1;
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto tok = kiln::Tokenizer::FromGguf(**file);
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", tok.status().ToString().c_str());
    return 1;
  }
  std::printf("kiln tokenizer: vocab %d, load %.1f ms, text %zu bytes\n", (*tok)->n_vocab(),
              load_s * 1e3, text.size());
  std::vector<int32_t> ids;
  for (int r = 0; r < reps; ++r) {
    ids.clear();
    const auto start = std::chrono::steady_clock::now();
    const absl::Status st = (*tok)->EncodeTo(text, false, false, &ids);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.ToString().c_str());
      return 1;
    }
    std::printf("rep %d: tokens %zu seconds %.6f MB/s %.2f tokens/s %.0f\n", r, ids.size(), s,
                text.size() / s / 1e6, ids.size() / s);
  }
  if (!dump_path.empty()) {
    std::ofstream(dump_path, std::ios::binary)
        .write(reinterpret_cast<const char*>(ids.data()),
               static_cast<std::streamsize>(ids.size() * sizeof(int32_t)));
  }
  return 0;
}
