// Medusa strategy: K trained heads on the target's final hidden state propose a static tree of
// candidates that the target verifies in one pass (speculative_decoder.h).
//
// Head k (1..K) reads the feature h of the token before the root (the row whose logits gave the
// root; the decoder hands it over through Strategy::ObserveTargetFeatures) and predicts the token
// at depth k below the root:  z_k = h + SiLU(W_k h + b_k),  logits_k = LM_head(z_k), with the
// target's own LM head (output.weight or the tied embeddings). The file's static tree says which
// candidates to verify: node i is the ranks[i]-th most likely token of head depth(i), so the tree
// is fixed per head file (chosen by tools/train/ from acceptance per head and rank measured on
// the default model) and only its tokens change per step.
//
// Exactness: the candidates are deterministic (top-k of the heads' logits, ties to the lower
// token id), so the decoder's tree verification is exact under any sampler chain: greedy output
// equals plain decoding, and sampled output has plain sampling's distribution (recursive
// rejection with one-hot drafts), unless the user opts into Medusa's lossy "typical acceptance"
// (MedusaParams::typical).
//
// When there is no feature for the current context (the first step after a prompt, or the
// context changed under the strategy), the heads propose nothing: that step verifies only the
// n-gram chain (MedusaParams::merge_ngram) or is plain decoding, and yields the feature for the
// next one.
//
// Head file (GGUF, general.architecture "medusa", lib/spec/draft_head.h for the fingerprint and
// tree keys):
//   medusa.format_version    uint32  1 or 2 (absent: 1); a newer version is refused, naming it
//   medusa.head_count        uint32  K
//   medusa.embedding_length  uint32  n_embd of the target
//   medusa.N.weight          [n_embd, n_embd] f32 or f16 (W_N, N = 0 .. K - 1; head N drafts
//                                              depth N + 1)
//   medusa.N.bias            [n_embd] f32
// Version 2 may add a reduced vocabulary (medusa.vocab.ids and medusa.lm_head.weight,
// draft_head.h): the heads then score only those V' tokens (logits_k = LM_head'(z_k), candidates
// mapped back through the ids), so proposing costs K mat-vecs plus V'/n_vocab of the target's LM
// head.
// Cost per proposal: K (n_embd x n_embd) mat-vecs plus the LM head (the target's or the file's)
// over the heads the tree uses (one batched matmul of max depth rows).
//
// Thread-safety: as every strategy (strategy.h); clones share the read-only head.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lib/backend/backend.h"
#include "lib/common/ggml_type.h"
#include "lib/engine/strategy.h"
#include "lib/model/model.h"
#include "lib/spec/draft_head.h"
#include "lib/spec/ngram_strategy.h"

namespace kiln::spec {

struct MedusaParams {
  // Most tree nodes proposed per step (the first max_draft nodes of the file's tree); 0: all.
  int32_t max_draft = 0;
  int n_threads = 1;  // threads of the heads' LM-head matmul; <= 0: physical cores
  // Merge the n-gram strategy's continuation of the context (prompt lookup, default NgramParams,
  // its cost-aware length) into every tree, within max_draft and on top of the file's tree
  // (NgramStrategy::MergeInto): copies of the context get long accepted runs.
  bool merge_ngram = true;
  // Set: Medusa's typical acceptance (rejection_sampler.h) instead of exact verification when
  // sampling, LOSSY (SpecMetrics::accepted_lossy counts what it accepted); unset (default): exact.
  std::optional<sample::TypicalAcceptance> typical;
};

// The weights of a Medusa head file, in f32.
struct MedusaHead {
  int32_t n_heads = 0;
  int64_t n_embd = 0;
  std::vector<std::vector<float>> weights;  // [K][n_embd (out) * n_embd (in)], row-major
  std::vector<std::vector<float>> biases;   // [K][n_embd]
  StaticTree tree;
  TargetFingerprint target;
  // Reduced vocabulary (format version 2; empty: the target's full LM head). vocab_ids[j] is the
  // target token of row j of lm_head: vocab_ids.size() rows of n_embd elements of lm_head_type,
  // back to back (the GGUF layout).
  std::vector<int32_t> vocab_ids;
  GgmlType lm_head_type = GgmlType::kF32;
  std::vector<uint8_t> lm_head;
};

// The newest head-file format this build reads (medusa.format_version).
inline constexpr uint32_t kMedusaFormatVersion = 2;

// The highest rank a tree may name (candidates per head).
inline constexpr int32_t kMedusaMaxRank = 64;

// Loads and checks a head file against `target` (InvalidArgument naming the mismatch for a head
// made for another model; DataLoss for a malformed file naming the key or tensor; the GGUF
// reader's errors for the file).
absl::StatusOr<MedusaHead> LoadMedusaHead(const std::string& path, const Model& target);
// Writes `head` as a head file (format version 2; tests); f16 residual weights when `f16`.
absl::Status WriteMedusaHead(const MedusaHead& head, const std::string& path, bool f16);

class MedusaStrategy final : public Strategy {
 public:
  // `target` is borrowed (its LM head is used; it must outlive the strategy and its clones).
  static absl::StatusOr<std::unique_ptr<MedusaStrategy>> Load(const std::string& path,
                                                              const Model& target,
                                                              const MedusaParams& params);
  static absl::StatusOr<std::unique_ptr<MedusaStrategy>> Create(
      std::shared_ptr<const MedusaHead> head, const Model& target, const MedusaParams& params);

  std::string_view name() const override { return "medusa"; }
  absl::Status Propose(std::span<const int32_t> context, int32_t max_draft,
                       const ProposeContext& ctx, DraftTree* out) override;
  void Accepted(int32_t drafted, std::span<const int32_t> accepted) override {}
  void Reset() override;
  absl::StatusOr<std::unique_ptr<Strategy>> Clone() const override;
  bool wants_target_features() const override { return true; }
  const sample::TypicalAcceptance* typical_acceptance() const override {
    return params_.typical ? &*params_.typical : nullptr;
  }
  void ObserveTargetFeatures(int32_t first_position, int32_t context_len,
                             std::span<const float> features, int64_t n_embd) override;

  const MedusaHead& head() const { return *head_; }
  // The heads' logits of the last proposal: [heads used, vocabulary] where the vocabulary is
  // the head's reduced one when it has one (head().vocab_ids), else the target's (tests, tools).
  const std::vector<float>& last_logits() const { return logits_; }

 private:
  MedusaStrategy(std::shared_ptr<const MedusaHead> head, const Model& target,
                 const MedusaParams& params, std::shared_ptr<const ReducedLmHead> reduced);
  // The heads' tree (Propose adds the n-gram chain).
  absl::Status ProposeTree(std::span<const int32_t> context, int32_t max_draft, DraftTree* out);

  std::shared_ptr<const MedusaHead> head_;
  const Model* target_;
  MedusaParams params_;
  std::unique_ptr<Backend> backend_;  // the LM-head matmul (the target engine's is locked)
  // The head file's reduced LM head when it has one (prepared once, shared by clones); else the
  // heads score with the target's output.
  std::shared_ptr<const ReducedLmHead> reduced_;
  std::unique_ptr<NgramStrategy> ngram_;   // null unless params_.merge_ngram
  std::vector<float> feature_;             // [n_embd] the feature that predicted the root
  int32_t feature_context_len_ = -1;       // the context length feature_ is valid for
  std::vector<float> z_;                   // [heads, n_embd]
  std::vector<float> logits_;              // [heads, n_vocab]
  std::vector<std::vector<int32_t>> top_;  // [heads][ranks] candidate tokens
};

}  // namespace kiln::spec
