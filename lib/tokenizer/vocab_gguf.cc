// Vocab::FromGguf and Tokenizer::FromGguf: the only tokenizer code that depends on the GGUF
// reader.
#include "lib/common/status.h"
#include "lib/gguf/gguf.h"
#include "lib/tokenizer/str_util.h"
#include "lib/tokenizer/tokenizer.h"
#include "lib/tokenizer/vocab.h"

namespace kiln {
namespace {

using tokenizer_internal::Sv;

// Reads an optional token id; `fallback` when absent. Values must fit int32 (range against the
// vocab is checked by Validate).
absl::Status ReadId(const gguf::GgufFile& f, std::string_view key, int32_t* id) {
  if (f.FindKey(key) == nullptr) return absl::OkStatus();
  KILN_ASSIGN_OR_RETURN(const int64_t v, f.GetInt(key));
  if (v < -1 || v > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(Sv(key), ": token id ", v, " out of range"));
  }
  *id = static_cast<int32_t>(v);
  return absl::OkStatus();
}

absl::Status ReadFlag(const gguf::GgufFile& f, std::string_view key, bool* flag) {
  if (f.FindKey(key) == nullptr) return absl::OkStatus();
  KILN_ASSIGN_OR_RETURN(*flag, f.GetBool(key));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Vocab> Vocab::FromGguf(const gguf::GgufFile& f) {
  Vocab v;
  KILN_ASSIGN_OR_RETURN(const std::string_view model, f.GetString("tokenizer.ggml.model"));
  if (model == "gpt2") {
    v.model = VocabModel::kBpe;
  } else if (model == "llama") {
    v.model = VocabModel::kSpm;
  } else {
    return absl::UnimplementedError(
        absl::StrCat("tokenizer.ggml.model: unsupported tokenizer model \"", Sv(model), "\""));
  }
  v.pre = PreTokenizer::kDefault;
  if (v.model == VocabModel::kBpe && f.FindKey("tokenizer.ggml.pre") != nullptr) {
    KILN_ASSIGN_OR_RETURN(const std::string_view pre, f.GetString("tokenizer.ggml.pre"));
    KILN_ASSIGN_OR_RETURN(v.pre, ParsePreTokenizer(pre));
  }

  KILN_ASSIGN_OR_RETURN(const std::vector<std::string_view> tokens,
                        f.GetStringArray("tokenizer.ggml.tokens"));
  v.tokens.assign(tokens.begin(), tokens.end());
  const size_t n = v.tokens.size();
  if (f.FindKey("tokenizer.ggml.scores") != nullptr) {
    KILN_ASSIGN_OR_RETURN(v.scores, f.GetFloatArray("tokenizer.ggml.scores"));
  }
  if (f.FindKey("tokenizer.ggml.token_type") != nullptr) {
    KILN_ASSIGN_OR_RETURN(const std::vector<int64_t> types,
                          f.GetIntArray("tokenizer.ggml.token_type"));
    v.types.reserve(types.size());
    for (size_t i = 0; i < types.size(); ++i) {
      if (types[i] < 0 || types[i] > static_cast<int64_t>(TokenType::kByte)) {
        return absl::InvalidArgumentError(absl::StrCat("tokenizer.ggml.token_type[", i,
                                                       "] = ", types[i], " is not a token type"));
      }
      v.types.push_back(static_cast<TokenType>(types[i]));
    }
  }
  if (f.FindKey("tokenizer.ggml.merges") != nullptr) {
    KILN_ASSIGN_OR_RETURN(const std::vector<std::string_view> merges,
                          f.GetStringArray("tokenizer.ggml.merges"));
    v.merges.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) {
      // "left right", split at the first space after the first byte (a side may start with ' ').
      const size_t sp = merges[i].size() > 1 ? merges[i].find(' ', 1) : std::string_view::npos;
      if (sp == std::string_view::npos || sp + 1 >= merges[i].size()) {
        return absl::InvalidArgumentError(absl::StrCat("tokenizer.ggml.merges[", i, "] = \"",
                                                       Sv(merges[i]), "\" is not \"left right\""));
      }
      v.merges.emplace_back(std::string(merges[i].substr(0, sp)),
                            std::string(merges[i].substr(sp + 1)));
    }
  } else if (v.model == VocabModel::kBpe) {
    return absl::NotFoundError("tokenizer.ggml.merges: missing (required for a gpt2 tokenizer)");
  }

  // llama.cpp's defaults, then the keys override.
  auto in_range = [&](int32_t id) { return id >= 0 && static_cast<size_t>(id) < n ? id : -1; };
  if (v.model == VocabModel::kSpm) {
    v.bos = in_range(1);
    v.eos = in_range(2);
    v.unk = in_range(0);
    v.add_bos = true;
    v.add_space_prefix = true;
  } else {
    v.bos = in_range(11);
    v.eos = in_range(11);
    v.add_bos = v.pre == PreTokenizer::kLlama3;
  }
  KILN_RETURN_IF_ERROR(ReadId(f, "tokenizer.ggml.bos_token_id", &v.bos));
  KILN_RETURN_IF_ERROR(ReadId(f, "tokenizer.ggml.eos_token_id", &v.eos));
  KILN_RETURN_IF_ERROR(ReadId(f, "tokenizer.ggml.eot_token_id", &v.eot));
  KILN_RETURN_IF_ERROR(ReadId(f, "tokenizer.ggml.eom_token_id", &v.eom));
  KILN_RETURN_IF_ERROR(ReadId(f, "tokenizer.ggml.unknown_token_id", &v.unk));
  KILN_RETURN_IF_ERROR(ReadId(f, "tokenizer.ggml.padding_token_id", &v.pad));
  KILN_RETURN_IF_ERROR(ReadId(f, "tokenizer.ggml.seperator_token_id", &v.sep));
  KILN_RETURN_IF_ERROR(ReadFlag(f, "tokenizer.ggml.add_bos_token", &v.add_bos));
  KILN_RETURN_IF_ERROR(ReadFlag(f, "tokenizer.ggml.add_eos_token", &v.add_eos));
  KILN_RETURN_IF_ERROR(ReadFlag(f, "tokenizer.ggml.add_space_prefix", &v.add_space_prefix));
  KILN_RETURN_IF_ERROR(v.Validate());
  return v;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const gguf::GgufFile& file) {
  KILN_ASSIGN_OR_RETURN(Vocab vocab, Vocab::FromGguf(file));
  return Create(std::move(vocab));
}

}  // namespace kiln
