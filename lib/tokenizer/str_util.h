// Private to lib/tokenizer: absl::StrCat arguments from std::string_view. The pinned Abseil
// (Debian 12) has its own absl::string_view type that StrCat's AlphaNum does not build from a
// std::string_view.
#pragma once

#include <string_view>

#include "absl/strings/string_view.h"

namespace kiln::tokenizer_internal {

inline absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace kiln::tokenizer_internal
