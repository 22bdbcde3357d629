#include "lib/spec/make_draft.h"

#include <charconv>
#include <memory>
#include <span>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "lib/common/status.h"
#include "lib/gguf/gguf.h"
#include "lib/gguf/gguf_writer.h"

namespace kiln::spec {

namespace {

// The block index of a tensor named "blk.<i>.<rest>", or -1 for any other name.
int64_t BlockIndexOf(std::string_view name) {
  constexpr std::string_view kPrefix = "blk.";
  if (name.substr(0, kPrefix.size()) != kPrefix) return -1;
  const std::string_view rest = name.substr(kPrefix.size());
  int64_t index = -1;
  const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), index);
  if (ec != std::errc() || end == rest.data() || end == rest.data() + rest.size() || *end != '.') {
    return -1;
  }
  return index;
}

}  // namespace

absl::Status MakeDraftModel(const std::string& in_path, const std::string& out_path, int64_t layers,
                            MakeDraftInfo* info) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<gguf::GgufFile> file, gguf::GgufFile::Open(in_path));
  KILN_ASSIGN_OR_RETURN(std::string_view arch, file->GetString("general.architecture"));
  const std::string block_count_key = std::string(arch) + ".block_count";
  KILN_ASSIGN_OR_RETURN(uint64_t block_count, file->GetUint(block_count_key));
  if (layers < 1 || static_cast<uint64_t>(layers) > block_count) {
    return absl::InvalidArgumentError(absl::StrCat("layers ", layers, " is outside [1, ",
                                                   block_count_key, " = ", block_count, "]"));
  }
  gguf::GgufWriter::Options options;
  options.version = file->version();
  options.alignment = static_cast<uint32_t>(file->alignment());
  gguf::GgufWriter writer(options);
  for (const gguf::KeyValue& kv : file->metadata()) {
    if (kv.key == "general.alignment") continue;  // the writer emits it from options
    if (kv.key == block_count_key) {
      writer.SetUint32(block_count_key, static_cast<uint32_t>(layers));
      continue;
    }
    writer.CopyKeyValue(kv);
  }
  MakeDraftInfo stats;
  stats.target_layers = static_cast<int64_t>(block_count);
  stats.draft_layers = layers;
  for (const gguf::TensorInfo& t : file->tensors()) {
    const int64_t block = BlockIndexOf(t.name);
    if (block >= layers) {
      ++stats.tensors_dropped;
      continue;
    }
    KILN_RETURN_IF_ERROR(writer.AddTensor(
        t.name, t.type, t.ne, std::span<const uint8_t>(t.data, static_cast<size_t>(t.nbytes))));
    ++stats.tensors_kept;
    stats.bytes_kept += t.nbytes;
  }
  KILN_RETURN_IF_ERROR(writer.WriteToFile(out_path));
  if (info != nullptr) *info = stats;
  return absl::OkStatus();
}

}  // namespace kiln::spec
