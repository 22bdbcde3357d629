#include "lib/gguf/gguf.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/common/ggml_type.h"
#include "lib/common/platform.h"
#include "lib/common/status.h"
#include "lib/common/strings.h"

namespace kiln::gguf {
namespace {

constexpr uint64_t kInt64Max = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

template <typename T>
T LoadLE(const uint8_t* p) {  // little-endian host assumed (x86-64, aarch64)
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Overflow-checked arithmetic on u64.
bool MulOverflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}
bool AddOverflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_add_overflow(a, b, out);
}

// Bounds-checked cursor over the file bytes. Errors carry the byte offset of the failed read.
class Cursor {
 public:
  Cursor(const uint8_t* data, uint64_t size) : data_(data), size_(size) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }
  const uint8_t* here() const { return data_ + pos_; }

  absl::Status Truncated(std::string_view what, uint64_t need) const {
    return absl::DataLossError(absl::StrFormat(
        "gguf: %s at byte %d: needs %d bytes but the file ends after %d more (file size %d)", what,
        pos_, need, remaining(), size_));
  }
  absl::Status Need(uint64_t n, std::string_view what) const {
    if (n > remaining()) return Truncated(what, n);
    return absl::OkStatus();
  }
  template <typename T>
  absl::StatusOr<T> Read(std::string_view what) {
    KILN_RETURN_IF_ERROR(Need(sizeof(T), what));
    T v = LoadLE<T>(here());
    pos_ += sizeof(T);
    return v;
  }
  void Skip(uint64_t n) { pos_ += n; }  // caller checked Need(n)

  // gguf_string: u64 length + bytes. `what` names the string for messages.
  absl::StatusOr<std::string_view> ReadString(std::string_view what) {
    const uint64_t at = pos_;
    KILN_ASSIGN_OR_RETURN(uint64_t len, Read<uint64_t>(StrCat(what, " length")));
    if (len > kMaxStringLength) {
      return absl::DataLossError(absl::StrFormat(
          "gguf: %s at byte %d: length %d exceeds the limit of 2^30 bytes", what, at, len));
    }
    KILN_RETURN_IF_ERROR(Need(len, StrCat(what, " bytes")));
    std::string_view s(reinterpret_cast<const char*>(here()), len);
    pos_ += len;
    return s;
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

bool IsValidValueType(uint32_t t) { return t < kValueTypeCount; }

std::string Quote(std::string_view s, size_t max_bytes = std::string_view::npos) {
  std::string out = "\"";
  size_t n = std::min(s.size(), max_bytes);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20 || c == 0x7F) {
          absl::StrAppendFormat(&out, "\\x%02x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
  if (n < s.size()) absl::StrAppend(&out, "...(", s.size(), " bytes)");
  return out;
}

// Formats one scalar of `type` encoded at p (not string/array).
std::string ScalarToString(ValueType type, const uint8_t* p) {
  switch (type) {
    case ValueType::kUint8:
      return StrCat(LoadLE<uint8_t>(p));
    case ValueType::kInt8:
      return StrCat(LoadLE<int8_t>(p));
    case ValueType::kUint16:
      return StrCat(LoadLE<uint16_t>(p));
    case ValueType::kInt16:
      return StrCat(LoadLE<int16_t>(p));
    case ValueType::kUint32:
      return StrCat(LoadLE<uint32_t>(p));
    case ValueType::kInt32:
      return StrCat(LoadLE<int32_t>(p));
    case ValueType::kUint64:
      return StrCat(LoadLE<uint64_t>(p));
    case ValueType::kInt64:
      return StrCat(LoadLE<int64_t>(p));
    case ValueType::kFloat32:
      return absl::StrFormat("%.9g", LoadLE<float>(p));
    case ValueType::kFloat64:
      return absl::StrFormat("%.17g", LoadLE<double>(p));
    case ValueType::kBool:
      return p[0] ? "true" : "false";
    default:
      return "?";
  }
}

// Integer scalar of `type` at p, as (negative?, magnitude-ish) pair: signed value in *s when
// the type is signed, unsigned value in *u otherwise. Returns false for non-integer types.
bool LoadInteger(ValueType type, const uint8_t* p, bool* is_signed, int64_t* s, uint64_t* u) {
  *is_signed = false;
  switch (type) {
    case ValueType::kUint8:
      *u = LoadLE<uint8_t>(p);
      return true;
    case ValueType::kUint16:
      *u = LoadLE<uint16_t>(p);
      return true;
    case ValueType::kUint32:
      *u = LoadLE<uint32_t>(p);
      return true;
    case ValueType::kUint64:
      *u = LoadLE<uint64_t>(p);
      return true;
    case ValueType::kInt8:
      *is_signed = true;
      *s = LoadLE<int8_t>(p);
      return true;
    case ValueType::kInt16:
      *is_signed = true;
      *s = LoadLE<int16_t>(p);
      return true;
    case ValueType::kInt32:
      *is_signed = true;
      *s = LoadLE<int32_t>(p);
      return true;
    case ValueType::kInt64:
      *is_signed = true;
      *s = LoadLE<int64_t>(p);
      return true;
    default:
      return false;
  }
}

absl::Status TypeMismatch(const KeyValue& kv, std::string_view expected) {
  std::string actual(ValueTypeName(kv.type));
  if (kv.type == ValueType::kArray) {
    actual += StrCat(" of ", ValueTypeName(kv.array_type));
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("gguf: key '%s' has type %s, expected %s", kv.key, actual, expected));
}

}  // namespace

std::string_view ValueTypeName(ValueType type) {
  switch (type) {
    case ValueType::kUint8:
      return "uint8";
    case ValueType::kInt8:
      return "int8";
    case ValueType::kUint16:
      return "uint16";
    case ValueType::kInt16:
      return "int16";
    case ValueType::kUint32:
      return "uint32";
    case ValueType::kInt32:
      return "int32";
    case ValueType::kFloat32:
      return "float32";
    case ValueType::kBool:
      return "bool";
    case ValueType::kString:
      return "string";
    case ValueType::kArray:
      return "array";
    case ValueType::kUint64:
      return "uint64";
    case ValueType::kInt64:
      return "int64";
    case ValueType::kFloat64:
      return "float64";
  }
  return "invalid";
}

size_t ValueTypeSize(ValueType type) {
  switch (type) {
    case ValueType::kUint8:
    case ValueType::kInt8:
    case ValueType::kBool:
      return 1;
    case ValueType::kUint16:
    case ValueType::kInt16:
      return 2;
    case ValueType::kUint32:
    case ValueType::kInt32:
    case ValueType::kFloat32:
      return 4;
    case ValueType::kUint64:
    case ValueType::kInt64:
    case ValueType::kFloat64:
      return 8;
    case ValueType::kString:
    case ValueType::kArray:
      return 0;
  }
  return 0;
}

bool IsIntegerType(ValueType type) {
  switch (type) {
    case ValueType::kUint8:
    case ValueType::kInt8:
    case ValueType::kUint16:
    case ValueType::kInt16:
    case ValueType::kUint32:
    case ValueType::kInt32:
    case ValueType::kUint64:
    case ValueType::kInt64:
      return true;
    default:
      return false;
  }
}

// ---------------------------------------------------------------------------------------------
// Construction

GgufFile::~GgufFile() = default;

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path, Options options) {
  auto with_prefix = [](const absl::Status& st) {
    return absl::Status(st.code(), StrCat("gguf: ", st.message()));
  };
  absl::StatusOr<platform::ReadOnlyFile> opened = platform::ReadOnlyFile::Open(path);
  if (!opened.ok()) return with_prefix(opened.status());
  const platform::ReadOnlyFile& f = *opened;
  if (f.kind() == platform::ReadOnlyFile::Kind::kDirectory) {
    return absl::FailedPreconditionError(
        StrCat("gguf: '", path, "' is a directory, not a GGUF file"));
  }
  if (f.kind() != platform::ReadOnlyFile::Kind::kRegular) {
    return absl::FailedPreconditionError(StrCat("gguf: '", path, "' is not a regular file"));
  }
  const uint64_t size = f.size();
  if (size == 0) {
    return absl::DataLossError(StrCat("gguf: '", path, "' is empty (0 bytes)"));
  }

  std::unique_ptr<GgufFile> file(new GgufFile());
  if (options.use_mmap) {
    absl::StatusOr<platform::FileMapping> m = f.Map(size);
    if (!m.ok()) return with_prefix(m.status());
    file->mapping_ = *std::move(m);
    file->data_ = file->mapping_.data();
    file->size_ = file->mapping_.size();
  } else {
    file->owned_.resize(size);
    absl::StatusOr<uint64_t> got = f.ReadAt(0, file->owned_.data(), size);
    if (!got.ok()) return with_prefix(got.status());
    if (*got != size) {
      return absl::DataLossError(
          absl::StrFormat("gguf: '%s' shrank while reading: got %d of %d bytes", path, *got, size));
    }
    file->data_ = file->owned_.data();
    file->size_ = size;
  }
  absl::Status st2 = file->ParseAll();
  if (!st2.ok()) {
    return absl::Status(st2.code(), StrCat(st2.message(), " [file '", path, "']"));
  }
  return file;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Parse(const uint8_t* data, size_t size,
                                                          bool copy) {
  if (data == nullptr && size > 0) {
    return absl::InvalidArgumentError("gguf: Parse called with data == nullptr and size > 0");
  }
  if (size == 0) return absl::DataLossError("gguf: empty buffer (0 bytes), not a GGUF file");
  std::unique_ptr<GgufFile> file(new GgufFile());
  if (copy) {
    file->owned_.assign(data, data + size);
    file->data_ = file->owned_.data();
  } else {
    file->data_ = data;
  }
  file->size_ = size;
  KILN_RETURN_IF_ERROR(file->ParseAll());
  return file;
}

// ---------------------------------------------------------------------------------------------
// Parsing

absl::Status GgufFile::ParseAll() {
  Cursor c(data_, size_);
  if (size_ < 4) {
    return absl::DataLossError(absl::StrFormat(
        "gguf: file too small for the magic (%d bytes, need at least 24 for the header)", size_));
  }
  KILN_ASSIGN_OR_RETURN(const uint32_t magic, c.Read<uint32_t>("magic"));
  if (magic != kMagic) {
    return absl::DataLossError(absl::StrFormat(
        "gguf: bad magic at byte 0: %02x %02x %02x %02x (expected 47 47 55 46 \"GGUF\")", data_[0],
        data_[1], data_[2], data_[3]));
  }
  KILN_ASSIGN_OR_RETURN(version_, c.Read<uint32_t>("version"));
  if ((version_ & 0xFFFF) == 0 && version_ != 0) {
    return absl::DataLossError(absl::StrFormat(
        "gguf: version at byte 4 is 0x%08x: a byte-swapped (big-endian) file, not supported",
        version_));
  }
  if (version_ != 2 && version_ != 3) {
    return absl::DataLossError(absl::StrFormat(
        "gguf: version at byte 4 is %d; kiln reads versions 2 and 3 only", version_));
  }
  KILN_ASSIGN_OR_RETURN(const uint64_t tensor_count, c.Read<uint64_t>("tensor_count"));
  KILN_ASSIGN_OR_RETURN(const uint64_t kv_count, c.Read<uint64_t>("metadata_kv_count"));
  // Cheapest possible records: KV = 8 (key length) + 1 (key) + 4 (type) + 1 (value);
  // tensor info = 8 + 1 (name) + 4 (n_dims) + 8 (ne[0]) + 4 (type) + 8 (offset).
  constexpr uint64_t kMinKvBytes = 14, kMinTensorInfoBytes = 33;
  if (kv_count > c.remaining() / kMinKvBytes) {
    return absl::DataLossError(absl::StrFormat(
        "gguf: metadata_kv_count at byte 16 is %d, but only %d bytes follow the header (each "
        "record needs at least %d)",
        kv_count, c.remaining(), kMinKvBytes));
  }
  if (tensor_count > c.remaining() / kMinTensorInfoBytes) {
    return absl::DataLossError(absl::StrFormat(
        "gguf: tensor_count at byte 8 is %d, but only %d bytes follow the header (each tensor "
        "info needs at least %d)",
        tensor_count, c.remaining(), kMinTensorInfoBytes));
  }

  // --- metadata
  metadata_.reserve(kv_count);
  key_index_.reserve(kv_count);
  for (uint64_t i = 0; i < kv_count; ++i) {
    KeyValue kv;
    kv.record_offset = c.pos();
    KILN_ASSIGN_OR_RETURN(std::string_view key,
                          c.ReadString(absl::StrFormat("metadata record %d key", i)));
    if (key.empty()) {
      return absl::DataLossError(
          absl::StrFormat("gguf: metadata record %d (at byte %d): empty key", i, kv.record_offset));
    }
    if (key.size() > kMaxKeyLength) {
      return absl::DataLossError(
          absl::StrFormat("gguf: metadata record %d (at byte %d): key length %d exceeds %d", i,
                          kv.record_offset, key.size(), kMaxKeyLength));
    }
    if (key_index_.contains(key)) {
      return absl::DataLossError(absl::StrFormat(
          "gguf: metadata record %d (at byte %d): duplicate key '%s'", i, kv.record_offset, key));
    }
    kv.key.assign(key);
    const uint64_t type_at = c.pos();
    KILN_ASSIGN_OR_RETURN(const uint32_t type,
                          c.Read<uint32_t>(StrCat("value type of key '", key, "'")));
    if (!IsValidValueType(type)) {
      return absl::DataLossError(
          absl::StrFormat("gguf: key '%s' (record at byte %d): unknown value type %d at byte %d",
                          key, kv.record_offset, type, type_at));
    }
    kv.type = static_cast<ValueType>(type);
    if (kv.type == ValueType::kString) {
      KILN_ASSIGN_OR_RETURN(std::string_view s,
                            c.ReadString(StrCat("string value of key '", key, "'")));
      kv.value_data = reinterpret_cast<const uint8_t*>(s.data());
      kv.value_size = s.size();
    } else if (kv.type == ValueType::kArray) {
      const uint64_t elem_type_at = c.pos();
      KILN_ASSIGN_OR_RETURN(const uint32_t elem_type,
                            c.Read<uint32_t>(StrCat("array type of key '", key, "'")));
      if (elem_type == static_cast<uint32_t>(ValueType::kArray)) {
        return absl::DataLossError(absl::StrFormat(
            "gguf: key '%s' (record at byte %d): nested array (element type array at byte %d) is "
            "not supported",
            key, kv.record_offset, elem_type_at));
      }
      if (!IsValidValueType(elem_type)) {
        return absl::DataLossError(absl::StrFormat(
            "gguf: key '%s' (record at byte %d): unknown array element type %d at byte %d", key,
            kv.record_offset, elem_type, elem_type_at));
      }
      kv.array_type = static_cast<ValueType>(elem_type);
      const uint64_t count_at = c.pos();
      KILN_ASSIGN_OR_RETURN(kv.array_count,
                            c.Read<uint64_t>(StrCat("array count of key '", key, "'")));
      if (kv.array_count > kMaxArrayCount) {
        return absl::DataLossError(
            absl::StrFormat("gguf: key '%s': array count %d at byte %d exceeds the limit of 2^30",
                            key, kv.array_count, count_at));
      }
      kv.value_data = c.here();
      const uint64_t start = c.pos();
      if (kv.array_type == ValueType::kString) {
        // Each element: u64 length + bytes. Validate in one tight loop (49k tokens).
        if (kv.array_count > c.remaining() / 8) {
          return c.Truncated(
              absl::StrFormat("array of %d strings for key '%s'", kv.array_count, key),
              kv.array_count * 8);
        }
        for (uint64_t j = 0; j < kv.array_count; ++j) {
          if (c.remaining() < 8) {
            return c.Truncated(absl::StrFormat("length of string %d of key '%s'", j, key), 8);
          }
          const uint64_t len = LoadLE<uint64_t>(c.here());
          if (len > kMaxStringLength) {
            return absl::DataLossError(absl::StrFormat(
                "gguf: key '%s': string %d at byte %d has length %d, over the limit of 2^30", key,
                j, c.pos(), len));
          }
          c.Skip(8);
          if (len > c.remaining()) {
            return c.Truncated(absl::StrFormat("bytes of string %d of key '%s'", j, key), len);
          }
          c.Skip(len);
        }
      } else {
        const uint64_t elem_size = ValueTypeSize(kv.array_type);
        uint64_t total;
        if (MulOverflows(kv.array_count, elem_size, &total) || total > c.remaining()) {
          return c.Truncated(absl::StrFormat("array of %d %s for key '%s'", kv.array_count,
                                             ValueTypeName(kv.array_type), key),
                             kv.array_count * elem_size);
        }
        if (kv.array_type == ValueType::kBool) {
          for (uint64_t j = 0; j < kv.array_count; ++j) {
            if (c.here()[j] > 1) {
              return absl::DataLossError(absl::StrFormat(
                  "gguf: key '%s': bool element %d at byte %d has value %d (must be 0 or 1)", key,
                  j, c.pos() + j, c.here()[j]));
            }
          }
        }
        c.Skip(total);
      }
      kv.value_size = c.pos() - start;
    } else {
      const uint64_t n = ValueTypeSize(kv.type);
      KILN_RETURN_IF_ERROR(
          c.Need(n, StrCat(ValueTypeName(kv.type), " value of key '", key, "'")));
      kv.value_data = c.here();
      kv.value_size = n;
      if (kv.type == ValueType::kBool && c.here()[0] > 1) {
        return absl::DataLossError(
            absl::StrFormat("gguf: key '%s': bool value at byte %d is %d (must be 0 or 1)", key,
                            c.pos(), c.here()[0]));
      }
      c.Skip(n);
    }
    key_index_.emplace(key, metadata_.size());  // view into the file bytes (stable)
    metadata_.push_back(std::move(kv));
  }

  // --- alignment
  if (const KeyValue* a = FindKey("general.alignment")) {
    if (a->type != ValueType::kUint32) {
      return absl::DataLossError(absl::StrFormat(
          "gguf: general.alignment (record at byte %d) has type %s; it must be uint32",
          a->record_offset, ValueTypeName(a->type)));
    }
    const uint32_t v = LoadLE<uint32_t>(a->value_data);
    if (v == 0 || (v & (v - 1)) != 0) {
      return absl::DataLossError(absl::StrFormat(
          "gguf: general.alignment (record at byte %d) is %d; it must be a power of two",
          a->record_offset, v));
    }
    alignment_ = v;
  }

  // --- tensor infos
  tensors_.reserve(tensor_count);
  tensor_index_.reserve(tensor_count);
  for (uint64_t i = 0; i < tensor_count; ++i) {
    TensorInfo t;
    t.info_offset = c.pos();
    KILN_ASSIGN_OR_RETURN(std::string_view name,
                          c.ReadString(absl::StrFormat("tensor info %d name", i)));
    if (name.empty() || name.size() > kMaxTensorNameLength) {
      return absl::DataLossError(
          absl::StrFormat("gguf: tensor info %d (at byte %d): name length %d (must be 1..%d bytes)",
                          i, t.info_offset, name.size(), kMaxTensorNameLength));
    }
    if (tensor_index_.contains(name)) {
      return absl::DataLossError(absl::StrFormat(
          "gguf: tensor info %d (at byte %d): duplicate tensor name '%s'", i, t.info_offset, name));
    }
    t.name.assign(name);
    const std::string where =
        absl::StrFormat("gguf: tensor '%s' (info at byte %d)", t.name, t.info_offset);
    const uint64_t ndims_at = c.pos();
    KILN_ASSIGN_OR_RETURN(const uint32_t n_dims, c.Read<uint32_t>(where + " n_dims"));
    if (n_dims < 1 || n_dims > kMaxDims) {
      return absl::DataLossError(absl::StrFormat("%s: n_dims at byte %d is %d (must be 1..%d)",
                                                 where, ndims_at, n_dims, kMaxDims));
    }
    t.ne.resize(n_dims);
    t.n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t ne_at = c.pos();
      KILN_ASSIGN_OR_RETURN(t.ne[d], c.Read<uint64_t>(StrCat(where, " ne[", d, "]")));
      if (t.ne[d] == 0 || t.ne[d] > kInt64Max) {
        return absl::DataLossError(absl::StrFormat(
            "%s: ne[%d] at byte %d is %d (must be 1..2^63-1)", where, d, ne_at, t.ne[d]));
      }
      if (MulOverflows(t.n_elements, t.ne[d], &t.n_elements) || t.n_elements > kInt64Max) {
        return absl::DataLossError(absl::StrFormat(
            "%s: element count overflows int64 at ne[%d] (byte %d)", where, d, ne_at));
      }
    }
    const uint64_t type_at = c.pos();
    KILN_ASSIGN_OR_RETURN(t.type, c.Read<uint32_t>(where + " type"));
    const std::optional<GgmlTypeInfo> info = GgmlTypeInfoOf(t.type);
    if (!info) {
      return absl::DataLossError(
          absl::StrFormat("%s: unknown ggml type id %d at byte %d", where, t.type, type_at));
    }
    if (t.ne[0] % info->block_size != 0) {
      return absl::DataLossError(
          absl::StrFormat("%s: ne[0] = %d is not a multiple of the %s block size %d", where,
                          t.ne[0], info->name, info->block_size));
    }
    // nbytes = (ne[0] / block) * type_size * ne[1] * ne[2] * ne[3]
    uint64_t nbytes = t.ne[0] / info->block_size;
    bool overflow = MulOverflows(nbytes, info->type_size, &nbytes);
    for (uint32_t d = 1; d < n_dims && !overflow; ++d) {
      overflow = MulOverflows(nbytes, t.ne[d], &nbytes);
    }
    if (overflow || nbytes > kInt64Max) {
      return absl::DataLossError(absl::StrFormat("%s: byte size overflows int64", where));
    }
    t.nbytes = nbytes;
    const uint64_t offset_at = c.pos();
    KILN_ASSIGN_OR_RETURN(t.offset, c.Read<uint64_t>(where + " offset"));
    if (t.offset % alignment_ != 0) {
      return absl::DataLossError(
          absl::StrFormat("%s: data offset %d at byte %d is not a multiple of the alignment %d",
                          where, t.offset, offset_at, alignment_));
    }
    tensor_index_.emplace(name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  // --- data section: starts at the next multiple of the alignment.
  const uint64_t infos_end = c.pos();
  uint64_t padded;
  if (AddOverflows(infos_end, alignment_ - 1, &padded)) {
    return absl::DataLossError("gguf: data section start overflows");
  }
  data_offset_ = padded / alignment_ * alignment_;
  if (!tensors_.empty() && data_offset_ > size_) {
    return absl::DataLossError(absl::StrFormat(
        "gguf: data section would start at byte %d (tensor infos end at %d, alignment %d), past "
        "the end of the file (size %d)",
        data_offset_, infos_end, alignment_, size_));
  }
  for (TensorInfo& t : tensors_) {
    uint64_t begin, end;
    if (AddOverflows(data_offset_, t.offset, &begin) || AddOverflows(begin, t.nbytes, &end) ||
        end > size_) {
      return absl::DataLossError(absl::StrFormat(
          "gguf: tensor '%s' (info at byte %d): data [%d, %d) extends past end of file (size %d)",
          t.name, t.info_offset, data_offset_ + t.offset, data_offset_ + t.offset + t.nbytes,
          size_));
    }
    t.data = data_ + begin;
  }
  // Overlaps: sort by offset, compare neighbours.
  std::vector<size_t> order(tensors_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return tensors_[a].offset < tensors_[b].offset; });
  for (size_t k = 1; k < order.size(); ++k) {
    const TensorInfo& a = tensors_[order[k - 1]];
    const TensorInfo& b = tensors_[order[k]];
    if (a.offset + a.nbytes > b.offset) {
      return absl::DataLossError(absl::StrFormat(
          "gguf: tensors '%s' (info at byte %d, data [%d, %d)) and '%s' (info at byte %d, data "
          "[%d, %d)) overlap",
          a.name, a.info_offset, data_offset_ + a.offset, data_offset_ + a.offset + a.nbytes,
          b.name, b.info_offset, data_offset_ + b.offset, data_offset_ + b.offset + b.nbytes));
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Lookups and getters

const KeyValue* GgufFile::FindKey(std::string_view key) const {
  auto it = key_index_.find(key);
  return it == key_index_.end() ? nullptr : &metadata_[it->second];
}

const TensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

absl::StatusOr<const KeyValue*> Lookup(const GgufFile& f, std::string_view key) {
  const KeyValue* kv = f.FindKey(key);
  if (kv == nullptr) return absl::NotFoundError(StrCat("gguf: key '", key, "' not found"));
  return kv;
}

}  // namespace

absl::StatusOr<uint64_t> GgufFile::GetUint(std::string_view key) const {
  KILN_ASSIGN_OR_RETURN(const KeyValue* kv, Lookup(*this, key));
  bool is_signed;
  int64_t s = 0;
  uint64_t u = 0;
  if (!LoadInteger(kv->type, kv->value_data, &is_signed, &s, &u)) {
    return TypeMismatch(*kv, "an unsigned integer");
  }
  if (is_signed) {
    if (s < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("gguf: key '%s' (%s) is %d, expected a non-negative integer", kv->key,
                          ValueTypeName(kv->type), s));
    }
    return static_cast<uint64_t>(s);
  }
  return u;
}

absl::StatusOr<int64_t> GgufFile::GetInt(std::string_view key) const {
  KILN_ASSIGN_OR_RETURN(const KeyValue* kv, Lookup(*this, key));
  bool is_signed;
  int64_t s = 0;
  uint64_t u = 0;
  if (!LoadInteger(kv->type, kv->value_data, &is_signed, &s, &u)) {
    return TypeMismatch(*kv, "an integer");
  }
  if (is_signed) return s;
  if (u > kInt64Max) {
    return absl::InvalidArgumentError(
        absl::StrFormat("gguf: key '%s' (%s) is %d, which does not fit int64", kv->key,
                        ValueTypeName(kv->type), u));
  }
  return static_cast<int64_t>(u);
}

absl::StatusOr<double> GgufFile::GetFloat(std::string_view key) const {
  KILN_ASSIGN_OR_RETURN(const KeyValue* kv, Lookup(*this, key));
  if (kv->type == ValueType::kFloat32) return LoadLE<float>(kv->value_data);
  if (kv->type == ValueType::kFloat64) return LoadLE<double>(kv->value_data);
  bool is_signed;
  int64_t s = 0;
  uint64_t u = 0;
  if (!LoadInteger(kv->type, kv->value_data, &is_signed, &s, &u)) {
    return TypeMismatch(*kv, "a number");
  }
  return is_signed ? static_cast<double>(s) : static_cast<double>(u);
}

absl::StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  KILN_ASSIGN_OR_RETURN(const KeyValue* kv, Lookup(*this, key));
  if (kv->type != ValueType::kBool) return TypeMismatch(*kv, "bool");
  return kv->value_data[0] != 0;
}

absl::StatusOr<std::string_view> GgufFile::GetString(std::string_view key) const {
  KILN_ASSIGN_OR_RETURN(const KeyValue* kv, Lookup(*this, key));
  if (kv->type != ValueType::kString) return TypeMismatch(*kv, "string");
  return std::string_view(reinterpret_cast<const char*>(kv->value_data), kv->value_size);
}

absl::StatusOr<std::vector<std::string_view>> GgufFile::GetStringArray(std::string_view key) const {
  KILN_ASSIGN_OR_RETURN(const KeyValue* kv, Lookup(*this, key));
  if (kv->type != ValueType::kArray || kv->array_type != ValueType::kString) {
    return TypeMismatch(*kv, "array of string");
  }
  std::vector<std::string_view> out;
  out.reserve(kv->array_count);
  const uint8_t* p = kv->value_data;  // validated during parsing
  for (uint64_t i = 0; i < kv->array_count; ++i) {
    const uint64_t len = LoadLE<uint64_t>(p);
    out.emplace_back(reinterpret_cast<const char*>(p + 8), len);
    p += 8 + len;
  }
  return out;
}

absl::StatusOr<std::vector<float>> GgufFile::GetFloatArray(std::string_view key) const {
  KILN_ASSIGN_OR_RETURN(const KeyValue* kv, Lookup(*this, key));
  const ValueType et = kv->array_type;
  if (kv->type != ValueType::kArray ||
      !(et == ValueType::kFloat32 || et == ValueType::kFloat64 || IsIntegerType(et))) {
    return TypeMismatch(*kv, "array of numbers");
  }
  std::vector<float> out(kv->array_count);
  const size_t es = ValueTypeSize(et);
  for (uint64_t i = 0; i < kv->array_count; ++i) {
    const uint8_t* p = kv->value_data + i * es;
    if (et == ValueType::kFloat32) {
      out[i] = LoadLE<float>(p);
    } else if (et == ValueType::kFloat64) {
      out[i] = static_cast<float>(LoadLE<double>(p));
    } else {
      bool is_signed;
      int64_t s = 0;
      uint64_t u = 0;
      LoadInteger(et, p, &is_signed, &s, &u);
      out[i] = is_signed ? static_cast<float>(s) : static_cast<float>(u);
    }
  }
  return out;
}

absl::StatusOr<std::vector<int64_t>> GgufFile::GetIntArray(std::string_view key) const {
  KILN_ASSIGN_OR_RETURN(const KeyValue* kv, Lookup(*this, key));
  const ValueType et = kv->array_type;
  if (kv->type != ValueType::kArray || !IsIntegerType(et)) {
    return TypeMismatch(*kv, "array of integers");
  }
  std::vector<int64_t> out(kv->array_count);
  const size_t es = ValueTypeSize(et);
  for (uint64_t i = 0; i < kv->array_count; ++i) {
    bool is_signed;
    int64_t s = 0;
    uint64_t u = 0;
    LoadInteger(et, kv->value_data + i * es, &is_signed, &s, &u);
    if (!is_signed && u > kInt64Max) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "gguf: key '%s': element %d is %d, which does not fit int64", kv->key, i, u));
    }
    out[i] = is_signed ? s : static_cast<int64_t>(u);
  }
  return out;
}

std::string GgufFile::ValueToString(const KeyValue& kv, size_t max_array_items) const {
  if (kv.type == ValueType::kString) {
    return Quote(std::string_view(reinterpret_cast<const char*>(kv.value_data), kv.value_size));
  }
  if (kv.type != ValueType::kArray) return ScalarToString(kv.type, kv.value_data);
  std::string out = "[";
  const uint64_t shown = std::min<uint64_t>(kv.array_count, max_array_items);
  const uint8_t* p = kv.value_data;
  const size_t es = ValueTypeSize(kv.array_type);
  for (uint64_t i = 0; i < shown; ++i) {
    if (i > 0) out += ", ";
    if (kv.array_type == ValueType::kString) {
      const uint64_t len = LoadLE<uint64_t>(p);
      out += Quote(std::string_view(reinterpret_cast<const char*>(p + 8), len), 256);
      p += 8 + len;
    } else {
      out += ScalarToString(kv.array_type, p);
      p += es;
    }
  }
  if (shown < kv.array_count) {
    absl::StrAppend(&out, shown > 0 ? ", " : "", "... (", kv.array_count, " items)");
  }
  out += "]";
  return out;
}

}  // namespace kiln::gguf
