// Draft-model strategy: a small model with the target's vocabulary (any GGUF; kiln-mkdraft makes
// one from the target by keeping its first layers) proposes a chain of draft tokens, one draft
// forward per token, from its own paged KV cache.
//
// Drafting: in greedy mode (temperature <= 0) the draft takes the argmax of its sampler-chain
// output and the chain is deterministic; otherwise each token is drawn from the draft's
// distribution q after the same sampler chain as the target (same parameters, history = context
// + earlier drafts), and q is passed to the verifier, so verification is exact.
//
// Its own state and rollback: the draft's cache sequence holds the context it last saw plus the
// drafts it computed. Accepted() truncates it to the context plus the accepted drafts; Propose()
// also keeps only the longest common prefix of what it holds and the new context and computes
// the rest, so any change of context (rewind, edited prompt, another session) is followed.
//
// Draft length: fixed max_draft, or adaptive (start at max_draft; +1 after a fully accepted
// draft, -1 after a rejection, within [1, max_draft]). Adaptive mode also backs off when even
// one-token drafts keep failing (a weak draft costs a draft pass and a wider target pass per
// step): after a miss at length 1 it proposes nothing for 1, 2, 4 ... up to max_skip steps (the
// draft then catches up on the skipped tokens in one batch at the next proposal); any accepted
// token ends the back-off.
//
// Thread-safety: none (see strategy.h). The draft model may be shared read-only.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "lib/common/ggml_type.h"
#include "lib/engine/forward_batch.h"
#include "lib/kv/kv_cache.h"
#include "lib/model/arch/llama.h"
#include "lib/model/model.h"
#include "lib/spec/strategy.h"

namespace kiln::spec {

struct DraftModelParams {
  int32_t max_draft = 5;  // >= 1
  bool adaptive = true;
  int32_t max_skip = 16;              // longest back-off in steps (adaptive only; 0: never)
  int n_threads = 0;                  // draft forward threads; <= 0: physical cores
  int32_t n_ctx = 0;                  // longest context drafted for; 0: min(training ctx, 8192)
  GgmlType kv_type = GgmlType::kF16;  // f16, f32 or bf16
};

class DraftModelStrategy final : public Strategy {
 public:
  // Loads the draft from `path` (owned by the strategy). InvalidArgument when its vocabulary
  // size differs from target_n_vocab or a parameter is bad (naming it); load errors pass through.
  static absl::StatusOr<std::unique_ptr<DraftModelStrategy>> Load(const std::string& path,
                                                                  int64_t target_n_vocab,
                                                                  const DraftModelParams& params);
  // Uses a loaded draft model (borrowed; must outlive the strategy).
  static absl::StatusOr<std::unique_ptr<DraftModelStrategy>> Create(const Model& draft,
                                                                    int64_t target_n_vocab,
                                                                    const DraftModelParams& params);
  ~DraftModelStrategy() override;

  std::string_view name() const override { return "draft"; }
  absl::Status Propose(std::span<const int32_t> context, int32_t max_draft,
                       const ProposeContext& ctx, DraftTree* out) override;
  void Accepted(int32_t drafted, std::span<const int32_t> accepted) override;
  void Reset() override;

  const Model& draft_model() const { return *model_; }
  int32_t current_draft_length() const { return draft_len_; }

 private:
  DraftModelStrategy(const Model& draft, const DraftModelParams& params)
      : model_(&draft), params_(params), draft_len_(params.max_draft) {}
  // Makes the draft sequence hold exactly context and leaves the last token's logits in logits_.
  absl::Status Sync(std::span<const int32_t> context);
  // Runs `tokens` at positions [pos, pos + n) causally; logits of the last one into logits_.
  absl::Status Run(std::span<const int32_t> tokens, int32_t pos);

  std::unique_ptr<Model> owned_model_;
  const Model* model_;
  DraftModelParams params_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<LlamaForward> forward_;
  SeqId seq_ = 0;
  int32_t draft_len_;
  int32_t misses_ = 0;            // consecutive misses at draft length 1
  int32_t skip_left_ = 0;         // proposals left to skip
  int32_t last_context_len_ = 0;  // context size of the last proposal
  int32_t last_computed_drafts_ = 0;
  std::vector<float> logits_;  // [n_vocab]
  std::vector<int32_t> history_;
  ForwardBatch batch_;
  ForwardOutput out_;
};

}  // namespace kiln::spec
