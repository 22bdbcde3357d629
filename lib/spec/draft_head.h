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
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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

// The k best tokens of `row` into *top (cleared first): highest logit first, ties to the lower id,
// so a head's candidates are deterministic, as exact tree verification needs.
void TopK(std::span<const float> row, int32_t k, std::vector<int32_t>* top);

}  // namespace kiln::spec
