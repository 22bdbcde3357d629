// kiln::StrCat: absl::StrCat that also accepts std::string_view. Debian 12's Abseil (20220623)
// is built with its own absl::string_view type, from which absl::AlphaNum cannot be built.
#pragma once

#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"

namespace kiln {
namespace strings_internal {
inline absl::string_view AlphaNumArg(std::string_view s) { return {s.data(), s.size()}; }
template <typename T>
const T& AlphaNumArg(const T& v) {
  return v;
}
}  // namespace strings_internal

template <typename... Args>
std::string StrCat(const Args&... args) {
  return absl::StrCat(strings_internal::AlphaNumArg(args)...);
}

}  // namespace kiln
