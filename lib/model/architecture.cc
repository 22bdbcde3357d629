#include "lib/model/architecture.h"

#include "lib/common/strings.h"

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

absl::Status CheckBatchTokens(const ForwardBatch& batch, const KvCache& cache, int64_t n_vocab) {
  if (batch.tokens.empty()) return absl::InvalidArgumentError("forward: empty batch");
  const int32_t n_layers = cache.layout().n_layers();
  for (size_t k = 0; k < batch.hidden_layers.size(); ++k) {
    const int32_t l = batch.hidden_layers[k];
    if (l < 0 || l >= n_layers || (k > 0 && l <= batch.hidden_layers[k - 1])) {
      return absl::InvalidArgumentError(StrCat("forward: hidden_layers[", k, "] = ", l,
                                               " is not a layer in [0, ", n_layers,
                                               ") above the one before it"));
    }
  }
  for (size_t i = 0; i < batch.tokens.size(); ++i) {
    const BatchToken& t = batch.tokens[i];
    if (t.token < 0 || t.token >= n_vocab) {
      return absl::InvalidArgumentError(
          StrCat("forward: token ", i, " has id ", t.token, " outside [0, ", n_vocab, ")"));
    }
    if (t.pos < 0)
      return absl::OutOfRangeError(StrCat("forward: token ", i, " has position ", t.pos));
    auto len = cache.Length(t.seq);
    if (!len.ok()) {
      return absl::InvalidArgumentError(StrCat("forward: token ", i, ": ", len.status().message()));
    }
    if (t.cache_index < 0 || t.cache_index >= *len) {
      return absl::OutOfRangeError(StrCat("forward: token ", i, " cache index ", t.cache_index,
                                          " outside its sequence's ", *len, " slots"));
    }
    if (t.parent >= 0) {
      if (t.parent >= static_cast<int32_t>(i) || batch.tokens[t.parent].seq != t.seq) {
        return absl::InvalidArgumentError(
            StrCat("forward: token ", i, " has parent ", t.parent,
                   ", which is not an earlier token of its sequence"));
      }
      if (batch.tokens[t.parent].cache_index >= t.cache_index) {
        return absl::InvalidArgumentError(
            StrCat("forward: tree token ", i, " must sit after its parent in the cache"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace kiln
