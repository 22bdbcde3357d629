// Seed inputs of the GGUF reader fuzzer (tests/fuzz/gguf_reader_fuzz.cc), written with kiln's
// own GgufWriter so that nothing binary is checked in and no Python is needed. Used by
//   * kiln-fuzz-seeds (tests/fuzz/make_seeds.cc): writes them into a directory for
//     tests/fuzz/run_fuzz.sh;
//   * tests/unit/gguf_fuzz_corpus_test.cc: builds them in memory and replays them.
//
// The seeds (each well under 10 KB, so the fuzzer mutates them quickly):
//   empty.gguf            v3, only general.architecture, no tensors
//   all_value_types.gguf  every scalar value type and an array of every element type, plus an
//                         empty array and strings with non-ASCII bytes
//   tiny_model.gguf       a one-layer llama: hparams, a 4-token BPE vocabulary with merges, and
//                         tensors of type q8_0, f32, q4_0, f16 and q4_1 (1-D and 2-D)
//   tiny_model_v2.gguf    the same content as a GGUF v2 file
//   kquant_tensors.gguf   one tensor of each K-quant, q5_0, q5_1, q8_1, iq4_nl, bf16 (3-D),
//                         i8, i16, i32, i64 and f64
//   aligned64.gguf        general.alignment 64, two f32 tensors (1-D, 2-D)
//   aligned1_v2.gguf      v2, general.alignment 1, odd-sized tensors packed without padding
//                         (i8, 4-D f16, f32)
// Every seed carries general.architecture = "llama". Tensor data comes from a fixed-seed
// generator: the bytes are identical on every run and platform (little-endian).
//
// Thread-safety: reentrant.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kiln::fuzz {

struct FuzzSeed {
  std::string name;            // file name, e.g. "tiny_model.gguf"
  std::vector<uint8_t> bytes;  // a complete GGUF file
};

// The seeds above, in the listed order. An error only if GgufWriter rejects a seed (a bug here).
absl::StatusOr<std::vector<FuzzSeed>> BuildFuzzSeeds();

// Writes every seed into `dir` (created if missing; existing files of the same names are
// replaced). Returns the paths written, or an error naming the file that could not be written.
absl::StatusOr<std::vector<std::string>> WriteFuzzSeeds(const std::string& dir);

}  // namespace kiln::fuzz
