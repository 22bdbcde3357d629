// StreamingDetokenizer: turns token ids pushed one at a time into text that is always valid
// UTF-8, for streaming generated tokens to a user.
//
// Byte-level BPE and SPM byte-fallback tokens can split one character over several tokens
// (an emoji is often 2-4 byte tokens). Push() returns only complete characters and holds back
// an incomplete trailing sequence until the bytes that complete it arrive. Bytes that can never
// become valid UTF-8 (a stray continuation byte, a lead byte followed by a non-continuation,
// overlong/surrogate forms) are replaced by U+FFFD, one per maximal invalid subpart (the
// Unicode/WHATWG "replacement of maximal subparts" practice, as Python's errors="replace").
// Flush() ends the stream: a held-back incomplete sequence becomes one U+FFFD.
//
// The concatenation of all outputs equals Tokenizer::Decode(all ids) whenever that is valid
// UTF-8 (including SPM's leading-space stripping).
//
// Thread-safety: one instance per stream; not safe for concurrent use. The Tokenizer must
// outlive it.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "lib/tokenizer/tokenizer.h"

namespace kiln {

class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer& tokenizer, bool render_special = false)
      : tokenizer_(tokenizer), render_special_(render_special) {}

  // Adds one token; returns the newly completed text (possibly empty). An out-of-range id is an
  // InvalidArgument error and leaves the state unchanged.
  absl::StatusOr<std::string> Push(int32_t id);
  // Returns whatever is held back (incomplete sequence -> U+FFFD) and resets the stream.
  std::string Flush();
  // Forgets held-back bytes and starts a new stream.
  void Reset();

  // Bytes currently held back (0..3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  // Moves the complete/invalid prefix of pending_ into *out; keeps an incomplete tail if
  // `final` is false.
  void Drain(bool final, std::string* out);

  const Tokenizer& tokenizer_;
  bool render_special_;
  bool strip_pending_ = true;  // SPM: the first text piece still has to lose a leading space
  std::string pending_;
};

}  // namespace kiln
