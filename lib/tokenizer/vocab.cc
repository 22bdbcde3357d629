#include "lib/tokenizer/vocab.h"

#include <array>

#include "lib/common/status.h"
#include "lib/tokenizer/str_util.h"

namespace kiln {

absl::StatusOr<PreTokenizer> ParsePreTokenizer(std::string_view name) {
  struct Alias {
    std::string_view name;
    PreTokenizer pre;
  };
  // Names from llama.cpp's tokenizer.ggml.pre values that share each regex list.
  static constexpr std::array<Alias, 24> kAliases = {{
      {"default", PreTokenizer::kDefault},   {"gpt2", PreTokenizer::kGpt2},
      {"gpt-2", PreTokenizer::kGpt2},        {"phi-2", PreTokenizer::kGpt2},
      {"mpt", PreTokenizer::kGpt2},          {"olmo", PreTokenizer::kGpt2},
      {"jais", PreTokenizer::kGpt2},         {"trillion", PreTokenizer::kGpt2},
      {"smollm", PreTokenizer::kSmollm},     {"starcoder", PreTokenizer::kSmollm},
      {"refact", PreTokenizer::kSmollm},     {"command-r", PreTokenizer::kSmollm},
      {"codeshell", PreTokenizer::kSmollm},  {"exaone", PreTokenizer::kSmollm},
      {"minerva-7b", PreTokenizer::kSmollm}, {"llama3", PreTokenizer::kLlama3},
      {"llama-v3", PreTokenizer::kLlama3},   {"llama-bpe", PreTokenizer::kLlama3},
      {"falcon3", PreTokenizer::kLlama3},    {"pixtral", PreTokenizer::kLlama3},
      {"qwen2", PreTokenizer::kQwen2},       {"deepseek-r1-qwen", PreTokenizer::kQwen2},
      {"stablelm2", PreTokenizer::kQwen2},   {"megrez", PreTokenizer::kQwen2},
  }};
  for (const Alias& a : kAliases) {
    if (a.name == name) return a.pre;
  }
  return absl::InvalidArgumentError(absl::StrCat("tokenizer.ggml.pre: unsupported pre-tokenizer \"",
                                                 tokenizer_internal::Sv(name), "\""));
}

absl::Status Vocab::Validate() const {
  const size_t n = tokens.size();
  if (n == 0) return absl::InvalidArgumentError("vocab: tokens is empty");
  if (n > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat("vocab: too many tokens (", n, ")"));
  }
  if (!scores.empty() && scores.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab: scores has ", scores.size(), " entries, tokens has ", n));
  }
  if (!types.empty() && types.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab: token_type has ", types.size(), " entries, tokens has ", n));
  }
  for (size_t i = 0; i < types.size(); ++i) {
    const auto t = static_cast<int32_t>(types[i]);
    if (t < 0 || t > static_cast<int32_t>(TokenType::kByte)) {
      return absl::InvalidArgumentError(
          absl::StrCat("vocab: token_type[", i, "] = ", t, " is not a valid token type"));
    }
  }
  for (size_t i = 0; i < merges.size(); ++i) {
    if (merges[i].first.empty() || merges[i].second.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("vocab: merges[", i, "] has an empty side"));
    }
  }
  const std::pair<const char*, int32_t> specials[] = {{"bos", bos}, {"eos", eos}, {"eot", eot},
                                                      {"eom", eom}, {"unk", unk}, {"pad", pad},
                                                      {"sep", sep}};
  for (const auto& [name, id] : specials) {
    if (id < -1 || id >= static_cast<int32_t>(n)) {
      return absl::InvalidArgumentError(
          absl::StrCat("vocab: ", name, " token id ", id, " out of range [0, ", n, ")"));
    }
  }
  if (add_bos && bos < 0) return absl::InvalidArgumentError("vocab: add_bos set but no bos id");
  if (add_eos && eos < 0) return absl::InvalidArgumentError("vocab: add_eos set but no eos id");
  return absl::OkStatus();
}

}  // namespace kiln
