// Weight-type names as the tools spell them (`--type q4_K`) and the llama_ftype a file whose
// matrices are mostly of one type records in general.file_type (kiln-mkmodel, kiln-quantize).
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace kiln::gguf {

// "f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K", "q3_K", "q4_K", "q5_K",
// "q6_K" -> ggml type id; InvalidArgument naming the string otherwise.
absl::StatusOr<uint32_t> WeightTypeByName(std::string_view name);

// llama_ftype written as general.file_type for a model whose matrices are mostly `ggml_type`
// (0, ALL_F32, for a type without one).
uint32_t FileTypeOf(uint32_t ggml_type);

}  // namespace kiln::gguf
