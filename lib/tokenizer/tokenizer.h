// Tokenizer: text <-> token ids for the vocabularies of GGUF models, following llama.cpp's
// semantics (so ids match llama.cpp on the same file).
//
//   * Byte-level BPE (tokenizer.ggml.model "gpt2"): pre-tokenizer split (pre_tokenizer.h), then
//     per word the BPE merge loop by merge rank (lowest first, ties leftmost), on a linked list of
//     symbols with a binary heap: O(n log n) in the word length. Words of 2..48 bytes are
//     memoized in a bounded thread-local cache (BPE of a word depends only on its bytes), and
//     long texts are pre-tokenized in chunks cut after a lone '\n' between ASCII non-space
//     bytes (always a word boundary for every supported pre-tokenizer), so the work buffers
//     stay small. Any byte sequence encodes. Invalid UTF-8 is first replaced as llama.cpp
//     does (unicode::ReplaceInvalidUtf8): each byte that is not UTF-8 becomes U+FFFD, even
//     when the vocab has a token for the raw byte, and an overlong form becomes its shortest
//     form; so ids match llama.cpp, and Decode gives the replaced text. Valid UTF-8 decodes
//     back to the same bytes.
//   * SentencePiece-style ("llama"): ' ' -> "▁" (plus one leading "▁" at the text start and after
//     a special token when add_space_prefix), symbols = UTF-8 characters, merge the adjacent pair
//     whose concatenation is a token with the highest score (ties leftmost); characters that end
//     up outside the vocab become byte tokens <0xXX>, or the unknown token if the vocab lacks one
//     of their bytes (an error if it has no unknown token either). A byte that is not UTF-8 is
//     a symbol of its own and stays a byte token <0xXX> when the vocab has one (the text
//     survives Decode exactly, as with llama.cpp's byte fallback); without one it becomes
//     U+FFFD first (its token, its byte tokens, or the unknown token). Never dropped.
//   * Special tokens: before either, the text is split on the texts of control / unknown tokens
//     (only with parse_special) and user-defined tokens (always); longer texts are matched first
//     over the whole text, then shorter ones in what is left (llama.cpp's partition order).
//     LSTRIP/RSTRIP attributes are not modelled (GGUF does not store them).
//
// Decode concatenates TokenPiece of each id; it does not apply llama.cpp's optional
// clean_up_tokenization_spaces (off for smollm/qwen2) so Decode(Encode(x)) == x for BPE.
// SPM with add_space_prefix: the first piece of text (a NORMAL token) loses one leading space.
//
// Thread-safety: immutable after Create; all const methods may be called concurrently. Encode
// uses thread-local scratch buffers, so steady-state calls allocate only their output.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/tokenizer/vocab.h"

namespace kiln {

class Tokenizer {
 public:
  // Builds from a GGUF file's tokenizer.ggml.* metadata (see Vocab::FromGguf).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const gguf::GgufFile& file);
  // Validates `vocab` and builds the lookup tables. Supported: VocabModel::kBpe with any
  // PreTokenizer, VocabModel::kSpm.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Create(Vocab vocab);

  // Tokenizes `text` (any bytes). add_special: prepend bos / append eos per the vocab's add_bos /
  // add_eos. parse_special: text equal to a control token's text (e.g. "<|im_start|>") becomes
  // that token; otherwise it is tokenized as plain text.
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_special,
                                              bool parse_special) const;
  // Same, appending to *out (whose capacity is reused).
  absl::Status EncodeTo(std::string_view text, bool add_special, bool parse_special,
                        std::vector<int32_t>* out) const;

  // The bytes of `ids` (control/unknown tokens only when render_special). Error (InvalidArgument)
  // for an id out of range, naming the id and its index.
  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids, bool render_special) const;

  // The token's text as stored in the vocab ("Ġthe", "▁the", "<0x0A>"); "" if out of range.
  std::string_view TokenText(int32_t id) const;
  // Appends the raw bytes `id` contributes to decoded text: NORMAL tokens their bytes, BYTE
  // tokens their byte, USER_DEFINED their text, CONTROL/UNKNOWN their text only when
  // render_special, UNUSED/UNDEFINED nothing. No leading-space stripping (see Decode).
  absl::Status TokenPiece(int32_t id, bool render_special, std::string* out) const;

  int32_t n_vocab() const { return vocab_.size(); }
  int32_t bos() const { return vocab_.bos; }
  int32_t eos() const { return vocab_.eos; }
  int32_t eot() const { return vocab_.eot; }
  int32_t unk() const { return vocab_.unk; }
  // eos, eot, eom and tokens named like an end of turn (<|im_end|>, <|eot_id|>, <|endoftext|>..)
  bool IsEndOfGeneration(int32_t id) const;
  bool IsControl(int32_t id) const;
  TokenType type(int32_t id) const;
  const Vocab& vocab() const { return vocab_; }

  // True when Decode should strip one leading space from the first NORMAL piece (SPM with
  // add_space_prefix). Exposed for StreamingDetokenizer.
  bool strips_leading_space() const {
    return vocab_.model == VocabModel::kSpm && vocab_.add_space_prefix;
  }

  struct Scratch;  // thread-local work buffers (defined in tokenizer.cc)

 private:
  explicit Tokenizer(Vocab vocab) : vocab_(std::move(vocab)) {}
  absl::Status Build();
  absl::Status BuildBpe();
  absl::Status BuildSpm();

  struct Segment {
    size_t begin;
    size_t end;
    int32_t token;  // -1: raw text [begin, end)
  };
  void Partition(std::string_view text, bool parse_special, Scratch& s) const;
  void EncodeBpeText(std::string_view text, Scratch& s, std::vector<int32_t>* out) const;
  void EncodeBpeWord(std::string_view word, Scratch& s, std::vector<int32_t>* out) const;
  void EmitBpeSymbol(int32_t sym, std::vector<int32_t>* out) const;
  absl::Status EncodeSpmText(std::string_view text, bool space_prefix, Scratch& s,
                             std::vector<int32_t>* out) const;
  std::string_view Piece(int32_t id) const {
    return std::string_view(pieces_).substr(piece_offsets_[id],
                                            piece_offsets_[id + 1] - piece_offsets_[id]);
  }

  Vocab vocab_;
  std::vector<TokenType> types_;  // per token, after llama.cpp's EOG fix-ups
  std::vector<uint8_t> eog_;      // per token: 1 = end of generation

  // Decoded bytes of every token, concatenated: token i is [piece_offsets_[i], [i+1]).
  std::string pieces_;
  std::vector<uint32_t> piece_offsets_;

  // Special-token partition candidates (control, unknown, user-defined), longest text first.
  std::vector<int32_t> specials_;
  bool special_first_byte_[256] = {};
  bool has_user_defined_ = false;  // matched even without parse_special

  // --- BPE: symbols are token ids, or ids >= n_vocab for merge parts that are not tokens.
  std::string bpe_keys_;  // raw bytes of every token whose text is byte-level encoded
  absl::flat_hash_map<std::string_view, int32_t> bpe_symbol_of_;  // raw bytes -> symbol
  std::vector<std::unique_ptr<std::string>> extra_symbols_;       // symbol n_vocab + i
  struct Merge {
    int32_t rank;
    int32_t result;  // symbol of left + right
  };
  absl::flat_hash_map<uint64_t, Merge> merges_;  // (left symbol << 32 | right symbol) -> merge
  int32_t byte_symbol_[256];                     // symbol of each single byte, -1 if none
  bool ignore_merges_ = false;
  // Distinguishes Tokenizer instances for the thread-local word cache (never reused).
  uint64_t instance_id_ = 0;

  // --- SPM
  absl::flat_hash_map<std::string_view, int32_t> spm_token_of_;  // token text -> id
  int32_t byte_token_[256];                                      // <0xXX> (or the char), or -1
};

}  // namespace kiln
