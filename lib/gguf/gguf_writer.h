// GGUF writer (tests, tools): collects metadata and tensors in memory, then serializes a GGUF
// v3 (or v2) file: header, KV records in insertion order, tensor infos in insertion order,
// zero padding to the alignment, tensor data packed in info order, each tensor's offset a
// multiple of the alignment (the layout ggml's own reader requires, GGUF_FACTS.md §1.4-1.5).
//
// Errors: Set*/AddTensor never abort. Invalid keys (empty or longer than 65535 bytes), strings or
// arrays over 2^30, bad tensor names/shapes/types or a byte size that does not match the shape
// are reported by AddTensor's status or, for Set*, remembered and returned by status(),
// WriteToBuffer() and WriteToFile(). Setting an existing key replaces its value in place.
// When alignment != 32, `general.alignment` (uint32) is written as the first record.
//
// Thread-safety: none; use one writer per thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/gguf/gguf.h"

namespace kiln::gguf {

struct GgufWriterOptions {
  uint32_t version = 3;     // 2 or 3 (same layout)
  uint32_t alignment = 32;  // power of two
};

class GgufWriter {
 public:
  using Options = GgufWriterOptions;
  GgufWriter() : GgufWriter(Options{}) {}
  explicit GgufWriter(Options options);

  // --- scalars
  void SetUint8(std::string_view key, uint8_t v);
  void SetInt8(std::string_view key, int8_t v);
  void SetUint16(std::string_view key, uint16_t v);
  void SetInt16(std::string_view key, int16_t v);
  void SetUint32(std::string_view key, uint32_t v);
  void SetInt32(std::string_view key, int32_t v);
  void SetFloat32(std::string_view key, float v);
  void SetBool(std::string_view key, bool v);
  void SetString(std::string_view key, std::string_view v);
  void SetUint64(std::string_view key, uint64_t v);
  void SetInt64(std::string_view key, int64_t v);
  void SetFloat64(std::string_view key, double v);

  // --- arrays (element type in the name)
  void SetArrayUint8(std::string_view key, std::span<const uint8_t> v);
  void SetArrayInt8(std::string_view key, std::span<const int8_t> v);
  void SetArrayUint16(std::string_view key, std::span<const uint16_t> v);
  void SetArrayInt16(std::string_view key, std::span<const int16_t> v);
  void SetArrayUint32(std::string_view key, std::span<const uint32_t> v);
  void SetArrayInt32(std::string_view key, std::span<const int32_t> v);
  void SetArrayFloat32(std::string_view key, std::span<const float> v);
  void SetArrayBool(std::string_view key, std::span<const bool> v);
  void SetArrayUint64(std::string_view key, std::span<const uint64_t> v);
  void SetArrayInt64(std::string_view key, std::span<const int64_t> v);
  void SetArrayFloat64(std::string_view key, std::span<const double> v);
  void SetArrayString(std::string_view key, std::span<const std::string> v);
  void SetArrayString(std::string_view key, std::span<const std::string_view> v);

  // Copies one record verbatim from a parsed file (e.g. all tokenizer.* keys of another model).
  void CopyKeyValue(const KeyValue& kv);

  // Adds a tensor: ne in ggml order (ne[0] innermost), 1..4 dims each >= 1, a known ggml type
  // id with ne[0] % block_size == 0, and exactly the tensor's byte size in `bytes`.
  absl::Status AddTensor(std::string_view name, uint32_t ggml_type, std::vector<uint64_t> ne,
                         std::span<const uint8_t> bytes);
  absl::Status AddTensor(std::string_view name, uint32_t ggml_type, std::vector<uint64_t> ne,
                         std::vector<uint8_t>&& bytes);

  bool HasKey(std::string_view key) const;
  size_t tensor_count() const { return tensors_.size(); }
  absl::Status status() const { return status_; }

  absl::StatusOr<std::vector<uint8_t>> WriteToBuffer() const;
  // Atomic: streams to `path`.tmp, fsyncs, renames over `path` (removes the .tmp on failure).
  absl::Status WriteToFile(const std::string& path) const;

 private:
  struct Record {
    std::string key;
    ValueType type;
    std::vector<uint8_t> value;  // encoded value (arrays: elem type + count + elements)
  };
  struct Tensor {
    std::string name;
    uint32_t type;
    std::vector<uint64_t> ne;
    std::vector<uint8_t> bytes;
  };
  void SetRecord(std::string_view key, ValueType type, std::vector<uint8_t> value);
  template <typename T>
  void SetScalar(std::string_view key, ValueType type, T v);
  template <typename T>
  void SetArray(std::string_view key, ValueType elem_type, std::span<const T> v);
  absl::Status ValidateTensor(std::string_view name, uint32_t ggml_type,
                              const std::vector<uint64_t>& ne, size_t nbytes) const;
  void Fail(absl::Status s);
  // Header, KV records, tensor infos and padding up to the data section; the data offset of
  // each tensor in *offsets and the data section's total size in *data_bytes.
  std::vector<uint8_t> SerializeHeader(std::vector<uint64_t>* offsets, uint64_t* data_bytes) const;

  Options options_;
  absl::Status status_;
  std::vector<Record> records_;
  std::vector<Tensor> tensors_;
};

}  // namespace kiln::gguf
