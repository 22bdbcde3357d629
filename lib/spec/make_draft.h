// MakeDraftModel: a draft model for speculative decoding cut from a target GGUF by keeping its
// first k transformer blocks. The token embedding, final norm and output head (every tensor not
// named blk.<i>.*) are kept as they are, blk.<i>.* tensors with i >= k are dropped and
// <arch>.block_count becomes k; every other metadata record (vocabulary, chat template, RoPE
// settings) is copied verbatim, so the draft shares the target's tokenizer exactly.
// Per-layer metadata arrays (none in llama-family files) are not rewritten.
//
// Thread-safety: a free function; reads `in_path`, writes `out_path` atomically.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace kiln::spec {

struct MakeDraftInfo {
  int64_t target_layers = 0;
  int64_t draft_layers = 0;
  int64_t tensors_kept = 0;
  int64_t tensors_dropped = 0;
  uint64_t bytes_kept = 0;  // tensor data bytes of the draft
};

// Errors: GGUF open/parse errors (naming the byte offset), NotFound (no general.architecture or
// <arch>.block_count), InvalidArgument (layers outside [1, block_count], naming both), write
// errors.
absl::Status MakeDraftModel(const std::string& in_path, const std::string& out_path, int64_t layers,
                            MakeDraftInfo* info = nullptr);

}  // namespace kiln::spec
