#include "lib/quant/requantize.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "lib/gguf/file_type.h"
#include "lib/quant/quant.h"

namespace kiln {
namespace {

bool IsQuantizableWeight(const gguf::TensorInfo& t) {
  return t.ne.size() >= 2 && absl::EndsWith(t.name, "weight") &&
         !absl::StrContains(t.name, "_norm.weight");
}

uint32_t BlockSize(GgmlType type) {
  return GgmlTypeInfoOf(static_cast<uint32_t>(type))->block_size;
}

}  // namespace

GgmlType RequantizeRowType(GgmlType target, uint64_t n_in) {
  GgmlType type = target;
  if (n_in % BlockSize(type) != 0) {
    switch (type) {
      case GgmlType::kQ4_K:
        type = GgmlType::kQ5_0;
        break;
      case GgmlType::kQ5_K:
        type = GgmlType::kQ5_1;
        break;
      case GgmlType::kQ2_K:
      case GgmlType::kQ3_K:
      case GgmlType::kQ6_K:
        type = GgmlType::kQ8_0;
        break;
      default:
        break;
    }
  }
  if (n_in % BlockSize(type) != 0) type = GgmlType::kF16;
  return type;
}

absl::Status RequantizeModel(const gguf::GgufFile& in, const RequantizeOptions& options,
                             gguf::GgufWriter* out, RequantizeStats* stats) {
  RequantizeStats local;
  RequantizeStats& st = stats != nullptr ? *stats : local;
  st = {};
  const uint32_t target_id = static_cast<uint32_t>(options.target);
  const std::optional<GgmlTypeInfo> target_info = GgmlTypeInfoOf(target_id);
  const QuantKernels* target_kernels = GetQuantKernels(options.target);
  if (!target_info || target_kernels == nullptr || target_kernels->quantize == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("kiln cannot write target type ", GgmlTypeName(target_id)));
  }

  // Metadata, in order; general.file_type replaced.
  const uint32_t file_type = gguf::FileTypeOf(target_id);
  bool wrote_file_type = false;
  for (const gguf::KeyValue& kv : in.metadata()) {
    if (kv.key == "general.file_type") {
      out->SetUint32("general.file_type", file_type);
      wrote_file_type = true;
    } else {
      out->CopyKeyValue(kv);
    }
  }
  if (!wrote_file_type) out->SetUint32("general.file_type", file_type);

  const bool tied = in.FindTensor("output.weight") == nullptr;
  const std::string_view output_name = tied ? "token_embd.weight" : "output.weight";

  std::vector<float> row;  // [n_in] one decoded row
  for (size_t index = 0; index < in.tensors().size(); ++index) {
    const gguf::TensorInfo& t = in.tensors()[index];
    st.bytes_in += t.nbytes;
    const GgmlType src = static_cast<GgmlType>(t.type);
    const bool keep =
        !IsQuantizableWeight(t) || (options.keep_output_type && t.name == output_name);
    const GgmlType dst = keep ? src : RequantizeRowType(options.target, t.ne[0]);
    if (dst == src) {
      KILN_RETURN_IF_ERROR(out->AddTensor(t.name, t.type, t.ne, std::span(t.data, t.nbytes)));
      ++st.tensors_copied;
      st.bytes_out += t.nbytes;
      if (options.log) {
        options.log(absl::StrCat(t.name, ": ", GgmlTypeName(t.type), " copied"));
      }
      continue;
    }
    const QuantKernels* src_kernels = GetQuantKernels(src);
    if (src_kernels == nullptr || src_kernels->dequantize == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", index, " '", t.name, "': kiln cannot decode its type ", GgmlTypeName(t.type)));
    }
    const QuantKernels* dst_kernels = GetQuantKernels(dst);
    if (dst_kernels == nullptr || dst_kernels->quantize == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", index, " '", t.name,
                                                     "': kiln cannot encode ",
                                                     GgmlTypeName(static_cast<uint32_t>(dst))));
    }
    const std::optional<GgmlTypeInfo> src_info = GgmlTypeInfoOf(t.type);
    const std::optional<GgmlTypeInfo> dst_info = GgmlTypeInfoOf(static_cast<uint32_t>(dst));
    const uint64_t n_in = t.ne[0];
    const uint64_t n_rows = t.n_elements / n_in;
    const size_t src_row_bytes = GgmlRowBytes(*src_info, n_in);
    const size_t dst_row_bytes = GgmlRowBytes(*dst_info, n_in);
    if (src_row_bytes * n_rows != t.nbytes) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", index, " '", t.name,
                                                     "': ", t.nbytes, " bytes, expected ",
                                                     src_row_bytes * n_rows));
    }
    std::vector<uint8_t> bytes(dst_row_bytes * n_rows);  // [n_rows, dst_row_bytes]
    row.resize(n_in);
    for (uint64_t r = 0; r < n_rows; ++r) {
      src_kernels->dequantize(t.data + r * src_row_bytes, row.data(), static_cast<int64_t>(n_in));
      dst_kernels->quantize(row.data(), bytes.data() + r * dst_row_bytes,
                            static_cast<int64_t>(n_in));
    }
    st.bytes_out += bytes.size();
    ++st.tensors_requantized;
    if (dst != options.target) ++st.tensors_fell_back;
    if (options.log) {
      options.log(absl::StrCat(t.name, ": ", GgmlTypeName(t.type), " -> ",
                               GgmlTypeName(static_cast<uint32_t>(dst)),
                               dst != options.target ? " (row length fallback)" : ""));
    }
    KILN_RETURN_IF_ERROR(
        out->AddTensor(t.name, static_cast<uint32_t>(dst), t.ne, std::move(bytes)));
  }
  return out->status();
}

absl::Status RequantizeFile(const std::string& in_path, const std::string& out_path,
                            const RequantizeOptions& options, RequantizeStats* stats) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<gguf::GgufFile> in, gguf::GgufFile::Open(in_path));
  gguf::GgufWriterOptions writer_options;
  writer_options.version = 3;
  writer_options.alignment = static_cast<uint32_t>(in->alignment());
  gguf::GgufWriter writer(writer_options);
  KILN_RETURN_IF_ERROR(RequantizeModel(*in, options, &writer, stats));
  return writer.WriteToFile(out_path);
}

}  // namespace kiln
