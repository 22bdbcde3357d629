// The ggml tensor type ids used by GGUF files, and the block geometry of each type.
// Shared by the GGUF reader (size validation), the quant kernels and the model loader.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace kiln {

// Values are the on-disk ggml_type ids (GGUF_FACTS.md §1.6); never renumber.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
  kCount = 43,  // one past the largest id the table knows
};

struct GgmlTypeInfo {
  std::string_view name;  // ggml's name, e.g. "q4_1"
  uint32_t block_size;    // elements per block (1 for plain types)
  uint32_t type_size;     // bytes per block
};

// Geometry of a type id as found in a file, or nullopt for ids that are not (or no longer)
// valid ggml types. Knowing a type's geometry does not mean kiln can compute with it.
std::optional<GgmlTypeInfo> GgmlTypeInfoOf(uint32_t type_id);

// Name for messages ("q4_1", or "type#N" for unknown ids).
std::string GgmlTypeName(uint32_t type_id);

// Bytes of one row of `n` elements; requires n % block_size == 0 (callers validate first).
inline size_t GgmlRowBytes(const GgmlTypeInfo& info, uint64_t n) {
  return static_cast<size_t>(n / info.block_size) * info.type_size;
}

}  // namespace kiln
