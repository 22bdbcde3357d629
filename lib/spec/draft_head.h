// What trained draft heads (Medusa, EAGLE) share: the fingerprint of the target model a head was
// trained for, the static draft tree a head file carries, and how a head picks its candidates.
//
// Head files are GGUF with their own general.architecture ("medusa"; "eagle" later) and these
// keys, `<arch>` being that architecture name:
//   <arch>.target.vocab_hash       uint64  VocabularyHash of the target's tokenizer.ggml.tokens
//   <arch>.target.vocab_size       uint32  the target's n_vocab
//   <arch>.target.embedding_length uint32  the target's n_embd (the feature size)
//   <arch>.target.block_count      uint32  the target's n_layer
//   <arch>.tree.parents            int32[] the static tree: node i hangs off node parents[i]
//                                           (< i) or off the root (-1)
//   <arch>.tree.ranks              int32[] node i is the ranks[i]-th most likely token (0: the
//                                           best) of the head for its depth
// A head loaded for a model whose fingerprint differs is refused (InvalidArgument naming each
// field that differs, both values), so a head never drafts garbage for another model silently.
//
// A head may carry a reduced vocabulary (both or neither; ReadReducedVocabulary):
//   <arch>.vocab.ids       int32[] V' target token ids, strictly ascending, each < n_vocab
//   <arch>.lm_head.weight  [n_embd, V'] any type the CPU matmul reads (the exporter copies the
//                                       target's LM-head rows for those ids in its own type)
// With it the head scores only those V' tokens (row j of the product is token ids[j]): drafting
// costs V'/n_vocab of the target's LM head. Tokens outside the subset are never proposed; the
// target still verifies every candidate, so output is unchanged.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/backend/backend.h"
#include "lib/common/ggml_type.h"
#include "lib/gguf/gguf.h"
#include "lib/gguf/gguf_writer.h"
#include "lib/model/model.h"

namespace kiln::spec {

// FNV-1a 64 over every token's bytes, each followed by one 0xff byte (which UTF-8 never holds),
// so ["ab", "c"] and ["a", "bc"] differ. tools/train/export_medusa.py computes the same.
uint64_t VocabularyHash(std::span<const std::string_view> tokens);

struct TargetFingerprint {
  uint64_t vocab_hash = 0;
  int64_t n_vocab = 0;
  int64_t n_embd = 0;
  int64_t n_layer = 0;
};

// The fingerprint of a loaded model (its tokenizer.ggml.tokens and hyper-parameters).
absl::StatusOr<TargetFingerprint> FingerprintOf(const Model& model);

// Reads `<arch>.target.*` (DataLoss naming a missing or malformed key).
absl::StatusOr<TargetFingerprint> ReadTargetFingerprint(const gguf::GgufFile& file,
                                                        std::string_view arch);
void WriteTargetFingerprint(const TargetFingerprint& fp, std::string_view arch,
                            gguf::GgufWriter& writer);

// OK when `head` (of the head file at `path`) was made for `target`; otherwise InvalidArgument
// "PATH: this medusa head was trained for another model: vocabulary hash X != the model's Y, ...".
absl::Status CheckTarget(const TargetFingerprint& head, const TargetFingerprint& target,
                         std::string_view arch, std::string_view path);

// A static draft tree: node i is the ranks[i]-th candidate at depth depths[i] (1 for children of
// the root) below parents[i]. Topological (parents[i] < i).
struct StaticTree {
  std::vector<int32_t> parents;
  std::vector<int32_t> ranks;
  std::vector<int32_t> depths;  // derived

  int32_t size() const { return static_cast<int32_t>(parents.size()); }
  // The deepest depth among the first n nodes.
  int32_t MaxDepth(int32_t n) const;
};

// Checks parents / ranks (same length, parents[i] in [-1, i), 0 <= ranks[i] < max_rank, no two
// siblings with the same rank, depth <= max_depth) and derives the depths. InvalidArgument naming
// the node.
absl::StatusOr<StaticTree> MakeStaticTree(std::vector<int32_t> parents, std::vector<int32_t> ranks,
                                          int32_t max_depth, int32_t max_rank);
absl::StatusOr<StaticTree> ReadStaticTree(const gguf::GgufFile& file, std::string_view arch,
                                          int32_t max_depth, int32_t max_rank);
void WriteStaticTree(const StaticTree& tree, std::string_view arch, gguf::GgufWriter& writer);

// The reduced vocabulary of the head file at `path`, when it has one: fills *ids and returns
// the checked <arch>.lm_head.weight (shape [n_embd, ids], bytes that make its rows); neither
// record: *ids empty and nullptr. Errors: InvalidArgument for an id outside [0, target.n_vocab)
// ("PATH: <arch>.vocab.ids[j] = X is outside the target's vocabulary [0, N)"), DataLoss for
// the rest (one record without the other, ids empty, of the wrong type, repeated or not
// ascending, a tensor of another shape or size; each message names the key or tensor).
absl::StatusOr<const gguf::TensorInfo*> ReadReducedVocabulary(
    const gguf::GgufFile& file, std::string_view arch, std::string_view path,
    const TargetFingerprint& target, int64_t n_embd, std::vector<int32_t>* ids);
// Writes `ids` and the LM-head rows `lm_head` (ids.size() rows of n_embd elements of `type`,
// back to back) as <arch>.vocab.ids and <arch>.lm_head.weight.
absl::Status WriteReducedVocabulary(std::string_view arch, std::span<const int32_t> ids,
                                    GgmlType type, std::span<const uint8_t> lm_head, int64_t n_embd,
                                    gguf::GgufWriter& writer);

// A reduced vocabulary's LM head ready for the CPU matmul: view.n_out == ids.size(), row j of a
// product is target token ids[j]. `view` points into memory the caller keeps alive (the head's).
struct ReducedLmHead {
  std::vector<int32_t> ids;
  WeightView view;
  std::unique_ptr<WeightStore> prepared;  // the CPU backend's prepared copy of view
};
// Checks the ids against `n_vocab` and the view's bytes (`n_bytes`), prepares the weights and
// multiplies once, so a type the matmul cannot read is refused here, not at the first proposal.
// InvalidArgument naming `who` and the fault.
absl::StatusOr<std::shared_ptr<const ReducedLmHead>> PrepareReducedLmHead(std::vector<int32_t> ids,
                                                                          WeightView view,
                                                                          size_t n_bytes,
                                                                          int64_t n_vocab,
                                                                          std::string_view who);

// The k best tokens of `row` into *top (cleared first): highest logit first, ties to the lower id,
// so a head's candidates are deterministic, as exact tree verification needs.
void TopK(std::span<const float> row, int32_t k, std::vector<int32_t>* top);

}  // namespace kiln::spec
