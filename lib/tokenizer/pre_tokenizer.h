// Pre-tokenizers of byte-level BPE: hand-written, Unicode-aware scanners equivalent to the regex
// lists llama.cpp applies for each tokenizer.ggml.pre (see PreTokenizer in vocab.h). Passes are
// applied in sequence: each pass re-splits every fragment of the previous pass, and both the
// matched spans and the gaps between them become fragments.
//
// Invalid UTF-8: Tokenizer hands the pre-tokenizer text already passed through
// unicode::ReplaceInvalidUtf8 (each invalid byte is U+FFFD, as in llama.cpp), so the words are
// llama.cpp's. The text is decoded with unicode::DecodeUtf8Lenient, llama.cpp's rule:
// a surrogate (which the replacement keeps) is one unit of no class. Any other text is still
// split safely: a byte the decoder rejects becomes its own unit with no class (like a symbol:
// not \p{L}, \p{N} nor \s), and words are byte ranges of the text given, so they cover it.
//
// Thread-safety: stateless functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "lib/tokenizer/vocab.h"

namespace kiln::pretok {

// One code point (or one invalid byte) of the text being split.
struct Unit {
  uint32_t offset;  // byte offset of the unit in the text
  uint32_t cp;      // code point (lenient decoding), or unicode::kInvalidBase + byte
  uint8_t flags;    // unicode::CodepointFlags
};

// Decodes `text` (precondition: size < 4 GiB) into units, plus a sentinel unit whose offset is
// text.size(); `units` is cleared first and its capacity reused.
void DecodeUnits(std::string_view text, std::vector<Unit>* units);

// Splits the units (as produced by DecodeUnits, sentinel included) into words and calls
// emit(byte_begin, byte_end) for each non-empty word, in text order. The words cover the text.
void Split(PreTokenizer pre, const std::vector<Unit>& units,
           absl::FunctionRef<void(size_t, size_t)> emit);

// Convenience (tests, tools): the words of `text` as strings.
std::vector<std::string> SplitToStrings(PreTokenizer pre, std::string_view text);

}  // namespace kiln::pretok
