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
// Clone (Session::Fork): the clone shares the draft model and the draft cache (with its forward
// pass, behind a mutex) and gets a fork of the sequence (blocks shared by reference, copy on
// write), so it continues from the same draft state without recomputing the context. When the
// shared cache runs out of blocks (several forks growing), the strategy that hit the limit moves
// to a cache of its own and recomputes its context there.
//
// Draft length: fixed max_draft, or cost-aware (adaptive; draft_policy.h): each proposal drafts
// the k in [0, max_draft] maximising (1 + E[accepted | k]) / (c(k + 1) + k d), with c the
// decoder's measured relative cost of a target pass over k + 1 tokens, d the measured cost of one
// draft pass in one-token target passes, and the acceptance (first token a1, later tokens a)
// estimated online from the verified drafts. When nothing pays it still probes with one token,
// then proposes nothing for 1, 2, 4 ... up to max_skip steps before evaluating again (the draft
// catches up on the skipped tokens in one batch at the next proposal); max_skip = 0 probes at
// every step. Greedy output never depends on these choices; with sampling and measured costs
// the text for a fixed seed depends on timing (pin the costs with fixed_pass_cost_beta >= 0).
//
// Thread-safety: none per strategy (see strategy.h); a strategy and its clones may be used on
// different threads at the same time (the shared cache is locked). The draft model is read-only.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "lib/common/ggml_type.h"
#include "lib/engine/draft_policy.h"
#include "lib/engine/engine.h"
#include "lib/engine/strategy.h"
#include "lib/model/model.h"

namespace kiln::spec {

struct DraftModelParams {
  int32_t max_draft = 5;  // >= 1
  bool adaptive = true;   // cost-aware draft length and back-off (false: always max_draft)
  int32_t max_skip = 16;  // longest back-off in steps (adaptive only; 0: probe every step)
  int n_threads = 0;      // draft forward threads; <= 0: physical cores
  int32_t n_ctx = 0;      // longest context drafted for; 0: min(training ctx, 8192)
  GgmlType kv_type = GgmlType::kF16;  // f16, f32, bf16 or q8_0
  // >= 0: pinned costs (deterministic draft lengths): a target pass over w tokens costs
  // 1 + fixed_pass_cost_beta (w - 1) and a draft pass draft_cost_prior one-token target passes.
  // < 0: the decoder's measured pass cost and the draft's measured pass time.
  double fixed_pass_cost_beta = -1.0;
  // One draft pass in one-token target passes, until measured (> 0).
  double draft_cost_prior = 0.3;
};

class DraftModelStrategy final : public Strategy {
 public:
  // Loads the draft from `path` (owned by the strategy and its clones). InvalidArgument when its
  // vocabulary size differs from target_n_vocab or a parameter is bad (naming it); load errors
  // pass through.
  static absl::StatusOr<std::unique_ptr<DraftModelStrategy>> Load(const std::string& path,
                                                                  int64_t target_n_vocab,
                                                                  const DraftModelParams& params);
  // Uses a loaded draft model (borrowed; must outlive the strategy and its clones).
  static absl::StatusOr<std::unique_ptr<DraftModelStrategy>> Create(const Model& draft,
                                                                    int64_t target_n_vocab,
                                                                    const DraftModelParams& params);
  ~DraftModelStrategy() override;

  std::string_view name() const override { return "draft"; }
  absl::Status Propose(std::span<const int32_t> context, int32_t max_draft,
                       const ProposeContext& ctx, DraftTree* out) override;
  void Accepted(int32_t drafted, std::span<const int32_t> accepted) override;
  void Reset() override;
  absl::StatusOr<std::unique_ptr<Strategy>> Clone() const override;

  const Model& draft_model() const { return *model_; }
  // The draft length of the last proposal.
  int32_t current_draft_length() const { return draft_len_; }
  const AcceptanceEstimate& acceptance() const { return acceptance_; }
  // Measured seconds of one single-token draft pass (moving average; 0 until measured).
  double draft_pass_seconds() const { return draft_t1_; }
  // Tokens this strategy has run through the draft forward pass (context catch-up and drafts).
  int64_t computed_tokens() const { return computed_tokens_; }
  // Whether this strategy shares its draft engine (and cache) with clones (or the strategy it
  // was cloned from).
  bool shares_cache() const { return engine_.use_count() > 1; }

 private:
  DraftModelStrategy(const Model& draft, const DraftModelParams& params)
      : model_(&draft), params_(params) {}
  // The draft model's engine: its cache holds one sequence per strategy (clones fork theirs).
  static absl::StatusOr<std::shared_ptr<Engine>> MakeEngine(const Model& draft,
                                                            const DraftModelParams& params);
  // Drafts k tokens continuing context into *out.
  absl::Status Draft(std::span<const int32_t> context, int32_t k, const ProposeContext& ctx,
                     DraftTree* out);
  // Makes the draft sequence hold exactly context and leaves the last token's logits in logits_.
  absl::Status Sync(std::span<const int32_t> context);
  // Appends `tokens` to the draft sequence and computes them; logits of the last into logits_.
  absl::Status Run(std::span<const int32_t> tokens);
  void ObserveDraftPass(double seconds);
  // k = the cost-aware draft length for at most max_k tokens (adaptive mode).
  int32_t ChooseLength(int32_t max_k, const ProposeContext& ctx);

  std::shared_ptr<Model> owned_model_;  // set by Load; shared with clones
  const Model* model_;
  DraftModelParams params_;
  std::shared_ptr<Engine> engine_;  // shared with clones (its mutex serializes them)
  SeqId seq_ = 0;
  int32_t draft_len_ = 0;
  AcceptanceEstimate acceptance_;
  int32_t probes_ = 0;     // consecutive probes (k forced to 1 because nothing paid)
  int32_t skip_left_ = 0;  // proposals left to skip
  double draft_t1_ = 0.0;  // EMA of one-token draft pass seconds
  int64_t computed_tokens_ = 0;
  int32_t last_context_len_ = 0;  // context size of the last proposal
  int32_t last_computed_drafts_ = 0;
  std::vector<float> logits_;  // [n_vocab]
  std::vector<int32_t> history_;
};

}  // namespace kiln::spec
