#include "lib/model/architecture.h"

namespace kiln {

// Each architecture's file (arch/<name>.cc) defines its factory, named here once.
namespace arch {
const Architecture& Llama();
const Architecture& Qwen2();
const Architecture& Gemma3();
const Architecture& Qwen3();
const Architecture& Phi3();
const Architecture& Mistral3();
const Architecture& Deepseek2();
}  // namespace arch

namespace {

// The registry: one line per architecture.
// clang-format off
const Architecture* const kArchitectures[] = {
    &arch::Llama(),
    &arch::Qwen2(),
    &arch::Gemma3(),
    &arch::Qwen3(),
    &arch::Phi3(),
    &arch::Mistral3(),
    &arch::Deepseek2(),
};
// clang-format on

}  // namespace

const Architecture* FindArchitecture(std::string_view name) {
  for (const Architecture* a : kArchitectures) {
    if (a->name() == name) return a;
  }
  return nullptr;
}

std::vector<std::string_view> ArchitectureNames() {
  std::vector<std::string_view> names;
  for (const Architecture* a : kArchitectures) names.push_back(a->name());
  return names;
}

}  // namespace kiln
