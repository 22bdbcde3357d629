// Requantizing a GGUF model to another weight type (what `kiln-quantize` runs).
//
// Every tensor whose name ends in "weight", has 2 or more dimensions and is not a norm
// ("_norm.weight") is decoded with its type's exact dequantizer and re-encoded with the target
// type's reference quantizer (lib/quant/quant.h). A tensor already in its destination type is
// copied byte for byte. Everything else (1-D norms, biases, rope_freqs) is copied unchanged.
//
// Row-length fallback (as llama-quantize does): when ne[0] is not a multiple of the target's
// block size, K-quants fall back to a 32-element type (q4_K -> q5_0, q5_K -> q5_1, q2_K/q3_K/q6_K
// -> q8_0; llama.cpp sends q2_K/q3_K to iq4_nl, which kiln does not write); any type whose block
// still does not fit falls back to f16.
//
// Metadata: every key is copied verbatim in its original order, except general.file_type, which
// becomes the target's llama_ftype (the key is added when the source has none). The output keeps
// the source's alignment.
//
// Thread-safety: pure functions of their inputs.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "lib/common/ggml_type.h"
#include "lib/common/status.h"
#include "lib/gguf/gguf.h"
#include "lib/gguf/gguf_writer.h"

namespace kiln {

struct RequantizeOptions {
  GgmlType target = GgmlType::kQ8_0;
  // Copy the output projection unchanged: output.weight, or token_embd.weight when the model
  // ties its head to the embeddings (no output.weight).
  bool keep_output_type = false;
  // One line per tensor (name, source type, destination type); may be empty.
  std::function<void(std::string_view)> log;
};

struct RequantizeStats {
  int tensors_requantized = 0;  // decoded and re-encoded
  int tensors_fell_back = 0;    // of those, written in a fallback type
  int tensors_copied = 0;       // copied byte for byte
  uint64_t bytes_in = 0;        // tensor data bytes read
  uint64_t bytes_out = 0;       // tensor data bytes written
};

// The type a 2-D weight with rows of `n_in` elements gets for `target` (the fallback rule above).
GgmlType RequantizeRowType(GgmlType target, uint64_t n_in);

// Fills `out` (a fresh writer) with `in` requantized. Errors: InvalidArgument naming the tensor
// when its type cannot be decoded or the target cannot be encoded by kiln.
absl::Status RequantizeModel(const gguf::GgufFile& in, const RequantizeOptions& options,
                             gguf::GgufWriter* out, RequantizeStats* stats = nullptr);

// Opens `in_path`, requantizes it and writes `out_path` atomically (temp file + rename).
absl::Status RequantizeFile(const std::string& in_path, const std::string& out_path,
                            const RequantizeOptions& options, RequantizeStats* stats = nullptr);

}  // namespace kiln
