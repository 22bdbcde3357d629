// absl::StrCat that also takes std::string_view. The pinned Abseil (20220623, Debian 12) is
// built with its own absl::string_view type, which StrCat's AlphaNum does not build from a
// std::string_view. Private to lib/gguf.
#pragma once

#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"

namespace kiln::gguf::internal {

inline absl::string_view ToAlphaNumArg(std::string_view s) { return {s.data(), s.size()}; }
template <typename T>
const T& ToAlphaNumArg(const T& v) {
  return v;
}

template <typename... Args>
std::string Cat(const Args&... args) {
  return absl::StrCat(ToAlphaNumArg(args)...);
}

}  // namespace kiln::gguf::internal
