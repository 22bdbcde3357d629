#include "lib/backend/attention_mask.h"

#include <algorithm>

namespace kiln {

absl::Status BuildTreeVisibility(std::span<const int32_t> parent, std::span<const int32_t> slot,
                                 std::vector<int32_t>& extra_indptr,
                                 std::vector<int32_t>& extra_positions) {
  if (parent.size() != slot.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "BuildTreeVisibility: parent has %d entries, slot has %d", parent.size(), slot.size()));
  }
  for (size_t i = 0; i < parent.size(); ++i) {
    if (parent[i] < -1 || parent[i] >= static_cast<int32_t>(i)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "BuildTreeVisibility: parent[%d] = %d must be -1 or an earlier node", i, parent[i]));
    }
  }
  if (extra_indptr.empty()) extra_indptr.push_back(static_cast<int32_t>(extra_positions.size()));
  for (size_t i = 0; i < parent.size(); ++i) {
    const size_t begin = extra_positions.size();
    for (int32_t n = static_cast<int32_t>(i); n >= 0; n = parent[n]) {
      extra_positions.push_back(slot[n]);
    }
    std::sort(extra_positions.begin() + begin, extra_positions.end());
    extra_indptr.push_back(static_cast<int32_t>(extra_positions.size()));
  }
  return absl::OkStatus();
}

}  // namespace kiln
