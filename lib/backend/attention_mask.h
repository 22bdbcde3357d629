// The attention mask in the flat form kernels read, and the one builder of tree visibility.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "lib/common/status.h"
#include "lib/kv/kv_cache.h"

namespace kiln {

// Which token sees which cache positions, in the flat (CSR) form kernels read. Token t of the
// batch belongs to sequence seq[t] (an index into the tables' sequences) and attends to its
// positions [first_visible[t], n_visible[t]) (first_visible empty: from 0; a sliding window
// otherwise) plus, when extra_indptr is not empty, the positions
// extra_positions[extra_indptr[t] .. extra_indptr[t + 1]) (tree ancestors and itself).
struct AttentionMask {
  std::span<const int32_t> seq;                 // [n_tokens]
  const KvTables* tables = nullptr;             // block tables of the batch's sequences
  std::span<const int32_t> n_visible;           // [n_tokens]
  std::span<const int32_t> extra_indptr;        // [n_tokens + 1] or empty
  std::span<const int32_t> extra_positions;     // [extra_indptr[n_tokens]]
  std::span<const int32_t> first_visible = {};  // [n_tokens] or empty
};

// Tree mask helper. For n tree nodes of one sequence: parent[i] is the index of node i's parent
// among the nodes (-1: child of the committed prefix; parents come before children), slot[i] is
// the logical cache position holding node i's K/V. Appends, for each node in order, its
// ancestors' slots and its own (sorted increasing) to extra_positions and the running offsets to
// extra_indptr (which gets n + 1 entries when it starts empty; otherwise n more, continuing
// from its last entry). Errors: parent index out of range or not earlier than the node.
absl::Status BuildTreeVisibility(std::span<const int32_t> parent, std::span<const int32_t> slot,
                                 std::vector<int32_t>& extra_indptr,
                                 std::vector<int32_t>& extra_positions);

}  // namespace kiln
