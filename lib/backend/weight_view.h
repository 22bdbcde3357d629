// WeightView: one weight tensor as the model binds it and every backend op reads it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "lib/common/ggml_type.h"
#include "lib/common/status.h"

namespace kiln {

// A matmul over a range of a weight's rows (Backend::MatMulRange) starts it on a multiple of
// this, and ends it on one or on the last row: the CPU's 16-row tiles and interleaved groups.
inline constexpr int64_t kMatMulRowAlign = 16;

// A 2-D weight as stored in GGUF: ggml ne = {n_in, n_out}, i.e. n_out rows of n_in elements of
// `type`, each row contiguous (GgmlRowBytes bytes), rows back to back. Vectors
// (norms, biases) have n_out = 1.
struct WeightView {
  GgmlType type = GgmlType::kF32;
  const void* data = nullptr;
  int64_t n_in = 0;   // ne[0]
  int64_t n_out = 0;  // ne[1]
  // The backend's prepared copy of `data` (Backend::PrepareWeights; the CPU backend's
  // row-interleaved layout for the integer-order matmuls), or null. When set, the kiln numeric
  // order multiplies with it; the llama.cpp order always reads `data`.
  const void* interleaved = nullptr;
  // Where `interleaved` is still being written (the CPU backend's background copy): rows
  // [0, *copied_rows) of it are complete (a multiple of 16, or n_out). Null: all of it.
  const std::atomic<int64_t>* copied_rows = nullptr;
  // Set by the CPU backend's PrepareWeights for the types whose copy's kernel has an in-place form
  // (QuantKernels::in_place_tile, the same bits): the kiln numeric order multiplies `data` with it
  // where no copied rows serve (until the copy is written); the llama.cpp order ignores it.
  bool in_place = false;
  std::string_view name = {};  // the GGUF tensor name ("" for views made by tests and benchmarks)
  // A device backend's copy of `data` in device memory (Backend::PrepareWeights of the CUDA
  // backend: the same bytes, quantized types kept quantized), or null. Never dereferenced on the
  // host; the CPU backend ignores it.
  const void* device_data = nullptr;

  size_t row_bytes() const {
    const auto info = GgmlTypeInfoOf(static_cast<uint32_t>(type));
    return info ? GgmlRowBytes(*info, static_cast<uint64_t>(n_in)) : 0;
  }
  const uint8_t* Row(int64_t r) const {
    return static_cast<const uint8_t*>(data) + static_cast<size_t>(r) * row_bytes();
  }
  const float* AsF32() const { return static_cast<const float*>(data); }  // f32 vectors
  // Rows of `interleaved` that may be read now.
  int64_t InterleavedRows() const {
    if (interleaved == nullptr) return 0;
    return copied_rows == nullptr ? n_out : copied_rows->load(std::memory_order_acquire);
  }
  // Rows [first, first + count) of the file's bytes as a weight of their own (an expert of a 3-D
  // tensor, a head's rows); without the prepared copies, which are laid out for the whole tensor.
  WeightView Rows(int64_t first, int64_t count) const {
    WeightView v = *this;
    v.data = Row(first);
    v.n_out = count;
    v.interleaved = nullptr;
    v.copied_rows = nullptr;
    v.device_data = nullptr;
    return v;
  }
};

// One output of a matmul of a shared input (Backend::MatMulEach): y = W x.
struct MatMulTarget {
  const WeightView* w = nullptr;
  float* y = nullptr;  // [n_tokens, w->n_out]
};

// InvalidArgument unless every target has a weight and all take the same n_in (one input).
absl::Status CheckMatMulTargets(std::span<const MatMulTarget> targets);

}  // namespace kiln
