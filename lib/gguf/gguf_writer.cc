#include "lib/gguf/gguf_writer.h"

#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/common/ggml_type.h"
#include "lib/common/platform.h"
#include "lib/common/status.h"
#include "lib/common/strings.h"

namespace kiln::gguf {
namespace {

template <typename T>
void Append(std::vector<uint8_t>* out, T v) {  // little-endian host
  const size_t at = out->size();
  out->resize(at + sizeof(T));
  std::memcpy(out->data() + at, &v, sizeof(T));
}

void AppendString(std::vector<uint8_t>* out, std::string_view s) {
  Append<uint64_t>(out, s.size());
  out->insert(out->end(), s.begin(), s.end());
}

uint64_t AlignUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

}  // namespace

GgufWriter::GgufWriter(Options options) : options_(options) {
  if (options_.version != 2 && options_.version != 3) {
    Fail(absl::InvalidArgumentError(
        StrCat("gguf writer: version ", options_.version, " (must be 2 or 3)")));
  }
  const uint32_t a = options_.alignment;
  if (a == 0 || (a & (a - 1)) != 0) {
    Fail(absl::InvalidArgumentError(
        StrCat("gguf writer: alignment ", a, " is not a power of two")));
    options_.alignment = 32;
  }
  if (options_.alignment != kDefaultAlignment) SetUint32("general.alignment", options_.alignment);
}

void GgufWriter::Fail(absl::Status s) {
  if (status_.ok()) status_ = std::move(s);
}

bool GgufWriter::HasKey(std::string_view key) const {
  for (const Record& r : records_) {
    if (r.key == key) return true;
  }
  return false;
}

void GgufWriter::SetRecord(std::string_view key, ValueType type, std::vector<uint8_t> value) {
  if (key.empty() || key.size() > kMaxKeyLength) {
    Fail(absl::InvalidArgumentError(
        StrCat("gguf writer: invalid key of length ", key.size(), " (must be 1..65535)")));
    return;
  }
  for (Record& r : records_) {
    if (r.key == key) {
      r.type = type;
      r.value = std::move(value);
      return;
    }
  }
  records_.push_back(Record{std::string(key), type, std::move(value)});
}

template <typename T>
void GgufWriter::SetScalar(std::string_view key, ValueType type, T v) {
  std::vector<uint8_t> value;
  Append<T>(&value, v);
  SetRecord(key, type, std::move(value));
}

template <typename T>
void GgufWriter::SetArray(std::string_view key, ValueType elem_type, std::span<const T> v) {
  if (v.size() > kMaxArrayCount) {
    Fail(absl::InvalidArgumentError(
        StrCat("gguf writer: array for key '", key, "' has ", v.size(), " elements")));
    return;
  }
  std::vector<uint8_t> value;
  value.reserve(12 + v.size() * sizeof(T));
  Append<uint32_t>(&value, static_cast<uint32_t>(elem_type));
  Append<uint64_t>(&value, v.size());
  for (const T& x : v) Append<T>(&value, x);
  SetRecord(key, ValueType::kArray, std::move(value));
}

void GgufWriter::SetUint8(std::string_view k, uint8_t v) { SetScalar(k, ValueType::kUint8, v); }
void GgufWriter::SetInt8(std::string_view k, int8_t v) { SetScalar(k, ValueType::kInt8, v); }
void GgufWriter::SetUint16(std::string_view k, uint16_t v) { SetScalar(k, ValueType::kUint16, v); }
void GgufWriter::SetInt16(std::string_view k, int16_t v) { SetScalar(k, ValueType::kInt16, v); }
void GgufWriter::SetUint32(std::string_view k, uint32_t v) { SetScalar(k, ValueType::kUint32, v); }
void GgufWriter::SetInt32(std::string_view k, int32_t v) { SetScalar(k, ValueType::kInt32, v); }
void GgufWriter::SetFloat32(std::string_view k, float v) { SetScalar(k, ValueType::kFloat32, v); }
void GgufWriter::SetBool(std::string_view k, bool v) {
  SetScalar<uint8_t>(k, ValueType::kBool, v ? 1 : 0);
}
void GgufWriter::SetUint64(std::string_view k, uint64_t v) { SetScalar(k, ValueType::kUint64, v); }
void GgufWriter::SetInt64(std::string_view k, int64_t v) { SetScalar(k, ValueType::kInt64, v); }
void GgufWriter::SetFloat64(std::string_view k, double v) { SetScalar(k, ValueType::kFloat64, v); }
void GgufWriter::SetString(std::string_view k, std::string_view v) {
  if (v.size() > kMaxStringLength) {
    Fail(absl::InvalidArgumentError(StrCat("gguf writer: string for key '", k, "' has ",
                                                  v.size(), " bytes (limit 2^30)")));
    return;
  }
  std::vector<uint8_t> value;
  AppendString(&value, v);
  SetRecord(k, ValueType::kString, std::move(value));
}

void GgufWriter::SetArrayUint8(std::string_view k, std::span<const uint8_t> v) {
  SetArray(k, ValueType::kUint8, v);
}
void GgufWriter::SetArrayInt8(std::string_view k, std::span<const int8_t> v) {
  SetArray(k, ValueType::kInt8, v);
}
void GgufWriter::SetArrayUint16(std::string_view k, std::span<const uint16_t> v) {
  SetArray(k, ValueType::kUint16, v);
}
void GgufWriter::SetArrayInt16(std::string_view k, std::span<const int16_t> v) {
  SetArray(k, ValueType::kInt16, v);
}
void GgufWriter::SetArrayUint32(std::string_view k, std::span<const uint32_t> v) {
  SetArray(k, ValueType::kUint32, v);
}
void GgufWriter::SetArrayInt32(std::string_view k, std::span<const int32_t> v) {
  SetArray(k, ValueType::kInt32, v);
}
void GgufWriter::SetArrayFloat32(std::string_view k, std::span<const float> v) {
  SetArray(k, ValueType::kFloat32, v);
}
void GgufWriter::SetArrayBool(std::string_view k, std::span<const bool> v) {
  std::vector<uint8_t> bytes(v.size());
  for (size_t i = 0; i < v.size(); ++i) bytes[i] = v[i] ? 1 : 0;
  SetArray<uint8_t>(k, ValueType::kBool, bytes);
}
void GgufWriter::SetArrayUint64(std::string_view k, std::span<const uint64_t> v) {
  SetArray(k, ValueType::kUint64, v);
}
void GgufWriter::SetArrayInt64(std::string_view k, std::span<const int64_t> v) {
  SetArray(k, ValueType::kInt64, v);
}
void GgufWriter::SetArrayFloat64(std::string_view k, std::span<const double> v) {
  SetArray(k, ValueType::kFloat64, v);
}
void GgufWriter::SetArrayString(std::string_view k, std::span<const std::string_view> v) {
  if (v.size() > kMaxArrayCount) {
    Fail(absl::InvalidArgumentError(
        StrCat("gguf writer: array for key '", k, "' has ", v.size(), " elements")));
    return;
  }
  std::vector<uint8_t> value;
  Append<uint32_t>(&value, static_cast<uint32_t>(ValueType::kString));
  Append<uint64_t>(&value, v.size());
  for (std::string_view s : v) {
    if (s.size() > kMaxStringLength) {
      Fail(absl::InvalidArgumentError(
          StrCat("gguf writer: a string in array '", k, "' exceeds 2^30 bytes")));
      return;
    }
    AppendString(&value, s);
  }
  SetRecord(k, ValueType::kArray, std::move(value));
}
void GgufWriter::SetArrayString(std::string_view k, std::span<const std::string> v) {
  std::vector<std::string_view> views(v.begin(), v.end());
  SetArrayString(k, std::span<const std::string_view>(views));
}

void GgufWriter::CopyKeyValue(const KeyValue& kv) {
  std::vector<uint8_t> value;
  if (kv.type == ValueType::kString) {
    Append<uint64_t>(&value, kv.value_size);
  } else if (kv.type == ValueType::kArray) {
    Append<uint32_t>(&value, static_cast<uint32_t>(kv.array_type));
    Append<uint64_t>(&value, kv.array_count);
  }
  value.insert(value.end(), kv.value_data, kv.value_data + kv.value_size);
  SetRecord(kv.key, kv.type, std::move(value));
}

absl::Status GgufWriter::ValidateTensor(std::string_view name, uint32_t ggml_type,
                                        const std::vector<uint64_t>& ne, size_t nbytes) const {
  if (name.empty() || name.size() > kMaxTensorNameLength) {
    return absl::InvalidArgumentError(
        absl::StrFormat("gguf writer: tensor name '%s' has %d bytes (must be 1..%d)", name,
                        name.size(), kMaxTensorNameLength));
  }
  for (const Tensor& t : tensors_) {
    if (t.name == name) {
      return absl::InvalidArgumentError(
          StrCat("gguf writer: duplicate tensor name '", name, "'"));
    }
  }
  if (ne.empty() || ne.size() > kMaxDims) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "gguf writer: tensor '%s' has %d dims (must be 1..%d)", name, ne.size(), kMaxDims));
  }
  const std::optional<GgmlTypeInfo> info = GgmlTypeInfoOf(ggml_type);
  if (!info) {
    return absl::InvalidArgumentError(
        absl::StrFormat("gguf writer: tensor '%s': unknown ggml type id %d", name, ggml_type));
  }
  if (ne[0] % info->block_size != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "gguf writer: tensor '%s': ne[0] = %d is not a multiple of the %s block size %d", name,
        ne[0], info->name, info->block_size));
  }
  uint64_t expected = ne[0] / info->block_size * info->type_size;
  for (size_t d = 0; d < ne.size(); ++d) {
    if (ne[d] == 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("gguf writer: tensor '%s': ne[%d] is 0", name, d));
    }
    if (d > 0 && __builtin_mul_overflow(expected, ne[d], &expected)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("gguf writer: tensor '%s': byte size overflows", name));
    }
  }
  if (expected != nbytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "gguf writer: tensor '%s' (%s, ne[0]=%d, %d dims) needs %d bytes but %d were given", name,
        info->name, ne[0], ne.size(), expected, nbytes));
  }
  return absl::OkStatus();
}

absl::Status GgufWriter::AddTensor(std::string_view name, uint32_t ggml_type,
                                   std::vector<uint64_t> ne, std::span<const uint8_t> bytes) {
  return AddTensor(name, ggml_type, std::move(ne),
                   std::vector<uint8_t>(bytes.begin(), bytes.end()));
}

absl::Status GgufWriter::AddTensor(std::string_view name, uint32_t ggml_type,
                                   std::vector<uint64_t> ne, std::vector<uint8_t>&& bytes) {
  KILN_RETURN_IF_ERROR(ValidateTensor(name, ggml_type, ne, bytes.size()));
  tensors_.push_back(Tensor{std::string(name), ggml_type, std::move(ne), std::move(bytes)});
  return absl::OkStatus();
}

std::vector<uint8_t> GgufWriter::SerializeHeader(std::vector<uint64_t>* offsets,
                                                 uint64_t* data_bytes) const {
  const uint64_t align = options_.alignment;
  std::vector<uint8_t> out;
  Append<uint32_t>(&out, kMagic);
  Append<uint32_t>(&out, options_.version);
  Append<uint64_t>(&out, tensors_.size());
  Append<uint64_t>(&out, records_.size());
  for (const Record& r : records_) {
    AppendString(&out, r.key);
    Append<uint32_t>(&out, static_cast<uint32_t>(r.type));
    out.insert(out.end(), r.value.begin(), r.value.end());
  }
  uint64_t offset = 0;
  offsets->clear();
  offsets->reserve(tensors_.size());
  for (const Tensor& t : tensors_) {
    AppendString(&out, t.name);
    Append<uint32_t>(&out, static_cast<uint32_t>(t.ne.size()));
    for (uint64_t n : t.ne) Append<uint64_t>(&out, n);
    Append<uint32_t>(&out, t.type);
    Append<uint64_t>(&out, offset);
    offsets->push_back(offset);
    offset = AlignUp(offset + t.bytes.size(), align);
  }
  out.resize(AlignUp(out.size(), align), 0);  // zero padding up to the data section
  *data_bytes = offset;
  return out;
}

absl::StatusOr<std::vector<uint8_t>> GgufWriter::WriteToBuffer() const {
  KILN_RETURN_IF_ERROR(status_);
  std::vector<uint64_t> offsets;
  uint64_t data_bytes = 0;
  std::vector<uint8_t> out = SerializeHeader(&offsets, &data_bytes);
  const uint64_t data_start = out.size();
  out.resize(data_start + data_bytes, 0);  // zero padding between tensors
  for (size_t i = 0; i < tensors_.size(); ++i) {
    std::memcpy(out.data() + data_start + offsets[i], tensors_[i].bytes.data(),
                tensors_[i].bytes.size());
  }
  return out;
}

absl::Status GgufWriter::WriteToFile(const std::string& path) const {
  KILN_RETURN_IF_ERROR(status_);
  std::vector<uint64_t> offsets;
  uint64_t data_bytes = 0;
  const std::vector<uint8_t> header = SerializeHeader(&offsets, &data_bytes);
  // Written under a temporary name and renamed at the end, so `path` is never half-written.
  const std::string tmp = path + ".tmp";
  auto with_prefix = [](const absl::Status& st) {
    return st.ok() ? st : absl::Status(st.code(), StrCat("gguf writer: ", st.message()));
  };
  absl::StatusOr<platform::WritableFile> created = platform::WritableFile::Create(tmp);
  if (!created.ok()) return with_prefix(created.status());
  platform::WritableFile& out = *created;
  // Streams the tensors (no second copy of the model in memory).
  absl::Status st = out.Write(header.data(), header.size());
  const std::vector<uint8_t> zeros(options_.alignment, 0);
  uint64_t written = 0;  // bytes of the data section so far
  for (size_t i = 0; i < tensors_.size() && st.ok(); ++i) {
    st = out.Write(zeros.data(), offsets[i] - written);
    if (!st.ok()) break;
    st = out.Write(tensors_[i].bytes.data(), tensors_[i].bytes.size());
    written = offsets[i] + tensors_[i].bytes.size();
  }
  if (st.ok()) st = out.Write(zeros.data(), data_bytes - written);
  const absl::Status closed = out.SyncAndClose();
  if (st.ok()) st = closed;
  std::error_code ec;
  if (st.ok()) {
    std::filesystem::rename(tmp, path, ec);  // replaces an existing `path`, as POSIX rename
    if (ec) st = platform::StatusFromErrorCode(ec, StrCat("cannot rename ", tmp, " to ", path));
  }
  if (!st.ok()) std::filesystem::remove(tmp, ec);
  return with_prefix(st);
}

}  // namespace kiln::gguf
