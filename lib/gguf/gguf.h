// GGUF reader: memory-maps (or borrows, or copies) a GGUF v2/v3 file, validates every field of
// the header, the metadata records and the tensor-info records, and exposes them as views into
// the file bytes. Layout facts: /work/shared/design/GGUF_FACTS.md §1.
//
// Trust model: every file is hostile. Parsing never reads outside the buffer, checks every count
// against the bytes that remain, every multiplication for overflow, and every tensor's data range
// against the file size. After a successful Open/Parse all views (KeyValue string data, tensor
// data pointers) stay valid for the lifetime of the GgufFile.
//
// Status codes (stable; lib/c_api maps them):
//   * DataLoss        — anything wrong with the bytes: truncation, bad magic, unsupported version,
//                       bad counts/lengths/types, invalid keys, invalid tensor infos, out-of-range
//                       or overlapping tensor data. The message starts with "gguf: ", names the
//                       field and the byte offset where it was read. (C API: KILN_ERR_FORMAT.)
//   * NotFound        — Open: the path does not exist (C API: KILN_ERR_IO); getters: key absent.
//   * PermissionDenied / FailedPrecondition (a directory, not a regular file) / other errno codes
//                     — Open: the path cannot be read (C API: KILN_ERR_IO).
//   * InvalidArgument — getters: the key holds another type, or the value does not fit; Parse:
//                       data == nullptr with size > 0.
//
// Validation decisions (stricter than ggml where ggml's leniency only admits broken files):
//   * versions 2 and 3 only (same layout); byte-swapped (big-endian) files are rejected;
//   * keys: non-empty, at most 65535 bytes, unique; strings at most 2^30 bytes;
//   * arrays: at most 2^30 elements, element type ARRAY (nested) rejected; bool values 0 or 1;
//   * general.alignment, when present, must be a UINT32 power of two (default 32);
//   * tensors: name 1..63 bytes and unique; 1 <= n_dims <= 4; every ne[i] >= 1 (ggml allows 0,
//     kiln rejects empty tensors: no model has one and they only hide bugs downstream);
//     element count and byte size must not overflow int64; type id must be known to
//     GgmlTypeInfoOf; ne[0] % block_size == 0; offset % alignment == 0; data inside the file;
//     no two tensors' data ranges overlap (tensors need not be stored in info order).
//
// Thread-safety: a GgufFile is immutable after Open/Parse; all const methods are thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "lib/common/platform.h"

namespace kiln::gguf {

inline constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as little-endian u32
inline constexpr uint64_t kDefaultAlignment = 32;
inline constexpr uint64_t kMaxStringLength = uint64_t{1} << 30;
inline constexpr uint64_t kMaxArrayCount = uint64_t{1} << 30;
inline constexpr uint64_t kMaxKeyLength = 65535;
inline constexpr size_t kMaxTensorNameLength = 63;  // ggml: length < 64
inline constexpr uint32_t kMaxDims = 4;

// On-disk metadata value type ids (GGUF_FACTS.md §1.3); never renumber.
enum class ValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};
inline constexpr uint32_t kValueTypeCount = 13;

// "uint8", "float32", "string", "array", ... ; "invalid" for ids outside the enum.
std::string_view ValueTypeName(ValueType type);
// Encoded size of one scalar of `type`; 0 for kString and kArray (variable) and invalid ids.
size_t ValueTypeSize(ValueType type);
bool IsIntegerType(ValueType type);  // u8..i64 (not bool)

// One metadata record. Read values through GgufFile's typed getters.
struct KeyValue {
  std::string key;
  ValueType type = ValueType::kUint8;
  ValueType array_type = ValueType::kUint8;  // valid when type == kArray
  uint64_t array_count = 0;                  // elements when type == kArray
  // Representation: the encoded value bytes, viewing the file.
  //   scalar: the value's little-endian bytes (value_size = ValueTypeSize(type));
  //   kString: the string bytes (no length prefix);
  //   kArray: the elements back to back, after the array's type and count fields (string
  //           elements keep their u64 length prefixes).
  const uint8_t* value_data = nullptr;
  uint64_t value_size = 0;
  uint64_t record_offset = 0;  // byte offset of the record (its key length) in the file
};

struct TensorInfo {
  std::string name;
  std::vector<uint64_t> ne;       // ne[0] innermost (ggml order); 1..4 entries, each >= 1
  uint32_t type = 0;              // ggml type id (lib/common/ggml_type.h)
  uint64_t offset = 0;            // relative to the data section
  const uint8_t* data = nullptr;  // absolute pointer into the mapping
  uint64_t nbytes = 0;
  uint64_t n_elements = 0;
  uint64_t info_offset = 0;  // byte offset of the tensor-info record in the file
};

struct GgufOpenOptions {
  bool use_mmap = true;  // false: read the file into an owned buffer
};

class GgufFile {
 public:
  using Options = GgufOpenOptions;

  // Opens and validates `path`. See the header comment for the status codes.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path,
                                                        Options options = {});
  // Parses bytes the caller keeps alive (fuzzing, in-memory models) for the lifetime of the
  // returned object; copy=true makes an owned copy first.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Parse(const uint8_t* data, size_t size,
                                                         bool copy = false);

  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // absolute start of the data section
  uint64_t file_size() const { return size_; }
  const uint8_t* bytes() const { return data_; }  // the whole file
  // True when bytes() is a read-only mapping of the file (pages can be dropped and re-read).
  bool mapped() const { return mapping_.mapped(); }

  const std::vector<KeyValue>& metadata() const { return metadata_; }
  const KeyValue* FindKey(std::string_view key) const;  // nullptr when absent; O(1)

  // Typed getters: NotFound naming the key if absent; InvalidArgument naming the key and its
  // actual type on a mismatch or when the value does not fit the result type.
  absl::StatusOr<uint64_t> GetUint(std::string_view key) const;  // any integer type >= 0
  absl::StatusOr<int64_t> GetInt(std::string_view key) const;    // any integer type that fits
  absl::StatusOr<double> GetFloat(std::string_view key) const;   // float32/64 and integers
  absl::StatusOr<bool> GetBool(std::string_view key) const;
  absl::StatusOr<std::string_view> GetString(std::string_view key) const;
  absl::StatusOr<std::vector<std::string_view>> GetStringArray(std::string_view key) const;
  absl::StatusOr<std::vector<float>> GetFloatArray(std::string_view key) const;  // floats, ints
  absl::StatusOr<std::vector<int64_t>> GetIntArray(std::string_view key) const;  // integers

  // Human-readable value for `kiln info`: numbers, quoted/escaped strings, arrays as
  // "[a, b, ... (N items)]" showing at most max_array_items elements.
  std::string ValueToString(const KeyValue& kv, size_t max_array_items = 8) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* FindTensor(std::string_view name) const;  // nullptr when absent; O(1)

 private:
  GgufFile() = default;
  absl::Status ParseAll();

  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  platform::FileMapping mapping_;  // the file's bytes when opened with use_mmap
  std::vector<uint8_t> owned_;

  uint32_t version_ = 0;
  uint64_t alignment_ = kDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<KeyValue> metadata_;
  std::vector<TensorInfo> tensors_;
  absl::flat_hash_map<std::string_view, size_t> key_index_;     // views into metadata_ keys
  absl::flat_hash_map<std::string_view, size_t> tensor_index_;  // views into tensors_ names
};

}  // namespace kiln::gguf
