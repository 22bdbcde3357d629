// kiln-mkeagle TARGET.gguf OUT.gguf [--init identity|last-layer|random] [--seed S]
// Writes an EAGLE head file for TARGET (general.architecture "eagle", its fingerprint and layer
// shapes; docs/speculative.md). The weights are not trained: identity (the head returns the
// feature it reads), last-layer (default: fc = [I | I] and the target's last decoder layer) or
// random. Such heads exercise the strategy's plumbing and exactness; they do not speed up.
#include <charconv>
#include <cstdio>
#include <string>
#include <string_view>

#include "lib/model/model.h"
#include "lib/spec/eagle_strategy.h"

namespace {

int Usage() {
  std::fprintf(stderr,
               "usage: kiln-mkeagle TARGET.gguf OUT.gguf [--init identity|last-layer|random]"
               " [--seed S]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string in, out;
  kiln::spec::EagleHeadInit init = kiln::spec::EagleHeadInit::kLastLayer;
  uint64_t seed = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--init") {
      if (i + 1 >= argc) return Usage();
      const std::string_view v = argv[++i];
      if (v == "identity") {
        init = kiln::spec::EagleHeadInit::kIdentity;
      } else if (v == "last-layer") {
        init = kiln::spec::EagleHeadInit::kLastLayer;
      } else if (v == "random") {
        init = kiln::spec::EagleHeadInit::kRandom;
      } else {
        std::fprintf(stderr, "kiln-mkeagle: --init: '%s' must be identity, last-layer or random\n",
                     argv[i]);
        return 2;
      }
    } else if (arg == "--seed") {
      if (i + 1 >= argc) return Usage();
      const std::string_view v = argv[++i];
      const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), seed);
      if (ec != std::errc() || end != v.data() + v.size()) {
        std::fprintf(stderr, "kiln-mkeagle: --seed: '%s' is not an unsigned integer\n", argv[i]);
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
  if (in.empty() || out.empty()) return Usage();
  kiln::ModelLoadOptions load;
  load.path = in;
  auto model = kiln::Model::Load(load);
  if (!model.ok()) {
    std::fprintf(stderr, "kiln-mkeagle: %s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  const absl::Status st = kiln::spec::WriteDerivedEagleHead(**model, init, seed, out);
  if (!st.ok()) {
    std::fprintf(stderr, "kiln-mkeagle: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  std::fprintf(stderr, "kiln-mkeagle: wrote %s\n", out.c_str());
  return 0;
}
