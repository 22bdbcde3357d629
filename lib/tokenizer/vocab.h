// Vocab: the tokenizer's data as stored in a GGUF file (tokenizer.ggml.*), in plain vectors so
// tests can build vocabularies by hand. A Vocab is plain data (copyable, no invariants enforced
// until Validate(), which Tokenizer::Create calls).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kiln {

namespace gguf {
class GgufFile;
}  // namespace gguf

// tokenizer.ggml.token_type values (llama.cpp's enum; 0 = undefined).
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// tokenizer.ggml.model
enum class VocabModel {
  kBpe,  // "gpt2": byte-level BPE with merges ranked by order
  kSpm,  // "llama": SentencePiece-style, merges by token score, byte fallback <0xXX>
};

// tokenizer.ggml.pre: which pre-tokenizer (regex split) byte-level BPE applies.
enum class PreTokenizer {
  kDefault,  // "default" (or missing): [\p{P}$+<=>^~|]+, then GPT-2, then \p{N}+, then [0-9]{3}
  kGpt2,     // "gpt2" and friends: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+
  kSmollm,   // "smollm"/"starcoder"/...: \p{N} (each digit alone), then the GPT-2 pattern
  kLlama3,   // "llama3"/"llama-bpe"/...: the Llama-3 pattern with \p{N}{1,3}; ignore_merges
  kQwen2,    // "qwen2"/...: the Llama-3 pattern with single \p{N}
};

// Maps a tokenizer.ggml.pre string to a PreTokenizer; an unknown name is an InvalidArgument
// error naming it.
absl::StatusOr<PreTokenizer> ParsePreTokenizer(std::string_view name);

struct Vocab {
  VocabModel model = VocabModel::kBpe;
  PreTokenizer pre = PreTokenizer::kGpt2;

  // Indexed by token id; `tokens` is the token text exactly as stored in GGUF (byte-level BPE:
  // GPT-2 byte-to-unicode encoded, e.g. "Ġthe"; SPM: "▁" for spaces, "<0x0A>" byte tokens).
  std::vector<std::string> tokens;
  std::vector<float> scores;     // empty (all 0) or one per token; SPM merge priority
  std::vector<TokenType> types;  // empty (all normal) or one per token

  // BPE merges, highest priority first (rank = index): {left, right} in token-text encoding.
  std::vector<std::pair<std::string, std::string>> merges;

  // Special ids; -1 = none.
  int32_t bos = -1;
  int32_t eos = -1;
  int32_t eot = -1;  // end of turn; FromGguf falls back to a token named <|im_end|>, <|eot_id|>...
  int32_t eom = -1;
  int32_t unk = -1;
  int32_t pad = -1;
  int32_t sep = -1;

  bool add_bos = false;           // Encode(add_special=true) prepends bos
  bool add_eos = false;           // Encode(add_special=true) appends eos
  bool add_space_prefix = false;  // SPM: prepend ' ' to text at the start / after a special token

  // Reads tokenizer.ggml.{model, pre, tokens, scores, token_type, merges, bos_token_id,
  // eos_token_id, eot_token_id, eom_token_id, unknown_token_id, padding_token_id,
  // seperator_token_id, add_bos_token, add_eos_token, add_space_prefix} with llama.cpp's defaults
  // (SPM: bos 1, eos 2, unk 0, add_bos true, add_space_prefix true; BPE: add_bos only for the
  // llama3 pre-tokenizer). Errors name the key that is missing or malformed.
  static absl::StatusOr<Vocab> FromGguf(const gguf::GgufFile& file);

  // Checks sizes (scores/types empty or n_vocab long), special ids in range, merges non-empty
  // strings. Errors name the field and index.
  absl::Status Validate() const;

  int32_t size() const { return static_cast<int32_t>(tokens.size()); }
  TokenType type(int32_t id) const { return types.empty() ? TokenType::kNormal : types[id]; }
  float score(int32_t id) const { return scores.empty() ? 0.0f : scores[id]; }
};

}  // namespace kiln
