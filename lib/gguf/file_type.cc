#include "lib/gguf/file_type.h"

#include <utility>

#include "lib/common/ggml_type.h"
#include "lib/common/status.h"
#include "lib/common/strings.h"

namespace kiln::gguf {

absl::StatusOr<uint32_t> WeightTypeByName(std::string_view name) {
  static constexpr std::pair<std::string_view, GgmlType> kTypes[] = {
      {"f32", GgmlType::kF32},   {"f16", GgmlType::kF16},   {"bf16", GgmlType::kBF16},
      {"q4_0", GgmlType::kQ4_0}, {"q4_1", GgmlType::kQ4_1}, {"q5_0", GgmlType::kQ5_0},
      {"q5_1", GgmlType::kQ5_1}, {"q8_0", GgmlType::kQ8_0}, {"q2_K", GgmlType::kQ2_K},
      {"q3_K", GgmlType::kQ3_K}, {"q4_K", GgmlType::kQ4_K}, {"q5_K", GgmlType::kQ5_K},
      {"q6_K", GgmlType::kQ6_K},
  };
  for (const auto& [n, t] : kTypes) {
    if (n == name) return static_cast<uint32_t>(t);
  }
  return absl::InvalidArgumentError(
      StrCat("unknown weight type '", name,
             "' (known: f32 f16 bf16 q4_0 q4_1 q5_0 q5_1 q8_0 q2_K q3_K q4_K q5_K q6_K)"));
}

uint32_t FileTypeOf(uint32_t ggml_type) {
  switch (static_cast<GgmlType>(ggml_type)) {
    case GgmlType::kF32:
      return 0;  // ALL_F32
    case GgmlType::kF16:
      return 1;  // MOSTLY_F16
    case GgmlType::kQ4_0:
      return 2;  // MOSTLY_Q4_0
    case GgmlType::kQ4_1:
      return 3;
    case GgmlType::kQ8_0:
      return 7;
    case GgmlType::kQ5_0:
      return 8;
    case GgmlType::kQ5_1:
      return 9;
    case GgmlType::kQ2_K:
      return 10;
    case GgmlType::kQ3_K:
      return 11;  // Q3_K_S (every matrix q3_K)
    case GgmlType::kQ4_K:
      return 14;  // Q4_K_S
    case GgmlType::kQ5_K:
      return 16;  // Q5_K_S
    case GgmlType::kQ6_K:
      return 18;
    case GgmlType::kBF16:
      return 32;
    default:
      return 0;
  }
}

}  // namespace kiln::gguf
