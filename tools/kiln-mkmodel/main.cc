// kiln-mkmodel: writes a random-weight GGUF model of a named shape (any registered architecture).
//
//   kiln-mkmodel --shape SHAPE (kiln-mkmodel --help lists them)
//                --type f32|f16|bf16|q4_0|q4_1|q5_0|q5_1|q8_0|q2_K|q3_K|q4_K|q5_K|q6_K
//                --out PATH [--seed N] [--vocab-from GGUF]
//
// What is written (keys, tensors, fallbacks, tokenizer): lib/model/random_model.h.
// Exit status: 0 on success, 2 on a usage error, 1 on any other failure (message on stderr).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "lib/gguf/file_type.h"
#include "lib/gguf/gguf.h"
#include "lib/gguf/gguf_writer.h"
#include "lib/model/random_model.h"

namespace {

std::string UsageText() {
  return "usage: kiln-mkmodel --shape " + absl::StrJoin(kiln::RandomModelShapeNames(), "|") +
         "\n"
         "                    --type "
         "f32|f16|bf16|q4_0|q4_1|q5_0|q5_1|q8_0|q2_K|q3_K|q4_K|q5_K|q6_K\n"
         "                    --out PATH [--seed N] [--vocab-from GGUF]\n";
}

int Usage(const std::string& why) {
  std::fprintf(stderr, "kiln-mkmodel: %s\n%s", why.c_str(), UsageText().c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string shape_name, type_name, out, vocab_from;
  uint64_t seed = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::fputs(UsageText().c_str(), stdout);
      return 0;
    }
    if (i + 1 >= argc) return Usage(std::string("missing value after ") + argv[i]);
    const char* value = argv[++i];
    if (arg == "--shape") {
      shape_name = value;
    } else if (arg == "--type") {
      type_name = value;
    } else if (arg == "--out") {
      out = value;
    } else if (arg == "--seed") {
      if (!absl::SimpleAtoi(value, &seed)) return Usage(std::string("bad --seed ") + value);
    } else if (arg == "--vocab-from") {
      vocab_from = value;
    } else {
      return Usage(std::string("unknown option ") + argv[i - 1]);
    }
  }
  if (shape_name.empty() || type_name.empty() || out.empty()) {
    return Usage("--shape, --type and --out are required");
  }
  auto shape = kiln::RandomModelShapeByName(shape_name);
  if (!shape.ok()) return Usage(std::string(shape.status().message()));
  auto type = kiln::gguf::WeightTypeByName(type_name);
  if (!type.ok()) return Usage(std::string(type.status().message()));

  std::unique_ptr<kiln::gguf::GgufFile> vocab;
  if (!vocab_from.empty()) {
    auto f = kiln::gguf::GgufFile::Open(vocab_from);
    if (!f.ok()) {
      std::fprintf(stderr, "kiln-mkmodel: --vocab-from: %s\n", f.status().ToString().c_str());
      return 1;
    }
    vocab = std::move(f).value();
  }

  kiln::RandomModelOptions options;
  options.shape = *shape;
  options.type = *type;
  options.seed = seed;
  options.vocab_from = vocab.get();
  options.note = [](std::string_view msg) {
    std::fprintf(stderr, "kiln-mkmodel: %.*s\n", static_cast<int>(msg.size()), msg.data());
  };
  kiln::gguf::GgufWriter writer;
  if (absl::Status st = kiln::BuildRandomModel(options, &writer); !st.ok()) {
    std::fprintf(stderr, "kiln-mkmodel: %s\n", st.ToString().c_str());
    return 1;
  }
  if (absl::Status st = writer.WriteToFile(out); !st.ok()) {
    std::fprintf(stderr, "kiln-mkmodel: %s\n", st.ToString().c_str());
    return 1;
  }
  std::printf("kiln-mkmodel: wrote %s (shape %s, type %s, seed %llu, %zu tensors)\n", out.c_str(),
              shape_name.c_str(), type_name.c_str(), static_cast<unsigned long long>(seed),
              writer.tensor_count());
  return 0;
}
