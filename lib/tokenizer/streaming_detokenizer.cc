#include "lib/tokenizer/streaming_detokenizer.h"

#include "lib/common/status.h"
#include "lib/tokenizer/unicode.h"

namespace kiln {

namespace {
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD
}  // namespace

absl::StatusOr<std::string> StreamingDetokenizer::Push(int32_t id) {
  std::string piece;
  KILN_RETURN_IF_ERROR(tokenizer_.TokenPiece(id, render_special_, &piece));
  if (strip_pending_ && tokenizer_.strips_leading_space() && !piece.empty()) {
    if (tokenizer_.type(id) == TokenType::kNormal && piece[0] == ' ') piece.erase(0, 1);
    strip_pending_ = false;
  }
  pending_ += piece;
  std::string out;
  Drain(/*final=*/false, &out);
  return out;
}

std::string StreamingDetokenizer::Flush() {
  std::string out;
  Drain(/*final=*/true, &out);
  Reset();
  return out;
}

void StreamingDetokenizer::Reset() {
  pending_.clear();
  strip_pending_ = true;
}

void StreamingDetokenizer::Drain(bool final, std::string* out) {
  size_t pos = 0;
  while (pos < pending_.size()) {
    size_t full = 0;
    const size_t valid = unicode::ValidPrefixLength(pending_, pos, &full);
    if (valid == 0) {  // cannot start a sequence
      out->append(kReplacement);
      pos += 1;
    } else if (valid == full) {  // complete character
      out->append(pending_, pos, full);
      pos += full;
    } else if (pos + valid == pending_.size() && !final) {  // incomplete tail: wait
      break;
    } else {  // maximal invalid subpart (or a truncated tail at the end of the stream)
      out->append(kReplacement);
      pos += valid;
    }
  }
  pending_.erase(0, pos);
}

}  // namespace kiln
