#include "lib/spec/draft_head.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lib/backend/cpu/cpu_backend.h"
#include "lib/common/half.h"
#include "lib/common/strings.h"

namespace kiln::spec {

uint64_t VocabularyHash(std::span<const std::string_view> tokens) {
  uint64_t h = 0xcbf29ce484222325ULL;
  constexpr uint64_t kPrime = 0x100000001b3ULL;
  for (std::string_view t : tokens) {
    for (unsigned char c : t) h = (h ^ c) * kPrime;
    h = (h ^ 0xffu) * kPrime;
  }
  return h;
}

absl::StatusOr<TargetFingerprint> FingerprintOf(const Model& model) {
  KILN_ASSIGN_OR_RETURN(std::vector<std::string_view> tokens,
                        model.file().GetStringArray("tokenizer.ggml.tokens"));
  TargetFingerprint fp;
  fp.vocab_hash = VocabularyHash(tokens);
  fp.n_vocab = model.hparams().n_vocab;
  fp.n_embd = model.hparams().n_embd;
  fp.n_layer = model.hparams().n_layer;
  return fp;
}

absl::StatusOr<TargetFingerprint> ReadTargetFingerprint(const gguf::GgufFile& file,
                                                        std::string_view arch) {
  TargetFingerprint fp;
  auto get = [&](std::string_view field) -> absl::StatusOr<uint64_t> {
    const std::string key = kiln::StrCat(arch, ".target.", field);
    absl::StatusOr<uint64_t> v = file.GetUint(key);
    if (!v.ok()) {
      return absl::DataLossError(kiln::StrCat("head file: key ", key,
                                              " (the target fingerprint): ", v.status().message()));
    }
    return *v;
  };
  KILN_ASSIGN_OR_RETURN(fp.vocab_hash, get("vocab_hash"));
  KILN_ASSIGN_OR_RETURN(const uint64_t n_vocab, get("vocab_size"));
  KILN_ASSIGN_OR_RETURN(const uint64_t n_embd, get("embedding_length"));
  KILN_ASSIGN_OR_RETURN(const uint64_t n_layer, get("block_count"));
  fp.n_vocab = static_cast<int64_t>(n_vocab);
  fp.n_embd = static_cast<int64_t>(n_embd);
  fp.n_layer = static_cast<int64_t>(n_layer);
  return fp;
}

void WriteTargetFingerprint(const TargetFingerprint& fp, std::string_view arch,
                            gguf::GgufWriter& writer) {
  writer.SetUint64(kiln::StrCat(arch, ".target.vocab_hash"), fp.vocab_hash);
  writer.SetUint32(kiln::StrCat(arch, ".target.vocab_size"), static_cast<uint32_t>(fp.n_vocab));
  writer.SetUint32(kiln::StrCat(arch, ".target.embedding_length"),
                   static_cast<uint32_t>(fp.n_embd));
  writer.SetUint32(kiln::StrCat(arch, ".target.block_count"), static_cast<uint32_t>(fp.n_layer));
}

absl::Status CheckTarget(const TargetFingerprint& head, const TargetFingerprint& target,
                         std::string_view arch, std::string_view path) {
  std::vector<std::string> diffs;
  if (head.vocab_hash != target.vocab_hash) {
    diffs.push_back(kiln::StrCat("vocabulary hash ", absl::Hex(head.vocab_hash), " != the model's ",
                                 absl::Hex(target.vocab_hash)));
  }
  if (head.n_vocab != target.n_vocab) {
    diffs.push_back(
        kiln::StrCat("vocabulary size ", head.n_vocab, " != the model's ", target.n_vocab));
  }
  if (head.n_embd != target.n_embd) {
    diffs.push_back(kiln::StrCat("hidden size ", head.n_embd, " != the model's ", target.n_embd));
  }
  if (head.n_layer != target.n_layer) {
    diffs.push_back(kiln::StrCat("layer count ", head.n_layer, " != the model's ", target.n_layer));
  }
  if (diffs.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(kiln::StrCat(
      path, ": this ", arch, " head was trained for another model: ", absl::StrJoin(diffs, ", ")));
}

int32_t StaticTree::MaxDepth(int32_t n) const {
  int32_t d = 0;
  for (int32_t i = 0; i < std::min(n, size()); ++i) d = std::max(d, depths[i]);
  return d;
}

absl::StatusOr<StaticTree> MakeStaticTree(std::vector<int32_t> parents, std::vector<int32_t> ranks,
                                          int32_t max_depth, int32_t max_rank) {
  if (parents.size() != ranks.size()) {
    return absl::InvalidArgumentError(
        kiln::StrCat("draft tree: ", parents.size(), " parents but ", ranks.size(), " ranks"));
  }
  StaticTree t;
  t.depths.resize(parents.size());
  std::set<std::pair<int32_t, int32_t>> children;  // (parent, rank)
  for (size_t i = 0; i < parents.size(); ++i) {
    const int32_t p = parents[i];
    if (p < -1 || p >= static_cast<int32_t>(i)) {
      return absl::InvalidArgumentError(
          kiln::StrCat("draft tree: node ", i, " has parent ", p, " (must be -1 or < ", i, ")"));
    }
    if (ranks[i] < 0 || ranks[i] >= max_rank) {
      return absl::InvalidArgumentError(kiln::StrCat("draft tree: node ", i, " has rank ", ranks[i],
                                                     " (must be in [0, ", max_rank, "))"));
    }
    if (!children.insert({p, ranks[i]}).second) {
      return absl::InvalidArgumentError(
          kiln::StrCat("draft tree: node ", i, " repeats rank ", ranks[i], " under parent ", p));
    }
    t.depths[i] = p < 0 ? 1 : t.depths[p] + 1;
    if (t.depths[i] > max_depth) {
      return absl::InvalidArgumentError(kiln::StrCat("draft tree: node ", i, " is at depth ",
                                                     t.depths[i], " but the file has ", max_depth,
                                                     " heads"));
    }
  }
  t.parents = std::move(parents);
  t.ranks = std::move(ranks);
  return t;
}

absl::StatusOr<StaticTree> ReadStaticTree(const gguf::GgufFile& file, std::string_view arch,
                                          int32_t max_depth, int32_t max_rank) {
  std::vector<std::vector<int32_t>> arrays;
  for (std::string_view field : {"parents", "ranks"}) {
    const std::string key = kiln::StrCat(arch, ".tree.", field);
    absl::StatusOr<std::vector<int64_t>> v = file.GetIntArray(key);
    if (!v.ok()) {
      return absl::DataLossError(kiln::StrCat("head file: key ", key, ": ", v.status().message()));
    }
    std::vector<int32_t>& a = arrays.emplace_back();
    for (int64_t x : *v) a.push_back(static_cast<int32_t>(std::clamp<int64_t>(x, -2, 1 << 30)));
  }
  return MakeStaticTree(std::move(arrays[0]), std::move(arrays[1]), max_depth, max_rank);
}

void WriteStaticTree(const StaticTree& tree, std::string_view arch, gguf::GgufWriter& writer) {
  writer.SetArrayInt32(kiln::StrCat(arch, ".tree.parents"), tree.parents);
  writer.SetArrayInt32(kiln::StrCat(arch, ".tree.ranks"), tree.ranks);
}

absl::StatusOr<const gguf::TensorInfo*> ReadReducedVocabulary(
    const gguf::GgufFile& file, std::string_view arch, std::string_view path,
    const TargetFingerprint& target, int64_t n_embd, std::vector<int32_t>* ids) {
  ids->clear();
  const std::string ids_key = kiln::StrCat(arch, ".vocab.ids");
  const std::string tensor = kiln::StrCat(arch, ".lm_head.weight");
  const bool has_ids = file.FindKey(ids_key) != nullptr;
  const gguf::TensorInfo* t = file.FindTensor(tensor);
  if (!has_ids && t == nullptr) return nullptr;
  if (!has_ids || t == nullptr) {
    return absl::DataLossError(kiln::StrCat(
        path, ": a reduced-vocabulary ", arch, " head needs both ", ids_key, " and the tensor ",
        tensor, "; the file has only ", has_ids ? ids_key : tensor));
  }
  absl::StatusOr<std::vector<int64_t>> values = file.GetIntArray(ids_key);
  if (!values.ok()) {
    return absl::DataLossError(
        kiln::StrCat(path, ": key ", ids_key, ": ", values.status().message()));
  }
  if (values->empty()) return absl::DataLossError(kiln::StrCat(path, ": ", ids_key, " is empty"));
  for (size_t j = 0; j < values->size(); ++j) {
    const int64_t id = (*values)[j];
    if (id < 0 || id >= target.n_vocab) {
      return absl::InvalidArgumentError(kiln::StrCat(path, ": ", ids_key, "[", j, "] = ", id,
                                                     " is outside the target's vocabulary [0, ",
                                                     target.n_vocab, ")"));
    }
    if (j > 0 && id <= (*values)[j - 1]) {
      return absl::DataLossError(kiln::StrCat(path, ": ", ids_key, " is not strictly ascending at ",
                                              j, " (", (*values)[j - 1], ", then ", id,
                                              id == (*values)[j - 1] ? ": a repeated id)" : ")"));
    }
    ids->push_back(static_cast<int32_t>(id));
  }
  const uint64_t rows = ids->size(), n = static_cast<uint64_t>(n_embd);
  if (t->ne != std::vector<uint64_t>{n, rows}) {
    return absl::DataLossError(kiln::StrCat(path, ": tensor ", tensor, " has shape [",
                                            absl::StrJoin(t->ne, ", "), "], expected [", n, ", ",
                                            rows, "] (n_embd, the ids' count)"));
  }
  const std::optional<GgmlTypeInfo> info = GgmlTypeInfoOf(t->type);
  if (!info || t->nbytes != GgmlRowBytes(*info, n) * rows) {
    return absl::DataLossError(kiln::StrCat(path, ": tensor ", tensor, " has type ",
                                            GgmlTypeName(t->type), " and ", t->nbytes,
                                            " bytes, which do not make ", rows, " rows of ", n));
  }
  // Float rows must be finite (quantized ones carry f16 scales the matmul reads as they are).
  for (uint64_t i = 0; i < t->n_elements; ++i) {
    float v = 0.0f;
    if (t->type == static_cast<uint32_t>(GgmlType::kF32)) {
      std::memcpy(&v, t->data + 4 * i, 4);
    } else if (t->type == static_cast<uint32_t>(GgmlType::kF16)) {
      uint16_t h;
      std::memcpy(&h, t->data + 2 * i, 2);
      v = Fp16ToFp32(h);
    } else {
      break;
    }
    if (!std::isfinite(v)) {
      return absl::DataLossError(kiln::StrCat(path, ": ", tensor, " is not finite at ", i));
    }
  }
  return t;
}

absl::Status WriteReducedVocabulary(std::string_view arch, std::span<const int32_t> ids,
                                    GgmlType type, std::span<const uint8_t> lm_head, int64_t n_embd,
                                    gguf::GgufWriter& writer) {
  writer.SetArrayInt32(kiln::StrCat(arch, ".vocab.ids"),
                       std::vector<int32_t>(ids.begin(), ids.end()));
  return writer.AddTensor(kiln::StrCat(arch, ".lm_head.weight"), static_cast<uint32_t>(type),
                          {static_cast<uint64_t>(n_embd), static_cast<uint64_t>(ids.size())},
                          lm_head);
}

absl::StatusOr<std::shared_ptr<const ReducedLmHead>> PrepareReducedLmHead(std::vector<int32_t> ids,
                                                                          WeightView view,
                                                                          size_t n_bytes,
                                                                          int64_t n_vocab,
                                                                          std::string_view who) {
  const int64_t rows = static_cast<int64_t>(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= n_vocab) {
      return absl::InvalidArgumentError(kiln::StrCat(who, ": reduced-vocabulary id ", id,
                                                     " is outside the target's vocabulary [0, ",
                                                     n_vocab, ")"));
    }
  }
  if (rows == 0 || view.n_out != rows || view.row_bytes() == 0 ||
      view.row_bytes() * rows != n_bytes) {
    return absl::InvalidArgumentError(
        kiln::StrCat(who, ": the reduced LM head holds ", n_bytes, " bytes, not ", rows,
                     " rows of ", view.n_in, " ", GgmlTypeName(static_cast<uint32_t>(view.type))));
  }
  auto head = std::make_shared<ReducedLmHead>();
  head->ids = std::move(ids);
  head->view = view;
  cpu::CpuBackend probe(1);
  WeightView* one[1] = {&head->view};
  KILN_ASSIGN_OR_RETURN(head->prepared, probe.PrepareWeights(one, false));
  std::vector<float> x(view.n_in, 0.0f), y(rows);
  if (absl::Status s = probe.MatMul(head->view, x.data(), 1, y.data()); !s.ok()) {
    return absl::InvalidArgumentError(kiln::StrCat(who, ": the reduced LM head (type ",
                                                   GgmlTypeName(static_cast<uint32_t>(view.type)),
                                                   ") cannot be multiplied: ", s.message()));
  }
  return std::shared_ptr<const ReducedLmHead>(std::move(head));
}

void TopK(std::span<const float> row, int32_t k, std::vector<int32_t>* top) {
  top->clear();
  for (int32_t v = 0; v < static_cast<int32_t>(row.size()); ++v) {
    const float x = row[v];
    if (static_cast<int32_t>(top->size()) == k && !(x > row[top->back()])) continue;
    auto at = std::upper_bound(top->begin(), top->end(), x,
                               [&](float value, int32_t t) { return value > row[t]; });
    top->insert(at, v);
    if (static_cast<int32_t>(top->size()) > k) top->pop_back();
  }
}

}  // namespace kiln::spec
