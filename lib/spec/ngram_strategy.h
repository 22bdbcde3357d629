// N-gram prompt lookup (no model): match the last n tokens of the context (n = max_ngram, then
// smaller, down to min_ngram) against the earlier context (prompt and output so far), take the
// most recent match and propose the tokens that followed it, as a deterministic chain. Exact
// under sampling too (q one-hot, rejection_sampler.h).
//
// Cost-aware draft length (adaptive = true; draft_policy.h): each step proposes the k in
// [0, max_draft] that maximises expected tokens per unit of target cost,
//   (1 + E[accepted | k]) / c(k + 1),
// where c(w) is the decoder's measured cost of a pass over w tokens relative to a one-token pass
// (ProposeContext::cost, or c(w) = 1 + fixed_pass_cost_beta (w - 1) when that is >= 0) and the
// acceptance is estimated online, separately for each suffix length n. k = 0 (plain decoding)
// when nothing pays. The acceptance is learned for free: the candidate continuation found at one
// step is compared with the tokens that actually followed it at the next step, whether or not it
// was proposed, so the strategy keeps learning while it backs off and needs no optimistic start
// (prior: half the drafts right). While no wide pass has been measured (the cost is the prior)
// it drafts at most start_draft tokens. When the policy has chosen k = 0 for max_skip
// consecutive steps that had a candidate, and one token would pay at half the measured cost
// slope, it proposes one token to measure a wide pass again (the backend or the load may have
// changed).
//
// Greedy output never depends on these choices (the verifier keeps the target's argmax path),
// so greedy equality does not depend on timing. With sampling and a measured cost, the text for
// a fixed seed depends on the (timing-driven) draft lengths; set fixed_pass_cost_beta >= 0 for
// reproducible sampled text.
//
// Thread-safety: none (see strategy.h).
#pragma once

#include <vector>

#include "lib/engine/draft_policy.h"
#include "lib/engine/strategy.h"

namespace kiln::spec {

struct NgramParams {
  int32_t max_ngram = 3;  // longest suffix tried first (>= min_ngram)
  // Shortest suffix tried (>= 1). One-token matches are right less often, but their acceptance
  // is learned apart from the longer ones', so they are drafted only while they pay; they pick
  // a copy up again one token after the answer departs from it (a corrected word), where a
  // two-token suffix needs two.
  int32_t min_ngram = 1;
  int32_t max_draft = 8;    // tokens proposed at most per step
  int32_t start_draft = 4;  // longest draft while the pass cost is the prior, in [1, max_draft]
  int32_t max_skip = 32;    // plain steps between probes of the pass cost (0: never probe)
  bool adaptive = true;     // cost-aware draft length (false: always max_draft when matched)
  // >= 0: use c(w) = 1 + fixed_pass_cost_beta (w - 1) instead of the measured cost
  // (deterministic draft lengths; no probes). < 0: the decoder's measured cost.
  double fixed_pass_cost_beta = -1.0;
};

class NgramStrategy final : public Strategy {
 public:
  // InvalidArgument naming the field for bad parameters.
  static absl::StatusOr<std::unique_ptr<NgramStrategy>> Create(const NgramParams& params);

  std::string_view name() const override { return "ngram"; }
  absl::Status Propose(std::span<const int32_t> context, int32_t max_draft,
                       const ProposeContext& ctx, DraftTree* out) override;
  void Accepted(int32_t drafted, std::span<const int32_t> accepted) override;
  void Reset() override;
  absl::StatusOr<std::unique_ptr<Strategy>> Clone() const override;
  // A NgramStrategyState message (lib/session/session_state.proto): the parameters, the
  // acceptance estimates, the pending candidate and the probe counter. LoadState requires the
  // same parameters (InvalidArgument naming the first that differs).
  absl::StatusOr<std::string> SaveState() const override;
  absl::Status LoadState(std::string_view state) override;

  // Proposes for `context` within the room max_draft leaves beside *tree (learning as Propose
  // does) and merges that chain into *tree (DraftTree::MergeChain): the n-gram candidates of the
  // head strategies (EAGLE, Medusa). The chain's length is priced as if it were verified alone.
  absl::Status MergeInto(std::span<const int32_t> context, int32_t max_draft,
                         const ProposeContext& ctx, DraftTree* tree);

  // Start of the most recent earlier occurrence of the last n tokens of `context` (an occurrence
  // that is followed by at least one token), or -1. Exposed for tests.
  static int64_t FindMostRecent(std::span<const int32_t> context, int32_t n);

  // The acceptance learned for suffix length n (in [min_ngram, max_ngram]). For tests and logs.
  const AcceptanceEstimate& acceptance(int32_t n) const { return acceptance_[n]; }

 private:
  explicit NgramStrategy(const NgramParams& params) : params_(params) { Reset(); }
  // Compares the candidate of the previous proposal with the tokens that followed it.
  void LearnFromPending(std::span<const int32_t> context);

  NgramParams params_;
  std::vector<AcceptanceEstimate> acceptance_;  // [max_ngram + 1], by suffix length
  // The previous step's candidate continuation (up to params_.max_draft tokens, proposed or not),
  // the context length it continued, that context's last token, and the suffix length matched.
  std::vector<int32_t> pending_;
  int64_t pending_len_ = 0;
  int32_t pending_root_ = -1;
  int32_t pending_n_ = 0;
  int32_t plain_run_ = 0;  // consecutive steps with a candidate and k = 0
};

}  // namespace kiln::spec
