// The target state_reader_fuzz reads states against (the dimensions of a small model with one
// sliding-window layer and one global layer, as gemma3 interleaves them), shared
// with kiln-state-seeds, which writes seed states that fit it.
#pragma once

#include "lib/engine/draft_policy.h"
#include "lib/session/session_state.h"

namespace kiln::fuzz {

inline state::StateTarget StateFuzzTarget() {
  state::StateTarget t;
  t.model_fingerprint = 0x1234'5678'9abc'def0ULL;
  t.model_description = "fuzz model";
  t.n_vocab = 300;
  t.n_ctx = 512;
  t.kv_type = GgmlType::kF16;
  t.kv_tiles = 2 * 2 * 2;  // 2 layers, K and V, 2 KV heads
  t.kv_row_elems = 8;
  t.kv_row_bytes = 16;
  t.kv_sliding_layers = {1, 0};  // layer 0 slides (its tiles may start later), layer 1 is global
  t.max_timed_width = spec::PassCostModel::kMaxTimedWidth;
  return t;
}

}  // namespace kiln::fuzz
